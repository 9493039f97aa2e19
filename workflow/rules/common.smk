# Set-up shared by every rule, and every helper function the rule files use (they hold rules only).
# The Python behind it lives in the package, tested there: the config check, the protocol gate, the
# run config and the run's folders, targets and job environments (int8alibi.snakefile.workflow_plan), the
# params that decide reruns (int8alibi.snakefile.rerun) from what each stage reads
# (int8alibi.planning.stage_needs), and the quoted commands (int8alibi.snakefile.rule_commands). Each stage's
# outputs, resources and protocol files come from its one declaration (int8alibi.stage_spec). What stays
# here needs Snakemake's own objects. No stage logic lives here; each stage is int8alibi.stages.<stage>.
import os
import re
import sys
from pathlib import Path

# The checkout's root: this Snakefile lives in its workflow/ folder (the workflow catalog's layout),
# beside the int8alibi package.
ROOT = Path(workflow.basedir).parent
sys.path.insert(0, workflow.basedir)

# Jobs compute under the portable CPU settings (int8alibi.portable): set them for every process
# Snakemake starts from here on.
from int8alibi.portable import apply_to_environ

apply_to_environ()
# Third-party progress bars are off in jobs (int8alibi.progress.quiet_bars): each stage's heartbeat
# says how far it is.
from int8alibi.progress import quiet_bars

quiet_bars()
from int8alibi import parse_cache
from int8alibi.snakefile import workflow_plan
from int8alibi.errors import Int8AlibiError
from int8alibi import stage_spec
from int8alibi.files.code import CodeDigests
from int8alibi.quant.variants import CHECKPOINT_VARIANTS
from int8alibi.report import tables as report_tables
from int8alibi.planning.resources import device_limit, plan_resources, rule_priority as _rule_priority
from int8alibi.snakefile.rule_commands import q, qpath, stage_cmd
from int8alibi.planning.stage_needs import STAGES
from int8alibi.snakefile.rerun import (
    CODE_CACHE,
    cannot_run,
    environment_params,
    job_python,
    llmcompressor_python,
    lock_param,
    missing_libraries,
    rerun_params,
    source_digests,
    unjudged,
    use_gpu,
)

# Parses and schema verdicts of exact bytes are kept between invocations (int8alibi.parse_cache);
# with the code digests below, written once every rule is defined (save_plan_caches, workflow/Snakefile).
parse_cache.enable(Path(".snakemake", "int8alibi", "parse-cache.pickle"))


def _stop(exc):
    from int8alibi.printable import printable  # a name holding a newline or escape codes prints as one line

    sys.stderr.write(printable(f"int8alibi: {exc}") + "\n")
    raise SystemExit(1)


# The config Snakemake loaded, read again strictly and validated, its results folder (inside the
# checkout, or under --config results_root=/abs) and the fail-closed protocol gate
# (int8alibi.snakefile.workflow_plan.checked_config).
try:
    RESULTS, GATE = workflow_plan.checked_config(
        config, workflow.configfiles, workflow.config_settings.overwrite_config, ROOT
    )
except Int8AlibiError as exc:
    _stop(exc)

# One results folder per config (results/, results/qwen3-8b, ...): logs and benchmarks follow it.
LOGS, BENCHMARKS = workflow_plan.side_folders(config, RESULTS)

# The run config the stages read: the config file + --config overrides, environment variables
# expanded, and the `resolved` block (device and arms decided once, with the reason and the host).
# One immutable file per expanded config, <results>/.run/<digest>/config.yaml: written once when a
# run starts executing (onstart below: never by -n, --dag, --summary), never rewritten, so another
# invocation cannot change what a running job reads. A plan reuses the resolution of its own file,
# else that of the last executing run (.run/current) when made for the same device/arms values, so a
# cluster job re-parsing this file reads the resolution instead of making its own; a file whose bytes
# are no longer those written (a hand-edited resolved block) is refused (workflow_plan.check_unedited).
# Commands name it as {params.run_config:q} (stage_params below): the printed command holds the
# relative path and runs as printed, while neither the rule's text nor its compared params change
# with it (what a stage reads from the config reruns it through its `config_*` params); each stage
# logs the path.
try:
    _PLAN = workflow_plan.run_plan(config, RESULTS)
except Int8AlibiError as exc:
    _stop(exc)
if _PLAN.unset:
    sys.stderr.write(
        "int8alibi: environment variable not set: " + ", ".join(_PLAN.unset) + "; the value stays as written "
        "and every job of this run stops until it is set\n"
    )
RUN_CONFIG, RUN = _PLAN.path, _PLAN.run
# The interpreter commands name, as {params.python:q} (int8alibi.snakefile.rerun.job_python). Outside
# conda, jobs run where Snakemake runs: an interpreter lacking the libraries every stage computes with
# (the planning environment, workflow/envs/plan.txt) plans, and its commands name the project's environment.
CONDA = any(m.name == "CONDA" for m in workflow.deployment_settings.deployment_method)
MISSING = [] if CONDA else missing_libraries()
PYTHON = job_python(CONDA, Path.cwd(), MISSING)


onstart:
    try:
        if MISSING:  # its jobs would record the params of an environment no stage ran in
            raise Int8AlibiError(cannot_run(MISSING))
        # one executing run per results folder, held until snakemake exits
        from int8alibi.planning.run_lock import hold

        workflow.globals["_RUN_LOCK"] = hold(RESULTS, RUN_CONFIG)
        # written once, with the digest of its bytes beside it that later plans check
        workflow_plan.write_run(RUN, RUN_CONFIG)
    except (Int8AlibiError, OSError) as exc:
        _stop(exc)


# The two kernel arms this run resolved to (the `arm` wildcard of the generate jobs).
KERNEL_ARMS = list(RUN["resolved"]["arms"])
# own or vllm, resolved once when the run was planned (int8alibi.planning.resolve.resolve_engine)
ENGINE = RUN["resolved"]["engine"]

# Rerun triggers Snakemake cannot see as input files (int8alibi.snakefile.rerun), one readable param
# each: the code a stage can run (by syntax tree: comments and docstrings rerun nothing), the config
# keys it reads, the model's source files by content, and the library versions and portable settings
# every job computes under. The caches live beside Snakemake's own state: planning (a dry run too)
# writes nothing under results.
_CACHE = Path(".snakemake", "int8alibi")
try:
    SOURCES = source_digests(RUN, _CACHE)
except Int8AlibiError as exc:
    _stop(exc)
ENVIRONMENT = environment_params()
# Without those libraries every recorded version reads as changed: a finished run is not judged here.
_UNJUDGED = unjudged(RESULTS, MISSING, SOURCES)
if _UNJUDGED:
    _stop(_UNJUDGED)
CODE = CodeDigests(_CACHE / CODE_CACHE)
# Host memory (mem_mb) and wall time (runtime) of each heavy rule, from the parent's size and the
# size profile (int8alibi.planning.resources); the SLURM profile sends them as --mem and --time.
# The device's size is the run's gpu_mem_mb limit: the one given (--resources gpu_mem_mb=N), else a
# CUDA run's device-memory budget (gpu_budget_mb, resolved when the run is planned) times the number of
# devices its GPU jobs spread over (gpus, resolved with it), the limit Snakemake schedules GPU jobs
# against (int8alibi.planning.resources.device_limit); each job asks for at most the budget and is
# pinned to one device with that much left when it starts (int8alibi.runtime.gpu_slots).
# A GPU job that cannot fit the budget stops the plan here, naming its stage.
# Snakemake's `gpu` resource (one per GPU job on a CUDA run) is left without a limit: on a one-GPU
# workstation several jobs share the card by gpu_mem_mb, which a limit of gpu=1 would serialize; the
# SLURM profile sends it as --gpus=1, and SLURM's CUDA_VISIBLE_DEVICES is kept by the job.
_DEVICE_LIMIT = device_limit(workflow.global_resources.get("gpu_mem_mb").value, RUN)
if _DEVICE_LIMIT is not None:
    workflow.register_resource("gpu_mem_mb", _DEVICE_LIMIT)
_GPUS = RUN["resolved"].get("gpus") or {}
if len(_GPUS.get("devices") or []) > 1:
    sys.stderr.write(
        f"int8alibi: GPU jobs spread over devices {','.join(_GPUS['devices'])} ({_GPUS['reason']}), each pinned to "
        f"one; gpu_mem_mb limit {_DEVICE_LIMIT} MiB\n"
    )
try:
    RESOURCES = plan_resources(RUN, GATE.protocol, _DEVICE_LIMIT)
except Int8AlibiError as exc:
    _stop(exc)
# What the run's unfinished stages write under the results folder against the free space there
# (int8alibi.planning.disk): a run that cannot fit stops here, before any job, a dry run too (it is the
# plan that answers "will it fit?"); not a cluster job's re-parse, nor --delete-*-output, which frees space.
if workflow.is_main_process and not {"--delete-all-output", "--delete-temp-output"} & set(sys.argv):
    from int8alibi.planning.disk import check_disk

    try:
        check_disk(RUN, GATE.protocol, RESULTS)
    except Int8AlibiError as exc:
        _stop(exc)


def rule_priority(rule):
    """The rule's `priority:` (int8alibi.planning.resources.rule_priority): the longest chains start
    first when requant finishes, ahead of the sixteen short generate jobs."""
    return _rule_priority(rule)


def save_plan_caches():
    """Keep the plan's caches; one that cannot be written (a read-only .snakemake/) only costs the
    next plan its speed, so it warns instead of stopping the plan."""
    try:
        CODE.save()
        parse_cache.save()
    except OSError as exc:
        from int8alibi.errors import fault_line

        sys.stderr.write(f"int8alibi: plan caches not saved: {fault_line(exc, 'the plan caches') or exc}\n")


def stage_params(stage, environment=None):
    """A stage rule's params, given as `**stage_params(...)` beside the rule's own: the rerun params
    (int8alibi.snakefile.rerun.rerun_params: the stage's code, and the config keys and source files
    that int8alibi.planning.stage_needs says it reads), and the interpreter and run config its command names.
    Those two are functions of the job's output, which Snakemake does not compare between runs (its
    "derived" params): they change with where the environment lives and with every config key, and a
    job reruns only for what it reads."""
    needs = STAGES[stage]
    sources = {role: SOURCES[role] for role in needs.sources}
    params = rerun_params(stage, RUN, CODE, needs.config, sources, ENVIRONMENT if environment is None else environment)
    return {**params, "python": lambda wildcards, output: PYTHON, "run_config": lambda wildcards, output: RUN_CONFIG}


def stage_threads(stage):
    """The rule's `threads:` (int8alibi.planning.stage_needs.StageNeeds.threads): one where the stage
    sums floats on the host (a forward pass, float statistics) on one intra-op thread for portable
    bytes, so Snakemake runs such jobs side by side."""
    return STAGES[stage].threads


def protocol_files(stage):
    """The protocol files a stage reads: an amendment touching one reruns exactly those stages."""
    return [f"preregistration/{name}" for name in stage_spec.stage(stage).protocol]


def stage_file(stage, output):
    """One output of a stage (int8alibi.stage_spec), under the results folder."""
    return f"{RESULTS}/{stage_spec.table(stage, output)}"


def stage_outputs(stage, folder=None, captions={}, category="Tables", extra={}):
    """The outputs of a stage, given as `**stage_outputs(...)` in its rules; every output its spec entry
    (int8alibi.stage_spec) declares, in its folder (or `folder`), each marked `update`, the tensor
    folders and figures beside them only for --delete-all-output (deleted_with); `captions` names, per
    output, its caption in workflow/report/ for Snakemake's report; `extra`: outputs a run decides
    beside them (the report's table pages)."""
    spec = stage_spec.stage(stage)
    folder = folder or f"{RESULTS}/{spec.directory}"
    out = deleted_with(**{name: f"{folder}/{path}" for name, path in spec.folders.items()})
    for name, file in spec.outputs.items():
        path = update(f"{folder}/{file}")
        out[name] = report(path, caption=f"../report/{captions[name]}", category=category) if name in captions else path
    return {**out, **extra}


def table_pages():
    """The report's page per main table this run writes (int8alibi.report.tables), each with its caption
    in workflow/report/<name>.rst for Snakemake's report."""
    return {
        name: report(
            update(f"{RESULTS}/report/{report_tables.page(name)}"), caption=f"../report/{name}.rst", category="Tables"
        )
        for name in REPORT_TABLES
    }


def stage_resources(rule):
    """A rule's `resources:`, given as `**stage_resources(...)`: host memory and wall time from its
    stage's memory model (RESOURCES above), plus a GPU and device memory for a rule of a GPU stage (one
    GPU always for a GPU-only stage, else one on a CUDA run); a stage without a memory model asks for
    its fixed mem_mb."""
    spec = stage_spec.rule_stages()[rule]
    if not spec.memory_model:
        return {"mem_mb": spec.mem_mb}
    held = RESOURCES[rule]
    resources = {"mem_mb": held.mem_mb, "runtime": held.runtime}
    if spec.gpu:
        resources.update(gpu=1 if spec.gpu_only else use_gpu(RUN), gpu_mem_mb=held.gpu_mem_mb)
    return resources


# What the report reads (and so the target of `all`): every stage's manifest. The K sweep is GPU
# only: part of the run when the device resolves to CUDA, else left out (the report says so).
REPORT_INPUTS = workflow_plan.report_inputs(RESULTS, RUN)
# The main tables Snakemake's report shows, each an HTML page the report stage writes beside the
# report (int8alibi.report.tables), for the stages this run reports.
REPORT_TABLES = report_tables.shown(Path(manifest).parent.name for manifest in REPORT_INPUTS)


def final_targets():
    return [rules.report.output.md, rules.report.output.html, rules.report_figures.output.figures]


# Folders of tensors beside a stage's tables (the saved parent, captured operands, checkpoints) and
# the report's figures are listed and hashed by the stage's manifest, not declared as outputs:
# Snakemake puts a timestamp file into a directory output after its job, a file no manifest lists,
# which `int8alibi verify` refuses. `snakemake --delete-all-output` is to remove them as well, so for
# that invocation alone (Snakemake runs no job then) they are declared, by `**deleted_with(...)` in
# the rule's output.
DELETING = "--delete-all-output" in sys.argv


def deleted_with(**paths):
    """`{name: path}` as outputs when Snakemake deletes all output (a folder as `directory()`; a path
    may be a glob, each match declared), else nothing."""
    if not DELETING:
        return {}
    found = workflow_plan.deleted_paths(paths)
    return {name: directory(path) if folder else path for name, (path, folder) in found.items()}


def software_env(gpu_capable=False):
    """The conda environment file a job runs in (int8alibi.snakefile.workflow_plan.software_env)."""
    return workflow_plan.software_env(RUN, gpu_capable)


def faults_shard_dirs(wildcards):
    """The fault campaign's layer-range shard folders (config faults_shards > 1), known once capture ran."""
    index = checkpoints.capture.get().output.index
    return workflow_plan.shard_dirs(RESULTS, index, int(config["faults_shards"]))


def faults_shard_manifests(wildcards):
    return [f"{d}/manifest.json" for d in faults_shard_dirs(wildcards)]


def faults_shard_args(wildcards):
    """`--shard DIR` per shard, as a list: the command gives it as `{params.shards:q}`, each word quoted."""
    return [word for d in faults_shard_dirs(wildcards) for word in ("--shard", d)]


def crossmodel_reports(wildcards):
    """The report manifests of the runs `--config crossmodel=[...]` names; asked for only when the
    crossmodel job is in the DAG, so planning it without that list stops, saying what to give."""
    try:
        return workflow_plan.crossmodel_manifests(config.get("crossmodel"))
    except Int8AlibiError as exc:
        raise WorkflowError(str(exc))


# `arm` names one of the two arms this run resolved to (the run config's block resolved).
wildcard_constraints:
    arm="|".join(re.escape(arm) for arm in KERNEL_ARMS),

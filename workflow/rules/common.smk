# Set-up shared by every rule: config validation, the fail-closed protocol gate, the run config
# (expanded, resolved once), the digests that decide reruns, and every helper function the rule files
# use (they hold rules only). No stage logic lives here; each stage is int8alibi.stages.<stage>.
import re
import sys
from pathlib import Path

ROOT = Path(workflow.basedir)
sys.path.insert(0, str(ROOT / "workflow"))

# Jobs compute under the portable CPU settings (int8alibi.portable): set them for every process
# Snakemake starts from here on.
from int8alibi.portable import apply_to_environ

apply_to_environ()
# Shell commands say plain `python`: put the interpreter Snakemake runs in first on PATH, also when
# Snakemake was started as .venv/bin/snakemake without activating the environment. Nothing absolute
# goes into a command's text, so moving or copying a finished checkout reruns nothing.
from int8alibi.workflow_support import put_interpreter_on_path

put_interpreter_on_path()

from int8alibi.config import expand_env, read_run_config, validate, write_effective_config
from int8alibi.errors import Int8AlibiError
from int8alibi.protocol import STAGE_FILES, gate
from int8alibi.resolve import plan
from int8alibi.workflow_support import (
    code_digest,
    config_digest,
    environment_digest,
    shard_ranges,
    source_digests,
    use_gpu,
)


def _stop(exc):
    sys.stderr.write(f"int8alibi: {exc}\n")
    raise SystemExit(1)


try:
    validate(config, "config (after --configfile/--config)")
    GATE = gate(ROOT)
except Int8AlibiError as exc:
    _stop(exc)

RESULTS = config.get("results", "results")
# One results folder per config (results/, results/qwen3-8b, ...): logs and benchmarks follow it.
_RUN = [] if RESULTS == "results" else [Path(RESULTS).name]
LOGS = Path("logs", *_RUN).as_posix()
BENCHMARKS = Path("benchmarks", *_RUN).as_posix()

# The run config the stages read: the config file + --config overrides, environment variables
# expanded, and the `resolved` block (device and arms decided once, with the reason and the host;
# reused when an earlier plan made it for the same device/arms values, so a cluster job re-parsing
# this file reads the resolution instead of making its own). Rewritten only when its content
# changes, so it never triggers reruns by itself. Its path is relative, as in every command.
RUN_CONFIG = f"{RESULTS}/.run/config.yaml"
_EXPANDED, _UNSET = expand_env(config)
if _UNSET:
    sys.stderr.write(
        "int8alibi: environment variable not set: " + ", ".join(_UNSET) + "; the value stays as written and "
        "every job of this run stops until it is set\n"
    )
try:
    RUN = plan(_EXPANDED, read_run_config(RUN_CONFIG))
    validate(RUN, RUN_CONFIG)
except Int8AlibiError as exc:
    _stop(exc)
write_effective_config(RUN, Path(RUN_CONFIG))
ARMS = list(RUN["resolved"]["arms"])

# Rerun triggers Snakemake cannot see as input files (int8alibi.workflow_support): the model's source
# files by content, and the library versions and portable settings every job computes under.
try:
    SOURCES = source_digests(RUN, Path(RESULTS) / ".run")
except Int8AlibiError as exc:
    _stop(exc)
ENVIRONMENT = environment_digest()


def protocol_files(stage):
    """The protocol files a stage reads: an amendment touching one reruns exactly those stages."""
    return [f"preregistration/{name}" for name in STAGE_FILES[stage]]


def stage_cmd(stage, out, extra=""):
    """The one-line command of a stage; relative paths only, `python` from PATH (set above)."""
    return f"python -m int8alibi.stages.{stage} --config {RUN_CONFIG} --out {out} {extra}".rstrip()


# What the report reads (and so the target of `all`): every stage's manifest.
STAGES_IN_RUN = ["protocol", "requant", "compare", "faults", "determinism", "prefill_decode", "perplexity", "tokens"]
REPORT_INPUTS = [f"{RESULTS}/{stage}/manifest.json" for stage in STAGES_IN_RUN]


def final_targets():
    return [f"{RESULTS}/report/report.md", f"{RESULTS}/report/report.html"]


def software_env(gpu_capable=False):
    """The conda environment file (for `--sdm conda`, see envs/README.md) that a job runs in.

    The GPU set for a GPU-capable stage when the run's resolved device is CUDA, else the CPU lock;
    the path is relative to the rule files."""
    return "../../envs/gpu.yaml" if gpu_capable and use_gpu(RUN) else "../../envs/cpu.yaml"


def faults_shard_dirs(wildcards):
    """The fault campaign's layer-range shard folders (config faults_shards > 1), known once capture ran."""
    index = checkpoints.capture.get().output.index
    return [f"{RESULTS}/faults/shards/{a}_{b}" for a, b in shard_ranges(index, int(config["faults_shards"]))]


def faults_shard_manifests(wildcards):
    return [f"{d}/manifest.json" for d in faults_shard_dirs(wildcards)]


def faults_shard_args(wildcards):
    return " ".join(f"--shard {d}" for d in faults_shard_dirs(wildcards))


# `arm` names one of the two arms this run resolved to (results/.run/config.yaml, block resolved).
wildcard_constraints:
    arm="|".join(re.escape(arm) for arm in ARMS),

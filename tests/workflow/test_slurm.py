"""The tiny-model DAG submitted to a real single-node SLURM cluster through profiles/slurm.

Where Debian's SLURM and munge packages are installed, or can be (root with apt-get: always in CI),
the module starts munged, slurmctld and slurmd in a temporary state directory (slurm_cluster.py) and
runs, on the tiny synthetic config of test_full_dag.py with the fault campaign split in three
shards:

1. a local run (the session's pinned tiny run, copied, its campaign then rerun in shards) as the
   reference;
2. the same config and commits in a fresh copy, everything submitted through
   `snakemake --profile profiles/slurm`, with the status command and the first status-check
   delay given on the command line (this cluster has no accounting storage), in two invocations
   that continue one results folder: the DAG without the campaign (`--omit-from faults_shard`),
   then the rest, so that the three shards are queued together on a node with room for them all;

and checks that every non-local job went through sbatch (Snakemake's submission lines, matched to
the cluster's job-completion log: completed, on the `cpu` partition), that the shards ran as
parallel jobs, that the outputs are byte-identical to the local run and that `int8alibi verify`
passes. A GPU-capable job of a CUDA run is then submitted too: the plugin sends `--gpus=1`, the
scheduler accepts it on the `gpu` partition, and the job stops on this GPU-less node naming the arm
and the host. Every daemon is stopped by its pid file at the end, also on failure; every command
runs under a time limit. Elsewhere the module skips, saying why; with CI set it fails instead.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from int8alibi.engines.generation import RUNS
from int8alibi.quant.variants import CHECKPOINT_VARIANTS

from . import slurm_cluster
from .conftest import BIN, SNAKEMAKE, TINY_CONFIG, commit_all, copy_run, venv_env

pytestmark = pytest.mark.slow

SHARDS = 3
CONFIG = TINY_CONFIG + f"faults_shards: {SHARDS}\n"
# Jobs that must go through sbatch, and the light ones that run where snakemake runs (localrules).
SUBMITTED_RULES = {"model", "reference_checkpoint", "requant", "capture", "prediction", "compare", "faults_shard",
                   "generate", "perplexity", "tokens", "prefill_decode", "batch"}
LOCAL_RULES = {"protocol", "faults", "determinism", "report", "report_figures", "all"}
# The cluster has no slurmdbd: sacct fails, so the plugin reads job states with squeue (valid: the
# cluster's MinJobAge, 600 s, is far above 3 x the first status-check delay).
SLURM_ARGS = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "5",
              "--slurm-keep-successful-logs"]
RUN_LIMIT_S = 1500   # the cluster run of the whole DAG
LOCAL_LIMIT_S = 900  # each local snakemake call


def _unavailable() -> str | None:
    missing = slurm_cluster.missing_programs()
    if not missing:
        return None
    why = slurm_cluster.can_install()
    if why is None:
        slurm_cluster.install()
        missing = slurm_cluster.missing_programs()
        return f"still missing after apt-get install: {', '.join(missing)}" if missing else None
    return f"SLURM programs missing ({', '.join(missing)}) and they cannot be installed here ({why})"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    reason = _unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real SLURM test: {reason}")
        pytest.skip(f"no real SLURM here: {reason}")
    state = tmp_path_factory.mktemp("slurm-state")
    os.chmod(state, 0o700)
    nodes = slurm_cluster.SingleNodeSlurm(state)
    try:
        nodes.start()
        yield nodes
    finally:
        # cancel whatever is left, then stop the daemons by their pid files
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, timeout=30, env=nodes.env())
        nodes.stop()
        assert not nodes.running_pids(), f"daemons still running: {nodes.running_pids()}"


def _run(repo: Path, args: list[str], limit: int, cluster: slurm_cluster.SingleNodeSlurm | None = None,
         log: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command in its own session; past ``limit`` seconds its whole process group is killed."""
    env = venv_env()
    if cluster:
        env = cluster.env(env)
    proc = subprocess.Popen(args, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        if log:
            log.write_text(out)
        raise AssertionError(f"{' '.join(args)} ran past {limit} s:\n{out[-6000:]}") from None
    if log:
        log.write_text(out)
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


def _ok(result: subprocess.CompletedProcess, extra: str = "") -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"{' '.join(result.args)} failed ({result.returncode}):\n{result.stdout[-8000:]}{extra}"
    return result


def _local(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return _ok(_run(repo, [str(SNAKEMAKE), *args, "--profile", "profiles/default", "--cores", "2",
                           "--configfile", "config/test.yaml"], LOCAL_LIMIT_S))


def _digests(results: Path) -> dict[str, str]:
    """Every table and tensor file by content (manifests record times and hosts; they are verified instead)."""
    return {str(p.relative_to(results)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(results.rglob("*")) if p.is_file() and p.suffix in {".parquet", ".safetensors"}}


def _jobs(log: str) -> tuple[dict[int, tuple[str, bool]], dict[int, str]]:
    """From Snakemake's output: {jobid: (rule, local)} for every job it started, {jobid: slurm id} for submissions."""
    jobs: dict[int, tuple[str, bool]] = {}
    current: tuple[str, bool] | None = None
    for line in log.splitlines():
        head = re.match(r"^(local)?(?:rule|checkpoint) (\w+):$", line.strip())
        if head:
            current = (head.group(2), bool(head.group(1)))
            continue
        jobid = re.match(r"^jobid: (\d+)$", line.strip())
        if jobid and current:
            jobs[int(jobid.group(1))] = current
            current = None
    submitted = {int(a): b for a, b in re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", log)}
    return jobs, submitted


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, cluster, pinned_tiny_run: Path) -> Path:
    """The local run: a copy of the session's pinned tiny run (predictions, their pin, then the whole
    DAG), with the campaign then split in shards (only the fault campaign and the report rerun)."""
    repo = copy_run(pinned_tiny_run, tmp_path_factory.mktemp("local") / "project")
    (repo / "config" / "test.yaml").write_text(CONFIG)
    commit_all(repo, "test config: the campaign in shards")
    _local(repo)
    assert len(list((repo / "results" / "faults" / "shards").iterdir())) == SHARDS
    return repo


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory: pytest.TempPathFactory, cluster, reference: Path) -> tuple[Path, list[str]]:
    """The same commits in a fresh copy (no results), the whole DAG through profiles/slurm in two
    invocations (everything but the campaign, then the campaign and what follows it): their logs."""
    repo = tmp_path_factory.mktemp("cluster") / "project"
    shutil.copytree(reference, repo, ignore=shutil.ignore_patterns("results", "logs", "benchmarks", ".snakemake"))
    logs = []
    for step, extra in enumerate([["--omit-from", "faults_shard"], []], start=1):
        started = time.monotonic()
        result = _run(repo, [str(SNAKEMAKE), "--profile", "profiles/slurm", *SLURM_ARGS, "--configfile",
                             "config/test.yaml", *extra], RUN_LIMIT_S, cluster=cluster,
                      log=repo.parent / f"snakemake-{step}.log")
        _ok(result, cluster.logs())
        print(f"\nSLURM run of the tiny DAG, step {step}: {time.monotonic() - started:.0f} s")
        logs.append(result.stdout)
    return repo, logs


def _all_jobs(logs: list[str]) -> list[tuple[str, bool, str | None]]:
    """(rule, local, SLURM job id or None) of every job the invocations started (job ids restart per invocation)."""
    out = []
    for log in logs:
        jobs, submitted = _jobs(log)
        out += [(rule, local, submitted.get(jobid)) for jobid, (rule, local) in jobs.items()]
    return out


def test_every_non_local_job_went_through_sbatch(cluster, cluster_run) -> None:
    repo, logs = cluster_run
    jobs = _all_jobs(logs)
    rules_run = {rule for rule, _, _ in jobs}
    assert rules_run == SUBMITTED_RULES | LOCAL_RULES, (rules_run, logs[-1][-4000:])
    for rule, local, slurm_id in jobs:
        assert local == (rule in LOCAL_RULES), f"{rule} local={local}"
        assert (slurm_id is not None) == (not local), f"{rule}: SLURM job {slurm_id}"
    records = {r["JobId"]: r for r in cluster.jobcomp_records()}
    for log in logs:
        names = set()
        for slurm_id in _jobs(log)[1].values():
            record = records.get(slurm_id)
            assert record, f"SLURM job {slurm_id} is not in the job-completion log"
            assert record["JobState"] == "COMPLETED" and record["Partition"] == "cpu", record
            names.add(record["Name"])
        # the plugin names every job of one invocation by its run id
        assert len(names) == 1, names
    generate = [rule for rule, _, _ in jobs if rule == "generate"]
    assert len(generate) == 2 * len(CHECKPOINT_VARIANTS) * len(RUNS)  # two arms x every checkpoint x two runs


def test_the_fault_shards_ran_as_parallel_jobs(cluster, cluster_run) -> None:
    repo, logs = cluster_run
    shards = [slurm_id for rule, _, slurm_id in _all_jobs(logs) if rule == "faults_shard"]
    assert len(shards) == len(list((repo / "results" / "faults" / "shards").iterdir())) >= 2, shards
    records = {r["JobId"]: r for r in cluster.jobcomp_records()}
    spans = [(datetime.fromisoformat(records[s]["StartTime"]), datetime.fromisoformat(records[s]["EndTime"]))
             for s in shards]
    # all shards were running at one moment: the latest start precedes the earliest end
    assert max(a for a, _ in spans) < min(b for _, b in spans), spans


def test_outputs_are_byte_identical_to_the_local_run(reference: Path, cluster_run) -> None:
    repo, _ = cluster_run
    local, remote = _digests(reference / "results"), _digests(repo / "results")
    assert local and "faults/cells.parquet" in local and "report/report.md" not in local
    assert remote == local
    for name in ["report.md", "report.html"]:
        assert (repo / "results" / "report" / name).is_file()


def test_verify_passes_on_the_cluster_run(cluster_run) -> None:
    repo, _ = cluster_run
    result = _ok(_run(repo, [str(BIN / "int8alibi"), "verify", "results"], 300))
    assert "0 error" in result.stdout


def test_a_gpu_job_is_submitted_with_the_plugins_gpu_request(tmp_path: Path, cluster, cluster_run) -> None:
    """A CUDA run's first GPU job (requant: it computes on the run's device, so naming the device reruns it):
    the plugin sends --gpus=1 (no --gres in slurm_extra, which it would refuse), the scheduler places it on
    `gpu`, and on this GPU-less node the stage stops, naming the device and the host (nothing is substituted)."""
    repo = tmp_path / "project"
    shutil.copytree(cluster_run[0], repo, symlinks=True)
    result = _run(repo, [str(SNAKEMAKE), "results/capture/index.parquet", "--profile", "profiles/slurm",
                         *SLURM_ARGS, "--configfile", "config/test.yaml", "--config", "device=cuda",
                         "arms=[cublaslt,triton]"], 600, cluster=cluster)
    assert result.returncode != 0, result.stdout[-4000:]
    jobs, submitted = _jobs(result.stdout)
    requant = [j for j, (rule, _) in jobs.items() if rule == "requant"]
    assert requant and requant[0] in submitted, result.stdout[-4000:]
    slurm_id = submitted[requant[0]]
    shown = subprocess.run(["scontrol", "show", "job", slurm_id], capture_output=True, text=True, timeout=30,
                           env=cluster.env()).stdout
    assert "Partition=gpu" in shown and re.search(r"TresPerJob=\S*gpu[:=]1", shown), shown
    record = {r["JobId"]: r for r in cluster.jobcomp_records()}[slurm_id]
    assert record["Partition"] == "gpu" and record["JobState"] == "FAILED", record
    stage_log = (repo / "logs" / "requant.log").read_text()
    assert "device cuda" in stage_log and cluster.node in stage_log, stage_log[-3000:]

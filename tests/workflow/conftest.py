"""Fixtures for tests that run Snakemake on a scratch copy of the project."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from int8alibi.planning.rerun import LLMCOMPRESSOR_VENV

PROJECT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
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

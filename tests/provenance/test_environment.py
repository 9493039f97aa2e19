"""Environment evidence: library versions (absent ones named), device facts, git state."""

from __future__ import annotations

import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from int8alibi.provenance import environment
from int8alibi.provenance.environment import NO_GIT, collect, git_state, library_versions


def test_library_versions_report_installed_and_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "LIBRARIES", ("pyarrow", "int8alibi-no-such-distribution"))
    assert library_versions() == {"pyarrow": metadata.version("pyarrow"),
                                  "int8alibi-no-such-distribution": "absent"}


def test_collect_on_cpu(tmp_path: Path) -> None:
    env = collect("cpu", tmp_path)
    assert env["device"] == {"device": "cpu", "compute_capability": "n/a", "cuda": "n/a", "driver": "n/a"}
    assert set(env["libraries"]) == set(environment.LIBRARIES)
    assert env["libraries"]["torch"] == metadata.version("torch")
    assert set(env["env"]) == set(environment.ENV_VARS)
    assert env["git"]["commit"] == NO_GIT


def test_no_git_history_is_recorded_not_an_error(tmp_path: Path) -> None:
    state = git_state(tmp_path)
    assert state["commit"] == NO_GIT
    assert state["dirty"] is None
    assert state["reason"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_commit_and_dirty_flag(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t.invalid",
                               *args], check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    assert git_state(tmp_path) == {"commit": git("rev-parse", "HEAD"), "dirty": False}
    (tmp_path / "a.txt").write_text("two\n")
    assert git_state(tmp_path)["dirty"] is True
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / "new.py").write_text("")
    assert git_state(tmp_path)["dirty"] is True  # an untracked source file also makes it dirty

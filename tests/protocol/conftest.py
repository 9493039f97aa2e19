"""Scratch git repositories holding a copy of the protocol, for the gate's tamper tests.

One scratch repository is built per session (the drafts committed first, then the lock commit
that adds amendments/LOCK); each test works on its own `git clone` of it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
COPIED = ("preregistration", "amendments", "workflow/schemas")


def git(repo: Path, *args: str) -> str:
    """Run git with a fixed identity and no signing; fail the test on error."""
    done = subprocess.run(
        [
            "git",
            "-c",
            "user.name=test",
            "-c",
            "user.email=test@invalid",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "init.defaultBranch=main",
            *args,
        ],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout


def copy_protocol(dest: Path, *, lock: bool = True) -> Path:
    """Copy the project's protocol folders (optionally without amendments/LOCK) into ``dest``."""
    for rel in COPIED:
        shutil.copytree(PROJECT / rel, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
    if not lock:
        (dest / "amendments" / "LOCK").unlink()
    return dest


def amendment_paths(root: Path) -> list[Path]:
    """The amendment records under ``root``, by number: however many the project has committed.

    Tests derive the latest and next amendment from this instead of naming A-0002 or A-0003,
    so they keep holding as amendments are added.
    """
    found = [p for p in (root / "amendments").iterdir() if re.fullmatch(r"A-\d{4}\.yaml", p.name)]
    return sorted(found, key=lambda p: int(p.name[2:6]))


def latest_number(root: Path) -> int:
    """Number of the latest amendment; the untampered records run A-0001 ... A-NNNN without gaps."""
    numbers = [int(p.name[2:6]) for p in amendment_paths(root)]
    assert numbers == list(range(1, len(numbers) + 1)), f"amendment records are not consecutive: {numbers}"
    return numbers[-1]


def record_path(root: Path, number: int) -> Path:
    """amendments/A-NNNN.yaml for ``number`` (the file need not exist)."""
    return root / "amendments" / f"A-{number:04d}.yaml"


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository whose second commit is the lock commit."""
    repo = copy_protocol(tmp_path_factory.mktemp("scratch") / "origin")
    lock = (repo / "amendments" / "LOCK").read_bytes()
    (repo / "amendments" / "LOCK").unlink()
    git(repo, "init", "-q")
    commit_all(repo, "drafts")
    (repo / "amendments" / "LOCK").write_bytes(lock)
    commit_all(repo, "lock the amendments")
    return repo


@pytest.fixture
def repo(scratch: Path, tmp_path: Path) -> Path:
    """A fresh clone of the scratch repository."""
    dest = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(scratch), str(dest))
    return dest


@pytest.fixture
def unpacked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The protocol as an unpacked archive: no .git anywhere above it that git may look into."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    return copy_protocol(tmp_path / "unpacked")

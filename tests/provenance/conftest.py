"""Fixtures: the int8alibi.protocol stand-in and a project with two recorded stages."""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import pytest

from .provenance_project import PROTOCOL_FILES, build_run, make_protocol_stub, use_protocol


@pytest.fixture
def protocol_stub(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    stub = make_protocol_stub()
    use_protocol(monkeypatch, stub)
    return stub


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol_stub: types.ModuleType) -> Path:
    """Project with two stages: alpha writes a table and a note, beta reads alpha's table."""
    root = tmp_path / "proj"
    (root / "preregistration").mkdir(parents=True)
    for name, text in PROTOCOL_FILES.items():
        (root / "preregistration" / name).write_text(text)
    monkeypatch.chdir(root)
    build_run(root, seed=1)
    return root


@pytest.fixture
def copy(project: Path) -> Path:
    """A copy of the project's run beside it (results-copy), for diff and verify to compare."""
    target = project / "results-copy"
    shutil.copytree(project / "results", target)
    return target

"""A second config's run kept inside the results folder (``results/<name>``, as the README keeps one) is
that run's: the default run's root digest, verify and diff cover the default run's own stages only,
and the nested run verifies on its own."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from int8alibi.provenance.audit import NOTICE, audit_run, diff, find_manifests, verify
from int8alibi.provenance.chain import nested_runs
from int8alibi.provenance.manifest import write_manifest
from .provenance_project import build_run


@pytest.fixture(params=["with .run/", "stage folders only"])
def nested(request: pytest.FixtureRequest, project: Path) -> Path:
    """The fixture run in ``results`` (with its own ``.run/``) and another run in ``results/other``."""
    (project / "results" / ".run").mkdir()
    other = build_run(project, seed=2, results="results/other", layers=("q", "k"))
    if request.param == "with .run/":
        (other / ".run" / "0123456789abcdef").mkdir(parents=True)
    return other


def test_a_nested_run_leaves_the_root_digest_and_the_manifests_as_they_were(project: Path) -> None:
    results = project / "results"
    before = audit_run(results)
    build_run(project, seed=2, results="results/other", layers=("q", "k"))
    (results / "other" / ".run").mkdir()
    findings, manifests, root = audit_run(results)
    assert (manifests, root) == (before[1], before[2]) and root is not None
    assert [(f.level, f.manifest, f.subject) for f in findings] == [
        (NOTICE, (results / "other").as_posix(), "results folder")]
    assert "verify it on its own" in findings[0].reason


def test_the_nested_run_is_found_and_verifies_on_its_own(nested: Path, project: Path) -> None:
    results = project / "results"
    assert nested_runs(results) == [nested]
    assert [m.parent.name for m in find_manifests(results)] == ["alpha", "beta"]
    assert [f.level for f in verify(results)] == [NOTICE]
    assert verify(nested) == []
    assert audit_run(nested)[2] not in (None, audit_run(results)[2])


def test_a_changed_byte_in_the_nested_run_is_its_error_not_the_default_runs(nested: Path, project: Path) -> None:
    (nested / "alpha" / "note.txt").write_text("edited\n")
    assert [f.level for f in verify(project / "results")] == [NOTICE]
    assert [f.subject for f in verify(nested)] == ["output results/other/alpha/note.txt"]


def test_diff_compares_the_default_runs_own_stages(nested: Path, project: Path) -> None:
    copy = project / "results-before"
    shutil.copytree(project / "results", copy)
    shutil.rmtree(copy / "other")
    assert diff(project / "results", copy) == []


def test_a_grouped_nested_run_is_found_below_a_plain_folder(project: Path) -> None:
    results = project / "results"
    other = build_run(project, seed=2, results="results/group/other", layers=("q", "k"))
    (other / ".run").mkdir()
    assert nested_runs(results) == [other]
    assert [m.parent.name for m in find_manifests(results)] == ["alpha", "beta"]


def test_a_stage_folder_awaiting_its_gather_is_no_nested_run(project: Path) -> None:
    """A faults folder whose shards ran but whose gather has not: its shards are this run's stages."""
    results = project / "results"
    shard = results / "campaign" / "shards" / "s0"
    shard.mkdir(parents=True)
    (shard / "cells.bin").write_bytes(b"cells")
    write_manifest(shard, stage="campaign", outputs=[shard / "cells.bin"], inputs=[], params={},
                   protocol_root=project / "preregistration", device="cpu")
    assert nested_runs(results) == []
    assert shard / "manifest.json" in find_manifests(results)
    assert verify(results) == []

"""verify and diff give one answer for every spelling of one results folder: relative from another
checkout (``../other/results --project-root .``), absolute, with '..', through a symbolic link to the
folder or to a folder above it; and the same verdict and root digest for a copy and a moved folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from int8alibi.provenance.audit import ERROR, audit_run, diff, verify, verify_main
from .provenance_project import PROTOCOL_FILES, build_run


def flip_note(results: Path) -> None:
    """One changed byte, so the answer compared below is a finding with paths, not an empty list."""
    note = results / "alpha" / "note.txt"
    note.write_bytes(b"X" + note.read_bytes()[1:])


@pytest.fixture(params=["clean", "one byte changed"])
def run(request: pytest.FixtureRequest, project: Path) -> Path:
    if request.param != "clean":
        flip_note(project / "results")
    return project / "results"


@pytest.fixture
def other_checkout(tmp_path: Path, project: Path) -> Path:
    """A second checkout beside the project, with the same protocol files (the reviewer's own)."""
    main = tmp_path / "main"
    (main / "preregistration").mkdir(parents=True)
    for name, text in PROTOCOL_FILES.items():
        (main / "preregistration" / name).write_text(text)
    return main


def spell(name: str, results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``results`` written one way; the working folder is changed where the spelling is relative."""
    project = results.parent
    if name == "relative":
        monkeypatch.chdir(project)
        return "results"
    if name == "relative from another checkout":
        monkeypatch.chdir(tmp_path / "main")
        return os.path.relpath(results, tmp_path / "main")            # ../proj/results
    if name == "with dot-dot":
        return f"{results}/alpha/../../results"
    if name == "link to the folder":
        (tmp_path / "link").symlink_to(results, target_is_directory=True)
        return str(tmp_path / "link")
    if name == "link above the folder":
        (tmp_path / "project-link").symlink_to(project, target_is_directory=True)
        return str(tmp_path / "project-link" / "results")
    return str(results)


SPELLINGS = ["absolute", "relative", "relative from another checkout", "with dot-dot", "link to the folder",
             "link above the folder"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_verify_gives_one_answer_for_every_spelling(run: Path, other_checkout: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, spelling: str) -> None:
    expected = audit_run(run.resolve())
    assert (expected[2] is None) == bool(expected[0])          # a root digest exactly when nothing is wrong
    assert audit_run(spell(spelling, run, tmp_path, monkeypatch)) == expected


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_verify_with_the_reviewers_project_root_gives_one_answer(run: Path, other_checkout: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                spelling: str) -> None:
    expected = audit_run(run.resolve(), other_checkout)
    spelled = spell(spelling, run, tmp_path, monkeypatch)
    root = "." if Path.cwd() == other_checkout else os.path.relpath(other_checkout)
    assert audit_run(spelled, root) == expected


def test_the_reported_command_verifies(project: Path, other_checkout: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``int8alibi verify ../proj/results --project-root .`` from another checkout: it reported every
    file as undeclared and every output as recorded outside its stage folder."""
    assert verify_main([str(project / "results")]) == 0
    expected = capsys.readouterr().out
    monkeypatch.chdir(other_checkout)
    assert verify_main(["../proj/results", "--project-root", "."]) == 0
    assert capsys.readouterr().out == expected == (
        f"verified 2 manifest(s): 0 error(s), 0 notice(s)\nroot digest: {audit_run(project / 'results')[2]}\n")


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_a_copied_or_moved_folder_gives_the_same_verdict_and_root_digest(run: Path, tmp_path: Path,
                                                                         how: str) -> None:
    findings, _, root = audit_run(run)
    target = tmp_path / "elsewhere" / "kept-results"
    (shutil.copytree if how == "copied" else shutil.move)(run, target)
    moved_findings, _, moved_root = audit_run(target, run.parent)  # out of its checkout: name the checkout
    assert moved_root == root
    assert [(f.level, Path(f.manifest).relative_to(target), f.subject, f.reason) for f in moved_findings] == [
        (f.level, Path(f.manifest).relative_to(run), f.subject, f.reason) for f in findings]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_diff_gives_one_answer_for_every_spelling(project: Path, other_checkout: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, spelling: str) -> None:
    other = build_run(project, seed=2, results="results-b", layers=("q", "k"))
    results = project / "results"
    expected = diff(results, other)
    assert expected
    spelled = spell(spelling, results, tmp_path, monkeypatch)
    assert diff(spelled, other) == expected
    assert diff(other, spelled) == diff(other, results)
    assert diff(spelled, results) == []


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_diff_sees_no_difference_in_a_copied_or_moved_folder(project: Path, tmp_path: Path, how: str) -> None:
    results = project / "results"
    reference = tmp_path / "reference"
    shutil.copytree(results, reference)
    target = tmp_path / "elsewhere" / "kept-results"
    (shutil.copytree if how == "copied" else shutil.move)(results, target)
    assert diff(reference, target) == []
    assert [f for f in verify(target, project) if f.level == ERROR] == []

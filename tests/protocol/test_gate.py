"""Tamper cases: the gate stops on each, naming the file and the reason (protocol.gate).

Each test works on a fresh `git clone` of a scratch repository whose second commit adds
amendments/LOCK (the lock commit), or on an unpacked copy without git.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml
from int8alibi.errors import ProtocolError
from int8alibi.protocol import current_pins, gate
from int8alibi.protocol.schema import read_yaml

from .conftest import commit_all, git, latest_number, record_path


def _head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_untampered_clone_passes_with_history_verified(repo: Path) -> None:
    lock = git(repo, "log", "--format=%H", "-1", "--", "amendments/LOCK").strip()
    report = gate(repo)
    assert report.history.status == "verified"
    assert report.history.lock_commit == lock
    assert report.amendments[:2] == ("A-0001", "A-0002")
    assert set(report.files) == {f"preregistration/{p.name}" for p in (repo / "preregistration").iterdir()}
    for rel, sha in report.files.items():
        assert sha == hashlib.sha256((repo / rel).read_bytes()).hexdigest()
    pins = current_pins(repo)
    assert pins["amendment"] == report.amendment and pins["files"] == report.files
    assert pins["history"] == {"status": "verified", "detail": report.history.detail, "lock_commit": lock}


@pytest.mark.parametrize("commit", [False, True], ids=["uncommitted", "committed"])
def test_edited_protocol_file(repo: Path, commit: bool) -> None:
    _edit(repo / "preregistration" / "thresholds.yaml", "ulp_tolerance: 1", "ulp_tolerance: 2")
    if commit:
        commit_all(repo, "loosen the tolerance")
    with pytest.raises(
        ProtocolError,
        match=r"^preregistration/thresholds\.yaml: sha256 [0-9a-f]{64} differs from its pin .* in amendments/A-\d{4}",
    ):
        gate(repo)


def test_whitespace_only_edit(repo: Path) -> None:
    path = repo / "preregistration" / "checks.yaml"
    path.write_bytes(path.read_bytes() + b"\n")
    with pytest.raises(
        ProtocolError, match=r"^preregistration/checks\.yaml: sha256 .* differs from its pin .*whitespace included"
    ):
        gate(repo)


def test_added_unpinned_file(repo: Path) -> None:
    (repo / "preregistration" / "late-idea.yaml").write_text("note: added after registration\n")
    with pytest.raises(
        ProtocolError,
        match=r"^preregistration/late-idea\.yaml: protocol file is not pinned by amendments/A-\d{4}\.yaml",
    ):
        gate(repo)


def test_added_unpinned_file_in_a_subfolder(repo: Path) -> None:
    (repo / "preregistration" / "extra").mkdir()
    (repo / "preregistration" / "extra" / ".hidden").write_text("x\n")
    with pytest.raises(ProtocolError, match=r"^preregistration/extra/\.hidden: protocol file is not pinned"):
        gate(repo)


def test_deleted_pinned_file(repo: Path) -> None:
    (repo / "preregistration" / "faults.yaml").unlink()
    with pytest.raises(
        ProtocolError, match=r"^preregistration/faults\.yaml: pinned by amendments/A-\d{4}\.yaml but missing"
    ):
        gate(repo)


def test_edited_amendment_uncommitted(repo: Path) -> None:
    _edit(repo / "amendments" / "A-0002.yaml", "summary: >-", "summary: >-\n  (revised)")
    with pytest.raises(
        ProtocolError, match=r"^amendments/A-0002\.yaml: uncommitted change \(modified\) to a committed amendment"
    ):
        gate(repo)


def test_edited_amendment_committed(repo: Path) -> None:
    _edit(repo / "amendments" / "A-0002.yaml", "summary: >-", "summary: >-\n  (revised)")
    edit = commit_all(repo, "revise an amendment")
    with pytest.raises(
        ProtocolError, match=rf"^amendments/A-0002\.yaml: modified in commit {edit[:12]}, after the lock commit"
    ):
        gate(repo)


def test_staged_edit_is_caught_too(repo: Path) -> None:
    path = repo / "amendments" / "A-0001.yaml"
    original = path.read_bytes()
    path.write_bytes(original + b"# staged\n")
    git(repo, "add", "amendments/A-0001.yaml")
    path.write_bytes(original)  # work tree restored, index still holds the edit
    with pytest.raises(ProtocolError, match=r"^amendments/A-0001\.yaml: uncommitted change \(modified\)"):
        gate(repo)


@pytest.mark.parametrize("name", ["A-0001.yaml", "A-0002.yaml", "LOCK"])
def test_deleted_amendment_uncommitted(repo: Path, name: str) -> None:
    (repo / "amendments" / name).unlink()
    with pytest.raises(ProtocolError, match=rf"^amendments/{name}: uncommitted change \(deleted\)"):
        gate(repo)


def test_deleted_amendment_committed(repo: Path) -> None:
    (repo / "amendments" / "A-0002.yaml").unlink()
    drop = commit_all(repo, "drop the post-data amendment")
    with pytest.raises(ProtocolError, match=rf"^amendments/A-0002\.yaml: deleted in commit {drop[:12]}"):
        gate(repo)


def test_renamed_amendment_committed(repo: Path) -> None:
    git(repo, "mv", "amendments/A-0002.yaml", "amendments/A-0002.yml")
    commit = commit_all(repo, "rename")
    with pytest.raises(ProtocolError, match=rf"^amendments/A-0002\.yaml: deleted in commit {commit[:12]}"):
        gate(repo)


def test_edited_in_an_earlier_commit_and_restored(repo: Path) -> None:
    path = repo / "amendments" / "A-0001.yaml"
    original = path.read_bytes()
    path.write_bytes(original + b"# quietly changed\n")
    edit = commit_all(repo, "edit")
    path.write_bytes(original)
    commit_all(repo, "restore")
    assert git(repo, "status", "--porcelain") == ""
    with pytest.raises(
        ProtocolError, match=rf"^amendments/A-0001\.yaml: modified in commit {edit[:12]}.*1 further violations"
    ):
        gate(repo)


def test_edit_hidden_in_a_merge_commit(repo: Path) -> None:
    """An 'evil merge' changes an amendment only in the merge result; the combined diff sees it."""
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "notes.txt").write_text("side work\n")
    commit_all(repo, "side work")
    git(repo, "checkout", "-q", "main")
    (repo / "other.txt").write_text("main work\n")
    commit_all(repo, "main work")
    git(repo, "merge", "-q", "--no-ff", "--no-commit", "side")
    _edit(repo / "amendments" / "A-0002.yaml", "summary: >-", "summary: >-\n  (merged)")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "merge side")
    merge = _head(repo)
    with pytest.raises(ProtocolError, match=rf"^amendments/A-0002\.yaml: modified in commit {merge[:12]}"):
        gate(repo)


def test_an_honest_merge_passes(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "notes.txt").write_text("side work\n")
    commit_all(repo, "side work")
    git(repo, "checkout", "-q", "main")
    (repo / "other.txt").write_text("main work\n")
    commit_all(repo, "main work")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    assert gate(repo).history.status == "verified"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_record(repo: Path, number: int, previous_sha: str, **changes: str) -> Path:
    """Write A-<number> as a copy of the latest record, relinked to ``previous_sha``.

    The copy pins what the latest record pins (the files on disk), so the gate's verdict turns on
    the id, the link and ``changes`` alone.
    """
    record = read_yaml(record_path(repo, latest_number(repo)))
    record.update(id=f"A-{number:04d}", previous_sha256=previous_sha, **changes)
    path = record_path(repo, number)
    path.write_text(yaml.safe_dump(record, sort_keys=False))
    return path


def test_broken_parent_hash(repo: Path) -> None:
    latest = latest_number(repo)
    assert latest >= 2
    wrong = _sha(record_path(repo, 1))  # a real record, but not the one before the new record
    _write_record(repo, latest + 1, wrong)
    with pytest.raises(
        ProtocolError,
        match=rf"^amendments/A-{latest + 1:04d}\.yaml: previous_sha256 {wrong} does not match "
        rf"amendments/A-{latest:04d}\.yaml",
    ):
        gate(repo)


def test_correct_parent_hash_is_accepted(repo: Path) -> None:
    latest = latest_number(repo)
    _write_record(repo, latest + 1, _sha(record_path(repo, latest)))
    report = gate(repo)
    assert report.amendment == f"A-{latest + 1:04d}"
    assert report.amendments == tuple(f"A-{n:04d}" for n in range(1, latest + 2))


def test_two_amendments_with_the_same_number(repo: Path) -> None:
    shutil.copy(repo / "amendments" / "A-0002.yaml", repo / "amendments" / "A-002.yaml")
    with pytest.raises(
        ProtocolError, match=r"^amendments/A-002\.yaml: amendment number 2 is already used by amendments/A-0002\.yaml"
    ):
        gate(repo)


def test_two_amendments_with_the_same_id(repo: Path) -> None:
    latest = latest_number(repo)
    shutil.copy(record_path(repo, latest), record_path(repo, latest + 1))
    with pytest.raises(
        ProtocolError,
        match=rf"^amendments/A-{latest + 1:04d}\.yaml: id A-{latest:04d} does not match the file name",
    ):
        gate(repo)


def test_stray_file_in_amendments(repo: Path) -> None:
    shutil.copy(repo / "amendments" / "A-0002.yaml", repo / "amendments" / "A-0002-copy.yaml")
    with pytest.raises(ProtocolError, match=r"^amendments/A-0002-copy\.yaml: unexpected entry"):
        gate(repo)


def test_gap_in_numbering(repo: Path) -> None:
    latest = latest_number(repo)
    _write_record(repo, latest + 2, _sha(record_path(repo, latest)))
    with pytest.raises(ProtocolError, match=rf"^amendments/A-{latest + 2:04d}\.yaml: A-{latest + 1:04d} is missing"):
        gate(repo)


def test_malformed_amendment_is_named(repo: Path) -> None:
    latest = latest_number(repo)
    _write_record(repo, latest + 1, _sha(record_path(repo, latest)), status="sometime")
    with pytest.raises(
        ProtocolError,
        match=rf"^amendments/A-{latest + 1:04d}\.yaml: does not match amendment\.schema\.yaml at status",
    ):
        gate(repo)


def test_no_git_history_check_not_possible_is_recorded(unpacked: Path) -> None:
    report = gate(unpacked)
    assert report.history.status == "not possible"
    assert report.history.detail.startswith("history check not possible")
    assert current_pins(unpacked)["history"]["status"] == "not possible"


def test_no_git_chain_and_pins_still_checked(unpacked: Path) -> None:
    _edit(unpacked / "amendments" / "A-0001.yaml", "summary: >-", "summary: >-\n  (revised)")
    with pytest.raises(
        ProtocolError,
        match=r"^amendments/A-0002\.yaml: previous_sha256 [0-9a-f]{64} does not match amendments/A-0001\.yaml",
    ):
        gate(unpacked)


def test_no_git_deleted_first_amendment(unpacked: Path) -> None:
    (unpacked / "amendments" / "A-0001.yaml").unlink()
    with pytest.raises(ProtocolError, match=r"^amendments/A-0002\.yaml: A-0001 is missing"):
        gate(unpacked)


def test_git_not_installed_is_recorded(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    report = gate(repo)
    assert report.history.status == "not possible"
    assert "git is not installed" in report.history.detail


def test_unreadable_git_directory_fails_closed(unpacked: Path) -> None:
    (unpacked / ".git").write_text("gitdir: /nonexistent/repository\n")
    with pytest.raises(ProtocolError, match=r"\.git: present but git cannot read the repository"):
        gate(unpacked)


def test_drafting_before_the_lock_is_committed(unpacked: Path) -> None:
    (unpacked / "amendments" / "LOCK").unlink()
    git(unpacked, "init", "-q")
    commit_all(unpacked, "drafts")
    # Redraft the latest record (no record links to it yet, so the chain still holds).
    latest = record_path(unpacked, latest_number(unpacked))
    record = read_yaml(latest)
    record["summary"] = f"(draft 2) {record['summary']}"
    before = latest.read_bytes()
    latest.write_text(yaml.safe_dump(record, sort_keys=False))
    assert latest.read_bytes() != before
    commit_all(unpacked, "redraft")
    report = gate(unpacked)
    assert report.history.status == "drafting"
    assert "LOCK has never been committed" in report.history.detail
    (unpacked / "amendments" / "LOCK").write_text("lock\n")
    assert "LOCK exists but is not committed" in gate(unpacked).history.detail
    commit_all(unpacked, "lock")
    assert gate(unpacked).history.status == "verified"


def test_shallow_clone_is_partial(scratch: Path, tmp_path: Path) -> None:
    dest = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{scratch}", str(dest))
    report = gate(dest)
    assert report.history.status == "partial"
    assert "shallow clone" in report.history.detail


def test_project_in_a_subfolder_of_the_repository(unpacked: Path) -> None:
    """Paths are reported relative to the project root even when the repository root is above it."""
    outer = unpacked.parent / "mono"
    project = outer / "int8alibi"
    shutil.copytree(unpacked, project)
    git(outer, "init", "-q")
    commit_all(outer, "lock inside a larger repository")
    assert gate(project).history.status == "verified"
    (project / "amendments" / "A-0001.yaml").unlink()
    with pytest.raises(ProtocolError, match=r"^amendments/A-0001\.yaml: uncommitted change \(deleted\)"):
        gate(project)
    commit_all(outer, "drop it")
    with pytest.raises(ProtocolError, match=r"^amendments/A-0001\.yaml: deleted in commit"):
        gate(project)

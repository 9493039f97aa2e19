"""The protocol's history against careless and hostile edits: an amendment dated in the future or on
no calendar day, a data pin of a file outside the project, a protocol file that is a symbolic link
out of it, and a history rewrite that changed a pin after stages ran under it (the gate alone cannot
see a consistently rewritten chain; ``verify`` compares the pins the manifests recorded)."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest
import yaml

from int8alibi.errors import ProtocolError
from int8alibi.protocol import gate
from int8alibi.tools.amend import amend, main
from int8alibi.protocol.history import check_dates
from int8alibi.protocol.chain import read_amendments

from .conftest import amendment_paths, commit_all, git


def _redate(path: Path, date: str) -> None:
    text = path.read_text()
    old = yaml.safe_load(text)["date"]
    path.write_text(text.replace(f"date: '{old}'", f"date: '{date}'", 1))


def _next_by_hand(repo: Path, date: str) -> Path:
    """An amendment written by hand (not by ``amend``) for a protocol that did not change."""
    path = amend(repo, "Clarify", "Nothing changes but the record.", ["report"], "post-data")
    _redate(path, date)
    return path


def test_an_amendment_dated_in_the_future_is_refused_naming_it(repo: Path) -> None:
    path = _next_by_hand(repo, "9999-12-31")
    with pytest.raises(ProtocolError, match=rf"{path.name}: dated 9999-12-31, after today .*not committed yet"):
        gate(repo)
    commit_all(repo, "a future-dated amendment")
    with pytest.raises(ProtocolError, match=rf"{path.name}: dated 9999-12-31, after the commit [0-9a-f]{{12}} that added it"):
        gate(repo)


def test_an_amendment_dated_on_no_calendar_day_is_refused_naming_it(repo: Path) -> None:
    path = _next_by_hand(repo, "2026-13-45")
    with pytest.raises(ProtocolError, match=rf"{path.name}: date '2026-13-45' is not a calendar date"):
        gate(repo)


def test_amendments_dated_today_in_any_time_zone_are_accepted(repo: Path) -> None:
    amendments = read_amendments(repo)
    latest = dt.date.fromisoformat(amendments[-1].data["date"])
    late_evening = dt.datetime.combine(latest, dt.time(10, 30), dt.UTC) - dt.timedelta(hours=14)
    check_dates(repo, amendments, now=late_evening)  # the UTC+14 day of 20:30 UTC the day before
    with pytest.raises(ProtocolError, match="after today"):
        _next_by_hand(repo, (late_evening + dt.timedelta(days=2)).date().isoformat())
        check_dates(repo, read_amendments(repo), now=late_evening)


def test_a_data_pin_outside_the_project_is_refused(repo: Path, tmp_path: Path, capsys) -> None:
    outside = tmp_path / "elsewhere.parquet"
    outside.write_bytes(b"PAR1 not the project's PAR1")
    inside_link = repo / "results" / "link.parquet"
    inside_link.parent.mkdir()
    inside_link.symlink_to(outside)
    for given in ("/etc/passwd", str(outside), "results/link.parquet"):
        argv = ["--root", str(repo), "--summary", "s", "--rationale", "r", "--stages", "compare",
                "--status", "pre-data", "--pin", f"predictions={given}"]
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "lies outside the project" in err[0], err
    assert len(amendment_paths(repo)) == len(read_amendments(repo))  # nothing written


def test_a_protocol_file_linked_to_outside_the_project_is_refused(repo: Path, tmp_path: Path) -> None:
    target = repo / "preregistration" / "analysis.yaml"
    copy = tmp_path / "analysis.yaml"
    shutil.copy(target, copy)
    target.unlink()
    target.symlink_to(copy)
    with pytest.raises(ProtocolError, match=r"^preregistration/analysis\.yaml: a symbolic link \(to .*analysis\.yaml\); "
                                            r"protocol and amendment files must be the repository's own files"):
        gate(repo)


def test_a_history_rewrite_that_changed_a_data_pin_fails_verify(repo: Path, monkeypatch) -> None:
    from int8alibi.provenance.audit import verify
    from int8alibi.provenance.manifest import write_manifest

    monkeypatch.chdir(repo)
    stage = repo / "results" / "compare"
    stage.mkdir(parents=True)
    (stage / "layers.txt").write_text("ran under the protocol as it was\n")
    write_manifest(stage, stage="compare", outputs=[stage / "layers.txt"], inputs=[], params={},
                   protocol_root=repo / "preregistration", device="cpu")
    assert [f for f in verify(repo / "results", repo) if f.level == "error"] == []
    # the rewrite: the latest amendment's data pin changed, and the repository rebuilt from scratch so
    # that the chain and the history are consistent again (the gate alone passes)
    latest = amendment_paths(repo)[-1]
    record = yaml.safe_load(latest.read_text())
    pins = dict(record.get("data_pins") or {})
    pins["predictions"] = "a" * 64
    text = latest.read_text()
    if "data_pins:" in text:
        old = yaml.safe_load(text)["data_pins"].get("predictions")
        assert old is not None
        text = text.replace(old, "a" * 64)
    else:
        text += f"data_pins:\n  predictions: {'a' * 64}\n"
    latest.write_text(text)
    shutil.rmtree(repo / ".git")
    lock = (repo / "amendments" / "LOCK").read_bytes()
    (repo / "amendments" / "LOCK").unlink()
    git(repo, "init", "-q")
    commit_all(repo, "drafts, rewritten")
    (repo / "amendments" / "LOCK").write_bytes(lock)
    commit_all(repo, "lock, rewritten")
    assert gate(repo).history.status == "verified"
    errors = [f.text() for f in verify(repo / "results", repo) if f.level == "error"]
    assert any("the lock commit is now" in e for e in errors), errors
    assert any(f"{record['id']} now pins other protocol files or data" in e for e in errors), errors


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_amend_root_that_is_not_a_folder_is_one_named_line(tmp_path: Path, capsys, kind: str) -> None:
    root = tmp_path / "nowhere"
    if kind == "file":
        root.write_text("x")
    argv = ["--root", str(root), "--summary", "s", "--rationale", "r", "--stages", "report", "--status", "post-data"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"int8alibi amend: --root {root}: not a folder (the project checkout holding amendments/)"]


def test_a_shallow_clone_does_not_name_its_oldest_commit_as_the_lock(repo: Path, tmp_path: Path) -> None:
    amend(repo, "Clarify", "Nothing changes but the record.", ["report"], "post-data")
    newest = commit_all(repo, "an amendment after the lock")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    history = gate(shallow).history
    assert history.status == "partial" and history.lock_commit is None
    assert f"oldest commit {newest[:12]} already holds amendments/LOCK" in history.detail
    assert "cannot be told here" in history.detail

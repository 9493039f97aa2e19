"""A stage killed outright, or interrupted while its transaction moves entries aside or back, loses
nothing (``files.transaction``): its watcher puts the previous outputs back as soon as the
stage's process is gone (SIGKILL or SIGTERM to its whole process group), a run stopped half-way
through setting entries aside or moving them back is finished by the next run, and a run that
restored a killed run's snapshot and then fails leaves those outputs in that snapshot (Snakemake,
which never saw them, would delete them as a failed job's outputs) for the next run to restore."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from int8alibi.errors import InputError
from int8alibi.files import transaction
from int8alibi.runtime.runner import stage_main

from .test_runner_transaction import config, destructive, previous, tree

KILLED_STAGE = """
import sys, time
from pathlib import Path
from int8alibi.files.transaction import stage_transaction
out = Path(sys.argv[1])
with stage_transaction(out):
    (out / "manifest.json").unlink(missing_ok=True)
    (out / "table.parquet").write_bytes(b"half-written new table")
    print("computing", flush=True)
    time.sleep(600)
"""


def _snapshots(out: Path) -> list[Path]:
    return sorted(out.glob(f".*{transaction.SUFFIX}"))


def _as_dead(snap: Path) -> Path:
    """The snapshot as a process that no longer runs would have left it."""
    return snap.rename(snap.with_name(snap.name.replace(f"-{os.getpid()}.", "-999999999.")))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_stage_killed_with_its_process_group_is_undone_at_once_by_its_watcher(tmp_path: Path, sig) -> None:
    out = tmp_path / "model"
    before = previous(out)
    stage = subprocess.Popen([sys.executable, "-c", KILLED_STAGE, str(out)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        assert stage.stdout is not None and stage.stdout.readline() == "computing\n"
        assert _snapshots(out) and tree(out) != before  # mid-run: the previous outputs are set aside
        os.killpg(stage.pid, sig)
        assert stage.wait(timeout=60) == -sig
    finally:
        if stage.poll() is None:
            stage.kill()
    deadline = time.monotonic() + 60
    while _snapshots(out) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tree(out) == before and not _snapshots(out)


@pytest.mark.parametrize("when", ["setting entries aside", "moving them back after success"])
def test_a_run_stopped_while_its_transaction_moves_entries_loses_none(tmp_path: Path, monkeypatch, when: str) -> None:
    """A kill between two renames, as an exception from the rename that did not happen; the next run
    (``recover``) finishes the move instead of discarding the entries already moved."""
    out = tmp_path / "model"
    before = previous(out)
    rename = os.rename

    def killed_at(name: str):
        def fake(src, dst):
            if Path(src).name == name:
                raise KeyboardInterrupt("killed")
            rename(src, dst)
        return fake

    if when == "setting entries aside":
        monkeypatch.setattr(transaction.os, "rename", killed_at("parent"))  # manifest.json already moved
        with pytest.raises(KeyboardInterrupt):
            transaction.snapshot(out, [])
        expected = before
    else:
        snap = transaction.snapshot(out, [])
        (out / "manifest.json").write_text('{"new": true}')  # the run succeeded, writing its manifest
        monkeypatch.setattr(transaction.os, "rename", killed_at("table.parquet"))  # parent already back
        with pytest.raises(KeyboardInterrupt):
            transaction.merge(out, snap)
        expected = {**before, "manifest.json": tree(out)["manifest.json"]}
    monkeypatch.setattr(transaction.os, "rename", rename)
    (snap,) = _snapshots(out)
    _as_dead(snap)
    assert transaction.recover(out, []) == []  # nothing to restore: only a move to finish
    assert tree(out) == expected and not _snapshots(out)


def test_a_failing_run_keeps_a_killed_runs_outputs_in_its_snapshot_for_the_next_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    out = tmp_path / "results" / "model"
    before = previous(out)
    dead = _as_dead(transaction.snapshot(out, []))
    (out / "partial.parquet").write_bytes(b"what the killed run had written")
    assert stage_main(destructive(InputError("bad parent")), ["--config", str(config(tmp_path)), "--out", str(out)]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    # nothing in the folder for Snakemake to delete; every previous output kept, in the killed run's snapshot
    assert [p.name for p in out.iterdir()] == [dead.name]
    assert tree(dead) == before
    assert transaction.recover(out, []) == [dead.name] and tree(out) == before

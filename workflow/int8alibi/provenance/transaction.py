"""A stage's ``--out`` folder as a transaction: a failed run leaves the previous outputs exactly as they were.

Stages remove an earlier run's record before computing (so a failure never leaves a stale pass
behind) and replace outputs one file at a time; either would lose or mix good results when a run
fails. So before a stage runs, every entry of its folder is moved (renamed: no bytes copied, and out
of reach of anything the stage writes) into a hidden snapshot folder inside it (so on the same
filesystem, also when the folder is a mount point), ``.<folder>.<host>-<pid>.<random>.previous``,
and the stage starts in an otherwise empty folder. On success the
snapshot's entries that the run did not write again are moved back (a stage writing part of a shared
folder, like one generation run of two, keeps the other's files) and the rest dropped; on any failure
(an exception, ``SystemExit``, Ctrl-C) everything the run wrote is removed and every entry moved
back. A run killed outright leaves its snapshot, and the next run into the folder restores it before
starting.

Entries that are not this run's to move are left in place: a sub-folder holding a manifest of its
own (a separate stage, such as a faults shard), one holding an input of the run (determinism's
``runs/``), and other processes' temporaries. An exclusive lock on the folder (``flock`` on the
directory itself: nothing is added to it) makes runs into one folder take turns.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import InputError
from .atomic import host_tag, process_alive

log = logging.getLogger("int8alibi")

SUFFIX = ".previous"
_SNAPSHOT = re.compile(r"^\.(?P<name>.+)\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)\.[0-9a-f]+\.previous$")
_OWN_TEMP = re.compile(r"^\..*\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")


def _holds_manifest(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and any(path.rglob("manifest.json"))


def _left_alone(entry: Path, inputs: list[Path]) -> bool:
    """Not this run's to change: a separate stage's folder, a folder holding an input, a foreign temporary."""
    if entry.name.endswith(".tmp"):
        owner = _OWN_TEMP.match(entry.name)
        return not (owner and owner["host"] == host_tag() and int(owner["pid"]) == os.getpid())
    if entry.name.endswith(SUFFIX):
        return True
    resolved = entry.absolute()
    if any(p == resolved or resolved in p.parents for p in inputs):
        return True
    return _holds_manifest(entry)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _entries(out: Path, inputs: list[Path]) -> list[Path]:
    return sorted(p for p in out.iterdir() if not _left_alone(p, inputs))


def snapshot(out: Path, inputs: list[Path]) -> Path:
    """Move this run's entries of ``out`` into a new hidden folder inside it; return that folder."""
    snap = out / f".{out.name}.{host_tag()}-{os.getpid()}.{secrets.token_hex(4)}{SUFFIX}"
    snap.mkdir()
    for entry in _entries(out, inputs):
        os.rename(entry, snap / entry.name)
    return snap


def restore(out: Path, snap: Path, inputs: list[Path]) -> None:
    """Make this run's entries of ``out`` exactly the snapshot's, then remove the snapshot."""
    for entry in _entries(out, inputs):
        _remove(entry)
    for entry in sorted(snap.iterdir()):
        os.rename(entry, out / entry.name)
    snap.rmdir()


def merge(out: Path, snap: Path) -> None:
    """Move back the snapshot's entries the run did not write again; drop the others and the snapshot."""
    for entry in sorted(snap.iterdir()):
        if not (out / entry.name).exists() and not (out / entry.name).is_symlink():
            os.rename(entry, out / entry.name)
    shutil.rmtree(snap)


def recover(out: Path, inputs: list[Path]) -> list[str]:
    """Restore the snapshot a killed run into ``out`` left (its process gone); one line per snapshot found."""
    lines = []
    for snap in sorted(out.glob(f".{glob_escape(out.name)}.*{SUFFIX}")):
        owner = _SNAPSHOT.match(snap.name)
        if owner is None or owner["name"] != out.name:
            continue
        if owner["host"] != host_tag() or process_alive(int(owner["pid"])):
            raise InputError(f"{snap}: the previous outputs of {out}, kept by process {owner['pid']} on host "
                             f"{owner['host']}, which may still be running; if no run is using {out}, move "
                             f"that folder's entries back into {out} (or remove it) and run again")
        restore(out, snap, inputs)
        lines.append(f"restored the previous outputs of {out} from {snap.name}, left by process {owner['pid']} "
                     "that no longer runs (it stopped before finishing)")
    return lines


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on the folder ``out`` (waiting for another run into it to finish)."""
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("%s: another run is writing into this folder; waiting for it to finish", out)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def stage_transaction(out: Path, inputs: Iterable[Path] = ()) -> Iterator[None]:
    """Run the block with ``out`` locked and emptied into a snapshot; put the previous entries back on any
    failure, and those not written again on success."""
    kept = [Path(p).absolute() for p in inputs]
    with locked(out):
        for line in recover(out, kept):
            log.warning("%s", line)
        snap = snapshot(out, kept)
        try:
            yield
        except BaseException:
            restore(out, snap, kept)
            raise
        merge(out, snap)

"""A stage's ``--out`` folder as a transaction: a failed or killed run leaves the previous outputs in place.

Stages remove an earlier run's record before computing (so a failure never leaves a stale pass
behind) and replace outputs one file at a time; either would lose or mix good results when a run
fails. So before a stage runs, every entry of its folder is moved (renamed: no bytes copied, and out
of reach of anything the stage writes) into a hidden snapshot folder inside it (so on the same
filesystem, also when the folder is a mount point), ``.<folder>.<host>-<pid>.<random>.previous``,
and the stage starts in an otherwise empty folder. On success the snapshot's entries that the run
did not write again are moved back (a stage writing part of a shared folder, like one generation run
of two, keeps the other's files) and the rest dropped; on any failure (an exception, ``SystemExit``,
Ctrl-C) everything the run wrote is removed and every entry moved back. While a snapshot is being
filled, and once the run is over, it is named ``...<random>-settle.previous``: a run interrupted
there is finished by moving the snapshot's entries back where the folder lacks them, never by
discarding the folder's entries (those are the previous outputs not yet set aside, or the run's own).

A run killed outright (SIGKILL, the OOM killer, a cluster's time limit) can restore nothing itself,
and while its outputs sit in the snapshot Snakemake sees them missing and, with the stage's
consumers up to date, would run nothing. So each run first starts a watcher: a small process in a
session of its own that ignores SIGTERM, SIGINT and SIGHUP, holds the reading end of a pipe whose
writing end only the run holds (and any child it forks), and exits when the run tells it the
transaction is over. If the pipe
closes without that word the run is gone, and the watcher puts the folder back at once: the
previous outputs are in place (they verify), and Snakemake, which had marked the job incomplete,
redoes it on the next run. Where the watcher died as well (a host crash), the next run into the
folder restores the snapshot before starting.

That next run is then the first to see those outputs, which Snakemake did not see when it prepared
the job: it holds no copy of them, and deletes whatever outputs a failed job leaves. So a run that
restored a killed run's snapshot puts the previous outputs back, should it fail, into that snapshot
again rather than into the folder: nothing is lost, and the next run into the folder restores them.

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
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ..errors import InputError
from .atomic import host_tag, process_alive

log = logging.getLogger("int8alibi")

SUFFIX = ".previous"
SETTLING = "-settle"  # the run is over: the snapshot's entries go back where the folder lacks them
_SNAPSHOT = re.compile(r"^\.(?P<name>.+)\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)\.(?P<token>[0-9a-f]+)"
                       rf"(?P<settling>{SETTLING})?\.previous$")
_OWN_TEMP = re.compile(r"^\..*\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")
DONE = b"d"  # what a run writes to its watcher when its transaction is over
_watchers: list[subprocess.Popen[bytes]] = []  # kept until they exit: one collected while running would warn


def _holds_manifest(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and any(path.rglob("manifest.json"))


def _left_alone(entry: Path, inputs: list[Path], owner: int) -> bool:
    """Not run ``owner``'s to change: a separate stage's folder, a folder holding an input, a snapshot,
    another process's temporary."""
    if entry.name.endswith(".tmp"):
        temp = _OWN_TEMP.match(entry.name)
        return not (temp and temp["host"] == host_tag() and int(temp["pid"]) == owner)
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


def _entries(out: Path, inputs: list[Path], owner: int) -> list[Path]:
    return sorted(p for p in out.iterdir() if not _left_alone(p, inputs, owner))


def _snapshot_path(out: Path, token: str, settling: bool) -> Path:
    return out / f".{out.name}.{host_tag()}-{os.getpid()}.{token}{SETTLING if settling else ''}{SUFFIX}"


def snapshot(out: Path, inputs: list[Path]) -> Path:
    """Move this run's entries of ``out`` into a new hidden folder inside it; return that folder.

    It is filled under its settling name, so a run killed half-way gets every entry back, then renamed."""
    token = secrets.token_hex(4)
    filling = _snapshot_path(out, token, settling=True)
    filling.mkdir()
    for entry in _entries(out, inputs, os.getpid()):
        os.rename(entry, filling / entry.name)
    return filling.rename(_snapshot_path(out, token, settling=False))


def settle(out: Path, snap: Path) -> None:
    """Move back the snapshot's entries that ``out`` lacks; drop the others and the snapshot."""
    if not snap.name.endswith(SETTLING + SUFFIX):
        snap = snap.rename(snap.with_name(snap.name[:-len(SUFFIX)] + SETTLING + SUFFIX))
    for entry in sorted(snap.iterdir()):
        if not (out / entry.name).exists() and not (out / entry.name).is_symlink():
            os.rename(entry, out / entry.name)
    shutil.rmtree(snap)


def discard(out: Path, inputs: list[Path], owner: int) -> None:
    """Remove every entry of ``out`` that run ``owner`` may have written (its temporaries included)."""
    for entry in _entries(out, inputs, owner):
        _remove(entry)


def restore(out: Path, snap: Path, inputs: list[Path], owner: int | None = None) -> None:
    """Make run ``owner``'s (default: this process's) entries of ``out`` exactly the snapshot's; remove it."""
    discard(out, inputs, os.getpid() if owner is None else owner)
    settle(out, snap)


def merge(out: Path, snap: Path) -> None:
    """Move back the snapshot's entries the run did not write again; drop the others and the snapshot."""
    settle(out, snap)


def recover(out: Path, inputs: list[Path], owner: int | None = None) -> list[str]:
    """Finish what runs into ``out`` that no longer run left: restore the snapshot of one killed while
    it ran, finish moving back one killed after it. Only process ``owner``'s when given (its watcher),
    else every one (a snapshot whose process may still run is an ``InputError``). Returns the names of
    the snapshots restored."""
    restored = []
    for snap in sorted(out.glob(f".{glob_escape(out.name)}.*{SUFFIX}")):
        found = _SNAPSHOT.match(snap.name)
        if found is None or found["name"] != out.name:
            continue
        pid = int(found["pid"])
        if owner is not None:
            if pid != owner or found["host"] != host_tag():
                continue
        elif found["host"] != host_tag() or process_alive(pid):
            raise InputError(f"{snap}: the previous outputs of {out}, kept by process {pid} on host "
                             f"{found['host']}, which may still be running; if no run is using {out}, move "
                             f"that folder's entries back into {out} (or remove it) and run again")
        if found["settling"]:
            settle(out, snap)
            log.warning("%s: finished moving back the entries of %s, left by process %d that stopped "
                        "after its run was over", out, snap.name, pid)
            continue
        restore(out, snap, inputs, pid)
        restored.append(snap.name)
        log.warning("restored the previous outputs of %s from %s, left by process %d that no longer runs "
                    "(it stopped before finishing)", out, snap.name, pid)
    return restored


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


def watch(argv: list[str]) -> None:
    """The watcher's body: ``FD PID OUT [INPUT ...]``. Waits for run ``PID`` to end; if it ended without
    writing ``DONE`` to ``FD``, restores ``OUT`` from its snapshot. Signals meant for the run's process
    group or session (a kill of the whole job, a closed terminal) do not stop it."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    fd, pid, folder, *inputs = argv
    with os.fdopen(int(fd), "rb") as pipe:
        if pipe.read(len(DONE)) == DONE:
            return
    out = Path(folder)
    if not out.is_dir():
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with locked(out):
        recover(out, [Path(p) for p in inputs], owner=int(pid))


def _start_watcher(out: Path, inputs: list[Path]) -> int:
    """Start this run's watcher (``watch``); return the pipe's writing end, only this process holds it."""
    read, write = os.pipe()
    code = "import sys; from int8alibi.files.transaction import watch; watch(sys.argv[1:])"
    package_parent = str(Path(__file__).resolve().parents[2])  # the watcher runs this very copy of the package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
    try:
        watcher = subprocess.Popen([sys.executable, "-c", code, str(read), str(os.getpid()), str(out.absolute()),
                                    *map(str, inputs)], pass_fds=(read,), start_new_session=True, env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    except OSError as exc:
        os.close(write)
        raise InputError(f"{out}: cannot start the process that restores it should this run be killed "
                         f"({exc.strerror or exc})") from None
    finally:
        os.close(read)
    _watchers[:] = [w for w in _watchers if w.poll() is None]
    _watchers.append(watcher)
    return write


def _release(write: int) -> None:
    """Tell the watcher the transaction is over, so it exits without touching the folder."""
    try:
        with suppress(BrokenPipeError):  # a watcher already gone has nothing to be told
            os.write(write, DONE)
    finally:
        os.close(write)


@contextmanager
def stage_transaction(out: Path, inputs: Iterable[Path] = ()) -> Iterator[None]:
    """Run the block with ``out`` locked, watched and emptied into a snapshot; put the previous entries
    back on any failure (into a killed run's snapshot, if this run restored one), and those not written
    again on success."""
    kept = [Path(p).absolute() for p in inputs]
    with locked(out):
        watcher = _start_watcher(out, kept)
        try:
            unseen = recover(out, kept)  # outputs Snakemake did not see when it prepared this job
            snap = snapshot(out, kept)
            try:
                yield
            except BaseException:
                if unseen:
                    discard(out, kept, os.getpid())
                    snap.rename(out / unseen[0])
                    log.warning("%s: the previous outputs, restored from a killed run's snapshot, stay in %s "
                                "for the next run to restore (outputs left in place would be deleted as those "
                                "of a failed job)", out, unseen[0])
                else:
                    restore(out, snap, kept)
                raise
            merge(out, snap)
        finally:
            _release(watcher)

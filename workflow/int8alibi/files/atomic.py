"""Atomic file replacement: a failed writer leaves no partial file and keeps any previous one.

Temporary files and folders are named ``.<name>.<host>-<pid>.<random>.tmp`` beside their target, so
the next run of a stage can tell whose they are: ``sweep_stale`` removes those of dead processes on
this host (a SIGKILLed capture leaves its operands folder) and reports any other. A full disk
(ENOSPC) while writing is a ``DiskFullError`` naming the file, not a library traceback.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import DiskFullError

_OWNED = re.compile(r"^\..*\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")
_TEMP = re.compile(r"^\..+\.tmp$")


def host_tag() -> str:
    """This host's name as it appears in temporaries' names."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())


def temp_prefix(name: str) -> str:
    """The prefix of a temporary beside ``name``: hidden, and naming this host and process."""
    return f".{name}.{host_tag()}-{os.getpid()}."


def temp_dir(parent: str | os.PathLike[str], name: str) -> Path:
    """A new temporary folder in ``parent`` for building ``name`` (renamed onto it when complete)."""
    with disk_space(Path(parent) / name):
        Path(parent).mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=parent, prefix=temp_prefix(name), suffix=".tmp"))


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC from the OS, or from a library that keeps only the message: pyarrow's OSError, or
    safetensors' own error type (``IoError(Os { code: 28, kind: StorageFull, ... })``)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    return isinstance(exc, Exception) and ("No space left on device" in str(exc) or "StorageFull" in str(exc))


@contextmanager
def disk_space(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn ENOSPC raised inside the block (by the OS or by a library in its own error type) into a
    ``DiskFullError`` naming ``path``."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as exc:
        if is_disk_full(exc):
            free = shutil.disk_usage(Path(path).parent if Path(path).parent.exists() else ".").free
            raise DiskFullError(f"{path}: disk full while writing ({free} bytes free on its filesystem); "
                                "nothing partial was kept: free space and run the stage again") from None
        raise


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    The temporary file lives in the same directory so ``os.replace`` is a same-filesystem
    rename (atomic on POSIX). On any exception the temporary file is removed and the exception
    propagates (ENOSPC as ``DiskFullError``); an existing ``path`` is left untouched.
    """
    target = Path(path)
    with disk_space(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=temp_prefix(target.name), suffix=".tmp")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            yield tmp
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are meant to be shared read-only
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _size(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        return sum(p.lstat().st_size for p in path.rglob("*"))
    return path.lstat().st_size


def sweep_stale(folder: str | os.PathLike[str]) -> list[str]:
    """Remove the temporaries in ``folder`` (recursively) that a dead process of this host left; return
    one line per temporary found: removed, or left in place with the reason (another host, a live
    process, or no owner in its name)."""
    folder, here = Path(folder), host_tag()
    lines: list[str] = []
    if not folder.is_dir():
        return lines
    found = [p for p in folder.rglob(".*.tmp") if _TEMP.match(p.name)]
    for path in sorted(found, key=lambda p: len(p.parts)):
        if not path.exists() and not path.is_symlink():  # inside a temporary removed just before
            continue
        size, owner = _size(path), _OWNED.match(path.name)
        if owner is not None and owner["host"] == here and not process_alive(int(owner["pid"])):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            lines.append(f"removed {path} ({size} bytes), left by process {owner['pid']} that no longer runs")
        else:
            why = ("no owner in its name" if owner is None else f"process {owner['pid']} still runs"
                   if owner["host"] == here else f"written on host {owner['host']}")
            lines.append(f"left in place {path} ({size} bytes): {why}; remove it by hand if no run is using it")
    return lines


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)

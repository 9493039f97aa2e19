"""One executing run per results folder: a second one (another config, another checkout sharing
``results_root``) is refused instead of interleaving its jobs' outputs and manifests with the first's.

The lock is an exclusive ``flock`` on ``<results>/.run/lock``, taken when a run starts executing
(Snakemake's ``onstart``; never by ``-n``) and held by the ``snakemake`` process until it exits, so
a crashed run never leaves it behind. The file names its holder for the refusal message.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import socket
from pathlib import Path
from typing import IO

from ..errors import InputError
from ..printable import printable

LOCK = "lock"


def hold(results: str | os.PathLike[str], config: str) -> IO[str]:
    """Take the run lock of ``results`` for this process's lifetime (keep the returned handle open)."""
    folder = Path(results) / ".run"
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / LOCK, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read(500).strip() or "holder unknown"
        handle.close()
        raise InputError(f"{results}: another run is executing into this results folder ({printable(holder)}); "
                         "wait for it to finish, or give this run its own results folder") from None
    handle.seek(0)
    handle.truncate()
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    handle.write(f"process {os.getpid()} on host {socket.gethostname()} since {now}, run config {config}\n")
    handle.flush()
    return handle

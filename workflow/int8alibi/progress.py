"""Progress a person can follow: while a stage runs, a line every ten seconds on the console and in its log.

Snakemake shows what a job writes to standard output as it comes, and a rule sends standard error
to the job's log; a stage's heartbeat (``heartbeat``, started by ``stages.stage_main``) writes one
plain line to both every ``PERIOD_S`` seconds: the stage, the time so far and where the counted task
under way (``Progress``) stands. No carriage returns, no redrawn bars: a log reads line by line, and
nothing here enters an output (timings are never hashed). A library's own bar, which redraws a line
with carriage returns, is switched off in jobs (``quiet_bars``) or, where it insists, reduced to its
last state (``plain_stderr``).
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import time
from collections.abc import Generator, Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any, TextIO

PERIOD_S = 10.0
log = logging.getLogger("int8alibi.progress")
_current: list[Progress] = []  # the counted tasks under way, innermost last
_lock = threading.Lock()


class Progress:
    """A counted task: iterate over it (or call ``update``) as the work is done; ``close`` when finished.

    Takes the arguments the stages gave tqdm's bar (``total``, ``desc``, ``unit``, ``disable``);
    a disabled one counts nothing and is never shown.
    """

    def __init__(self, iterable: Iterable[Any] | None = None, total: int | None = None, desc: str = "",
                 unit: str = "item", disable: bool = False) -> None:
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.desc, self.unit, self.disable = total, desc, unit, disable
        self.done, self.note, self.started = 0, "", time.monotonic()
        if not disable:
            with _lock:
                _current.append(self)

    def __iter__(self) -> Iterator[Any]:
        try:
            for item in self.iterable or ():
                yield item
                self.update()
        finally:  # also when the loop over it stops early or raises: a failed task is no longer under way
            self.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.done += n

    def set_postfix_str(self, note: str) -> None:
        """A word on the item under way, shown after the count."""
        self.note = note

    def close(self) -> None:
        with _lock:
            if self in _current:
                _current.remove(self)
                log.info("%s: %s in %.0f s", self.desc, self._count(), time.monotonic() - self.started)

    def _count(self) -> str:
        if self.total:
            return f"{self.done}/{self.total} {self.unit}s ({100 * self.done // self.total}%)"
        return f"{self.done} {self.unit}s"

    def line(self) -> str:
        return f"{self.desc}: {self._count()}" + (f", {self.note}" if self.note else "")


class _PlainLines(io.TextIOBase):
    """Standard error as a log reads it: a carriage return starts the line over, as on a terminal, so a
    bar redrawn in place (a library's tqdm) leaves one line, its last state."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.line = out, ""

    def write(self, text: str) -> int:
        *ended, rest = text.split("\n")
        for part in ended:
            self.out.write((self.line + part).rsplit("\r", 1)[-1] + "\n")
            self.line = ""
        self.line = (self.line + rest).rsplit("\r", 1)[-1]
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def fileno(self) -> int:
        return self.out.fileno()

    def finish(self) -> None:
        """Write a last line left without its newline."""
        if self.line:
            self.out.write(self.line + "\n")
            self.line = ""
        self.out.flush()


@contextmanager
def plain_stderr() -> Generator[None, None, None]:
    """Within the block, ``sys.stderr`` (the rule's log) gets plain lines only (``_PlainLines``)."""
    original = sys.stderr
    plain = _PlainLines(original)
    sys.stderr = plain
    try:
        yield
    finally:
        sys.stderr = original
        plain.finish()


def quiet_bars(environ: MutableMapping[str, str] | None = None) -> None:
    """Switch tqdm's bars off (``TQDM_DISABLE``) for the processes started from here: the libraries the
    stages call (transformers, llm-compressor) draw them with carriage returns, which fill a log."""
    (os.environ if environ is None else environ)["TQDM_DISABLE"] = "1"


def status() -> str:
    """Where the counted tasks under way stand, innermost last; ``running`` when none is counted."""
    with _lock:
        return "; ".join(p.line() for p in _current) or "running"


@contextmanager
def heartbeat(stage: str, period: float = PERIOD_S, console: TextIO | None = None) -> Generator[None, None, None]:
    """Write ``int8alibi <stage>: <seconds> s, <status>`` every ``period`` seconds while the block runs,
    to ``console`` (default standard output) and to the log."""
    out = sys.stdout if console is None else console
    stop = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not stop.wait(period):
            line = f"int8alibi {stage}: {time.monotonic() - start:.0f} s, {status()}"
            try:
                print(line, file=out, flush=True)
            except (OSError, ValueError):  # a closed console: the log still has it
                pass
            log.info(line)

    thread = threading.Thread(target=beat, name=f"{stage}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()

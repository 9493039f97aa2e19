"""A stage's device memory: held to the run's budget, its peak written to its log (never to a hashed
output) and read back.

A run with a device-memory budget (``gpu_budget_mb``) caps each GPU job's CUDA allocator at the budget
(``cap_to_budget``), so a larger card behaves like one of the budget's size: a job that would not fit
such a card fails with an out-of-memory error instead of passing unnoticed. The CUDA context lies
outside torch's allocator and outside the cap.

Snakemake's benchmark files hold host memory only. A stage that used a CUDA device logs one line
at its end, ``int8alibi device memory: peak_allocated_bytes=N peak_reserved_bytes=M device=NAME``
(torch's own counters since the process started); ``int8alibi bench dag`` reads the largest such
line of each stage's logs. The value varies run to run, which is why it lives in the log.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

PREFIX = "int8alibi device memory:"
LINE = re.compile(rf"{re.escape(PREFIX)} peak_allocated_bytes=(\d+) peak_reserved_bytes=(\d+) device=(.*)$")


def cap_to_budget(budget_bytes: int | None, log: logging.Logger) -> None:
    """Cap this process's CUDA allocator at ``budget_bytes`` of the current device (None: no budget, no
    cap). Called only by a GPU stage of a CUDA run, after its device is chosen: it initialises CUDA."""
    if budget_bytes is None:
        return
    import torch

    if not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)
    log.info("%s capped at the run's budget: %d MiB of %s's %d MiB", PREFIX, budget_bytes >> 20,
             torch.cuda.get_device_name(device), total >> 20)


def log_peak_device_memory(log: logging.Logger) -> None:
    """Log the peak CUDA memory of this process, if it initialised CUDA (else nothing; torch is
    not imported for a stage that did not import it)."""
    torch = sys.modules.get("torch")
    if torch is None or not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    device = torch.cuda.current_device()
    log.info("%s peak_allocated_bytes=%d peak_reserved_bytes=%d device=%s", PREFIX,
             torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device),
             torch.cuda.get_device_name(device))


def peak_reserved_bytes(log_file: Path) -> int | None:
    """The largest ``peak_reserved_bytes`` logged in ``log_file`` (None: no such line)."""
    peaks = [int(m.group(2)) for line in Path(log_file).read_text(encoding="utf-8", errors="replace").splitlines()
             if (m := LINE.search(line))]
    return max(peaks) if peaks else None

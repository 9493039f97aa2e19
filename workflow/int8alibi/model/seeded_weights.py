"""Seeded bf16 weights from a counter-based integer hash: the same bits on every machine.

A random-number generator's stream depends on the device, the library version and how the work is
split; a hash of (tensor key, element index) does not. Element ``i`` of a tensor with 64-bit key
``k`` starts from ``s``, the sum of the four 16-bit fields of
``splitmix64(k + (i + 1) * 0x9E3779B97F4A7C15)``: an Irwin-Hall sum of four uniforms, an integer in
[0, 262140], bell-shaped and symmetric about 131070. Its value is
``bf16(float32(s - 131070) * scale[r] + offset)`` for its row ``r``. A matrix's rows get their own
gains, as a trained model's output channels have (so their int8 scales spread over a few octaves):
``scale[r] = float32(std * g_r / (sigma * rms))`` with ``g_r = 1 + 0.75 (s_r - 131070) / 131070``
from the row's own hash sum ``s_r`` (0.25 to 1.75), sigma the sum's standard deviation and rms that
of the gains, so the matrix's standard deviation is ``std``; a vector has one row of gain 1.
Per element there is integer arithmetic, one float32 multiply (and add) and one rounding to bf16
(round to nearest even, on the float32 bits), each exact: the bytes depend on neither the chunking,
nor the workers, nor the machine. Large tensors are filled by worker processes (numpy's small steps
hold the GIL between them: 16 threads ran as ~1.3 cores on an H200's host) straight into the
shared file (in /dev/shm where there is one) that becomes the tensor's memory. A worker is
``python -m int8alibi.model.seeded_weights``: it imports numpy and this module only (a
multiprocessing child would import the stage's main module, torch and all: ~0.8 GB each), reads
one JSON request a line and answers ``ok`` or the error.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import math
import mmap
import os
import subprocess
import sys
import tempfile

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError

if TYPE_CHECKING:  # torch is imported where a tensor is made: the workers import this module without it
    import torch

log = logging.getLogger("int8alibi.model")
KEY_DOMAIN = "int8alibi-synthetic-counter-hash"
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
MASK64 = (1 << 64) - 1
FIELDS, FIELD_MAX = 4, 0xFFFF
SUM_MAX = FIELDS * FIELD_MAX  # 262140
SUM_CENTRE = SUM_MAX // 2  # 131070: the sum's mean and median
SUM_SIGMA = math.sqrt(FIELDS * ((FIELD_MAX + 1) ** 2 - 1) / 12)  # std of a sum of four uniforms on 0..65535
GAIN_SPREAD = 0.75  # row gains 1 +- 0.75: output channels' absmax spread over about 2.8 octaves
GAIN_RMS = math.sqrt(1 + (GAIN_SPREAD * SUM_SIGMA / SUM_CENTRE) ** 2)
CHUNK = 1 << 14  # elements per step: the working arrays stay in cache (measured fastest of 2^12..2^16)
PROCESS_MIN = 1 << 22  # elements: a smaller tensor is filled in this process (workers cost more than they save)
SPANS_PER_WORKER = 4

_INCREMENTS = np.arange(1, CHUNK + 1, dtype=np.uint64) * np.uint64(GOLDEN)  # (j + 1) * GOLDEN mod 2^64


def tensor_key(seed: int, name: str) -> int:
    """The 64-bit key of tensor ``name`` under ``seed`` (independent of every other tensor)."""
    if seed < 0:
        raise InputError(f"seeded weights: seed={seed} must be >= 0")
    digest = hashlib.sha256(f"{KEY_DOMAIN}|{seed}|{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _mix(key: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``splitmix64`` of elements [start, start + count) in place, and a scratch array of the same size."""
    if start < 0 or not 0 <= count <= CHUNK:
        raise InputError(f"splitmix64: start={start} must be >= 0 and count={count} in [0, {CHUNK}]")
    z = _INCREMENTS[:count] + np.uint64((key + start * GOLDEN) & MASK64)
    t = np.empty_like(z)
    for shift, mul in ((30, MIX1), (27, MIX2)):
        np.right_shift(z, np.uint64(shift), out=t)
        z ^= t
        z *= np.uint64(mul)
    np.right_shift(z, np.uint64(31), out=t)
    z ^= t
    return z, t


def splitmix64(key: int, start: int, count: int) -> np.ndarray:
    """``splitmix64(key + (i + 1) * GOLDEN)`` for i in [start, start + count), as uint64."""
    return _mix(key, start, count)[0]


def field_sums(key: int, start: int, count: int) -> np.ndarray:
    """The Irwin-Hall sums (int64 in [0, SUM_MAX]) of elements [start, start + count) of tensor ``key``."""
    z, t = _mix(key, start, count)
    np.right_shift(z, np.uint64(16), out=t)  # fields 1 and 3 beside fields 0 and 2: two 17-bit pair sums
    t &= np.uint64(0x0000FFFF0000FFFF)
    z &= np.uint64(0x0000FFFF0000FFFF)
    z += t
    np.right_shift(z, np.uint64(32), out=t)
    z &= np.uint64(0xFFFFFFFF)
    z += t
    return z.view(np.int64)


def row_scales(key: int, rows: int, std: float, *, gains: bool = True) -> np.ndarray:
    """float32 scale of each of ``rows`` rows: ``std * g_r / (SUM_SIGMA * GAIN_RMS)`` for the row
    gains of key ``key`` (``gains=False``: every row ``std / SUM_SIGMA``), rounded once from float64."""
    if not (std > 0 and math.isfinite(std)):
        raise InputError(f"seeded weights: std={std} must be finite and > 0")
    if rows < 1:
        raise InputError(f"seeded weights: rows={rows} must be >= 1")
    if not gains:
        return np.full(rows, std / SUM_SIGMA, dtype=np.float64).astype(np.float32)
    sums = np.concatenate([field_sums(key, start, min(CHUNK, rows - start)) for start in range(0, rows, CHUNK)])
    return (std * row_gains(sums) / (SUM_SIGMA * GAIN_RMS)).astype(np.float32)


def row_gains(sums: np.ndarray) -> np.ndarray:
    """float64 gain of rows with hash sums ``sums``: 1 + GAIN_SPREAD (s - SUM_CENTRE) / SUM_CENTRE."""
    return 1.0 + GAIN_SPREAD * (sums.astype(np.float64) - SUM_CENTRE) / SUM_CENTRE


def element_values(sums: np.ndarray, scales: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """float32 ``float32(s - SUM_CENTRE) * scale + offset`` per element (bf16 is one rounding away)."""
    values = (sums - SUM_CENTRE).astype(np.float32)
    values *= scales
    if offset:
        values += np.float32(offset)
    return values


def default_threads() -> int:
    """The CPUs this process may use (a cluster job's allocation, not the whole host)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns (uint16) of finite float32 ``values``, rounded to nearest even."""
    bits = values.view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def _write_span(flat: np.ndarray, key: int, scales: np.ndarray, offset: float, lo: int, hi: int, chunk: int) -> None:
    """Elements [lo, hi) of tensor ``key`` as bf16 bits into ``flat`` (uint16, the whole tensor)."""
    cols = flat.size // scales.size
    for start in range(lo, hi, chunk):
        stop = min(start + chunk, hi)
        first, last = start // cols, (stop - 1) // cols
        counts = np.full(last - first + 1, cols)
        counts[0] -= start - first * cols
        counts[-1] -= (last + 1) * cols - stop
        values = element_values(field_sums(key, start, stop - start),
                                np.repeat(scales[first:last + 1], counts), offset)  # each element's row scale
        flat[start:stop] = bf16_bits(values)


def _serve_one(request: dict[str, Any]) -> None:
    """A worker's request: fill its spans of the shared file (the tensor's bf16 bits, then its
    float32 row scales)."""
    n, rows, key, offset, chunk = (int(request["n"]), int(request["rows"]), int(request["key"]),
                                   float(request["offset"]), int(request["chunk"]))
    with open(str(request["path"]), "r+b") as handle, mmap.mmap(handle.fileno(), 0) as shared:
        flat = np.frombuffer(shared, dtype=np.uint16, count=n)  # plain arrays: a np.memmap slice costs more
        scales = np.frombuffer(shared, dtype=np.float32, count=rows, offset=_scales_offset(n))
        for lo, hi in request["spans"]:
            _write_span(flat, key, scales, offset, int(lo), int(hi), chunk)
        del flat, scales  # before the map closes


def _scales_offset(n: int) -> int:
    """Where the row scales start in the shared file: after the bits, 4-byte aligned."""
    return -(-2 * n // 4) * 4


def _serve() -> None:
    """The worker's loop: one JSON request per line on stdin, one answer per line on stdout."""
    for line in sys.stdin:
        try:
            _serve_one(json.loads(line))
            answer = "ok"
        except Exception as exc:  # answered, so the parent raises it naming the tensor
            answer = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


class _Shared:
    """A file of ``size`` bytes mapped into this process (in /dev/shm where there is one), its space
    reserved up front so that a full file system is an OSError here, not a crash in a worker."""

    def __init__(self, size: int) -> None:
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, self.path = tempfile.mkstemp(prefix="int8alibi-seeded-", dir=directory)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        except OSError:  # the caller fills the tensor in its own process instead
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        self.linked = True

    def unlink(self) -> None:
        """Remove the name once every worker has mapped the file (the maps keep it)."""
        if self.linked:
            os.unlink(self.path)
            self.linked = False


class _Workers:
    """``count`` worker processes, started once and kept while this process lives."""

    def __init__(self, count: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True) for _ in range(count)]
        atexit.register(self.close)

    def tensor(self, shape: tuple[int, ...], key: int, scales: np.ndarray, offset: float, chunk: int) -> torch.Tensor:
        """A bf16 tensor of ``shape`` whose memory is a shared file the workers filled: worker i
        takes spans i, i + count, ... of a few per worker. This process never touches the pages
        (faulting them in, not the arithmetic, is what one process would spend its time on)."""
        import torch

        n, count = math.prod(shape), len(self.procs)
        shared = _Shared(_scales_offset(n) + 4 * scales.size)
        try:
            np.frombuffer(shared.map, dtype=np.float32, count=scales.size, offset=_scales_offset(n))[:] = scales
            step = -(-n // (count * SPANS_PER_WORKER) // chunk) * chunk  # chunk-aligned
            spans = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
            for i, proc in enumerate(self.procs):
                request = {"path": shared.path, "n": n, "rows": scales.size, "key": key, "offset": offset,
                           "spans": spans[i::count], "chunk": chunk}
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(request) + "\n")
                proc.stdin.flush()
            answers = []
            for proc in self.procs:
                assert proc.stdout is not None
                answers.append(proc.stdout.readline().strip() or f"worker exited with status {proc.poll()}")
        finally:
            shared.unlink()  # the map keeps the memory; the tensor keeps the map
        failed = [a for a in answers if a != "ok"]
        if failed:
            shared.map.close()
            raise InputError(f"seeded weights: a worker process failed: {failed[0]}")
        return torch.frombuffer(shared.map, dtype=torch.bfloat16, count=n).view(shape)

    def close(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
        for proc in self.procs:
            proc.wait()


_WORKERS: dict[int, _Workers] = {}


def _workers(count: int) -> _Workers:
    if count not in _WORKERS:
        _WORKERS[count] = _Workers(count)
    return _WORKERS[count]


def fill(out: torch.Tensor, key: int, scales: np.ndarray, offset: float = 0.0, *, chunk: int = CHUNK) -> torch.Tensor:
    """Write element ``i`` of tensor ``key`` into ``out.view(-1)[i]`` for every i, rows of
    ``out.numel() // len(scales)`` elements scaled by ``scales``, in this process; returns ``out``.

    ``out``: a contiguous bf16 CPU tensor. ``chunk`` changes only the speed.
    """
    import torch

    if out.dtype != torch.bfloat16 or out.device.type != "cpu" or not out.is_contiguous():
        raise InputError(f"seeded weights: fill needs a contiguous bf16 CPU tensor, got {out.dtype} on {out.device}")
    _check(out.numel(), scales, chunk)
    _write_span(out.view(-1).view(torch.int16).numpy().view(np.uint16), key, scales, offset, 0, out.numel(), chunk)
    return out


def _check(n: int, scales: np.ndarray, chunk: int) -> None:
    if not 1 <= chunk <= CHUNK:
        raise InputError(f"seeded weights: chunk={chunk} outside [1, {CHUNK}]")
    if scales.dtype != np.float32 or scales.ndim != 1 or not scales.size or n % scales.size:
        raise InputError(f"seeded weights: {scales.size} float32 row scales do not divide {n} elements")


def seeded_tensor(shape: tuple[int, ...], seed: int, name: str, std: float, offset: float = 0.0, *,
                  threads: int | None = None, chunk: int = CHUNK) -> torch.Tensor:
    """A new bf16 CPU tensor of ``shape`` holding tensor ``name``'s seeded values (a matrix's rows
    with their gains, a vector's elements without): from ``threads`` worker processes (default: the
    CPUs this process may use) when it has at least ``PROCESS_MIN`` elements, else this process."""
    import torch

    rows = shape[0] if len(shape) == 2 else 1
    scales = row_scales(tensor_key(seed, f"{name}|rows"), rows, std, gains=len(shape) == 2)
    key, n = tensor_key(seed, name), math.prod(shape)
    workers = max(1, min(threads or default_threads(), -(-n // chunk)))
    if workers > 1 and n >= PROCESS_MIN:
        _check(n, scales, chunk)
        try:
            return _workers(workers).tensor(shape, key, scales, offset, chunk)
        except OSError as exc:  # e.g. a container's small /dev/shm: the same bytes, one process
            log.warning("seeded weights: %s (%s bytes): no shared file for the workers (%s); filling it here",
                        name, f"{2 * n:,}", exc)
    return fill(torch.empty(shape, dtype=torch.bfloat16), key, scales, offset, chunk=chunk)


if __name__ == "__main__":
    _serve()

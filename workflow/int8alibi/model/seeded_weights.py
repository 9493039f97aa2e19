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
Per element there is integer arithmetic, one float32 multiply (and add) and one rounding to bf16,
each exact IEEE arithmetic: the bytes depend on neither the chunking, nor the threads, nor the machine.
"""

from __future__ import annotations

import hashlib
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..errors import InputError

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


def fill(out: torch.Tensor, key: int, scales: np.ndarray, offset: float = 0.0, *, threads: int | None = None,
         chunk: int = CHUNK) -> torch.Tensor:
    """Write element ``i`` of tensor ``key`` into ``out.view(-1)[i]`` for every i, rows of
    ``out.numel() // len(scales)`` elements scaled by ``scales``; returns ``out``.

    ``out``: a contiguous bf16 CPU tensor. ``threads`` and ``chunk`` change only the speed.
    """
    if out.dtype != torch.bfloat16 or out.device.type != "cpu" or not out.is_contiguous():
        raise InputError(f"seeded weights: fill needs a contiguous bf16 CPU tensor, got {out.dtype} on {out.device}")
    if not 1 <= chunk <= CHUNK:
        raise InputError(f"seeded weights: chunk={chunk} outside [1, {CHUNK}]")
    n = out.numel()
    if scales.dtype != np.float32 or scales.ndim != 1 or not scales.size or n % scales.size:
        raise InputError(f"seeded weights: {scales.size} float32 row scales do not divide {n} elements")
    flat, cols = out.view(-1), n // scales.size

    def span(lo: int, hi: int) -> None:
        for start in range(lo, hi, chunk):
            stop = min(start + chunk, hi)
            first, last = start // cols, (stop - 1) // cols
            counts = np.full(last - first + 1, cols)
            counts[0] -= start - first * cols
            counts[-1] -= (last + 1) * cols - stop
            values = element_values(field_sums(key, start, stop - start),
                                    np.repeat(scales[first:last + 1], counts), offset)  # each element's row scale
            flat[start:stop].copy_(torch.from_numpy(values))  # rounded to nearest even, to bf16

    workers = max(1, min(threads or default_threads(), -(-n // chunk)))
    if workers == 1:
        span(0, n)
        return out
    step = -(-n // (workers * 4) // chunk) * chunk  # a few spans per thread, chunk-aligned
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda lo: span(lo, min(lo + step, n)), range(0, n, step)))
    return out


def seeded_tensor(shape: tuple[int, ...], seed: int, name: str, std: float, offset: float = 0.0, *,
                  threads: int | None = None) -> torch.Tensor:
    """A new bf16 CPU tensor of ``shape`` holding tensor ``name``'s seeded values (a matrix's rows
    with their gains, a vector's elements without)."""
    rows = shape[0] if len(shape) == 2 else 1
    scales = row_scales(tensor_key(seed, f"{name}|rows"), rows, std, gains=len(shape) == 2)
    out = torch.empty(shape, dtype=torch.bfloat16)
    return fill(out, tensor_key(seed, name), scales, offset, threads=threads)

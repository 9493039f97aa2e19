"""Seeded bf16 weights from a counter-based integer hash: the same bits on every machine.

A random-number generator's stream depends on the device, the library version and how the work is
split; a hash of (tensor key, element index) does not. Element ``i`` of a tensor with 64-bit key
``k`` is ``table[s]``, where ``s`` is the sum of the four 16-bit fields of
``splitmix64(k + (i + 1) * 0x9E3779B97F4A7C15)`` (an Irwin-Hall sum of four uniforms: an integer in
[0, 262140], bell-shaped, symmetric about 131070) and ``table`` maps each possible sum to its bf16
value once: ``bf16(float32(s - 131070) * float32(std / sigma) + offset)``, sigma being the sum's
standard deviation. Everything per element is integer arithmetic and a table lookup, so the bytes do
not depend on the chunking, the thread count or the machine; the one float step is the table.
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
CHUNK = 1 << 14  # elements per step: the working arrays stay in cache (measured fastest of 2^12..2^16)

_INCREMENTS = np.arange(1, CHUNK + 1, dtype=np.uint64) * np.uint64(GOLDEN)  # (j + 1) * GOLDEN mod 2^64


def tensor_key(seed: int, name: str) -> int:
    """The 64-bit key of tensor ``name`` under ``seed`` (independent of every other tensor)."""
    if seed < 0:
        raise InputError(f"seeded weights: seed={seed} must be >= 0")
    digest = hashlib.sha256(f"{KEY_DOMAIN}|{seed}|{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def splitmix64(key: int, start: int, count: int) -> np.ndarray:
    """``splitmix64(key + (i + 1) * GOLDEN)`` for i in [start, start + count), as uint64."""
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
    return z


def field_sums(key: int, start: int, count: int) -> np.ndarray:
    """The Irwin-Hall sums (int64 in [0, SUM_MAX]) of elements [start, start + count) of tensor ``key``."""
    z = splitmix64(key, start, count)
    pairs = (z & np.uint64(0x0000FFFF0000FFFF)) + ((z >> np.uint64(16)) & np.uint64(0x0000FFFF0000FFFF))
    return ((pairs & np.uint64(0xFFFFFFFF)) + (pairs >> np.uint64(32))).view(np.int64)


def value_table(std: float, offset: float = 0.0) -> torch.Tensor:
    """bf16 value of every sum 0..SUM_MAX: ``bf16(float32(s - SUM_CENTRE) * float32(std / SUM_SIGMA) + offset)``."""
    if not (std > 0 and math.isfinite(std) and math.isfinite(offset)):
        raise InputError(f"seeded weights: std={std} must be finite and > 0, offset={offset} finite")
    centred = torch.arange(-SUM_CENTRE, SUM_CENTRE + 1, dtype=torch.float32)
    scaled = centred * torch.tensor(std / SUM_SIGMA, dtype=torch.float32)
    return (scaled + torch.tensor(offset, dtype=torch.float32)).to(torch.bfloat16)


def default_threads() -> int:
    """The CPUs this process may use (a cluster job's allocation, not the whole host)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def fill(out: torch.Tensor, key: int, table: torch.Tensor, *, threads: int | None = None,
         chunk: int = CHUNK) -> torch.Tensor:
    """Write element ``i`` of tensor ``key`` into ``out.view(-1)[i]`` for every i; returns ``out``.

    ``out``: a contiguous bf16 CPU tensor. ``threads`` and ``chunk`` change only the speed.
    """
    if out.dtype != torch.bfloat16 or out.device.type != "cpu" or not out.is_contiguous():
        raise InputError(f"seeded weights: fill needs a contiguous bf16 CPU tensor, got {out.dtype} on {out.device}")
    if not 1 <= chunk <= CHUNK:
        raise InputError(f"seeded weights: chunk={chunk} outside [1, {CHUNK}]")
    flat = out.view(-1).view(torch.int16).numpy()
    lookup = table.view(torch.int16).numpy()
    n = flat.size

    def span(lo: int, hi: int) -> None:
        for start in range(lo, hi, chunk):
            stop = min(start + chunk, hi)
            np.take(lookup, field_sums(key, start, stop - start), out=flat[start:stop])

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
    """A new bf16 CPU tensor of ``shape`` holding tensor ``name``'s seeded values."""
    out = torch.empty(shape, dtype=torch.bfloat16)
    return fill(out, tensor_key(seed, name), value_table(std, offset), threads=threads)

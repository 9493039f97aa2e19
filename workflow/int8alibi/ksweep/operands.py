"""Seeded sweep operands: drawn once per seed at the largest K, quantized per K to int8 and to e4m3.

The draw happens on the CPU from a seeded generator, so a seed names the same values on every
device; each K takes the first K columns of both matrices and gets its own scales. Quantization
uses IEEE divisions, absolute maxima and round-to-nearest-even only, so it gives the same bytes
on CPU and GPU.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ..errors import InputError

INT8_MAX = 127.0
E4M3_MAX = 448.0
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Draw:
    """Float32 activations [M, K_max] (rows of unequal magnitude) and weights [N, K_max] of one seed."""

    seed: int
    x: torch.Tensor
    w: torch.Tensor

    def digest(self) -> str:
        """SHA-256 of both matrices' float32 bytes: names the draw in the tables."""
        h = hashlib.sha256()
        for t in (self.x, self.w):
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()


@dataclass(frozen=True)
class Quantized:
    """One format's operands at one K: a_q [M,K], w_q [N,K], s_a [M] and s_w [N] float32."""

    a_q: torch.Tensor
    w_q: torch.Tensor
    s_a: torch.Tensor
    s_w: torch.Tensor


def draw(seed: int, m: int, n: int, k_max: int) -> Draw:
    """x = randn[m,k_max] * 2**randint(-2, 3, [m,1]), w = randn[n,k_max], in that generator order."""
    if min(m, n, k_max) < 1:
        raise InputError(f"ksweep operands: m, n and k_max must be positive, got {m}, {n}, {k_max}")
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    x = torch.randn(m, k_max, generator=g, dtype=torch.float32)
    w = torch.randn(n, k_max, generator=g, dtype=torch.float32)
    rows = torch.pow(2.0, torch.randint(-2, 3, (m, 1), generator=g).to(torch.float32))
    return Draw(int(seed), x * rows, w)


def _per_row(t: torch.Tensor, limit: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(t / s clamped to ±limit, s) with s = absmax/limit per row; an all-zero row gets s = 0, q = 0."""
    absmax = t.abs().amax(dim=1)
    s = absmax / torch.full_like(absmax, limit)
    safe = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.where((s == 0)[:, None], torch.zeros_like(t), t / safe[:, None])
    return q.clamp(-limit, limit), s


def fp8_per_row(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``t [R, K]`` as e4m3 per row: (q, s) with s = absmax/448 (the sweep's FP8 rule)."""
    q, s = _per_row(t, E4M3_MAX)
    return q.to(FP8), s


def quantize(d: Draw, k: int, fmt: str, device: torch.device | str) -> Quantized:
    """The first ``k`` columns of the draw in ``fmt`` (``int8`` or ``fp8``), on ``device``."""
    if not 1 <= k <= d.x.shape[1]:
        raise InputError(f"ksweep operands: K={k} outside the draw's 1..{d.x.shape[1]}")
    x = d.x[:, :k].to(device)
    w = d.w[:, :k].to(device)
    if fmt == "int8":
        qx, s_a = _per_row(x, INT8_MAX)
        qw, s_w = _per_row(w, INT8_MAX)
        return Quantized(torch.round(qx).to(torch.int8), torch.round(qw).to(torch.int8), s_a, s_w)
    if fmt == "fp8":
        qx, s_a = fp8_per_row(x)
        qw, s_w = fp8_per_row(w)
        return Quantized(qx, qw, s_a, s_w)
    raise InputError(f"ksweep operands: unknown format {fmt!r} (expected int8 or fp8)")

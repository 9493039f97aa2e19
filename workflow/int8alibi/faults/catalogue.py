"""The nine faults (preregistration/faults.yaml) as small pure functions.

Epilogue faults (F1-F5) map the float32 accumulator and the scales to arm B's full bf16 output;
a severity then decides at which output elements arm B shows it (``campaign``). Precondition
faults (F6, F7) decide how the operands of both arms are inflated; F9 builds arm B's operands.
F8 changes nothing and so has no function: arm B is the reference itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..arith import bf16_rne, bf16_round, bf16_rtz
from ..errors import InputError
from .pipeline import scale


def f1_scale_precision(acc_f32: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """F1: both scales rounded to bf16 (nearest even) before they multiply the accumulator.

    Models a kernel that loads its scales in bf16. Weight scales stored in bf16 and powers of two
    survive the cast, so the fault shows only where a scale needs more than 8 significand bits.
    """
    s_a16 = bf16_round(s_a, "rne").to(torch.float32)
    s_w16 = bf16_round(s_w, "rne").to(torch.float32)
    return bf16_rne(scale(acc_f32, s_a16, s_w16))


def f2_double_rounding(acc_f32: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """F2: ``f32(acc) * s_a`` rounded to bf16 before the second multiply, then rounded again.

    Models a kernel that stores an intermediate in bf16 (e.g. between two fused stages).
    """
    partial = bf16_rne(acc_f32 * s_a[:, None]).to(torch.float32)
    return bf16_rne(partial * s_w[None, :])


def f3_scale_order(acc_f32: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """F3: the scales multiplied together first, ``f32(acc) * (s_a * s_w)``.

    Models a kernel that precomputes the outer product of the scales: the float32 rounding moves
    from ``acc * s_a`` to ``s_a * s_w``. A legitimate reassociation rather than a defect.
    """
    return bf16_rne(acc_f32 * (s_a[:, None] * s_w[None, :]))


def f4_output_truncation(acc_f32: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """F4: the reference scaling, but the final cast to bf16 rounds toward zero.

    Models a kernel whose output conversion truncates (as Triton's CPU interpreter does).
    """
    return bf16_rtz(scale(acc_f32, s_a, s_w))


def f5_accumulate_(total: torch.Tensor, partial_f32: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """One step of F5's fused reduction, in place: ``total += partial * s_w``, in float32.

    ``partial_f32`` is a K-tile's exact integer partial sum converted to float32 (exact up to
    2^24, nearest even beyond). The product and the sum are two separate float32 roundings (two
    kernels, never a fused multiply-add), so every device gives the same bits. In place because
    the campaign runs it K/tile times per regime on [M, N].
    """
    return total.add_(partial_f32 * s_w[None, :])


def f5_finish(total: torch.Tensor, s_a: torch.Tensor) -> torch.Tensor:
    """The end of F5's fused order: the activation scale, then one rounding to bf16."""
    return bf16_rne(total * s_a[:, None])


def f5_fused_order(partials: Iterable[torch.Tensor], s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """F5: the per-channel scale folded into the reduction, a float32 sum over K-tiles in order.

    Models a kernel that scales each K-tile's integer partial sum as it goes (a split-K or
    streamed epilogue): ``bf16_rne((sum_t f32(P_t) * s_w) * s_a)`` with the sum taken left to
    right over the float32 tile sums ``partials`` (from ``pipeline.tile_partial_sums``).
    """
    total: torch.Tensor | None = None
    for partial in partials:
        if total is None:
            total = torch.zeros(partial.shape, dtype=torch.float32, device=partial.device)
        f5_accumulate_(total, partial, s_w)
    if total is None:
        raise InputError("f5_fused_order: no K-tiles (K = 0)")
    return f5_finish(total, s_a)


def wraps_int32(acc: torch.Tensor) -> torch.Tensor:
    """Where an exact int64 accumulator leaves the int32 range [-2^31, 2^31 - 1]."""
    return (acc > 2**31 - 1) | (acc < -(2**31))


def f6_overflow_repeats(acc: torch.Tensor, what: str) -> int:
    """F6: the least r such that the exact accumulator of operands tiled r times along K wraps.

    Tiling both operands r times along K multiplies every exact accumulator entry by r, so r is
    read off the largest positive and negative entries: r * max >= 2^31 or r * (-min) > 2^31.
    An all-zero accumulator cannot be made to wrap by depth; that is an error naming ``what``.
    """
    top, bottom = int(acc.max().item()), -int(acc.min().item())
    candidates = []
    if top > 0:
        candidates.append(-(-(2**31) // top))  # ceil(2^31 / top)
    if bottom > 0:
        candidates.append(2**31 // bottom + 1)
    if not candidates:
        raise InputError(f"{what}: F6 cannot be induced: the accumulator is all zero, so no depth makes it wrap")
    return min(candidates)


def f7_repeats(max_abs: int, k: int, f32_exact_bound: int, product_bound: int, limit: int) -> int | None:
    """F7: the least r with r * max|acc| > 2^24 and the int32 bound still holding at depth r*K.

    ``product_bound * r * K < limit`` keeps check 2 silent and, since every |acc| <= 16256 * K,
    keeps the tiled accumulator below 2^31. None when no such r exists for this ``max_abs``.
    """
    if max_abs <= 0:
        return None
    r = f32_exact_bound // max_abs + 1
    return r if product_bound * r * k < limit else None


def f7_boost(a_q: torch.Tensor, w_q: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """F7's fallback when tiling alone cannot pass 2^24: activation row 0 := 127 * sign(w_q[j]).

    ``j`` is the weight row with the largest sum of magnitudes (the first such), so accumulator
    entry (0, j) becomes 127 * sum|w_q[j]|, the largest one activation row can produce against
    that weight. Returns (new a_q, boosted row, weight row).
    """
    j = int(w_q.to(torch.int32).abs().sum(dim=1).argmax().item())  # K * 128 < 2^31 for any real K
    boosted = a_q.clone()
    boosted[0] = (127 * torch.sign(w_q[j].to(torch.int16))).to(torch.int8)
    return boosted, 0, j


def f9_all(a_q: torch.Tensor) -> torch.Tensor:
    """F9 all: every activation element one step away, +1, or -1 where it is +127 (stays in int8)."""
    step = torch.where(a_q == 127, -1, 1).to(torch.int16)
    return (a_q.to(torch.int16) + step).to(torch.int8)


def f9_one(a_q: torch.Tensor, row: int, col: int) -> tuple[torch.Tensor, int]:
    """F9 one: activation element (row, col) one step away, as in ``f9_all``; returns (a_q, delta).

    Only accumulator row ``row`` changes, by ``delta * w_q[:, col]`` (a rank-one update).
    """
    delta = -1 if int(a_q[row, col].item()) == 127 else 1
    moved = a_q.clone()
    moved[row, col] += delta
    return moved, delta


def f9_pct(s_a: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """F9 pct: the activation scales at ``rows`` moved to the next float32 up; int8 tensors untouched."""
    moved = s_a.clone()
    moved[rows] = torch.nextafter(s_a[rows], torch.full_like(s_a[rows], float("inf")))
    return moved

"""The one home of fault application: how each fault of preregistration/faults.yaml perturbs a
scaled INT8 GEMM (a_q, w_q int8; s_a, s_w; int32 accumulator; epilogue), given the seeded picks.

Every function broadcasts over leading dimensions: accumulators [..., M, N], activations
[..., M, K], weights [..., N, K], activation scales [..., M], weight scales [..., N]. The batched
engine (``batched``) calls them on stacks of layers and regimes, the per-cell engine
(``campaign``) and the token-level injection (``tokens.inject``) on one GEMM, so the three apply a
fault the same way by construction. What each family perturbs:

* F1-F5, the epilogue: arm B's bf16 output from the float32 accumulator and the scales
  (``epilogue_fault``; F5 from its own float32 reduction over K-tiles, ``fused_reduction``);
* F6, F7, the depth (both arms): both operands tiled r times along K, which multiplies the exact
  accumulator by r (``inflate``); F7 may first boost activation row 0;
* F8: nothing, arm B is the reference;
* F9, arm B's operands: every activation element one step (``step_all``), one element, which
  changes one accumulator row (``step_one``), or a fraction of the activation scales one float32
  step up (``nudge_scales``); the picks come from ``one_position`` and ``pct_rows``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import torch

from ..arith import F32_EXACT_BOUND, INT8_PRODUCT_MAX, bf16_rne, bf16_round, bf16_rtz, wrap_int32
from ..errors import InputError
from .checks import Thresholds
from .pipeline import float32_tiles, scale, tile_partial_sums

SEVERITIES = ("one", "pct", "all")
EPILOGUE_FAULTS = ("F1", "F2", "F3", "F4", "F5")
INFLATING = ("F6", "F7")      # precondition faults: arm A carries them too
OPERAND_FAULTS = ("F9",)
# The catalogue the campaign implements: fault -> the severities it runs.
FAULT_SEVERITIES: dict[str, tuple[str, ...]] = {
    **{f: SEVERITIES for f in EPILOGUE_FAULTS},
    "F6": ("all",), "F7": ("all",), "F8": ("all",), "F9": SEVERITIES,
}


@dataclass(frozen=True)
class Rounding:
    """How arm B's float32 values become bf16: ``rne`` to nearest even, ``rtz`` toward zero."""

    rne: Callable[[torch.Tensor], torch.Tensor]
    rtz: Callable[[torch.Tensor], torch.Tensor]


def _cast_rtz(x: torch.Tensor) -> torch.Tensor:
    """``arith.bf16_rtz``'s truncation without its NaN read-back (a NaN may truncate to inf)."""
    return (x.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)


# ``arith``'s roundings keep a NaN's sign and payload, at the price of reading back whether there
# is one; a caller that flags NaNs itself (and reruns those layers with CHECKED) takes the casts.
CHECKED = Rounding(bf16_rne, bf16_rtz)
CAST = Rounding(lambda x: x.to(torch.bfloat16), _cast_rtz)


def _f1_scale_precision(acc_f32: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
                        rounding: Rounding) -> torch.Tensor:
    """F1: both scales rounded to bf16 (nearest even) before they multiply the accumulator.

    Models a kernel that loads its scales in bf16; bf16 weight scales and powers of two survive
    the cast, so the fault shows only where a scale needs more than 8 significand bits.
    """
    s_a16 = bf16_round(s_a, "rne").to(torch.float32)
    s_w16 = bf16_round(s_w, "rne").to(torch.float32)
    return rounding.rne(scale(acc_f32, s_a16, s_w16))


def _f2_double_rounding(acc_f32: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
                        rounding: Rounding) -> torch.Tensor:
    """F2: ``f32(acc) * s_a`` rounded to bf16 before the second multiply, then rounded again
    (a kernel that stores an intermediate in bf16)."""
    partial = rounding.rne(acc_f32 * s_a[..., :, None]).to(torch.float32)
    return rounding.rne(partial * s_w[..., None, :])


def _f3_scale_order(acc_f32: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
                    rounding: Rounding) -> torch.Tensor:
    """F3: ``f32(acc) * (s_a * s_w)``, the outer product of the scales first: the float32 rounding
    moves from ``acc * s_a`` to ``s_a * s_w`` (a legitimate reassociation rather than a defect)."""
    return rounding.rne(acc_f32 * (s_a[..., :, None] * s_w[..., None, :]))


def _f4_output_truncation(acc_f32: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
                          rounding: Rounding) -> torch.Tensor:
    """F4: the reference scaling, but the final cast to bf16 rounds toward zero (as Triton's CPU
    interpreter does)."""
    return rounding.rtz(scale(acc_f32, s_a, s_w))


_SCALING_FAULTS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Rounding], torch.Tensor]] = {
    "F1": _f1_scale_precision, "F2": _f2_double_rounding, "F3": _f3_scale_order, "F4": _f4_output_truncation,
}


def epilogue_fault(fault: str, acc_f32: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
                   f5_total: Callable[[], torch.Tensor], rounding: Rounding = CHECKED) -> torch.Tensor:
    """Arm B's full bf16 output under epilogue fault ``fault`` (F1-F5).

    ``acc_f32`` is the int32 accumulator as float32; ``f5_total`` gives F5's float32 reduction
    (``fused_reduction``), asked for only by F5, which finishes it: ``bf16_rne(total * s_a)``.
    """
    if fault == "F5":
        return rounding.rne(f5_total() * s_a[..., :, None])
    if fault not in _SCALING_FAULTS:
        raise InputError(f"epilogue_fault: {fault!r} is not an epilogue fault ({', '.join(EPILOGUE_FAULTS)})")
    return _SCALING_FAULTS[fault](acc_f32, s_a, s_w, rounding)


def _f5_tile_sums(a_q: torch.Tensor, w_q: torch.Tensor, width: int) -> Iterator[torch.Tensor]:
    """float32(P_t) of each K-tile of ``width`` columns, [..., M, N], in tile order, one at a time.

    One GEMM takes ``pipeline.tile_partial_sums``, the device's fastest exact route (oneDNN's int8
    GEMM on the CPU). A stack takes one float32 matmul per tile while ``width * 16384 <= 2^24``
    (every partial sum an integer below 2^24, exact in float32 in any order), else that route GEMM
    by GEMM.
    """
    if width < 1:
        raise InputError(f"F5: tile width {width} must be positive")
    if a_q.dim() == 2 and w_q.dim() == 2:
        yield from tile_partial_sums(a_q, w_q, width)
    elif width * INT8_PRODUCT_MAX <= F32_EXACT_BOUND:
        yield from float32_tiles(a_q, w_q, width)
    else:
        lead = torch.broadcast_tensors(a_q[..., 0, 0], w_q[..., 0, 0])[0].shape
        a_flat = a_q.expand(*lead, *a_q.shape[-2:]).reshape(-1, *a_q.shape[-2:])
        w_flat = w_q.expand(*lead, *w_q.shape[-2:]).reshape(-1, *w_q.shape[-2:])
        for tile in zip(*(tile_partial_sums(a, w, width) for a, w in zip(a_flat, w_flat))):
            yield torch.stack(tile).reshape(*lead, a_q.shape[-2], w_q.shape[-2])


def fused_reduction(a_q: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor, width: int) -> torch.Tensor:
    """F5's fused order before its last step: ``sum_t f32(P_t) * s_w`` over K-tiles, left to right
    from a float32 zero.

    Models a kernel that scales each K-tile's integer partial sum as it goes (split-K or a streamed
    epilogue). The product and the sum are two float32 roundings (two kernels, never a fused
    multiply-add), so every device gives the same bits. ``s_w`` may carry more leading dimensions
    than the operands (one per regime): all of them share each tile's sums.
    """
    total: torch.Tensor | None = None
    for partial in _f5_tile_sums(a_q, w_q, width):
        term = partial * s_w[..., None, :]
        if total is None:
            total = torch.zeros_like(term)   # from +0: a first term of -0 sums to +0, as in a kernel
        total.add_(term)
    if total is None:
        raise InputError("F5: no K-tiles (K = 0)")
    return total


@dataclass(frozen=True)
class Inflation:
    """F6 or F7 on both arms, per GEMM (leading dimensions [...]): the operands tiled ``repeats``
    times along K, so the exact accumulator is ``repeats`` times that of the stored ones.

    Where ``reachable`` is false the fault cannot be induced (``refusal`` says why) and the other
    fields mean nothing; ``checked`` turns that into an error for a caller with one GEMM.
    """

    a_q: torch.Tensor       # [..., M, K] the activations tiled (F7: row 0 boosted where ``boosted``)
    exact: torch.Tensor     # [..., M, N] int64 exact accumulator at the inflated depth
    repeats: torch.Tensor   # [...] int64
    absmax: torch.Tensor    # [...] int64 max |exact|
    boosted: torch.Tensor   # [...] bool
    reachable: torch.Tensor  # [...] bool
    refusal: str

    def checked(self, what: str) -> "Inflation":
        """This inflation, or an error naming ``what`` where any GEMM cannot take the fault."""
        if not bool(self.reachable.all()):
            raise InputError(f"{what}: {self.refusal}")
        return self


def _f6_overflow(exact: torch.Tensor, a_q: torch.Tensor) -> Inflation:
    """F6: the least r at which the tiled accumulator wraps, read off the extremes:
    ``r * max >= 2^31`` or ``r * (-min) > 2^31``; an all-zero accumulator cannot wrap."""
    top, bottom = exact.amax((-2, -1)), -exact.amin((-2, -1))
    never = torch.full_like(top, 2**40)
    r = torch.minimum(torch.where(top > 0, -(-(2**31) // top.clamp(min=1)), never),
                      torch.where(bottom > 0, 2**31 // bottom.clamp(min=1) + 1, never))
    reachable = r != never
    r = torch.where(reachable, r, torch.ones_like(r))
    return Inflation(a_q, exact * r[..., None, None], r, r * torch.maximum(top, bottom), torch.zeros_like(reachable),
                     reachable, "F6 cannot be induced: the accumulator is all zero, so no depth makes it wrap")


def _f7_past_f32(exact: torch.Tensor, a_q: torch.Tensor, w_q: torch.Tensor,
                 accumulate: Callable[[torch.Tensor], torch.Tensor], th: Thresholds) -> Inflation:
    """F7: the least r with ``r * max|acc| > 2^24`` while ``product_bound * r * K < limit`` (check 2
    silent, the tiled accumulator below 2^31). Where tiling alone cannot, activation row 0 first
    becomes ``127 * sign(w_q[j])``, j the weight row with the largest sum of magnitudes (the first
    such): accumulator entry (0, j) becomes the largest one activation row can make.
    ``accumulate`` gives the exact accumulator of activation rows [..., 1, K] against ``w_q``."""
    k = a_q.shape[-1]

    def depth(top_abs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = th.f32_exact_bound // top_abs.clamp(min=1) + 1
        return r, (top_abs > 0) & (th.product_bound * r * k < th.int32_limit)

    absmax = exact.abs().amax((-2, -1))
    r0, ok0 = depth(absmax)
    refusal = (f"F7 cannot be induced: even with a boosted activation row no depth passes {th.f32_exact_bound} "
               f"while {th.product_bound}*K stays below {th.int32_limit} (K={k})")
    if exact.dim() == 2 and bool(ok0):  # one GEMM that needs no boost: skip it (a stack reads nothing back)
        return Inflation(a_q, exact * r0, r0, r0 * absmax, ~ok0, ok0, refusal)
    j = w_q.to(torch.int32).abs().sum(-1).argmax(-1)                               # K * 128 < 2^31
    boost_row = (127 * torch.sign(torch.take_along_dim(w_q, j[..., None, None], -2).to(torch.int16))).to(torch.int8)
    new_row0 = accumulate(boost_row)                                               # [..., 1, N]
    rest = exact[..., 1:, :].abs().amax((-2, -1)) if exact.shape[-2] > 1 else torch.zeros_like(absmax)
    absmax_b = torch.maximum(rest, new_row0.abs().amax((-2, -1)))
    rb, okb = depth(absmax_b)
    boosted = ~ok0
    r = torch.where(boosted, rb, r0)
    acc = exact.clone()
    acc[..., :1, :] = torch.where(boosted[..., None, None], new_row0, exact[..., :1, :])
    moved = a_q.clone()
    moved[..., :1, :] = torch.where(boosted[..., None, None], boost_row, a_q[..., :1, :])
    return Inflation(moved, acc * r[..., None, None], r, r * torch.where(boosted, absmax_b, absmax), boosted,
                     ok0 | okb, refusal)


def inflate(fault: str, exact: torch.Tensor, a_q: torch.Tensor, w_q: torch.Tensor,
            accumulate: Callable[[torch.Tensor], torch.Tensor], th: Thresholds) -> Inflation:
    """F6 or F7 (``INFLATING``) on the exact accumulators ``exact`` of ``a_q`` against ``w_q``."""
    if fault == "F6":
        return _f6_overflow(exact, a_q)
    if fault == "F7":
        return _f7_past_f32(exact, a_q, w_q, accumulate, th)
    raise InputError(f"inflate: {fault!r} is not a depth fault ({', '.join(INFLATING)})")


def step_all(a_q: torch.Tensor) -> torch.Tensor:
    """F9 all: every activation element one step away, +1, or -1 where it is +127 (stays in int8)."""
    step = torch.where(a_q == 127, -1, 1).to(torch.int16)
    return (a_q.to(torch.int16) + step).to(torch.int8)


class OneStep(NamedTuple):
    """F9 one: activation element (row, col) one step away, as in ``step_all``."""

    element: torch.Tensor    # [...] int8 the element before the move
    step: torch.Tensor       # [...] the step taken, +1 or -1
    row: torch.Tensor        # [..., N] exact accumulator row ``row`` after it: the only one that changes
    acc32: torch.Tensor      # [..., M, N] the int32 accumulator with that row replaced


def step_one(a_q: torch.Tensor, exact: torch.Tensor, acc32: torch.Tensor, w_q: torch.Tensor,
             rows: torch.Tensor | int, cols: torch.Tensor | int) -> OneStep:
    """F9 one at positions ``rows``, ``cols`` (int64 [...], or one GEMM's ints): a rank-one update,
    row ``row`` of the accumulator moves by ``step * w_q[:, col]``."""
    at_row, at_col = (torch.as_tensor(i, device=a_q.device)[..., None, None] for i in (rows, cols))
    before = torch.take_along_dim(torch.take_along_dim(a_q, at_row, -2), at_col, -1)[..., 0, 0]
    step = torch.where(before == 127, -1, 1)
    column = torch.take_along_dim(w_q, at_col, -1)[..., 0].to(torch.int64)            # [..., N]
    row = torch.take_along_dim(exact, at_row, -2)[..., 0, :] + step[..., None] * column
    moved = acc32.expand(*row.shape[:-1], *acc32.shape[-2:]).clone()
    moved.scatter_(-2, at_row.expand(*row.shape[:-1], 1, acc32.shape[-1]), wrap_int32(row)[..., None, :])
    return OneStep(before, step, row, moved)


def stepped_operand(a_q: torch.Tensor, row: int, col: int, step: int) -> torch.Tensor:
    """F9 one's activations of one GEMM: ``a_q`` with element (row, col) moved by ``step``."""
    moved = a_q.clone()
    moved[row, col] += step
    return moved


def nudge_scales(s_a: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """F9 pct: the activation scales at ``rows`` [..., P] moved to the next float32 up; the int8
    tensors untouched."""
    picked = s_a.gather(-1, rows)
    return s_a.scatter(-1, rows, torch.nextafter(picked, torch.full_like(picked, float("inf"))))


def fraction_count(fraction: Fraction, total: int) -> int:
    """ceil(fraction * total), never below one: the size of a ``pct`` rung."""
    return max(1, math.ceil(fraction * total))


def one_position(rng: np.random.Generator, m: int, k: int) -> tuple[int, int]:
    """F9 one's seeded pick: the (row, col) of the activation element that moves."""
    return int(rng.integers(m)), int(rng.integers(k))


def pct_rows(rng: np.random.Generator, m: int, fraction: Fraction) -> np.ndarray:
    """F9 pct's seeded pick: the sorted activation-scale rows that move."""
    rows = rng.choice(m, size=fraction_count(fraction, m), replace=False, shuffle=False)
    return np.sort(rows).astype(np.int64)

"""The reference pipeline of the fault campaign (arm A): kernel semantics, bit for bit on any device.

A W8A8 kernel holds the exact integer sum wrapped to int32, converts it to float32, multiplies
by the per-token scale and then by the per-channel scale (each product rounded to float32) and
rounds once to bfloat16, nearest even: ``bf16_rne((f32(acc) * s_a) * s_w)``. Every fault in
``catalogue`` changes one step of this; the checks compare against the exact (int64) sum.

Each float32 operation here is one IEEE operation on the device (correctly rounded on CPU and
CUDA alike), so arm A's bits do not depend on where the campaign runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import torch

from ..arith import F32_EXACT_BOUND, INT8_PRODUCT_MAX, bf16_rne, exact_accumulator, snap_pow2, wrap_int32
from ..errors import InputError

Regime = Literal["own", "pow2"]
REGIMES: tuple[Regime, ...] = ("own", "pow2")


def as_scales(s: torch.Tensor, rows: int, what: str) -> torch.Tensor:
    """A scale vector as float32 [rows]: bf16 or float32, shape [rows] or [rows, 1], finite, >= 0.

    Checkpoints store weight scales as bf16 [N, 1]; converting bf16 to float32 is exact, so the
    kernel multiplies by the same numbers either way. Anything else names ``what`` and fails.
    """
    if not isinstance(s, torch.Tensor) or s.dtype not in (torch.float32, torch.bfloat16):
        got = s.dtype if isinstance(s, torch.Tensor) else type(s).__name__
        raise InputError(f"{what}: scales must be float32 or bfloat16, got {got}")
    if tuple(s.shape) not in ((rows,), (rows, 1)):
        raise InputError(f"{what}: scales of shape {tuple(s.shape)}, expected [{rows}] or [{rows}, 1]")
    s = s.reshape(rows).to(torch.float32)
    bad = ~torch.isfinite(s) | (s < 0)
    if bool(bad.any()):
        index = int(bad.nonzero()[0].item())
        raise InputError(f"{what}: {int(bad.sum())} scale(s) are negative or not finite "
                         f"(first: {s[index].item()!r} at {index})")
    return s


def regime_scales(s: torch.Tensor, regime: Regime, what: str) -> torch.Tensor:
    """The scales a regime runs with: ``own`` as given, ``pow2`` snapped to 2^round(log2 s).

    A zero scale (an all-zero activation row) stays zero: it has no nearest power of two, and it
    multiplies exactly already. Check 5 still sees it as not a power of two, so a cell with a
    zero scale reports check 5 not applicable rather than borrowing an exactness it lacks.
    """
    if regime == "own":
        return s
    if regime != "pow2":
        raise InputError(f"{what}: unknown scale regime {regime!r} (expected one of {REGIMES})")
    return snap_pow2(s, "nearest", name=what, keep_zero=True)


def scale(acc_f32: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """The reference scaling ``(acc * s_a) * s_w`` in float32, two rounded products, [..., M, N]
    from [..., M, N], [..., M] and [..., N] (the batched engine scales stacks of layers)."""
    return (acc_f32 * s_a[..., :, None]) * s_w[..., None, :]


def epilogue(acc32: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """The reference epilogue on a kernel's int32 accumulator: ``bf16_rne((f32(acc)*s_a)*s_w)``.

    int32 -> float32 rounds to nearest even, as the hardware conversion does, so an accumulator
    beyond 2^24 loses its low bits here exactly as in a kernel.
    """
    if acc32.dtype != torch.int32:
        raise InputError(f"epilogue: accumulator dtype {acc32.dtype} is not torch.int32")
    return bf16_rne(scale(acc32.to(torch.float32), s_a, s_w))


def tile_partial_sums(a_q: torch.Tensor, w_q: torch.Tensor, width: int) -> Iterator[torch.Tensor]:
    """float32(P_t) for consecutive K-tiles of ``width`` columns, in ascending order.

    P_t is the tile's exact integer partial sum; converting it to float32 is exact up to 2^24 and
    rounds to nearest even beyond. Exact sums are the same integers on every route, so each device
    takes its fastest: the CPU ``arith.exact_accumulator`` (oneDNN's int8 GEMM on a CPU with VNNI
    where proven exact, else OpenBLAS float32 chunks); elsewhere, while
    ``width * 16384 <= 2^24``, one float32 matmul per tile, whose every intermediate sum is an
    integer of magnitude at most 2^24, hence exact in any summation order (even with TF32 or bf16
    inputs, which hold int8 values exactly). The last tile is narrower when ``width`` does not
    divide K.
    """
    if width < 1:
        raise InputError(f"tile_partial_sums: tile width {width} must be positive")
    k = a_q.shape[1]
    if a_q.device.type != "cpu" and width * INT8_PRODUCT_MAX <= F32_EXACT_BOUND:
        yield from float32_tiles(a_q, w_q, width)
    else:  # a tile spanning all of K is the operand itself: contiguous() copies nothing then
        for start in range(0, k, width):
            tile = slice(start, start + width)
            yield exact_accumulator(a_q[:, tile].contiguous(), w_q[:, tile].contiguous()).to(torch.float32)


def float32_tiles(a_q: torch.Tensor, w_q: torch.Tensor, width: int) -> Iterator[torch.Tensor]:
    """``tile_partial_sums``' GPU route: one float32 matmul per tile, exact while
    ``width * 16384 <= 2^24`` (checked by the caller); a function of its own so that a CPU test
    can hold it to the exact sums too, and so that stacks of GEMMs ([..., M, K], [..., N, K]) can
    take it on any device (``catalogue.fused_reduction``)."""
    a32, w32 = a_q.to(torch.float32), w_q.to(torch.float32)
    for start in range(0, a_q.shape[-1], width):
        yield a32[..., start:start + width] @ w32[..., start:start + width].transpose(-1, -2)


def reference(
    a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Arm A on one operand set: (int32 accumulator, bf16 output [M, N])."""
    acc32 = wrap_int32(exact_accumulator(a_q, w_q))
    return acc32, epilogue(acc32, s_a, s_w)

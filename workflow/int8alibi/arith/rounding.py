"""Correct rounding of float32/float64 to bfloat16, decided on the integer bits.

Both kernels' last step is a float32 -> bf16 cast, and the faults include a truncating one, so the
project needs both modes bit-exact on any device. Float64 input is rounded once, directly from its
own bits: going through float32 first could round twice (onto a bf16 tie, then to even).

Float32, the hot path (every epilogue), shares bf16's exponent field, so rounding is a carry into
the upper 16 bits, in int32. Float64 takes the general route: rebuild the significand, shift it
by an amount that grows in bf16's subnormal range, round on the dropped bits. The tests check
the two routes against each other on every float32 class.
"""

from __future__ import annotations

from typing import Literal

import torch

from ..errors import InputError
from .bits import BFLOAT16, FLOAT32, FLOAT64, FloatFormat, assemble, fields, format_of

RoundingMode = Literal["rne", "rtz"]

_BF16_EMIN = 1 - BFLOAT16.bias  # -126: smallest normal exponent; below it the spacing stays 2**-133
_BF16_INF = BFLOAT16.exp_max << BFLOAT16.frac_bits  # 0x7F80
_BF16_MAX_FINITE = _BF16_INF - 1  # 0x7F7F
_BF16_QUIET = 1 << (BFLOAT16.frac_bits - 1)  # 0x0040
_MAX_SHIFT = 62  # any larger shift also leaves 0 with no round-up (significands are < 2**53)
_DROPPED_F32 = FLOAT32.frac_bits - BFLOAT16.frac_bits  # float32 -> bf16 drops the 16 low bits
_F32_INF = FLOAT32.exp_max << FLOAT32.frac_bits  # 0x7F800000


def bf16_round(x: torch.Tensor, mode: RoundingMode = "rne") -> torch.Tensor:
    """Round ``x`` (float32 or float64) to bfloat16: ``rne`` nearest-even or ``rtz`` toward zero.

    Subnormal results are rounded at bf16's fixed subnormal spacing; overflow gives inf under
    ``rne`` and the largest finite bf16 under ``rtz``; ±inf and signed zeros are kept; a NaN stays
    a NaN with its sign and leading payload bits, and its quiet bit set.
    """
    if mode not in ("rne", "rtz"):
        raise InputError(f"bf16_round: unknown rounding mode {mode!r} (expected 'rne' or 'rtz')")
    fmt = format_of(x, (FLOAT32, FLOAT64), "bf16_round input")
    if fmt is FLOAT32:
        return _round_float32(x, mode)
    return _round_general(x, fmt, mode)


def _round_float32(x: torch.Tensor, mode: RoundingMode) -> torch.Tensor:
    # On the signed bits: an arithmetic shift keeps the sign, so the upper half is the truncated
    # bf16 already, and every value stays within int16 once shifted (no cast wraps).
    bits = x.view(torch.int32)
    upper = bits >> _DROPPED_F32
    if mode == "rne":
        # Adding just under half (plus one when the kept part is odd) carries exactly when the
        # dropped bits are above half, or at half with an odd kept part; overflow carries to inf.
        # NaNs are replaced below; the clamp keeps a positive NaN's addition within int32.
        rounded = (bits.clamp(max=_F32_INF) + ((upper & 1) + ((1 << (_DROPPED_F32 - 1)) - 1))) >> _DROPPED_F32
    else:
        rounded = upper  # truncation: the largest finite float32 truncates to bf16's largest
    nan = torch.isnan(x)
    if x.device.type != "cpu" or bool(nan.any()):  # on the CPU the check is cheaper than the where
        rounded = torch.where(nan, upper | _BF16_QUIET, rounded)
    return rounded.to(torch.int16).view(torch.bfloat16)


def _round_general(x: torch.Tensor, fmt: FloatFormat, mode: RoundingMode) -> torch.Tensor:
    sign, exp, frac = fields(x, fmt)

    # value = sig * 2**(e - frac_bits); subnormal inputs share the minimum exponent.
    e = exp.clamp(min=1) - fmt.bias
    sig = frac | ((exp > 0).to(torch.int64) << fmt.frac_bits)
    # Keep 8 significant bits (7 stored + hidden), fewer where the result is a bf16 subnormal.
    shift = ((fmt.frac_bits - BFLOAT16.frac_bits) + (_BF16_EMIN - e).clamp(min=0)).clamp(max=_MAX_SHIFT)
    kept = sig >> shift
    if mode == "rne":
        one = torch.ones_like(shift)
        dropped = sig & ((one << shift) - 1)
        half = one << (shift - 1)
        round_up = (dropped > half) | ((dropped == half) & ((kept & 1) == 1))
        kept = kept + round_up.to(torch.int64)
        ceiling = _BF16_INF
    else:
        ceiling = _BF16_MAX_FINITE
    # ``kept`` carries the hidden bit, so adding it to (biased bf16 exponent - 1) << 7 yields the
    # exponent and fraction fields; a carry out of the fraction bumps the exponent by itself.
    magnitude = ((e - _BF16_EMIN).clamp(min=0) << BFLOAT16.frac_bits) + kept
    magnitude = magnitude.clamp(max=ceiling)

    nan = _BF16_INF | _BF16_QUIET | (frac >> (fmt.frac_bits - BFLOAT16.frac_bits))
    special = torch.where(frac != 0, nan, torch.full_like(nan, _BF16_INF))
    magnitude = torch.where(exp == fmt.exp_max, special, magnitude)
    return assemble(sign, magnitude, BFLOAT16)


def bf16_rne(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16, round to nearest even, on any device.

    torch's own float32 -> bf16 conversion rounds to nearest even on CPU and CUDA and is about a
    hundred times faster than the integer-bit reference ``bf16_round``; the two agree on every
    non-NaN float32 (the tests sweep every bf16 neighbourhood, ties, subnormals and overflow, on
    each device). torch canonicalises NaN payloads, so a tensor that holds a NaN goes through the
    reference instead, which keeps sign and payload.
    """
    _require_f32(x, "bf16_rne")
    if has_nan(x):
        return bf16_round(x, "rne")
    return x.to(torch.bfloat16)


def bf16_rtz(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16, round toward zero: the top 16 bits of each float32.

    bfloat16 is float32 with the low 16 fraction bits dropped, so truncation is exact for every
    non-NaN value (finite values never overflow, inf stays inf). A NaN whose payload sits in the
    dropped bits would truncate to inf, so tensors holding a NaN go through ``bf16_round``.
    """
    _require_f32(x, "bf16_rtz")
    if has_nan(x):
        return bf16_round(x, "rtz")
    return (x.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)


def has_nan(x: torch.Tensor) -> bool:
    """Whether ``x`` holds a NaN: torch's max propagates NaN, one reduction without a mask (on a GPU
    it reads the answer back)."""
    return x.numel() > 0 and bool(torch.isnan(x.amax()).item())


def _require_f32(x: torch.Tensor, who: str) -> None:
    if x.dtype != torch.float32:
        raise InputError(f"{who}: input dtype {x.dtype} is not torch.float32")

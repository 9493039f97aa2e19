"""Power-of-two scales: snapping a scale to 2^round(log2 s) or 2^ceil(log2 s), and recognising one.

Decided on the bits, without ``log2``: for s = m * 2^e with m in [1, 2), round(log2 s) is e when
m < sqrt(2) and e + 1 otherwise, and m < sqrt(2) iff m*m < 2, an integer comparison on the
significand (never a tie: m*m = 2 has no rational solution). Ceiling keeps exact powers.
"""

from __future__ import annotations

from typing import Literal

import torch

from ..errors import InputError
from .bits import BFLOAT16, FLOAT32, FLOAT64, FloatFormat, assemble, fields, format_of

SnapMode = Literal["nearest", "ceiling"]


def _first_offender(s: torch.Tensor, bad: torch.Tensor) -> str:
    index = int(bad.flatten().nonzero()[0].item())
    return f"{s.flatten()[index].item()!r} at flat index {index}"


def snap_pow2(s: torch.Tensor, mode: SnapMode, *, name: str = "scales") -> torch.Tensor:
    """Each positive normal float32/bf16 scale in ``s`` snapped to a power of two, same dtype.

    Raises InputError naming ``name`` if any scale is zero, negative, subnormal, inf or NaN, or if
    the snapped power (2^128) would not be representable in the dtype.
    """
    if mode not in ("nearest", "ceiling"):
        raise InputError(f"snap_pow2 {name}: unknown mode {mode!r} (expected 'nearest' or 'ceiling')")
    fmt = format_of(s, (FLOAT32, BFLOAT16), f"snap_pow2 {name}")
    sign, exp, frac = fields(s, fmt)
    bad = sign | (exp == 0) | (exp == fmt.exp_max)
    if bool(bad.any()):
        raise InputError(
            f"snap_pow2 {name}: {int(bad.sum())} of {s.numel()} scales are not positive finite normal "
            f"values (first: {_first_offender(s, bad)}); scales must be positive"
        )
    if mode == "nearest":
        significand = (1 << fmt.frac_bits) + frac  # m * 2**frac_bits; squared < 2**48
        up = significand * significand >= 2 << (2 * fmt.frac_bits)
    else:
        up = frac != 0
    exp = exp + up.to(torch.int64)
    overflow = exp == fmt.exp_max
    if bool(overflow.any()):
        raise InputError(
            f"snap_pow2 {name}: {mode} power of two of {_first_offender(s, overflow)} is 2^{fmt.bias + 1}, "
            f"not representable in {s.dtype}"
        )
    return assemble(sign, exp << fmt.frac_bits, fmt)


def _single_bit(x: torch.Tensor) -> torch.Tensor:
    return (x != 0) & ((x & (x - 1)) == 0)


def is_pow2(s: torch.Tensor) -> torch.Tensor:
    """Where ``s`` (float32, float64 or bf16) is a positive power of two, subnormal powers included."""
    fmt: FloatFormat = format_of(s, (FLOAT32, FLOAT64, BFLOAT16), "is_pow2 input")
    sign, exp, frac = fields(s, fmt)
    normal_power = (exp > 0) & (exp < fmt.exp_max) & (frac == 0)
    subnormal_power = (exp == 0) & _single_bit(frac)
    return ~sign & (normal_power | subnormal_power)

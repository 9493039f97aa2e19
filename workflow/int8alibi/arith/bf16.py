"""bf16 bit patterns: the views, the value classes read off the bits, and the ordered line.

Every comparison of bf16 outputs in the project (ulp distances, differing-element counts, the
campaign's dense comparisons, the checks) reads bits through these functions, so one definition
decides what "non-finite", "subnormal" and "one spacing apart" mean.

The ordered line maps sign-magnitude bits to signed integers: +0 and -0 both at 0, every other
finite value one step from its neighbours (the smallest subnormals at +1 and -1), so a spacing
count is a subtraction that also crosses zero. It is meaningless for inf and NaN, which callers
mask with ``nonfinite_bits``.
"""

from __future__ import annotations

import torch

from ..errors import InputError

SIGN = 0x8000
MAGNITUDE = 0x7FFF
EXPONENT = 0x7F80  # all exponent bits set: inf (fraction 0) or NaN
MIN_NORMAL = 0x0080  # magnitude bits of the smallest normal; nonzero magnitudes below it are subnormal
_NEGATIVE_ZERO_SIGNED = -32768  # 0x8000 sign-extended to int32


def require_bf16(x: torch.Tensor, what: str) -> None:
    """InputError naming ``what`` unless ``x`` is a bf16 tensor."""
    if x.dtype != torch.bfloat16:
        raise InputError(f"{what}: dtype {x.dtype} is not torch.bfloat16")


def signed_bits(x: torch.Tensor) -> torch.Tensor:
    """The 16 bits of each bf16 element, sign-extended to int32 (the form the ordered line takes)."""
    require_bf16(x, "bf16 bits input")
    return x.view(torch.int16).to(torch.int32)


def unsigned_bits(x: torch.Tensor) -> torch.Tensor:
    """The 16 bits of each bf16 element as an int32 in [0, 0xFFFF] (the pattern as written in hex)."""
    return signed_bits(x) & 0xFFFF


def ordered_line(bits: torch.Tensor) -> torch.Tensor:
    """Positions on the ordered line of sign-extended int32 bf16 bits (``signed_bits``).

    A set sign bit gives b = magnitude - 32768, so the position -magnitude is -32768 - b.
    """
    return torch.where(bits < 0, _NEGATIVE_ZERO_SIGNED - bits, bits)


def nonfinite_bits(bits: torch.Tensor) -> torch.Tensor:
    """Where bf16 bits (int16 views, signed or unsigned int32) hold inf or NaN."""
    return (bits & EXPONENT) == EXPONENT


def subnormal_bits(bits: torch.Tensor) -> torch.Tensor:
    """Where bf16 bits hold a subnormal (nonzero magnitude below the smallest normal; zeros are not)."""
    magnitude = bits & MAGNITUDE
    return (magnitude != 0) & (magnitude < MIN_NORMAL)

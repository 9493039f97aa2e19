"""Power-of-two scales: snapping a scale to 2^round(log2 s) or 2^ceil(log2 s), and recognising one.

The one snap of the project: the quantizer's pow2 arms, the prediction, the campaign's pow2 regime
and its batched engine all call ``snap_pow2`` or ``snapped_pow2``.

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


def snapped_pow2(s: torch.Tensor, mode: SnapMode, *, keep_zero: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(snapped, refused, overflow)`` of float32/bf16 scales, reading nothing back from the device.

    ``refused`` marks scales that are not positive finite normal values (zero too, unless
    ``keep_zero``: then +0 and -0 stay as they are, having no power of two and multiplying exactly
    already); ``overflow`` marks scales whose power (2^128) the dtype cannot hold. Entries under
    either mask are meaningless: ``snap_pow2`` refuses them, a batched caller reruns them.
    """
    if mode not in ("nearest", "ceiling"):
        raise InputError(f"snap_pow2: unknown mode {mode!r} (expected 'nearest' or 'ceiling')")
    fmt = format_of(s, (FLOAT32, BFLOAT16), "snap_pow2 scales")
    sign, exp, frac = fields(s, fmt)
    zero = (exp == 0) & (frac == 0) if keep_zero else torch.zeros_like(sign)
    refused = ~zero & (sign | (exp == 0) | (exp == fmt.exp_max))
    if mode == "nearest":
        significand = (1 << fmt.frac_bits) + frac  # m * 2**frac_bits; squared < 2**48
        up = significand * significand >= 2 << (2 * fmt.frac_bits)
    else:
        up = frac != 0
    exp = exp + up.to(torch.int64)
    overflow = ~zero & ~refused & (exp == fmt.exp_max)
    snapped = assemble(sign, exp.clamp(max=fmt.exp_max - 1) << fmt.frac_bits, fmt)
    return torch.where(zero, s, snapped), refused, overflow


def snap_pow2(s: torch.Tensor, mode: SnapMode, *, name: str = "scales", keep_zero: bool = False) -> torch.Tensor:
    """Each positive normal float32/bf16 scale in ``s`` snapped to a power of two, same dtype; with
    ``keep_zero`` an exact zero stays zero.

    Raises InputError naming ``name`` if any scale is (unless kept) zero, or negative, subnormal, inf
    or NaN, or if the snapped power (2^128) would not be representable in the dtype.
    """
    if mode not in ("nearest", "ceiling"):
        raise InputError(f"snap_pow2 {name}: unknown mode {mode!r} (expected 'nearest' or 'ceiling')")
    format_of(s, (FLOAT32, BFLOAT16), f"snap_pow2 {name}")
    snapped, refused, overflow = snapped_pow2(s, mode, keep_zero=keep_zero)
    if bool(refused.any()):
        raise InputError(
            f"snap_pow2 {name}: {int(refused.sum())} of {s.numel()} scales are not positive finite normal "
            f"values (first: {_first_offender(s, refused)}); scales must be positive"
        )
    if bool(overflow.any()):
        fmt = format_of(s, (FLOAT32, BFLOAT16), f"snap_pow2 {name}")
        raise InputError(
            f"snap_pow2 {name}: {mode} power of two of {_first_offender(s, overflow)} is 2^{fmt.bias + 1}, "
            f"not representable in {s.dtype}"
        )
    return snapped


def _single_bit(x: torch.Tensor) -> torch.Tensor:
    return (x != 0) & ((x & (x - 1)) == 0)


def is_pow2(s: torch.Tensor) -> torch.Tensor:
    """Where ``s`` (float32, float64 or bf16) is a positive power of two, subnormal powers included."""
    fmt: FloatFormat = format_of(s, (FLOAT32, FLOAT64, BFLOAT16), "is_pow2 input")
    sign, exp, frac = fields(s, fmt)
    normal_power = (exp > 0) & (exp < fmt.exp_max) & (frac == 0)
    subnormal_power = (exp == 0) & _single_bit(frac)
    return ~sign & (normal_power | subnormal_power)

"""IEEE-754 fields of float tensors as int64, so every rounding decision is integer arithmetic, and
bit patterns of any tensor, so "identical" means identical bits (signed zeros and NaN payloads count).

Integer operations give the same answer on every device; float conversions need not (flush-to-zero
modes, interpreter casts). Everything in `arith` that inspects or builds a float goes through here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: its torch dtype, the same-width integer dtype, field widths."""

    dtype: torch.dtype
    int_dtype: torch.dtype
    exp_bits: int
    frac_bits: int

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def exp_max(self) -> int:
        """Biased exponent field of inf and NaN."""
        return (1 << self.exp_bits) - 1

    @property
    def width(self) -> int:
        return 1 + self.exp_bits + self.frac_bits


FLOAT32 = FloatFormat(torch.float32, torch.int32, 8, 23)
FLOAT64 = FloatFormat(torch.float64, torch.int64, 11, 52)
BFLOAT16 = FloatFormat(torch.bfloat16, torch.int16, 8, 7)
FORMATS = {f.dtype: f for f in (FLOAT32, FLOAT64, BFLOAT16)}


def format_of(x: torch.Tensor, allowed: tuple[FloatFormat, ...], what: str) -> FloatFormat:
    """The format of ``x``, or InputError naming ``what`` when its dtype is not one of ``allowed``."""
    fmt = FORMATS.get(x.dtype)
    if fmt not in allowed:
        names = ", ".join(str(f.dtype) for f in allowed)
        raise InputError(f"{what}: dtype {x.dtype} not supported (expected one of {names})")
    return fmt


def fields(x: torch.Tensor, fmt: FloatFormat) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sign as bool, biased exponent field, fraction field) of ``x``, the last two as int64."""
    bits = x.view(fmt.int_dtype).to(torch.int64)
    sign = bits < 0
    exp = (bits >> fmt.frac_bits) & fmt.exp_max
    frac = bits & ((1 << fmt.frac_bits) - 1)
    return sign, exp, frac


def assemble(sign: torch.Tensor, magnitude: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """The float of ``fmt`` whose sign bit is ``sign`` and whose other bits are ``magnitude``.

    A set sign bit makes the two's-complement integer ``magnitude - 2**(width-1)``, which fits the
    signed integer dtype, so no cast ever has to wrap.
    """
    signed = torch.where(sign, magnitude + torch.iinfo(fmt.int_dtype).min, magnitude)
    return signed.to(fmt.int_dtype).view(fmt.dtype)


_SAME_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_pattern(x: torch.Tensor) -> torch.Tensor:
    """A float tensor's elements as same-width integers (bf16 and float16 as int16, float32 as int32,
    ...); any other tensor as it is. Comparing these compares bits, not values."""
    if not x.dtype.is_floating_point:
        return x
    return x.contiguous().view(_SAME_WIDTH[x.element_size()])


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, same shape and the same bits (``b`` read on ``a``'s device): -0.0 is not +0.0 and
    NaNs are equal only with equal payloads."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(bit_pattern(a), bit_pattern(b.to(a.device))))

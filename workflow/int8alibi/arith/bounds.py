"""The integer bounds behind the alibi: when int32 cannot overflow and float32 loses nothing.

``INT32_PRODUCT_BOUND`` uses the operands the quantizers produce (activations symmetric in
[-127, 127], weights in [-128, 127]); ``INT8_PRODUCT_MAX`` covers any int8 pair and sizes the
exact float64 accumulation, which must stay exact whatever it is given.
"""

from __future__ import annotations

import torch

from ..errors import InputError

INT32_PRODUCT_BOUND = 127 * 128  # 16256
INT8_PRODUCT_MAX = 128 * 128  # 16384: (-128) * (-128)
INT32_LIMIT = 2**31
F32_EXACT_BOUND = 2**24  # every integer of magnitude <= 2**24 is a float32
F64_EXACT_BOUND = 2**53


def int32_bound_holds(k: int) -> bool:
    """Whether a K-deep dot product of quantized operands always fits int32: 16256*K < 2**31."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise InputError(f"int32_bound_holds: reduction depth K={k!r} is not a non-negative int")
    return INT32_PRODUCT_BOUND * k < INT32_LIMIT


def f32_exact(acc: torch.Tensor, exact_repr: bool = False) -> torch.Tensor:
    """Where converting the int64 accumulator to float32 is exact.

    By default the bound the prediction uses, |acc| <= 2**24. With ``exact_repr`` also every
    larger integer that float32 happens to represent (odd part below 2**24, e.g. 2**24 + 2).
    """
    if acc.dtype != torch.int64:
        raise InputError(f"f32_exact: accumulator dtype {acc.dtype} is not torch.int64")
    within = (acc >= -F32_EXACT_BOUND) & (acc <= F32_EXACT_BOUND)
    if not exact_repr:
        return within
    magnitude = acc.abs()  # -2**63 stays negative; the floor division below still gives 1 for it
    lowest_bit = magnitude & -magnitude
    odd_part = magnitude // torch.where(lowest_bit == 0, torch.ones_like(lowest_bit), lowest_bit)
    return within | (odd_part < F32_EXACT_BOUND)  # odd part fits float32's 24-bit significand

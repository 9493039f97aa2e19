"""Distances between bf16 outputs in units of bf16 spacing, and the bitwise comparison of two outputs.

Distances are subtractions on the ordered line of ``arith.bf16``. Non-finite values have no
distance: they are counted apart so that an inf or NaN can never hide inside a maximum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError
from .bf16 import nonfinite_bits, ordered_line, require_bf16, signed_bits, subnormal_bits, unsigned_bits


def _require_pair(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    require_bf16(a, f"{what} first operand")
    require_bf16(b, f"{what} second operand")
    if a.shape != b.shape:
        raise InputError(f"{what}: shapes differ ({tuple(a.shape)} vs {tuple(b.shape)})")
    if a.device != b.device:
        raise InputError(f"{what}: devices differ ({a.device} vs {b.device})")


def bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """The 16 bits of each bf16 element as an int32 in [0, 0xFFFF]."""
    require_bf16(x, "bf16_bits input")
    return unsigned_bits(x)


def ordered_bf16(x: torch.Tensor) -> torch.Tensor:
    """Position of each bf16 value on the integer line of representable values (±0 -> 0).

    Adjacent finite values differ by one; the smallest positive and negative subnormals sit at +1
    and -1. Meaningless for NaN (``ulp_distance`` masks it).
    """
    require_bf16(x, "ordered_bf16 input")
    return ordered_line(signed_bits(x))


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|ordered(a) - ordered(b)| as int32 where both are finite, -1 where either is inf or NaN."""
    _require_pair(a, b, "ulp_distance")
    distance = (ordered_bf16(a) - ordered_bf16(b)).abs()
    finite = torch.isfinite(a) & torch.isfinite(b)
    return torch.where(finite, distance, torch.full_like(distance, -1))


@dataclass(frozen=True)
class BF16Comparison:
    """Summary of two same-shaped bf16 tensors (Python ints, read back from the device).

    ``differing`` counts bit patterns that differ, so +0 vs -0 and different NaN payloads count;
    ``max_finite_ulp`` is the largest ``ulp_distance`` over pairs where both are finite, and None
    when no such pair exists (then no tolerance can be checked). ``finite_pairs`` says how many
    pairs that maximum ranges over.
    """

    elements: int
    differing: int
    max_finite_ulp: int | None
    nonfinite_a: int
    nonfinite_b: int
    subnormal_a: int
    subnormal_b: int
    finite_pairs: int


def compare_bf16(a: torch.Tensor, b: torch.Tensor) -> BF16Comparison:
    """Compare two bf16 outputs element by element: bitwise, in ulps, and by value class."""
    _require_pair(a, b, "compare_bf16")
    bits_a, bits_b = bf16_bits(a), bf16_bits(b)
    distance = ulp_distance(a, b)
    finite = distance >= 0
    finite_pairs = int(finite.sum().item())
    max_ulp = int(distance[finite].max().item()) if finite_pairs else None
    return BF16Comparison(
        elements=a.numel(),
        differing=int((bits_a != bits_b).sum().item()),
        max_finite_ulp=max_ulp,
        nonfinite_a=int(nonfinite_bits(bits_a).sum().item()),
        nonfinite_b=int(nonfinite_bits(bits_b).sum().item()),
        subnormal_a=int(subnormal_bits(bits_a).sum().item()),
        subnormal_b=int(subnormal_bits(bits_b).sum().item()),
        finite_pairs=finite_pairs,
    )

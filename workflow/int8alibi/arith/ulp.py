"""Distances between bf16 outputs in units of bf16 spacing, and the bitwise comparison of two outputs.

Mapping sign-magnitude bits to a signed integer line (``ordered_bf16``) makes the spacing count a
plain subtraction that also crosses zero. Non-finite values have no distance: they are counted
apart so that an inf or NaN can never hide inside a maximum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError

_SIGN = 0x8000
_MAGNITUDE = 0x7FFF
_INF = 0x7F80


def _require_bf16(x: torch.Tensor, what: str) -> None:
    if x.dtype != torch.bfloat16:
        raise InputError(f"{what}: dtype {x.dtype} is not torch.bfloat16")


def _require_pair(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    _require_bf16(a, f"{what} first operand")
    _require_bf16(b, f"{what} second operand")
    if a.shape != b.shape:
        raise InputError(f"{what}: shapes differ ({tuple(a.shape)} vs {tuple(b.shape)})")
    if a.device != b.device:
        raise InputError(f"{what}: devices differ ({a.device} vs {b.device})")


def bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """The 16 bits of each bf16 element as an int32 in [0, 0xFFFF]."""
    _require_bf16(x, "bf16_bits input")
    return x.view(torch.int16).to(torch.int32) & 0xFFFF


def ordered_bf16(x: torch.Tensor) -> torch.Tensor:
    """Position of each bf16 value on the integer line of representable values (±0 -> 0).

    Adjacent finite values differ by one; the smallest positive and negative subnormals sit at +1
    and -1. Meaningless for NaN (``ulp_distance`` masks it).
    """
    bits = bf16_bits(x)
    magnitude = bits & _MAGNITUDE
    return torch.where((bits & _SIGN) != 0, -magnitude, magnitude)


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


def _subnormal_count(bits: torch.Tensor) -> int:
    magnitude = bits & _MAGNITUDE
    return int(((magnitude != 0) & (magnitude < 0x0080)).sum().item())


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
        nonfinite_a=int(((bits_a & _MAGNITUDE) >= _INF).sum().item()),
        nonfinite_b=int(((bits_b & _MAGNITUDE) >= _INF).sum().item()),
        subnormal_a=_subnormal_count(bits_a),
        subnormal_b=_subnormal_count(bits_b),
        finite_pairs=finite_pairs,
    )

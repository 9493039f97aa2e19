"""Pair statistics on boundary bit patterns: signed zeros, neighbours across zero, NaN, infinities."""

from __future__ import annotations

import pytest
import torch
from int8alibi.errors import InputError
from int8alibi.ksweep.stats import bin_labels, compare

EDGES = [1, 2, 3, 5, 9, 17, 65]


def bf16(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def _far(n: int = 64) -> list[int]:
    """Many elements of magnitude 1.0 (0x3F80) so the RMS is 1 and the near-zero cut is 0.01."""
    return [0x3F80] * n


def test_signed_zeros_differ_in_bits_but_not_in_ulp() -> None:
    a, b = bf16(_far() + [0x0000]), bf16(_far() + [0x8000])
    s = compare(a, b, near_zero_fraction=0.01, edges=EDGES)
    assert s.differing == 1 and s.signed_zero_pairs == 1
    assert s.max_ulp == 0
    assert sum(s.histogram["near_zero"]) == 0 and sum(s.histogram["non_near_zero"]) == 0  # no distance >= 1
    assert s.differing_near_zero == 1 and s.differing_non_near_zero == 0


def test_smallest_subnormals_across_zero_are_two_apart() -> None:
    a, b = bf16(_far() + [0x0001]), bf16(_far() + [0x8001])
    s = compare(a, b, near_zero_fraction=0.01, edges=EDGES)
    assert s.max_ulp == 2
    assert s.histogram["near_zero"] == [0, 1, 0, 0, 0, 0, 0]


def test_neighbours_and_bins_among_non_near_zero_elements() -> None:
    # 1.0 vs 1.0 + 1, 2, 4, 16 and 100 spacings: bins 1, 2, 3-4, 9-16, 65+
    steps = [1, 2, 4, 16, 100]
    a = bf16(_far() + [0x3F80] * len(steps))
    b = bf16(_far() + [0x3F80 + d for d in steps])
    s = compare(a, b, near_zero_fraction=0.01, edges=EDGES)
    assert s.histogram["non_near_zero"] == [1, 1, 1, 0, 1, 0, 1]
    assert s.differing_non_near_zero == 5 and s.ge2_ulp_non_near_zero == 4
    assert s.ge2_ulp_share == pytest.approx(0.8)
    assert s.max_ulp == 100
    # relative difference of 1 + 100 * 2^-7 against 1
    assert s.max_relative_difference == pytest.approx(100 * 2**-7)


def test_nan_and_infinity_are_excluded_and_counted() -> None:
    nan, inf, big = 0x7FC0, 0x7F80, 0x7F7F  # quiet NaN, +inf, largest finite
    a = bf16(_far() + [nan, inf, big])
    b = bf16(_far() + [0x3F80, big, inf])
    s = compare(a, b, near_zero_fraction=0.01, edges=EDGES)
    assert s.nonfinite_pairs == 3 and s.differing == 3
    assert s.max_ulp is None and s.max_relative_difference is None
    assert sum(s.histogram["near_zero"]) + sum(s.histogram["non_near_zero"]) == 0
    assert s.ge2_ulp_share is None
    both_nan = compare(bf16([nan, 0x3F80]), bf16([nan, 0x3F80]), near_zero_fraction=0.01, edges=EDGES)
    assert both_nan.differing == 0 and both_nan.nonfinite_pairs == 1


def test_near_zero_cut_is_relative_to_arm_a_rms() -> None:
    # RMS of a is 1 (64 ones); 0x3C00 = 2^-7 = 0.0078 < 0.01 is near zero, 0x3C40 = 0.01172 is not
    a = bf16(_far() + [0x3C00, 0x3C40])
    b = bf16(_far() + [0x3C03, 0x3C43])
    s = compare(a, b, near_zero_fraction=0.01, edges=EDGES)
    assert s.near_zero_threshold == pytest.approx(0.01 * (64 * 1.0 + 0.0078125**2 + 0.01171875**2) ** 0.5 / 66**0.5)
    assert s.differing_near_zero == 1 and s.differing_non_near_zero == 1
    assert s.histogram["near_zero"][2] == 1 and s.histogram["non_near_zero"][2] == 1


def test_all_zero_output_keeps_zeros_near_zero() -> None:
    s = compare(bf16([0, 0]), bf16([0x8000, 0x0001]), near_zero_fraction=0.01, edges=EDGES)
    assert s.near_zero_threshold == 0.0
    assert s.differing_near_zero == 2 and s.max_relative_difference is None


def test_identical_outputs() -> None:
    a = torch.randn(4, 8).to(torch.bfloat16)
    s = compare(a, a.clone(), near_zero_fraction=0.01, edges=EDGES)
    assert s.differing == 0 and s.prevalence == 0 and s.max_ulp is None


def test_bins_and_inputs_are_checked() -> None:
    assert bin_labels([1, 2, 5]) == [(1, 1), (2, 4), (5, None)]
    for bad in ([2, 3], [1, 1, 2], [1, 3, 2], []):
        with pytest.raises(InputError, match="ulp bins"):
            bin_labels(bad)
    with pytest.raises(InputError, match="dtype"):
        compare(torch.zeros(2), torch.zeros(2), near_zero_fraction=0.01, edges=EDGES)
    with pytest.raises(InputError, match="shapes differ"):
        compare(bf16([0, 0]), bf16([0]), near_zero_fraction=0.01, edges=EDGES)

"""Pair statistics on boundary bit patterns: signed zeros, neighbours across zero, NaN, infinities; the
median relative difference and the two >= 2 ulp shares against their definitions in ksweep.yaml."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from int8alibi.errors import InputError
from int8alibi.ksweep.stats import bin_labels, compare, median

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


def _relative(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """|a - b| / |a| in float64, element by element."""
    a64, b64 = a.double().numpy(), b.double().numpy()
    return np.abs(a64 - b64) / np.abs(a64)


@pytest.mark.parametrize("steps", [[1, 2, 4], [1, 2, 4, 16], [7]])
def test_median_relative_difference_is_over_differing_finite_non_near_zero_elements(steps: list[int]) -> None:
    """Odd, even and single counts; a near-zero, a non-finite and an equal element stay out of it."""
    near, nan = 0x3C00, 0x7FC0  # 2^-7, below the 0.01 cut of an RMS near 1; quiet NaN
    a = bf16(_far() + [0x3F80] * len(steps) + [near, nan, 0x3F80])
    b = bf16(_far() + [0x3F80 + d for d in steps] + [near + 50, 0x3F80, 0x3F80])
    s = compare(a, b, near_zero_fraction=0.01, edges=EDGES)
    counted = _relative(a[64:64 + len(steps)], b[64:64 + len(steps)])
    assert s.differing_non_near_zero == len(steps)
    assert s.median_relative_difference == pytest.approx(float(np.median(counted)), rel=1e-12)
    assert s.max_relative_difference == pytest.approx(float(counted.max()), rel=1e-12)


def test_median_of_an_even_count_is_the_mean_of_the_two_middle_values() -> None:
    values = torch.tensor([4.0, 1.0, 3.0, 2.0], dtype=torch.float64)
    assert median(values) == pytest.approx((2.0 + 3.0) / 2)
    assert median(values) != float(torch.median(values))  # torch takes the lower middle value
    assert median(torch.tensor([5.0], dtype=torch.float64)) == 5.0
    assert median(torch.tensor([], dtype=torch.float64)) is None


def test_no_differing_non_near_zero_element_has_no_median_or_share() -> None:
    a = bf16(_far() + [0x3C00])
    s = compare(a, bf16(_far() + [0x3C05]), near_zero_fraction=0.01, edges=EDGES)  # differs only near zero
    assert s.differing == 1 and s.differing_non_near_zero == 0
    assert s.median_relative_difference is None and s.max_relative_difference is None
    assert s.ge2_ulp_share is None and s.ge2_ulp_share_of_all == 0.0


def test_ge2_ulp_share_of_all_outputs_and_of_differing_non_near_zero_ones() -> None:
    """The same >= 2 ulp count over two denominators; a near-zero element at 3 ulp counts in neither."""
    steps = [1, 1, 2, 3, 40]
    a = bf16(_far() + [0x3F80] * len(steps) + [0x3C00])
    b = bf16(_far() + [0x3F80 + d for d in steps] + [0x3C03])
    s = compare(a, b, near_zero_fraction=0.01, edges=EDGES)
    ge2 = sum(d >= 2 for d in steps)
    assert s.ge2_ulp_non_near_zero == ge2
    assert s.ge2_ulp_share == pytest.approx(ge2 / len(steps))
    assert s.ge2_ulp_share_of_all == pytest.approx(ge2 / a.numel())
    assert s.ge2_ulp_share_of_all < s.ge2_ulp_share

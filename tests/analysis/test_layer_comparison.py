"""layer_comparison: the normalized float64 errors and the near-zero split of one layer's outputs."""

from __future__ import annotations

import pytest
import torch

from int8alibi.analysis import layer_comparison


def _bf16(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)


def test_layer_errors_normalize_by_the_reference_rms_and_split_near_zero() -> None:
    # a = [3, 4, 0, 0.01]: RMS over finite a = sqrt((9 + 16 + 0 + 1e-4) / 4); near zero below 1% of it
    a = _bf16([3.0, 4.0, 0.0, 0.01])
    b = _bf16([3.0, 4.03125, -0.0, 0.02])  # 4 -> next bf16 value up; +0 vs -0 differs in its bits
    got = layer_comparison.layer_errors(a, b, 0.01)
    rms = float(torch.sqrt(torch.mean(a.double() ** 2)))
    assert got["reference_rms"] == pytest.approx(rms)
    assert got["near_zero_elements"] == 2                       # a = 0 and |0.01| < 0.01 * 2.5
    assert (got["differing_near_zero"], got["differing_non_near_zero"]) == (2, 1)
    diff = (a.double() - b.double()).abs() / rms
    assert got["max_normalized_error"] == pytest.approx(float(diff.max()))
    assert got["rms_normalized_error"] == pytest.approx(float(torch.sqrt(torch.mean(diff ** 2))))


def test_layer_errors_leave_nothing_to_normalize_by_as_null() -> None:
    zero = layer_comparison.layer_errors(_bf16([0.0, 0.0]), _bf16([0.0, 1.0]), 0.01)
    assert zero["reference_rms"] == 0.0 and zero["max_normalized_error"] is None
    assert (zero["near_zero_elements"], zero["differing_near_zero"]) == (2, 1)
    nan = layer_comparison.layer_errors(_bf16([float("nan")]), _bf16([1.0]), 0.01)
    assert nan["reference_rms"] is None and nan["max_normalized_error"] is None and nan["near_zero_elements"] == 0
    # a non-finite pair enters neither side of the split nor the errors
    inf = layer_comparison.layer_errors(_bf16([2.0, 2.0]), _bf16([2.0, float("inf")]), 0.01)
    assert (inf["differing_near_zero"], inf["differing_non_near_zero"], inf["max_normalized_error"]) == (0, 0, 0.0)

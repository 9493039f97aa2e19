"""Each fault does what its docstring says: boundary values and independent recomputation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from int8alibi.arith import bf16_round, exact_accumulator, is_pow2, ulp_distance, wrap_int32
from int8alibi.errors import InputError
from int8alibi.faults import catalogue as cat
from int8alibi.faults.pipeline import epilogue, reference, regime_scales, scale, tile_partial_sums


def operands(m: int = 12, k: int = 384, n: int = 40, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s_a = torch.rand(m, generator=g) * 0.05 + 1e-3
    s_w = (torch.rand(n, generator=g) * 2e-3 + 1e-5).to(torch.bfloat16).to(torch.float32)
    return a, w, s_a, s_w


def acc_f32(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return wrap_int32(exact_accumulator(a, w)).to(torch.float32)


def test_epilogue_faults_vanish_under_power_of_two_scales() -> None:
    """F1, F2, F3 and F5 only move roundings that a power-of-two scale makes exact."""
    a, w, s_a, s_w = operands()
    s_a, s_w = regime_scales(s_a, "pow2", "s_a"), regime_scales(s_w, "pow2", "s_w")
    assert bool(is_pow2(s_a).all()) and bool(is_pow2(s_w).all())
    _, y = reference(a, w, s_a, s_w)
    x = acc_f32(a, w)
    for y_fault in (cat.f1_scale_precision(x, s_a, s_w), cat.f2_double_rounding(x, s_a, s_w),
                    cat.f3_scale_order(x, s_a, s_w), cat.f5_fused_order(tile_partial_sums(a, w, 128), s_a, s_w)):
        assert torch.equal(y_fault.view(torch.int16), y.view(torch.int16))


def test_f1_rounds_both_scales_to_bf16() -> None:
    a, w, s_a, s_w = operands()
    x = acc_f32(a, w)
    expected = scale(x, bf16_round(s_a, "rne").float(), bf16_round(s_w, "rne").float()).to(torch.bfloat16)
    assert torch.equal(cat.f1_scale_precision(x, s_a, s_w).view(torch.int16), expected.view(torch.int16))
    _, y = reference(a, w, s_a, s_w)
    assert not torch.equal(cat.f1_scale_precision(x, s_a, s_w), y)  # s_a has more than 8 significand bits


def test_f2_rounds_between_the_multiplies() -> None:
    a, w, s_a, s_w = operands()
    x = acc_f32(a, w)
    expected = bf16_round(bf16_round(x * s_a[:, None], "rne").float() * s_w[None, :], "rne")
    y_fault = cat.f2_double_rounding(x, s_a, s_w)
    assert torch.equal(y_fault.view(torch.int16), expected.view(torch.int16))
    _, y = reference(a, w, s_a, s_w)
    assert int(ulp_distance(y, y_fault).max()) == 1  # it does change outputs, by one spacing here


def test_f3_multiplies_the_scales_first() -> None:
    a, w, s_a, s_w = operands()
    x = acc_f32(a, w)
    expected = (x * (s_a[:, None] * s_w[None, :])).to(torch.bfloat16)
    assert torch.equal(cat.f3_scale_order(x, s_a, s_w).view(torch.int16), expected.view(torch.int16))


def test_f4_truncates_toward_zero() -> None:
    x = torch.tensor([[1.0 + 2**-8, -(1.0 + 2**-8), 1.0 + 2**-7 - 2**-20, 3.0]])  # tie, -tie, just below, exact
    y = cat.f4_output_truncation(x, torch.ones(1), torch.ones(4))
    assert y.float().tolist() == [[1.0, -1.0, 1.0, 3.0]]
    big = torch.tensor([[3.40e38]])  # above bf16's largest finite value plus half a spacing
    assert bf16_round(big, "rne").float().item() == float("inf")
    assert cat.f4_output_truncation(big, torch.ones(1), torch.ones(1)).float().item() == torch.finfo(torch.bfloat16).max


def test_f5_is_the_float32_sum_of_scaled_tiles_in_order() -> None:
    """Recompute F5 element by element with numpy float32, a separate implementation."""
    a, w, s_a, s_w = operands(m=4, k=700, n=6)
    y = cat.f5_fused_order(tile_partial_sums(a, w, 128), s_a, s_w)
    a64, w64 = a.numpy().astype(np.int64), w.numpy().astype(np.int64)
    sw, sa = s_w.numpy(), s_a.numpy()
    for i in range(4):
        for j in range(6):
            total = np.float32(0)
            for start in range(0, 700, 128):
                partial = np.float32(int(a64[i, start:start + 128] @ w64[j, start:start + 128]))
                total = np.float32(total + np.float32(partial * sw[j]))
            expected = bf16_round(torch.tensor([np.float32(total * sa[i])]), "rne")
            assert y[i, j].view(torch.int16).item() == expected.view(torch.int16).item()


def test_f5_cancellation_can_move_an_output_far() -> None:
    """When tile sums cancel, the float32 running sum keeps the rounding error of its large terms
    while the exact accumulator is small, so F5 is not bounded by one spacing in general. Tiles
    2^24 - 1 and -(2^24 - 2) sum to 1; scaled by 1 + 2^-7 each product rounds (float32 spacing
    is 2 above 2^24) to +-16908286, and their float32 sum is 0 instead of 1.0078125."""
    partials = [torch.tensor([[16_777_215.0]]), torch.tensor([[-16_777_214.0]])]
    s_w = torch.tensor([1.0 + 2**-7])
    y = cat.f5_fused_order(partials, torch.ones(1), s_w)
    assert y.float().item() == 0.0
    exact = epilogue(torch.tensor([[1]], dtype=torch.int32), torch.ones(1), s_w)
    assert exact.float().item() == 1.0 + 2**-7
    assert int(ulp_distance(y, exact).item()) > 16_000


@pytest.mark.parametrize("top,bottom,expected", [
    (2**30, 0, 2),             # 2 * 2^30 = 2^31 leaves int32
    (2**31 - 1, 0, 2),         # 2^31 - 1 itself fits; twice it does not
    (0, 2**30, 3),             # 2 * -2^30 = -2^31 still fits: the negative side needs 3
    (2**30, 2**30, 2),
    (5, 0, 429_496_730),       # ceil(2^31 / 5)
])
def test_f6_repeats_is_the_least_depth_that_wraps(top: int, bottom: int, expected: int) -> None:
    acc = torch.tensor([[top, -bottom, 0]], dtype=torch.int64)
    r = cat.f6_overflow_repeats(acc, "layer t")
    assert r == expected
    assert bool(cat.wraps_int32(acc * r).any())
    assert not bool(cat.wraps_int32(acc * (r - 1)).any())


def test_f6_refuses_an_all_zero_accumulator() -> None:
    with pytest.raises(InputError, match="layer z: F6 cannot be induced"):
        cat.f6_overflow_repeats(torch.zeros(2, 2, dtype=torch.int64), "layer z")


def test_tiling_along_k_multiplies_the_accumulator() -> None:
    """The derivation F6/F7 rely on, checked by building the tiled operands once."""
    a, w, _, _ = operands(m=3, k=64, n=5)
    r = 7
    assert torch.equal(exact_accumulator(a.repeat(1, r), w.repeat(1, r)), r * exact_accumulator(a, w))


@pytest.mark.parametrize("max_abs,k,expected", [
    (2**24, 100, 2),           # must exceed 2^24 strictly
    (2**24 + 1, 100, 1),
    (1000, 2048, None),        # r = 16778 would need 16256 * r * 2048 >= 2^31
    (300_000, 2048, 56),
    (300_000, 6144, None),     # 56 * 6144 * 16256 >= 2^31
])
def test_f7_repeats(max_abs: int, k: int, expected: int | None) -> None:
    r = cat.f7_repeats(max_abs, k, 2**24, 16256, 2**31)
    assert r == expected
    if r is not None:
        assert r * max_abs > 2**24 and 16256 * r * k < 2**31
        assert r == 1 or (r - 1) * max_abs <= 2**24


def test_f7_boost_makes_the_largest_entry_one_row_can_reach() -> None:
    a, w, _, _ = operands(m=4, k=200, n=6)
    boosted, row, j = cat.f7_boost(a, w)
    assert row == 0 and j == int(w.to(torch.int64).abs().sum(1).argmax())
    assert torch.equal(boosted[1:], a[1:])
    acc = exact_accumulator(boosted, w)
    assert acc[0, j].item() == 127 * int(w[j].to(torch.int64).abs().sum())


def test_f9_all_moves_every_element_one_step_and_stays_in_range() -> None:
    a = torch.tensor([[127, -127, 0, 126, -128]], dtype=torch.int8)
    moved = cat.f9_all(a)
    assert moved.tolist() == [[126, -126, 1, 127, -127]]
    assert bool(((moved.to(torch.int16) - a.to(torch.int16)).abs() == 1).all())


def test_f9_one_is_a_rank_one_update() -> None:
    a, w, _, _ = operands()
    for row, col in ((0, 0), (5, 17)):
        a[row, col] = 127 if row == 0 else a[row, col]
        moved, delta = cat.f9_one(a, row, col)
        assert int((moved != a).sum()) == 1 and delta == (-1 if a[row, col] == 127 else 1)
        expected = exact_accumulator(a, w).clone()
        expected[row] += delta * w[:, col].to(torch.int64)
        assert torch.equal(exact_accumulator(moved, w), expected)


def test_f9_pct_moves_only_the_chosen_scales_one_float32_step() -> None:
    s = torch.tensor([1.0, 0.25, 3.0e-3, 0.0])
    moved = cat.f9_pct(s, torch.tensor([1, 3]))
    assert moved[0] == s[0] and moved[2] == s[2]
    assert moved[1].item() == 0.25 * (1 + 2**-23)
    assert moved[3].item() == torch.finfo(torch.float32).smallest_normal * 2**-23  # next float32 above 0
    assert (moved.view(torch.int32) - s.view(torch.int32)).tolist() == [0, 1, 0, 1]

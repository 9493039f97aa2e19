"""Each fault does what its docstring says: boundary values and independent recomputation."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from int8alibi.arith import bf16_round, exact_accumulator, is_pow2, ulp_distance, wrap_int32
from int8alibi.errors import InputError
from int8alibi.faults import catalogue as cat
from int8alibi.faults.checks import Thresholds
from int8alibi.faults.pipeline import epilogue, reference, regime_scales

from . import exact_reference as ref


def operands(m: int = 12, k: int = 384, n: int = 40, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s_a = torch.rand(m, generator=g) * 0.05 + 1e-3
    s_w = (torch.rand(n, generator=g) * 2e-3 + 1e-5).to(torch.bfloat16).to(torch.float32)
    return a, w, s_a, s_w


def acc_f32(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return wrap_int32(exact_accumulator(a, w)).to(torch.float32)


def _no_f5() -> torch.Tensor:
    raise AssertionError("only F5 asks for its float32 reduction")


def scaling(fault: str, x: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """Arm B's output under F1-F4 from a float32 accumulator ``x``."""
    return cat.epilogue_fault(fault, x, s_a, s_w, _no_f5)


def fused(a: torch.Tensor, w: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, width: int = 128) -> torch.Tensor:
    """Arm B's output under F5 on operands ``a``, ``w``."""
    return cat.epilogue_fault("F5", acc_f32(a, w), s_a, s_w, lambda: cat.fused_reduction(a, w, s_w, width))


def test_epilogue_faults_vanish_under_power_of_two_scales() -> None:
    """F1, F2, F3 and F5 only move roundings that a power-of-two scale makes exact."""
    a, w, s_a, s_w = operands()
    s_a, s_w = regime_scales(s_a, "pow2", "s_a"), regime_scales(s_w, "pow2", "s_w")
    assert bool(is_pow2(s_a).all()) and bool(is_pow2(s_w).all())
    _, y = reference(a, w, s_a, s_w)
    x = acc_f32(a, w)
    for y_fault in (*(scaling(f, x, s_a, s_w) for f in ("F1", "F2", "F3")), fused(a, w, s_a, s_w)):
        assert torch.equal(y_fault.view(torch.int16), y.view(torch.int16))


def bits(y: torch.Tensor) -> np.ndarray:
    """bf16 bit patterns as int64 in [0, 0xFFFF]."""
    return y.view(torch.int16).numpy().astype(np.int64) & 0xFFFF


def f32_values(*bit_patterns: int) -> np.ndarray:
    """float32 numbers given by their bit patterns (so a boundary value is exactly what it says)."""
    return np.array(bit_patterns, dtype=np.uint32).view(np.float32)


def grid(accs: list[int], s_a: np.ndarray, s_w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (accumulator, s_a, s_w) combination: rows take ``s_a``; column j takes
    ``s_w[j // len(accs)]`` and accumulator ``accs[j % len(accs)]``."""
    cols_w = np.repeat(np.asarray(s_w, np.float32), len(accs))
    acc = np.tile(np.asarray(accs, np.int64), (len(s_a), len(s_w)))
    return acc, np.asarray(s_a, np.float32), cols_w


def module_inputs(acc: np.ndarray, s_a: np.ndarray, s_w: np.ndarray) -> tuple[torch.Tensor, ...]:
    """What the campaign hands a fault: f32(int32 accumulator) by torch's conversion, float32 scales."""
    return (torch.from_numpy(acc).to(torch.int32).to(torch.float32), torch.from_numpy(s_a.copy()),
            torch.from_numpy(s_w.copy()))


# Boundary accumulators: zero, +-1, |acc| around 2^24 (int32 -> float32 ties to even), the int32 ends.
ACCS = [0, 1, -1, 3, 127, -16256, 51941, 12_345_677, -7_654_321, 2**24 - 1, 2**24 + 1, 2**24 + 3,
        -(2**24 + 1), 33_292_293, 2**31 - 1, -(2**31)]
# Scales at bf16 ties and their neighbours, float32 subnormals, values bf16 does not hold, large ones.
S_A = f32_values(0x00000000,  # a zero row's scale
                 0x3F800000,  # 1
                 0x3F808000,  # 1 + 2^-8: a bf16 tie, to even (1)
                 0x3F818000,  # 1 + 3*2^-8: a bf16 tie, to even (1 + 2^-6)
                 0x3F808001,  # just above the tie: up
                 0x3F807FFF,  # just below the tie: down
                 0x3D833179,  # 0.064059205, realistic per-token scale
                 0x3C010204,  # 1/127 in float32
                 0x00200000,  # 2^-130: float32 subnormal that bf16 holds
                 0x00013333,  # float32 subnormal between bf16's subnormals
                 0x007FFFFF,  # largest float32 subnormal
                 0x477FE000)  # 65504
S_W = f32_values(0x3F800000,  # 1
                 0x3C000000,  # 2^-7, a power of two
                 0x3AB20000,  # a bf16 weight scale
                 0x39B3BAEB,  # 0.00034280805, not a bf16 value
                 0x3F808000,  # 1 + 2^-8: bf16 tie
                 0x3F7FFFFF,  # 1 - 2^-24: rounds up to 1 in bf16
                 0x00000001,  # 2^-149, float32's smallest subnormal
                 0x0D000000,  # 2^-101: products land in float32's and bf16's subnormals
                 0x7149F2CA)  # 1e30: overflow to inf in the second product
# (An s_a that overflows the first product is in the next test: here F1 rounds s_w = 2^-149 to 0,
# and inf * 0 would make a NaN, whose bits are the hardware's, not the fault's.)


def test_the_reference_rounding_on_hand_checked_values() -> None:
    """The reference's own rounding, on values worked out by hand, and against numpy's and torch's casts."""
    bf = ref.BF16
    assert ref.round_to(np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)]), bf, "rne").tolist() == [1.0, 1 + 2**-6, -1.0]
    assert ref.round_to(np.array([1 + 2**-7 - 2**-20, -(1 + 2**-7 - 2**-20)]), bf, "rtz").tolist() == [1.0, -1.0]
    largest = (2 - 2**-7) * 2.0**127
    assert ref.round_to(np.array([largest + 2**119, largest + 2**119 - 2**96]), bf, "rne").tolist() == [np.inf, largest]
    assert ref.round_to(np.array([2.0**130, -np.inf]), bf, "rtz").tolist() == [largest, -np.inf]
    assert ref.round_to(np.array([2.0**-134, 3 * 2.0**-134, 2.0**-135 * 3]), bf, "rne").tolist() == [0.0, 2.0**-132, 2.0**-133]
    assert ref.f32(np.array([2**24 + 1, 2**24 + 3, 2**31 - 1])).tolist() == [2**24, 2**24 + 4, 2**31]
    assert np.signbit(ref.round_to(np.array([-2.0**-140]), bf, "rne"))[0]  # -0 stays negative
    assert ref.bf16_bits(np.array([1.0, -np.inf, 2.0**-133])).tolist() == [0x3F80, 0xFF80, 0x0001]
    # A sweep: float64 -> float32 against numpy's IEEE cast, float32 -> bf16 against torch's CPU cast.
    rng = np.random.default_rng(4)
    x = rng.standard_normal(20000) * np.exp2(rng.integers(-160, 130, 20000))
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)
    assert np.array_equal(ref.f32(x), x32.astype(np.float64))
    x32 = x32[np.isfinite(x32)]
    cast = torch.from_numpy(x32).to(torch.bfloat16).view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    assert np.array_equal(ref.bf16_bits(ref.round_to(x32.astype(np.float64), bf, "rne")), cast)


@pytest.mark.parametrize("fault", ["F1", "F2", "F4"])
def test_epilogue_faults_match_the_exact_reference_on_boundary_values(fault: str) -> None:
    """Every combination of the boundary accumulators and scales, against the float64-exact reference."""
    expected_of = {"F1": ref.f1, "F2": ref.f2, "F4": ref.f4}[fault]
    acc, s_a, s_w = grid(ACCS, S_A, S_W)
    expected = expected_of(acc, s_a, s_w)
    got = bits(scaling(fault, *module_inputs(acc, s_a, s_w)))
    wrong = np.argwhere(got != expected)
    assert wrong.size == 0, [(int(acc[i, j]), float(s_a[i]), float(s_w[j]), hex(got[i, j]), hex(expected[i, j]))
                             for i, j in wrong[:5]]
    # The grid reaches what it is meant to: zeros, subnormals, infinities and a change vs the reference.
    magnitude = expected & 0x7FFF
    assert (magnitude == 0).any() and ((magnitude > 0) & (magnitude < 0x0080)).any() and (magnitude == 0x7F80).any()
    assert (expected != ref.reference(acc, s_a, s_w)).any()


@pytest.mark.parametrize("fault", ["F1", "F2", "F4"])
def test_epilogue_faults_match_the_exact_reference_where_scales_overflow_bf16(fault: str) -> None:
    """Scales at bf16's overflow boundary (F1's cast to bf16 and F2's bf16 partial reach inf); no zero
    anywhere, so no inf * 0."""
    expected_of = {"F1": ref.f1, "F2": ref.f2, "F4": ref.f4}[fault]
    s_a = f32_values(0x7F7F8000,   # bf16's largest finite + half a spacing: a tie, to inf
                     0x7F7F7FFF,   # just below it: bf16's largest finite
                     0x7F7FFFFF,   # float32's largest finite: inf in bf16
                     0x3D833179)
    s_w = f32_values(0x006CE3EE,   # 1e-38
                     0x00010000,   # 2^-133, bf16's smallest subnormal (does not round to zero)
                     0x3F800000, 0x39B3BAEB)
    acc, s_a, s_w = grid([1, -1, 3, 2**31 - 1, -(2**31)], s_a, s_w)
    expected = expected_of(acc, s_a, s_w)
    got = bits(scaling(fault, *module_inputs(acc, s_a, s_w)))
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5].tolist()
    assert ((expected & 0x7FFF) == 0x7F80).any()


def test_f1_and_f2_match_the_exact_reference_on_realistic_operands() -> None:
    a, w, s_a, s_w = operands()
    x = acc_f32(a, w)
    acc = exact_accumulator(a, w).numpy()
    sa, sw = s_a.numpy(), s_w.numpy()
    y1, y2 = scaling("F1", x, s_a, s_w), scaling("F2", x, s_a, s_w)
    assert np.array_equal(bits(y1), ref.f1(acc, sa, sw))
    assert np.array_equal(bits(y2), ref.f2(acc, sa, sw))
    _, y = reference(a, w, s_a, s_w)
    assert np.array_equal(bits(y), ref.reference(acc, sa, sw))
    assert not torch.equal(y1, y)  # s_a has more than 8 significand bits
    assert int(ulp_distance(y, y2).max()) == 1  # F2 does change outputs, by one spacing here


def test_f3_multiplies_the_scales_first() -> None:
    a, w, s_a, s_w = operands()
    x = acc_f32(a, w)
    expected = (x * (s_a[:, None] * s_w[None, :])).to(torch.bfloat16)
    assert torch.equal(scaling("F3", x, s_a, s_w).view(torch.int16), expected.view(torch.int16))


def test_f4_keeps_the_reference_association_under_non_unit_scales() -> None:
    """F4 is ``bf16_rtz((f32(acc) * s_a) * s_w)``. With realistic scales, these accumulators (found by
    a search over 1 <= acc < 2^22) are where the reference association lands exactly on a bf16
    value or just above it while ``acc * (s_a * s_w)`` lands just below, so truncation tells the
    two associations apart; the exact reference shows both sides, and F4 must match the first."""
    cases = [
        (0x3D833179, 0x39B3BAEB, [51941, -51941, 103882, 207764]),   # s_a 0.064059205, s_w 0.00034280805
        (0x3D95FCB3, 0x39875043, [25523, -25523, 51046, 102092]),    # s_a 0.07323589, s_w 0.00025809006
        (0x3BA5AFFB, 0x38F0E8FA, [70613, 141226, -282452]),           # s_a 0.005056379, s_w 0.00011487487
    ]
    for sa_bits, sw_bits, accs in cases:
        acc, s_a, s_w = grid(accs, f32_values(sa_bits), f32_values(sw_bits))
        expected = ref.f4(acc, s_a, s_w)
        assert (expected != ref.f4_scales_first(acc, s_a, s_w)).all()  # the associations differ everywhere here
        assert np.array_equal(bits(scaling("F4", *module_inputs(acc, s_a, s_w))), expected)


def test_f4_matches_the_exact_reference_on_realistic_operands() -> None:
    a, w, s_a, s_w = operands(m=24, k=512, n=48, seed=3)
    acc = exact_accumulator(a, w).numpy()
    y = scaling("F4", acc_f32(a, w), s_a, s_w)
    assert np.array_equal(bits(y), ref.f4(acc, s_a.numpy(), s_w.numpy()))


def test_f4_truncates_toward_zero() -> None:
    x = torch.tensor([[1.0 + 2**-8, -(1.0 + 2**-8), 1.0 + 2**-7 - 2**-20, 3.0]])  # tie, -tie, just below, exact
    y = scaling("F4", x, torch.ones(1), torch.ones(4))
    assert y.float().tolist() == [[1.0, -1.0, 1.0, 3.0]]
    big = torch.tensor([[3.40e38]])  # above bf16's largest finite value plus half a spacing
    assert bf16_round(big, "rne").float().item() == float("inf")
    assert scaling("F4", big, torch.ones(1), torch.ones(1)).float().item() == torch.finfo(torch.bfloat16).max


def test_f5_is_the_float32_sum_of_scaled_tiles_in_order() -> None:
    """Recompute F5 element by element with numpy float32, a separate implementation."""
    a, w, s_a, s_w = operands(m=4, k=700, n=6)
    y = fused(a, w, s_a, s_w)
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
    2^24 - 1 and -(2^24 - 2) sum to 1 (1100-wide tiles, past the width where a float32 matmul is
    exact); scaled by 1 + 2^-7 each product rounds (float32 spacing is 2 above 2^24) to
    +-16908286, and their float32 sum is 0 instead of 1.0078125."""
    a, w = torch.zeros(1, 2200, dtype=torch.int8), torch.zeros(1, 2200, dtype=torch.int8)
    # 2^24 - 1 = 1032 * 16256 + 127 * 8 + 7 * 1 and -(2^24 - 2) = -(1032 * 16256 + 127 * 8 + 6 * 1)
    for start, sign, last in ((0, 1, 7), (1100, -1, 6)):
        a[0, start:start + 1032], w[0, start:start + 1032] = sign * -127, -128
        a[0, start + 1032:start + 1034] = torch.tensor([127, last], dtype=torch.int8)
        w[0, start + 1032:start + 1034] = torch.tensor([sign * 8, sign], dtype=torch.int8)
    assert exact_accumulator(a[:, :1100], w[:, :1100]).item() == 2**24 - 1
    assert exact_accumulator(a[:, 1100:], w[:, 1100:]).item() == -(2**24 - 2)
    s_w = torch.tensor([1.0 + 2**-7])
    y = fused(a, w, torch.ones(1), s_w, width=1100)
    assert y.float().item() == 0.0
    exact = epilogue(torch.tensor([[1]], dtype=torch.int32), torch.ones(1), s_w)
    assert exact.float().item() == 1.0 + 2**-7
    assert int(ulp_distance(y, exact).item()) > 16_000


TH = Thresholds()


def f6(acc: torch.Tensor) -> cat.Inflation:
    """F6 on an accumulator alone (F6 reads nothing else)."""
    a = torch.zeros(acc.shape[0], 1, dtype=torch.int8)
    return cat.inflate("F6", acc, a, a, lambda rows: exact_accumulator(rows, a), TH)


def f7(acc: torch.Tensor, a: torch.Tensor, w: torch.Tensor) -> cat.Inflation:
    return cat.inflate("F7", acc, a, w, lambda rows: exact_accumulator(rows, w), TH)


@pytest.mark.parametrize("top,bottom,expected", [
    (2**30, 0, 2),             # 2 * 2^30 = 2^31 leaves int32
    (2**31 - 1, 0, 2),         # 2^31 - 1 itself fits; twice it does not
    (0, 2**30, 3),             # 2 * -2^30 = -2^31 still fits: the negative side needs 3
    (2**30, 2**30, 2),
    (5, 0, 429_496_730),       # ceil(2^31 / 5)
])
def test_f6_repeats_is_the_least_depth_that_wraps(top: int, bottom: int, expected: int) -> None:
    acc = torch.tensor([[top, -bottom, 0]], dtype=torch.int64)
    inflated = f6(acc).checked("layer t")
    r = int(inflated.repeats)
    assert r == expected and torch.equal(inflated.exact, acc * r)
    assert not torch.equal(wrap_int32(acc * r).to(torch.int64), acc * r)
    assert torch.equal(wrap_int32(acc * (r - 1)).to(torch.int64), acc * (r - 1))


def test_f6_refuses_an_all_zero_accumulator() -> None:
    with pytest.raises(InputError, match="layer z: F6 cannot be induced"):
        f6(torch.zeros(2, 2, dtype=torch.int64)).checked("layer z")


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
    """Tiling alone: the least r past 2^24 within the int32 bound; where none, the boost is tried and
    (zero weights leave nothing to boost) cannot help either."""
    zeros = torch.zeros(1, k, dtype=torch.int8)
    inflated = f7(torch.tensor([[max_abs]], dtype=torch.int64), zeros, zeros)
    assert bool(inflated.reachable) == (expected is not None) and bool(inflated.boosted) == (expected is None)
    if expected is not None:
        r = int(inflated.repeats)
        assert r == expected and r * max_abs > 2**24 and 16256 * r * k < 2**31
        assert r == 1 or (r - 1) * max_abs <= 2**24


def test_f7_boost_makes_the_largest_entry_one_row_can_reach() -> None:
    g = torch.Generator().manual_seed(5)
    a = torch.randint(-1, 2, (4, 2048), generator=g, dtype=torch.int8)     # too small to pass 2^24 by depth
    w = torch.randint(-128, 128, (6, 2048), generator=g, dtype=torch.int8)
    inflated = f7(exact_accumulator(a, w), a, w).checked("layer b")
    j = int(w.to(torch.int64).abs().sum(1).argmax())
    assert bool(inflated.boosted) and torch.equal(inflated.a_q[1:], a[1:])
    assert torch.equal(inflated.a_q[0], (127 * torch.sign(w[j].to(torch.int16))).to(torch.int8))
    r = int(inflated.repeats)
    assert torch.equal(inflated.exact, exact_accumulator(inflated.a_q, w) * r)
    assert inflated.exact[0, j].item() == 127 * int(w[j].to(torch.int64).abs().sum()) * r
    assert int(inflated.absmax) == int(inflated.exact.abs().max()) and 16256 * r * 2048 < 2**31


def test_f9_all_moves_every_element_one_step_and_stays_in_range() -> None:
    a = torch.tensor([[127, -127, 0, 126, -128]], dtype=torch.int8)
    moved = cat.step_all(a)
    assert moved.tolist() == [[126, -126, 1, 127, -127]]
    assert bool(((moved.to(torch.int16) - a.to(torch.int16)).abs() == 1).all())


def test_f9_one_is_a_rank_one_update() -> None:
    a, w, _, _ = operands()
    for row, col in ((0, 0), (5, 17)):
        a[row, col] = 127 if row == 0 else a[row, col]
        exact = exact_accumulator(a, w)
        one = cat.step_one(a, exact, wrap_int32(exact), w, row, col)
        moved = cat.stepped_operand(a, row, col, int(one.step))
        assert int((moved != a).sum()) == 1 and int(one.step) == (-1 if a[row, col] == 127 else 1)
        assert int(one.element) == int(a[row, col])
        assert torch.equal(exact_accumulator(moved, w)[row], one.row)
        assert torch.equal(one.acc32, wrap_int32(exact_accumulator(moved, w)))


def test_f9_pct_moves_only_the_chosen_scales_one_float32_step() -> None:
    s = torch.tensor([1.0, 0.25, 3.0e-3, 0.0])
    moved = cat.nudge_scales(s, torch.tensor([1, 3]))
    assert moved[0] == s[0] and moved[2] == s[2]
    assert moved[1].item() == 0.25 * (1 + 2**-23)
    assert moved[3].item() == torch.finfo(torch.float32).smallest_normal * 2**-23  # next float32 above 0
    assert (moved.view(torch.int32) - s.view(torch.int32)).tolist() == [0, 1, 0, 1]


def test_a_stack_of_gemms_gets_each_gemm_s_fault() -> None:
    """Broadcasting over leading dimensions, as the batched engine uses it ([L, R] stacks of layers
    and regimes against [L, 1] operands), gives every GEMM what a call on it alone gives."""
    gemms = [operands(m=6, k=300, n=10, seed=s) for s in range(3)]
    a, w = torch.stack([g[0] for g in gemms]), torch.stack([g[1] for g in gemms])       # [L, M, K], [L, N, K]
    s_a = torch.stack([torch.stack([g[2], g[2] * 3]) for g in gemms])                   # [L, R, M]
    s_w = torch.stack([torch.stack([g[3], g[3] / 3]) for g in gemms])                   # [L, R, N]
    exact = torch.stack([exact_accumulator(g[0], g[1]) for g in gemms])
    x = wrap_int32(exact).to(torch.float32)[:, None]
    totals = cat.fused_reduction(a[:, None], w[:, None], s_w, 128)
    rows, cols = torch.tensor([[0, 5], [2, 2], [5, 1]]), torch.tensor([[299, 0], [7, 7], [150, 3]])
    one = cat.step_one(a[:, None], exact[:, None], wrap_int32(exact)[:, None], w[:, None], rows, cols)
    pct = torch.tensor([[[0, 4], [1, 2]]] * 3)
    nudged = cat.nudge_scales(s_a, pct)
    for li, (a1, w1, _, _) in enumerate(gemms):
        e1 = exact[li]
        for r in range(2):
            sa1, sw1 = s_a[li, r], s_w[li, r]
            for fault in cat.EPILOGUE_FAULTS:
                stacked = cat.epilogue_fault(fault, x, s_a, s_w, lambda: totals, cat.CAST)[li, r]
                single = cat.epilogue_fault(fault, x[li, 0], sa1, sw1, functools.partial(cat.fused_reduction, a1, w1, sw1, 128))
                assert torch.equal(stacked.view(torch.int16), single.view(torch.int16)), (fault, li, r)
            alone = cat.step_one(a1, e1, wrap_int32(e1), w1, int(rows[li, r]), int(cols[li, r]))
            assert torch.equal(one.acc32[li, r], alone.acc32) and torch.equal(one.row[li, r], alone.row)
            assert torch.equal(nudged[li, r], cat.nudge_scales(sa1, pct[li, r]))
        for fault in cat.INFLATING:
            stacked_inf = cat.inflate(fault, exact, a, w, lambda acts: torch.stack(
                [exact_accumulator(x1, w2) for x1, w2 in zip(acts, w)]), TH)
            single_inf = cat.inflate(fault, e1, a1, w1, functools.partial(exact_accumulator, w_q=w1), TH)
            for field in ("exact", "repeats", "absmax", "boosted", "reachable", "a_q"):
                assert torch.equal(getattr(stacked_inf, field)[li], getattr(single_inf, field)), (fault, field)

"""The seven checks: applicability apart from verdict, threshold boundaries, and the evidence helpers."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from int8alibi.arith import compare_bf16, ordered_bf16, ulp_distance
from int8alibi.faults.checks import (CellEvidence, ElementDiff, OperandSet, OutputComparison, Thresholds,
                                     accumulator_matches, compare_outputs, count_differing, dense_distance, evaluate,
                                     evaluate_arms, nonfinite_index, operands_identical, ordered_positions, scales_pow2)
from int8alibi.errors import InputError

TH = Thresholds()
QUIET = OutputComparison(elements=10, differing=0, max_finite_ulp=0, nonfinite=0, finiteness_mismatch=0)
BASE = CellEvidence(operands_identical=True, k=(2048, 2048), exact_absmax=1000, accumulators=True,
                    scales_pow2=False, outputs=QUIET)


def verdicts(ev: CellEvidence) -> dict[int, bool | None]:
    return {r.check: r.fired for r in evaluate(ev, TH)}


def test_thresholds_come_from_the_protocol() -> None:
    from pathlib import Path

    from int8alibi.protocol import load

    th = Thresholds.from_protocol(load(Path(__file__).resolve().parents[2] / "preregistration").thresholds)
    assert th == Thresholds(product_bound=16256, int32_limit=2**31, f32_exact_bound=2**24, ulp_tolerance=1)


def test_a_quiet_cell_under_real_scales() -> None:
    results = evaluate(BASE, TH)
    assert [r.check for r in results] == [1, 2, 3, 4, 5, 6, 7]
    assert [(r.applicable, r.fired) for r in results] == [
        (True, False), (True, False), (True, False), (True, False), (False, None), (True, False), (False, None)]
    assert "logit" in results[6].reason


def test_check_5_and_6_split_on_the_scales() -> None:
    pow2 = evaluate(replace(BASE, scales_pow2=True), TH)
    assert (pow2[4].applicable, pow2[5].applicable) == (True, False)
    assert pow2[5].fired is None


def test_check_1_and_4_fire_on_their_evidence() -> None:
    assert verdicts(replace(BASE, operands_identical=False))[1] is True
    assert verdicts(replace(BASE, accumulators=False))[4] is True
    note = "arm B does not expose its accumulator"
    hidden = evaluate(replace(BASE, accumulators=None, accumulator_note=note), TH)
    assert (hidden[3].applicable, hidden[3].fired, hidden[3].reason) == (False, None, note)


@pytest.mark.parametrize("k,fires", [(132_104, False), (132_105, True)])
def test_check_2_boundary(k: int, fires: bool) -> None:
    assert 16256 * 132_104 < 2**31 <= 16256 * 132_105
    assert verdicts(replace(BASE, k=(2048, k)))[2] is fires


@pytest.mark.parametrize("absmax,fires", [(2**24, False), (2**24 + 1, True)])
def test_check_3_boundary(absmax: int, fires: bool) -> None:
    assert verdicts(replace(BASE, exact_absmax=absmax))[3] is fires


@pytest.mark.parametrize("max_ulp,mismatch,fires", [(1, 0, False), (2, 0, True), (0, 1, True), (None, 0, False)])
def test_check_6_tolerance_and_nonfinite_pattern(max_ulp: int | None, mismatch: int, fires: bool) -> None:
    out = OutputComparison(elements=10, differing=1, max_finite_ulp=max_ulp, nonfinite=mismatch,
                           finiteness_mismatch=mismatch)
    assert verdicts(replace(BASE, outputs=out))[6] is fires


def test_check_5_counts_signed_zeros() -> None:
    y_a = torch.tensor([0.0, 1.0], dtype=torch.bfloat16)
    y_b = torch.tensor([-0.0, 1.0], dtype=torch.bfloat16)
    out = compare_outputs(y_a, y_b)
    assert (out.differing, out.max_finite_ulp) == (1, 0)
    assert verdicts(replace(BASE, scales_pow2=True, outputs=out))[5] is True


def operand_set(**changes: object) -> OperandSet:
    base = dict(a_q=torch.ones(2, 3, dtype=torch.int8), w_q=torch.ones(4, 3, dtype=torch.int8),
                s_a=torch.tensor([0.5, 0.25]), s_w=torch.tensor([1.0, 2.0, 4.0, 0.0]))
    base.update(changes)
    return OperandSet(**base)  # type: ignore[arg-type]


def test_operands_identical_is_bitwise() -> None:
    x = operand_set()
    assert operands_identical(x, operand_set())
    assert not operands_identical(x, operand_set(s_w=torch.tensor([1.0, 2.0, 4.0, -0.0])))  # -0.0 != +0.0
    assert not operands_identical(x, operand_set(s_a=torch.tensor([0.5, 0.25], dtype=torch.float64)))
    assert not operands_identical(x, replace(x, repeats=2))
    a = torch.ones(2, 3, dtype=torch.int8)
    a[1, 2] = 2
    assert not operands_identical(x, operand_set(a_q=a))
    nan1 = torch.tensor([0x7FC00000, 0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert not operands_identical(operand_set(s_a=nan1[:1].repeat(2)), operand_set(s_a=nan1[1:].repeat(2)))
    assert x.k == 3 and replace(x, repeats=5).k == 15


def test_scales_pow2_needs_every_scale_and_zero_is_not_one() -> None:
    assert not scales_pow2(operand_set())  # s_w holds 0.0
    good = operand_set(s_w=torch.tensor([1.0, 2.0, 4.0, 0.125]))
    assert scales_pow2(good)
    assert not scales_pow2(good, operand_set(s_a=torch.tensor([0.5, 0.3])))


def test_accumulator_matches() -> None:
    exact = torch.tensor([[2**31, 5]], dtype=torch.int64)
    assert not accumulator_matches(torch.tensor([[-(2**31), 5]], dtype=torch.int32), exact)
    assert accumulator_matches(torch.tensor([[7, 5]], dtype=torch.int32), torch.tensor([[7, 5]]))
    assert not accumulator_matches(torch.tensor([[7]], dtype=torch.int32), torch.tensor([[7, 5]]))


def all_bf16() -> torch.Tensor:
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def test_ordered_positions_and_dense_distance_equal_arith() -> None:
    y = all_bf16()
    finite = torch.isfinite(y)
    assert torch.equal(ordered_positions(y)[finite], ordered_bf16(y)[finite])
    shifted = y.roll(12345)
    nf = torch.cat([nonfinite_index(y), nonfinite_index(shifted)])
    assert torch.equal(dense_distance(ordered_positions(y), ordered_positions(shifted), nf), ulp_distance(y, shifted))


def test_nonfinite_index_finds_inf_and_nan() -> None:
    y = torch.tensor([1.0, float("inf"), 0.0, float("nan"), -float("inf")], dtype=torch.bfloat16)
    assert nonfinite_index(y).tolist() == [1, 3, 4]
    assert nonfinite_index(torch.ones(3, dtype=torch.bfloat16)).numel() == 0


def special_pair(seed: int, n: int = 4000) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y_a = (torch.randn(n, generator=g) * 10).to(torch.bfloat16)
    y_b = y_a.clone()
    pick = torch.randperm(n, generator=g)
    y_b[pick[:300]] = (y_a[pick[:300]].float() * (1 + 2**-8)).to(torch.bfloat16)  # about one spacing
    y_b[pick[300:310]] = -y_a[pick[300:310]]
    y_a[pick[310:313]] = float("inf")
    y_b[pick[313:315]] = float("nan")
    y_a[pick[315]] = 0.0
    y_b[pick[315]] = -0.0
    return y_a, y_b


@pytest.mark.parametrize("seed", [0, 1])
def test_compare_outputs_agrees_with_arith(seed: int) -> None:
    y_a, y_b = special_pair(seed)
    ours, ref = compare_outputs(y_a, y_b), compare_bf16(y_a, y_b)
    both_nf = int((~torch.isfinite(y_a) & ~torch.isfinite(y_b)).sum())
    assert ours.differing == ref.differing
    assert ours.max_finite_ulp == ref.max_finite_ulp
    assert ours.nonfinite == ref.nonfinite_a + ref.nonfinite_b - both_nf
    assert ours.elements - ours.nonfinite == ref.finite_pairs
    assert ours.finiteness_mismatch == int((torch.isfinite(y_a) != torch.isfinite(y_b)).sum())
    assert count_differing(y_a, y_b) == ref.differing


@pytest.mark.parametrize("dense", [False, True])
def test_restricted_summary_equals_the_materialized_output(dense: bool) -> None:
    """summary(where) must equal comparing y_a with where(mask, y_b, y_a), on both storage paths."""
    y_a, y_b = special_pair(2)
    if dense:
        y_b = (y_b.float() * (1 + 2**-7)).to(torch.bfloat16)  # most elements differ
    diff = ElementDiff.of(y_a, y_b)
    assert (diff.distance is not None) is dense
    g = torch.Generator().manual_seed(9)
    for size in (1, 40, 700, 4000):
        where = torch.randperm(4000, generator=g)[:size].sort().values
        mask = torch.zeros(4000, dtype=torch.bool)
        mask[where] = True
        assert diff.summary(where) == compare_outputs(y_a, torch.where(mask, y_b, y_a)), size
    assert diff.summary() == compare_outputs(y_a, y_b)


def test_summary_with_no_finite_pair() -> None:
    y = torch.tensor([float("inf"), float("nan")], dtype=torch.bfloat16)
    out = compare_outputs(y, y)
    assert (out.max_finite_ulp, out.nonfinite, out.finiteness_mismatch) == (None, 2, 0)
    assert verdicts(replace(BASE, outputs=out))[6] is False


def test_output_comparison_refuses_mismatched_outputs() -> None:
    with pytest.raises(InputError, match="shapes differ"):
        compare_outputs(torch.zeros(2, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16))
    with pytest.raises(InputError, match="not torch.bfloat16"):
        compare_outputs(torch.zeros(2), torch.zeros(2))


def test_evaluate_arms_from_tensors() -> None:
    x = operand_set(s_w=torch.tensor([1.0, 2.0, 4.0, 0.125]), s_a=torch.tensor([0.5, 0.25]))
    y = torch.ones(2, 4, dtype=torch.bfloat16)
    exact = torch.full((2, 4), 3, dtype=torch.int64)
    acc = exact.to(torch.int32)
    ev, results = evaluate_arms(x, x, 3, (acc, acc), exact, y, y, TH)
    assert ev.scales_pow2 and [r.fired for r in results] == [False, False, False, False, False, None, None]
    ev, results = evaluate_arms(x, x, 3, (acc, None), exact, y, y, TH)
    assert results[3].applicable is False and "arm B" in results[3].reason

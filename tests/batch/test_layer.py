"""Layer-level batch invariance: the seeded co-batches, the measure on exact arms (identical by
construction of the arithmetic), a planted batch-dependent arm caught at the M where it changes, and
the contrasts."""

from __future__ import annotations

import pytest
import torch

from int8alibi.batch.layer import Bf16Gemm, co_batches, contrast_gemms, dequantized_bf16, layer_rows, measure
from int8alibi.errors import InputError
from int8alibi.kernels.layer_operands import synthetic_layers
from int8alibi.kernels.registry import get

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def operands():
    return next(iter(synthetic_layers(m=24, seed=3, blocks=1)))


def test_co_batches_are_distinct_rows_drawn_from_a_seed_and_refuse_sizes_that_do_not_fit() -> None:
    batches = co_batches(24, [1, 3, 24], draws=2, seed=7, where="w")
    assert [(b.m, b.draw) for b in batches] == [(1, 0), (1, 1), (3, 0), (3, 1), (24, 0), (24, 1)]
    for b in batches:
        assert len(set(b.rows.tolist())) == b.m and all(0 <= r < 24 for r in b.rows.tolist())
    assert sorted(batches[-1].rows.tolist()) == list(range(24))
    again = co_batches(24, [1, 3, 24], draws=2, seed=7, where="w")
    assert all(torch.equal(a.rows, b.rows) for a, b in zip(batches, again))
    assert not torch.equal(co_batches(24, [24], 1, seed=8, where="w")[0].rows, batches[-2].rows)
    for bad in ([0], [-1], [25]):
        with pytest.raises(InputError, match=r"^file.yaml: batch sizes \[.*\] .* 24 captured rows"):
            co_batches(24, bad, draws=1, seed=0, where="file.yaml")
    with pytest.raises(InputError, match="draws 0"):
        co_batches(24, [1], draws=0, seed=0, where="w")


@pytest.mark.parametrize("arm", ["exact-cutlass-order", "exact-triton-order"])
def test_the_exact_int8_arms_give_every_row_the_same_bits_at_every_m(operands, arm) -> None:
    gemm = get(arm, CPU).scaled_mm
    op = operands
    rows = measure(gemm, op.a_q, op.w_q, op.s_a, op.s_w, co_batches(op.m, [1, 2, 3, 8, 24], 2, 0, "w"), "w")
    assert [r["m"] for r in rows] == [1, 2, 3, 8, 24]
    assert [r["rows"] for r in rows] == [2, 4, 6, 16, 48]
    assert all(r["rows_differing"] == 0 and r["elements_differing"] == 0 and r["max_ulp"] == 0 for r in rows)


def test_a_planted_arm_whose_epilogue_depends_on_m_is_caught_at_the_ms_where_it_changes(operands) -> None:
    exact = get("exact-cutlass-order", CPU).scaled_mm

    def batch_dependent(a_q, w_q, s_a, s_w):
        out = exact(a_q, w_q, s_a, s_w)
        if a_q.shape[0] >= 8:  # a kernel that switches its epilogue for large M: one ulp up
            out = (out.view(torch.int16) + 1).view(torch.bfloat16)
        return out

    op = operands
    rows = measure(batch_dependent, op.a_q, op.w_q, op.s_a, op.s_w, co_batches(op.m, [1, 2, 8, 24], 1, 0, "w"), "w")
    by_m = {r["m"]: r for r in rows}
    assert by_m[1]["rows_differing"] == 1 and by_m[2]["rows_differing"] == 2   # small M: unlike the M=24 reference
    assert by_m[8]["rows_differing"] == 0 and by_m[24]["rows_differing"] == 0
    assert by_m[1]["max_ulp"] == 1 and by_m[1]["elements_differing"] == op.n


def test_a_gemm_returning_the_wrong_shape_or_dtype_is_refused_naming_it(operands) -> None:
    op = operands
    with pytest.raises(InputError, match="^arm x: returned torch.float32"):
        measure(lambda a, w, sa, sw: torch.zeros(a.shape[0], w.shape[0]), op.a_q, op.w_q, op.s_a, op.s_w, [], "arm x")

    def short(a, w, sa, sw):
        return torch.zeros(max(a.shape[0] - 1, 1) if a.shape[0] < op.m else a.shape[0], w.shape[0],
                           dtype=torch.bfloat16)

    with pytest.raises(InputError, match=r"^arm y: at M=3 returned .* \(2, "):
        measure(short, op.a_q, op.w_q, op.s_a, op.s_w, co_batches(op.m, [3], 1, 0, "w"), "arm y")


def test_the_bf16_contrast_multiplies_the_dequantized_operands_and_fp8_says_why_it_did_not_run(operands) -> None:
    op = operands
    a = dequantized_bf16(op.a_q, op.s_a)
    assert a.dtype == torch.bfloat16
    assert torch.equal(a, (op.a_q.float() * op.s_a[:, None]).bfloat16())
    gemm = Bf16Gemm()
    expected = torch.matmul(a, dequantized_bf16(op.w_q, op.s_w).t())
    assert torch.equal(gemm(op.a_q, op.w_q, op.s_a, op.s_w).view(torch.int16), expected.view(torch.int16))
    # the kept weight is the same tensors' only: another weight, or this one changed in place, is dequantized again
    other = op.w_q.flip(0).contiguous()
    assert torch.equal(gemm(op.a_q, other, op.s_a, op.s_w).view(torch.int16),
                       torch.matmul(a, dequantized_bf16(other, op.s_w).t()).view(torch.int16))
    w = op.w_q.clone()
    gemm(op.a_q, w, op.s_a, op.s_w)
    w.neg_()
    assert torch.equal(gemm(op.a_q, w, op.s_a, op.s_w).view(torch.int16),
                       torch.matmul(a, dequantized_bf16(w, op.s_w).t()).view(torch.int16))
    made = contrast_gemms(["bf16", "fp8"], CPU)
    assert isinstance(made["bf16"][0], Bf16Gemm)
    assert made["fp8"] == (None, "not run: no GPU")
    with pytest.raises(InputError, match="unknown contrast 'int4'"):
        contrast_gemms(["int4"], CPU)


def test_layer_rows_carry_the_layer_gemm_and_kind(operands) -> None:
    arm = get("exact-triton-order", CPU)
    rows = layer_rows("own", operands.layer, operands, {"exact-triton-order": ("int8", arm.scaled_mm),
                                                        "bf16": ("bf16", Bf16Gemm())},
                      co_batches(operands.m, [1, 24], 1, 0, "w"))
    assert [(r["gemm"], r["kind"], r["m"]) for r in rows] == [("exact-triton-order", "int8", 1),
                                                              ("exact-triton-order", "int8", 24),
                                                              ("bf16", "bf16", 1), ("bf16", "bf16", 24)]
    assert all(r["checkpoint"] == "own" and r["captured_m"] == 24 for r in rows)

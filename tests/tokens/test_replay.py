"""Replay: the per-position comparison on hand-made logits (ties, exact margins, non-finite rows),
the row-block dispatch, and a batched forward of the tiny synthetic model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.kernels.registry import get
from int8alibi.model.synthetic import build_synthetic
from int8alibi.model.w8a8 import quantize_linears, swap_linears
from int8alibi.tokens.replay import RowBlockArm, compare, copies_identical, margins, replay_window, w8a8_layers

CPU = torch.device("cpu")


def bf16(rows: list[list[float]]) -> torch.Tensor:
    t = torch.tensor(rows, dtype=torch.float64)
    out = t.to(torch.bfloat16)
    assert torch.equal(out.to(torch.float64).nan_to_num(7.0), t.nan_to_num(7.0)), "test values must be bf16-exact"
    return out


def test_compare_by_hand() -> None:
    a = bf16([[1.0, 3.0, 3.0, 0.0],        # a tie: top-1 is the lowest id, margin 0
              [0.5, 2.0, 1.0, -1.0],       # margin 1
              [0.0, float("nan"), 1.0, 2.0]])
    b = bf16([[1.0, 3.0, 3.5, 0.0],        # the tie resolved the other way: a flip
              [0.5, 2.0, 1.0, -1.0],       # identical row
              [0.0, float("nan"), 1.0, 2.0]])
    p = compare(a, b)
    assert p.top1_a.tolist()[:2] == [1, 1] and p.top1_b.tolist()[:2] == [2, 1]
    assert p.margin[0] == 0.0 and p.margin[1] == 1.0 and math.isnan(p.margin[2])
    assert p.flip.tolist() == [True, False, False] and p.differ.tolist() == [True, False, False]


def test_margins_are_exact_where_float32_would_round() -> None:
    """2^20 - 2^-20 needs 41 significand bits: the bf16 values are subtracted in float64."""
    logits = torch.tensor([[2.0**20, 2.0**-20, -1.0]]).to(torch.bfloat16)
    assert float(margins(logits)[0]) == 2.0**20 - 2.0**-20
    assert float(torch.tensor(2.0**20) - torch.tensor(2.0**-20)) != 2.0**20 - 2.0**-20  # float32 would round
    with pytest.raises(InputError, match="at least two logits"):
        margins(torch.zeros(3, 1, dtype=torch.bfloat16))


def test_row_blocks_hand_each_arm_exactly_its_copies_rows() -> None:
    g = torch.Generator().manual_seed(0)
    a_q = torch.randint(-127, 128, (12, 64), generator=g, dtype=torch.int8)
    w_q = torch.randint(-128, 128, (16, 64), generator=g, dtype=torch.int8)
    s_a, s_w = torch.rand(12, generator=g) * 0.1, torch.rand(16, generator=g) * 0.01
    cut, tri = get("exact-cutlass-order", CPU), get("exact-triton-order", CPU)
    arm = RowBlockArm([(cut, 1), (tri, 2)], rows=4, layer="x")
    out = arm.scaled_mm(a_q, w_q, s_a, s_w)
    assert torch.equal(out[:4].view(torch.int16), cut.scaled_mm(a_q[:4], w_q, s_a[:4], s_w).view(torch.int16))
    assert torch.equal(out[4:].view(torch.int16), tri.scaled_mm(a_q[4:], w_q, s_a[4:], s_w).view(torch.int16))
    with pytest.raises(InputError, match="12 rows reached the row-block arm, expected 2 copies"):
        RowBlockArm([(cut, 2)], rows=4, layer="x").scaled_mm(a_q, w_q, s_a, s_w)


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    model = build_synthetic("tiny", seed=0, vocab_size=256)
    return swap_linears(model, quantize_linears(model), get("exact-cutlass-order", CPU))


def test_copies_under_one_arm_agree_and_arms_are_restored(tiny: torch.nn.Module) -> None:
    ids = torch.arange(10, 26)
    cut, tri = get("exact-cutlass-order", CPU), get("exact-triton-order", CPU)
    before = [layer.arm for layer in w8a8_layers(tiny)]
    logits = replay_window(tiny, ids, 3, lambda layer, w: RowBlockArm([(cut, 1), (tri, 1), (cut, 1)], 16, layer),
                           0, CPU)
    assert logits.shape == (3, 16, 256) and logits.dtype == torch.bfloat16
    assert copies_identical(logits, 0, 2)
    assert [layer.arm for layer in w8a8_layers(tiny)] == before
    alone = replay_window(tiny, ids, 1, lambda layer, w: tri, 0, CPU)
    p = compare(logits[0], logits[1])
    assert p.flip.shape == (16,) and np.array_equal(p.top1_b, alone[0].argmax(dim=-1).numpy())


def test_a_failing_arm_leaves_the_model_as_it_was(tiny: torch.nn.Module) -> None:
    class Refuses:
        name = "refuses"

        def scaled_mm(self, *_: torch.Tensor) -> torch.Tensor:
            raise InputError("refuses: no output")

    before = [layer.arm for layer in w8a8_layers(tiny)]
    with pytest.raises(InputError, match="refuses: no output"):
        replay_window(tiny, torch.arange(4), 1, lambda layer, w: Refuses(), 0, CPU)
    assert [layer.arm for layer in w8a8_layers(tiny)] == before
    with pytest.raises(InputError, match="no W8A8Linear layers"):
        w8a8_layers(torch.nn.Linear(2, 2))

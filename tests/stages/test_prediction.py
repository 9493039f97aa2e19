"""prediction: exact max|acc|, headroom, bounds and the pow2 bitwise prediction on hand-checkable operands.

Each operand set is small enough to check by hand; boundary cases sit exactly on 2**24, on the
int32 depth bound, and on float32's normal range, and where the prediction says "not bitwise"
the exact emulations of the two kernel orders are shown to really disagree.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from int8alibi.arith import compare_bf16
from int8alibi.config import load_config
from int8alibi.errors import InputError, ProtocolError
from int8alibi.kernels import get
from int8alibi.kernels.layer_operands import Operands
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.files.parquet import read_table
from int8alibi.stages import prediction
from int8alibi.analysis import bitwise_prediction
from int8alibi.kernels import capture_index

PROJECT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def ops(a_rows: list[list[int]], w_rows: list[list[int]], s_a: list[float], s_w: list[float],
        layer: str = "model.layers.0.mlp.up_proj") -> Operands:
    return Operands(layer, 0, layer.rsplit(".", 1)[-1],
                    torch.tensor(a_rows, dtype=torch.int8), torch.tensor(s_a, dtype=torch.float32),
                    torch.tensor(w_rows, dtype=torch.int8), torch.tensor(s_w, dtype=torch.float32))


def f32_from_bits(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32).item()


def both_orders(op: Operands) -> tuple[torch.Tensor, torch.Tensor]:
    args = (op.a_q, op.w_q, op.s_a, op.s_w)
    return get("exact-cutlass-order", CPU).scaled_mm(*args), get("exact-triton-order", CPU).scaled_mm(*args)


def test_max_acc_and_headroom_by_hand() -> None:
    # acc = [[127*127*2, -128*127*2]] = [[32258, -32512]]
    op = ops([[127, 127]], [[127, 127], [-128, -128]], [0.5], [0.25, 0.125])
    row = bitwise_prediction.predict_layer(op, "pow2-snapped", CPU)
    assert row["max_abs_acc"] == 32512
    assert row["headroom_bits"] == pytest.approx(math.log2(2**24 / 32512), abs=1e-12)
    assert row["int32_bound_holds"] and row["f32_exact"] and row["weight_scales_exact"]
    assert row["predicted_bitwise_pow2"]


def test_headroom_conventions() -> None:
    assert bitwise_prediction.headroom_bits(0) == math.inf
    assert bitwise_prediction.headroom_bits(2**24) == 0.0
    assert bitwise_prediction.headroom_bits(2**25) == -1.0
    assert bitwise_prediction.headroom_bits(1) == 24.0
    with pytest.raises(InputError, match="negative"):
        bitwise_prediction.headroom_bits(-1)


def test_f32_exact_boundary_at_2_pow_24() -> None:
    # 1024 products of (-128)(-128) = 2**24 exactly; one more product of 1 goes one past it.
    at = ops([[-128] * 1024], [[-128] * 1024], [1.0], [1.0])
    past = ops([[-128] * 1024 + [1]], [[-128] * 1024 + [1]], [1.0], [1.0])
    row_at = bitwise_prediction.predict_layer(at, "pow2-snapped", CPU)
    row_past = bitwise_prediction.predict_layer(past, "pow2-snapped", CPU)
    assert row_at["max_abs_acc"] == 2**24 and row_at["f32_exact"] and row_at["headroom_bits"] == 0.0
    assert row_at["predicted_bitwise_pow2"]
    assert row_past["max_abs_acc"] == 2**24 + 1 and not row_past["f32_exact"]
    assert row_past["headroom_bits"] < 0 and not row_past["predicted_bitwise_pow2"]


def test_int32_depth_bound_boundary() -> None:
    # 16256 * 132104 < 2**31 <= 16256 * 132105; zero operands: max|acc| = 0, infinite headroom.
    deepest = bitwise_prediction.predict_layer(ops([[0] * 132104], [[0] * 132104], [1.0], [1.0]), "pow2-snapped", CPU)
    too_deep = bitwise_prediction.predict_layer(ops([[0] * 132105], [[0] * 132105], [1.0], [1.0]), "pow2-snapped", CPU)
    assert deepest["int32_bound_holds"] and deepest["predicted_bitwise_pow2"]
    assert deepest["max_abs_acc"] == 0 and deepest["headroom_bits"] == math.inf
    assert not too_deep["int32_bound_holds"] and not too_deep["predicted_bitwise_pow2"]


def test_normal_range_boundaries_of_the_products() -> None:
    # s_a * s_w * acc = 2**-120 * 2**-6 * 1 = 2**-126: the smallest normal, still predicted bitwise.
    low = bitwise_prediction.products_normal(torch.tensor([[1]]), torch.tensor([2.0**-120]), torch.tensor([2.0**-6]))
    below = bitwise_prediction.products_normal(torch.tensor([[1]]), torch.tensor([2.0**-120]), torch.tensor([2.0**-7]))
    # 2**100 * 2**20 * 2**7 = 2**127 is finite; with acc = 2**8 the product is 2**128: overflow.
    high = bitwise_prediction.products_normal(torch.tensor([[2**7]]), torch.tensor([2.0**100]), torch.tensor([2.0**20]))
    over = bitwise_prediction.products_normal(torch.tensor([[2**8]]), torch.tensor([2.0**100]), torch.tensor([2.0**20]))
    # the largest float32 itself is finite: (2 - 2**-23) * 2**103 * 2**24
    largest = bitwise_prediction.products_normal(torch.tensor([[2**24]]), torch.tensor([f32_from_bits(0x737FFFFF)]),
                                         torch.tensor([1.0]))
    assert (low, below, high, over, largest) == (True, False, True, False, True)
    # zero scales and zero accumulators multiply exactly, however small the other factors
    assert bitwise_prediction.products_normal(torch.tensor([[0, 5]]), torch.tensor([0.0]), torch.tensor([2.0**-126, 2.0**100]))


def test_zero_activation_scale_does_not_hide_an_overflow() -> None:
    # s_w * acc = 5 * 2**127 overflows before the zero activation scale is applied: CUTLASS gives
    # 0 * inf = NaN, Triton 2**127 * (0 * 5) = 0.
    op = ops([[5]], [[1]], [0.0], [2.0**127])
    assert not bitwise_prediction.products_normal(torch.tensor([[5]]), op.s_a, op.s_w)
    assert not bitwise_prediction.predict_layer(op, "pow2-requant", CPU)["predicted_bitwise_pow2"]
    cutlass, triton = both_orders(op)
    assert torch.isnan(cutlass.float()).all() and triton.float().tolist() == [[0.0]]


def test_zero_scale_rows_stay_zero_when_snapped() -> None:
    op = ops([[0, 0], [3, -5]], [[1, 2]], [0.0, 0.3], [0.011])
    snapped = bitwise_prediction.snap_operands(op)
    assert snapped.s_a.tolist() == [0.0, 0.25] and snapped.s_w.tolist() == [2.0**-7]
    row = bitwise_prediction.predict_layer(op, "pow2-snapped", CPU)
    assert row["predicted_bitwise_pow2"]
    with pytest.raises(InputError, match="s_a"):
        bitwise_prediction.snap_operands(ops([[1]], [[1]], [-0.5], [1.0]))


def test_overflow_case_is_not_predicted_and_the_orders_really_differ() -> None:
    # acc = 64 * 16 = 2**10, both scales powers of two: CUTLASS forms s_w*acc = 2**130 = inf first,
    # Triton s_a*acc = 2**-10 and then 2**110. The prediction must not claim bitwise agreement.
    op = ops([[64]], [[16]], [2.0**-20], [2.0**120])
    row = bitwise_prediction.predict_layer(op, "pow2-snapped", CPU)
    assert row["weight_scales_exact"] and row["f32_exact"] and not row["products_normal"]
    assert not row["predicted_bitwise_pow2"]
    cutlass, triton = both_orders(op)
    result = compare_bf16(cutlass, triton)
    assert result.differing == 1 and result.nonfinite_a == 1 and result.nonfinite_b == 0


def test_subnormal_double_rounding_is_not_predicted_and_the_orders_really_differ() -> None:
    # pow2-requant regime: power-of-two weight scale 2**-126, a real activation scale. The product
    # lands among float32 subnormals: Triton rounds s_a*acc, then again after * 2**-126; CUTLASS
    # rounds once. acc = 21*127 + 15 = 2682; the two bf16 results differ.
    op = ops([[127] * 21 + [15]], [[1] * 22], [f32_from_bits(0x39997C48)], [2.0**-126])
    row = bitwise_prediction.predict_layer(op, "pow2-requant", CPU)
    assert row["max_abs_acc"] == 2682 and row["weight_scales_exact"] and not row["products_normal"]
    assert not row["predicted_bitwise_pow2"]
    cutlass, triton = both_orders(op)
    assert compare_bf16(cutlass, triton).differing == 1


def test_pow2_requant_needs_power_of_two_weight_scales() -> None:
    op = ops([[3, 4]], [[5, 6]], [0.1], [0.3])
    row = bitwise_prediction.predict_layer(op, "pow2-requant", CPU)
    assert not row["weight_scales_exact"] and not row["predicted_bitwise_pow2"]
    assert bitwise_prediction.predict_layer(op, "pow2-snapped", CPU)["predicted_bitwise_pow2"]


def test_random_layers_predicted_bitwise_are_bitwise_identical() -> None:
    gen = torch.Generator().manual_seed(7)
    for trial in range(4):
        a_q = torch.randint(-127, 128, (16, 96), generator=gen, dtype=torch.int8)
        w_q = torch.randint(-128, 128, (24, 96), generator=gen, dtype=torch.int8)
        s_a = torch.rand(16, generator=gen) * 0.05 + 1e-4
        s_w = (torch.rand(24, generator=gen) * 0.01 + 1e-5).to(torch.bfloat16).float()
        op = bitwise_prediction.snap_operands(Operands(f"l{trial}", trial, "q_proj", a_q, s_a, w_q, s_w))
        assert bitwise_prediction.predict_layer(op, "pow2-requant", CPU)["predicted_bitwise_pow2"]
        cutlass, triton = both_orders(op)
        assert compare_bf16(cutlass, triton).differing == 0


def test_thresholds_must_match_the_code() -> None:
    good = {"f32_exact_bound": 2**24, "int32": {"product_bound": 16256, "limit": 2**31}}
    prediction.check_thresholds(good)
    with pytest.raises(ProtocolError, match="f32_exact_bound"):
        prediction.check_thresholds({**good, "f32_exact_bound": 2**23})


def test_stage_writes_one_row_per_captured_layer(tmp_path: Path) -> None:
    own = [ops([[1, 2]], [[3, 4], [5, 6]], [0.3], [0.02, 0.03], layer=f"model.layers.{b}.mlp.up_proj")
           for b in range(2)]
    pow2 = [ops([[1, 2]], [[3, 4], [5, 6]], [0.3], [2.0**-6, 2.0**-5], layer=f"model.layers.{b}.mlp.up_proj")
            for b in range(2)]
    index = capture_index.write_capture(tmp_path / "capture", {("own", "prefill"): (own, "t"),
                                                         ("pow2-nearest", "prefill"): (pow2, "t")})
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text((PROJECT / "config" / "config.yaml").read_text())
    cfg = load_config(cfg_path, ["device=cpu"])
    out = tmp_path / "prediction"
    prediction.run(cfg, out, index=index, project_root=PROJECT)
    table = read_table(out / "predictions.parquet", bitwise_prediction.PREDICTION_SCHEMA)
    assert len(table) == 4
    assert set(zip(table.checkpoint, table.pow2_setting)) == {("own", "pow2-snapped"), ("pow2-nearest", "pow2-requant")}
    assert table["max_abs_acc"].tolist() == [1 * 5 + 2 * 6] * 4  # acc = [[1*3 + 2*4, 1*5 + 2*6]]
    assert table["predicted_bitwise_pow2"].all()
    manifest = load_manifest(out / "manifest.json")
    assert manifest["stage"] == "prediction" and manifest["extra"]["rows"] == 4
    assert {rec["path"].rsplit("/", 1)[-1] for rec in manifest["inputs"]} == {
        "index.parquet", "own-prefill.safetensors", "pow2-nearest-prefill.safetensors"}

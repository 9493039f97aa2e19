"""``int8alibi bench decode`` on the CPU with the tiny preset: its floor's bytes from the model's shapes,
its table, and its refusals."""

from __future__ import annotations

import pytest

from int8alibi.kernels.registry import get
from int8alibi.model.synthetic import build_synthetic, synthetic_config
from int8alibi.model.w8a8 import quantize_linears, swap_linears
from int8alibi.tools.bench import decode


def test_the_floor_counts_every_projection_weight_its_scales_and_the_head() -> None:
    config = synthetic_config("tiny")
    model = build_synthetic("tiny", seed=0)
    swap_linears(model, quantize_linears(model, "none"), get("exact-cutlass-order", "cpu"))
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    per_block = [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]  # (out, in) of q k v o gate up down
    projections = config.num_hidden_layers * sum(out * inp + 4 * out for out, inp in per_block)
    assert decode.step_bytes(model) == projections + config.vocab_size * h * 2


def test_the_cpu_table_has_one_row_per_arm_with_its_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert decode.main(["--preset", "tiny", "--steps", "2", "--device", "cpu",
                        "--arms", "exact-cutlass-order,exact-triton-order"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| exact-")]
    assert [r.split(" | ")[0:2] for r in rows] == [["| exact-cutlass-order", "eager dynamic cache"],
                                                   ["| exact-triton-order", "eager dynamic cache"]]
    for row in rows:
        ms, floor, ratio = (float(c) for c in row.strip(" |").split(" | ")[2:])
        assert ms > 0 and floor > 0 and ratio == pytest.approx(ms / floor, rel=0.06, abs=0.06)


def test_bad_counts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert decode.main(["--preset", "tiny", "--steps", "0", "--device", "cpu"]) == 2
    assert "--steps and --layers must be >= 1" in capsys.readouterr().err

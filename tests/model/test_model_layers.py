"""Layer enumeration: every projection of every block, in (block, projection) order, fail-closed."""

from __future__ import annotations

import pytest
from torch import nn

from int8alibi.errors import InputError
from int8alibi.model.layers import PROJECTIONS, parse_layer_name, quantized_linears, sort_layer_names


def test_tiny_qwen3_has_two_blocks_of_seven_in_order(tiny_model):
    refs = quantized_linears(tiny_model)
    assert [(r.block, r.proj) for r in refs] == [(b, p) for b in range(2) for p in PROJECTIONS]
    assert refs[0].name == "model.layers.0.self_attn.q_proj" and refs[-1].name == "model.layers.1.mlp.down_proj"


def test_names_parse_and_sort_numerically():
    names = ["model.layers.10.mlp.up_proj", "model.layers.2.self_attn.v_proj", "model.layers.2.mlp.gate_proj"]
    assert [r.name for r in sort_layer_names(names)] == [names[1], names[2], names[0]]
    assert parse_layer_name("model.layers.3.self_attn.q_norm") is None
    assert parse_layer_name("model.layers.3.mlp.q_proj") is None  # q_proj belongs to self_attn
    assert parse_layer_name("lm_head") is None
    with pytest.raises(InputError, match="'lm_head' is not a decoder projection"):
        sort_layer_names(["lm_head"])


def test_missing_projection_or_no_decoder_fails_closed(tiny_model):
    del tiny_model.model.layers[1].mlp.up_proj
    with pytest.raises(InputError, match=r"block 1 lacks \['up_proj'\]"):
        quantized_linears(tiny_model)
    with pytest.raises(InputError, match="no decoder projections"):
        quantized_linears(nn.Sequential(nn.Linear(4, 4)))

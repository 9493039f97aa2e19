"""Operand capture: the tensors each W8A8 layer hands its kernel, observed independently."""

from __future__ import annotations

import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.model.hooks import capture, tapped
from int8alibi.model.w8a8 import quantize_linears, swap_linears
from int8alibi.kernels.layer_operands import operand_digest
from int8alibi.quant.activation import quantize_per_token


@pytest.fixture
def swapped(tiny_model, reference_arm):
    return swap_linears(tiny_model, quantize_linears(tiny_model), reference_arm)


def test_capture_records_what_the_kernel_received(swapped):
    inputs: dict[str, torch.Tensor] = {}
    handles = [swapped.get_submodule(name).register_forward_pre_hook(
        lambda mod, args, name=name: inputs.__setitem__(name, args[0].detach().clone()))
        for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj")]
    ids = torch.arange(5, 45)
    ops = capture(swapped, ids)
    for h in handles:
        h.remove()
    assert len(ops) == 14 and list(ops)[0] == "model.layers.0.self_attn.q_proj"
    for name, x in inputs.items():
        op = ops[name]
        a_q, s_a = quantize_per_token(x.reshape(-1, x.shape[-1]))
        layer = swapped.get_submodule(name)
        assert op.m == 40 and op.k == layer.in_features and op.n == layer.out_features
        assert torch.equal(op.a_q, a_q) and torch.equal(op.s_a, s_a)
        assert op.w_q is layer.w_q and torch.equal(op.s_w, layer.s_w.float().flatten())
    down = ops["model.layers.1.mlp.down_proj"]
    assert (down.block, down.proj) == (1, "down_proj")
    assert all(not swapped.get_submodule(n).taps for n in ops)  # taps removed afterwards


def test_capture_is_deterministic_and_can_select_layers(swapped):
    ids = torch.arange(7, 30)[None, :]
    first = capture(swapped, ids, layers=["model.layers.1.self_attn.v_proj"])
    again = capture(swapped, ids, layers=["model.layers.1.self_attn.v_proj"])
    assert list(first) == ["model.layers.1.self_attn.v_proj"]
    assert operand_digest(first["model.layers.1.self_attn.v_proj"]) == operand_digest(again["model.layers.1.self_attn.v_proj"])


def test_capture_fails_closed(swapped):
    with pytest.raises(InputError, match="not projections of this model"):
        capture(swapped, torch.arange(4), layers=["lm_head"])
    with pytest.raises(InputError, match="non-empty integer"):
        capture(swapped, torch.ones(4))
    with pytest.raises(InputError, match="ran twice"):
        with tapped(swapped), torch.no_grad():
            swapped(input_ids=torch.arange(4)[None, :])
            swapped(input_ids=torch.arange(4)[None, :])


def test_capture_needs_a_swapped_model():
    from int8alibi.model.synthetic import build_synthetic

    with pytest.raises(InputError, match="not a W8A8Linear; swap_linears first"):
        capture(build_synthetic("tiny", 1, vocab_size=64), torch.arange(4))

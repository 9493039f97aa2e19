"""Projections reading one input as one int8 GEMM (model.projection_groups): the same bits as each
projection alone, fewer GEMMs, and every case that must fall back to computing a member alone."""

from __future__ import annotations

import pytest
import torch

from int8alibi.engines.own import cache_argument, greedy_steps
from int8alibi.engines.static_decode import static_steps
from int8alibi.kernels.registry import get
from int8alibi.model.projection_groups import grouped, projection_groups
from int8alibi.model.synthetic import build_synthetic
from int8alibi.model.w8a8 import W8A8Linear, quantize_linears, swap_linears

CPU = torch.device("cpu")
IDS = torch.tensor([[5, 17, 200, 2, 9, 31, 77, 3]])


class Counting:
    """An arm that counts its GEMMs and their N, computing through a real (exact) arm."""

    def __init__(self, arm: object) -> None:
        self.arm, self.calls = arm, []
        self.name = getattr(arm, "name", "counting")

    def scaled_mm(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        self.calls.append(w_q.shape[0])
        return self.arm.scaled_mm(a_q, w_q, s_a, s_w)


def _model(arm: object) -> torch.nn.Module:
    model = build_synthetic("tiny", seed=0, vocab_size=256)
    return swap_linears(model, quantize_linears(model, "none"), arm)


def _layers(model: torch.nn.Module) -> list[W8A8Linear]:
    return [m for m in model.modules() if isinstance(m, W8A8Linear)]


@pytest.mark.parametrize("arm_name", ["exact-cutlass-order", "exact-triton-order"])
@pytest.mark.parametrize("ids", [IDS, IDS[:, :1]], ids=["M=8", "M=1"])
def test_a_grouped_forward_is_the_ungrouped_forward_bit_for_bit_with_fewer_gemms(arm_name: str, ids: torch.Tensor) -> None:
    arm = Counting(get(arm_name, CPU))
    model = _model(arm)
    before = {m.name: (m.w_q.clone(), m.s_w32.clone()) for m in _layers(model)}
    with torch.inference_mode():
        alone = model(input_ids=ids).logits
        n_alone = len(arm.calls)
        arm.calls.clear()
        with grouped(model) as groups:
            together = model(input_ids=ids).logits
        n_grouped, first = len(arm.calls), arm.calls[:3]
        again = model(input_ids=ids).logits  # outside the block: each projection alone again
    blocks = model.config.num_hidden_layers
    assert len(groups) == 2 * blocks
    assert torch.equal(alone.view(torch.int16), together.view(torch.int16))
    assert torch.equal(alone.view(torch.int16), again.view(torch.int16))
    assert (n_alone, n_grouped, len(arm.calls) - n_grouped) == (7 * blocks, 4 * blocks, 7 * blocks)
    c = model.config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    assert first == [q + 2 * kv, c.hidden_size, 2 * c.intermediate_size]  # qkv, o, gate+up of block 0
    for m in _layers(model):  # values unchanged; group members are views of one buffer
        assert torch.equal(m.w_q, before[m.name][0]) and torch.equal(m.s_w32, before[m.name][1])
    attn = model.model.layers[0].self_attn
    assert attn.k_proj.w_q.untyped_storage().data_ptr() == attn.q_proj.w_q.untyped_storage().data_ptr()


def test_building_the_groups_twice_keeps_the_first() -> None:
    model = _model(get("exact-cutlass-order", CPU))
    first = projection_groups(model)
    assert [id(g) for g in projection_groups(model)] == [id(g) for g in first]


def test_a_tap_or_a_member_on_another_arm_computes_each_member_alone() -> None:
    arm = Counting(get("exact-cutlass-order", CPU))
    model = _model(arm)
    block = model.model.layers[0]
    block.self_attn.v_proj.taps.append(lambda layer, a_q, s_a: None)
    other = Counting(get("exact-cutlass-order", CPU))
    block.mlp.up_proj.arm = other
    with torch.inference_mode(), grouped(model):
        arm.calls.clear()
        model(input_ids=IDS[:, :1])
    c = model.config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    assert arm.calls[:5] == [q, kv, kv, c.hidden_size, c.intermediate_size]  # block 0: all alone
    assert other.calls == [c.intermediate_size]
    assert arm.calls[6] == q + 2 * kv  # block 1 still grouped


def test_a_member_called_with_another_tensor_or_out_of_order_computes_alone() -> None:
    arm = Counting(get("exact-cutlass-order", CPU))
    model = _model(arm)
    attn = model.model.layers[0].self_attn
    x = torch.randn(1, 2, model.config.hidden_size).to(torch.bfloat16)
    y = x.clone()
    with torch.inference_mode(), grouped(model):
        q = attn.q_proj(x)
        v_first = attn.v_proj(x)  # skips k: not the member expected next
        k_other = attn.k_proj(y)  # another tensor (equal values)
    with torch.inference_mode():
        expect = [attn.q_proj(x), attn.v_proj(x), attn.k_proj(y)]
    for got, want in zip((q, v_first, k_other), expect):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    n = attn.q_proj.out_features + 2 * attn.k_proj.out_features
    assert arm.calls[:3] == [n, attn.v_proj.out_features, attn.k_proj.out_features]


def test_static_decode_steps_grouped_on_the_cpu_are_the_dynamic_cache_steps() -> None:
    """The static-cache step (grouped) against the model's own dynamic-cache steps (each projection
    alone), bit for bit, on the exact arm."""
    model = _model(get("exact-triton-order", CPU))
    with torch.inference_mode():
        dynamic = greedy_steps(model, IDS, None)
        want = [next(dynamic) for _ in range(6)]
        steps = static_steps(model, IDS, 6, cache_argument(model), graph=False)
        got = [next(steps) for _ in range(6)]
    assert [int(n) for _, n in got] == [int(n) for _, n in want]
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for (a, _), (b, _) in zip(got, want))

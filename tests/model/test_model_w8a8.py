"""W8A8 path: the swapped linears compute exactly quantize -> scaled_mm -> reshape, nothing else
of the model changes, and every mismatch between model and checkpoint fails closed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from int8alibi.errors import InputError
from int8alibi.kernels.registry import get
from int8alibi.model.layers import quantized_linears
from int8alibi.model.w8a8 import NonFiniteGuard, W8A8Linear, quantize_linears, swap_linears
from int8alibi.quant import weight as wq
from int8alibi.quant.activation import quantize_per_token
from int8alibi.quant.compressed_tensors import load_checkpoint, save_checkpoint


def test_quantize_linears_applies_the_weight_rule_per_layer(tiny_model):
    ckpt = quantize_linears(tiny_model, "ceiling")
    assert list(ckpt) == [r.name for r in quantized_linears(tiny_model)]
    w = tiny_model.get_submodule("model.layers.1.mlp.down_proj").weight
    expected = wq.requantize(w.detach(), "ceiling")
    assert torch.equal(ckpt["model.layers.1.mlp.down_proj"].w_q, expected.w_q)


def test_w8a8_linear_is_quantize_then_cutlass_epilogue(reference_arm):
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(64, 48, generator=gen) * 0.05).to(torch.bfloat16)
    w_q, s_w = wq.quantize_weight(w)
    layer = W8A8Linear(w_q, s_w, reference_arm, name="probe")
    x = (torch.randn(2, 5, 48, generator=gen) * 3).to(torch.bfloat16)
    y = layer(x)
    assert y.shape == (2, 5, 64) and y.dtype == torch.bfloat16
    a_q, s_a = quantize_per_token(x.reshape(10, 48))
    acc = a_q.double() @ w_q.double().T  # exact: |acc| < 2^53
    expected = (s_a.double()[:, None] * (s_w.double().T * acc)).float()
    # The epilogue is float32 with one final rounding; agreement within one bf16 spacing of float64.
    assert torch.allclose(y.reshape(10, 64).float(), expected, rtol=2**-7, atol=0)
    assert torch.equal(y.reshape(10, 64), reference_arm.scaled_mm(a_q, w_q, s_a, s_w.float().flatten()))


def test_swap_replaces_only_projections_and_matches_the_exact_arm(tiny_model, reference_arm):
    ids = torch.arange(3, 40)[None, :]
    with torch.no_grad():
        bf16_logits = tiny_model(input_ids=ids).logits
    norm_before = tiny_model.model.layers[0].input_layernorm
    swap_linears(tiny_model, quantize_linears(tiny_model), reference_arm)
    swapped = [n for n, m in tiny_model.named_modules() if isinstance(m, W8A8Linear)]
    assert len(swapped) == 14 and tiny_model.model.layers[0].input_layernorm is norm_before
    assert isinstance(tiny_model.lm_head, nn.Linear) and not isinstance(tiny_model.lm_head, W8A8Linear)
    with torch.no_grad():
        w8a8 = tiny_model(input_ids=ids).logits
    assert bool(torch.isfinite(w8a8).all()) and not torch.equal(w8a8, bf16_logits)
    # The project's exact CUTLASS-order arm gives the same bits as the test-local restatement.
    for name in swapped:
        tiny_model.get_submodule(name).arm = get("exact-cutlass-order", "cpu")
    with torch.no_grad():
        assert torch.equal(tiny_model(input_ids=ids).logits, w8a8)


def test_swap_from_a_saved_checkpoint(tiny_model, reference_arm, tmp_path):
    own = quantize_linears(tiny_model)
    state = {n.removesuffix(".weight") if n.removesuffix(".weight") in own else n: t
             for n, t in tiny_model.state_dict().items()}
    other = {n: t for n, t in state.items() if n not in own and n != "lm_head.weight"}  # lm_head is tied
    path = save_checkpoint(tmp_path / "own", own, other, tiny_model.config.to_dict())
    swap_linears(tiny_model, load_checkpoint(path), reference_arm)
    layer = tiny_model.get_submodule("model.layers.0.self_attn.k_proj")
    assert torch.equal(layer.w_q, own["model.layers.0.self_attn.k_proj"].w_q)


def test_mismatches_fail_closed(tiny_model, reference_arm):
    own = quantize_linears(tiny_model)
    partial = dict(own)
    partial.pop("model.layers.1.mlp.gate_proj")
    with pytest.raises(InputError, match="1 missing"):
        swap_linears(tiny_model, partial, reference_arm)
    wrong = dict(own)
    wrong["model.layers.0.mlp.up_proj"] = own["model.layers.0.mlp.down_proj"]
    with pytest.raises(InputError, match=r"model.layers.0.mlp.up_proj weight is \[128, 384\]"):
        swap_linears(tiny_model, wrong, reference_arm)
    tiny_model.model.layers[0].self_attn.q_proj.bias = nn.Parameter(torch.zeros(128, dtype=torch.bfloat16))
    with pytest.raises(InputError, match="q_proj: has a bias"):
        swap_linears(tiny_model, own, reference_arm)


def test_w8a8_linear_refuses_non_bf16_input(reference_arm):
    w_q, s_w = wq.quantize_weight(torch.ones(16, 16, dtype=torch.bfloat16))
    layer = W8A8Linear(w_q, s_w, reference_arm, name="l")
    with pytest.raises(InputError, match=r"W8A8Linear l: input must be bf16 \[..., 16\]"):
        layer(torch.ones(2, 16))
    with pytest.raises(InputError, match="s_w must be bf16"):
        W8A8Linear(w_q, s_w.float(), reference_arm)


def _layers(names: list[str], arm: object) -> list[W8A8Linear]:
    return [W8A8Linear(torch.ones(8, 8, dtype=torch.int8), torch.ones(8, 1, dtype=torch.bfloat16), arm, name=n)
            for n in names]


def test_the_non_finite_guard_names_the_first_layer_and_starts_again_from_zero(reference_arm):
    """The guard's logic on CPU counters (on CUDA the layers' kernels add into the same slots)."""
    layers = _layers(["a", "b", "c"], reference_arm)
    guard = NonFiniteGuard(layers, torch.device("cpu"))
    assert [int(layer.nonfinite) for layer in layers] == [0, 0, 0]
    guard.check()  # nothing counted: passes
    layers[1].nonfinite += 3  # what b's kernel does on the device: a view of its slot
    layers[2].nonfinite += 1
    with pytest.raises(InputError, match=r"^b input: 3 non-finite element\(s\); .* \(and 1 later layer\(s\)\)$"):
        guard.check()
    assert guard.counts.tolist() == [0, 0, 0]
    guard.check()  # reset: the next forward starts from zero
    layers[0].nonfinite += 2
    with pytest.raises(InputError, match=r"^a input: 2 non-finite element\(s\); no int8 scale represents them$"):
        guard.check()


def test_a_cpu_model_keeps_the_per_layer_check_and_gets_no_guard(tiny_model, reference_arm):
    model = swap_linears(tiny_model, quantize_linears(tiny_model, "none"), reference_arm)
    assert not model._forward_hooks
    assert all(m.nonfinite is None for m in model.modules() if isinstance(m, W8A8Linear))
    layer = _layers(["probe"], reference_arm)[0]
    x = torch.ones(1, 8, dtype=torch.bfloat16)
    x[0, 3] = float("nan")
    with pytest.raises(InputError, match="probe input: 1 non-finite"):
        layer(x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the guard is CUDA-only)")
def test_a_cuda_model_checks_once_per_forward_and_names_the_first_layer(tiny_model):
    arm = get("triton", "cuda")
    model = swap_linears(tiny_model.cuda(), quantize_linears(tiny_model.cuda(), "none"), arm)
    ids = torch.tensor([[1, 2, 3]], device="cuda")
    model(input_ids=ids, use_cache=False)  # finite: passes
    first = next(m for m in model.modules() if isinstance(m, W8A8Linear))
    first.register_forward_pre_hook(lambda mod, args: (args[0].clone().fill_(float("nan")),))
    with pytest.raises(InputError, match=rf"^{first.name} input: \d+ non-finite element\(s\)"):
        model(input_ids=ids, use_cache=False)

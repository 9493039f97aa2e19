"""The synthetic parents' presets as plain data: readable at plan time without torch or transformers.

``tiny`` is the test suite's model; the others are Qwen3-1.7B, 8B and 14B as their public
config.json files give them. ``int8alibi.model.synthetic`` builds the models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

QWEN3_VOCAB = 151936


@dataclass(frozen=True)
class Preset:
    """A synthetic model: its Qwen3 shape and how its weights and tokenizer are made."""

    shape: dict[str, int]
    vocab_size: int
    tie_word_embeddings: bool
    weights: str  # "torch-generator" (tiny) or "counter-hash" (seeded_weights)
    tokenizer: str  # "gguf-package" (the default model's) or "bytes" (byte_tokenizer)
    config: dict[str, Any] = field(default_factory=dict)  # further Qwen3Config fields


def _qwen3(layers: int, hidden: int, intermediate: int, heads: int, *, tied: bool) -> Preset:
    """A paper-scale preset: Qwen3's published shape, rope and vocabulary, 8 KV heads of width 128."""
    return Preset(dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=8, head_dim=128),
                  vocab_size=QWEN3_VOCAB, tie_word_embeddings=tied, weights="counter-hash", tokenizer="bytes",
                  config=dict(max_position_embeddings=40960, rope_theta=1_000_000.0))


PRESETS: dict[str, Preset] = {
    # 2 blocks x 7 linears: hidden 128, MLP 384, 4 query heads and 2 KV heads of width 32.
    "tiny": Preset(dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=32),
                   vocab_size=49152, tie_word_embeddings=True, weights="torch-generator", tokenizer="gguf-package",
                   config=dict(max_position_embeddings=4096)),
    # Qwen3-1.7B, 8B and 14B as their config.json files give them (1.7B ties its head to the embedding).
    "qwen3-1.7b": _qwen3(28, 2048, 6144, 16, tied=True),
    "qwen3-8b": _qwen3(36, 4096, 12288, 32, tied=False),
    "qwen3-14b": _qwen3(40, 5120, 17408, 40, tied=False),
}


def preset(name: str) -> Preset:
    """The preset called ``name``; an unknown name is an InputError listing the known ones."""
    if name not in PRESETS:
        raise InputError(f"synthetic model preset {name!r} unknown (expected one of {sorted(PRESETS)})")
    return PRESETS[name]


def synthetic_config_fields(name: str = "tiny", vocab_size: int | None = None) -> dict[str, Any]:
    """The config.json fields of preset ``name`` as a plain dict (no transformers import)."""
    spec = preset(name)
    vocab = spec.vocab_size if vocab_size is None else vocab_size
    if vocab < 2:
        raise InputError(f"synthetic model: vocab_size={vocab} must be >= 2")
    return dict(spec.shape, vocab_size=vocab, tie_word_embeddings=spec.tie_word_embeddings, rms_norm_eps=1e-6,
                bos_token_id=None, eos_token_id=None, pad_token_id=None, model_type="qwen3", **spec.config)

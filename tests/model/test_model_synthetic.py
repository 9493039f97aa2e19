"""The seeded synthetic Qwen3: deterministic per seed, independent of the global RNG, real shapes."""

from __future__ import annotations

import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.model.synthetic import build_synthetic, synthetic_config
from int8alibi.operands import QWEN3_SHAPES


def test_weights_depend_on_the_seed_only():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = build_synthetic("tiny", 3, vocab_size=64).state_dict()
    assert torch.equal(torch.random.get_rng_state(), before)  # global RNG untouched
    torch.manual_seed(999)
    b = build_synthetic("tiny", 3, vocab_size=64).state_dict()
    c = build_synthetic("tiny", 4, vocab_size=64).state_dict()
    assert all(torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) for k in a)
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], c["model.layers.0.mlp.up_proj.weight"])


def test_tiny_model_is_bf16_with_float32_rotary_and_kernel_friendly_shapes():
    model = build_synthetic("tiny", 0, vocab_size=64)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    for name, module in model.named_modules():
        if name.endswith("_proj"):
            n, k = module.weight.shape
            assert n % 16 == 0 and k % 16 == 0, name
    with torch.no_grad():
        assert bool(torch.isfinite(model(input_ids=torch.arange(10)[None]).logits).all())


def test_qwen3_shapes_preset_matches_the_study_shapes():
    config = synthetic_config("qwen3-1.7b-shapes", vocab_size=1024)
    shapes = QWEN3_SHAPES["qwen3-1.7b"]
    kv = config.num_key_value_heads * config.head_dim
    expected = {"q_proj": (config.hidden_size, config.num_attention_heads * config.head_dim),
                "k_proj": (config.hidden_size, kv), "v_proj": (config.hidden_size, kv),
                "o_proj": (config.num_attention_heads * config.head_dim, config.hidden_size),
                "gate_proj": (config.hidden_size, config.intermediate_size),
                "up_proj": (config.hidden_size, config.intermediate_size),
                "down_proj": (config.intermediate_size, config.hidden_size)}
    assert config.num_hidden_layers == shapes.blocks
    assert {proj: (k, n) for _, proj, k, n in shapes.projections} == expected


def test_unknown_preset_or_bad_arguments_are_refused():
    with pytest.raises(InputError, match="preset 'huge' unknown"):
        synthetic_config("huge")
    with pytest.raises(InputError, match="seed=-1 must be >= 0"):
        build_synthetic("tiny", -1)

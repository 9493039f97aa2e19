"""The seeded synthetic Qwen3: deterministic per seed, independent of the global RNG, real shapes."""

from __future__ import annotations

import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.model.seeded_weights import seeded_tensor
from int8alibi.model.synthetic import (PRESETS, build_synthetic, parameter_shapes, synthetic_config, synthetic_tensor,
                                      write_synthetic)
from int8alibi.kernels.layer_operands import QWEN3_SHAPES


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


# The public config.json of each Qwen3 size (blocks, hidden, MLP, heads, KV heads, head width,
# vocabulary, tied head, context, rope base) and its parameter count as stated by the model card.
QWEN3 = {
    "qwen3-1.7b": dict(num_hidden_layers=28, hidden_size=2048, intermediate_size=6144, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(num_hidden_layers=36, hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "qwen3-14b": dict(num_hidden_layers=40, hidden_size=5120, intermediate_size=17408, num_attention_heads=40,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
}
STATED_BILLIONS = {"qwen3-1.7b": 1.7, "qwen3-8b": 8.2, "qwen3-14b": 14.8}


@pytest.mark.parametrize("name", sorted(QWEN3))
def test_paper_presets_have_qwen3s_published_shapes(name):
    config = synthetic_config(name)
    assert {key: getattr(config, key) for key in QWEN3[name]} == QWEN3[name]
    assert (config.rms_norm_eps, config.max_position_embeddings) == (1e-6, 40960)
    assert config.rope_parameters["rope_theta"] == 1_000_000.0


@pytest.mark.parametrize("name", sorted(QWEN3))
def test_paper_presets_parameters_match_the_study_shapes_without_allocating(name):
    shapes = parameter_shapes(synthetic_config(name))  # meta device: no 28 GB allocation
    spec = QWEN3[name]
    hidden, vocab = spec["hidden_size"], spec["vocab_size"]
    q, kv = spec["num_attention_heads"] * spec["head_dim"], spec["num_key_value_heads"] * spec["head_dim"]
    expected_linears = {"q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden),
                        "o_proj": (hidden, q), "gate_proj": (spec["intermediate_size"], hidden),
                        "up_proj": (spec["intermediate_size"], hidden),
                        "down_proj": (hidden, spec["intermediate_size"])}
    study = QWEN3_SHAPES[name]
    assert study.blocks == spec["num_hidden_layers"]
    for layer, _block, proj, k, n in study.layers():
        assert shapes[f"{layer}.weight"] == (n, k) == expected_linears[proj]
    assert shapes["model.embed_tokens.weight"] == (vocab, hidden)
    assert ("lm_head.weight" in shapes) == (not spec["tie_word_embeddings"])
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (spec["head_dim"],)
    total = sum(torch.Size(s).numel() for s in shapes.values())
    assert round(total / 1e9, 1) == STATED_BILLIONS[name]


def test_paper_preset_weights_come_from_the_counter_hash():
    """A paper preset's parameter is seeded_tensor(name) with std 0.02 (norms: offset 1), whatever
    the thread count: checked on one matrix and one norm of the real 1.7B shapes."""
    spec = PRESETS["qwen3-1.7b"]
    shape = (1024, 2048)  # k_proj
    name = "model.layers.3.self_attn.k_proj.weight"
    w = synthetic_tensor(spec, 7, name, shape, threads=2)
    assert torch.equal(w.view(torch.int16), seeded_tensor(shape, 7, name, 0.02, threads=1).view(torch.int16))
    norm = synthetic_tensor(spec, 7, "model.norm.weight", (2048,))
    assert torch.equal(norm, seeded_tensor((2048,), 7, "model.norm.weight", 0.02, 1.0))
    assert abs(norm.float().mean().item() - 1.0) < 2e-3


def test_written_folder_loads_as_the_built_model(tmp_path):
    """write_synthetic's sharded folder is a valid HF parent holding build_synthetic's tensors."""
    from int8alibi.model.sources import load_hf_dir, tensors_digest

    folder = write_synthetic("tiny", 2, tmp_path / "parent", shard_bytes=300_000)
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    assert len(shards) > 2 and (folder / "model.safetensors.index.json").is_file()
    assert folder.stat().st_mode & 0o777 == 0o755 and {p.stat().st_mode & 0o777 for p in folder.iterdir()} == {0o644}
    model, tokenizer = load_hf_dir(folder)
    assert tensors_digest(model) == tensors_digest(build_synthetic("tiny", 2))
    assert len(tokenizer) == model.config.vocab_size == 49152
    with pytest.raises(InputError, match="already exists"):
        write_synthetic("tiny", 2, folder)


def test_unknown_preset_or_bad_arguments_are_refused():
    with pytest.raises(InputError, match="preset 'huge' unknown"):
        synthetic_config("huge")
    with pytest.raises(InputError, match="seed=-1 must be >= 0"):
        build_synthetic("tiny", -1)

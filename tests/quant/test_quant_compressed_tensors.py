"""compressed-tensors I/O: round trips (single file and shards), llm-compressor's own output, and
every rejection naming the file and the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from int8alibi.errors import InputError
from int8alibi.quant import weight as wq
from int8alibi.quant.compressed_tensors import (CheckpointWriter, load_checkpoint, quantization_config,
                                                save_checkpoint)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llmcompressor"
LAYERS = ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.up_proj")
MODEL_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 32}


def _layers(seed: int = 0) -> dict[str, wq.QuantizedWeight]:
    gen = torch.Generator().manual_seed(seed)
    return {name: wq.quantize_weight((torch.randn(48, 32, generator=gen) * 0.02).to(torch.bfloat16))
            for name in LAYERS}


def _other() -> dict[str, torch.Tensor]:
    return {"model.embed_tokens.weight": torch.ones(16, 32, dtype=torch.bfloat16),
            "model.norm.weight": torch.full((32,), 0.5, dtype=torch.bfloat16)}


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return save_checkpoint(tmp_path / "ckpt", _layers(), _other(), MODEL_CONFIG)


def test_round_trip_keeps_every_byte_and_writes_the_scheme(saved: Path):
    ckpt = load_checkpoint(saved)
    layers = _layers()
    assert ckpt.layers == tuple(sorted(LAYERS)) and set(ckpt) == set(LAYERS) and len(ckpt) == 3
    for name in LAYERS:
        assert torch.equal(ckpt[name].w_q, layers[name].w_q)
        assert torch.equal(ckpt[name].s_w.view(torch.int16), layers[name].s_w.view(torch.int16))
    assert ckpt.other_names == tuple(sorted(_other()))
    assert torch.equal(ckpt.tensor("model.norm.weight"), _other()["model.norm.weight"])
    config = json.loads((saved / "config.json").read_text())
    qc = config["quantization_config"]
    assert config["hidden_size"] == 32
    assert (qc["format"], qc["quant_method"], qc["ignore"]) == ("int-quantized", "compressed-tensors", ["lm_head"])
    group = qc["config_groups"]["group_0"]
    assert {k: group["weights"][k] for k in ("num_bits", "type", "symmetric", "strategy")} == \
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    assert group["input_activations"]["dynamic"] is True and group["input_activations"]["strategy"] == "token"
    stored = load_file(str(saved / "model.safetensors"))
    assert stored["model.layers.0.mlp.down_proj.weight"].dtype == torch.int8
    assert stored["model.layers.0.mlp.down_proj.weight_scale"].shape == (48, 1)


def test_sharded_checkpoint_loads_the_same(tmp_path: Path):
    path = save_checkpoint(tmp_path / "sharded", _layers(), _other(), MODEL_CONFIG, shard_bytes=2000)
    assert (path / "model.safetensors.index.json").is_file() and not (path / "model.safetensors").exists()
    assert len(list(path.glob("model-*-of-*.safetensors"))) > 2
    ckpt = load_checkpoint(path)
    for name, layer in _layers().items():
        assert torch.equal(ckpt[name].w_q, layer.w_q)


def test_reads_llm_compressors_own_output():
    ckpt = load_checkpoint(FIXTURE / "quantized")
    assert len(ckpt) == 14 and "model.embed_tokens.weight" in ckpt.other_names


def test_layer_names_must_match_the_parent(saved: Path):
    with pytest.raises(InputError, match=r"ckpt: quantized layers differ from the parent /p: 1 missing"):
        load_checkpoint(saved, [*LAYERS, "model.layers.1.mlp.gate_proj"], against="the parent /p")
    with pytest.raises(InputError, match="1 extra"):
        load_checkpoint(saved, LAYERS[:2])


def test_writer_leaves_nothing_when_interrupted(tmp_path: Path):
    with pytest.raises(RuntimeError):
        with CheckpointWriter(tmp_path / "partial", MODEL_CONFIG) as writer:
            writer.add_layer(LAYERS[0], _layers()[LAYERS[0]])
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_wrong_dtypes(tmp_path: Path):
    writer = CheckpointWriter(tmp_path / "x", MODEL_CONFIG)
    with pytest.raises(InputError, match="expected int8 \\[N,K\\] and bf16 \\[N,1\\]"):
        writer.add_layer("a", wq.QuantizedWeight(torch.zeros(2, 2, dtype=torch.int8), torch.ones(2, 1)))
    with pytest.raises(InputError, match="'n' is torch.float32; expected bfloat16"):
        writer.add_tensor("n", torch.ones(2))
    writer.abort()


# --- rejections: each corrupts one aspect of a valid checkpoint -------------------------------------

def _edit_config(path: Path, edit) -> None:
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))


def _edit_tensors(path: Path, edit) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def _weights(config):
    return config["quantization_config"]["config_groups"]["group_0"]["weights"]


def _inputs(config):
    return config["quantization_config"]["config_groups"]["group_0"]["input_activations"]


CONFIG_EDITS = {
    "no_quant_config": (lambda c: c.pop("quantization_config"), "no quantization_config block"),
    "quant_method": (lambda c: c["quantization_config"].update(quant_method="gptq"), "quant_method 'gptq'"),
    "format": (lambda c: c["quantization_config"].update(format="pack-quantized"), "format 'pack-quantized'"),
    "per_tensor": (lambda c: _weights(c).update(strategy="tensor"), "not channel-wise symmetric int8"),
    "grouped": (lambda c: _weights(c).update(strategy="group", group_size=128), "not channel-wise symmetric int8"),
    "asymmetric": (lambda c: _weights(c).update(symmetric=False), "not channel-wise symmetric int8"),
    "four_bit": (lambda c: _weights(c).update(num_bits=4), "not channel-wise symmetric int8"),
    "float_weights": (lambda c: _weights(c).update(type="float"), "not channel-wise symmetric int8"),
    "static_inputs": (lambda c: _inputs(c).update(dynamic=False), "dynamic per-token"),
    "no_inputs": (lambda c: c["quantization_config"]["config_groups"]["group_0"].update(input_activations=None),
                  "has no input_activations"),
    "kv_cache": (lambda c: c["quantization_config"].update(kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme"),
    "transform": (lambda c: c["quantization_config"].update(transform_config={"spinquant": {}}), "transform_config"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_EDITS))
def test_config_rejections(saved: Path, case: str):
    edit, reason = CONFIG_EDITS[case]
    _edit_config(saved, edit)
    with pytest.raises(InputError) as err:
        load_checkpoint(saved)
    assert str(saved / "config.json") in str(err.value) and reason in str(err.value)


SCALE = "model.layers.0.mlp.down_proj.weight_scale"
WEIGHT = "model.layers.0.mlp.down_proj.weight"


def _set(name, value):
    return lambda t: t.__setitem__(name, value)


def _zero_one(t):
    t[SCALE] = t[SCALE].clone()
    t[SCALE][3, 0] = 0


def _nan_one(t):
    t[SCALE] = t[SCALE].clone()
    t[SCALE][5, 0] = float("nan")


TENSOR_EDITS = {
    "missing_scale": (lambda t: t.pop(SCALE), f"int8 weight '{WEIGHT}' has no weight_scale"),
    "scale_vector": (_set(SCALE, torch.ones(48, dtype=torch.bfloat16)), "expected bfloat16 [48, 1]"),
    "scale_per_tensor": (_set(SCALE, torch.ones(1, 1, dtype=torch.bfloat16)), "expected bfloat16 [48, 1]"),
    "scale_float32": (_set(SCALE, torch.ones(48, 1)), "is torch.float32"),
    "zero_scale": (_zero_one, "1 zero, negative or non-finite scale(s) (first at channel 3"),
    "nan_scale": (_nan_one, "non-finite scale(s) (first at channel 5"),
    "negative_scale": (_set(SCALE, -torch.ones(48, 1, dtype=torch.bfloat16)), "48 zero, negative or non-finite"),
    "bf16_weight": (_set(WEIGHT, torch.ones(48, 32, dtype=torch.bfloat16)), "expected int8 [N,K] beside its scale"),
    "missing_weight": (lambda t: t.pop(WEIGHT), f"'{SCALE}' has no '{WEIGHT}'"),
    "zero_point": (_set(WEIGHT + "_zero_point", torch.zeros(48, 1, dtype=torch.int8)), "asymmetric weights"),
    "input_scale": (_set("model.layers.0.mlp.down_proj.input_scale", torch.ones(1, dtype=torch.bfloat16)),
                    "static activation scales"),
    "float32_other": (_set("model.norm.weight", torch.ones(32)), "'model.norm.weight' is torch.float32"),
}


@pytest.mark.parametrize("case", sorted(TENSOR_EDITS))
def test_tensor_rejections(saved: Path, case: str):
    edit, reason = TENSOR_EDITS[case]
    _edit_tensors(saved, edit)
    with pytest.raises(InputError) as err:
        load_checkpoint(saved)
    assert str(saved / "model.safetensors") in str(err.value) and reason in str(err.value)


def test_missing_files_are_named(tmp_path: Path, saved: Path):
    with pytest.raises(InputError, match="checkpoint directory not found"):
        load_checkpoint(tmp_path / "nowhere")
    (saved / "model.safetensors").unlink()
    with pytest.raises(InputError, match="no model.safetensors or model.safetensors.index.json"):
        load_checkpoint(saved)
    (saved / "config.json").unlink()
    with pytest.raises(InputError, match="config.json: not found"):
        load_checkpoint(saved)


def test_corrupt_safetensors_is_named(saved: Path):
    (saved / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(InputError, match="model.safetensors: not a readable safetensors file"):
        load_checkpoint(saved)


def test_written_config_is_what_the_loader_accepts():
    from int8alibi.quant.compressed_tensors import check_quantization_config

    assert check_quantization_config(Path("x"), {"quantization_config": quantization_config()})["format"] == "int-quantized"


def test_config_nested_too_deeply_or_truncated_shard_is_named(saved: Path):
    data = (saved / "model.safetensors").read_bytes()
    (saved / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=rf"{saved / 'model.safetensors'}: not a readable safetensors file"):
        load_checkpoint(saved)
    (saved / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match=rf"{saved / 'config.json'}: not readable JSON \(RecursionError"):
        load_checkpoint(saved)

"""Requant stage: the byte-exact gate against llm-compressor's checkpoint, its failures (which write
nothing), the self-built label, the power-of-two arms and the division statistics. (The gate against
a checkpoint llm-compressor makes in the run, the reference stage's: tests/stages/test_reference.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from int8alibi.config import Config
from int8alibi.errors import GateError, InputError, ProtocolError
from int8alibi.quant.compressed_tensors import load_checkpoint
from int8alibi.quant.variants import CHECKPOINT_VARIANTS
from int8alibi.stages import requant
from int8alibi.quant import gate as requant_gate
from int8alibi.model import requant as requant_rule

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "llmcompressor"
PROTOCOL = REPO / "preregistration"
LAYER = "model.layers.1.mlp.gate_proj"


def _cfg(tmp_path: Path) -> Config:
    data = {"model": {"source": "synthetic", "synthetic": {"preset": "tiny", "seed": 0}, "checkpoint": None},
            "size_profile": "default-cpu", "corpus": {"source": "package"}, "device": "cpu", "arms": "auto",
            "exploratory": False, "results": str(tmp_path / "results")}
    return Config(data=data, path=tmp_path / "config.yaml")


def _run(tmp_path: Path, checkpoint: Path | None, protocol: Path = PROTOCOL) -> Path:
    out = tmp_path / "requant"
    requant.run(_cfg(tmp_path), out, parent=FIXTURE / "parent", checkpoint=checkpoint, protocol=protocol)
    return out


def _nothing_written(out: Path) -> bool:
    return not out.exists() or list(out.iterdir()) == []


@pytest.fixture(scope="module")
def passed(tmp_path_factory) -> Path:
    """The stage run once against llm-compressor's own checkpoint of the fixture parent."""
    return _run(tmp_path_factory.mktemp("gate"), FIXTURE / "quantized")


def test_gate_passes_on_llm_compressor_checkpoint(passed: Path):
    table = pd.read_parquet(passed / "gate.parquet")
    assert len(table) == 14 * 4 and set(table.arm) == set(CHECKPOINT_VARIANTS)
    own = table[table.arm == "own"]
    label = requant_rule.committed_reference(FIXTURE / "quantized").label
    assert label.startswith(f"committed {FIXTURE / 'quantized'} (files sha256 ")
    assert own.bytes_equal.all() and (own.reference == label).all() and (own.differing_int8 == 0).all()
    assert set(table.gate) == {requant_gate.GATE_PASSED}
    manifest = json.loads((passed / "manifest.json").read_text())
    assert manifest["extra"]["gate"] == requant_gate.GATE_PASSED and manifest["params"]["division"] == "bf16"
    assert manifest["extra"]["reference"]["kind"] == "committed"
    assert label.endswith(f"(files sha256 {manifest['extra']['reference']['sha256'][:16]})")
    committed = load_checkpoint(FIXTURE / "quantized")
    own_ckpt = load_checkpoint(passed / "checkpoints" / "own")
    for layer in committed.layers:
        assert torch.equal(own_ckpt[layer].w_q, committed[layer].w_q)
        assert torch.equal(own_ckpt[layer].s_w.view(torch.int16), committed[layer].s_w.view(torch.int16))


def test_pow2_arms_have_power_of_two_scales_and_the_probe_keeps_old_int8(passed: Path):
    from int8alibi.arith import is_pow2

    table = pd.read_parquet(passed / "gate.parquet")
    pow2 = table[table.arm != "own"]
    assert pow2.all_pow2.all() and not table[table.arm == "own"].all_pow2.any()
    assert (table[table.arm == "probe"].differing_int8 == 0).all() and table[table.arm == "probe"].clipped.isna().all()
    assert (table[table.arm == "pow2-nearest"].differing_int8 > 0).all()
    # Nearest may round a scale down and clip; ceiling never rounds down.
    assert table[table.arm == "pow2-nearest"].clipped.sum() > table[table.arm == "pow2-ceiling"].clipped.sum()
    own = load_checkpoint(passed / "checkpoints" / "own")
    probe = load_checkpoint(passed / "checkpoints" / "probe")
    for arm in ("pow2-nearest", "pow2-ceiling", "probe"):
        ckpt = load_checkpoint(passed / "checkpoints" / arm, own.layers)
        assert all(bool(is_pow2(ckpt[layer].s_w).all()) for layer in ckpt.layers)
        assert json.loads((ckpt.path / "config.json").read_text())["int8alibi"]["arm"] == arm
    assert torch.equal(probe[LAYER].w_q, own[LAYER].w_q)


def test_division_statistics_per_layer_and_in_the_manifest(passed: Path):
    """Own rows: int8 weights a float32 division changes, counted here against llm-compressor's
    stored bytes; the snapped arms divide by powers of two (exact), the probe divides nothing."""
    from int8alibi.quant import weight as wq

    table = pd.read_parquet(passed / "gate.parquet")
    parent = load_file(str(FIXTURE / "parent" / "model.safetensors"))
    committed = load_checkpoint(FIXTURE / "quantized")
    own = table[table.arm == "own"].set_index("layer")
    for layer in committed.layers:
        stored = committed[layer]
        f32 = wq.quantize_with_scale(parent[f"{layer}.weight"], stored.s_w, "float32")
        assert own.loc[layer, "f32_division_differing"] == int((f32 != stored.w_q).sum()), layer
    assert (own.quotient_shift_max <= 0.25).all() and (own.code_offset_max < 0.75).all()
    snapped = table[table.arm.isin(["pow2-nearest", "pow2-ceiling"])]
    assert (snapped.f32_division_differing == 0).all() and (snapped.quotient_shift_max == 0).all()
    probe = table[table.arm == "probe"]
    assert probe.f32_division_differing.isna().all() and probe.quotient_shift_max.isna().all()
    summary = json.loads((passed / "manifest.json").read_text())["extra"]["division_statistics"]
    assert summary["f32_division_differing"] == int(own.f32_division_differing.sum())
    assert summary["weights"] == int((own.n * own.k).sum()) == sum(parent[f"{layer}.weight"].numel() for layer in own.index)
    assert summary["f32_division_differing_share"] == summary["f32_division_differing"] / summary["weights"]
    assert summary["code_offset_max"] == float(own.code_offset_max.max())


def test_one_changed_int8_weight_fails_the_gate_and_writes_nothing(tmp_path: Path):
    bad = tmp_path / "bad"
    shutil.copytree(FIXTURE / "quantized", bad)
    tensors = load_file(str(bad / "model.safetensors"))
    w = tensors[f"{LAYER}.weight"].clone()
    old = int(w[3, 7])
    w[3, 7] = old + 1 if old < 127 else old - 1
    tensors[f"{LAYER}.weight"] = w
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(GateError) as err:
        _run(tmp_path, bad)
    message = str(err.value)
    assert f"1 of 14 layers of {bad} differ" in message
    assert f"{LAYER} (1 int8, 0 scales; first int8 at [3, 7]: rebuilt {old}, reference {int(w[3, 7])})" in message
    assert "float32 would have matched 0 of them" in message
    assert _nothing_written(tmp_path / "requant")


def test_pinned_float32_division_fails_and_says_bf16_would_have_matched(tmp_path: Path):
    protocol = tmp_path / "preregistration"
    shutil.copytree(PROTOCOL, protocol)
    thresholds = yaml.safe_load((protocol / "thresholds.yaml").read_text())
    thresholds["weight_quantization"].update(division="float32", division_alternatives=["bf16"])
    (protocol / "thresholds.yaml").write_text(yaml.safe_dump(thresholds))
    with pytest.raises(GateError) as err:
        _run(tmp_path, FIXTURE / "quantized", protocol)
    message = str(err.value)
    assert "14 of 14 layers" in message and "pinned division 'float32'" in message
    assert "dividing in bf16 would have matched every differing layer" in message and "fails regardless" in message
    assert _nothing_written(tmp_path / "requant")


def test_protocol_pinning_another_rule_is_refused(tmp_path: Path):
    protocol = tmp_path / "preregistration"
    shutil.copytree(PROTOCOL, protocol)
    thresholds = yaml.safe_load((protocol / "thresholds.yaml").read_text())
    thresholds["weight_quantization"]["scale_divisor"] = 127
    (protocol / "thresholds.yaml").write_text(yaml.safe_dump(thresholds))
    with pytest.raises(ProtocolError, match="scale_divisor is 127, but the implemented rule uses 127.5"):
        requant_rule.pinned_division(protocol)


def test_checkpoint_of_another_parent_fails_the_gate(tmp_path: Path):
    other = tmp_path / "other"
    shutil.copytree(FIXTURE / "quantized", other)
    tensors = load_file(str(other / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 2
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(GateError, match="'model.norm.weight' differs from the parent.*not made from this parent"):
        _run(tmp_path, other)
    assert _nothing_written(tmp_path / "requant")


def test_checkpoint_with_other_layers_is_refused(tmp_path: Path):
    partial = tmp_path / "partial"
    shutil.copytree(FIXTURE / "quantized", partial)
    tensors = load_file(str(partial / "model.safetensors"))
    tensors[f"{LAYER}.weight"] = torch.ones(384, 128, dtype=torch.bfloat16)
    del tensors[f"{LAYER}.weight_scale"]
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match=r"quantized layers differ from the parent .*1 missing"):
        _run(tmp_path, partial)


def test_without_a_checkpoint_the_gate_is_labelled_self_built(tmp_path: Path):
    out = _run(tmp_path, None)
    table = pd.read_parquet(out / "gate.parquet")
    assert set(table.gate) == {"self-built (not an independent test)"}
    own = table[table.arm == "own"]
    assert own.bytes_equal.isna().all() and (own.reference == "none (self-built)").all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["extra"]["gate"] == "self-built (not an independent test)"
    assert manifest["params"]["committed"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_requant_on_cuda_writes_the_bytes_it_writes_on_cpu(passed: Path, tmp_path: Path):
    """A GPU run computes the weight rule on the GPU: every checkpoint file and the gate table are the
    CPU run's bytes."""
    from int8alibi.files.hashing import tree_hashes

    cfg = _cfg(tmp_path)
    cfg.data["device"] = "cuda"
    out = tmp_path / "requant"
    requant.run(cfg, out, parent=FIXTURE / "parent", checkpoint=FIXTURE / "quantized", protocol=PROTOCOL)
    assert tree_hashes(out / "checkpoints") == tree_hashes(passed / "checkpoints")
    assert (out / "gate.parquet").read_bytes() == (passed / "gate.parquet").read_bytes()

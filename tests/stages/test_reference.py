"""Reference stage: llm-compressor itself quantizes the tiny parent in its own environment; the bytes
do not depend on the thread count or the instruction set; the requant gate passes against them and
stops on a one-byte change.

The tool runs in .venv-llmcompressor (./bootstrap builds it from workflow/envs/llmcompressor.txt); the tests
that need it are skipped, saying so, only where that environment was not built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file, save_file

from int8alibi import portable
from int8alibi.errors import InputError
from int8alibi.files.hashing import tree_hashes
from int8alibi.provenance.manifest import write_manifest
from int8alibi.quant.compressed_tensors import load_checkpoint
from int8alibi.stages import reference, requant
from int8alibi.snakefile.rerun import LLMCOMPRESSOR_VENV
from int8alibi.quant import gate as requant_gate
from int8alibi.model import requant as requant_rule

ROOT = Path(__file__).resolve().parents[2]
TOOL_PYTHON = ROOT / LLMCOMPRESSOR_VENV / "bin" / "python"
FIXTURE = ROOT / "tests" / "fixtures" / "llmcompressor"
ARMS = ["exact-cutlass-order", "exact-triton-order"]
LAYER = "model.layers.1.mlp.gate_proj"

needs_tool = pytest.mark.skipif(not TOOL_PYTHON.is_file(), reason=f"{LLMCOMPRESSOR_VENV} not built: run ./bootstrap "
                                "(it installs workflow/envs/llmcompressor.txt there)")


def _reference(config: Path, out: Path, parent: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(TOOL_PYTHON), "-m", "int8alibi.stages.reference", "--config", str(config),
                           "--out", str(out), "--input", f"parent={parent}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def made(tiny_pipeline, tmp_path_factory) -> dict:
    """The tiny parent quantized by llm-compressor twice: portable settings with one thread, and
    the host's own instruction set (portable settings off) with two."""
    config, cfg = tiny_pipeline("reference", ARMS)
    parent = cfg.results / "model" / "parent.parquet"
    runs = {}
    base = {k: v for k, v in os.environ.items() if k not in portable.STEERING_VARS}
    for name, extra in (("portable-1", {"OMP_NUM_THREADS": "1"}),
                        ("native-2", {"OMP_NUM_THREADS": "2", "PORTABLE_CPU": "0"})):
        out = tmp_path_factory.mktemp(name) / "reference"
        done = _reference(config, out, parent, {**base, **extra})
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = out
    return {"config": config, "cfg": cfg, "parent": parent, "runs": runs}


@needs_tool
def test_llm_compressor_writes_a_checkpoint_under_a_manifest_naming_tool_versions_and_recipe(made):
    out = made["runs"]["portable-1"]
    manifest = json.loads((out / "manifest.json").read_text())
    tool = manifest["extra"]["tool"]
    assert tool["versions"]["llmcompressor"] == "0.14.0.1" and tool["versions"]["compressed-tensors"] == "0.19.0"
    assert tool["versions"]["torch"].startswith("2.13.0") and set(tool["versions"]) == set(reference.TOOL_DISTRIBUTIONS)
    assert tool["describe"].startswith("llm-compressor 0.14.0.1 (compressed-tensors 0.19.0, torch 2.13.0")
    assert manifest["params"]["recipe"] == reference.RECIPE
    assert [o["name"] for o in manifest["outputs"]] == ["checkpoint"]
    ckpt = load_checkpoint(out / "checkpoint")
    assert len(ckpt.layers) == 14 and ckpt.config["quantization_config"]["quant_method"] == "compressed-tensors"


@needs_tool
def test_bytes_do_not_depend_on_threads_or_instruction_set(made):
    a, b = (tree_hashes(made["runs"][n] / "checkpoint") for n in ("portable-1", "native-2"))
    assert a == b and "model.safetensors" in a


@needs_tool
def test_gate_passes_against_llm_compressors_checkpoint(made, tmp_path: Path):
    manifest = made["runs"]["portable-1"] / "manifest.json"
    out = tmp_path / "requant"
    requant.run(made["cfg"], out, parent=made["parent"], reference=manifest, protocol=ROOT / "preregistration")
    table = pd.read_parquet(out / "gate.parquet")
    own = table[table.arm == "own"]
    assert set(table.gate) == {requant_gate.GATE_PASSED_TOOL} and len(own) == 14 and own.bytes_equal.all()
    assert own.reference.str.startswith("llm-compressor 0.14.0.1 (compressed-tensors 0.19.0").all()
    # the reference is named inside the results folder, not by where that folder lies
    where = f": <results>/{manifest.parent.name}/checkpoint (files sha256 "
    assert own.reference.str.contains(where, regex=False).all()
    assert not own.reference.str.contains(str(tmp_path), regex=False).any()
    assert not own.reference.str.contains(str(manifest.parent.parent), regex=False).any()
    extra = json.loads((out / "manifest.json").read_text())["extra"]
    assert extra["reference"]["kind"] == "llm-compressor" and extra["reference"]["tool"]["versions"]["llmcompressor"]
    assert extra["division_statistics"]["f32_division_differing"] > 0


def _requant_cli(made: dict, out: Path, manifest: Path) -> subprocess.CompletedProcess:
    """The requant stage as Snakemake starts it (its exit status is what stops the run)."""
    return subprocess.run([sys.executable, "-m", "int8alibi.stages.requant", "--config", str(made["config"]),
                           "--out", str(out), "--input", f"parent={made['parent']}",
                           "--input", f"reference={manifest}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def _one_byte_changed(made: dict, tmp_path: Path) -> tuple[Path, int, int]:
    """A copy of the reference with one int8 weight moved by one; returns (folder, old, new)."""
    stage = tmp_path / "reference"
    shutil.copytree(made["runs"]["portable-1"], stage)
    file = stage / "checkpoint" / "model.safetensors"
    tensors = load_file(str(file))
    w = tensors[f"{LAYER}.weight"].clone()
    old = int(w[3, 7])
    w[3, 7] = old + 1 if old < 127 else old - 1
    tensors[f"{LAYER}.weight"] = w
    save_file(tensors, str(file), metadata={"format": "pt"})
    return stage, old, int(w[3, 7])


@needs_tool
def test_a_one_byte_change_to_the_reference_stops_the_run_at_the_gate(made, tmp_path: Path):
    stage, old, new = _one_byte_changed(made, tmp_path)
    # the changed bytes re-recorded as if the tool had written them: only the gate can catch them
    recorded = json.loads((stage / "manifest.json").read_text())
    write_manifest(stage, stage="reference", outputs={"checkpoint": stage / "checkpoint"},
                   inputs={"parent": made["parent"]}, params=recorded["params"], protocol_root=ROOT / "preregistration",
                   extra=recorded["extra"])
    out = tmp_path / "requant"
    done = _requant_cli(made, out, stage / "manifest.json")
    assert done.returncode == 1
    assert "stage requant failed: requant gate failed: 1 of 14 layers" in done.stderr
    assert f"{LAYER} (1 int8, 0 scales; first int8 at [3, 7]: rebuilt {old}, reference {new})" in done.stderr
    assert not (out / "gate.parquet").exists() and not (out / "manifest.json").exists()


@needs_tool
def test_a_reference_changed_after_its_manifest_is_refused(made, tmp_path: Path):
    stage, _, _ = _one_byte_changed(made, tmp_path)
    with pytest.raises(InputError, match="files differ from those its manifest .* records"):
        requant_rule.tool_reference(stage / "manifest.json")


def test_outside_llm_compressors_environment_the_stage_names_it(tmp_path: Path):
    try:
        import llmcompressor  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match="not installed in this Python environment.*workflow/envs/llmcompressor.txt"):
            reference.tool_versions()
    else:
        pytest.skip("not applicable: llm-compressor is importable in this environment")


def test_committed_checkpoint_and_tool_reference_together_are_refused(tmp_path: Path):
    from int8alibi.config import Config

    data = {"model": {"source": "synthetic", "synthetic": {"preset": "tiny", "seed": 0},
                      "checkpoint": str(FIXTURE / "quantized")},
            "size_profile": "default-cpu", "corpus": {"source": "package"}, "device": "cpu", "arms": "auto",
            "exploratory": False, "results": str(tmp_path / "results")}
    with pytest.raises(InputError, match="committed checkpoint"):
        requant.run(Config(data=data, path=tmp_path / "config.yaml"), tmp_path / "requant",
                    parent=FIXTURE / "parent", reference=tmp_path / "reference" / "manifest.json")


def test_accelerators_are_hidden_before_the_tool_looks(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr("torch.accelerator.is_available", lambda: False)
    reference.hide_accelerators()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_an_accelerator_still_visible_after_hiding_stops_the_stage(monkeypatch):
    """CUDA initialised earlier in the process keeps its devices: the stage refuses instead of letting
    the tool quantize there (dividing in float32)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr("torch.accelerator.is_available", lambda: True)
    with pytest.raises(InputError, match="accelerator is still visible"):
        reference.hide_accelerators()


@needs_tool
def test_manifest_records_the_pinned_cpu_path_the_tool_reports(made):
    compute = json.loads((made["runs"]["portable-1"] / "manifest.json").read_text())["extra"]["tool"]["compute"]
    assert compute["device"] == "cpu" and compute["tool_device"] == "cpu"
    assert compute["cuda_visible_devices"] == "" and compute["division"].startswith("bf16")


@needs_tool
@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device visible to torch")
def test_bytes_unchanged_when_a_cuda_device_is_visible(made, tmp_path: Path):
    """On a GPU host: the reference made with the GPU visible to the process equals the one made
    with it hidden from the start (the stage hides it from the tool itself)."""
    base = {k: v for k, v in os.environ.items() if k not in portable.STEERING_VARS}
    visible, hidden = tmp_path / "visible" / "reference", tmp_path / "hidden" / "reference"
    for out, cuda in ((visible, "0"), (hidden, "")):
        done = _reference(made["config"], out, made["parent"], {**base, "CUDA_VISIBLE_DEVICES": cuda})
        assert done.returncode == 0, done.stderr[-3000:]
    assert tree_hashes(visible / "checkpoint") == tree_hashes(hidden / "checkpoint")
    assert tree_hashes(visible / "checkpoint") == tree_hashes(made["runs"]["portable-1"] / "checkpoint")

"""Every stage reads another stage's files only as that stage's manifest records them: a file
changed after the upstream stage ran stops the reading stage (``stage_main``) before it reads,
naming the file and the upstream manifest; so does a saved parent record changed under the model
stage's manifest."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from int8alibi.errors import ManifestError
from int8alibi.model import sources
from int8alibi.runtime.runner import stage_main
from int8alibi.stages.capture import run as capture

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pipe(tiny_pipeline):
    return tiny_pipeline("stage-inputs", ["exact-cutlass-order", "exact-fp32-order"])


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _capture(config: Path, results: Path) -> int:
    return stage_main(capture, ["--config", str(config), "--out", str(results / "capture"),
                                "--input", f"gate={results}/requant/gate.parquet"])


def test_changed_upstream_file_stops_the_stage_naming_both(pipe, tmp_path, monkeypatch, capsys):
    config, cfg = pipe
    results = Path(cfg["results"])
    monkeypatch.chdir(ROOT)
    manifest = results / "requant" / "manifest.json"
    # a checkpoint beside the gate table, which capture reads through the gate, changed after requant ran
    shard = sorted((results / "requant" / "checkpoints").rglob("*.safetensors"))[0]
    original = shard.read_bytes()
    try:
        flip_byte(shard, len(original) - 1)
        assert _capture(config, results) == 1
        err = capsys.readouterr().err
        checkpoints = results / "requant" / "checkpoints"
        assert f"stage capture failed: {checkpoints}: does not match the manifest {manifest} of stage 'requant'" in err
        assert f"file {shard.relative_to(checkpoints).as_posix()} changed" in err
        assert "rerun stage 'requant'" in err
        assert not (results / "capture" / "manifest.json").exists()
    finally:
        shard.write_bytes(original)
    gate = results / "requant" / "gate.parquet"
    original = gate.read_bytes()
    try:
        flip_byte(gate, 60)
        assert _capture(config, results) == 1
        assert f"{gate}: does not match the manifest {manifest}" in capsys.readouterr().err
    finally:
        gate.write_bytes(original)


def test_saved_parent_record_changed_under_the_model_manifest_is_refused(pipe, tmp_path):
    _, cfg = pipe
    copy = tmp_path / "results" / "model"
    shutil.copytree(Path(cfg["results"]) / "model", copy)
    flip_byte(copy / "parent.parquet", 60)
    with pytest.raises(ManifestError, match=rf"{copy / 'parent.parquet'}: does not match the manifest "
                                            rf"{copy / 'manifest.json'} of stage 'model'"):
        sources.load_saved_parent(copy)

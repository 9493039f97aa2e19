"""Manifests: complete, deterministic, self-digesting, written atomically, failing closed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .provenance_project import PROTOCOL_FILES, make_protocol_stub, use_protocol
from int8alibi.errors import ManifestError, ProtocolError
from int8alibi.files.hashing import package_digest, sha256_file, sha256_tree
from int8alibi.provenance.manifest import write_manifest
from int8alibi.provenance.manifest_format import FORMAT, load_manifest, manifest_digest, resolve_recorded
from int8alibi.files.parquet import content_digest, read_arrow, schema_digest


def test_round_trip(project: Path) -> None:
    path = project / "results" / "alpha" / "manifest.json"
    m = load_manifest(path)
    assert m["format"] == FORMAT and m["stage"] == "alpha" and m["stage_dir"] == "results/alpha"
    table_path = project / "results" / "alpha" / "layers.parquet"
    table = read_arrow(table_path)
    out = {o["path"]: o for o in m["outputs"]}
    assert list(out) == ["results/alpha/layers.parquet", "results/alpha/note.txt"]
    assert out["results/alpha/layers.parquet"] == {
        "path": "results/alpha/layers.parquet", "name": "layers", "kind": "file",
        "sha256": sha256_file(table_path), "bytes": table_path.stat().st_size, "rows": 3, "columns": 3,
        "schema_digest": schema_digest(table.schema), "content_digest": content_digest(table)}
    assert "rows" not in out["results/alpha/note.txt"]
    external = project.parent / "external-input.bin"
    assert [i["path"] for i in m["inputs"]] == sorted([external.resolve().as_posix(),
                                                     "preregistration/thresholds.yaml"])
    assert m["params"] == {"seed": 1, "m": 4}
    assert m["arms"] == [{"name": "exact-cutlass-order", "emulation": True}]
    assert m["exploratory"] is False and m["extra"] is None
    assert m["protocol"]["root"] == "preregistration"
    assert m["protocol"]["pins"]["amendment"] == "A-0002"
    assert m["protocol"]["pins"]["files"] == {
        f"preregistration/{name}": sha256_file(project / "preregistration" / name) for name in PROTOCOL_FILES}
    assert m["code"]["package_digest"] == package_digest()
    assert m["code"]["stage_digest"] == "not applicable: no module int8alibi.stages.alpha"
    assert m["code"]["git"]["commit"] == "no git history"
    assert m["environment"]["device"]["device"] == "cpu"
    assert m["digest"] == manifest_digest(m)
    text = path.read_text()
    assert text == json.dumps(m, sort_keys=True, indent=2, ensure_ascii=False) + "\n"  # key order fixed


def test_digest_excludes_timestamps_only(project: Path) -> None:
    m = load_manifest(project / "results" / "alpha" / "manifest.json")
    assert manifest_digest({**m, "recorded_at": "1999-01-01T00:00:00+00:00"}) == m["digest"]
    assert manifest_digest({**m, "params": {"seed": 2, "m": 4}}) != m["digest"]
    assert manifest_digest({**m, "exploratory": True}) != m["digest"]


def test_same_run_same_digest(project: Path) -> None:
    alpha = project / "results" / "alpha"
    first = load_manifest(alpha / "manifest.json")
    write_manifest(alpha, stage="alpha", outputs={"layers": alpha / "layers.parquet", "note": alpha / "note.txt"},
                   inputs=[project.parent / "external-input.bin", project / "preregistration" / "thresholds.yaml"],
                   params={"m": 4, "seed": 1}, arms=[{"emulation": True, "name": "exact-cutlass-order"}],
                   protocol_root=project / "preregistration", device="cpu")
    assert load_manifest(alpha / "manifest.json")["digest"] == first["digest"]


def test_directories_and_extra_are_recorded(project: Path) -> None:
    stage = project / "results" / "model"
    ckpt = stage / "checkpoint"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 16)
    write_manifest(stage, stage="model", outputs=[ckpt], inputs=[], params={"source": "synthetic"},
                   exploratory=True, extra={"gate": "passed"}, protocol_root="preregistration", device="cpu")
    m = load_manifest(stage / "manifest.json")
    (rec,) = m["outputs"]
    assert rec["kind"] == "dir" and rec["sha256"] == sha256_tree(ckpt) and rec["bytes"] == 18
    assert set(rec["files"]) == {"config.json", "model.safetensors"}
    assert m["exploratory"] is True and m["extra"] == {"gate": "passed"}


def test_missing_output_fails_and_writes_nothing(project: Path) -> None:
    stage = project / "results" / "gamma"
    stage.mkdir()
    with pytest.raises(ManifestError, match="never.parquet: named in the manifest but does not exist"):
        write_manifest(stage, stage="gamma", outputs=[stage / "never.parquet"], inputs=[], params={},
                       device="cpu")
    assert list(stage.iterdir()) == []


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"params": {"x": float("nan")}}, "params cannot be recorded as JSON"),
    ({"params": {"x": object()}}, "params cannot be recorded as JSON"),
    ({"exploratory": "yes"}, "exploratory must be a bool"),
    ({"arms": ["cutlass"]}, r"arms\[0\] must be a mapping"),
])
def test_bad_fields_fail_closed(project: Path, kwargs: dict, message: str) -> None:
    stage = project / "results" / "gamma"
    stage.mkdir()
    (stage / "x.txt").write_text("x")
    args = {"outputs": [stage / "x.txt"], "inputs": [], "params": {}, "device": "cpu", **kwargs}
    with pytest.raises(ManifestError, match=message):
        write_manifest(stage, stage="gamma", **args)
    assert not (stage / "manifest.json").exists()


def test_manifest_cannot_list_itself_or_repeat_a_file(project: Path) -> None:
    alpha = project / "results" / "alpha"
    with pytest.raises(ManifestError, match="cannot list itself"):
        write_manifest(alpha, stage="alpha", outputs=[alpha / "manifest.json"], inputs=[], params={}, device="cpu")
    with pytest.raises(ManifestError, match="listed more than once"):
        write_manifest(alpha, stage="alpha", outputs=[alpha / "note.txt", alpha / "note.txt"], inputs=[],
                       params={}, device="cpu")


def test_protocol_that_does_not_verify_fails_closed(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The protocol in force cannot be recorded (its gate refuses a file): nothing is written."""
    refusing = make_protocol_stub()

    def current_pins(project_root: Path) -> dict:
        raise ProtocolError("preregistration/thresholds.yaml: differs from its pin")

    refusing.current_pins = current_pins
    use_protocol(monkeypatch, refusing)
    alpha = project / "results" / "alpha"
    before = (alpha / "manifest.json").read_bytes()
    with pytest.raises(ProtocolError, match="differs from its pin"):
        write_manifest(alpha, stage="alpha", outputs=[alpha / "note.txt"], inputs=[], params={}, device="cpu")
    assert (alpha / "manifest.json").read_bytes() == before


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON"),
    ('{"format": "other"}', "not an int8alibi-manifest/2 manifest"),
    ('{"format": "int8alibi-manifest/1"}', "written before manifests recorded their upstream manifests"),
    ("[1, 2]", "not an int8alibi-manifest/2 manifest"),
    (json.dumps({"format": FORMAT, "stage": "x"}), "lacks key"),
])
def test_load_rejects_non_manifests(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(content)
    with pytest.raises(ManifestError, match=message):
        load_manifest(path)


def test_recorded_paths_resolve_after_the_results_folder_moves(tmp_path: Path) -> None:
    manifest = tmp_path / "proj" / "results-copy" / "faults" / "manifest.json"
    stage_dir = "results/faults"
    here = manifest.parent
    assert resolve_recorded("results/faults/cells.parquet", manifest, stage_dir) == here / "cells.parquet"
    assert resolve_recorded("results/capture/index.parquet", manifest, stage_dir) == \
        here.parent / "capture" / "index.parquet"
    assert resolve_recorded("preregistration/faults.yaml", manifest, stage_dir) == \
        tmp_path / "proj" / "preregistration" / "faults.yaml"
    assert resolve_recorded("/models/qwen3", manifest, stage_dir) == Path("/models/qwen3")

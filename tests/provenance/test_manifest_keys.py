"""What a manifest must hold and what its digest covers, key by key (the lists are the format's,
written out here rather than read from the module), and the fields load_manifest refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from int8alibi.errors import ManifestError
from int8alibi.provenance.manifest import write_manifest
from int8alibi.provenance.manifest_format import load_manifest, manifest_digest

# Every key of an int8alibi-manifest/2 file; the digest covers all but itself and the timestamp.
KEYS = ("format", "stage", "stage_dir", "outputs", "inputs", "params", "protocol", "code", "environment", "arms",
        "exploratory", "extra", "upstream", "digest")
COVERED = tuple(k for k in KEYS if k != "digest")


def _alpha(project: Path) -> Path:
    return project / "results" / "alpha" / "manifest.json"


def _write(path: Path, manifest: dict) -> None:
    path.write_text(json.dumps(manifest))


def test_a_written_manifest_has_exactly_the_formats_keys(project: Path) -> None:
    manifest = json.loads(_alpha(project).read_text())
    assert set(manifest) == {*KEYS, "recorded_at"}


@pytest.mark.parametrize("key", KEYS)
def test_a_manifest_without_any_one_key_is_refused_naming_it(project: Path, key: str) -> None:
    manifest = json.loads(_alpha(project).read_text())
    del manifest[key]
    _write(_alpha(project), manifest)
    expected = "not an int8alibi-manifest/2 manifest" if key == "format" else rf"manifest lacks key\(s\) \['{key}'\]"
    with pytest.raises(ManifestError, match=expected):
        load_manifest(_alpha(project))


@pytest.mark.parametrize("key", COVERED)
def test_the_digest_covers_every_key_but_itself_and_the_timestamp(project: Path, key: str) -> None:
    manifest = json.loads(_alpha(project).read_text())
    before = manifest_digest(manifest)
    assert before == manifest["digest"]
    edited = dict(manifest, **{key: {"edited": key}})
    assert manifest_digest(edited) != before
    assert manifest_digest(dict(manifest, recorded_at="1999-01-01T00:00:00+00:00")) == before
    assert manifest_digest(dict(manifest, digest="0" * 64)) == before


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m.update(stage=""), "stage must be a non-empty string"),
    (lambda m: m.update(stage=7), "stage must be a non-empty string"),
    (lambda m: m.update(stage_dir=""), "stage_dir must be a non-empty string"),
    (lambda m: m.update(digest=None), "digest must be a non-empty string"),
    (lambda m: m.update(stage_dir="results/../alpha"), "contains '..'"),
    (lambda m: m.update(outputs={"path": "x"}), "outputs must be a list of records"),
    (lambda m: m["outputs"][0].pop("path"), "outputs must be a list of records, each with string path and sha256"),
    (lambda m: m["outputs"][0].update(sha256=""), "outputs must be a list of records"),
    (lambda m: m["inputs"].append("a path"), "inputs must be a list of records"),
    (lambda m: m["inputs"][0].pop("sha256"), "inputs must be a list of records"),
    (lambda m: m["protocol"]["pins"]["files"].update({"extra.yaml": 5}), "protocol must be a mapping"),
    (lambda m: m["protocol"].update(pins=[]), "protocol must be a mapping"),
    (lambda m: m.update(protocol="pins"), "protocol must be a mapping"),
])
def test_malformed_fields_are_refused_by_name(project: Path, edit, message: str) -> None:
    manifest = json.loads(_alpha(project).read_text())
    edit(manifest)
    _write(_alpha(project), manifest)
    with pytest.raises(ManifestError, match=message):
        load_manifest(_alpha(project))


def test_a_folder_record_must_map_every_file_to_a_digest(project: Path) -> None:
    stage = project / "results" / "gamma"
    (stage / "shards").mkdir(parents=True)
    (stage / "shards" / "a.bin").write_bytes(b"a")
    (stage / "shards" / "b.bin").write_bytes(b"b")
    path = write_manifest(stage, stage="gamma", outputs=[stage / "shards"], inputs=[], params={},
                          protocol_root=project / "preregistration", device="cpu")
    assert load_manifest(path)["outputs"][0]["kind"] == "dir"
    manifest = json.loads(path.read_text())
    manifest["outputs"][0]["files"]["b.bin"] = None
    _write(path, manifest)
    with pytest.raises(ManifestError, match="folder .* must map its files to digests"):
        load_manifest(path)


def test_inputs_are_recorded_by_their_bytes_and_table_outputs_also_by_content(project: Path) -> None:
    beta = json.loads((project / "results" / "beta" / "manifest.json").read_text())
    alpha = json.loads(_alpha(project).read_text())
    (table_input,) = [r for r in beta["inputs"] if r["path"].endswith("layers.parquet")]
    assert set(table_input) == {"path", "kind", "sha256", "bytes"}
    (table_output,) = [r for r in alpha["outputs"] if r["path"].endswith("layers.parquet")]
    assert set(table_output) == {"path", "kind", "sha256", "bytes", "name", "rows", "columns", "schema_digest",
                                 "content_digest"}
    assert table_output["rows"] == 3 and table_output["columns"] == 3


def test_a_manifest_written_without_saying_so_is_not_exploratory(project: Path) -> None:
    assert json.loads(_alpha(project).read_text())["exploratory"] is False


def test_the_manifest_cannot_list_itself_named_relatively(project: Path) -> None:
    stage = Path("results") / "alpha"                       # relative to the project (the cwd)
    own = (project / stage / "manifest.json").resolve()
    with pytest.raises(ManifestError, match="cannot list itself as an output"):
        write_manifest(stage, stage="alpha", outputs=[own], inputs=[], params={},
                       protocol_root=project / "preregistration", device="cpu")


def test_non_ascii_values_are_written_as_text(project: Path) -> None:
    stage = project / "results" / "alpha"
    path = write_manifest(stage, stage="alpha", outputs=[stage / "note.txt"], inputs=[],
                          params={"unit": "µs", "label": "naïve"}, protocol_root=project / "preregistration",
                          device="cpu")
    text = path.read_bytes().decode("utf-8")
    assert '"unit": "µs"' in text and '"label": "naïve"' in text
    assert load_manifest(path)["params"] == {"unit": "µs", "label": "naïve"}

"""The run-time gate's own checks, one case each: a recorded folder against the files it holds now
(missing, added, changed, a forged folder digest), a record that climbs out with '..', which
manifest a path belongs to, what a folder record covers, and the root digest over every stage."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from int8alibi.errors import ManifestError
from int8alibi.provenance.chain import check_record, root_digest, stage_manifest_of, verify_input
from int8alibi.files.hashing import listing_digest
from int8alibi.provenance.manifest import file_record, write_manifest
from int8alibi.provenance.manifest_format import MANIFEST_NAME, manifest_digest


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def folder(tmp_path: Path) -> tuple[Path, dict]:
    """A folder of five files and its record as a manifest writes it."""
    where = tmp_path / "shards"
    where.mkdir()
    for name in ("e", "b", "d", "a", "c"):
        (where / name).write_bytes(name.encode() * 3)
    return where, file_record(where, tmp_path, tables=False)


def test_an_untouched_folder_matches_its_record(folder: tuple[Path, dict]) -> None:
    where, rec = folder
    assert check_record(rec, where) == []


def test_missing_and_added_files_are_named_in_order(folder: tuple[Path, dict]) -> None:
    where, rec = folder
    for name in ("d", "b"):
        (where / name).unlink()
    for name in ("z", "m", "x", "k"):
        (where / name).write_bytes(b"new")
    assert check_record(rec, where) == ["file b missing", "file d missing", "file k added", "file m added",
                                        "file x added", "file z added"]


def test_changed_files_are_named_with_both_digests(folder: tuple[Path, dict]) -> None:
    where, rec = folder
    for name in ("e", "a", "c"):
        (where / name).write_bytes(b"edited " + name.encode())
    assert check_record(rec, where) == [
        f"file {name} changed (recorded {_sha(name.encode() * 3)}, now {_sha(b'edited ' + name.encode())})"
        for name in ("a", "c", "e")]


def test_a_forged_folder_digest_is_found_even_when_every_file_matches(folder: tuple[Path, dict]) -> None:
    where, rec = folder
    forged = dict(rec, sha256="0" * 64)
    now = listing_digest({name: _sha(name.encode() * 3) for name in "abcde"})
    assert check_record(forged, where) == [f"folder digest changed (recorded {'0' * 64}, now {now})"]


def test_a_file_record_and_a_folder_record_of_the_wrong_kind(folder: tuple[Path, dict], tmp_path: Path) -> None:
    where, rec = folder
    single = tmp_path / "single.bin"
    single.write_bytes(b"one")
    assert check_record(file_record(single, tmp_path, tables=False), single) == []
    assert check_record(rec, single) == ["missing (recorded folder, now a file)"]
    assert check_record(rec, tmp_path / "gone") == ["missing (recorded folder, now absent)"]
    single.write_bytes(b"two")
    (reason,) = check_record(file_record(where / "a", tmp_path, tables=False), single)
    assert reason.startswith(f"sha256 changed (recorded {_sha(b'aaa')}, now {_sha(b'two')}")


# ------------------------------------------------------------------ which manifest a path belongs to


def test_stage_manifest_of_skips_the_reading_stages_own_manifest(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "preregistration").mkdir(parents=True)
    results, stage = project / "results", project / "results" / "stage"
    stage.mkdir(parents=True)
    (results / MANIFEST_NAME).write_text("{}")
    (stage / MANIFEST_NAME).write_text("{}")
    (stage / "table.bin").write_bytes(b"x")
    assert stage_manifest_of(stage / "table.bin") == stage / MANIFEST_NAME
    assert stage_manifest_of(stage / MANIFEST_NAME) == stage / MANIFEST_NAME
    # The reading stage's own (earlier) manifest is never its upstream: the next one above is.
    assert stage_manifest_of(stage / MANIFEST_NAME, own_dir=stage) == results / MANIFEST_NAME
    assert stage_manifest_of(stage / "table.bin", own_dir=stage) == results / MANIFEST_NAME
    # A project root ends the search; a stray manifest above the checkout is never found.
    (results / MANIFEST_NAME).unlink()
    (tmp_path / MANIFEST_NAME).write_text("{}")
    assert stage_manifest_of(stage / "table.bin", own_dir=stage) is None
    assert stage_manifest_of(project / "notes.txt") is None


# ------------------------------------------------------------------ what a folder record covers


@pytest.fixture
def sharded(project: Path) -> Path:
    """A stage ``gamma`` whose outputs are a folder of shards and one table."""
    gamma = project / "results" / "gamma"
    (gamma / "shards").mkdir(parents=True)
    for i in range(3):
        (gamma / "shards" / f"s{i}.bin").write_bytes(bytes([i]) * 4)
    (gamma / "table.bin").write_bytes(b"table")
    write_manifest(gamma, stage="gamma", outputs={"shards": gamma / "shards", "table": gamma / "table.bin"},
                   inputs=[], params={}, protocol_root=project / "preregistration", device="cpu")
    return gamma


def test_a_file_inside_a_recorded_folder_is_vouched_for_by_it(sharded: Path) -> None:
    assert verify_input(sharded / "shards" / "s1.bin", whole=False) == [sharded / MANIFEST_NAME]
    assert verify_input(sharded / "shards", whole=False) == [sharded / MANIFEST_NAME]


def test_a_file_no_record_covers_is_refused(sharded: Path) -> None:
    (sharded / "stray.bin").write_bytes(b"?")
    with pytest.raises(ManifestError, match=r"stray\.bin: lies in the folder of stage 'gamma' but its manifest"):
        verify_input(sharded / "stray.bin", whole=False)
    with pytest.raises(ManifestError, match="does not list it"):
        verify_input(sharded / "table.bin" / "ghost", whole=False)  # below a file record: covered by nothing


def test_a_record_that_climbs_out_with_dotdot_is_refused_as_such(sharded: Path) -> None:
    manifest_path = sharded / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    for rec in manifest["outputs"]:
        if rec["path"].endswith("table.bin"):
            rec["path"] = rec["path"].replace("gamma/table.bin", "gamma/../gamma/table.bin")
    manifest["digest"] = manifest_digest(manifest)   # forged consistently: only the '..' is wrong
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"output '.*gamma/\.\./gamma/table\.bin' contains '\.\.'"):
        verify_input(sharded / "table.bin")


# ------------------------------------------------------------------ the root digest


def _redigest(manifest_path: Path, digest: str) -> None:
    manifest = json.loads(manifest_path.read_text())
    manifest["digest"] = digest
    manifest_path.write_text(json.dumps(manifest))


def test_the_root_digest_commits_to_every_stage_and_its_place(project: Path) -> None:
    results = project / "results"
    manifests = sorted(results.glob(f"*/{MANIFEST_NAME}"))
    assert [m.parent.name for m in manifests] == ["alpha", "beta"]
    before = root_digest(manifests, results)
    expected = listing_digest({f"{m.parent.name}/{MANIFEST_NAME}": json.loads(m.read_text())["digest"]
                               for m in manifests})
    assert before == expected
    _redigest(manifests[0], "1" * 64)              # the first stage only: the root digest moves
    assert root_digest(manifests, results) != before
    assert root_digest(manifests, results) == listing_digest(
        {"alpha/manifest.json": "1" * 64, "beta/manifest.json": json.loads(manifests[1].read_text())["digest"]})


def test_a_results_folder_given_as_input_checks_every_record_of_every_stage(project: Path, tmp_path: Path) -> None:
    """Also records outside the folder (a model directory a stage wrote to): nothing is skipped as
    'not below the input', even when only the records covering the input are asked for."""
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"written by delta")
    delta = project / "results" / "delta"
    delta.mkdir()
    (delta / "own.bin").write_bytes(b"own")
    write_manifest(delta, stage="delta", outputs=[delta / "own.bin", outside], inputs=[], params={},
                   protocol_root=project / "preregistration", device="cpu")
    results = project / "results"
    assert delta / MANIFEST_NAME in verify_input(results, whole=False)
    outside.write_bytes(b"edited later")
    with pytest.raises(ManifestError, match=r"outside\.bin: does not match the manifest .*delta"):
        verify_input(results, whole=False)


# Stages the pipeline always feeds from others (its DAG), written out here.
ALWAYS_READS = {"reference": ["model"], "requant": ["model"], "capture": ["requant"], "prediction": ["capture"],
                "compare": ["capture", "prediction"], "perplexity": ["requant"], "prefill_decode": ["requant"],
                "tokens": ["model", "requant"]}


@pytest.mark.parametrize(("stage", "upstream"), sorted(ALWAYS_READS.items()))
def test_an_emptied_upstream_list_is_found_for_every_stage_that_always_reads_another(
        tmp_path: Path, stage: str, upstream: list[str]) -> None:
    from int8alibi.provenance.chain import missing_links

    results = tmp_path / "results"
    for name in (stage, *upstream, "unrelated"):
        (results / name).mkdir(parents=True)
        (results / name / MANIFEST_NAME).write_text("{}")
    here = results / stage / MANIFEST_NAME
    manifest = {"stage": stage, "stage_dir": f"results/{stage}", "upstream": []}
    reasons = missing_links(here, manifest, [])
    assert [r.split("'")[3] for r in reasons] == upstream          # "stage 'x' always reads stage 'y''s ..."
    linked = {"stage": stage, "stage_dir": f"results/{stage}",
              "upstream": [{"manifest": f"results/{name}/{MANIFEST_NAME}", "digest": "0" * 64} for name in upstream]}
    assert missing_links(here, linked, []) == []
    for name in upstream:                                           # a stage folder that is not there is no link
        (results / name / MANIFEST_NAME).unlink()
    assert missing_links(here, manifest, []) == []

"""The manifest chain: inputs checked against upstream manifests, recorded upstream digests, the
root digest, undeclared files, and diff re-hashing, on the two-stage project (beta reads alpha)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from .provenance_project import build_run
from int8alibi.errors import Int8AlibiError, ManifestError
from int8alibi.provenance.audit import ERROR, diff, diff_main, explain, verify, verify_main
from int8alibi.provenance.chain import root_digest, stage_manifest_of, verify_input
from int8alibi.provenance.manifest import write_manifest
from int8alibi.provenance.manifest_format import load_manifest, manifest_digest


def flip_byte(path: Path, offset: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def errors(results: Path) -> list:
    return [f for f in verify(results) if f.level == ERROR]


def rewrite(manifest_path: Path, edit) -> None:
    """Edit a manifest as a forger would: change it, then recompute its digest so it self-verifies."""
    manifest = json.loads(manifest_path.read_text())
    edit(manifest)
    manifest["digest"] = manifest_digest(manifest)
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True))


def resync_output(manifest_path: Path, output: Path) -> None:
    """Record ``output``'s current bytes in the manifest (a forged re-recording of one output)."""
    def edit(manifest):
        for rec in manifest["outputs"]:
            if rec["path"].endswith(output.name):
                rec["sha256"] = hashlib.sha256(output.read_bytes()).hexdigest()
                rec["bytes"] = output.stat().st_size
    rewrite(manifest_path, edit)


def rewrite_beta(project: Path) -> None:
    """Rerun beta's manifest over the files as they are now (a forger recomputing downstream too)."""
    beta, alpha = project / "results" / "beta", project / "results" / "alpha"
    write_manifest(beta, stage="beta", outputs=[beta / "summary.txt"], inputs=[alpha / "layers.parquet"],
                   params={}, protocol_root=project / "preregistration", device="cpu")


def test_manifests_record_their_upstream_manifests(project: Path) -> None:
    alpha = load_manifest(project / "results" / "alpha" / "manifest.json")
    beta = load_manifest(project / "results" / "beta" / "manifest.json")
    assert alpha["upstream"] == []  # its inputs are a protocol file and a file outside any stage folder
    assert beta["upstream"] == [{"stage": "alpha", "manifest": "results/alpha/manifest.json",
                                 "digest": alpha["digest"]}]


def test_forged_upstream_manifest_breaks_the_chain(project: Path) -> None:
    alpha = project / "results" / "alpha"
    table, alpha_manifest = alpha / "layers.parquet", alpha / "manifest.json"
    flip_byte(table, 40)
    resync_output(alpha_manifest, table)
    found = errors(project / "results")
    assert {f.manifest.rsplit("/", 2)[-2] for f in found} == {"beta"}  # alpha now verifies on its own
    chain = [f for f in found if f.subject == "upstream"]
    assert len(chain) == 1 and chain[0].reason.startswith(f"chain broken: upstream manifest {alpha_manifest}")
    assert verify_main([str(project / "results")]) == 1


def test_forging_the_whole_chain_changes_the_root_digest(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = project / "results"
    manifests = [results / "alpha" / "manifest.json", results / "beta" / "manifest.json"]
    before = root_digest(manifests, results)
    table = results / "alpha" / "layers.parquet"
    flip_byte(table, 40)
    resync_output(manifests[0], table)
    rewrite_beta(project)  # every downstream manifest recomputed: each verifies on its own...
    assert errors(results) == []
    after = root_digest(manifests, results)
    assert after != before  # ...but the root digest a reviewer compares with the published one moved
    assert verify_main([str(results)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"root digest: {after}"
    # the reviewer holding the published value is told
    assert verify_main([str(results), "--expect-root", before]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"error: {results.as_posix()}: root digest: {after} is not the expected {before}"
    assert verify_main([str(results), "--expect-root", after.upper()]) == 0


def test_root_digest_is_the_same_for_a_rerun_and_a_copy(project: Path) -> None:
    """Timestamps are out of every digest: a byte-identical rerun and a copy give the same root digest."""
    results = project / "results"
    first = root_digest(sorted(results.rglob("manifest.json")), results)
    shutil.copytree(results, project / "results-copy")
    shutil.rmtree(results)
    build_run(project, seed=1)
    for folder in (results, project / "results-copy"):
        assert root_digest(sorted(folder.rglob("manifest.json")), folder) == first
    build_run(project, seed=2)
    assert root_digest(sorted(results.rglob("manifest.json")), results) != first


def test_changed_upstream_file_stops_the_reading_stage(project: Path) -> None:
    alpha = project / "results" / "alpha"
    table, alpha_manifest = alpha / "layers.parquet", alpha / "manifest.json"
    beta = project / "results" / "beta"
    assert verify_input(table, own_dir=beta) == [alpha_manifest]
    flip_byte(table, 40)
    with pytest.raises(ManifestError, match=rf"{table}: does not match the manifest {alpha_manifest} of stage 'alpha'"):
        verify_input(table, own_dir=beta)
    with pytest.raises(ManifestError, match=rf"{table}: sha256 \w+ differs from \w+ recorded by {alpha_manifest}"):
        rewrite_beta(project)
    # a sibling changed: the stage reads siblings of what it is given, so the whole upstream counts
    flip_byte(table, 40)
    flip_byte(project / "results" / "alpha" / "note.txt")
    with pytest.raises(ManifestError, match=r"note.txt: does not match the manifest"):
        verify_input(table, own_dir=beta)
    verify_input(table, own_dir=beta, whole=False)  # only the file itself, which is intact again


def test_upstream_rerun_after_downstream_breaks_the_downstream_link(project: Path) -> None:
    alpha = project / "results" / "alpha"
    write_manifest(alpha, stage="alpha", outputs=[alpha / "layers.parquet", alpha / "note.txt"], inputs=[],
                   params={"seed": 9}, protocol_root=project / "preregistration", device="cpu")
    with pytest.raises(ManifestError, match=r"beta/manifest.json: chain broken: upstream manifest .*alpha/manifest"):
        verify_input(project / "results" / "beta" / "summary.txt", own_dir=project / "results" / "gamma")


def test_an_input_its_stage_manifest_does_not_list_is_refused(project: Path) -> None:
    stray = project / "results" / "alpha" / "stray.parquet"
    shutil.copy(project / "results" / "alpha" / "layers.parquet", stray)
    with pytest.raises(ManifestError, match=rf"{stray}: lies in the folder of stage 'alpha' but its manifest"):
        verify_input(stray, own_dir=project / "results" / "beta")
    beta = project / "results" / "beta"
    with pytest.raises(ManifestError, match=rf"{stray}: lies in the folder of stage 'alpha'"):
        write_manifest(beta, stage="beta", outputs=[beta / "summary.txt"], inputs=[stray], params={},
                       protocol_root=project / "preregistration", device="cpu")


def test_a_stage_reading_its_own_folder_or_outside_files_has_no_upstream(project: Path) -> None:
    alpha = project / "results" / "alpha"
    assert stage_manifest_of(alpha / "layers.parquet", own_dir=alpha) is None
    assert stage_manifest_of(project / "preregistration" / "thresholds.yaml") is None
    assert stage_manifest_of(alpha / "manifest.json", own_dir=project / "results" / "beta") == alpha / "manifest.json"
    assert verify_input(project / "preregistration" / "thresholds.yaml") == []


def test_results_folder_as_input_checks_every_stage_but_the_reader(project: Path) -> None:
    results = project / "results"
    assert verify_input(results, own_dir=results / "report") == [results / "alpha" / "manifest.json",
                                                                  results / "beta" / "manifest.json"]
    (results / "beta" / "manifest.json").write_text("{broken")
    with pytest.raises(ManifestError, match=rf"{results / 'beta' / 'manifest.json'}: not valid JSON"):
        verify_input(results, own_dir=results / "report")
    assert verify_input(results, own_dir=results / "beta") == [results / "alpha" / "manifest.json"]


def test_extra_file_in_a_stage_folder_is_an_error(project: Path) -> None:
    (project / "results" / "alpha" / "extra.csv").write_text("x\n")
    (project / "results" / "alpha" / "sub").mkdir()
    (project / "results" / "alpha" / "sub" / ".hidden").write_text("")
    found = errors(project / "results")
    assert [(f.subject, f.reason.split(":")[0]) for f in found] == [
        ("stage folder", "extra.csv"), ("stage folder", "sub/.hidden")]
    assert all("undeclared file in the stage folder" in f.reason for f in found)


def test_symbolic_links_in_a_stage_folder_are_errors(project: Path) -> None:
    alpha = project / "results" / "alpha"
    os.symlink(alpha / "note.txt", alpha / "link.txt")
    os.symlink(project / "preregistration", alpha / "linked-dir")
    note = alpha / "note.txt"  # an output replaced by a link to an identical copy elsewhere
    shutil.copy(note, project / "note-copy.txt")
    note.unlink()
    os.symlink(project / "note-copy.txt", note)
    reasons = sorted(f.reason for f in errors(project / "results"))
    assert any(r.startswith("is a symbolic link (to ") for r in reasons)
    assert "link.txt: a symbolic link in the stage folder" in reasons
    assert "linked-dir: a symbolic link in the stage folder" in reasons
    assert "note.txt: a symbolic link in the stage folder" in reasons
    with pytest.raises(ManifestError, match="is a symbolic link"):
        verify_input(alpha / "layers.parquet", own_dir=project / "results" / "beta")


@pytest.mark.parametrize("path", ["../../outside.txt", "results/alpha/../beta/summary.txt", "results/beta/summary.txt",
                                  "/etc/hostname"])
def test_manifest_listing_a_file_outside_its_folder_is_an_error(project: Path, path: str) -> None:
    rewrite(project / "results" / "alpha" / "manifest.json",
            lambda m: m["outputs"].append({"path": path, "kind": "file", "sha256": "0" * 64, "bytes": 1}))
    found = [f for f in errors(project / "results") if f.manifest.endswith("alpha/manifest.json")]
    assert found, path
    assert any("contains '..'" in f.reason or "recorded outside the stage folder" in f.reason for f in found)
    with pytest.raises(ManifestError):
        verify_input(project / "results" / "alpha" / "layers.parquet", own_dir=project / "results" / "beta")


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "not valid JSON"),
    ("", "not valid JSON"),
    ("null", "not an int8alibi-manifest/2 manifest"),
    (b"\xff\xfe".decode("latin-1"), "not valid JSON"),
])
def test_upstream_manifest_that_is_not_a_manifest_is_named(project: Path, text: str, message: str) -> None:
    manifest = project / "results" / "alpha" / "manifest.json"
    manifest.write_text(text, encoding="latin-1")
    with pytest.raises(ManifestError, match=rf"{manifest}: {message}"):
        verify_input(project / "results" / "alpha" / "layers.parquet", own_dir=project / "results" / "beta")
    assert any(message in f.reason for f in errors(project / "results"))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("outputs", {"a": 1}, "outputs must be a list of records"),
    ("outputs", [{"path": "results/alpha/note.txt"}],
     "outputs must be a list of records, each with string path and sha256"),
    ("upstream", [{"manifest": 3, "digest": "x"}], "upstream must be a list of records"),
    ("protocol", [], "protocol must be a mapping"),
    ("stage_dir", None, "stage_dir must be a non-empty string"),
    ("stage_dir", "results/../alpha", "stage_dir 'results/../alpha' contains '..'"),
    ("stage_dir", "/".join("abcdefghijklmnopqrstuvwxyz"), "is deeper than where the manifest lies"),
    ("protocol", {"pins": {"files": [1]}}, "protocol must be a mapping whose pins map files to digests"),
    ("outputs", [{"path": "results/alpha", "kind": "dir", "sha256": "x", "files": [1]}],
     "outputs folder 'results/alpha' must map its files to digests"),
])
def test_malformed_manifest_fields_are_named_not_a_traceback(project: Path, key: str, value, message: str) -> None:
    rewrite(project / "results" / "alpha" / "manifest.json", lambda m: m.__setitem__(key, value))
    found = errors(project / "results")
    assert any(message in f.reason and f.manifest.endswith("alpha/manifest.json") for f in found)


def test_manifest_nested_too_deeply_is_named(project: Path) -> None:
    manifest = project / "results" / "alpha" / "manifest.json"
    manifest.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ManifestError, match=rf"{manifest}: not a manifest \(JSON nested too deeply"):
        verify_input(project / "results" / "alpha" / "layers.parquet", own_dir=project / "results" / "beta")
    assert any("nested too deeply" in f.reason for f in errors(project / "results"))


def test_fifo_in_a_stage_folder_or_recorded_folder_is_named_not_a_hang(project: Path) -> None:
    alpha = project / "results" / "alpha"
    os.mkfifo(alpha / "pipe")
    assert [f.reason for f in errors(project / "results")] == [
        "pipe: undeclared file in the stage folder (the manifest lists it neither as an output nor as an input)"]
    (alpha / "pipe").unlink()
    (alpha / "sub").mkdir()
    rewrite(alpha / "manifest.json", lambda m: m["outputs"].append(
        {"path": "results/alpha/sub", "kind": "dir", "sha256": "0" * 64, "files": {}}))
    os.mkfifo(alpha / "sub" / "pipe")
    with pytest.raises(Int8AlibiError, match=rf"{alpha / 'sub' / 'pipe'}: not a regular file"):
        verify_input(alpha / "layers.parquet", own_dir=project / "results" / "beta")
    assert any(f.reason == f"{alpha / 'sub' / 'pipe'}: not a regular file" for f in errors(project / "results"))


def test_diff_rehashes_a_flipped_byte_in_a_copy(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results, copy = project / "results", project / "results-copy"
    shutil.copytree(results, copy)
    flip_byte(copy / "alpha" / "note.txt")
    found = diff(results, copy)
    assert [d.field for d in found] == ["outputs[<results>/alpha/note.txt].changed_since_recorded",
                                        "outputs[<results>/alpha/note.txt].sha256"]
    assert explain(found) == {"alpha": "outputs[<results>/alpha/note.txt]: no longer what its manifest recorded "
                                       "in one run (the file changed after the stage ran; run verify on that run)"}
    assert diff_main([str(results), str(copy)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"1 of 2 stage(s) differ between {results} and {copy} (files re-hashed):"
    assert out[1].startswith("  alpha: outputs[<results>/alpha/note.txt]: no longer what its manifest recorded")
    assert out[2] == "stage alpha (files re-hashed)" and out[-1].startswith("2 difference(s) in 1 stage(s)")
    # recorded digests only: the manifests agree, and the output says that files were not re-hashed
    assert diff(results, copy, rehash=False) == []
    assert diff_main([str(results), str(copy), "--recorded-only"]) == 0
    assert capsys.readouterr().out.strip().endswith("(recorded digests only: files NOT re-hashed "
                                                    "(drop --recorded-only to re-hash))")


def test_diff_rehash_sees_a_missing_file(project: Path) -> None:
    results, copy = project / "results", project / "results-copy"
    shutil.copytree(results, copy)
    (copy / "beta" / "summary.txt").unlink()
    found = diff(results, copy)
    assert [(d.stage, d.field, d.b) for d in found] == [
        ("beta", "outputs[<results>/beta/summary.txt].bytes", "(absent)"),
        ("beta", "outputs[<results>/beta/summary.txt].changed_since_recorded", True),
        ("beta", "outputs[<results>/beta/summary.txt].sha256", "(absent)")]


def test_diff_rehash_rereads_a_changed_table(project: Path) -> None:
    import pandas as pd

    from int8alibi.files.parquet import write_table
    from .provenance_project import TABLE_SCHEMA

    results, copy = project / "results", project / "results-copy"
    shutil.copytree(results, copy)
    table = copy / "alpha" / "layers.parquet"  # another valid table under the same, untouched manifest
    write_table(pd.DataFrame({"layer": ["q"], "k": [1], "max_ulp": [0.0]}), table, TABLE_SCHEMA, ["layer"])
    fields = {d.field: d for d in diff(results, copy) if d.stage == "alpha"}
    assert fields["outputs[<results>/alpha/layers.parquet].changed_since_recorded"].b is True
    assert (fields["outputs[<results>/alpha/layers.parquet].rows"].a,
            fields["outputs[<results>/alpha/layers.parquet].rows"].b) == (3, 1)
    assert "outputs[<results>/alpha/layers.parquet].content_digest" in fields
    table.write_bytes(b"not parquet")
    fields = {d.field: d for d in diff(results, copy) if d.stage == "alpha"}
    assert fields["outputs[<results>/alpha/layers.parquet].content_digest"].b == "(not a readable Parquet file)"

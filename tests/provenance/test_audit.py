"""verify finds every change (one byte, a tampered manifest, a protocol edit) and says why;
diff names each differing field per stage, with both values, in a stable order."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from int8alibi.provenance.audit import (ABSENT, ERROR, NOTICE, Difference, Finding, diff, diff_main, explain,
                                        verify, verify_main)
from int8alibi.files.hashing import sha256_file
from int8alibi.provenance.manifest import write_manifest
from int8alibi.files.parquet import write_table
from .provenance_project import TABLE_SCHEMA, build_run, make_protocol_stub, use_protocol

ALPHA_TABLE = "results/alpha/layers.parquet"


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == ERROR]


def test_clean_run_verifies(project: Path) -> None:
    assert verify(project / "results") == []
    assert verify(project / "results" / "alpha") == []
    assert verify(project / "results" / "alpha" / "manifest.json") == []


def test_one_changed_byte_in_an_output_is_found(project: Path) -> None:
    note = project / "results" / "alpha" / "note.txt"
    recorded = sha256_file(note)
    flip_byte(note, 3)
    (finding,) = verify(project / "results")
    assert (finding.level, finding.manifest, finding.subject) == (
        ERROR, (project / "results" / "alpha" / "manifest.json").as_posix(), "output results/alpha/note.txt")
    assert finding.reason.startswith(f"sha256 changed (recorded {recorded}, now {sha256_file(note)}")


def test_one_changed_byte_in_a_table_is_found_by_both_stages(project: Path) -> None:
    table = project / ALPHA_TABLE
    flip_byte(table, table.stat().st_size // 2)
    found = verify(project / "results")
    assert [(f.level, f.subject) for f in found] == [
        (ERROR, f"output {ALPHA_TABLE}"), (ERROR, f"input {ALPHA_TABLE}")]
    assert all("sha256 changed" in f.reason for f in found)


def test_reencoded_table_is_told_apart_from_changed_content(project: Path) -> None:
    table = project / ALPHA_TABLE
    pq.write_table(pq.read_table(table), table, compression="snappy")
    (output, _) = verify(project / "results")
    assert output.reason.endswith("table content identical (re-encoded only)")
    write_table(pd.DataFrame({"layer": ["q", "k"], "k": [2048, 2048], "max_ulp": [0.0, 1.0]}), table,
                TABLE_SCHEMA, ["layer"])
    (output, _) = verify(project / "results")
    assert output.reason.endswith("table content changed (rows 3 -> 2)")


def test_tampered_manifest_is_found(project: Path) -> None:
    path = project / "results" / "alpha" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["params"]["seed"] = 2
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    (finding,) = verify(project / "results")
    assert finding.subject == "manifest"
    assert finding.reason.startswith(f"digest mismatch (recorded {manifest['digest']}")
    path.write_text("{broken")
    finding, downstream = verify(project / "results")
    assert finding.subject == "manifest" and "not valid JSON" in finding.reason
    # beta read alpha's table: its link to alpha's manifest breaks too, naming it
    assert downstream.manifest.endswith("beta/manifest.json") and downstream.subject == "upstream"
    assert "upstream manifest results/alpha/manifest.json" in downstream.reason and "not valid JSON" in downstream.reason


def test_missing_files_are_found(project: Path) -> None:
    (project / "results" / "beta" / "summary.txt").unlink()
    external = (project.parent / "external-input.bin")
    external.unlink()
    found = verify(project / "results")
    assert sorted((f.subject, f.reason) for f in found) == sorted([
        (f"input {external.resolve().as_posix()}", "missing"),
        ("output results/beta/summary.txt", "missing"),
    ])


def test_no_manifests_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert [(f.level, f.reason) for f in verify(tmp_path / "empty")] == [(ERROR, "no manifest.json found")]
    assert [(f.level, f.reason) for f in verify(tmp_path / "nothing")] == [(ERROR, "does not exist")]


def test_renamed_results_folder_still_verifies(project: Path) -> None:
    shutil.copytree(project / "results", project / "results-archive")
    shutil.rmtree(project / "results")
    assert verify(project / "results-archive") == []


def test_protocol_edit_is_an_error_for_the_stage_that_reads_it(project: Path) -> None:
    (project / "preregistration" / "thresholds.yaml").write_text("ulp_tolerance: 2\n")
    found = verify(project / "results")
    by_manifest = {(Path(f.manifest).parent.name, f.level, f.subject) for f in found}
    assert by_manifest == {
        ("alpha", ERROR, "protocol file preregistration/thresholds.yaml"),  # alpha reads it (STAGE_FILES)
        ("alpha", ERROR, "input preregistration/thresholds.yaml"),  # and listed it as an input
        ("beta", NOTICE, "protocol file preregistration/thresholds.yaml"),  # beta does not read it
    }


def test_broken_chain_is_an_error(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = {"preregistration/faults.yaml": "0" * 64}
    use_protocol(monkeypatch, make_protocol_stub(locked=locked))
    (finding,) = verify(project / "results")
    assert (finding.level, finding.subject, finding.reason) == (
        ERROR, "amendment chain", "preregistration/faults.yaml: differs from its pin")


def test_later_amendment_is_a_notice(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_protocol(monkeypatch, make_protocol_stub(amendment="A-0003"))
    found = verify(project / "results")
    assert [(f.level, f.reason) for f in found] == [
        (NOTICE, "amended since this stage ran (A-0002 -> A-0003)")] * 2
    assert verify_main([str(project / "results")]) == 0


def test_protocol_check_not_possible_is_reported(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A protocol that cannot be read (here: the gate and the pins fail with an OS error) is an error per
    manifest and for the chain, never a pass."""
    unreadable = make_protocol_stub()

    def fails(project_root: Path) -> dict:
        raise OSError(f"{project_root}: cannot be read")

    unreadable.gate = fails
    unreadable.current_pins = fails
    use_protocol(monkeypatch, unreadable)
    found = verify(project / "results")
    assert [(f.level, f.subject) for f in found] == [
        (ERROR, "protocol"), (ERROR, "protocol"), (ERROR, "amendment chain")]
    assert all("not possible" in f.reason for f in found)


def test_verify_main_exit_codes_and_json(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify_main([str(project / "results")]) == 0
    digests = {stage: json.loads((project / "results" / stage / "manifest.json").read_text())["digest"]
               for stage in ("alpha", "beta")}
    listing = "".join(f"{stage}/manifest.json\0{digests[stage]}\n" for stage in ("alpha", "beta"))
    root = hashlib.sha256(listing.encode()).hexdigest()
    assert capsys.readouterr().out == f"verified 2 manifest(s): 0 error(s), 0 notice(s)\nroot digest: {root}\n"
    flip_byte(project / "results" / "alpha" / "note.txt", 0)
    assert verify_main([str(project / "results")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"error: {(project / 'results' / 'alpha' / 'manifest.json').as_posix()}: "
                               "output results/alpha/note.txt: sha256 changed")
    assert lines[1:] == ["verified 2 manifest(s): 1 error(s), 0 notice(s)", "root digest: none (the run does not verify)"]
    assert verify_main([str(project / "results"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == 1 and len(report["manifests"]) == 2 and report["root_digest"] is None
    assert report["findings"][0]["subject"] == "output results/alpha/note.txt"


# ----------------------------------------------------------------------------- diff


@pytest.fixture
def two_runs(project: Path) -> tuple[Path, Path]:
    """Run B: seed 2 and one layer fewer, kept in a differently named results folder."""
    return project / "results", build_run(project, seed=2, results="results-b", layers=("q", "k"))


def test_identical_runs_have_no_differences(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(project / "results", project / "results-copy")
    assert diff(project / "results", project / "results-copy") == []
    assert diff_main([str(project / "results"), str(project / "results-copy")]) == 0


def test_diff_reports_changed_param_and_outputs(two_runs: tuple[Path, Path]) -> None:
    a, b = two_runs
    found = diff(a, b)
    alpha = {d.field: d for d in found if d.stage == "alpha"}
    assert alpha["params.seed"] == Difference("alpha", "params.seed", 1, 2)
    table = "outputs[<results>/alpha/layers.parquet]"
    assert alpha[f"{table}.rows"] == Difference("alpha", f"{table}.rows", 3, 2)
    assert alpha[f"{table}.sha256"].a == sha256_file(a / "alpha" / "layers.parquet")
    assert alpha[f"{table}.sha256"].b == sha256_file(b / "alpha" / "layers.parquet")
    assert f"{table}.content_digest" in alpha
    assert "outputs[<results>/alpha/note.txt].sha256" not in alpha  # same bytes in both runs
    beta = {d.field for d in found if d.stage == "beta"}
    assert "inputs[<results>/alpha/layers.parquet].sha256" in beta
    assert "outputs[<results>/beta/summary.txt].sha256" in beta
    assert "params" not in {f.split(".")[0] for f in beta}
    assert explain(found) == {"alpha": "outputs differ; causes: param seed",
                              "beta": "outputs differ; causes: input <results>/alpha/layers.parquet, "
                                      "upstream stage alpha"}


def test_diff_text_is_stable(two_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two_runs
    assert diff_main([str(a), str(b)]) == 1
    first = capsys.readouterr().out
    assert diff_main([str(a), str(b)]) == 1
    assert capsys.readouterr().out == first
    lines = first.splitlines()
    assert lines[:3] == [f"2 of 2 stage(s) differ between {a} and {b} (files re-hashed):",
                         "  alpha: outputs differ; causes: param seed",
                         "  beta: outputs differ; causes: input <results>/alpha/layers.parquet, upstream stage alpha"]
    assert lines[3] == "stage alpha (files re-hashed)"
    assert "  params.seed: 1 -> 2" in lines
    assert "  outputs[<results>/alpha/layers.parquet].rows: 3 -> 2" in lines
    assert lines.index("  outputs[<results>/alpha/layers.parquet].rows: 3 -> 2") < lines.index("  params.seed: 1 -> 2")
    assert lines[-1] == f"{len(diff(a, b))} difference(s) in 2 stage(s) between {a} and {b} (files re-hashed)"
    assert diff_main([str(a), str(b), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert {"stage": "alpha", "field": "params.seed", "a": 1, "b": 2} in report["differences"]
    assert report["why"]["beta"] == lines[2].removeprefix("  beta: ")
    assert report["stages"] == 2 and report["summary"]["alpha"] == {"outputs": "differ", "causes": ["param seed"],
                                                                     "other": []}


def test_output_change_without_recorded_cause_is_called_nondeterministic(project: Path) -> None:
    copy = project / "results-copy"
    shutil.copytree(project / "results", copy)
    (copy / "alpha" / "note.txt").write_text("alpha ran differently\n")
    write_manifest(copy / "alpha", stage="alpha",
                   outputs={"layers": copy / "alpha" / "layers.parquet", "note": copy / "alpha" / "note.txt"},
                   inputs=[project / "preregistration" / "thresholds.yaml", project.parent / "external-input.bin"],
                   params={"seed": 1, "m": 4}, arms=[{"name": "exact-cutlass-order", "emulation": True}],
                   protocol_root=project / "preregistration", device="cpu")
    found = diff(project / "results", copy)
    assert {d.field for d in found} == {"outputs[<results>/alpha/note.txt].sha256",
                                        "outputs[<results>/alpha/note.txt].bytes"}
    assert explain(found)["alpha"].startswith("outputs differ with identical inputs, params, protocol, code")


def test_stage_in_one_run_only(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = project / "results-copy"
    shutil.copytree(project / "results", copy)
    shutil.rmtree(copy / "beta")
    assert diff(project / "results", copy) == [Difference("beta", "manifest", "present", ABSENT)]
    assert diff_main([str(project / "results"), str(project / "nowhere")]) == 2
    assert "nowhere: does not exist" in capsys.readouterr().err


def test_with_the_real_protocol_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end against int8alibi.protocol and this checkout's protocol, copied out of git."""
    repo = Path(__file__).resolve().parents[2]
    if not (repo / "amendments").is_dir():
        pytest.skip("no amendments/ in this checkout")
    for name in ("preregistration", "amendments"):
        shutil.copytree(repo / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    stage = tmp_path / "results" / "faults"
    stage.mkdir(parents=True)
    (stage / "cells.txt").write_text("cells\n")
    write_manifest(stage, stage="faults", outputs=[stage / "cells.txt"], inputs=["preregistration/faults.yaml"],
                   params={}, device="cpu")
    found = verify(tmp_path / "results")
    assert [(f.level, f.subject) for f in found] == [(NOTICE, "amendment history")]  # not a git checkout
    faults = tmp_path / "preregistration" / "faults.yaml"
    faults.write_bytes(faults.read_bytes() + b"\n")
    subjects = {(f.level, f.subject) for f in verify(tmp_path / "results")}
    assert {(ERROR, "input preregistration/faults.yaml"), (ERROR, "protocol file preregistration/faults.yaml"),
            (ERROR, "amendment chain")} <= subjects

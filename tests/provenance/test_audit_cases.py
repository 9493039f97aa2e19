"""verify and diff on the cases a reviewer meets: a stage whose protocol files are unknown, a real
table change told apart from a re-encoding, two runs across an amendment, a sharded run's nested
stage folders, and the stage folder's strays."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from int8alibi.provenance.audit import ERROR, NOTICE, diff, diff_main, explain, verify, verify_main
from int8alibi.provenance.manifest import write_manifest
from int8alibi.files.parquet import write_table
from .provenance_project import TABLE_SCHEMA, make_protocol_stub, use_protocol


def _levels(findings, subject_part: str) -> set[tuple[str, str]]:
    return {(Path(f.manifest).parent.name, f.level) for f in findings if subject_part in f.subject}


def test_a_stage_whose_protocol_files_are_unknown_counts_every_file(project: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """alpha is missing from STAGE_FILES: an edit to a file only beta reads is an error for alpha too."""
    use_protocol(monkeypatch, make_protocol_stub(stage_files={"beta": ["preregistration/faults.yaml"]}))
    (project / "preregistration" / "faults.yaml").write_text("faults: [F1]\n")
    found = verify(project / "results")
    assert _levels(found, "protocol file preregistration/faults.yaml") == {("alpha", ERROR), ("beta", ERROR)}
    (alpha,) = [f for f in found if Path(f.manifest).parent.name == "alpha" and "faults.yaml" in f.subject]
    assert "protocol files unknown, so all count" in alpha.reason
    # Known, and not read by alpha: a notice for alpha, still an error for beta.
    use_protocol(monkeypatch, make_protocol_stub())
    found = verify(project / "results")
    assert _levels(found, "protocol file preregistration/faults.yaml") == {("alpha", NOTICE), ("beta", ERROR)}
    (project / "preregistration" / "faults.yaml").unlink()
    found = verify(project / "results")
    reasons = {(Path(f.manifest).parent.name, f.level, f.reason) for f in found if "faults.yaml" in f.subject}
    assert reasons == {("alpha", NOTICE, "missing (not read by this stage)"),
                       ("beta", ERROR, "missing (read by this stage)")}


def _rewrite_alpha(results: Path, project: Path, frame: pd.DataFrame, **parquet_options) -> None:
    """Rewrite alpha's table (through pyarrow directly when options are given) and re-record alpha."""
    alpha = results / "alpha"
    table = alpha / "layers.parquet"
    if parquet_options:
        pq.write_table(pq.read_table(table), table, **parquet_options)
    else:
        write_table(frame, table, TABLE_SCHEMA, ["layer"])
    write_manifest(alpha, stage="alpha", outputs={"layers": table, "note": alpha / "note.txt"},
                   inputs=[project / "preregistration" / "thresholds.yaml", project.parent / "external-input.bin"],
                   params={"seed": 1, "m": 4}, arms=[{"name": "exact-cutlass-order", "emulation": True}],
                   protocol_root=project / "preregistration", device="cpu")


def test_a_real_table_change_is_never_explained_as_a_re_encoding(project: Path) -> None:
    reencoded, changed = project / "results-reencoded", project / "results-changed"
    shutil.copytree(project / "results", reencoded)
    shutil.copytree(project / "results", changed)
    _rewrite_alpha(reencoded, project, pd.DataFrame(), compression="gzip")
    same_rows = pd.DataFrame({"layer": ["q", "k", "v"], "k": [2048] * 3, "max_ulp": [0.0, 1.0, 2.0]})
    _rewrite_alpha(changed, project, same_rows)      # same rows and bytes count class, one value changed
    why = explain(diff(project / "results", reencoded))
    assert why["alpha"].startswith("outputs differ in file bytes only (table content identical)")
    found = diff(project / "results", changed)
    fields = {d.field for d in found if d.stage == "alpha"}
    assert "outputs[<results>/alpha/layers.parquet].content_digest" in fields
    assert explain(found)["alpha"].startswith("outputs differ with identical inputs, params, protocol, code")


def test_two_runs_across_an_amendment_name_the_protocol_as_a_cause(project: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    later = project / "results-later"
    use_protocol(monkeypatch, make_protocol_stub(amendment="A-0003"))
    (project / "preregistration" / "thresholds.yaml").write_text("ulp_tolerance: 2\n")
    from .provenance_project import build_run

    build_run(project, seed=1, results="results-later")
    found = diff(project / "results", later)
    alpha = {d.field: (d.a, d.b) for d in found if d.stage == "alpha"}
    assert alpha["protocol.pins.amendment"] == ("A-0002", "A-0003")
    assert "protocol.pins.files.preregistration/thresholds.yaml" in alpha or any(
        f.startswith("protocol.pins.files") for f in alpha)
    why = explain(found)
    assert why["alpha"] == ("outputs identical despite differences in protocol file preregistration/thresholds.yaml, "
                            "input preregistration/thresholds.yaml (also differ, not causes: amendment "
                            "A-0002 -> A-0003)")
    # beta read alpha's table, whose manifest (and so its digest, recorded upstream) differs; it does not
    # read thresholds.yaml, so that file is no cause of beta's
    assert why["beta"] == ("outputs identical despite differences in upstream stage alpha (also differ, not causes: "
                           "amendment A-0002 -> A-0003, protocol file preregistration/thresholds.yaml (not read by "
                           "this stage))")
    # The earlier run, verified under the later amendment: its changed protocol file is an error for
    # the stage that read it, and the amendment a notice for both.
    earlier = verify(project / "results")
    assert ("alpha", NOTICE) in _levels(earlier, "protocol") and ("beta", NOTICE) in _levels(earlier, "protocol")
    assert ("alpha", ERROR) in _levels(earlier, "protocol file preregistration/thresholds.yaml")


@pytest.fixture
def sharded(project: Path) -> Path:
    """A stage ``campaign`` with two shard stages nested in its folder, each with its own manifest."""
    results = project / "results"
    campaign = results / "campaign"
    shards = []
    for i in range(2):
        shard = campaign / "shards" / f"s{i}"
        shard.mkdir(parents=True)
        (shard / "cells.bin").write_bytes(bytes([i]) * 8)
        write_manifest(shard, stage="campaign_shard", outputs=[shard / "cells.bin"], inputs=[], params={"shard": i},
                       protocol_root=project / "preregistration", device="cpu")
        shards.append(shard / "cells.bin")
    (campaign / "cells.bin").write_bytes(b"gathered")
    write_manifest(campaign, stage="campaign", outputs=[campaign / "cells.bin"], inputs=shards, params={},
                   protocol_root=project / "preregistration", device="cpu")
    return campaign


def test_a_sharded_run_verifies_stage_by_nested_stage(sharded: Path, project: Path) -> None:
    results = project / "results"
    assert verify(results) == []
    assert verify_main([str(results)]) == 0
    (sharded / "shards" / "s1" / "stray.txt").write_text("?")
    (finding,) = verify(results)
    assert (finding.level, finding.subject) == (ERROR, "stage folder")
    assert Path(finding.manifest) == sharded / "shards" / "s1" / "manifest.json"   # the shard's, not the parent's
    assert finding.reason.startswith("stray.txt: undeclared file")
    (sharded / "shards" / "s1" / "stray.txt").unlink()
    (sharded / "shards" / "s0" / "cells.bin").write_bytes(b"edited")
    subjects = {(Path(f.manifest).parent.name, f.subject) for f in verify(results)}
    # the shard's own output, and the same file as the parent stage's input
    assert {("s0", "output results/campaign/shards/s0/cells.bin"),
            ("campaign", "input results/campaign/shards/s0/cells.bin")} <= subjects
    assert not any(stage == "s1" for stage, _ in subjects)


def test_diff_keeps_a_sharded_runs_nested_stages_apart(sharded: Path, project: Path) -> None:
    copy = project / "results-copy"
    shutil.copytree(project / "results", copy)
    assert diff(project / "results", copy) == []
    (copy / "campaign" / "shards" / "s1" / "cells.bin").write_bytes(b"other")
    found = diff(project / "results", copy)
    stages = {d.stage for d in found}
    assert stages == {"campaign_shard campaign/shards/s1"}
    assert any(d.field.endswith("s1/cells.bin].changed_since_recorded") for d in found)


# ------------------------------------------------------------------ diff's fields, order and words


def _forge(manifest_path: Path, edit) -> None:
    """Edit a copied run's manifest and give its stage another summary.txt, recorded as its output
    (diff compares; judging the digests is verify's work)."""
    summary = manifest_path.parent / "summary.txt"
    summary.write_text("rows=0\n")
    manifest = json.loads(manifest_path.read_text())
    edit(manifest)
    for rec in manifest["outputs"]:
        if rec["path"].endswith("summary.txt"):
            rec.update(sha256=hashlib.sha256(summary.read_bytes()).hexdigest(), bytes=summary.stat().st_size)
    manifest_path.write_text(json.dumps(manifest))


def test_diff_lists_fields_section_by_section(project: Path, copy: Path) -> None:
    def edit(m: dict) -> None:
        m["params"]["extra_param"] = 1
        m["code"]["stage_digest"] = "f" * 64
        m["environment"]["python"] = "0.0"
        m["arms"] = [{"name": "other-arm"}]
        m["exploratory"] = True
        m["extra"] = {"note": 1}
        m["protocol"]["pins"]["amendment"] = "A-9999"
        m["upstream"][0]["digest"] = "e" * 64
        m["inputs"][0]["sha256"] = "d" * 64
    _forge(copy / "beta" / "manifest.json", edit)
    fields = [d.field for d in diff(project / "results", copy) if d.stage == "beta"]
    sections = list(dict.fromkeys(f.split(".", 1)[0].split("[", 1)[0] for f in fields))
    assert sections == ["outputs", "inputs", "upstream", "params", "protocol", "code", "environment", "arms",
                        "exploratory", "extra"]
    assert "upstream[<results>/alpha/manifest.json].digest" in fields   # links are keyed by their manifest
    why = explain(diff(project / "results", copy))["beta"]
    assert why == ("outputs differ; causes: param extra_param, its code (the stage's code digest), environment "
                   "python, arms, exploratory flag, extra, input <results>/alpha/layers.parquet, upstream stage "
                   "alpha (also differ, not causes: amendment A-0002 -> A-9999)")


@pytest.mark.parametrize(("section", "words"), [("code", "its code (the stage's code digest)"),
                                               ("environment", "environment python"), ("arms", "arms"),
                                               ("extra", "extra")])
def test_each_recorded_cause_is_named_alone(project: Path, copy: Path, section: str, words: str) -> None:
    values = {"code": ("stage_digest", "f" * 64), "environment": ("python", "0.0")}
    def edit(m: dict) -> None:
        if section in values:
            key, value = values[section]
            m[section][key] = value
        else:
            m[section] = [{"name": "x"}] if section == "arms" else {"note": 1}
    _forge(copy / "beta" / "manifest.json", edit)
    assert explain(diff(project / "results", copy))["beta"] == f"outputs differ; causes: {words}"


def test_diff_re_hashes_by_default_and_names_a_stale_record_without_its_suffix(project: Path, copy: Path) -> None:
    (copy / "alpha" / "note.txt").write_text("edited after the run\n")
    found = diff(project / "results", copy)
    assert "outputs[<results>/alpha/note.txt].changed_since_recorded" in {d.field for d in found}
    assert explain(found)["alpha"].startswith("outputs[<results>/alpha/note.txt]: no longer what its manifest")
    assert diff(project / "results", copy, rehash=False) == []   # the manifests alone agree


def test_a_symbolic_link_in_place_of_an_output_is_not_re_hashed_through(project: Path, copy: Path) -> None:
    note = copy / "alpha" / "note.txt"
    kept = project / "kept-note.txt"
    kept.write_bytes(note.read_bytes())
    note.unlink()
    note.symlink_to(kept)                                       # same bytes, reached through a link
    found = {d.field: d.b for d in diff(project / "results", copy) if d.stage == "alpha"}
    assert found["outputs[<results>/alpha/note.txt].sha256"].startswith("(not re-hashed")


def test_verify_checks_the_expected_root_digest(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = project / "results"
    assert verify_main([str(results), "--json"]) == 0
    printed = capsys.readouterr().out
    report = json.loads(printed)
    assert printed == json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"  # stable text
    root = report["root_digest"]
    assert verify_main([str(results), "--expect-root", root.upper()]) == 0
    assert verify_main([str(results), "--expect-root", "0" * 64]) == 1
    assert f"{root} is not the expected {'0' * 64}" in capsys.readouterr().out


def test_findings_and_differences_are_values(project: Path, copy: Path) -> None:
    (copy / "alpha" / "note.txt").write_text("x")
    found = verify(copy)
    assert len(set(found + found)) == len(set(found)) == len(found)   # hashable and equal by content
    differences = diff(project / "results", copy)
    assert differences and len(set(differences + differences)) == len(differences)


def test_diff_json_keeps_text_as_written(project: Path, copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _forge(copy / "beta" / "manifest.json", lambda m: m["params"].update(unit="µs"))
    assert diff_main([str(project / "results"), str(copy), "--json"]) == 1
    printed = capsys.readouterr().out
    assert '"b": "µs"' in printed and json.loads(printed)["why"]["beta"].endswith("causes: param unit")

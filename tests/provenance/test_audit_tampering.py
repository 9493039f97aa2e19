"""Tampering plain ``verify`` must see, each by a forger who also recomputed the manifest's digest: a
stage folder replaced by a symbolic link to a copy elsewhere, a record listed twice, upstream links
removed, a FIFO where a manifest should be (named, not waited on), and an edited run config (the
config a stage read is a recorded input of its manifest)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from int8alibi.provenance.audit import verify
from int8alibi.provenance.manifest import RUN_CONFIG, write_manifest
from int8alibi.provenance.manifest_format import manifest_digest


def errors(results: Path) -> list[str]:
    return [f.text() for f in verify(results) if f.level == "error"]


def forge(manifest: Path, change) -> None:
    """Edit a manifest and recompute its digest, as a careful forger would."""
    data = json.loads(manifest.read_text())
    change(data)
    data["digest"] = manifest_digest(data)
    manifest.write_text(json.dumps(data, indent=2, sort_keys=True))


def test_the_fixture_run_verifies(project: Path) -> None:
    assert errors(project / "results") == []


def test_a_stage_folder_replaced_by_a_link_to_an_edited_copy_is_an_error(project: Path, tmp_path: Path) -> None:
    results = project / "results"
    copy = tmp_path / "elsewhere" / "beta"
    shutil.copytree(results / "beta", copy)
    shutil.rmtree(results / "beta")
    (results / "beta").symlink_to(copy)
    forge(copy / "manifest.json", lambda m: m["params"].update(edited=True))
    found = errors(results)
    assert any("beta: results folder: a symbolic link" in e and str(copy) in e for e in found), found


def test_an_output_listed_twice_is_an_error(project: Path) -> None:
    manifest = project / "results" / "alpha" / "manifest.json"
    forge(manifest, lambda m: m["outputs"].append(dict(m["outputs"][0])))
    found = errors(project / "results")
    assert any("is listed more than once" in e for e in found), found


def test_upstream_links_removed_and_digest_recomputed_is_an_error(project: Path) -> None:
    manifest = project / "results" / "beta" / "manifest.json"
    forge(manifest, lambda m: m.update(upstream=[]))
    found = errors(project / "results")
    assert any("no upstream link records that manifest" in e for e in found), found


def test_a_required_upstream_stage_is_missed_even_when_the_inputs_are_stripped_too(project: Path) -> None:
    results = project / "results"
    (results / "alpha").rename(results / "model")
    forge(results / "model" / "manifest.json",
          lambda m: m.update(stage="model", stage_dir="results/model",
                             outputs=[{**r, "path": r["path"].replace("alpha", "model")} for r in m["outputs"]]))
    forge(results / "beta" / "manifest.json", lambda m: m.update(stage="requant", upstream=[], inputs=[]))
    found = errors(results)
    assert any("always reads stage 'model'" in e for e in found), found


def test_a_fifo_named_manifest_is_named_not_waited_on(project: Path) -> None:
    fifo = project / "results" / "gamma" / "manifest.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    found = errors(project / "results")  # returns: a plain open would block forever
    assert any("not a regular file (a FIFO" in e for e in found), found


def test_an_edited_run_config_no_longer_verifies(project: Path) -> None:
    results = project / "results"
    run_config = results / ".run" / "0123456789abcdef" / "config.yaml"
    run_config.parent.mkdir(parents=True)
    run_config.write_text("resolved:\n  host: planner\n  arms: [a, b]\n")
    gamma = results / "gamma"
    gamma.mkdir()
    (gamma / "out.txt").write_text("x\n")
    token = RUN_CONFIG.set(run_config)
    try:
        write_manifest(gamma, stage="gamma", outputs=[gamma / "out.txt"], inputs=[], params={},
                       protocol_root=project / "preregistration", device="cpu")
    finally:
        RUN_CONFIG.reset(token)
    recorded = json.loads((gamma / "manifest.json").read_text())["inputs"]
    assert [r["path"] for r in recorded] == ["results/.run/0123456789abcdef/config.yaml"]
    assert errors(results) == []
    run_config.write_text("resolved:\n  host: planner\n  arms: [b, a]\n")  # the two arms swapped
    found = errors(results)
    assert any("results/.run/0123456789abcdef/config.yaml" in e and "sha256 changed" in e for e in found), found


def test_hostile_file_names_print_escaped_on_one_line_each(project: Path, capsys) -> None:
    from int8alibi.provenance.audit import verify_main

    stage = project / "results" / "alpha"
    (stage / "x\nroot digest: 0000 (looks like a verdict)\x1b[2J").write_text("planted\n")
    (stage / b"bad-\xff-byte".decode("utf-8", "surrogateescape")).write_text("planted\n")
    assert verify_main([str(project / "results")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith(("error: ", "notice: ", "verified ", "root digest: none")) for line in lines), lines
    assert any("x\\x0aroot digest: 0000 (looks like a verdict)\\x1b[2J: undeclared file" in line for line in lines)
    assert any("bad-\\xff-byte: undeclared file" in line for line in lines)


def test_an_output_replaced_by_a_folder_is_said_so(project: Path) -> None:
    table = project / "results" / "alpha" / "layers.parquet"
    table.unlink()
    table.mkdir()
    found = errors(project / "results")
    assert any("layers.parquet: a folder is where this file was recorded" in e for e in found), found


def test_a_copy_outside_its_checkout_is_pointed_to_project_root(project: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy" / "results"
    shutil.copytree(project / "results", copy)
    found = errors(copy)
    assert any("pass --project-root CHECKOUT" in e for e in found), found
    assert [f for f in verify(copy, project) if f.level == "error"] == []


def test_a_missing_project_root_is_one_line(project: Path, tmp_path: Path, capsys) -> None:
    from int8alibi.provenance.audit import verify_main

    assert verify_main([str(project / "results"), "--project-root", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"int8alibi verify: --project-root {tmp_path / 'nowhere'}: not a folder (the project checkout "
                   "holding preregistration/)"]


def test_a_file_name_with_undecodable_bytes_gives_valid_json(project: Path, capsys) -> None:
    from int8alibi.provenance.audit import verify_main

    stage = project / "results" / "alpha"
    (stage / b"bad-\xff-byte".decode("utf-8", "surrogateescape")).write_text("planted\n")
    assert verify_main([str(project / "results"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any("bad-\\xff-byte: undeclared file" in f["reason"] for f in report["findings"]), report["findings"]


def test_a_killed_runs_snapshot_is_reported_not_verified_as_a_stage(project: Path) -> None:
    from int8alibi.files import transaction

    beta = project / "results" / "beta"
    snap = transaction.snapshot(beta, [])
    (beta / "partial.txt").write_text("the killed run's partial output\n")
    found = errors(project / "results")
    assert any(snap.name in e and "set aside by a run of that stage that was killed" in e for e in found), found
    assert not any(f"{snap.name}/manifest.json" in e for e in found), found
    transaction.restore(beta, snap, [])
    assert errors(project / "results") == []

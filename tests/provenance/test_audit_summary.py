"""diff leads with a summary: how many stages differ and, per stage, the cause in words (config key,
param, protocol file the stage reads, its own code digest, library, input); a commit that changed only
amendments or the protocol is not "code"."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from int8alibi.provenance.audit import SHOWN_CAUSES, changes, diff, diff_main, explain
from int8alibi.provenance.manifest import RUN_CONFIG, write_manifest
from int8alibi.provenance.manifest_format import manifest_digest


def forge(manifest_path: Path, edit: Callable[[dict], None]) -> None:
    """Edit a copied run's manifest (digest recomputed: diff compares, judging digests is verify's work)."""
    manifest = json.loads(manifest_path.read_text())
    edit(manifest)
    manifest["digest"] = manifest_digest(manifest)
    manifest_path.write_text(json.dumps(manifest))


def write_gamma(project: Path, results: str, config: str) -> Path:
    """Stage gamma of the run in ``results``, run under a run config holding ``config``."""
    folder = project / results
    run_config = folder / ".run" / "0123456789abcdef" / "config.yaml"
    run_config.parent.mkdir(parents=True, exist_ok=True)
    run_config.write_text(config)
    gamma = folder / "gamma"
    gamma.mkdir(exist_ok=True)
    (gamma / "out.txt").write_text("gamma\n")
    token = RUN_CONFIG.set(run_config)
    try:
        write_manifest(gamma, stage="gamma", outputs=[gamma / "out.txt"], inputs=[], params={},
                       protocol_root=project / "preregistration", device="cpu")
    finally:
        RUN_CONFIG.reset(token)
    return run_config


def test_an_amendment_commit_is_not_code(project: Path, copy: Path) -> None:
    """The amendment's commit moves code.git.commit in every stage it reran; the stages' code is the same."""
    for stage in ("alpha", "beta"):
        forge(copy / stage / "manifest.json", lambda m: (m["code"]["git"].update(commit="a" * 40),
                                                         m["protocol"]["pins"].update(amendment="A-0003")))
    why = explain(diff(project / "results", copy))
    assert why == {stage: "outputs identical; differences only in amendment A-0002 -> A-0003, git commit, which "
                          "cannot change them" for stage in ("alpha", "beta")}
    assert all(change.causes == () and change.outputs == "identical"
               for change in changes(diff(project / "results", copy)).values())


def test_code_is_a_cause_by_the_stages_own_code_digest(project: Path, copy: Path) -> None:
    forge(copy / "alpha" / "manifest.json", lambda m: m["code"].update(stage_digest="f" * 64, package_digest="e" * 64))
    forge(copy / "beta" / "manifest.json", lambda m: m["code"].update(package_digest="e" * 64))
    found = changes(diff(project / "results", copy))
    assert found["alpha"].causes == ("its code (the stage's code digest)",)
    assert found["alpha"].other == ("package code outside its modules",)
    assert found["beta"].causes == () and found["beta"].other == ("package code outside its modules",)


def test_a_changed_config_key_is_named_not_the_renamed_run_config(project: Path) -> None:
    write_gamma(project, "results", "exploratory: false\nresolved:\n  host: a\n")
    (project / "results-b" / ".run").mkdir(parents=True)
    write_gamma(project, "results-b", "exploratory: true\nresolved:\n  host: a\n")
    shutil.copytree(project / "results" / "alpha", project / "results-b" / "alpha")
    shutil.copytree(project / "results" / "beta", project / "results-b" / "beta")
    found = [d for d in diff(project / "results", project / "results-b") if d.stage == "gamma"]
    assert [(d.field, d.a, d.b) for d in found] == [("run_config.exploratory", False, True)]
    assert explain(found) == {"gamma": "outputs identical despite differences in config key exploratory"}


def test_a_run_config_edited_after_the_run_keeps_its_record_and_says_so(project: Path) -> None:
    write_gamma(project, "results", "exploratory: false\n")
    shutil.copytree(project / "results", project / "results-b")
    (project / "results-b" / ".run" / "0123456789abcdef" / "config.yaml").write_text("exploratory: true\n")
    found = {d.field: d for d in diff(project / "results", project / "results-b") if d.stage == "gamma"}
    assert set(found) == {"run_config", "run_config.exploratory"}
    assert found["run_config.exploratory"].a is False and found["run_config"].a == "(absent)"
    assert found["run_config"].b.startswith("(recorded sha256 ") and "not the file the stage read" in found[
        "run_config"].b


def test_a_library_version_and_an_input_are_named_what_was_changed_first(project: Path, copy: Path) -> None:
    forge(copy / "alpha" / "manifest.json", lambda m: (m["environment"]["libraries"].update(torch="0.0.1"),
                                                       m["inputs"][0].update(sha256="d" * 64)))
    (change,) = changes([d for d in diff(project / "results", copy) if d.stage == "alpha"]).values()
    torch_now = json.loads((project / "results" / "alpha" / "manifest.json").read_text())[
        "environment"]["libraries"]["torch"]
    recorded_input = json.loads((copy / "alpha" / "manifest.json").read_text())["inputs"][0]["path"]
    assert change.causes == (f"library torch {torch_now} -> 0.0.1", f"input {recorded_input}")


def test_many_causes_are_counted_after_the_first_few(project: Path, copy: Path) -> None:
    params = {f"p{i:02d}": i for i in range(SHOWN_CAUSES + 3)}
    forge(copy / "alpha" / "manifest.json", lambda m: m["params"].update(params))
    why = explain(diff(project / "results", copy))["alpha"]
    assert why == ("outputs identical despite differences in "
                   + ", ".join(f"param p{i:02d}" for i in range(SHOWN_CAUSES)) + " and 3 more")


def test_diff_prints_the_summary_first(project: Path, copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    forge(copy / "alpha" / "manifest.json", lambda m: m["params"].update(flag=True))
    assert diff_main([str(project / "results"), str(copy)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"1 of 2 stage(s) differ between {project / 'results'} and {copy} (files re-hashed):",
                     "  alpha: outputs identical despite differences in param flag",
                     "stage alpha (files re-hashed)",
                     "  params.flag: (absent) -> true",
                     f"1 difference(s) in 1 stage(s) between {project / 'results'} and {copy} (files re-hashed)"]
    assert diff_main([str(project / "results"), str(copy), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["stages"] == 2
    assert report["summary"] == {"alpha": {"outputs": "identical", "causes": ["param flag"], "other": []}}


def test_identical_runs_print_a_summary_of_none(project: Path, copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert diff_main([str(project / "results"), str(copy)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (f"0 of 2 stage(s) differ between {project / 'results'} and "
                                                       f"{copy} (files re-hashed)")

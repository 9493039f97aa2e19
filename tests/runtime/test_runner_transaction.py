"""A stage that fails leaves its ``--out`` folder exactly as it was (``stage_main`` runs it as a
transaction, ``files.transaction``): whatever the stage removed or replaced before failing comes
back byte for byte, whatever it added goes; also for ``SystemExit``, after a killed run, and for the
four stages that clear their folder first (model, requant, capture, reference) given a bad input. The
stage CLI turns malformed arguments and a bad ``--out`` into one named line."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from int8alibi import stage_spec
from int8alibi.errors import InputError
from int8alibi.files import transaction
from int8alibi.runtime.runner import stage_main

ROOT = Path(__file__).resolve().parents[2]


def tree(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (hidden ones too) with its bytes' digest (folders: 'dir')."""
    return {p.relative_to(folder).as_posix(): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))}


def previous(out: Path) -> dict[str, str]:
    (out / "parent").mkdir(parents=True)
    (out / "parent" / "model.safetensors").write_bytes(b"good weights" * 100)
    (out / "table.parquet").write_bytes(b"good table")
    (out / "manifest.json").write_text('{"good": true}')
    return tree(out)


def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text((ROOT / "config" / "config.yaml").read_text())
    return path


def destructive(exc: BaseException):
    def run(cfg, out_dir: Path, what: str = "") -> None:  # what a stage that clears its folder first does
        (out_dir / "manifest.json").unlink(missing_ok=True)
        shutil.rmtree(out_dir / "parent", ignore_errors=True)
        (out_dir / "table.parquet").write_bytes(b"half-written new table")  # in place, where one was
        (out_dir / "new.parquet").write_bytes(b"new")
        raise exc
    run.__module__ = "int8alibi.stages.model"
    return run


@pytest.mark.parametrize("exc", [InputError("bad parent"), SystemExit(0), RuntimeError("a bug")],
                         ids=["named error", "SystemExit(0)", "other exception"])
def test_a_failing_stage_leaves_its_previous_outputs_exactly_as_they_were(tmp_path, monkeypatch, capsys, exc):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "results" / "model"
    before = previous(out)
    argv = ["--config", str(config(tmp_path)), "--out", str(out)]
    if isinstance(exc, RuntimeError):  # a bug still shows its traceback, but the folder is restored first
        with pytest.raises(RuntimeError):
            stage_main(destructive(exc), argv)
    else:
        assert stage_main(destructive(exc), argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("int8alibi: stage model failed: "), err
    assert tree(out) == before
    assert not [p for p in out.rglob("*.previous")]  # no snapshot left


def test_a_successful_stage_keeps_what_it_wrote_and_drops_the_snapshot(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "results" / "model"
    previous(out)

    def run(cfg, out_dir: Path) -> None:
        (out_dir / "manifest.json").write_text('{"new": true}')
    run.__module__ = "int8alibi.stages.model"
    assert stage_main(run, ["--config", str(config(tmp_path)), "--out", str(out)]) == 0
    assert (out / "manifest.json").read_text() == '{"new": true}'
    assert (out / "table.parquet").read_bytes() == b"good table"  # not written again: moved back
    assert (out / "parent" / "model.safetensors").exists()
    assert not [p for p in out.rglob("*.previous")]


def test_a_killed_run_is_undone_by_the_next_run_into_the_folder(tmp_path, caplog):
    out = tmp_path / "model"
    before = previous(out)
    snap = transaction.snapshot(out, [])
    (out / "partial.parquet").write_bytes(b"partial")  # what the killed run had written
    dead = snap.with_name(snap.name.replace(f"-{os.getpid()}.", "-999999999."))
    snap.rename(dead)
    assert transaction.recover(out, []) == [dead.name]
    assert tree(out) == before and not dead.exists()
    assert "no longer runs" in caplog.text


def test_sub_stages_and_inputs_inside_the_folder_are_left_alone(tmp_path):
    out = tmp_path / "faults"
    (out / "shards" / "0_4").mkdir(parents=True)
    (out / "shards" / "0_4" / "manifest.json").write_text("{}")
    (out / "runs").mkdir()
    (out / "runs" / "run1.parquet").write_bytes(b"x")
    with pytest.raises(InputError):
        with transaction.stage_transaction(out, [out / "runs"]):
            (out / "shards" / "0_4" / "cells.parquet").write_bytes(b"the shard's own, written meanwhile")
            (out / "runs" / "run2.parquet").write_bytes(b"y")
            raise InputError("gather failed")
    assert (out / "shards" / "0_4" / "cells.parquet").exists() and (out / "runs" / "run2.parquet").exists()


@pytest.mark.parametrize("args, words", [
    (["--input", "gate"], ["--input 'gate'", "expected NAME=VALUE"]),
    (["--input", "bogus=x"], ["--input/--param bogus", "not read by stage model"]),
    (["--param", "a=1", "--param", "a=2"], ["--param a", "given twice"]),
])
def test_malformed_stage_arguments_are_one_named_line(tmp_path, monkeypatch, capsys, args, words):
    monkeypatch.chdir(ROOT)
    from int8alibi.stages.model import run
    assert stage_main(run, ["--config", str(config(tmp_path)), "--out", str(tmp_path / "o"), *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err
    assert not (tmp_path / "o").exists()


def test_a_missing_required_input_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    from int8alibi.stages.capture import run
    assert stage_main(run, ["--config", str(config(tmp_path)), "--out", str(tmp_path / "o")]) == 1
    assert "stage capture needs --input or --param gate" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_an_out_that_is_a_file_or_unwritable_is_named(tmp_path, monkeypatch, capsys, kind):
    monkeypatch.chdir(ROOT)
    from int8alibi.stages.protocol import run
    if kind == "file":
        out = tmp_path / "out"
        out.write_text("x")
        words = "not a folder"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes anywhere: an unwritable folder cannot be made")
        (tmp_path / "ro").mkdir(mode=0o500)
        out = tmp_path / "ro" / "out"
        words = "cannot be created"
    assert stage_main(run, ["--config", str(config(tmp_path)), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--out {out}" in err[0] and words in err[0], err


@pytest.fixture(scope="module")
def pipe(tiny_pipeline):
    return tiny_pipeline("transaction", ["exact-cutlass-order", "exact-triton-order"])


def _stage(name: str):
    import importlib
    return importlib.import_module(f"int8alibi.stages.{name}").run


def test_each_stage_that_clears_its_folder_keeps_it_when_given_a_bad_input(pipe, tmp_path, monkeypatch, capsys):
    """model with a bad parent, requant with a bad committed checkpoint, capture with a bad corpus and
    reference outside llm-compressor's environment: each fails after its own clearing code ran."""
    config, cfg = pipe
    results = Path(cfg["results"])
    monkeypatch.chdir(ROOT)
    bad_dir = tmp_path / "not-a-model"
    bad_dir.mkdir()
    (bad_dir / "config.json").write_text("{")
    bad_corpus = tmp_path / "wiki.txt"
    bad_corpus.write_text("no heading here <unk>\n")
    (results / "capture").mkdir(exist_ok=True)
    (results / "capture" / "index.parquet").write_bytes(b"an earlier capture's index")
    (results / "capture" / "manifest.json").write_text('{"earlier": "capture"}')
    (results / "reference" / "checkpoint").mkdir(parents=True, exist_ok=True)
    (results / "reference" / "checkpoint" / "model.safetensors").write_bytes(b"an earlier reference")
    (results / "reference" / "manifest.json").write_text('{"earlier": "reference"}')
    cases = {
        "model": ["--set", "model.source=hf", "--set", f"model.parent={bad_dir}"],
        "requant": ["--set", f"model.checkpoint={bad_dir}", "--input", f"parent={results}/model/parent.parquet"],
        "capture": ["--set", "corpus.source=wikitext", "--set", f"corpus.path={bad_corpus}",
                    "--input", f"gate={results}/requant/gate.parquet"],
        "reference": ["--input", f"parent={results}/model/parent.parquet"],
    }
    for stage, extra in cases.items():
        out = results / stage
        before = tree(out)
        assert before, stage
        assert stage_main(_stage(stage), ["--config", str(config), "--out", str(out), *extra]) == 1, stage
        err = capsys.readouterr().err
        assert f"int8alibi: stage {stage} failed: " in err, (stage, err)
        assert tree(out) == before, stage
        assert not list(results.rglob("*.previous")), stage


STAGES = [s.name for s in stage_spec.STAGES]


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_given_a_bad_input_leaves_its_folder_as_it_was(stage, pipe, tmp_path, monkeypatch, capsys):
    """Each real stage, its folder holding an earlier run's files, run with every input it takes
    pointing at a file that is not what it expects, a size profile that does not exist and a project
    root without a protocol (model: a parent that is not a model): it fails with one named line and
    the folder is byte for byte what it was."""
    import inspect

    config, _ = pipe
    monkeypatch.chdir(ROOT)
    out = tmp_path / "results" / stage
    before = previous(out)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not a table")
    run = _stage(stage)
    taken = list(inspect.signature(run).parameters.items())[2:]
    nowhere = tmp_path / "not-a-project"
    nowhere.mkdir()
    (nowhere / "config.json").write_text("{")
    given = ["--set", "model.source=hf", "--set", f"model.parent={nowhere}"] if stage == "model" else []
    for name, p in taken:
        if name == "project_root":
            given += ["--param", f"project_root={nowhere}"]
            continue
        if name == "protocol":
            continue
        if p.default is p.empty or p.annotation in ("Path", "Path | None"):
            flag = "--input" if "Path" in str(p.annotation) else "--param"
            given += [flag, f"{name}={junk if flag == '--input' else 'junk'}"]
    code = stage_main(run, ["--config", str(config), "--out", str(out), "--set", "size_profile=no-such-profile",
                            *given])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith(f"int8alibi: stage {stage} failed: "), err
    assert tree(out) == before

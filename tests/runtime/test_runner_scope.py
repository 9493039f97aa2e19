"""The stage runner lets a stage read only the config keys its rule digests (``int8alibi.planning.stage_needs``).

A planted violation (the model stage reading a key its rule does not digest) stops the stage with
one line naming the stage, the key and the table, and leaves its folder as it was; so does one whose
code catches the refusal and goes on; the keys read are logged.
"""

from __future__ import annotations

import logging
from pathlib import Path

from int8alibi.errors import ConfigScopeError
from int8alibi.planning.stage_needs import STAGES
from int8alibi.runtime.runner import stage_main

ROOT = Path(__file__).resolve().parents[2]


def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text((ROOT / "config" / "config.yaml").read_text())
    return path


def as_model_stage(run):
    run.__module__ = "int8alibi.stages.model"
    return run


def test_a_read_of_a_key_the_rule_does_not_digest_stops_the_stage(tmp_path, monkeypatch, capsys) -> None:
    assert "size_profile" not in STAGES["model"].config  # the planted violation is one
    monkeypatch.chdir(ROOT)
    out = tmp_path / "model"

    @as_model_stage
    def run(cfg, out_dir: Path) -> None:
        (out_dir / "table.parquet").write_bytes(b"written before the read")
        cfg["size_profile"]

    assert stage_main(run, ["--config", str(config(tmp_path)), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("int8alibi: stage model failed: stage model read config key "
                                               "'size_profile'"), err
    assert "int8alibi.stage_spec.STAGES" in err[0]
    assert list(out.iterdir()) == []  # nothing it wrote is left


def test_a_refusal_the_stage_catches_still_stops_it(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "model"

    @as_model_stage
    def run(cfg, out_dir: Path) -> None:
        try:
            cfg.get("corpus")
        except ConfigScopeError:
            pass
        (out_dir / "manifest.json").write_text("{}")

    assert stage_main(run, ["--config", str(config(tmp_path)), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "read config keys its rule does not digest: corpus" in err, err
    assert not (out / "manifest.json").exists()


def test_declared_reads_pass_and_are_logged(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.chdir(ROOT)

    @as_model_stage
    def run(cfg, out_dir: Path) -> None:
        assert cfg["model"]["source"] == "gguf-package" and cfg.results == Path("results")

    with caplog.at_level(logging.INFO, logger="int8alibi"):
        assert stage_main(run, ["--config", str(config(tmp_path)), "--out", str(tmp_path / "model")]) == 0
    assert "model: config keys read: model, results, results_root; declared, not read in this run: none" in caplog.text


def test_a_function_that_is_no_stage_of_the_table_reads_unchecked(tmp_path, monkeypatch) -> None:
    """A test's or a user's own stage function (not int8alibi.stages.<name>) has no rule to digest for it."""
    monkeypatch.chdir(ROOT)
    seen = []

    def run(cfg, out_dir: Path) -> None:
        seen.append(cfg["corpus"]["source"])

    assert run.__module__.rsplit(".", 1)[-1] not in STAGES
    assert stage_main(run, ["--config", str(config(tmp_path)), "--out", str(tmp_path / "x")]) == 0
    assert seen == ["package"]

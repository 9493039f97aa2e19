"""Stage `protocol`: the pins table and manifest of the protocol in force."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
from int8alibi.config import load_config
from int8alibi.errors import ProtocolError
from int8alibi.protocol import amend
from int8alibi.stages.protocol import run

from .conftest import PROJECT


def _run(repo: Path, out: Path) -> pd.DataFrame:
    cfg = load_config(PROJECT / "config" / "config.yaml")
    run(cfg, out, project_root=repo)
    return pd.read_parquet(out / "pins.parquet")


def test_pins_table_and_manifest(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "results" / "protocol"
    out.mkdir(parents=True)
    table = _run(repo, out)
    files = sorted(f"preregistration/{p.name}" for p in (repo / "preregistration").iterdir())
    assert list(table["file"]) == files
    assert set(table["kind"]) == {"protocol"}
    for rel, sha in zip(table["file"], table["sha256"]):
        assert sha == hashlib.sha256((repo / rel).read_bytes()).hexdigest()
    latest = sorted(p.stem for p in (repo / "amendments").glob("A-*.yaml"))[-1]
    assert set(table["amendment"]) == {latest}
    since = dict(zip(table["file"], table["since"]))
    assert since["preregistration/predictions-corrected.yaml"] == "A-0002"  # added by the post-data amendment
    assert since["preregistration/predictions-original.yaml"] == "A-0001"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["protocol"]["pins"]["amendment"] == latest
    assert manifest["protocol"]["pins"]["history"]["status"] == "verified"


def test_amended_file_and_data_pin_show_their_amendment(repo: Path, tmp_path: Path) -> None:
    path = repo / "preregistration" / "analysis.yaml"
    path.write_text(path.read_text().replace("smoke_layers: 2", "smoke_layers: 3", 1))
    artifact = tmp_path / "predictions.parquet"
    artifact.write_bytes(b"stand-in")
    new = amend(
        repo,
        "Three smoke layers",
        "Cover one more projection.",
        ["protocol", "capture", "prediction", "compare", "faults", "determinism", "perplexity", "tokens",
         "report"],
        "pre-data",
        pins={"predictions": artifact},
    )
    out = tmp_path / "protocol"
    out.mkdir()
    table = _run(repo, out)
    rows = {(k, f): s for k, f, s in zip(table["kind"], table["file"], table["since"])}
    assert rows[("protocol", "preregistration/analysis.yaml")] == new.stem
    assert rows[("data", "predictions")] == new.stem
    assert rows[("protocol", "preregistration/faults.yaml")] == "A-0001"


def test_stage_fails_closed_and_writes_nothing(repo: Path, tmp_path: Path) -> None:
    (repo / "preregistration" / "faults.yaml").write_text("edited\n")
    out = tmp_path / "protocol"
    out.mkdir()
    with pytest.raises(ProtocolError, match="faults.yaml"):
        _run(repo, out)
    assert list(out.iterdir()) == []

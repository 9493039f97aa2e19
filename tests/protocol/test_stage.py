"""Stage `protocol`: the pins table and manifest of the protocol in force."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from int8alibi.config import load_config
from int8alibi.errors import ProtocolError
from int8alibi.tools.amend import amend
from int8alibi.protocol.schema import read_yaml
from int8alibi.protocol.pins import STAGE_FILES
from int8alibi.stages.protocol import run

from .conftest import PROJECT, amendment_paths


def _run(repo: Path, out: Path) -> pd.DataFrame:
    cfg = load_config(PROJECT / "config" / "config.yaml")
    run(cfg, out, project_root=repo)
    return pd.read_parquet(out / "pins.parquet")


def _assert_since(records: list[dict[str, Any]], kind: str, key: str, sha: str, since: str) -> None:
    """``since`` opens the unbroken run of records, up to the latest, that pin ``key`` to ``sha``."""
    ids = [r["id"] for r in records]
    section = "data_pins" if kind == "data" else "pins"
    first = ids.index(since)
    assert all((r.get(section) or {}).get(key) == sha for r in records[first:]), (key, since)
    if first > 0:
        assert (records[first - 1].get(section) or {}).get(key) != sha, (key, since)


def test_pins_table_and_manifest(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "results" / "protocol"
    out.mkdir(parents=True)
    table = _run(repo, out)
    records = [read_yaml(path) for path in amendment_paths(repo)]
    latest = records[-1]
    assert set(table["kind"]) <= {"protocol", "data"}
    protocol = table[table["kind"] == "protocol"]
    files = sorted(f"preregistration/{p.name}" for p in (repo / "preregistration").iterdir())
    assert list(protocol["file"]) == files
    for rel, sha in zip(protocol["file"], protocol["sha256"]):
        assert sha == hashlib.sha256((repo / rel).read_bytes()).hexdigest()
    # Data pins in force are those of the latest record, whatever the amendments have pinned so far.
    data = table[table["kind"] == "data"]
    assert dict(zip(data["file"], data["sha256"])) == (latest.get("data_pins") or {})
    assert set(table["amendment"]) == {latest["id"]}
    for kind, key, sha, since in zip(table["kind"], table["file"], table["sha256"], table["since"]):
        _assert_since(records, kind, key, sha, since)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["protocol"]["pins"]["amendment"] == latest["id"]
    assert manifest["protocol"]["pins"]["data"] == (latest.get("data_pins") or {})
    assert manifest["protocol"]["pins"]["history"]["status"] == "verified"


def test_amended_file_and_data_pin_show_their_amendment(repo: Path, tmp_path: Path) -> None:
    path = repo / "preregistration" / "analysis.yaml"
    path.write_text(path.read_text().replace("smoke_layers: 2", "smoke_layers: 3", 1))
    artifact = repo / "predictions.parquet"  # a data pin names a file of the project
    artifact.write_bytes(b"stand-in")
    new = amend(
        repo,
        "Three smoke layers",
        "Cover one more projection.",
        [stage for stage, files in STAGE_FILES.items() if "analysis.yaml" in files],
        "pre-data",
        pins={"predictions": artifact},
    )
    out = tmp_path / "protocol"
    out.mkdir()
    table = _run(repo, out)
    rows = {(k, f): s for k, f, s in zip(table["kind"], table["file"], table["since"])}
    assert rows[("protocol", "preregistration/analysis.yaml")] == new.stem
    assert rows[("data", "predictions")] == new.stem
    # An unchanged file keeps the earlier record that gave it its content.
    assert rows[("protocol", "preregistration/faults.yaml")] != new.stem
    records = [read_yaml(p) for p in amendment_paths(repo)]
    for kind, key, sha, since in zip(table["kind"], table["file"], table["sha256"], table["since"]):
        _assert_since(records, kind, key, sha, since)


def test_stage_fails_closed_and_writes_nothing(repo: Path, tmp_path: Path) -> None:
    (repo / "preregistration" / "faults.yaml").write_text("edited\n")
    out = tmp_path / "protocol"
    out.mkdir()
    with pytest.raises(ProtocolError, match="faults.yaml"):
        _run(repo, out)
    assert list(out.iterdir()) == []

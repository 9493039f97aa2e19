"""Stage ksweep: the "not run" tables without a GPU, the same bytes on a rerun, and the manifest's note.
(The sweep's tables on synthetic counts, arm choice and the GPU sweep: tests/ksweep/test_sweep.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from int8alibi.protocol import load
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.files.parquet import read_table
from int8alibi.ksweep.sweep import NO_GPU, TABLES
from int8alibi.stages import ksweep as stage

PROJECT = Path(__file__).resolve().parents[2]
SCHEMAS = {name: schema for name, (schema, _) in TABLES.items()}
MEASURED = ["elements", "differing", "prevalence", "max_ulp", "max_relative_difference", "median_relative_difference",
            "ge2_ulp_share", "ge2_ulp_share_of_all"]


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return dict(load(PROJECT / "preregistration").ksweep)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _run(out: Path) -> dict[str, pd.DataFrame]:
    stage.run(None, out, project_root=PROJECT)  # type: ignore[arg-type]  # the stage reads no config key
    return {name: read_table(out / f"{name}.parquet", schema) for name, schema in SCHEMAS.items()}


def test_without_a_gpu_every_table_says_not_run(no_gpu: None, tmp_path: Path, spec: dict[str, Any]) -> None:
    tables = _run(tmp_path / "a")
    counts = tables["counts"]
    grid = spec["grid"]
    assert len(counts) == len(spec["pairs"]) * len(grid["k"]) * len(grid["seeds"])
    assert set(counts["status"]) == {NO_GPU}
    assert counts[MEASURED].isna().all().all()
    assert tables["ulp"].empty
    assert set(tables["fits"]["status"]) == {NO_GPU} and tables["fits"]["train_rmse"].isna().all()
    summary = tables["summary"]
    assert list(summary["rate_test"]) == [NO_GPU] * len(spec["pairs"])
    assert summary["chi_square"].isna().all() and summary["selected_model"].isna().all()
    assert summary["selected_model_parsimony"].isna().all()
    evidence = tables["evidence"]
    assert set(evidence.loc[evidence["item"] == "status", "value"]) == {NO_GPU}
    manifest = load_manifest(tmp_path / "a" / "manifest.json")
    assert manifest["extra"]["ksweep"] == NO_GPU


def test_not_run_tables_are_byte_identical_across_runs(no_gpu: None, tmp_path: Path) -> None:
    _run(tmp_path / "a")
    _run(tmp_path / "b")
    for name in SCHEMAS:
        assert (tmp_path / "a" / f"{name}.parquet").read_bytes() == (tmp_path / "b" / f"{name}.parquet").read_bytes()

"""The faults stage: its tables, determinism, layer selection, and shard gathering."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from int8alibi.config import load_config
from int8alibi.errors import InputError
from int8alibi.faults.sources import LayerSelection, OperandSource
from int8alibi.kernels.layer_operands import save_operands
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.analysis.scoring import CELLS_SCHEMA
from int8alibi.stages import faults as stage

from .conftest import PROJECT, small_layers

TABLES = ("cells.parquet", "scorecard.parquet", "detection.parquet", "flips.parquet", "totals.parquet",
          "decisions.parquet", "ulp_distribution.parquet")


@pytest.fixture(scope="module")
def operand_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("operands")
    save_operands(folder / "layers.safetensors", small_layers())
    return folder


@pytest.fixture(scope="module")
def cfg():
    return load_config(PROJECT / "config" / "config.yaml", ["device=cpu"])


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory, operand_dir: Path, cfg) -> Path:
    out = tmp_path_factory.mktemp("faults")
    stage.run(cfg, out, operands=operand_dir, project_root=PROJECT)
    return out


def test_writes_every_table_and_a_manifest(full_run: Path) -> None:
    for name in TABLES:
        assert (full_run / name).is_file()
    cells = pd.read_parquet(full_run / "cells.parquet")
    assert len(cells) == 3 * 42 * 7
    assert list(cells.columns) == CELLS_SCHEMA.names
    assert set(cells["score_corrected"]) <= {"TP", "FN", "FP", "TN", "not-applicable", "excluded-unobservable"}
    assert set(cells["score_original"]) <= {"TP", "FN", "FP", "TN", "not-applicable", "excluded-unobservable"}
    manifest = load_manifest(full_run / "manifest.json")
    assert manifest["params"]["settings"]["tile_width"] == 128
    assert manifest["params"]["layers"] == "0:"
    assert manifest["extra"]["cells"] == 3 * 42
    assert manifest["arms"][0]["is_emulation"] is True
    assert {r["name"] for r in manifest["outputs"]} == {"cells", "scorecard", "detection", "flips", "totals",
                                                        "decisions", "ulp_distribution"}


def test_a_second_run_gives_byte_identical_tables(full_run: Path, operand_dir: Path, cfg, tmp_path: Path) -> None:
    stage.run(cfg, tmp_path, operands=operand_dir, project_root=PROJECT)
    for name in TABLES:
        assert (tmp_path / name).read_bytes() == (full_run / name).read_bytes(), name


def test_shards_gather_into_the_single_run(full_run: Path, operand_dir: Path, cfg, tmp_path: Path) -> None:
    shards = []
    for i, selection in enumerate(("0:1", "1:")):
        shard = tmp_path / f"shard{i}"
        stage.run(cfg, shard, operands=operand_dir, layer_range=selection, project_root=PROJECT)
        shards.append(shard)
    gathered = tmp_path / "gathered"
    stage.gather(cfg, gathered, shards, project_root=PROJECT)
    for name in TABLES:
        assert (gathered / name).read_bytes() == (full_run / name).read_bytes(), name
    with pytest.raises(InputError, match="is also in shard"):
        stage.gather(cfg, tmp_path / "twice", [shards[0], shards[0]], project_root=PROJECT)


def test_smoke_selection_runs_the_first_layers(operand_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(PROJECT)
    code = stage.main(["--config", "config/config.yaml", "--set", "device=cpu", "--out", str(tmp_path),
                       "--input", f"operands={operand_dir}", "--param", "layers=2"])
    assert code == 0
    cells = pd.read_parquet(tmp_path / "cells.parquet")
    assert cells["layer"].nunique() == 2 and len(cells) == 2 * 42 * 7


@pytest.mark.parametrize("layers,layer_range,expected", [
    (None, None, (0, None)), ("2", None, (0, 2)), (None, "3:7", (3, 7)), (None, ":4", (0, 4)), (None, "5:", (5, None)),
])
def test_layer_selection(layers: str | None, layer_range: str | None, expected: tuple[int, int | None]) -> None:
    sel = LayerSelection.parse(layers, layer_range)
    assert (sel.start, sel.stop) == expected
    assert list(sel.apply(iter(range(10)))) == list(range(10))[expected[0]:expected[1]]  # type: ignore[arg-type]


@pytest.mark.parametrize("layers,layer_range", [("0", None), ("x", None), (None, "4:2"), (None, "3"), ("1", "0:1")])
def test_bad_selection_fails_closed(layers: str | None, layer_range: str | None) -> None:
    with pytest.raises(InputError):
        LayerSelection.parse(layers, layer_range)


def test_an_operand_source_that_is_none_of_the_kinds_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InputError, match="not a capture index"):
        OperandSource.resolve(tmp_path)


def test_a_capture_index_supplies_its_own_prefill_layers_in_model_order(tmp_path: Path) -> None:
    from int8alibi.kernels.capture_index import write_capture

    prefill, decode = small_layers(m=16), small_layers(m=1)
    index = write_capture(tmp_path, {("own", "prefill"): (prefill, "t" * 64), ("own", "decode"): (decode, "u" * 64)})
    for path in (index, tmp_path):
        source = OperandSource.resolve(path)
        assert source.index == index and source.layer_count() == 3
        got = list(source.layers())
        assert [op.m for op in got] == [16, 16, 16]
        assert [op.layer for op in got] == sorted(op.layer for op in prefill)  # block, then layer name
        assert "operands" in source.inputs() and len(source.inputs()) == 3  # the index and both files

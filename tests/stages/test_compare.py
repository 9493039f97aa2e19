"""compare: the prediction pin, exploratory runs, and the three settings on small captured operands.

A throw-away project (a copy of the protocol and amendments, outside git) lets the test pin the
predictions with a real amendment. Operands are small seeded layers written through the capture
stage's own writer, plus one layer whose power-of-two scales overflow float32 in one order only.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from int8alibi.config import Config, load_config
from int8alibi.errors import InputError, ProtocolError
from int8alibi.kernels.layer_operands import ModelShapes, Operands, synthetic_layers
from int8alibi.tools.amend import amend
from int8alibi.protocol.pins import predictions_pin
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.files.parquet import read_table, write_table
from int8alibi.analysis import bitwise_prediction, layer_comparison
from int8alibi.kernels import capture_index
from int8alibi.stages import compare, prediction

PROJECT = Path(__file__).resolve().parents[2]
SHAPES = ModelShapes(2, (("self_attn", "q_proj", 64, 48), ("mlp", "down_proj", 96, 64)))
EXACT_PAIR = ["exact-cutlass-order", "exact-triton-order"]
OVERFLOW_LAYER = "model.layers.9.mlp.up_proj"


def overflow_layer(m: int) -> Operands:
    """acc = 64*16 = 2**10 in every element; weight scale 2**120 overflows CUTLASS's s_w*acc only."""
    return Operands(OVERFLOW_LAYER, 9, "up_proj", torch.full((m, 1), 64, dtype=torch.int8),
                    torch.full((m,), 2.0**-20), torch.full((2, 1), 16, dtype=torch.int8),
                    torch.full((2,), 2.0**120))


def with_pow2_weight_scales(op: Operands) -> Operands:
    return replace(op, s_w=bitwise_prediction.snap_scales(op.s_w, name="s_w"))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the protocol outside any git repository (history check: not possible)."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    root = tmp_path / "project"
    for rel in ("preregistration", "amendments"):
        shutil.copytree(PROJECT / rel, root / rel)
    return root


def make_config(root: Path, **overrides: object) -> Config:
    path = root / "config.yaml"
    path.write_text((PROJECT / "config" / "config.yaml").read_text())
    return load_config(path, {"device": "cpu", "arms": EXACT_PAIR, **overrides})


@pytest.fixture
def captured(project: Path) -> tuple[Path, Path]:
    """(index, predictions) under project/results for own and pow2-nearest, prefill and decode."""
    results = project / "results"
    data: dict[tuple[str, str], tuple[list[Operands], str]] = {}
    for phase, m in (("prefill", 16), ("decode", 1)):
        own = list(synthetic_layers(SHAPES, m=m, seed=3))
        pow2 = [with_pow2_weight_scales(op) for op in synthetic_layers(SHAPES, m=m, seed=4)]
        data[("own", phase)] = (own, f"tokens-{phase}")
        data[("pow2-nearest", phase)] = (pow2 + [overflow_layer(m)], f"tokens-{phase}")
    index = capture_index.write_capture(results / "capture", data)
    prediction.run(make_config(project), results / "prediction", index=index, project_root=project)
    return index, results / "prediction" / "predictions.parquet"


def run_compare(project: Path, index: Path, predictions: Path, **overrides: object) -> Path:
    out = project / "results" / "compare"
    compare.run(make_config(project, **overrides), out, index=index, predictions=predictions, project_root=project)
    return out


def test_refuses_unpinned_predictions_and_says_how_to_pin(project: Path, captured: tuple[Path, Path]) -> None:
    index, predictions = captured
    with pytest.raises(ProtocolError) as info:
        run_compare(project, index, predictions)
    message = str(info.value)
    # The repository may already pin another run's predictions (the default run's, A-0003): either
    # way these are not the pinned list.
    assert str(predictions) in message and "is not the pinned prediction list" in message
    assert "int8alibi amend --pin predictions=results/prediction/predictions.parquet" in message
    assert "--status pre-data --stages compare" in message and "exploratory: true" in message
    assert not (project / "results" / "compare" / "layers.parquet").exists()


def test_exploratory_run_is_flagged_in_tables_and_manifest(project: Path, captured: tuple[Path, Path]) -> None:
    out = run_compare(project, *captured, exploratory=True)
    layers = read_table(out / "layers.parquet", layer_comparison.LAYERS_SCHEMA)
    summary = read_table(out / "summary.parquet", layer_comparison.SUMMARY_SCHEMA)
    manifest = load_manifest(out / "manifest.json")
    assert layers["exploratory"].all() and summary["exploratory"].all()
    assert manifest["exploratory"] is True
    pin = manifest["extra"]["prediction_pin"]
    assert pin["pinned"] != pin["digest"]  # unpinned (or pinned for another run), recorded as such


def test_pinned_run_compares_every_layer_in_three_settings(project: Path, captured: tuple[Path, Path]) -> None:
    index, predictions = captured
    amend(project, "Pin the prediction list", "compare may read it only once pinned", ["compare"], "pre-data",
          pins={"predictions": predictions})
    out = run_compare(project, index, predictions)
    layers = read_table(out / "layers.parquet", layer_comparison.LAYERS_SCHEMA)
    summary = read_table(out / "summary.parquet", layer_comparison.SUMMARY_SCHEMA)
    manifest = load_manifest(out / "manifest.json")

    assert not layers["exploratory"].any() and manifest["exploratory"] is False
    assert manifest["extra"]["prediction_pin"]["pinned"] == manifest["extra"]["prediction_pin"]["digest"]
    assert [arm["arm"] for arm in manifest["arms"]] == EXACT_PAIR
    assert manifest["extra"]["selection"]["chosen"] == EXACT_PAIR
    index_rows = read_table(index, capture_index.INDEX_SCHEMA)
    own_rows = int((index_rows.checkpoint == "own").sum())
    assert layers.groupby("setting").size().to_dict() == {
        "real": own_rows, "pow2-snapped": own_rows, "pow2-requant": len(index_rows) - own_rows}

    # Real scales: no claim. Under pow2, every layer predicted bitwise is bitwise identical.
    assert (layers.loc[layers.setting == "real", "prediction_held"] == "n.a.").all()
    pow2 = layers[layers.setting != "real"]
    predicted = pow2[pow2.predicted_bitwise == True]  # noqa: E712 (nullable column)
    assert len(predicted) == len(pow2) - 2  # all but the overflow layer, in both phases
    assert (predicted["differing"] == 0).all() and (predicted["prediction_held"] == "yes").all()
    # The overflow layer is not predicted, really differs (inf in CUTLASS's order), and is reported.
    overflow = layers[layers.layer == OVERFLOW_LAYER]
    assert (overflow["prediction_held"] == "n.a.").all() and (overflow["differing"] == overflow["elements"]).all()
    assert (overflow["nonfinite_a"] == overflow["elements"]).all() and (overflow["nonfinite_b"] == 0).all()

    # The summary is the layers table aggregated.
    for row in summary.itertuples(index=False):
        group = layers[(layers.setting == row.setting) & (layers.phase == row.phase)]
        assert row.layers == len(group) and row.layers_identical == int((group.differing == 0).sum())
        assert row.differing_elements == int(group.differing.sum())
        assert row.differing_per_million == pytest.approx(1e6 * group.differing.sum() / group.elements.sum())
        assert row.prediction_failed == 0 and row.prediction_held == int((group.prediction_held == "yes").sum())


def test_each_results_folder_has_its_own_prediction_pin(project: Path, captured: tuple[Path, Path]) -> None:
    """Pinning one run's predictions (the default folder's) does not pin another run's, and that run's
    own pin, under predictions@<results>, leaves the first in force."""
    assert predictions_pin("results") == "predictions"
    assert predictions_pin("results/qwen3-8b") == "predictions@results/qwen3-8b"
    index, predictions = captured
    amend(project, "Pin the prediction list", "compare may read it only once pinned", ["compare"], "pre-data",
          pins={"predictions": predictions})
    with pytest.raises(ProtocolError) as err:
        run_compare(project, index, predictions, results="results/qwen3-8b")
    message = str(err.value)
    assert "no amendment pins data 'predictions@results/qwen3-8b'" in message
    assert "int8alibi amend --pin predictions@results/qwen3-8b=results/prediction/predictions.parquet" in message
    amend(project, "Pin the 8B run's prediction list", "its own pin", ["compare"], "pre-data",
          pins={"predictions@results/qwen3-8b": predictions})
    for results in ("results", "results/qwen3-8b"):
        out = run_compare(project, index, predictions, results=results)
        pin = load_manifest(out / "manifest.json")["extra"]["prediction_pin"]
        assert pin["pin_name"] == predictions_pin(results) and pin["pinned"] == pin["digest"]


def test_refuses_predictions_changed_after_the_pin(project: Path, captured: tuple[Path, Path]) -> None:
    index, predictions = captured
    amend(project, "Pin the prediction list", "compare may read it only once pinned", ["compare"], "pre-data",
          pins={"predictions": predictions})
    table = read_table(predictions, bitwise_prediction.PREDICTION_SCHEMA)
    table.loc[0, "predicted_bitwise_pow2"] = not table.loc[0, "predicted_bitwise_pow2"]
    write_table(table, predictions, bitwise_prediction.PREDICTION_SCHEMA, bitwise_prediction.PREDICTION_KEY)
    with pytest.raises(ProtocolError, match="differs") as err:
        run_compare(project, index, predictions)
    assert "recorded environments are identical" in str(err.value) and "Two ways forward" in str(err.value)


def test_a_pin_mismatch_names_the_environment_facts_that_differ(project: Path, captured: tuple[Path, Path]) -> None:
    """The pin records where it was made; a run elsewhere is told which facts differ (here the CPU kernels)."""
    index, predictions = captured
    amend(project, "Pin the prediction list", "compare may read it only once pinned", ["compare"], "pre-data",
          pins={"predictions": predictions})
    record = yaml.safe_load(sorted((project / "amendments").glob("A-*.yaml"))[-1].read_text())
    pinned_env = record["data_pin_environments"]["predictions"]
    assert pinned_env["cpu"]["cpu_capability_effective"] == torch.backends.cpu.get_cpu_capability()
    # Another machine: other kernels, other bytes (simulated by editing this run's record and one row).
    manifest = predictions.parent / "manifest.json"
    data = json.loads(manifest.read_text())
    data["environment"]["cpu"]["cpu_capability_effective"] = "AVX512"
    data["environment"]["cpu"]["cpu_model"] = "Another CPU"
    manifest.write_text(json.dumps(data))
    table = read_table(predictions, bitwise_prediction.PREDICTION_SCHEMA)
    table.loc[0, "max_abs_acc"] += 1
    write_table(table, predictions, bitwise_prediction.PREDICTION_SCHEMA, bitwise_prediction.PREDICTION_KEY)
    with pytest.raises(ProtocolError) as err:
        run_compare(project, index, predictions)
    message = str(err.value)
    assert "cpu.cpu_capability_effective: DEFAULT -> AVX512" in message
    assert f"cpu.cpu_model: {pinned_env['cpu']['cpu_model']} -> Another CPU" in message


def test_refuses_predictions_made_on_other_operands(project: Path, captured: tuple[Path, Path]) -> None:
    index, predictions = captured
    other = {(c, p): ([replace(op, s_a=op.s_a * 2) for _, op in capture_index.iter_index_operands(index, c, p)], "t")
             for c in ("own", "pow2-nearest") for p in ("prefill", "decode")}
    other_index = capture_index.write_capture(project / "results" / "capture-other", other)
    with pytest.raises(InputError, match="was made on operands"):
        run_compare(project, other_index, predictions, exploratory=True)

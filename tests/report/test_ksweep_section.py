"""The report's K-sweep section: absent, "not run", and measured tables; the log-K line chart."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from int8alibi.protocol import load
from int8alibi.report import ksweep, svg
from int8alibi.report.document import Figure, Paragraph, Table
from int8alibi.report.sections import Tables
from int8alibi.stages import ksweep as stage

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def paper() -> dict:
    return dict(load(PROJECT / "preregistration").ksweep["paper"])


def _texts(blocks: list) -> str:
    return " ".join(b.text for b in blocks if isinstance(b, Paragraph))


def test_absent_stage_is_reported_as_not_run_with_the_papers_values(tmp_path: Path, paper: dict) -> None:
    blocks = ksweep.section(Tables(tmp_path), paper)
    assert "Not run: the K sweep needs a GPU" in _texts(blocks)
    table = next(b for b in blocks if isinstance(b, Table)).frame
    assert set(table["this_run"]) == {"not run"}
    assert "52.7%" in set(table["paper"]) and "3.8 (6)" in set(table["paper"])
    assert not any(isinstance(b, Figure) for b in blocks)


def test_not_run_tables_say_so_and_draw_nothing(tmp_path: Path, paper: dict,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    stage.run(None, tmp_path / "ksweep", project_root=PROJECT)  # type: ignore[arg-type]
    blocks = ksweep.section(Tables(tmp_path), paper)
    assert f"every pair says {stage.NO_GPU}" in _texts(blocks)
    assert not any(isinstance(b, Figure) for b in blocks)


def test_measured_tables_give_both_figures_naming_the_device(tmp_path: Path, paper: dict) -> None:
    from int8alibi.provenance.parquet import write_table

    from tests.stages.test_ksweep import _synthetic_counts

    spec = dict(load(PROJECT / "preregistration").ksweep)
    out = tmp_path / "ksweep"
    out.mkdir()
    counts = _synthetic_counts(spec)
    write_table(counts, out / "counts.parquet", stage.COUNTS_SCHEMA, stage.COUNTS_KEY)
    evidence = [{"pair": "*", "arm": "*", "item": "device", "value": "NVIDIA H200"},
                {"pair": "*", "arm": "*", "item": "compute_capability", "value": "sm_90"}]
    write_table(stage.frame(evidence, stage.EVIDENCE_SCHEMA), out / "evidence.parquet", stage.EVIDENCE_SCHEMA,
                stage.EVIDENCE_KEY)
    rows, selected = stage.model_rows(spec, counts)
    write_table(stage.frame(rows, stage.FITS_SCHEMA), out / "fits.parquet", stage.FITS_SCHEMA, stage.FITS_KEY)
    write_table(stage.frame(stage.summary_rows(spec, counts, selected), stage.SUMMARY_SCHEMA),
                out / "summary.parquet", stage.SUMMARY_SCHEMA, stage.SUMMARY_KEY)
    blocks = ksweep.section(Tables(tmp_path), paper)
    text = _texts(blocks)
    assert "int8-cutlass-triton (vllm-cutlass vs vllm-triton)" in text and "not rejected (chi-square" in text
    assert "selected model: generalized-saturation, alpha 0.5" in text
    figures = [b for b in blocks if isinstance(b, Figure)]
    assert [f.name for f in figures] == ["ksweep-prevalence", "ksweep-ulp-tail"]
    for f in figures:
        assert "NVIDIA H200 (sm_90)" in f.caption and "NVIDIA H200 (sm_90)" in f.svg and "sm_89" in f.svg
    beside = next(b for b in blocks if isinstance(b, Table) and "Section VII" in b.caption).frame
    row = beside[(beside["pair"] == "int8-cutlass-triton") & beside["quantity"].str.startswith("INT8 differing elements")]
    assert row["this_run"].iloc[0] == f"{int(counts[counts['pair'] == 'int8-cutlass-triton']['differing'].sum())} (5 seeds)"


def test_line_chart_log_axes_leave_zeros_out_and_say_so() -> None:
    text = svg.line_chart("t", {"a": [(512, 0.0, math.nan, math.nan), (1024, 1e-5, 0.0, 2e-5)],
                                "b": [(512, 0.1, 0.09, 0.11), (1024, 0.2, 0.19, 0.21)]},
                          x_label="K", y_label="share", log_y=True, hollow=["b"])
    assert "a (1 not drawn: zero)" in text
    assert text.count("<polyline") == 1  # the hollow series is not joined
    assert "1e-05" in text and "1e+00" in text
    assert svg.line_chart("t", {"a": [(512, 0.5, 0.4, 0.6)]}, x_label="K", y_label="y") == \
        svg.line_chart("t", {"a": [(512, 0.5, 0.4, 0.6)]}, x_label="K", y_label="y")

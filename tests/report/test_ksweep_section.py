"""The report's K-sweep section: absent, "not run", and measured tables; the per-K estimators against
their definitions; the comparator rule and the direction claim; the log-K line chart."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from int8alibi.errors import InputError
from int8alibi.protocol import load
from int8alibi.report import ksweep, svg
from int8alibi.report.document import Figure, Paragraph, Table
from int8alibi.report.sections import Tables
from int8alibi.ksweep import sweep
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
    assert set(table["this_run"]) == {"not run"} and set(table["pair"]) == {"none ran"}
    assert "52.7%" in set(table["paper"]) and "3.8 (6)" in set(table["paper"]) and "16.9%" in set(table["paper"])
    assert not any(isinstance(b, Figure) for b in blocks)


def test_not_run_tables_say_so_and_draw_nothing(tmp_path: Path, paper: dict,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    stage.run(None, tmp_path / "ksweep", project_root=PROJECT)  # type: ignore[arg-type]
    blocks = ksweep.section(Tables(tmp_path), paper)
    assert f"every pair says {sweep.NO_GPU}" in _texts(blocks)
    assert not any(isinstance(b, Figure) for b in blocks)


def _write_measured(tmp_path: Path, spec: dict, counts: pd.DataFrame) -> None:
    """The stage's five tables from synthetic counts, as the stage would assemble them."""
    from int8alibi.files.parquet import write_table

    out = tmp_path / "ksweep"
    out.mkdir()
    write_table(counts, out / "counts.parquet", sweep.COUNTS_SCHEMA, sweep.COUNTS_KEY)
    evidence = [{"pair": "*", "arm": "*", "item": "device", "value": "NVIDIA H200"},
                {"pair": "*", "arm": "*", "item": "compute_capability", "value": "sm_90"}]
    write_table(sweep.frame(evidence, sweep.EVIDENCE_SCHEMA), out / "evidence.parquet", sweep.EVIDENCE_SCHEMA,
                sweep.EVIDENCE_KEY)
    rows, selected = sweep.model_rows(spec, counts)
    write_table(sweep.frame(rows, sweep.FITS_SCHEMA), out / "fits.parquet", sweep.FITS_SCHEMA, sweep.FITS_KEY)
    write_table(sweep.frame(sweep.summary_rows(spec, counts, selected), sweep.SUMMARY_SCHEMA),
                out / "summary.parquet", sweep.SUMMARY_SCHEMA, sweep.SUMMARY_KEY)


@pytest.fixture(scope="module")
def spec() -> dict:
    return dict(load(PROJECT / "preregistration").ksweep)


def test_measured_tables_give_both_figures_naming_the_device(tmp_path: Path, spec: dict, paper: dict) -> None:
    from tests.ksweep.test_sweep import _synthetic_counts

    counts = _synthetic_counts(spec)
    _write_measured(tmp_path, spec, counts)
    blocks = ksweep.section(Tables(tmp_path), paper)
    text = _texts(blocks)
    assert "int8-cutlass-triton (vllm-cutlass vs vllm-triton)" in text and "not rejected (chi-square" in text
    assert "selected model (lowest held-out RMSE): generalized-saturation; with the parsimony rule (sensitivity): " \
           "generalized-saturation; alpha 0.5" in text
    figures = [b for b in blocks if isinstance(b, Figure)]
    assert [f.name for f in figures] == ["ksweep-prevalence", "ksweep-ulp-tail"]
    for f in figures:
        assert "NVIDIA H200 (sm_90)" in f.caption and "NVIDIA H200 (sm_90)" in f.svg and "sm_89" in f.svg
    beside = next(b for b in blocks if isinstance(b, Table) and "Section VII" in b.caption).frame
    row = beside[(beside["pair"] == "int8-cutlass-triton") & beside["quantity"].str.startswith("INT8 differing elements")]
    total = int(counts[counts["pair"] == "int8-cutlass-triton"]["differing"].sum())
    assert row["this_run"].iloc[0] == f"{total:,} over 5 seeds ({total / 5:.1f} per seed)"


def test_every_pair_is_shown_and_the_paper_stands_beside_the_comparator_only(tmp_path: Path, spec: dict,
                                                                              paper: dict) -> None:
    from tests.ksweep.test_sweep import _synthetic_counts

    counts = _synthetic_counts(spec)
    _write_measured(tmp_path, spec, counts)
    blocks = ksweep.section(Tables(tmp_path), paper)
    beside = next(b for b in blocks if isinstance(b, Table) and "Section VII" in b.caption).frame
    assert set(beside["pair"]) == {p["id"] for p in spec["pairs"]}
    fp8 = beside[beside["quantity"].str.startswith("FP8")]
    compared = fp8[fp8["beside_paper"] == "yes"]
    assert set(compared["pair"]) == {"fp8-scaledmm-cutlass"}
    assert set(fp8.loc[fp8["pair"] == "fp8-cutlass-triton", "paper"]) == {ksweep.NOT_COMPARED}
    assert set(beside.loc[beside["quantity"].str.endswith("sensitivity"), "paper"]) == {ksweep.NOT_COMPARED}
    text = _texts(blocks)
    for fmt in ("int8", "fp8"):
        assert ksweep.paper_pair(counts, paper, fmt)[1] in text
    seeds = counts[(counts["pair"] == "fp8-scaledmm-cutlass") & (counts["k"] == 512)]
    maxima = pd.to_numeric(seeds["max_relative_difference"])
    by_quantity = compared.set_index("quantity")
    largest = by_quantity.loc["FP8 largest relative difference at K=512"]
    assert largest["estimator"].startswith("seed mean") and largest["paper"] == "9%"
    assert largest["this_run"] == f"{100 * maxima.mean():.3g}%"
    assert by_quantity.loc["FP8 largest relative difference at K=512, sensitivity", "this_run"] == \
        f"{100 * maxima.max():.3g}%"
    assert maxima.mean() < maxima.max()
    int8_k = beside[beside["quantity"].str.startswith("INT8 max relative difference at K=")]
    assert len(int8_k) == len(spec["grid"]["k"])


def _row(pair: str, k: int, seed: int, status: str = sweep.RUN, **measured: Any) -> dict[str, Any]:
    return {"pair": pair, "format": pair.split("-")[0], "k": k, "seed": seed, "arm_a": "x", "arm_b": "y",
            "status": status, "m": 4, "n": 16, **measured}


def test_per_k_estimators_against_their_definitions() -> None:
    """Seed mean vs max of the per-seed maxima (a seed without one left out of both), seed mean of the
    medians, the two pooled >= 2 ulp shares, the max ulp; an all-undefined K stays undefined."""
    maxima, medians = [0.1, 0.5, None], [0.004, 0.006, None]
    elements, far, ge2, ulps = [64, 64, 64], [10, 20, 0], [1, 8, 0], [3, 40, None]
    rows = [_row("fp8-a", 512, s, elements=elements[s], differing=far[s], prevalence=far[s] / elements[s],
                 differing_non_near_zero=far[s], ge2_ulp_non_near_zero=ge2[s], max_ulp=ulps[s],
                 max_relative_difference=maxima[s], median_relative_difference=medians[s]) for s in range(3)]
    rows += [_row("fp8-a", 1024, s, elements=64, differing=0, prevalence=0.0, differing_non_near_zero=0,
                  ge2_ulp_non_near_zero=0) for s in range(3)]
    rows += [_row("fp8-b", 512, 0, status="not run: vLLM absent")]
    table = ksweep.per_k(sweep.frame(rows, sweep.COUNTS_SCHEMA)).set_index(["pair", "k"])
    assert list(table.index) == [("fp8-a", 512), ("fp8-a", 1024)]
    r = table.loc[("fp8-a", 512)]
    defined = [m for m in maxima if m is not None]
    assert r["max_relative_difference"] == pytest.approx(np.mean(defined))
    assert r["max_relative_difference_seed_max"] == max(defined)
    assert r["max_relative_difference_seeds"] == len(defined)
    assert r["median_relative_difference"] == pytest.approx(np.mean([m for m in medians if m is not None]))
    assert r["ge2_ulp_share"] == pytest.approx(sum(ge2) / sum(far))
    assert r["ge2_ulp_share_of_all"] == pytest.approx(sum(ge2) / sum(elements))
    assert r["prevalence_mean"] == pytest.approx(np.mean([f / e for f, e in zip(far, elements)]))
    assert r["max_ulp"] == 40
    empty = table.loc[("fp8-a", 1024)]
    assert empty["max_relative_difference_seeds"] == 0 and pd.isna(empty["max_relative_difference"])
    assert pd.isna(empty["ge2_ulp_share"]) and empty["ge2_ulp_share_of_all"] == 0.0 and pd.isna(empty["max_ulp"])


def _ran(*pairs: str, not_run: tuple[str, ...] = ()) -> pd.DataFrame:
    rows = [_row(p, 512, 0, prevalence=0.1) for p in pairs] + [_row(p, 512, 0, "not run: vLLM absent")
                                                               for p in not_run]
    return sweep.frame(rows, sweep.COUNTS_SCHEMA)


@pytest.mark.parametrize("rows", [("fp8-scaledmm-cutlass", "fp8-cutlass-triton"),
                                  ("fp8-cutlass-triton", "fp8-scaledmm-cutlass")])
def test_the_comparator_follows_the_registered_order_whatever_the_row_order(paper: dict, rows: tuple) -> None:
    first = paper["comparator"]["order"]["fp8"][0]
    pair, why = ksweep.paper_pair(_ran(*rows), paper, "fp8")
    assert pair == first and first in why and "first FP8 pair in registration order" in why
    assert ksweep.paper_pair(ksweep.per_k(_ran(*rows)), paper, "fp8")[0] == first  # per_k's table: no status
    reordered = {**paper, "comparator": {**paper["comparator"], "order": {
        **paper["comparator"]["order"], "fp8": list(reversed(paper["comparator"]["order"]["fp8"]))}}}
    assert ksweep.paper_pair(_ran(*rows), reordered, "fp8")[0] == reordered["comparator"]["order"]["fp8"][0]


def test_a_pair_that_did_not_run_is_skipped(paper: dict) -> None:
    first, second = paper["comparator"]["order"]["fp8"]
    pair, why = ksweep.paper_pair(_ran(second, "int8-cutlass-triton", not_run=(first,)), paper, "fp8")
    assert pair == second and f"{first} did not run" in why
    none, why = ksweep.paper_pair(_ran("int8-cutlass-triton", not_run=(first, second)), paper, "fp8")
    assert none is None and why.startswith("No FP8 pair ran")
    assert ksweep.paper_pair(_ran(first, second), paper, "int8")[0] is None
    with pytest.raises(InputError, match="format 'bf16'"):
        ksweep.paper_pair(_ran(first), paper, "bf16")


def _tables(spec: dict, counts: pd.DataFrame) -> pd.DataFrame:
    _, selected = sweep.model_rows(spec, counts)
    return sweep.frame(sweep.summary_rows(spec, counts, selected), sweep.SUMMARY_SCHEMA)


def test_direction_on_the_comparator_pairs(spec: dict, paper: dict) -> None:
    from tests.ksweep.test_sweep import _synthetic_counts

    counts = _synthetic_counts(spec)
    summary = _tables(spec, counts)
    found = ksweep.direction(counts, summary, paper)
    assert found is not None and (found.int8_pair, found.fp8_pair) == ("int8-cutlass-triton", "fp8-scaledmm-cutlass")
    fp8 = counts[counts["pair"] == found.fp8_pair]
    ks = sorted(spec["grid"]["k"])
    means = tuple(float(pd.to_numeric(fp8.loc[fp8["k"] == k, "prevalence"]).mean()) for k in (ks[0], ks[-1]))
    assert found.fp8_k == (ks[0], ks[-1]) and found.fp8_prevalence == pytest.approx(means)
    int8 = summary[summary["pair"] == found.int8_pair].iloc[0]
    assert found.int8_p_value == pytest.approx(float(int8["p_value"]))
    assert found.int8_rejected == (float(int8["p_value"]) < spec["statistics"]["int8_constant_rate_test"]["alpha"])
    assert found.fp8_rejected and found.fp8_rises and not found.int8_rejected and found.holds
    assert found.text.startswith("FP8 divergence grows with K, INT8 does not: holds.")


def test_direction_fails_when_int8_rises_or_the_fp8_comparator_is_flat(spec: dict, paper: dict) -> None:
    from tests.ksweep.test_sweep import _synthetic_counts

    counts = _synthetic_counts(spec)
    rising = counts.copy()
    int8 = rising["pair"] == "int8-cutlass-triton"
    rising.loc[int8, "differing"] = (rising.loc[int8, "k"] // 16).astype(object)  # 32 ... 2048 per seed
    rising.loc[int8, "prevalence"] = (rising.loc[int8, "differing"] / rising.loc[int8, "elements"]).astype(object)
    found = ksweep.direction(rising, _tables(spec, rising), paper)
    assert found is not None and found.int8_rejected and not found.holds and "does not hold" in found.text
    flat = counts.copy()  # fp8-scaledmm-cutlass did not run: fp8-cutlass-triton, at a constant rate, is next
    first = flat["pair"] == "fp8-scaledmm-cutlass"
    flat.loc[first, "status"] = "not run: vLLM absent"
    flat.loc[first, ["elements", "differing", "prevalence"]] = None
    found = ksweep.direction(flat, _tables(spec, flat), paper)
    assert found is not None and found.fp8_pair == "fp8-cutlass-triton"
    assert not found.fp8_rises and not found.holds
    no_fp8 = flat.copy()
    no_fp8.loc[no_fp8["format"] == "fp8", "status"] = "not run: vLLM absent"
    assert ksweep.direction(no_fp8, _tables(spec, no_fp8), paper) is None


def test_line_chart_log_axes_leave_zeros_out_and_say_so() -> None:
    text = svg.line_chart("t", {"a": [(512, 0.0, math.nan, math.nan), (1024, 1e-5, 0.0, 2e-5)],
                                "b": [(512, 0.1, 0.09, 0.11), (1024, 0.2, 0.19, 0.21)]},
                          x_label="K", y_label="share", log_y=True, hollow=["b"])
    assert "a (1 not drawn: zero)" in text
    assert text.count("<polyline") == 1  # the hollow series is not joined
    assert "1e-05" in text and "1e+00" in text
    assert svg.line_chart("t", {"a": [(512, 0.5, 0.4, 0.6)]}, x_label="K", y_label="y") == \
        svg.line_chart("t", {"a": [(512, 0.5, 0.4, 0.6)]}, x_label="K", y_label="y")

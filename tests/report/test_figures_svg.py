"""The report's SVG charts, parsed: every mark and every label inside the viewBox (legends included),
one mark per data point or series, every series named in a legend drawn, and the new figures (per
layer, ROC, calibration) built from the tables the way the tokens stage computes the same numbers."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from int8alibi.model.layers import PROJECTIONS
from int8alibi.report import svg
from int8alibi.report.document import Document, Figure, Source
from int8alibi.report.sections import (Tables, calibration_bins, calibration_figure, execution_order, faults,
                                       layer_figure, roc_figure, ulp_buckets)
from int8alibi.tokens.margin import auc_small_margin, calibrate

NS = "{http://www.w3.org/2000/svg}"
SRC = Source("results/x.parquet", "0" * 64)


def _root(chart: str) -> ET.Element:
    return ET.fromstring(chart)


def _box(root: ET.Element) -> tuple[float, float]:
    _, _, width, height = (float(v) for v in root.get("viewBox", "").split())
    assert (float(root.get("width", "")), float(root.get("height", ""))) == (width, height)
    return width, height


def _text_span(el: ET.Element) -> tuple[float, float, float, float]:
    """(left, right, top, bottom) of a text element by the charts' own generous width estimate."""
    size = float(el.get("font-size", "10"))
    width = svg.text_width("".join(el.itertext()), size)
    x, y = float(el.get("x", "0")), float(el.get("y", "0"))
    if el.get("transform", "").startswith("rotate(-90"):
        return x - size, x, y - width / 2, y + width / 2
    anchor = el.get("text-anchor", "start")
    left = x - width / 2 if anchor == "middle" else x - width if anchor == "end" else x
    return left, left + width, y - size, y + 0.3 * size


def outside(chart: str) -> list[str]:
    """Every text and rect that reaches outside the viewBox (empty: all inside)."""
    root = _root(chart)
    width, height = _box(root)
    bad = []
    for el in root.iter(f"{NS}text"):
        left, right, top, bottom = _text_span(el)
        if left < 0 or right > width or top < 0 or bottom > height:
            bad.append(f"text {''.join(el.itertext())!r} at {left:.0f}..{right:.0f} x {top:.0f}..{bottom:.0f}")
    for el in root.iter(f"{NS}rect"):
        if el.get("width") == "100%":
            continue
        x, y, w, h = (float(el.get(k, "0")) for k in ("x", "y", "width", "height"))
        if x < 0 or y < 0 or x + w > width + 1e-6 or y + h > height + 1e-6:
            bad.append(f"rect at {x}, {y} size {w} x {h}")
    return bad


def _legend_labels(chart: str) -> list[str]:
    root = _root(chart)
    return ["".join(t.itertext()) for g in root.iter(f"{NS}g") if "legend" in g.get("class", "").split()
            for t in g.iter(f"{NS}text")]


def _layers(blocks: int = 28) -> pd.DataFrame:
    """A compare/layers table: every projection of every block, three settings, two phases; only
    real-scale prefill layers differ (by 0, 1, 20 or 700 elements), one of them with no finite pair."""
    base = pd.DataFrame([(b, p) for b in range(blocks) for p in PROJECTIONS], columns=["block", "proj"])
    base["layer"] = "model.layers." + base["block"].astype(str) + "." + base["proj"]
    frames = []
    for setting in ("pow2-requant", "real", "pow2-snapped"):   # stored order is not the drawn order
        for phase in ("decode", "prefill"):
            part = base.assign(setting=setting, phase=phase)
            real = setting == "real" and phase == "prefill"
            part["differing"] = np.where(real, np.array([0, 1, 20, 700])[np.arange(len(part)) % 4], 0)
            part["max_finite_ulp"] = pd.array(np.where(part["differing"] > 1, 2, part["differing"]), dtype="Int64")
            frames.append(part)
    out = pd.concat(frames, ignore_index=True)
    out.loc[(out["setting"] == "real") & (out["phase"] == "prefill") & (out.index % 4 == 3), "max_finite_ulp"] = pd.NA
    return out.sample(frac=1.0, random_state=0).reset_index(drop=True)  # the figure must not rely on row order


def test_the_per_layer_figure_has_one_bar_per_layer_comparison_in_execution_order() -> None:
    layers = _layers()
    figure = layer_figure(layers, SRC)
    assert outside(figure.svg) == []
    root = _root(figure.svg)
    bars = [r for r in root.iter(f"{NS}rect") if r.get("class") == "layer"]
    assert len(bars) == len(layers) == 28 * 7 * 6
    strips = [t.text for t in root.iter(f"{NS}text") if t.get("font-weight") == "bold"][1:]
    assert strips == ["real, prefill", "real, decode", "pow2-snapped, prefill", "pow2-snapped, decode",
                      "pow2-requant, prefill", "pow2-requant, decode"]
    first = [r for r in bars if r.find(f"{NS}title").text.startswith("real, prefill")]
    xs = {r.find(f"{NS}title").text.split(": ")[1]: float(r.get("x")) for r in first}
    order = [f"model.layers.{b}.{p}" for b in range(28) for p in PROJECTIONS]
    assert [name for name, _ in sorted(xs.items(), key=lambda kv: kv[1])] == order
    assert set(_legend_labels(figure.svg)) == {"identical", "max 1 ulp", "max 2–15 ulp", "no finite pair"}
    assert execution_order(layers)["position"].tolist() == list(range(196))


def test_the_per_layer_figure_fits_a_1280_px_screen_for_252_layers() -> None:
    figure = layer_figure(_layers(blocks=36), SRC)
    width, _ = _box(_root(figure.svg))
    assert width <= 1100 and outside(figure.svg) == []


def _positions(rng: np.random.Generator) -> pd.DataFrame:
    """tokens/positions rows of the kernel pair: flips likelier at small margins under own scales,
    none under pow2; margins on a coarse grid, so many ties."""
    n, windows = 640, 8
    margin = np.round(rng.gamma(2.0, 1.0, size=n) * 4) / 4
    flip = rng.random(n) < 0.6 * np.exp(-margin)
    window = np.repeat(np.arange(windows), n // windows)
    own = pd.DataFrame({"comparison": "kernels", "regime": "own", "window": window, "margin": margin, "flip": flip})
    pow2 = own.assign(regime="pow2", flip=False)
    noise = own.assign(comparison="F1 all")   # injection comparisons are not the kernel pair's curve
    return pd.concat([own, pow2, noise], ignore_index=True)


def test_the_roc_draws_one_curve_per_regime_with_flips_and_its_area_is_the_stages_auc() -> None:
    positions = _positions(np.random.default_rng(0))
    figure = roc_figure(positions, SRC)
    assert outside(figure.svg) == []
    root = _root(figure.svg)
    curves = [p for p in root.iter(f"{NS}polyline") if p.get("class") == "series"]
    assert len(curves) == 1
    own = positions[(positions["comparison"] == "kernels") & (positions["regime"] == "own")]
    auc = auc_small_margin(own["margin"].to_numpy(), own["flip"].to_numpy())
    assert f"own: AUC {auc:.3f} ({int(own['flip'].sum())} flips of 640)" in _legend_labels(figure.svg)
    notes = ["".join(t.itertext()) for t in root.iter(f"{NS}text") if t.get("class") == "note"]
    assert " ".join(notes).startswith("pow2: no curve: 0 flips among 640 positions")
    points = [tuple(map(float, xy.split(","))) for xy in curves[0].get("points").split()]
    assert points[0] == (70.0, 310.0) and points[-1] == (350.0, 30.0)   # (0, 0) to (1, 1) on the 280 px plot
    assert all(b[0] >= a[0] and b[1] <= a[1] for a, b in zip(points, points[1:]))  # monotone


def _predictor(positions: pd.DataFrame) -> pd.DataFrame:
    """The map_bin rows the tokens stage writes, from the stage's own calibration of these positions."""
    rows = []
    for regime, part in positions[positions["comparison"] == "kernels"].groupby("regime"):
        cal = calibrate(part["margin"].to_numpy(), part["flip"].to_numpy(), part["window"].to_numpy(),
                        bins=10, min_support=40)
        edges = np.concatenate([[-np.inf], cal.map.edges, [np.inf]])
        for i, p in enumerate(cal.map.probability):
            rows.append({"comparison": "kernels", "regime": regime, "quantity": "map_bin", "bin": i + 1,
                         "value": float(p), "margin_from": None if i == 0 else float(edges[i]),
                         "margin_to": None if i == len(cal.map.probability) - 1 else float(edges[i + 1])})
    return pd.DataFrame(rows)


def test_the_calibration_plot_has_one_marker_per_bin_and_counts_the_held_out_positions_as_the_map_bins_them() -> None:
    positions = _positions(np.random.default_rng(1))
    predictor = _predictor(positions)
    bins = calibration_bins(predictor, positions)
    for regime, part in positions[positions["comparison"] == "kernels"].groupby("regime"):
        cal = calibrate(part["margin"].to_numpy(), part["flip"].to_numpy(), part["window"].to_numpy(),
                        bins=10, min_support=40)
        held = part[part["window"] % 2 == 1]
        which = cal.map.bin_of(held["margin"].to_numpy())
        mine = bins[bins["regime"] == regime]
        assert mine["held_out_positions"].tolist() == np.bincount(which, minlength=len(mine)).tolist()
        assert mine["held_out_flips"].tolist() == np.bincount(which[held["flip"].to_numpy()],
                                                              minlength=len(mine)).tolist()
    figure = calibration_figure(bins, (SRC,))
    assert outside(figure.svg) == []
    markers = [c for c in _root(figure.svg).iter(f"{NS}circle") if c.get("class") == "bin"]
    assert len(markers) == int((bins["held_out_positions"] > 0).sum()) and len(markers) >= 4
    assert {label.split(" ")[0] for label in _legend_labels(figure.svg)} == {"perfect", "own", "pow2"}


def _write(root: Path, rel: str, frame: pd.DataFrame) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(root / rel, index=False)


def test_the_ulp_chart_draws_every_bucket_present_in_a_colour_of_its_own(tmp_path: Path) -> None:
    """The H200 report's ulp chart lost a bucket: a seventh series took the first one's colour and its
    legend entry ran past the frame. Here every bucket present has a visible segment, a distinct
    colour and a legend entry inside the frame; an absent bucket has none."""
    ulp = pd.DataFrame({"fault": ["F1", "F1", "F9", "F9", "F9", "F9", "F9", "F9"],
                        "regime": ["own"] * 8, "max_ulp": pd.array([0, 1, 0, 3, 100, 1000, 20000, None], dtype="Int64"),
                        "cells": [1000, 260, 5, 2, 300, 400, 500, 1], "observable_cells": [0, 260, 0, 2, 300, 400, 500, 1]})
    _write(tmp_path, "faults/ulp_distribution.parquet", ulp)
    _write(tmp_path, "faults/detection.parquet", pd.DataFrame({
        "definition": ["stated"], "fault": ["F1"], "regime": ["both"], "cells": [1], "observable": [1],
        "detected": [0], "detected_by": [""]}))
    figure = next(b for b in faults(Tables(tmp_path), Document("t")) if isinstance(b, Figure) and b.name == "ulp")
    assert outside(figure.svg) == []
    segments = [r for r in _root(figure.svg).iter(f"{NS}rect") if r.get("class") == "segment"]
    drawn = {r.find(f"{NS}title").text.split(": ")[0].split(" ", 1)[1] for r in segments
             if float(r.get("width")) >= svg.MIN_SEGMENT}
    assert drawn == set(svg.ULP_BUCKETS) and _legend_labels(figure.svg) == svg.ULP_BUCKETS
    colours = {r.get("fill") for r in segments if r.find(f"{NS}title").text.startswith("F9")}
    assert len(colours) == len(svg.ULP_BUCKETS)
    assert ulp_buckets(ulp["max_ulp"]).tolist() == ["0", "1", "0", "2–15", "16–255", "256–4095", "≥4096", "non-finite"]
    absent = svg.stacked_bars("t", ["F1"], {"0": [5], "1": [0]}, x_label="cells", y_label="fault")
    assert _legend_labels(absent) == ["0"]


def test_the_heat_map_legend_fits_and_names_n_a_only_when_a_cell_is_n_a() -> None:
    cells = [[0.0, None, 1.0], [0.79, 0.65, 0.0]]
    chart = svg.heat_map("Detection heat map (fault × check)", ["F1", "F9"], ["1", "5", "6"], cells, x_label="check",
                         y_label="fault", scale_label="share fired", width=svg.HALF_WIDTH)
    assert outside(chart) == []
    assert _legend_labels(chart) == ["n/a: no observable, applicable cell"]
    full = svg.heat_map("t", ["F1"], ["1"], [[0.5]], x_label="check", y_label="fault", scale_label="share fired")
    assert outside(full) == [] and _legend_labels(full) == []


@pytest.mark.parametrize("chart", [
    svg.stacked_bars("Cells by max ulp (arm A vs arm B)", ["F1", "F9"],
                     {b: [1, 2] for b in svg.ULP_BUCKETS}, x_label="cells", y_label="fault",
                     ends=["0–1", "0–34,463"], width=svg.HALF_WIDTH),
    svg.interval_plot("Relative perplexity change vs own (%)", ["pow2-nearest", "pow2-ceiling"], [0.46, -1.21],
                      [0.01, -1.5], [0.94, -0.91], "%", x_label="change (%)", y_label="arm", width=svg.HALF_WIDTH),
    svg.line_chart("Differing elements vs K", {"int8-cutlass-triton (vllm-cutlass vs vllm-triton, 5 seeds)":
                                               [(512, 1e-6, math.nan, math.nan), (1024, 2e-6, 1e-6, 3e-6)],
                                               "fp8-scaledmm-cutlass (torch-scaled-mm vs vllm-cutlass)":
                                               [(512, 0.08, 0.07, 0.09), (1024, 0.1, 0.09, 0.11)]},
                   x_label="K", y_label="share", log_y=True),
    svg.column_chart("Headroom below 2^24", [str(b) for b in range(36)], [4.0 + b / 10 for b in range(36)],
                     x_label="transformer block", y_label="bits", width=svg.HALF_WIDTH),
], ids=["stacked", "interval", "line", "column"])
def test_every_chart_keeps_its_marks_and_labels_inside_its_frame(chart: str) -> None:
    assert outside(chart) == []

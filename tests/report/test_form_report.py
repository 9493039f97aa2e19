"""The report's form from a small but complete run: the main page keeps no per-row table (each one is
in the appendix, with its source), every section's figure is there, and the printed main page
(headless Chromium, --print-to-pdf) fits in eight pages.

The run's tables are made here with the shapes and, where the pipeline has a function for it, the
code that writes them (compare's write_tables, the tokens stage's predictor and influence tables),
so the report is built from tables like the ones a run leaves."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from int8alibi.analysis.layer_comparison import write_tables
from int8alibi.config import Config
from int8alibi.model.layers import PROJECTIONS
from int8alibi.protocol import load
from int8alibi.report import document, sections
from int8alibi.report.document import MAIN_ROWS, Document, Figure, Table

from .render import chromium

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = load(ROOT / "preregistration")
CFG = Config({"model": {"source": "synthetic", "synthetic": {"preset": "tiny"}}, "size_profile": "tiny",
              "arms": ["exact-cutlass-order", "exact-triton-order"], "device": "cpu",
              "corpus": {"source": "synthetic"}, "exploratory": True}, ROOT / "config.yaml")
BLOCKS = 28
CHECKPOINTS = ["own", "pow2-ceiling", "pow2-nearest", "probe"]


def _write(results: Path, rel: str, frame: pd.DataFrame) -> None:
    (results / rel).parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(results / rel, index=False)


def _layer_rows(rng: np.random.Generator) -> list[dict]:
    """compare's layer rows: 196 layers, three settings, two phases; only real scales differ."""
    rows = []
    for setting, checkpoint in (("real", "own"), ("pow2-snapped", "own"), ("pow2-requant", "pow2-nearest")):
        for phase, m in (("prefill", 512), ("decode", 1)):
            for block in range(BLOCKS):
                for proj in PROJECTIONS:
                    differing = int(rng.poisson(1.5)) if setting == "real" and phase == "prefill" else 0
                    rows.append({
                        "setting": setting, "phase": phase, "layer": f"model.layers.{block}.{proj}",
                        "checkpoint": checkpoint, "block": block, "proj": proj, "m": m, "k": 2048, "n": 2048,
                        "operand_digest": "0" * 64, "arm_a": "exact-cutlass-order", "arm_b": "exact-triton-order",
                        "elements": m * 2048, "differing": differing, "identical": differing == 0,
                        "max_finite_ulp": min(differing, 1), "finite_pairs": m * 2048, "nonfinite_a": 0,
                        "nonfinite_b": 0, "subnormal_a": 0, "subnormal_b": 0,
                        "predicted_bitwise": None if setting == "real" else True,
                        "prediction_held": "n.a." if setting == "real" else "yes", "exploratory": True,
                        "reference_rms": 1.0, "max_normalized_error": 0.01 * differing,
                        "rms_normalized_error": 0.001 * differing, "near_zero_elements": 10,
                        "differing_near_zero": 0, "differing_non_near_zero": differing})
    return rows


def _positions(rng: np.random.Generator) -> pd.DataFrame:
    """tokens/positions of the kernel pair: 8 windows x 128 positions per regime, flips only under own."""
    frames = []
    for regime, checkpoint in (("own", "own"), ("pow2", "pow2-nearest")):
        n = 8 * 128
        margin = np.round(rng.gamma(2.0, 1.0, size=n) * 8) / 8
        flip = (rng.random(n) < 0.5 * np.exp(-2 * margin)) & (regime == "own")
        top1 = rng.integers(0, 50000, size=n)
        frames.append(pd.DataFrame({
            "comparison": "kernels", "regime": regime, "checkpoint": checkpoint,
            "window": np.repeat(np.arange(8, dtype=np.int32), 128), "position": np.tile(np.arange(128, dtype=np.int32), 8),
            "token": rng.integers(0, 50000, size=n), "margin": margin, "top1_a": top1, "top1_b": top1 + flip,
            "flip": flip, "logits_differ": (regime == "own") & (rng.random(n) < 0.4) | flip, "changed": flip}))
    return pd.concat(frames, ignore_index=True)


def _tokens(results: Path, rng: np.random.Generator) -> None:
    from int8alibi.tokens.study import Outcome, influence_table, predictor_table

    positions = _positions(rng)
    outcomes = {("kernels", r): Outcome("kernels", r, [part]) for r, part in positions.groupby("regime")}
    boot = PROTOCOL.analysis["bootstrap"]
    _write(results, "tokens/positions.parquet", positions)
    _write(results, "tokens/predictor.parquet", predictor_table(outcomes, PROTOCOL.tokens["predictor"], boot))
    _write(results, "tokens/influence.parquet", influence_table(outcomes))
    flips = positions.groupby("regime")["flip"].sum()
    _write(results, "tokens/pairs.parquet", pd.DataFrame({
        "comparison": "kernels", "regime": ["own", "pow2"], "checkpoint": ["own", "pow2-nearest"],
        "arm_a": "exact-cutlass-order", "arm_b": "exact-triton-order", "windows": 8, "positions": 1024,
        "differing_positions": [400, 0], "flips": flips.tolist(), "flip_rate": (flips / 1024).tolist(),
        "flip_rate_low": 0.0, "flip_rate_high": 0.1, "level": 0.9, "confident_flips": 0, "fired": False,
        "prediction": "silent", "predicted_observable": [True, False], "score": ["TN", "excluded-unobservable"],
        "reason": "within the budget"}))
    cells = [(f, s, r) for f in ("F1", "F2", "F3", "F4", "F5", "F6", "F7") for s in ("all", "one", "pct")
             for r in ("own", "pow2")]
    _write(results, "tokens/check7.parquet", pd.DataFrame({
        "fault": [c[0] for c in cells], "severity": [c[1] for c in cells], "regime": [c[2] for c in cells],
        "positions": 96, "changed_positions": 10, "flips": 3, "confident_flips": 0, "fraction": 0.03,
        "fired": False, "prediction": "silent", "predicted_miss": False, "score": "TN"}))


def _faults(results: Path, rng: np.random.Generator) -> None:
    """The fault campaign's tables, written by the faults stage from campaign rows: every (fault,
    severity, check) of the corrected matrix on seven layers in both regimes, checks firing as it
    predicts; check 5 applies under pow2 scales only, check 6 under own scales, check 7 never."""
    from int8alibi.analysis.scoring import cells_table, score
    from int8alibi.protocol.definitions import MATRICES
    from int8alibi.stages.faults import write_tables as write_fault_tables

    grid = PROTOCOL.matrix("corrected")[["fault", "severity", "check", "prediction"]]
    layers = pd.DataFrame({"block": 0, "proj": list(PROJECTIONS)})
    layers["layer"] = "model.layers.0." + layers["proj"]
    rows = layers.merge(grid, how="cross").merge(pd.DataFrame({"regime": ["own", "pow2"]}), how="cross")
    n = len(rows)
    applicable = ~(((rows["check"] == 5) & (rows["regime"] == "own")) | ((rows["check"] == 6) & (rows["regime"] == "pow2"))
                   | (rows["check"] == 7))
    fired = rows["prediction"] == "fire"
    big = rows["fault"] == "F9"
    rows = rows.drop(columns="prediction").assign(
        changed_elements=np.where(rows["fault"] == "F8", 0, 10), observable=rows["fault"] != "F8",
        max_ulp=np.where(big, rng.integers(2, 40000, size=n), rng.integers(0, 2, size=n)), nonfinite=0,
        k_effective=2048, tile_repeats=1, f7_boost=False, applicable=applicable,
        fired=pd.Series(fired, dtype=object).where(applicable, None), reason="")
    cells = cells_table(score(rows, {m: PROTOCOL.matrix(m) for m in MATRICES}, True))
    write_fault_tables(results / "faults", cells, PROTOCOL)


def _others(results: Path, rng: np.random.Generator) -> None:
    _write(results, "protocol/pins.parquet", pd.DataFrame({"kind": "file", "file": [f"f{i}.yaml" for i in range(11)],
                                                           "sha256": "0" * 64}))
    _write(results, "prediction/predictions.parquet", pd.DataFrame([
        ("own", "prefill", b, p, 4.0 + rng.random(), 500_000) for b in range(BLOCKS) for p in PROJECTIONS],
        columns=["checkpoint", "phase", "block", "proj", "headroom_bits", "max_abs_acc"]))
    _write(results, "determinism/summary.parquet", pd.DataFrame({"arm_a": ["a"], "arm_b": ["b"], "own": ["3/4"],
                                                                 "probe": ["4/4"]}))
    comparisons = ["arms", "runs-of-exact-cutlass-order", "runs-of-exact-triton-order"]
    agreement = pd.DataFrame([(c, k, p) for c in CHECKPOINTS for k in comparisons for p in range(4)],
                             columns=["checkpoint", "comparison", "prompt"])
    _write(results, "determinism/agreement.parquet", agreement.assign(
        identical=True, first_divergence=np.nan, allow_unverified=False))
    _write(results, "prefill_decode/prefill_decode.parquet", pd.DataFrame({
        "checkpoint": np.repeat(CHECKPOINTS, 2), "arm": ["a", "b"] * 4, "sequences": 4, "positions": 64,
        "differing_positions": 50, "flips": 5, "flip_rate": 5 / 64, "flip_rate_low": 0.02, "flip_rate_high": 0.12,
        "level": 0.9}))
    _write(results, "prefill_decode/first_divergence.parquet", pd.DataFrame({
        "checkpoint": np.repeat(CHECKPOINTS, 4), "arm": "a", "sequence": np.tile(np.arange(4), 4), "diverged": True,
        "module": "lm_head", "kind": "head"}))
    arms = ["own", "parent", "pow2-ceiling", "pow2-nearest", "probe"]
    _write(results, "perplexity/summary.parquet", pd.DataFrame({
        "quantity": ["perplexity"] * 5 + ["relative_change_vs_own"] * 4 + ["hypothesis:H1", "gate:G1",
                                                                          "mismatch_share", "constraint_share"],
        "arm": arms + arms[1:] + ["pow2-ceiling", "pow2-ceiling", "probe", "probe"],
        "value": [20.0, 19.9, 19.8, 20.1, 20.7, -0.004, -0.012, 0.005, 0.035, -0.017, -0.012, 0.867, 0.133],
        "low": [None] * 5 + [-0.006, -0.015, 0.0001, 0.007, -0.021, None, 0.57, None],
        "high": [None] * 5 + [-0.002, -0.009, 0.009, 0.065, -0.012, None, 1.02, None],
        "level": 0.9, "verdict": [None] * 9 + ["supported", "gate not triggered", None, None], "detail": ""}))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("run") / "results"
    rng = np.random.default_rng(0)
    write_tables(_layer_rows(rng), results / "compare", True)
    _tokens(results, rng)
    _faults(results, rng)
    _others(results, rng)
    return results


def _sections(results: Path) -> Document:
    """The page sections.py makes: contents, glossary and every section (the K sweep's is ksweep.py's)."""
    tables = sections.Tables(results, tuple(PROTOCOL.paper["claims"]))
    doc = Document("t")
    doc.add(document.Contents(), *sections.glossary())
    for section in sections.SECTIONS:
        doc.add(*section(tables, doc))
    return doc


def test_the_sections_keep_per_row_tables_in_the_appendix(run: Path) -> None:
    doc = _sections(run)
    html = document.to_html(doc)
    for table in re.findall(r"<table.*?</table>", html, re.S):
        caption = re.search(r"<caption>(.*?)</caption>", table).group(1)
        assert table.count("<tr>") - 1 <= MAIN_ROWS, caption
    shown = [b for b in doc.blocks if isinstance(b, (Table, Figure))]
    assert len(shown) >= 15 and all(b.sources for b in shown)
    appendix = {t.caption.split(". ", 1)[1].split(":")[0]: len(t.frame) for t in doc.appendix}
    assert appendix["Every layer comparison"] == BLOCKS * 7 * 6 and all(t.sources for t in doc.appendix)
    names = {b.name for b in doc.blocks if isinstance(b, Figure)}
    assert {"layers", "headroom", "ulp", "detection", "perplexity", "perplexity-probe", "roc", "calibration"} <= names


def test_the_sections_name_the_papers_by_arxiv_id(run: Path) -> None:
    md, _ = document.to_markdown(_sections(run))
    assert not re.search(r"\b(first|second) paper", md)


@pytest.mark.slow
def test_the_main_page_prints_on_at_most_eight_pages(run: Path, tmp_path: Path, monkeypatch) -> None:
    """The whole report (setup, findings, every section) printed as a reader would, A4 or Letter."""
    from int8alibi.stages import report

    browser = chromium()
    if browser is None:
        pytest.skip("Chromium is not installed (./bootstrap test installs it as root where apt-get works): "
                    "the printed page count was not measured")
    monkeypatch.chdir(ROOT)
    out = tmp_path / "report"
    out.mkdir()
    document.write(report.build(CFG, run), out)
    html = (out / "report.html").read_text()
    for paper in ("A4", "Letter"):
        page = tmp_path / f"report-{paper}.html"
        page.write_text(html.replace("@page{", f"@page{{size:{paper};"))
        pdf = tmp_path / f"report-{paper}.pdf"
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer",
                        f"--user-data-dir={tmp_path / 'profile'}", f"--print-to-pdf={pdf}", page.as_uri()],
                       check=True, capture_output=True, timeout=120)
        pages = len(re.findall(rb"/Type\s*/Page\b(?!s)", pdf.read_bytes()))
        assert 1 <= pages <= 8, (paper, pages)

"""The papers' claims beside a run: measures, verdicts, and what happens when a table is missing or stale."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from int8alibi.errors import ProtocolError
from int8alibi.protocol import load
from int8alibi.report.claims import Measured, claims_table, measure, paper_value, verdict
from int8alibi.report.sections import Tables

PROTOCOL = load(Path(__file__).resolve().parents[2] / "preregistration")
CLAIMS = {c["id"]: c for c in PROTOCOL.paper["claims"]}


def _write(root: Path, rel: str, frame: pd.DataFrame) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False)


def test_magnitudes_get_a_verdict_only_on_the_papers_model() -> None:
    claim = CLAIMS["check4-detection-original"]
    assert verdict(claim, Measured("75.00%", 75.0), "Qwen3-1.7B") == "reproduced"
    assert verdict(claim, Measured("74.96%", 74.96), "qwen3-1.7b") == "reproduced"  # the paper's one decimal
    assert verdict(claim, Measured("66.67%", 66.67), "Qwen3-1.7B") == "differs"
    assert verdict(claim, Measured("66.67%", 66.67), "synthetic tiny").startswith("no verdict: measured on Qwen3-1.7B")


def test_structural_claims_get_a_verdict_on_any_model() -> None:
    claim = CLAIMS["f8-never-fires"]
    assert verdict(claim, Measured("0", 0.0, holds=True), "synthetic tiny") == "reproduced"
    assert verdict(claim, Measured("3", 3.0, holds=False), "synthetic tiny") == "not reproduced"


def test_a_missing_or_stale_table_is_not_applicable(tmp_path: Path) -> None:
    tables = Tables(tmp_path)
    got = measure(CLAIMS["cells-flipped"], tables, PROTOCOL)
    assert got.why == "not applicable: faults/totals.parquet was not produced"
    _write(tmp_path, "faults/scorecard.parquet", pd.DataFrame({"matrix": ["original"], "check": [4]}))
    stale = measure(CLAIMS["check4-detection-original"], tables, PROTOCOL)
    assert stale.why.startswith("not applicable: faults/scorecard.parquet has no column 'definition'")
    assert verdict(CLAIMS["check4-detection-original"], stale, "Qwen3-1.7B") == stale.why


def test_measures_read_the_named_rows(tmp_path: Path) -> None:
    _write(tmp_path, "faults/scorecard.parquet", pd.DataFrame({
        "definition": ["paper", "stated"], "matrix": ["reverted", "original"], "check": [4, 4],
        "detection_rate": [0.75, 0.5], "fn": [392, 9]}))
    _write(tmp_path, "faults/totals.parquet", pd.DataFrame({
        "definition": ["paper"], "matrix": ["both"], "quantity": ["cells_flipped"], "value": [1278]}))
    _write(tmp_path, "faults/ulp_distribution.parquet", pd.DataFrame({
        "fault": ["F1", "F4", "F9"], "regime": ["own"] * 3, "max_ulp": [0, 2, 300], "cells": [1, 1, 1],
        "observable_cells": [1, 1, 1]}))
    tables = Tables(tmp_path)
    assert measure(CLAIMS["check4-detection-original"], tables, PROTOCOL).number == pytest.approx(75.0)
    assert measure(CLAIMS["check4-false-negatives-original"], tables, PROTOCOL).text == "392"
    assert measure(CLAIMS["cells-flipped"], tables, PROTOCOL).text == "1,278"
    ulp = measure(CLAIMS["epilogue-within-one-spacing"], tables, PROTOCOL)
    assert (ulp.text, ulp.holds) == ("max ulp 0–2", False)  # F4 at 2 spacings breaks the claim; F9 is not epilogue
    counts = measure(CLAIMS["corrected-matrix-counts"], tables, PROTOCOL)
    assert (counts.text, counts.holds) == ("14/52/11, 6 misses", True)


def test_every_claim_has_a_row_and_an_unknown_measure_is_refused(tmp_path: Path) -> None:
    frame, _ = claims_table(PROTOCOL, Tables(tmp_path), "synthetic tiny")
    assert list(frame["claim"]) == [" ".join(c["statement"].split()) for c in PROTOCOL.paper["claims"]]
    assert list(frame.columns) == ["claim", "paper", "paper_model", "this_run", "definition", "verdict"]
    assert paper_value(CLAIMS["check5-false-positive-original"]) == "55.76%"
    with pytest.raises(ProtocolError, match="paper.yaml: claim x: unknown measure 'nothing.here'"):
        measure({**CLAIMS["cells"], "id": "x", "measure": "nothing.here"}, Tables(tmp_path), PROTOCOL)


def test_probe_and_prefill_decode_measures(tmp_path: Path) -> None:
    tables = Tables(tmp_path)
    assert measure(CLAIMS["prefill-decode-flips-probe"], tables, PROTOCOL).why == (
        "not applicable: prefill_decode/prefill_decode.parquet was not produced")
    _write(tmp_path, "determinism/agreement.parquet", pd.DataFrame({
        "checkpoint": ["own", "probe", "probe"], "comparison": ["arms"] * 3, "prompt": [0, 0, 1],
        "identical": [False, True, False]}))
    agree = measure(CLAIMS["probe-arms-agree"], tables, PROTOCOL)
    assert (agree.text, agree.holds) == ("1/2 sequences identical across arms", False)
    _write(tmp_path, "prefill_decode/prefill_decode.parquet", pd.DataFrame({
        "checkpoint": ["own", "own", "probe", "probe"], "arm": ["a", "b", "a", "b"], "flips": [3, 1, 0, 0],
        "positions": [40, 40, 40, 40], "flip_rate": [0.075, 0.025, 0.0, 0.0], "flip_rate_low": [0.0, 0.0, 0.0, 0.0],
        "flip_rate_high": [0.15, 0.05, 0.0, 0.0], "level": [0.9] * 4}))
    own = measure(CLAIMS["prefill-decode-flips-real"], tables, PROTOCOL)
    assert own.number == pytest.approx(5.0) and own.text.startswith("a 3/40 (7.5%, 90% interval 0.0–15.0%); b 1/40")
    probe = measure(CLAIMS["prefill-decode-flips-probe"], tables, PROTOCOL)
    assert probe.number == 0.0
    assert verdict(CLAIMS["prefill-decode-flips-probe"], probe, "SmolLM2-135M").startswith("no verdict: measured on")

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
    assert verdict(claim, Measured("66.67%", 66.67), "synthetic tiny") == "magnitude: no verdict (other model)"


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
    assert list(frame.columns) == ["paper", "claim", "side", "paper_value", "this_run", "verdict"]
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
    assert verdict(CLAIMS["prefill-decode-flips-probe"], probe, "SmolLM2-135M") == "magnitude: no verdict (other model)"


def test_h1_and_d1_are_registered_as_the_papers_found_them() -> None:
    h1 = CLAIMS["ceiling-cheaper"]
    assert h1["kind"] == "magnitude" and h1["value"].startswith("not supported") and "+0.54%" in h1["value"]
    assert verdict(h1, Measured("supported (ceiling +0.34% vs nearest +9.17%)"), "SmolLM2-135M") == (
        "magnitude: no verdict (other model)")
    assert CLAIMS["d1-strict"]["value"] == "not triggered; narrowed"
    assert CLAIMS["d1-real-scales"]["value"] == "triggered; narrowed"


def test_verdicts_say_what_was_tested() -> None:
    pow2 = CLAIMS["pow2-bitwise"]
    assert pow2["evidence"] == "kernels"
    assert verdict(pow2, Measured("x", holds=True), "m", emulated=True) == "holds by construction (emulated arms)"
    assert verdict(pow2, Measured("x", holds=False), "m", emulated=True) == "not reproduced (emulated arms)"
    assert verdict(pow2, Measured("x", holds=True), "m", emulated=False) == "reproduced"
    # a structural claim that does not depend on the arms is tested whatever the arms are
    assert verdict(CLAIMS["f8-never-fires"], Measured("0", holds=True), "m", emulated=True) == "reproduced"
    counts = CLAIMS["original-matrix-counts"]
    assert verdict(counts, measure(counts, Tables(Path("/nonexistent")), PROTOCOL), "m") == "protocol"
    sglang = measure(CLAIMS["ia-sglang"], Tables(Path("/nonexistent")), PROTOCOL)
    assert verdict(CLAIMS["ia-sglang"], sglang, "m") == "not computed here: this pipeline has no SGLang engine"


def test_every_result_row_is_registered_with_where_model_size_and_side() -> None:
    claims = PROTOCOL.paper["claims"]
    numbers = [c for c in claims if c["kind"] in ("magnitude", "not_computed")]
    assert len(numbers) >= 30
    assert {c["paper"] for c in claims} == {"IA", "PT"} and {"divergence", "agreement"} <= {c["side"] for c in claims}
    assert all(c["where"] != "not recorded" and c["size"] for c in claims)
    assert {CLAIMS[i]["value"] for i in ("ia-e2e-own-1.7b", "ia-e2e-own-8b", "ia-e2e-own-64")} == {"0/8", "0/16", "0/64"}
    assert PROTOCOL.paper["papers"]["IA"]["arxiv"] == "2608.13756" and PROTOCOL.paper["papers"]["PT"]["arxiv"] == "2609.00363"


def _cells(rows: list[tuple[str, str, str, bool, bool, bool | None]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["fault", "severity", "regime", "observable", "applicable", "fired"]).assign(
        layer="L", check=range(len(rows)))


def test_d1_real_scale_reading_counts_only_own_scale_catches(tmp_path: Path) -> None:
    # F4 caught under pow2 only: the strict reading is not triggered, the real-scale reading is
    _write(tmp_path, "faults/cells.parquet", _cells([
        ("F4", "all", "pow2", True, True, True), ("F4", "all", "own", True, True, False),
        ("F1", "all", "own", True, False, None), ("F2", "one", "own", False, True, True)]))
    got = measure(CLAIMS["d1-real-scales"], Tables(tmp_path), PROTOCOL)
    assert (got.holds, got.text) == (True, "triggered: no check caught any of 2 observable own-scale epilogue cells")
    _write(tmp_path, "faults/cells.parquet", _cells([("F4", "all", "own", True, True, True),
                                                     ("F1", "all", "own", True, True, False)]))
    got = measure(CLAIMS["d1-real-scales"], Tables(tmp_path), PROTOCOL)
    assert (got.holds, got.text) == (False, "not triggered: caught 1 of 2 own-scale cells (F4: 1)")


def test_detection_rows_sum_regimes_unless_one_is_named(tmp_path: Path) -> None:
    _write(tmp_path, "faults/detection.parquet", pd.DataFrame({
        "definition": ["paper", "paper", "stated"], "fault": ["F4", "F4", "F4"], "regime": ["own", "pow2", "own"],
        "cells": [588, 588, 1], "observable": [478, 494, 1], "detected": [0, 494, 1], "detected_by": ["", "5", "5"]}))
    tables = Tables(tmp_path)
    assert measure(CLAIMS["detection-f4"], tables, PROTOCOL).text == "1,176 / 972 / 494"
    assert measure(CLAIMS["detection-f4-own"], tables, PROTOCOL).text == "588 / 478 / 0"

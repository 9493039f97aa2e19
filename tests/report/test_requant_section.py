"""The report's requantization gate: which reference it was compared with, and the division
statistics beside arXiv:2609.00363's 6.42% and 0.749 (also as claims)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from int8alibi.protocol import load
from int8alibi.report.claims import measure
from int8alibi.report.document import Document, Paragraph, Table
from int8alibi.report.measures import decision_row, division_summary, summary_row
from int8alibi.report.sections import Tables, requant

CLAIMS = tuple(load(Path(__file__).resolve().parents[2] / "preregistration").paper["claims"])
LABEL = "llm-compressor 0.14.0.1 (compressed-tensors 0.19.0, torch 2.13.0+cpu, transformers 5.17.0): ref"
PASSED = "passed: byte-identical to llm-compressor's own checkpoint"


def _gate(tmp_path: Path, **own: list) -> None:
    rows = {"block": [0, 1, 0], "proj": ["q_proj", "q_proj", "q_proj"], "arm": ["own", "own", "probe"],
            "layer": ["l0", "l1", "l0"], "n": [4, 8, 4], "k": [100, 50, 100], "division": ["bf16"] * 3,
            "reference": [LABEL, LABEL, "own"], "bytes_equal": [True, True, False], "differing_int8": [0, 0, 0],
            "differing_scales": [0, 0, 4], "scale_min": [0.1] * 3, "scale_max": [0.2] * 3, "scale_ratio": [2.0] * 3,
            "clipped": [0, 0, None], "saturated": [1, 1, 1], "all_pow2": [False, False, True], "gate": [PASSED] * 3,
            "f32_division_differing": [30, 10, None], "quotient_shift_max": [0.125, 0.25, None],
            "code_offset_max": [0.5, 0.749, None]}
    rows.update(own)
    path = tmp_path / "requant" / "gate.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


def test_gate_section_names_the_reference_and_sets_the_division_beside_the_paper(tmp_path: Path) -> None:
    _gate(tmp_path)
    blocks = requant(Tables(tmp_path, CLAIMS), Document("t"))
    reference = next(b.text for b in blocks if isinstance(b, Paragraph) and b.text.startswith("Reference"))
    assert reference == f"Reference: {LABEL}. Gate: {PASSED} (2 of 2 layers byte-equal in every int8 weight and every scale)."
    division = next(b for b in blocks if isinstance(b, Table) and b.caption.startswith("Division statistics")).frame
    # 40 of 4*100 + 8*50 = 800 weights differ: 5.00%
    assert division["this_run"].tolist() == ["5.00% (40 of 800)", "0.749", "0.250"]
    assert division["paper"].tolist()[:2] == ["6.42% (Qwen3-1.7B)",
                                              "0.749 (Qwen3-1.7B)"]


def test_self_built_gate_says_there_was_no_reference(tmp_path: Path) -> None:
    _gate(tmp_path, reference=["none (self-built)"] * 2 + ["own"], bytes_equal=[None, None, False],
          gate=["self-built (not an independent test)"] * 3)
    text = next(b.text for b in requant(Tables(tmp_path, CLAIMS), Document("t")) if isinstance(b, Paragraph))
    assert text.startswith("Reference: none. The gate is self-built (not an independent test)")


def test_a_gate_table_without_the_statistics_says_so(tmp_path: Path) -> None:
    _gate(tmp_path)
    path = tmp_path / "requant" / "gate.parquet"
    pd.read_parquet(path).drop(columns=["code_offset_max"]).to_parquet(path, index=False)
    blocks = requant(Tables(tmp_path, CLAIMS), Document("t"))
    assert any(isinstance(b, Paragraph) and "Division statistics: not in this run" in b.text for b in blocks)
    claim = next(c for c in CLAIMS if c["id"] == "division-bf16-shift")
    assert measure(claim, Tables(tmp_path, CLAIMS), None).why.startswith("not applicable")


def test_division_claims_measure_the_own_rows(tmp_path: Path) -> None:
    _gate(tmp_path)
    t = Tables(tmp_path, CLAIMS)
    share = measure(next(c for c in CLAIMS if c["id"] == "division-f32-differing"), t, None)
    shift = measure(next(c for c in CLAIMS if c["id"] == "division-bf16-shift"), t, None)
    assert share.number == 5.0 and share.text == "5.00% (40 of 800 int8 weights)"
    assert shift.number == 0.749 and shift.text == (
        "0.749 (the bf16 rounding of the quotient alone: 0.250; below 0.75 by construction)") and shift.holds


def test_the_section_and_the_claims_show_one_division_summary(tmp_path: Path) -> None:
    _gate(tmp_path, f32_division_differing=[7, 0, None], quotient_shift_max=[0.0, 0.25, None],
          code_offset_max=[0.749, 0.5, None])
    tables = Tables(tmp_path, CLAIMS)
    division = next(b for b in requant(tables, Document("t"))
                    if isinstance(b, Table) and b.caption.startswith("Division statistics")).frame
    share, offset = (measure(next(c for c in CLAIMS if c["id"] == i), tables, None)
                     for i in ("division-f32-differing", "division-bf16-shift"))
    summary = division_summary(pd.read_parquet(tmp_path / "requant" / "gate.parquet"))
    assert summary is not None and (summary.differing, summary.weights) == (7, 800)  # the probe's row is not own
    assert division["this_run"].tolist()[:2] == ["0.88% (7 of 800)", "0.749"]
    assert share.number == summary.share_percent and offset.number == summary.code_offset_max == 0.749


def test_a_gate_table_without_own_rows_has_no_division_summary(tmp_path: Path) -> None:
    _gate(tmp_path, arm=["probe", "probe", "probe"])
    assert division_summary(pd.read_parquet(tmp_path / "requant" / "gate.parquet")) is None
    blocks = requant(Tables(tmp_path, CLAIMS), Document("t"))
    assert any(isinstance(b, Paragraph) and "Division statistics: not in this run" in b.text for b in blocks)


def test_a_summary_or_decision_row_is_read_only_when_it_is_the_one_row() -> None:
    summary = pd.DataFrame({"quantity": ["hypothesis:H1", "gate:G1", "gate:G1"], "value": [1.0, 2.0, 3.0]})
    assert summary_row(summary, "hypothesis:H1")["value"] == 1.0
    assert summary_row(summary, "gate:G1") is None and summary_row(summary, "hypothesis:H2") is None
    decisions = pd.DataFrame({"rule": ["D1", "D1"], "definition": ["stated", "paper"], "triggered": [True, False]})
    assert bool(decision_row(decisions, "D1", "paper")["triggered"]) is False
    assert decision_row(decisions, "D2", "stated") is None

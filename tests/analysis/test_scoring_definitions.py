"""Both scoring definitions on a hand-built Qwen3-1.7B-sized campaign (196 layers x 42 cells).

arXiv:2609.00363's original-matrix figures are 75.0% check-4 detection (392 false negatives), 55.76% and
11.39% false-positive rates for checks 5 and 6, and 1,278 of 8,232 cells flipped (494 F4 x check 5
+ 392 F9-one x check 6 + 392 F9-pct x check 4). The table below is built from the counts those
figures state; which checks fire on an observable cell follows the campaign's semantics (the
epilogue faults move outputs by at most one spacing, F6/F7 run both arms on the same inflated
operands, F9 hands arm B other operands). Two counts are not stated as such and are derived:
F4-one under pow2 scales changes an output in 494 - 2 x 196 = 102 layers, and the epilogue faults
under own scales change an output in 1,380 cells (what 11.39% leaves for check 6's true negatives
once the other silent cells are counted: 392 / 0.1139 - 392 - 1,670). How those 1,380 split over
faults and rungs, and how many F9-pct own cells change an output bit (13 here), is free: the
paper definition gives the same figures for any split; the stated rule's numbers are derived by
hand below from the same construction.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from int8alibi.analysis import decisions
from int8alibi.protocol import load
from int8alibi.protocol.definitions import REVERTED, STATED, Definition
from int8alibi.analysis.scoring import definition_scores, detection, flips, reverted_matrix, scorecard, totals

PROTOCOL = load(Path(__file__).resolve().parents[2] / "preregistration")
LAYERS = 196
PAPER = Definition.from_protocol("paper", PROTOCOL.paper["definitions"]["paper"])
OWN_EPILOGUE_OBSERVABLE = {  # (fault, severity) -> layers whose own-scale cell changes an output: 1,380
    ("F1", "all"): 196, ("F1", "pct"): 196, ("F1", "one"): 48, ("F2", "all"): 196, ("F2", "pct"): 196,
    ("F2", "one"): 40, ("F3", "all"): 50, ("F3", "pct"): 1, ("F4", "all"): 196, ("F4", "pct"): 196,
    ("F4", "one"): 42, ("F5", "all"): 20, ("F5", "pct"): 3,
}
POW2_F4_ONE_OBSERVABLE = 102
F9_PCT_OWN_OBSERVABLE = 13


def _observable(fault: str, severity: str, regime: str, i: int) -> bool:
    if fault in ("F6", "F7") or (fault == "F9" and severity != "pct"):
        return True
    if fault == "F8":
        return False
    if fault == "F9":
        return regime == "pow2" or i < F9_PCT_OWN_OBSERVABLE
    if regime == "pow2":  # a power of two makes F1-F3 and F5 exact: only truncation (F4) shows
        return fault == "F4" and (severity != "one" or i < POW2_F4_ONE_OBSERVABLE)
    return i < OWN_EPILOGUE_OBSERVABLE.get((fault, severity), 0)


def _cell_rows(layer: int, fault: str, severity: str, regime: str) -> list[dict[str, object]]:
    seen = _observable(fault, severity, regime, layer)
    operand = fault == "F9"
    big = operand and severity != "pct"
    max_ulp = 300 if big else (1 if seen and fault not in ("F6", "F7") else 0)
    pow2 = regime == "pow2" and severity != "pct" if operand else regime == "pow2"
    verdicts = {1: operand, 2: fault == "F6", 3: fault in ("F6", "F7"), 4: fault == "F6" or big}
    rows = []
    for check in range(1, 8):
        if check <= 4:
            applicable, fired = True, verdicts[check]
        elif check == 5:
            applicable, fired = pow2, (seen and fault not in ("F6", "F7")) if pow2 else None
        elif check == 6:
            applicable, fired = not pow2, (max_ulp > 1) if not pow2 else None
        else:
            applicable, fired = False, None
        rows.append({"layer": f"L{layer:03d}", "block": layer, "proj": "q_proj", "fault": fault,
                     "severity": severity, "regime": regime, "check": check, "changed_elements": int(seen),
                     "observable": seen, "max_ulp": max_ulp, "nonfinite": 0, "k_effective": 2048,
                     "tile_repeats": 1, "f7_boost": False, "applicable": applicable, "fired": fired, "reason": "r"})
    return rows


@pytest.fixture(scope="module")
def scores() -> pd.DataFrame:
    rows = []
    for fault, info in PROTOCOL.fault_info().items():
        for severity in info.severities:
            for regime in ("own", "pow2"):
                for layer in range(LAYERS):
                    rows += _cell_rows(layer, fault, severity, regime)
    cells = pd.DataFrame(rows)
    matrices = {m: PROTOCOL.matrix(m) for m in ("corrected", "original")}
    matrices[REVERTED] = reverted_matrix(matrices["corrected"])
    return definition_scores(cells, [STATED, PAPER], matrices, ulp_tolerance=1)


def _card(scores: pd.DataFrame) -> pd.DataFrame:
    return scorecard(scores).set_index(["definition", "matrix", "check"])


def test_the_campaign_has_the_papers_size(scores: pd.DataFrame) -> None:
    table = totals(scores).set_index(["definition", "matrix", "quantity"])["value"]
    assert table[("paper", "both", "cells")] == table[("stated", "both", "cells")] == 8232


def test_paper_definition_reproduces_the_papers_original_matrix_figures(scores: pd.DataFrame) -> None:
    card = _card(scores)
    four, five, six = (card.loc[("paper", REVERTED, c)] for c in (4, 5, 6))
    assert (four.tp, four.fn) == (1176, 392)
    assert round(100 * four.detection_rate, 1) == 75.0
    assert (five.fp, five.false_positive_denominator) == (494, 886)
    assert round(100 * five.false_positive_rate, 2) == 55.76
    assert (six.fp, six.false_positive_denominator) == (392, 3442)
    assert round(100 * six.false_positive_rate, 2) == 11.39
    table = totals(scores).set_index(["definition", "matrix", "quantity"])["value"]
    assert table[("paper", "both", "cells_flipped")] == 1278
    flipped = flips(scores).set_index(["definition", "fault", "severity", "check"])["flipped"]
    assert flipped.loc["paper"].groupby(level=["fault", "check"]).sum().to_dict() == {
        ("F4", 5): 494, ("F9", 6): 392, ("F9", 4): 392}


def test_paper_definition_detects_every_f9_cell(scores: pd.DataFrame) -> None:
    table = detection(scores).set_index(["definition", "fault", "regime"])
    assert table.loc[("paper", "F9", "both"), ["cells", "observable", "detected"]].tolist() == [1176, 1176, 1176]
    # the stated rule leaves out the F9-pct own cells that change no output bit
    assert table.loc[("stated", "F9", "both"), "detected"] == 1176 - (LAYERS - F9_PCT_OWN_OBSERVABLE)


def test_stated_rule_gives_other_numbers_from_the_same_cells(scores: pd.DataFrame) -> None:
    card = _card(scores)
    pct_seen = LAYERS + F9_PCT_OWN_OBSERVABLE  # F9-pct cells that change an output (pow2 all, own 13)
    four = card.loc[("stated", "original", 4)]
    # registered original: F9-pct x 4 predicted to fire; only its observable cells count
    assert (four.tp, four.fn) == (1176, pct_seen)
    assert four.detection_rate == pytest.approx(1176 / (1176 + pct_seen))
    five = card.loc[("stated", "original", 5)]
    # F4 under pow2 scales fires where it changes an output; F6/F7 stay silent; F9-pct is n/a
    assert (five.fp, five.tn) == (494, 2 * LAYERS)
    six = card.loc[("stated", "original", 6)]
    # own scales (and F9-pct's perturbed scales) only: F9-all and F9-one fire as predicted (TP),
    # F9-pct is predicted to fire and stays within one spacing (FN)
    assert (six.tp, six.fp, six.fn) == (2 * LAYERS, 0, pct_seen)
    assert six.false_positive_rate == 0.0
    assert six.tn == 1380 + 2 * LAYERS  # observable own-scale epilogue cells + F6 + F7 (own)
    table = totals(scores).set_index(["definition", "matrix", "quantity"])["value"]
    # F4 x 5 (494) and the F9-pct cells scored under both (checks 4 and 6 change together);
    # F9-one x 6 is predicted to fire by both registered matrices, so it never flips
    assert table[("stated", "both", "cells_flipped")] == 494 + pct_seen
    corrected = card.loc[("stated", "corrected", 4)]
    assert (corrected.fn, corrected.detection_rate) == (0, 1.0)


def test_d1_is_evaluated_with_its_evidence(scores: pd.DataFrame) -> None:
    table = decisions.evaluate(scores, PROTOCOL.analysis["decision_rules"]).set_index(["rule", "definition"])
    d1 = table.loc[("D1", "stated")]
    assert not d1.triggered and d1.caught_cells == 494
    assert d1.caught_by == "F4: 494 cells (check 5)" and d1.faults == "F1, F2, F3, F4, F5"
    assert d1.verdict.startswith("condition not met")


def test_d1_triggers_when_no_check_catches_an_epilogue_fault(scores: pd.DataFrame) -> None:
    silent = scores.assign(hit=scores["hit"] & ~scores["fault"].isin(["F1", "F2", "F3", "F4", "F5"]))
    table = decisions.evaluate(silent, PROTOCOL.analysis["decision_rules"]).set_index(["rule", "definition"])
    d1 = table.loc[("D1", "paper")]
    assert d1.triggered and d1.caught_by == "none" and "narrows" in d1.consequence


def test_reverted_matrix_undoes_exactly_the_three_corrections() -> None:
    corrected = PROTOCOL.matrix("corrected")
    reverted = reverted_matrix(corrected)
    changed = corrected[corrected["prediction"] != reverted["prediction"]]
    assert sorted({(r.fault, r.severity, r.check) for r in changed.itertuples()}) == [
        ("F4", "all", 5), ("F4", "one", 5), ("F4", "pct", 5), ("F9", "one", 6), ("F9", "pct", 4)]

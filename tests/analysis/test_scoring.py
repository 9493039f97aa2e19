"""Scoring against both prediction matrices, and the scorecard, detection and ulp tables."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from int8alibi.errors import ProtocolError
from int8alibi.protocol import load
from int8alibi.analysis.scoring import (NOT_APPLICABLE, STATED, UNOBSERVABLE, cells_table, definition_scores, detection,
                                        outcome, score, scorecard, ulp_distribution)

PROTOCOL = load(Path(__file__).resolve().parents[2] / "preregistration")
MATRICES = {m: PROTOCOL.matrix(m) for m in ("corrected", "original")}


@pytest.mark.parametrize("prediction,observable,applicable,fired,expected", [
    ("fire", True, True, True, "TP"),
    ("fire", True, True, False, "FN"),
    ("silent", True, True, True, "FP"),
    ("silent", True, True, False, "TN"),
    ("fire", False, True, True, UNOBSERVABLE),     # unobservable wins over everything
    ("n/a", False, False, None, UNOBSERVABLE),
    ("n/a", True, False, None, NOT_APPLICABLE),
    ("fire", True, False, None, NOT_APPLICABLE),   # a check that does not apply is never a pass
    ("silent", True, False, None, NOT_APPLICABLE),
])
def test_reading_rule(prediction: str, observable: bool, applicable: bool, fired: bool | None, expected: str) -> None:
    assert outcome(prediction, observable, applicable, fired) == expected


def test_outcome_refuses_a_verdict_that_cannot_be_scored() -> None:
    with pytest.raises(ProtocolError):
        outcome("fire", True, True, None)


def row(fault: str, severity: str, regime: str, check: int, *, changed: int = 5, applicable: bool = True,
        fired: bool | None = False, max_ulp: int | None = 1, layer: str = "L0") -> dict[str, object]:
    return {"layer": layer, "block": 0, "proj": "q_proj", "fault": fault, "severity": severity, "regime": regime,
            "check": check, "changed_elements": changed, "observable": changed > 0, "max_ulp": max_ulp,
            "nonfinite": 0, "k_effective": 256, "tile_repeats": 1, "f7_boost": False,
            "applicable": applicable, "fired": fired if applicable else None, "reason": "r"}


def test_scores_use_each_matrix_and_the_original_f9_row_for_every_rung() -> None:
    rows = pd.DataFrame([
        row("F9", "pct", "own", 4, fired=False),     # corrected: silent (was fire) -> TN; original: fire -> FN
        row("F9", "one", "own", 6, fired=True),      # corrected: fire -> TP; original: fire -> TP
        row("F4", "all", "pow2", 5, fired=True),     # corrected: fire -> TP; original: silent -> FP
        row("F1", "all", "own", 6, fired=False),     # silent, a predicted miss in both
        row("F8", "all", "own", 1, changed=0),       # unobservable
        row("F1", "all", "own", 7, applicable=False),
    ])
    scored = score(rows, MATRICES, exploratory=True).set_index(["fault", "severity", "check"])
    assert scored.loc[("F9", "pct", 4), ["score_corrected", "score_original"]].tolist() == ["TN", "FN"]
    assert scored.loc[("F9", "one", 6), ["score_corrected", "score_original"]].tolist() == ["TP", "TP"]
    assert scored.loc[("F4", "all", 5), ["score_corrected", "score_original"]].tolist() == ["TP", "FP"]
    misses = ["predicted_miss_corrected", "predicted_miss_original"]
    assert scored.loc[("F1", "all", 6), misses].tolist() == [True, True]
    assert scored.loc[("F8", "all", 1), "score_corrected"] == UNOBSERVABLE
    assert scored.loc[("F1", "all", 7), ["predicted_corrected", "score_original"]].tolist() == ["n/a", NOT_APPLICABLE]
    assert scored["exploratory"].all()


def test_a_cell_without_a_prediction_is_a_protocol_error() -> None:
    rows = pd.DataFrame([row("F10", "all", "own", 1)])
    with pytest.raises(ProtocolError, match="F10"):
        score(rows, MATRICES, exploratory=False)
    with pytest.raises(ProtocolError, match="original"):
        score(pd.DataFrame([row("F1", "all", "own", 1)]), {"corrected": MATRICES["corrected"]}, exploratory=False)


def scored_frame() -> pd.DataFrame:
    rows = []
    for layer in ("L0", "L1"):
        rows += [
            row("F6", "all", "own", 2, fired=True, layer=layer),
            row("F6", "all", "own", 5, applicable=False, layer=layer),
            row("F9", "all", "pow2", 6, applicable=False, layer=layer, max_ulp=300),
            row("F9", "all", "pow2", 5, fired=True, layer=layer, max_ulp=300),
            row("F4", "one", "own", 6, fired=False, layer=layer),
            row("F4", "one", "pow2", 5, fired=layer == "L0", changed=1 if layer == "L0" else 0, layer=layer),
            row("F1", "all", "own", 6, fired=layer == "L1", layer=layer, max_ulp=2 if layer == "L1" else 1),
            row("F8", "all", "own", 6, changed=0, layer=layer, max_ulp=0),
        ]
    return cells_table(score(pd.DataFrame(rows), MATRICES, exploratory=False))


def test_scorecard_counts_rates_and_denominators() -> None:
    scores = definition_scores(scored_frame(), [STATED], MATRICES, ulp_tolerance=1)
    card = scorecard(scores).set_index(["matrix", "check"])
    six = card.loc[("corrected", 6)]
    # F4-one x6 TN (2), F1 x6: L0 TN, L1 FP; F8 unobservable (2); F9 x6 not applicable (2).
    assert (six.tp, six.fn, six.fp, six.tn) == (0, 0, 1, 3)
    assert six.false_positive_denominator == 4 and six.false_positive_rate == pytest.approx(0.25)
    assert six.detection_denominator == 0 and six.detection_rate is None
    assert (six.excluded_unobservable, six.not_applicable) == (2, 2)
    assert six.predicted_misses_silent == 3  # F1 x6 (L0) and F4 x6 (both layers) are predicted misses
    five_c, five_o = card.loc[("corrected", 5)], card.loc[("original", 5)]
    # F9-all x5 fires in both layers (TP under both); F4-pow2 x5: L0 fired, L1 unobservable.
    assert (five_c.tp, five_c.fp, five_c.excluded_unobservable) == (3, 0, 1)
    assert (five_o.tp, five_o.fp, five_o.false_positive_rate) == (2, 1, 1.0)
    assert card.loc[("corrected", 2)].detection_rate == 1.0


def test_detection_splits_f4_by_regime_and_lists_the_checks_that_fired() -> None:
    table = detection(scored_frame()).drop(columns="definition").set_index(["fault", "regime"])
    assert set(table.index) == {("F1", "both"), ("F4", "own"), ("F4", "pow2"), ("F6", "both"), ("F8", "both"),
                                ("F9", "both")}
    assert table.loc[("F4", "pow2")].tolist() == [2, 1, 1, "5"]
    assert table.loc[("F4", "own")].tolist() == [2, 2, 0, ""]
    assert table.loc[("F1", "both")].tolist() == [2, 2, 1, "6"]
    assert table.loc[("F9", "both")].tolist() == [2, 2, 2, "5"]
    assert table.loc[("F8", "both")].tolist() == [2, 0, 0, ""]


def test_ulp_distribution_counts_cells_once() -> None:
    dist = ulp_distribution(scored_frame()).set_index(["fault", "regime", "max_ulp"])
    assert dist.loc[("F1", "own", 1)].tolist() == [1, 1]
    assert dist.loc[("F1", "own", 2)].tolist() == [1, 1]
    assert dist.loc[("F9", "pow2", 300)].tolist() == [2, 2]
    assert dist.loc[("F8", "own", 0)].tolist() == [2, 0]
    assert dist["cells"].sum() == 12  # 6 cells x 2 layers


def test_cells_table_uses_nulls_not_nans() -> None:
    table = scored_frame()
    assert table.loc[~table["applicable"], "fired"].map(lambda v: v is None).all()
    frame = score(pd.DataFrame([row("F9", "all", "own", 6, max_ulp=None)]), MATRICES, exploratory=False)
    assert cells_table(frame)["max_ulp"].tolist() == [None]

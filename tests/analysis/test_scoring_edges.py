"""Scoring (and the definitions it reads) on constructed cells: the reading rule's whole truth
table (one cell at a time and over columns), check 6 read in both regimes where a cell has
non-finite elements or no finite pair, and how many matrices a definition takes."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from int8alibi.protocol import definitions
from int8alibi.analysis import scoring
from int8alibi.errors import ProtocolError

# The reading rule: not observable -> excluded; prediction n/a or check not applicable -> n/a;
# otherwise fire/silent against the verdict.
TRUTH = {
    ("fire", True): "TP", ("fire", False): "FN", ("silent", True): "FP", ("silent", False): "TN",
}


@pytest.mark.parametrize(("prediction", "observable", "applicable", "fired", "expected"), [
    *[(p, True, True, f, TRUTH[(p, f)]) for p, f in TRUTH],
    *[(p, False, a, f, "excluded-unobservable") for p in ("fire", "silent", "n/a") for a in (True, False)
      for f in (True, False, None)],
    *[("n/a", True, a, f, "not-applicable") for a in (True, False) for f in (True, False, None)],
    *[(p, True, False, f, "not-applicable") for p in ("fire", "silent") for f in (True, False, None)],
])
def test_the_reading_rule_cell_by_cell(prediction: str, observable: bool, applicable: bool, fired: bool | None,
                                       expected: str) -> None:
    assert scoring.outcome(prediction, observable, applicable, fired) == expected


@pytest.mark.parametrize(("prediction", "fired"), [("fire", None), ("silent", None), ("maybe", True)])
def test_an_applicable_observable_check_needs_a_verdict_and_a_known_prediction(prediction: str,
                                                                               fired: bool | None) -> None:
    with pytest.raises(ProtocolError, match="cannot score"):
        scoring.outcome(prediction, True, True, fired)


def _every_valid_combination() -> pd.DataFrame:
    rows = [(p, o, a, f) for p, o, a, f in itertools.product(("fire", "silent", "n/a"), (True, False), (True, False),
                                                              (True, False, None))
            if not (o and a and p != "n/a" and f is None)]
    return pd.DataFrame(rows, columns=["prediction", "observable", "applicable", "fired"])


def test_scoring_whole_columns_agrees_with_the_rule_row_by_row() -> None:
    table = _every_valid_combination()
    expected = [TRUTH[(p, bool(f))] if o and a and p != "n/a" else
                ("excluded-unobservable" if not o else "not-applicable")
                for p, o, a, f in table.itertuples(index=False)]
    fired = table["fired"].astype(object)
    assert list(scoring.outcomes(table["prediction"], table["observable"], table["applicable"], fired)) == expected
    assert [scoring.outcome(*row) for row in table.itertuples(index=False)] == expected


def test_outcomes_refuses_an_applicable_check_without_verdict_and_unknown_predictions() -> None:
    with pytest.raises(ProtocolError, match="without a verdict"):
        scoring.outcomes(pd.Series(["fire", "silent"]), pd.Series([True, True]), pd.Series([True, True]),
                         pd.Series([True, None], dtype=object))
    with pytest.raises(ProtocolError, match=r"cannot score predictions \['maybe'\]"):
        scoring.outcomes(pd.Series(["maybe"]), pd.Series([True]), pd.Series([True]), pd.Series([True]))
    # an unknown prediction is refused even where nothing would be scored: the matrix itself is wrong
    for observable, applicable in ((False, True), (True, False)):
        with pytest.raises(ProtocolError, match=r"cannot score predictions \['maybe'\]"):
            scoring.outcome("maybe", observable, applicable, None)
    # a missing verdict where nothing is scored is no problem
    assert list(scoring.outcomes(pd.Series(["fire", "n/a"]), pd.Series([False, True]), pd.Series([True, True]),
                                 pd.Series([None, None], dtype=object))) == ["excluded-unobservable", "not-applicable"]


# ------------------------------------------------------------------ check 6 read in both regimes

BOTH = definitions.Definition("both", ("corrected", "original"), definitions.COUNT_OUTPUT,
                              definitions.CHECK6_BOTH_REGIMES)


def _cells(rows: list[dict]) -> pd.DataFrame:
    base = {"layer": "l0", "fault": "F4", "severity": "all", "observable": True}
    frame = pd.DataFrame([{**base, "regime": f"r{i}", **row} for i, row in enumerate(rows)])
    frame["fired"] = frame["fired"].astype(object)
    return frame


def test_check_6_is_read_off_the_largest_finite_ulp_only_where_every_element_is_finite() -> None:
    cells = _cells([
        {"check": 6, "applicable": False, "fired": None, "max_ulp": 2.0, "nonfinite": 0},    # read: 2 > 1 fires
        {"check": 6, "applicable": False, "fired": None, "max_ulp": 1.0, "nonfinite": 0},    # read: 1 is within
        {"check": 6, "applicable": False, "fired": None, "max_ulp": 0.0, "nonfinite": 0},
        {"check": 6, "applicable": False, "fired": None, "max_ulp": 0.0, "nonfinite": 3},    # non-finite: stays n/a
        {"check": 6, "applicable": False, "fired": None, "max_ulp": 7.0, "nonfinite": 1},
        {"check": 6, "applicable": False, "fired": None, "max_ulp": np.nan, "nonfinite": 0},  # no finite pair
        {"check": 5, "applicable": False, "fired": None, "max_ulp": 9.0, "nonfinite": 0},    # another check: kept
        {"check": 6, "applicable": True, "fired": False, "max_ulp": 9.0, "nonfinite": 0},    # applied: kept
    ])
    view = scoring.viewed(cells, BOTH, ulp_tolerance=1)
    assert view["applicable"].tolist() == [True, True, True, False, False, False, False, True]
    assert view["fired"].tolist()[:3] == [True, False, False]
    assert [v is None for v in view["fired"].tolist()[3:7]] == [True] * 4
    assert view["hit"].tolist() == [True, False, False, False, False, False, False, False]
    # with a tolerance of 2 the first is within it too
    assert scoring.viewed(cells, BOTH, ulp_tolerance=2)["fired"].tolist()[:3] == [False, False, False]
    # the stated reading leaves every row as recorded
    stated = scoring.viewed(cells, definitions.STATED, ulp_tolerance=1)
    assert stated["applicable"].tolist() == cells["applicable"].tolist()
    assert stated["counted"].tolist() == [True] * len(cells)


def test_counting_operand_changes_counts_cells_whose_check_1_fired() -> None:
    definition = definitions.Definition("ops", ("corrected", "original"), definitions.COUNT_OUTPUT_OR_OPERANDS,
                                        definitions.CHECK6_REAL_SCALES)
    rows = []
    for regime, observable, check1 in (("a", False, True), ("b", False, False), ("c", True, False), ("d", False, None)):
        for check in (1, 2):
            rows.append({"layer": "l0", "fault": "F9", "severity": "one", "regime": regime, "check": check,
                         "observable": observable, "applicable": True, "fired": check1 if check == 1 else False,
                         "max_ulp": 0.0, "nonfinite": 0})
    cells = pd.DataFrame(rows)
    cells["fired"] = cells["fired"].astype(object)
    view = scoring.viewed(cells, definition, ulp_tolerance=1)
    assert view["counted"].tolist() == [True, True, False, False, True, True, False, False]


# ------------------------------------------------------------------ definitions


@pytest.mark.parametrize("matrices", [["corrected"], ["corrected", "original", "reverted"], [],
                                      ["corrected", "mine"]])
def test_a_definition_takes_exactly_two_known_matrices(matrices: list[str]) -> None:
    entry = {"matrices": matrices, "counted": definitions.COUNT_OUTPUT, "check_6": definitions.CHECK6_REAL_SCALES}
    with pytest.raises(ProtocolError, match=r"paper\.yaml: definition 'd' names matrices"):
        definitions.Definition.from_protocol("d", entry)


def test_a_definition_of_two_known_matrices_and_implemented_readings_reads() -> None:
    for pair in (["corrected", "original"], ["original", "reverted"], ["reverted", "corrected"]):
        for counted in (definitions.COUNT_OUTPUT, definitions.COUNT_OUTPUT_OR_OPERANDS):
            for check6 in (definitions.CHECK6_REAL_SCALES, definitions.CHECK6_BOTH_REGIMES):
                entry = {"matrices": pair, "counted": counted, "check_6": check6}
                d = definitions.Definition.from_protocol("d", entry)
                assert (d.matrices, d.counted, d.check6) == (tuple(pair), counted, check6)
    for key, value in (("counted", "everything"), ("check_6", "never")):
        entry = {"matrices": ["corrected", "original"], "counted": definitions.COUNT_OUTPUT,
                 "check_6": definitions.CHECK6_REAL_SCALES, key: value}
        with pytest.raises(ProtocolError, match=f"{key} '{value}' is not implemented"):
            definitions.Definition.from_protocol("d", entry)


def test_the_stated_rule_is_what_the_protocol_states() -> None:
    """analysis.yaml's reading rule: the corrected and the original matrix, output changes counted,
    check 6 read only where it applies; paper.yaml's ``stated`` entry says the same."""
    from pathlib import Path

    from int8alibi import strict_yaml

    assert definitions.STATED == definitions.Definition("stated", ("corrected", "original"),
                                                        definitions.COUNT_OUTPUT, definitions.CHECK6_REAL_SCALES)
    paper = strict_yaml.read(Path(__file__).resolve().parents[2] / "preregistration" / "paper.yaml")
    assert definitions.Definition.from_protocol("stated", paper["definitions"]["stated"]) == definitions.STATED

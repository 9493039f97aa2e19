"""Scoring the campaign against the prediction matrices, and the tables built from the scores.

The reading rule (analysis.yaml): per cell x check and per matrix, an unobservable cell (its
fault changed no output element) is ``excluded-unobservable``; a prediction of n/a or a check
that reports itself not applicable is ``not-applicable``; otherwise predicted fire & fired = TP,
fire & silent = FN, silent & fired = FP, silent & silent = TN. Rates use only TP/FN/FP/TN, so
unobservable and not-applicable cells enter no denominator; they are counted separately.

That rule is the ``stated`` definition. arXiv:2609.00363's figures follow from a second, registered
definition (``paper``, see ``Definition``); the scorecard, detection, flips and totals tables carry
a ``definition`` key so both are computed from the same cells table and shown side by side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ..protocol.definitions import CHECK6_BOTH_REGIMES, COUNT_OUTPUT, STATED, Definition
from ..errors import ProtocolError

OUTCOMES = ("TP", "FN", "FP", "TN")
UNOBSERVABLE = "excluded-unobservable"
NOT_APPLICABLE = "not-applicable"
CELL_KEY = ["layer", "fault", "severity", "regime"]

CELLS_SCHEMA = pa.schema([
    pa.field("layer", pa.string(), nullable=False),
    pa.field("block", pa.int32(), nullable=False),
    pa.field("proj", pa.string(), nullable=False),
    pa.field("fault", pa.string(), nullable=False),
    pa.field("severity", pa.string(), nullable=False),
    pa.field("regime", pa.string(), nullable=False),
    pa.field("check", pa.int32(), nullable=False),
    pa.field("changed_elements", pa.int64(), nullable=False),
    pa.field("observable", pa.bool_(), nullable=False),
    pa.field("max_ulp", pa.int64(), nullable=True),
    pa.field("nonfinite", pa.int64(), nullable=False),
    pa.field("k_effective", pa.int64(), nullable=False),
    pa.field("tile_repeats", pa.int64(), nullable=False),
    pa.field("f7_boost", pa.bool_(), nullable=False),
    pa.field("applicable", pa.bool_(), nullable=False),
    pa.field("fired", pa.bool_(), nullable=True),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("predicted_corrected", pa.string(), nullable=False),
    pa.field("predicted_original", pa.string(), nullable=False),
    pa.field("predicted_miss_corrected", pa.bool_(), nullable=False),
    pa.field("predicted_miss_original", pa.bool_(), nullable=False),
    pa.field("score_corrected", pa.string(), nullable=False),
    pa.field("score_original", pa.string(), nullable=False),
    pa.field("exploratory", pa.bool_(), nullable=False),
])
CELLS_KEY = [*CELL_KEY, "check"]

SCORECARD_SCHEMA = pa.schema([
    pa.field("definition", pa.string(), nullable=False),
    pa.field("matrix", pa.string(), nullable=False),
    pa.field("check", pa.int32(), nullable=False),
    pa.field("tp", pa.int64(), nullable=False),
    pa.field("fn", pa.int64(), nullable=False),
    pa.field("fp", pa.int64(), nullable=False),
    pa.field("tn", pa.int64(), nullable=False),
    pa.field("detection_denominator", pa.int64(), nullable=False),
    pa.field("detection_rate", pa.float64(), nullable=True),
    pa.field("false_positive_denominator", pa.int64(), nullable=False),
    pa.field("false_positive_rate", pa.float64(), nullable=True),
    pa.field("excluded_unobservable", pa.int64(), nullable=False),
    pa.field("not_applicable", pa.int64(), nullable=False),
    pa.field("predicted_misses_silent", pa.int64(), nullable=False),
])
SCORECARD_KEY = ["definition", "matrix", "check"]

DETECTION_SCHEMA = pa.schema([
    pa.field("definition", pa.string(), nullable=False),
    pa.field("fault", pa.string(), nullable=False),
    pa.field("regime", pa.string(), nullable=False),
    pa.field("cells", pa.int64(), nullable=False),
    pa.field("observable", pa.int64(), nullable=False),
    pa.field("detected", pa.int64(), nullable=False),
    pa.field("detected_by", pa.string(), nullable=False),
])
DETECTION_KEY = ["definition", "fault", "regime"]

ULP_SCHEMA = pa.schema([
    pa.field("fault", pa.string(), nullable=False),
    pa.field("regime", pa.string(), nullable=False),
    pa.field("max_ulp", pa.int64(), nullable=True),
    pa.field("cells", pa.int64(), nullable=False),
    pa.field("observable_cells", pa.int64(), nullable=False),
])
ULP_KEY = ["fault", "regime", "max_ulp"]

# Regimes are pooled in the detection table except for F4, the one fault whose predicted
# detection differs by regime (check 5 applies only under power-of-two scales).
SPLIT_BY_REGIME = ("F4",)
POOLED = "both"


PREDICTIONS = ("fire", "silent", "n/a")


def outcomes(prediction: pd.Series, counted: pd.Series, applicable: pd.Series, fired: pd.Series) -> np.ndarray:
    """The reading rule above over whole columns (a campaign scores 57,624 rows per matrix).

    Refuses any prediction outside fire/silent/n/a, wherever it stands, and a counted, applicable
    check predicted fire or silent without a verdict.
    """
    pred = prediction.to_numpy(dtype=object)
    if not set(pred) <= set(PREDICTIONS):
        raise ProtocolError(f"cannot score predictions {sorted(set(pred) - set(PREDICTIONS))}")
    verdict = fired.map(lambda v: None if v is None or pd.isna(v) else bool(v)).to_numpy(dtype=object)
    counted_, applicable_ = counted.to_numpy(dtype=bool), applicable.to_numpy(dtype=bool)
    scored = counted_ & applicable_ & (pred != "n/a")
    if any(v is None for v in verdict[scored]):
        raise ProtocolError("cannot score an applicable check without a verdict")
    fired_ = np.array([bool(v) for v in verdict], dtype=bool) if len(verdict) else np.zeros(0, dtype=bool)
    table = np.where(pred == "fire", np.where(fired_, "TP", "FN"), np.where(fired_, "FP", "TN"))
    return np.where(~counted_, UNOBSERVABLE, np.where(scored, table, NOT_APPLICABLE)).astype(object)


def outcome(prediction: str, counted: bool, applicable: bool, fired: bool | None) -> str:
    """``outcomes`` of one cell x check (the token-level check 7 scores its cells one at a time)."""
    return str(outcomes(pd.Series([prediction], dtype=object), pd.Series([counted]), pd.Series([applicable]),
                        pd.Series([fired], dtype=object))[0])


def with_predictions(view: pd.DataFrame, matrix: pd.DataFrame, name: str) -> pd.DataFrame:
    """``view`` (``viewed``) joined with matrix ``name``: each row's ``prediction``, ``predicted_miss``
    and ``score``. A cell x check without exactly one prediction is a protocol error."""
    m = matrix[["fault", "severity", "check", "prediction", "predicted_miss"]]
    if m.duplicated(["fault", "severity", "check"]).any():
        raise ProtocolError(f"prediction matrix {name!r} has more than one row for some (fault, severity, check)")
    joined = view.merge(m, on=["fault", "severity", "check"], how="left", validate="many_to_one")
    if joined["prediction"].isna().any():
        first = joined[joined["prediction"].isna()].iloc[0]
        raise ProtocolError(f"prediction matrix {name!r} has no prediction for {first['fault']} "
                            f"{first['severity']} check {first['check']}")
    joined["predicted_miss"] = joined["predicted_miss"].astype(bool)
    joined["score"] = outcomes(joined["prediction"], joined["counted"], joined["applicable"], joined["fired"])
    return joined


def score(rows: pd.DataFrame, matrices: Mapping[str, pd.DataFrame], exploratory: bool) -> pd.DataFrame:
    """The campaign's rows with their predictions and scores under both matrices (the cells table's
    ``predicted_*``, ``predicted_miss_*`` and ``score_*`` columns): the stated definition's rows of
    ``definition_scores``, the path the scorecard is counted from.

    ``matrices`` maps "corrected"/"original" to ``Protocol.matrix(...)`` frames (one row per
    fault, severity, check).
    """
    stated = definition_scores(rows, [STATED], matrices, ulp_tolerance=None)
    out = rows.copy()
    for name in STATED.matrices:
        part = stated[stated["matrix"] == name]
        for column in ("prediction", "predicted_miss", "score"):
            target = column.replace("prediction", "predicted")
            out[f"{target}_{name}"] = part[column].to_numpy()
    out["exploratory"] = exploratory
    return out


def _nullable_int(series: pd.Series) -> list[int | None]:
    return [None if pd.isna(v) else int(v) for v in series]


def cells_table(scored: pd.DataFrame) -> pd.DataFrame:
    """The cells table in schema order, with None (not NaN) for missing verdicts and ulps."""
    table = scored[[f.name for f in CELLS_SCHEMA]].copy()
    table["max_ulp"] = pd.Series(_nullable_int(table["max_ulp"]), dtype=object, index=table.index)
    table["fired"] = pd.Series([None if pd.isna(v) else bool(v) for v in table["fired"]], dtype=object,
                               index=table.index)
    return table


def reverted_matrix(corrected: pd.DataFrame) -> pd.DataFrame:
    """The corrected matrix with exactly its post-data corrections undone (arXiv:2609.00363's "original")."""
    out = corrected.copy()
    flagged = out["corrected_post_data"].astype(bool)
    if out.loc[flagged, "original_prediction"].isna().any():
        raise ProtocolError("corrected matrix: a post-data correction has no original prediction")
    out.loc[flagged, "prediction"] = out.loc[flagged, "original_prediction"]
    out.loc[flagged, "predicted_miss"] = False
    return out


def viewed(cells: pd.DataFrame, definition: Definition, ulp_tolerance: int | None) -> pd.DataFrame:
    """The cells table as ``definition`` reads it: ``counted``, ``applicable``/``fired`` (check 6 read
    in both regimes where it says so, against ``ulp_tolerance``) and ``hit`` (an applicable check fired)."""
    out = cells.copy()
    fired = out["fired"].astype(object)
    applicable = out["applicable"].astype(bool).copy()
    if definition.counted == COUNT_OUTPUT:
        counted = out["observable"].astype(bool)
    else:
        one = out[out["check"] == 1].set_index(CELL_KEY)["fired"]
        changed = one.map(lambda v: bool(v) if v is not None and not pd.isna(v) else False)
        operands = pd.MultiIndex.from_frame(out[CELL_KEY]).map(changed.to_dict())
        counted = out["observable"].astype(bool) | pd.Series(operands, index=out.index).fillna(False).astype(bool)
    if definition.check6 == CHECK6_BOTH_REGIMES:
        if ulp_tolerance is None:
            raise ProtocolError(f"definition {definition.name!r} reads check 6 in both regimes: it needs the ulp tolerance")
        # Check 6's verdict where it does not apply (every scale a power of two), read off the recorded
        # max finite ulp; with a non-finite element the finiteness test is not recorded: stays n/a.
        ulp = pd.to_numeric(out["max_ulp"], errors="coerce")
        readable = (out["check"] == 6) & ~applicable & (out["nonfinite"] == 0) & ulp.notna()
        applicable[readable] = True
        fired[readable] = [bool(u > ulp_tolerance) for u in ulp[readable]]
    out["counted"] = counted.to_numpy()
    out["applicable"] = applicable
    out["fired"] = fired
    out["hit"] = applicable & fired.map(lambda v: bool(v) if v is not None and not pd.isna(v) else False)
    return out


def definition_scores(cells: pd.DataFrame, definitions: Sequence[Definition], matrices: Mapping[str, pd.DataFrame],
                      ulp_tolerance: int | None) -> pd.DataFrame:
    """One row per definition x its matrix x cell x check: prediction, predicted miss, counted, hit, score."""
    frames = []
    for definition in definitions:
        view = viewed(cells, definition, ulp_tolerance)
        for name in definition.matrices:
            if name not in matrices:
                raise ProtocolError(f"definition {definition.name!r} needs the {name!r} prediction matrix")
            joined = with_predictions(view, matrices[name], name)
            joined["definition"], joined["matrix"] = definition.name, name
            frames.append(joined[["definition", "matrix", *CELLS_KEY, "prediction", "predicted_miss", "counted",
                                  "applicable", "hit", "score"]])
    return pd.concat(frames, ignore_index=True)


def _rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def scorecard(scores: pd.DataFrame) -> pd.DataFrame:
    """Per definition x matrix x check (from ``definition_scores``): TP/FN/FP/TN, detection and
    false-positive rates with denominators, cells not counted, cells not applicable, and predicted
    misses that stayed silent."""
    records: list[dict[str, Any]] = []
    for (definition, matrix, check), group in scores.groupby(["definition", "matrix", "check"], sort=True):
        counts = group["score"].value_counts()
        tp, fn, fp, tn = (int(counts.get(k, 0)) for k in OUTCOMES)
        misses = group[group["predicted_miss"].astype(bool) & (group["score"] == "TN")]
        records.append({
            "definition": definition, "matrix": matrix, "check": int(check), "tp": tp, "fn": fn, "fp": fp,
            "tn": tn, "detection_denominator": tp + fn, "detection_rate": _rate(tp, tp + fn),
            "false_positive_denominator": fp + tn, "false_positive_rate": _rate(fp, fp + tn),
            "excluded_unobservable": int(counts.get(UNOBSERVABLE, 0)),
            "not_applicable": int(counts.get(NOT_APPLICABLE, 0)),
            "predicted_misses_silent": len(misses),
        })
    frame = pd.DataFrame.from_records(records)
    for column in ("detection_rate", "false_positive_rate"):  # None (a null), never NaN, when undefined
        frame[column] = pd.Series([r[column] for r in records], dtype=object, index=frame.index)
    return frame


def _one_matrix(scores: pd.DataFrame) -> pd.DataFrame:
    """Per definition, the rows of its first matrix (counted and hit do not depend on the matrix)."""
    first = scores.groupby("definition", sort=False)["matrix"].transform("first")
    return scores[scores["matrix"] == first]


def detection(scores: pd.DataFrame) -> pd.DataFrame:
    """Per definition and fault (F4 per regime): cells, counted cells, counted cells where any
    applicable check fired, and which checks fired on some counted cell (comma-separated). A plain
    cells table (no ``definition`` column) is read under the stated rule."""
    if "definition" not in scores:
        scores = viewed(scores, STATED, ulp_tolerance=None).assign(definition=STATED.name, matrix=STATED.matrices[0])
    frame = _one_matrix(scores)
    regimes = [r if f in SPLIT_BY_REGIME else POOLED for f, r in zip(frame["fault"], frame["regime"])]
    frame = frame.assign(group_regime=regimes)
    records = []
    for (definition, fault, regime), group in frame.groupby(["definition", "fault", "group_regime"], sort=True):
        per_cell = group.groupby(CELL_KEY, sort=True).agg(counted=("counted", "first"), hit=("hit", "any"))
        counted = group[group["counted"]]
        checks = sorted({int(c) for c in counted.loc[counted["hit"], "check"]})
        records.append({
            "definition": definition, "fault": fault, "regime": regime, "cells": len(per_cell),
            "observable": int(per_cell["counted"].sum()),
            "detected": int((per_cell["counted"] & per_cell["hit"]).sum()),
            "detected_by": ",".join(str(c) for c in checks),
        })
    return pd.DataFrame.from_records(records)


FLIPS_SCHEMA = pa.schema([
    pa.field("definition", pa.string(), nullable=False),
    pa.field("fault", pa.string(), nullable=False),
    pa.field("severity", pa.string(), nullable=False),
    pa.field("check", pa.int32(), nullable=False),
    pa.field("matrix_a", pa.string(), nullable=False),
    pa.field("prediction_a", pa.string(), nullable=False),
    pa.field("matrix_b", pa.string(), nullable=False),
    pa.field("prediction_b", pa.string(), nullable=False),
    pa.field("rows", pa.int64(), nullable=False),
    pa.field("flipped", pa.int64(), nullable=False),
])
FLIPS_KEY = ["definition", "fault", "severity", "check"]


def _paired(scores: pd.DataFrame) -> pd.DataFrame:
    """Per definition, each cell x check with its prediction and score under both of its matrices."""
    parts = []
    for definition, group in scores.groupby("definition", sort=True):
        names = list(dict.fromkeys(group["matrix"]))
        a, b = (group.loc[group["matrix"] == n, [*CELLS_KEY, "prediction", "score"]] for n in names)
        pair = a.merge(b, on=CELLS_KEY, suffixes=("_a", "_b"), validate="one_to_one")
        parts.append(pair.assign(definition=definition, matrix_a=names[0], matrix_b=names[1]))
    return pd.concat(parts, ignore_index=True)


def flips(scores: pd.DataFrame) -> pd.DataFrame:
    """Per definition, every (fault, severity, check) whose prediction differs between its two
    matrices: how many cell rows it covers and how many of them change score."""
    pair = _paired(scores)
    pair = pair[pair["prediction_a"] != pair["prediction_b"]]
    records = []
    keys = ["definition", "fault", "severity", "check", "matrix_a", "prediction_a", "matrix_b", "prediction_b"]
    for key, group in pair.groupby(keys, sort=True):
        records.append({**dict(zip(keys, key)), "check": int(key[3]), "rows": len(group),
                        "flipped": int((group["score_a"] != group["score_b"]).sum())})
    return pd.DataFrame.from_records(records, columns=FLIPS_SCHEMA.names)


TOTALS_SCHEMA = pa.schema([
    pa.field("definition", pa.string(), nullable=False),
    pa.field("matrix", pa.string(), nullable=False),
    pa.field("quantity", pa.string(), nullable=False),
    pa.field("value", pa.int64(), nullable=False),
])
TOTALS_KEY = ["definition", "matrix", "quantity"]
BOTH = "both"  # a quantity that does not depend on the matrix
EPILOGUE = ("F1", "F2", "F3", "F4", "F5")


def totals(scores: pd.DataFrame) -> pd.DataFrame:
    """Per definition: cells, counted cells, undetected counted epilogue cells and cells whose score
    changes between the two matrices; per matrix: TP, FN, FP, TN over every check."""
    records = []
    pair = _paired(scores)
    for definition, group in _one_matrix(scores).groupby("definition", sort=True):
        per_cell = group.groupby(CELL_KEY, sort=True).agg(counted=("counted", "first"), hit=("hit", "any"))
        faults = per_cell.index.get_level_values("fault")
        flipped = pair[(pair["definition"] == definition) & (pair["score_a"] != pair["score_b"])]
        for quantity, value in (("cells", len(per_cell)), ("counted_cells", int(per_cell["counted"].sum())),
                                ("undetected_epilogue_cells",
                                 int((per_cell["counted"] & ~per_cell["hit"] & faults.isin(EPILOGUE)).sum())),
                                ("cells_flipped", len(flipped.drop_duplicates(CELL_KEY)))):
            records.append({"definition": definition, "matrix": BOTH, "quantity": quantity, "value": value})
    for (definition, matrix), group in scores.groupby(["definition", "matrix"], sort=True):
        counts = group["score"].value_counts()
        for outcome_ in OUTCOMES:
            records.append({"definition": definition, "matrix": matrix, "quantity": outcome_.lower(),
                            "value": int(counts.get(outcome_, 0))})
    return pd.DataFrame.from_records(records)


def ulp_distribution(cells: pd.DataFrame) -> pd.DataFrame:
    """Histogram of cells' max finite ulp per fault and regime (null: no finite pair)."""
    per_cell = cells.drop_duplicates(CELL_KEY)
    records = []
    for (fault, regime), group in per_cell.groupby(["fault", "regime"], sort=True):
        values = group["max_ulp"].astype("Int64")
        for value in sorted(values.dropna().unique().tolist()) + ([None] if values.isna().any() else []):
            hit = values.isna() if value is None else (values == value).fillna(False)
            records.append({
                "fault": fault, "regime": regime, "max_ulp": None if value is None else int(value),
                "cells": int(hit.sum()), "observable_cells": int((hit & group["observable"]).sum()),
            })
    frame = pd.DataFrame.from_records(records)
    frame["max_ulp"] = pd.Series([r["max_ulp"] for r in records], dtype=object, index=frame.index)
    return frame

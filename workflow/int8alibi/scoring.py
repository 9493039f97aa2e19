"""Scoring the campaign against the prediction matrices, and the tables built from the scores.

The reading rule (analysis.yaml): per cell x check and per matrix, an unobservable cell (its
fault changed no output element) is ``excluded-unobservable``; a prediction of n/a or a check
that reports itself not applicable is ``not-applicable``; otherwise predicted fire & fired = TP,
fire & silent = FN, silent & fired = FP, silent & silent = TN. Rates use only TP/FN/FP/TN, so
unobservable and not-applicable cells enter no denominator; they are counted separately.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa

from .errors import ProtocolError

MATRICES = ("corrected", "original")
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
SCORECARD_KEY = ["matrix", "check"]

DETECTION_SCHEMA = pa.schema([
    pa.field("fault", pa.string(), nullable=False),
    pa.field("regime", pa.string(), nullable=False),
    pa.field("cells", pa.int64(), nullable=False),
    pa.field("observable", pa.int64(), nullable=False),
    pa.field("detected", pa.int64(), nullable=False),
    pa.field("detected_by", pa.string(), nullable=False),
])
DETECTION_KEY = ["fault", "regime"]

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


def outcome(prediction: str, observable: bool, applicable: bool, fired: bool | None) -> str:
    """The score of one cell x check under one matrix (the reading rule above)."""
    if not observable:
        return UNOBSERVABLE
    if prediction == "n/a" or not applicable:
        return NOT_APPLICABLE
    if prediction not in ("fire", "silent") or fired is None:
        raise ProtocolError(f"cannot score prediction {prediction!r} with verdict {fired!r}")
    if prediction == "fire":
        return "TP" if fired else "FN"
    return "FP" if fired else "TN"


def score(rows: pd.DataFrame, matrices: dict[str, pd.DataFrame], exploratory: bool) -> pd.DataFrame:
    """Join each cell x check with its prediction under both matrices and score it.

    ``matrices`` maps "corrected"/"original" to ``Protocol.matrix(...)`` frames (one row per
    fault, severity, check). A cell x check without exactly one prediction is a protocol error.
    """
    out = rows.copy()
    for name in MATRICES:
        if name not in matrices:
            raise ProtocolError(f"scoring needs the {name!r} prediction matrix")
        m = matrices[name][["fault", "severity", "check", "prediction", "predicted_miss"]]
        m = m.rename(columns={"prediction": f"predicted_{name}", "predicted_miss": f"predicted_miss_{name}"})
        if m.duplicated(["fault", "severity", "check"]).any():
            raise ProtocolError(f"prediction matrix {name!r} has more than one row for some (fault, severity, check)")
        out = out.merge(m, on=["fault", "severity", "check"], how="left", validate="many_to_one")
        missing = out[out[f"predicted_{name}"].isna()]
        if len(missing):
            first = missing.iloc[0]
            raise ProtocolError(f"prediction matrix {name!r} has no prediction for {first['fault']} "
                                f"{first['severity']} check {first['check']}")
        out[f"predicted_miss_{name}"] = out[f"predicted_miss_{name}"].astype(bool)
        out[f"score_{name}"] = [
            outcome(p, bool(o), bool(a), None if f is None or pd.isna(f) else bool(f))
            for p, o, a, f in zip(out[f"predicted_{name}"], out["observable"], out["applicable"], out["fired"])
        ]
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


def _rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def scorecard(cells: pd.DataFrame) -> pd.DataFrame:
    """Per matrix x check: TP/FN/FP/TN, detection and false-positive rates with denominators,
    cells excluded as unobservable, cells not applicable, and predicted misses that stayed silent."""
    records: list[dict[str, Any]] = []
    for name in MATRICES:
        scores = cells[f"score_{name}"]
        for check, group in cells.groupby("check", sort=True):
            counts = scores.loc[group.index].value_counts()
            tp, fn, fp, tn = (int(counts.get(k, 0)) for k in OUTCOMES)
            misses = group[group[f"predicted_miss_{name}"] & (scores.loc[group.index] == "TN")]
            records.append({
                "matrix": name, "check": int(check), "tp": tp, "fn": fn, "fp": fp, "tn": tn,
                "detection_denominator": tp + fn, "detection_rate": _rate(tp, tp + fn),
                "false_positive_denominator": fp + tn, "false_positive_rate": _rate(fp, fp + tn),
                "excluded_unobservable": int(counts.get(UNOBSERVABLE, 0)),
                "not_applicable": int(counts.get(NOT_APPLICABLE, 0)),
                "predicted_misses_silent": len(misses),
            })
    frame = pd.DataFrame.from_records(records)
    for column in ("detection_rate", "false_positive_rate"):  # None (a null), never NaN, when undefined
        frame[column] = pd.Series([r[column] for r in records], dtype=object, index=frame.index)
    return frame


def detection(cells: pd.DataFrame) -> pd.DataFrame:
    """Per fault (F4 per regime): cells, observable cells, observable cells where any applicable
    check fired, and which checks fired on some observable cell (comma-separated, ascending)."""
    regimes = [r if f in SPLIT_BY_REGIME else POOLED for f, r in zip(cells["fault"], cells["regime"])]
    frame = cells.assign(group_regime=regimes)
    frame = frame.assign(hit=frame["applicable"] & frame["fired"].fillna(False).astype(bool))
    records = []
    for (fault, regime), group in frame.groupby(["fault", "group_regime"], sort=True):
        per_cell = group.groupby(CELL_KEY, sort=True).agg(observable=("observable", "first"), hit=("hit", "any"))
        observable = group[group["observable"]]
        checks = sorted({int(c) for c in observable.loc[observable["hit"], "check"]})
        records.append({
            "fault": fault, "regime": regime, "cells": len(per_cell),
            "observable": int(per_cell["observable"].sum()),
            "detected": int((per_cell["observable"] & per_cell["hit"]).sum()),
            "detected_by": ",".join(str(c) for c in checks),
        })
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

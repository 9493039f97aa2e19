"""What the batch-invariance tables add up to, set against the registered predictions.

``by_m`` is the figure's data (the share of rows that differ, per GEMM and M). ``summary`` gives
one row per level, checkpoint and GEMM (or arm): what was compared, how much differed, and the
outcome against ``preregistration/batch.yaml``: a kind predicted identical "holds" when nothing
differs and "fails" otherwise; a kind with no registered prediction says "no prediction" and
carries its measure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import pyarrow as pa

BY_M_SCHEMA = pa.schema([
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("gemm", pa.string(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
    pa.field("m", pa.int32(), nullable=False),
    pa.field("layers", pa.int32(), nullable=False),
    pa.field("rows", pa.int64(), nullable=False),
    pa.field("rows_differing", pa.int64(), nullable=False),
    pa.field("share", pa.float64(), nullable=False),
    pa.field("max_ulp", pa.int32(), nullable=True),
])
BY_M_KEY = ["checkpoint", "gemm", "m"]

SUMMARY_SCHEMA = pa.schema([
    pa.field("level", pa.string(), nullable=False),          # layer, sequence
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("gemm", pa.string(), nullable=False),           # layer: arm or contrast; sequence: the arm
    pa.field("kind", pa.string(), nullable=False),           # int8, bf16, fp8; sequence: model
    pa.field("unit", pa.string(), nullable=False),           # rows, sequences
    pa.field("compared", pa.int64(), nullable=False),
    pa.field("differing", pa.int64(), nullable=False),
    pa.field("share", pa.float64(), nullable=False),
    pa.field("max_ulp", pa.int32(), nullable=True),          # layer level: over every M
    pa.field("worst_m", pa.int32(), nullable=True),          # layer: the M with the largest differing share
    pa.field("first_modules", pa.string(), nullable=True),   # sequence: first differing modules, by count
    pa.field("predicted_identical", pa.bool_(), nullable=True),
    pa.field("outcome", pa.string(), nullable=False),        # holds, fails, no prediction
])
SUMMARY_KEY = ["level", "checkpoint", "gemm"]


def outcome(predicted: bool | None, differing: int) -> str:
    """A registered prediction of identity holds only when nothing differs."""
    if predicted is None:
        return "no prediction"
    return "holds" if differing == 0 else "fails"


def by_m(layers: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint, GEMM and M: layers, rows compared and differing, their share, the largest ulp."""
    grouped = layers.groupby(["checkpoint", "gemm", "kind", "m"], sort=True)
    out = grouped.agg(layers=("layer", "nunique"), rows=("rows", "sum"), rows_differing=("rows_differing", "sum"),
                      max_ulp=("max_ulp", "max")).reset_index()
    out["share"] = out["rows_differing"] / out["rows"]
    out["max_ulp"] = out["max_ulp"].astype("Int32")
    return out[BY_M_SCHEMA.names].sort_values(BY_M_KEY, ignore_index=True)


def summary(layers: pd.DataFrame, sequences: pd.DataFrame, predictions: Mapping[str, Any]) -> pd.DataFrame:
    """One row per level × checkpoint × GEMM (see the module doc)."""
    rows: list[dict[str, Any]] = []
    table = by_m(layers)
    for (checkpoint, gemm, kind), part in table.groupby(["checkpoint", "gemm", "kind"], sort=True):
        compared, differing = int(part["rows"].sum()), int(part["rows_differing"].sum())
        worst = part.sort_values(["share", "m"], ascending=[False, True]).iloc[0]
        predicted = predictions[kind]["identical"]
        rows.append({"level": "layer", "checkpoint": checkpoint, "gemm": gemm, "kind": kind, "unit": "rows",
                     "compared": compared, "differing": differing, "share": differing / compared,
                     "max_ulp": None if part["max_ulp"].isna().all() else int(part["max_ulp"].max()),
                     "worst_m": int(worst["m"]) if differing else None, "first_modules": None,
                     "predicted_identical": predicted, "outcome": outcome(predicted, differing)})
    for (checkpoint, arm), part in sequences.groupby(["checkpoint", "arm"], sort=True):
        differing = int((~part["identical"]).sum())
        modules = part["module"].dropna().value_counts()
        named = sorted(modules.items(), key=lambda kv: (-kv[1], kv[0]))
        predicted = predictions["sequence"]["identical"]
        rows.append({"level": "sequence", "checkpoint": checkpoint, "gemm": arm, "kind": "model", "unit": "sequences",
                     "compared": len(part), "differing": differing, "share": differing / len(part), "max_ulp": None,
                     "worst_m": None, "first_modules": "; ".join(f"{m} ({n})" for m, n in named) or None,
                     "predicted_identical": predicted, "outcome": outcome(predicted, differing)})
    frame = pd.DataFrame(rows, columns=SUMMARY_SCHEMA.names)
    return frame.astype({"max_ulp": "Int32", "worst_m": "Int32", "predicted_identical": "boolean"})

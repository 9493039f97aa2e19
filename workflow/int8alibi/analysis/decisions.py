"""The pre-registered decision rules (analysis.yaml ``decision_rules``), evaluated on the campaign.

A decision rule that is only schema-checked decides nothing. D1 says: if no applicable check fires
on any observable cell of the epilogue faults, the suite's claim narrows. It is evaluated here from
the scored cells under each scoring definition, with its evidence: which of the rule's faults some
check caught, on how many cells, and by which checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa

from ..errors import ProtocolError

# The one condition form the registered rules use; any other wording is refused, not guessed at.
NO_CHECK_FIRES = "No applicable check fires on any observable cell of these faults."

DECISIONS_SCHEMA = pa.schema([
    pa.field("rule", pa.string(), nullable=False),
    pa.field("definition", pa.string(), nullable=False),
    pa.field("faults", pa.string(), nullable=False),
    pa.field("cells", pa.int64(), nullable=False),
    pa.field("counted_cells", pa.int64(), nullable=False),
    pa.field("caught_cells", pa.int64(), nullable=False),
    pa.field("caught_by", pa.string(), nullable=False),
    pa.field("triggered", pa.bool_(), nullable=False),
    pa.field("verdict", pa.string(), nullable=False),
    pa.field("consequence", pa.string(), nullable=False),
])
DECISIONS_KEY = ["rule", "definition"]
CELL = ["layer", "fault", "severity", "regime"]


def _normalise(text: str) -> str:
    return " ".join(text.split())


def evidence(rows: pd.DataFrame) -> str:
    """Which faults were caught, on how many counted cells, by which checks: "F4: 524 cells (check 5)"."""
    parts = []
    for fault, group in rows.groupby("fault", sort=True):
        caught = group[group["counted"] & group["hit"]]
        if caught.empty:
            continue
        cells = len(caught.drop_duplicates(CELL))
        checks = ", ".join(str(int(c)) for c in sorted(caught["check"].unique()))
        parts.append(f"{fault}: {cells} cells (check{'s' if ',' in checks else ''} {checks})")
    return "; ".join(parts) if parts else "none"


def evaluate(scores: pd.DataFrame, rules: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Each rule under each definition in ``scores`` (``scoring.definition_scores``; one matrix is
    enough, verdicts do not depend on predictions)."""
    records = []
    first = scores.groupby("definition", sort=False)["matrix"].transform("first")
    view = scores[scores["matrix"] == first]
    for rule in rules:
        if _normalise(rule["condition"]) != NO_CHECK_FIRES:
            raise ProtocolError(f"analysis.yaml: decision rule {rule['id']}: cannot evaluate condition "
                                f"{_normalise(rule['condition'])!r} (only {NO_CHECK_FIRES!r} is implemented)")
        for definition, group in view.groupby("definition", sort=True):
            rows = group[group["fault"].isin(rule["faults"])]
            if rows.empty:
                raise ProtocolError(f"decision rule {rule['id']}: no cell of faults {list(rule['faults'])} was run")
            per_cell = rows.groupby(CELL, sort=True).agg(counted=("counted", "first"), hit=("hit", "any"))
            caught = int((per_cell["counted"] & per_cell["hit"]).sum())
            triggered = caught == 0
            verdict = ("condition met: no check caught any of these faults, the claim narrows" if triggered else
                       "condition not met: a check caught some of these faults, the claim stands")
            records.append({
                "rule": rule["id"], "definition": definition, "faults": ", ".join(rule["faults"]),
                "cells": len(per_cell), "counted_cells": int(per_cell["counted"].sum()), "caught_cells": caught,
                "caught_by": evidence(rows), "triggered": triggered, "verdict": verdict,
                "consequence": _normalise(rule["consequence"]) if triggered else "none: the claim is not narrowed",
            })
    return pd.DataFrame.from_records(records, columns=DECISIONS_SCHEMA.names)

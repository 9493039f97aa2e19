"""The stage measures the report shows in more than one place, each read one way from the table the
stage wrote: the requant gate's division statistics over the own arm, a perplexity summary row
(hypothesis or gate) and a decision rule's row. The claims table and the findings both call these,
so the two can never show different numbers for one measure.
"""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

DIVISION_COLUMNS = ("f32_division_differing", "quotient_shift_max", "code_offset_max")


class DivisionSummary(NamedTuple):
    """The own arm's float32-versus-bf16 division statistics, summed and maximised over its layers."""

    differing: int  # int8 weights a float32 division would change
    weights: int
    quotient_shift_max: float
    code_offset_max: float

    @property
    def share_percent(self) -> float:
        return 100 * self.differing / self.weights


def division_summary(gate: pd.DataFrame) -> DivisionSummary | None:
    """The division statistics of requant/gate.parquet's own rows (the per-layer values requant
    wrote); None where the table has no own rows."""
    own = gate[gate["arm"] == "own"]
    if own.empty:
        return None
    return DivisionSummary(int(own["f32_division_differing"].sum()), int((own["n"] * own["k"]).sum()),
                           float(own["quotient_shift_max"].max()), float(own["code_offset_max"].max()))


def summary_row(summary: pd.DataFrame, quantity: str) -> pd.Series | None:
    """perplexity/summary.parquet's one row for ``quantity`` (``hypothesis:H1``, ``gate:G1``), or None."""
    rows = summary[summary["quantity"] == quantity]
    return rows.iloc[0] if len(rows) == 1 else None


def decision_row(decisions: pd.DataFrame, rule: str, definition: str) -> pd.Series | None:
    """faults/decisions.parquet's one row for ``rule`` under scoring ``definition``, or None."""
    rows = decisions[(decisions["rule"] == rule) & (decisions["definition"] == definition)]
    return rows.iloc[0] if len(rows) == 1 else None

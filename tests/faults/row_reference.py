"""The campaign's rows as the engines built them before ``faults.rows``: a tuple per cell x check
from ``checks.evaluate`` on each cell's evidence, and one ``DataFrame.from_records`` over all rows.

Kept here as the reference the column builder must reproduce, dtypes and bytes included.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from int8alibi.faults.checks import evaluate
from int8alibi.faults import CampaignSettings
from int8alibi.faults.campaign import _LayerRun
from int8alibi.faults.rows import ROW_COLUMNS
from int8alibi.kernels.layer_operands import Operands


def layer_rows(op: Operands, settings: CampaignSettings) -> list[tuple[Any, ...]]:
    """One tuple per cell x check of the per-cell engine's cells, in ``ROW_COLUMNS`` order."""
    rows: list[tuple[Any, ...]] = []
    identity = (op.layer, int(op.block), op.proj)
    for cell in _LayerRun(op, settings, torch.device("cpu")).cells():
        ev = cell.evidence
        common = (*identity, cell.fault, cell.severity, cell.regime, cell.changed, cell.changed > 0,
                  ev.outputs.max_finite_ulp, ev.outputs.nonfinite, max(ev.k), cell.repeats, cell.boosted)
        rows.extend((*common, r.check, r.applicable, r.fired, r.reason) for r in evaluate(ev, settings.thresholds))
    return rows


def reference_frame(layers: list[Operands], settings: CampaignSettings) -> pd.DataFrame:
    """The unscored campaign table of ``layers`` built row by row."""
    rows = [row for op in layers for row in layer_rows(op, settings)]
    return pd.DataFrame.from_records(rows, columns=list(ROW_COLUMNS))

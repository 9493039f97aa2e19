"""The campaign's row table built column by column: one row per cell x check.

A campaign has 57,624 rows (196 layers x 42 cells x 7 checks); building a tuple per row and
letting pandas infer each column from them cost more host time than the GPU spends on the whole
campaign. Here the cells of all layers are numpy columns (``CellColumns``), the checks are
decided once per distinct value of what they read (``checks.evaluate_columns``), and the table is
made from whole columns with the dtypes the rows would have been inferred to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from .checks import EvidenceColumns, Thresholds, evaluate_columns
from ..errors import InputError

CHECKS = 7
ROW_COLUMNS = ("layer", "block", "proj", "fault", "severity", "regime", "changed_elements", "observable", "max_ulp",
               "nonfinite", "k_effective", "tile_repeats", "f7_boost", "check", "applicable", "fired", "reason")


@dataclass(frozen=True)
class CellColumns:
    """Cells in row order, one array per field: the identity (object arrays of str, ``block``
    int64), what each cell measured and its evidence."""

    layer: np.ndarray
    block: np.ndarray
    proj: np.ndarray
    fault: np.ndarray
    severity: np.ndarray
    regime: np.ndarray
    changed: np.ndarray
    nonfinite: np.ndarray
    repeats: np.ndarray
    boosted: np.ndarray
    evidence: EvidenceColumns

    def __len__(self) -> int:
        return len(self.changed)

    def part(self, start: int, stop: int) -> "CellColumns":
        """Cells ``start`` to ``stop`` (views)."""
        ev = EvidenceColumns(*(getattr(self.evidence, f.name)[start:stop] for f in fields(EvidenceColumns)))
        return CellColumns(**{f.name: getattr(self, f.name)[start:stop] for f in fields(CellColumns)
                              if f.name != "evidence"}, evidence=ev)

    @classmethod
    def concat(cls, parts: Sequence["CellColumns"]) -> "CellColumns":
        """The cells of ``parts``, one after another."""
        ev = EvidenceColumns(*(np.concatenate([getattr(p.evidence, f.name) for p in parts])
                               for f in fields(EvidenceColumns)))
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)
                      if f.name != "evidence"}, evidence=ev)


def strings(value: str, count: int) -> np.ndarray:
    """An object array of ``count`` times ``value``."""
    out = np.empty(count, dtype=object)
    out[:] = value
    return out


def check_layer(layer: str, cells: int, expected: int) -> None:
    """Refuse a layer whose engine produced another number of cells than the catalogue has."""
    if cells != expected:
        raise InputError(f"layer {layer!r}: campaign produced {cells * CHECKS} rows, expected {expected * CHECKS}")


def frame(cells: CellColumns, th: Thresholds) -> pd.DataFrame:
    """The unscored row table of ``cells`` in ``ROW_COLUMNS`` order, rows cell by cell and check 1-7
    within a cell, dtypes as ``pandas.DataFrame.from_records`` infers them from the rows (the
    largest finite ulp is float64 with NaN where some cell has none, int64 otherwise)."""
    if not len(cells):
        raise InputError("fault campaign: no layers to run")
    ev = cells.evidence
    applicable, fired, reason = evaluate_columns(ev, th)

    def each(values: np.ndarray) -> np.ndarray:
        return np.repeat(values, CHECKS)

    ulp = ev.max_finite_ulp.astype(np.int64)
    max_ulp = np.where(ulp < 0, np.nan, ulp) if (ulp < 0).any() else ulp
    columns = {
        "layer": each(cells.layer), "block": each(cells.block.astype(np.int64)), "proj": each(cells.proj),
        "fault": each(cells.fault), "severity": each(cells.severity), "regime": each(cells.regime),
        "changed_elements": each(cells.changed.astype(np.int64)), "observable": each(cells.changed > 0),
        "max_ulp": each(max_ulp), "nonfinite": each(cells.nonfinite.astype(np.int64)),
        "k_effective": each(ev.k.max(1).astype(np.int64)), "tile_repeats": each(cells.repeats.astype(np.int64)),
        "f7_boost": each(cells.boosted.astype(bool)),
        "check": np.tile(np.arange(1, CHECKS + 1, dtype=np.int64), len(cells)),
        "applicable": applicable.reshape(-1), "fired": fired.reshape(-1), "reason": reason.reshape(-1),
    }
    return pd.DataFrame(columns, columns=list(ROW_COLUMNS))

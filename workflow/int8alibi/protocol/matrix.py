"""Prediction matrices: parse, verify against the fault and check catalogues, count, expand.

A registered row covers one fault, or one rung of a fault when the matrix splits it by severity.
Scoring joins campaign cells on (fault, severity, check), so `expand` gives every row to each
severity it covers: an unsplit row (F1..F8, and the original matrix's single F9 row) to every
severity its fault runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ProtocolError

if TYPE_CHECKING:  # the tables are built when asked for: verifying a matrix (the plan-time gate) needs no pandas
    import pandas as pd

PREDICTIONS = ("fire", "silent", "n/a")
SEVERITIES = ("one", "pct", "all")
COLUMNS = [
    "fault",
    "severity",
    "check",
    "prediction",
    "predicted_miss",
    "corrected_post_data",
    "original_prediction",
    "row",
]


@dataclass(frozen=True)
class FaultInfo:
    """What the matrix needs to know about a fault: its rungs and whether it is a real defect."""

    severities: tuple[str, ...]
    is_defect: bool


@dataclass(frozen=True)
class PredictionMatrix:
    """One registered matrix: one record per registered cell (row label x check), ``COLUMNS`` keys."""

    name: str
    source: str
    records: tuple[Mapping[str, Any], ...]

    @property
    def cells(self) -> pd.DataFrame:
        """The records as a table, ``COLUMNS`` in order."""
        import pandas as pd

        return pd.DataFrame.from_records(list(self.records), columns=COLUMNS)

    def counts(self) -> dict[str, int]:
        """Registered cells by prediction, and predicted misses."""
        by = Counter(r["prediction"] for r in self.records)
        return {
            "cells": len(self.records),
            **{p: by.get(p, 0) for p in PREDICTIONS},
            "predicted_miss": sum(bool(r["predicted_miss"]) for r in self.records),
        }

    def expand(self, faults: Mapping[str, FaultInfo]) -> pd.DataFrame:
        """One row per campaign (fault, severity, check), in catalogue order."""
        import pandas as pd

        parts = []
        for fault, info in faults.items():
            rows = self.cells[self.cells["fault"] == fault]
            for severity in info.severities:
                hit = rows[rows["severity"].isna() | (rows["severity"] == severity)].copy()
                hit["severity"] = severity
                parts.append(hit)
        return pd.concat(parts, ignore_index=True)[COLUMNS]


def _row_label(fault: str, severity: str | None) -> str:
    return fault if severity is None else f"{fault} {severity}"


def _check_ids(entries: Sequence[Mapping[str, Any]], n_checks: int, where: str, what: str) -> list[int]:
    ids = [int(e["check"]) for e in entries]
    if len(set(ids)) != len(ids):
        raise ProtocolError(f"{where}: {what} lists a check twice")
    bad = [i for i in ids if not 1 <= i <= n_checks]
    if bad:
        raise ProtocolError(f"{where}: {what} names check {bad[0]}, but checks.yaml defines 1..{n_checks}")
    return ids


def parse_matrix(
    data: Mapping[str, Any],
    source: str,
    faults: Mapping[str, FaultInfo],
    layer_level_na: Sequence[int],
    n_checks: int,
) -> PredictionMatrix:
    """Verify a schema-valid predictions file against the catalogues and build its cell table.

    ``layer_level_na`` are the checks that never apply at layer level: they must be predicted n/a.
    """
    records: list[dict[str, Any]] = []
    covered: dict[str, list[str | None]] = {}
    for index, row in enumerate(data["rows"]):
        fault, severity = row["fault"], row.get("severity")
        label = _row_label(fault, severity)
        where = f"{source}: row {index} ({label})"
        if fault not in faults:
            raise ProtocolError(f"{where}: fault {fault} is not in faults.yaml")
        if severity is not None and severity not in faults[fault].severities:
            raise ProtocolError(f"{where}: {fault} has no severity {severity!r} in faults.yaml")
        covered.setdefault(fault, []).append(severity)
        predictions = row["predictions"]
        if len(predictions) != n_checks:
            raise ProtocolError(f"{where}: {len(predictions)} predictions, but checks.yaml defines {n_checks} checks")
        for check in layer_level_na:
            if predictions[check - 1] != "n/a":
                raise ProtocolError(f"{where}: check {check} never applies at layer level, so it must be predicted n/a")
        misses = _check_ids(row.get("predicted_misses", []), n_checks, where, "predicted_misses")
        for check in misses:
            if predictions[check - 1] != "silent":
                raise ProtocolError(
                    f"{where}: check {check} is a predicted miss but is predicted "
                    f"{predictions[check - 1]!r}, not silent"
                )
            if not faults[fault].is_defect:
                raise ProtocolError(f"{where}: a predicted miss needs a real defect, and {fault} injects none")
        _check_ids(row.get("corrected_post_data", []), n_checks, where, "corrected_post_data")
        corrections = {c["check"]: c["original_prediction"] for c in row.get("corrected_post_data", [])}
        for check, before in corrections.items():
            if predictions[check - 1] == before:
                raise ProtocolError(
                    f"{where}: check {check} is flagged corrected_post_data but its prediction is "
                    f"unchanged ({before!r})"
                )
        for check, prediction in enumerate(predictions, start=1):
            records.append(
                {
                    "fault": fault,
                    "severity": severity,
                    "check": check,
                    "prediction": prediction,
                    "predicted_miss": check in misses,
                    "corrected_post_data": check in corrections,
                    "original_prediction": corrections.get(check),
                    "row": label,
                }
            )
    for fault, info in faults.items():
        rungs = covered.get(fault, [])
        whole = rungs == [None]
        split = sorted(str(r) for r in rungs) == sorted(info.severities)
        if not (whole or split):
            found = ["(all severities)" if r is None else r for r in rungs] or "nothing"
            raise ProtocolError(
                f"{source}: fault {fault} must have exactly one row, or exactly one row per severity "
                f"{list(info.severities)}; found rows for {found}"
            )
    matrix = PredictionMatrix(name=str(data["matrix"]), source=source, records=tuple(records))
    declared = {k: int(v) for k, v in data["counts"].items()}
    actual = matrix.counts()
    if declared != actual:
        raise ProtocolError(f"{source}: declared counts {declared} do not match the rows, which give {actual}")
    return matrix


def verify_corrections(original: PredictionMatrix, corrected: PredictionMatrix) -> None:
    """Every difference between the matrices in rows they share must be a disclosed correction.

    Rows are shared when both matrices register the same (fault, severity) row, e.g. F1..F8. There
    a flagged cell must name the registered prediction as its original, and an unflagged cell must
    equal the registered one (prediction and predicted miss alike).
    """
    registered = {(r["row"], r["check"]): r for r in original.records}
    joined = [(cell, registered[(cell["row"], cell["check"])]) for cell in corrected.records
              if (cell["row"], cell["check"]) in registered]
    for cell, before in joined:
        if cell["corrected_post_data"] and cell["original_prediction"] != before["prediction"]:
            raise ProtocolError(
                f"{corrected.source}: {cell['row']} check {cell['check']} says its original prediction was "
                f"{cell['original_prediction']!r}, but {original.source} registered {before['prediction']!r}"
            )
    for cell, before in joined:
        if not cell["corrected_post_data"] and (cell["prediction"] != before["prediction"]
                                                or cell["predicted_miss"] != before["predicted_miss"]):
            raise ProtocolError(
                f"{corrected.source}: {cell['row']} check {cell['check']} differs from {original.source} "
                f"({before['prediction']!r} -> {cell['prediction']!r}, predicted miss "
                f"{bool(before['predicted_miss'])} -> {bool(cell['predicted_miss'])}) without a "
                "corrected_post_data disclosure"
            )

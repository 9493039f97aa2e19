"""The row builder refuses an empty campaign itself (not only through run_campaign)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from int8alibi.faults.checks import EvidenceColumns, Thresholds
from int8alibi.errors import InputError
from int8alibi.faults.rows import CellColumns, frame


def test_a_table_of_no_cells_is_refused() -> None:
    evidence = EvidenceColumns(*(np.zeros((0, 2) if f.name == "k" else 0, dtype=np.int64)
                                 for f in fields(EvidenceColumns)))
    empty = CellColumns(*(np.zeros(0, dtype=object) for f in fields(CellColumns) if f.name != "evidence"),
                        evidence=evidence)
    assert len(empty) == 0
    with pytest.raises(InputError, match="fault campaign: no layers to run"):
        frame(empty, Thresholds())

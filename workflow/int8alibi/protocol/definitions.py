"""The scoring definitions paper.yaml registers, importable without pandas (the plan-time gate checks them).

The stated rule (analysis.yaml's reading rule, ``int8alibi.analysis.scoring``) is one definition.
arXiv:2609.00363's own figures (its fault campaign) follow from another (registered in
preregistration/paper.yaml): its "original" matrix is the corrected one with its post-data
corrections undone ("reverted"); check 6 is read in both scale regimes; and a cell counts when its
fault changed the output or the operands an arm received, so an operand change that leaves every
output bit alone (F9's pct rung under own scales) still enters the rates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ProtocolError

MATRICES: tuple[Literal["corrected", "original"], ...] = ("corrected", "original")

COUNT_OUTPUT = "output_changed"
COUNT_OUTPUT_OR_OPERANDS = "output_or_operands_changed"
CHECK6_REAL_SCALES = "real_scales"
CHECK6_BOTH_REGIMES = "both_regimes"
REVERTED = "reverted"
ALL_MATRICES = (*MATRICES, REVERTED)


@dataclass(frozen=True)
class Definition:
    """One scoring definition: which two matrices, which cells count, where check 6 is read."""

    name: str
    matrices: tuple[str, str]
    counted: str
    check6: str

    @classmethod
    def from_protocol(cls, name: str, entry: Mapping[str, Any], source: str = "paper.yaml") -> "Definition":
        """Read one entry of paper.yaml's ``definitions``; refuse values this module does not implement."""
        matrices = tuple(entry["matrices"])
        if len(matrices) != 2 or any(m not in ALL_MATRICES for m in matrices):
            raise ProtocolError(f"{source}: definition {name!r} names matrices {list(matrices)}; "
                                f"expected two of {list(ALL_MATRICES)}")
        if entry["counted"] not in (COUNT_OUTPUT, COUNT_OUTPUT_OR_OPERANDS):
            raise ProtocolError(f"{source}: definition {name!r}: counted {entry['counted']!r} is not implemented")
        if entry["check_6"] not in (CHECK6_REAL_SCALES, CHECK6_BOTH_REGIMES):
            raise ProtocolError(f"{source}: definition {name!r}: check_6 {entry['check_6']!r} is not implemented")
        return cls(name, (matrices[0], matrices[1]), entry["counted"], entry["check_6"])


# The reading rule of analysis.yaml, as a definition (paper.yaml's `stated` entry must say the same).
STATED = Definition("stated", ("corrected", "original"), COUNT_OUTPUT, CHECK6_REAL_SCALES)

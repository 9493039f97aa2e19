"""Where the engines find their inputs: the requant stage's checkpoints, behind its gate.

Checkpoints are read only beside a requant gate table whose every row passed (against a committed
checkpoint or llm-compressor's own) or is labelled self-built, so a run cannot silently use
checkpoints whose byte-exact gate failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import GateError, InputError
from ..files.parquet import read_table
from ..quant.gate import CHECKPOINTS_DIR, GATE_SCHEMA, VERDICTS
from ..quant.variants import CHECKPOINT_VARIANTS


def gate_verdict(gate: Path) -> str:
    """The requant gate's one verdict (passed against its reference, or self-built); GateError otherwise."""
    table = read_table(gate, GATE_SCHEMA)
    verdicts = sorted(set(table["gate"]))
    if table.empty or any(v not in VERDICTS for v in verdicts) or len(verdicts) != 1:
        raise GateError(f"{gate}: requant gate verdicts {verdicts} are not one pass; checkpoints are not verified")
    # The gate is the own arm's comparison with the reference checkpoint (null when self-built);
    # the other arms' bytes_equal describe how far they moved from own, by design.
    own = table[table["arm"] == "own"]
    failed = own.loc[own["bytes_equal"].map(lambda v: v is False), "layer"]
    if own.empty or not failed.empty:
        what = f"layer {failed.iloc[0]} is not byte-identical" if not failed.empty else "no own rows"
        raise GateError(f"{gate}: {what}; checkpoints are not verified")
    return verdicts[0]


def checkpoint_dir(gate: Path, name: str) -> Path:
    """``<requant>/checkpoints/<name>`` beside the gate table ``<requant>/gate.parquet``, once the
    gate table has been checked (one passing verdict, own byte-identical) and found to cover ``name``.
    The one gate check of every stage that reads a checkpoint."""
    if name not in CHECKPOINT_VARIANTS:
        raise InputError(f"checkpoint {name!r}: expected one of {list(CHECKPOINT_VARIANTS)}")
    gate = Path(gate)
    if not gate.is_file():
        raise InputError(f"{gate}: requant gate table not found; its checkpoints are not verified")
    gate_verdict(gate)
    if name not in set(read_table(gate, GATE_SCHEMA)["arm"]):
        raise InputError(f"{gate}: no gate rows for checkpoint {name!r}; it is not verified")
    path = gate.parent / CHECKPOINTS_DIR / name
    if not (path / "config.json").is_file():
        raise InputError(f"{path}: checkpoint {name!r} not found beside the requant gate {gate}")
    return path


def parent_digest(info: Any) -> str:
    """The parent model's content digest from ``model.sources.ParentInfo``."""
    digest = getattr(info, "sha256", None)
    if not isinstance(digest, str) or not digest:
        raise InputError(f"parent model info {type(info).__name__}: no sha256 digest to identify the parent by")
    return digest

"""The capture index: which operand file holds each captured layer GEMM, and the digest it must have.

The capture stage writes it (``write_capture``); prediction, compare and the fault campaign read the
captured operands only through it (``iter_index_operands``), so every later comparison uses exactly
the bytes capture stored, and a file changed since is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from ..errors import InputError
from .layer_operands import Operands, load_operands, operand_digest, save_operands
from ..files.parquet import read_table, write_table

OPERANDS_DIR = "operands"

# The columns that name one captured layer GEMM; tables keyed per captured layer start with them.
LAYER_FIELDS = [
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("phase", pa.string(), nullable=False),
    pa.field("layer", pa.string(), nullable=False),
    pa.field("block", pa.int32(), nullable=False),
    pa.field("proj", pa.string(), nullable=False),
    pa.field("m", pa.int64(), nullable=False),
    pa.field("k", pa.int64(), nullable=False),
    pa.field("n", pa.int64(), nullable=False),
]
INDEX_SCHEMA = pa.schema([
    *LAYER_FIELDS,
    pa.field("file", pa.string(), nullable=False),  # relative to the index's folder
    pa.field("operand_digest", pa.string(), nullable=False),
    pa.field("tokens_sha256", pa.string(), nullable=False),  # the token ids whose forward pass it is
])
INDEX_KEY = ["checkpoint", "phase", "layer"]


def operand_file(checkpoint: str, phase: str) -> str:
    """The operands file of one checkpoint × phase, relative to the capture folder."""
    return f"{OPERANDS_DIR}/{checkpoint}-{phase}.safetensors"


def index_rows(ops: list[Operands], checkpoint: str, phase: str, tokens_sha256: str) -> list[dict[str, Any]]:
    """Index rows describing operands saved to ``operand_file(checkpoint, phase)``."""
    return [{
        "checkpoint": checkpoint, "phase": phase, "layer": op.layer, "block": int(op.block),
        "proj": op.proj, "m": int(op.m), "k": int(op.k), "n": int(op.n),
        "file": operand_file(checkpoint, phase), "operand_digest": operand_digest(op),
        "tokens_sha256": tokens_sha256,
    } for op in ops]


def read_index(index: Path) -> pd.DataFrame:
    """The capture index, which must have exactly ``INDEX_SCHEMA`` and name files that exist."""
    frame = read_table(index, INDEX_SCHEMA)
    if frame.empty:
        raise InputError(f"{index}: the capture index lists no layers")
    for rel in sorted(set(frame["file"])):
        if not (Path(index).parent / rel).is_file():
            raise InputError(f"{index}: operand file {rel} is missing")
    return frame


def index_inputs(index: Path) -> dict[str, Path]:
    """The operand files an index names, as manifest inputs (name -> path)."""
    return {rel: Path(index).parent / rel for rel in sorted(set(read_index(index)["file"]))}


def iter_index_operands(index: Path, checkpoint: str, phase: str) -> Iterator[tuple[Any, Operands]]:
    """(index row, operands) for every layer of one checkpoint × phase, in model order.

    Each file is loaded once; a layer missing from its file, or whose operands no longer have the
    digest or shape the index recorded, stops the run.
    """
    frame = read_index(index)
    rows = frame[(frame.checkpoint == checkpoint) & (frame.phase == phase)].sort_values(["block", "layer"])
    if rows.empty:
        raise InputError(f"{index}: no captured layers for checkpoint {checkpoint!r}, phase {phase!r}")
    for rel in rows["file"].drop_duplicates():
        path = Path(index).parent / rel
        by_layer = {op.layer: op for op in load_operands(path)}
        for row in rows[rows.file == rel].itertuples(index=False):
            op = by_layer.get(row.layer)
            if op is None:
                raise InputError(f"{path}: layer {row.layer} listed in {index} is not in the file")
            if (op.m, op.k, op.n) != (row.m, row.k, row.n) or operand_digest(op) != row.operand_digest:
                raise InputError(f"{path}: layer {row.layer} does not match {index} "
                                 f"(shape or operand digest differs)")
            yield row, op


def save_phase(out_dir: Path, ops: list[Operands], checkpoint: str, phase: str,
               tokens_sha256: str) -> list[dict[str, Any]]:
    """Save one checkpoint × phase's operands (model order) to its file; return their index rows."""
    if not ops:
        raise InputError(f"capture {checkpoint}/{phase}: no linear layer was captured")
    save_operands(Path(out_dir) / operand_file(checkpoint, phase), ops)
    return index_rows(ops, checkpoint, phase, tokens_sha256)


def write_index(out_dir: Path, rows: list[dict[str, Any]]) -> Path:
    """The capture index over every saved checkpoint × phase."""
    return write_table(pd.DataFrame(rows, columns=INDEX_SCHEMA.names), Path(out_dir) / "index.parquet",
                       INDEX_SCHEMA, INDEX_KEY)


def write_capture(out_dir: Path, captured: dict[tuple[str, str], tuple[list[Operands], str]]) -> Path:
    """Save each (checkpoint, phase)'s operands and write the index; return the index path.

    ``captured`` maps (checkpoint, phase) to (operands in model order, sha256 of the token ids).
    """
    rows: list[dict[str, Any]] = []
    for (checkpoint, phase), (ops, tokens_sha256) in sorted(captured.items()):
        rows.extend(save_phase(out_dir, ops, checkpoint, phase, tokens_sha256))
    return write_index(out_dir, rows)

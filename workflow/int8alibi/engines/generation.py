"""A generation artifact: the token table one greedy run writes, beside its identity contract.

The generate stage writes ``tokens.parquet`` (``TOKENS_SCHEMA``) and ``identity.json``
(``engines.identity``) into ``runs/<arm>/<checkpoint>/run<k>/``, one folder per arm × checkpoint ×
run; determinism and the report read them back through ``artifact_dir``, ``artifact_paths`` and
``parse_ids``, and ``sequence_sha256`` lets either side check a sequence against its recorded digest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from ..errors import InputError
from ..files.hashing import sha256_bytes

# Two fresh processes per arm and checkpoint (every variant of quant.variants, the probe too): the
# second run is the arm's self-consistency.
RUNS = (1, 2)

TOKENS_SCHEMA = pa.schema([
    pa.field("prompt", pa.int32(), nullable=False),
    pa.field("prompt_tokens", pa.int32(), nullable=False),
    pa.field("n_tokens", pa.int32(), nullable=False),
    pa.field("sequence_sha256", pa.string(), nullable=False),
    pa.field("token_ids", pa.string(), nullable=False),
])


def ids_text(token_ids: list[int]) -> str:
    """Token ids as one flat column value, decimal ids separated by single spaces.

    Flat because manifests digest table content column by column and that digest is defined for
    flat types only (docs/ARCHITECTURE.md, files.parquet.content_digest).
    """
    return " ".join(str(int(t)) for t in token_ids)


def parse_ids(text: str, where: str) -> list[int]:
    """Inverse of ``ids_text``; anything but single-space-separated decimal ids is refused."""
    parts = text.split(" ") if text else []
    if not all(p.isdigit() and (p == "0" or not p.startswith("0")) for p in parts):
        raise InputError(f"{where}: token_ids {text[:40]!r} is not a list of decimal ids separated by single spaces")
    return [int(p) for p in parts]


def sequence_sha256(token_ids: list[int]) -> str:
    """SHA-256 of the generated ids as little-endian int32: equal digests, equal sequences."""
    return sha256_bytes(np.asarray(token_ids, dtype="<i4").tobytes())


def artifact_dir(runs: Path, arm: str, checkpoint: str, run: int) -> Path:
    """``runs/<arm>/<checkpoint>/run<k>``: a folder per generate job, because a stage's ``--out`` is a
    locked transaction (``files.transaction``): two runs sharing one would take turns, and each
    would hide the other's finished files while it ran."""
    return runs / arm / checkpoint / f"run{run}"


def artifact_paths(run_dir: Path) -> tuple[Path, Path]:
    """``tokens.parquet`` and ``identity.json`` in one generate job's folder (``artifact_dir``)."""
    return run_dir / "tokens.parquet", run_dir / "identity.json"

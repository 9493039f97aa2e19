"""Several runs' results side by side, shaped like the papers' tables of three model sizes.

Each run is a results folder written by one config: the default run's ``results`` or a second
config's ``results/<name>`` (``--config results=results/<name>``). Every claim of
preregistration/paper.yaml is measured in every run with the same code the report uses
(``report.claims``), so the one table shows each model's value beside the paper's and the others'.
A run folder that is not a finished run (no report manifest) or does not verify (``int8alibi verify``)
is refused, naming it; the manifest records each run's root digest. A run's own stages are verified
(runs kept inside its folder are theirs), less the view's own folder while it is written, which may
lie in one of the runs (``results/crossmodel`` in the default run).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from ..config import CURRENT, current_run_config, load_config
from ..errors import InputError
from ..files.hashing import sha256_file
from .claims import measure, paper_value
from .sections import Tables
from .summary import run_model

MODELS_SCHEMA = pa.schema([
    pa.field("claim", pa.string(), nullable=False),
    pa.field("run", pa.string(), nullable=False),
    pa.field("model", pa.string(), nullable=False),
    pa.field("statement", pa.string(), nullable=False),
    pa.field("definition", pa.string(), nullable=False),
    pa.field("paper", pa.string(), nullable=False),
    pa.field("paper_model", pa.string(), nullable=False),
    pa.field("value", pa.string(), nullable=False),
    pa.field("number", pa.float64(), nullable=True),
    pa.field("holds", pa.bool_(), nullable=True),
    pa.field("note", pa.string(), nullable=False),
    pa.field("source_sha256", pa.string(), nullable=False),
])
MODELS_KEY = ["claim", "run"]


def check_run(folder: Path) -> Path:
    """The run config of a finished run folder (the one its last executing run used, ``.run/current``);
    refuse a folder without one or without its report."""
    folder = Path(folder)
    config = current_run_config(folder) or folder / ".run" / CURRENT
    for needed in (config, folder / "report" / "manifest.json"):
        if not needed.is_file():
            raise InputError(f"{folder}: not a finished run ({needed.relative_to(folder)} is missing); run its "
                             f"config to the end first")
    return config


def verified_root(folder: Path, own: str | os.PathLike[str] | None = None) -> str:
    """The run folder's root digest, after ``provenance.audit.verify`` found nothing wrong in it (every
    output re-hashed, every manifest and chain link checked): a value edited in one run's table stops
    the view instead of flowing into it. ``own``: the view's own folder, left out (it is being written)."""
    from ..provenance.audit import ERROR, audit_run

    findings, _, root = audit_run(folder, exclude=() if own is None else (own,))
    problems = [f for f in findings if f.level == ERROR]
    if problems or root is None:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        first = problems[0].text() if problems else "no root digest"
        raise InputError(f"{folder}: does not verify: {first}{more}; run int8alibi verify {folder}")
    return root


def _label(folder: Path) -> str:
    return folder.name


def gather(runs: Sequence[Path], protocol: Any, own: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """One row per paper claim x run: this run's value, whether a structural claim holds, and the
    SHA-256 of the table it came from. ``own``: the view's folder, left out of each run's verification."""
    if len(runs) < 2:
        raise InputError(f"cross-model view: needs at least two run folders, got {len(runs)}")
    labels = [_label(Path(r)) for r in runs]
    if len(set(labels)) != len(labels):
        raise InputError(f"cross-model view: run folder names must differ, got {labels}")
    records = []
    for folder in map(Path, runs):
        config = check_run(folder)
        verified_root(folder, own)
        cfg = load_config(config)
        tables = Tables(folder)
        model = run_model(cfg)
        for claim in protocol.paper["claims"]:
            got = measure(claim, tables, protocol)
            source = folder / got.source if got.source.endswith(".parquet") else None
            records.append({
                "claim": claim["id"], "run": _label(folder), "model": model,
                "statement": " ".join(claim["statement"].split()), "definition": claim["definition"],
                "paper": paper_value(claim), "paper_model": claim["model"], "value": got.text,
                "number": got.number, "holds": got.holds, "note": got.why,
                "source_sha256": sha256_file(source) if source is not None and source.is_file() else "not a table",
            })
    frame = pd.DataFrame.from_records(records)
    frame["number"] = pd.Series([r["number"] for r in records], dtype=object)
    frame["holds"] = pd.Series([r["holds"] for r in records], dtype=object)
    return frame


def wide(frame: pd.DataFrame) -> pd.DataFrame:
    """The paper's layout: one row per claim, the paper's value, then one column per run."""
    order = list(dict.fromkeys(frame["claim"]))
    runs = list(dict.fromkeys(frame["run"]))
    first = frame.drop_duplicates("claim").set_index("claim")
    out = pd.DataFrame({"claim": [first.loc[c, "statement"] for c in order],
                        "paper": [f"{first.loc[c, 'paper']} ({first.loc[c, 'paper_model']})" for c in order],
                        "definition": [first.loc[c, "definition"] for c in order]})
    values = frame.set_index(["claim", "run"])
    for run in runs:
        model = frame.loc[frame["run"] == run, "model"].iloc[0]
        out[f"{run} ({model})"] = [_shown(values.loc[(c, run)]) for c in order]
    return out


def _shown(row: pd.Series) -> str:
    if row["note"]:
        return row["note"]
    mark = "" if row["holds"] is None or pd.isna(row["holds"]) else (" ✓" if row["holds"] else " ✗")
    return f"{row['value']}{mark}"

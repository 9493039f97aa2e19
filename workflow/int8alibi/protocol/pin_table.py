"""The pins table of the protocol in force: one row per pinned protocol file and per pinned data
artifact, with its sha256, the amendment in force, and the amendment since which the pin has held
(the record that gave the file its current content). The protocol stage writes it.

Kept out of the package's ``__init__``: it needs pandas and pyarrow, which planning does not load.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pyarrow as pa

from .chain import Amendment, read_amendments
from .gate import gate

log = logging.getLogger("int8alibi.protocol")

PINS_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),  # protocol | data
        pa.field("file", pa.string(), nullable=False),  # project-relative path, or the data name
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("amendment", pa.string(), nullable=False),  # in force
        pa.field("since", pa.string(), nullable=False),  # first amendment of the unbroken run of this pin
    ]
)
PINS_KEY = ["kind", "file"]


def _since(amendments: list[Amendment], key: str, digest: str, data: bool) -> str:
    """Walk back from the latest amendment while the pin is unchanged."""
    since = amendments[-1].id
    for amendment in reversed(amendments):
        pins = amendment.data_pins if data else amendment.pins
        if pins.get(key) != digest:
            break
        since = amendment.id
    return since


def pins_table(project_root: Path) -> pd.DataFrame:
    """The verified pins of the protocol in force, one row per file or data artifact."""
    report = gate(project_root)
    amendments = read_amendments(project_root)
    rows = [
        {
            "kind": "protocol",
            "file": rel,
            "sha256": sha,
            "amendment": report.amendment,
            "since": _since(amendments, rel, sha, data=False),
        }
        for rel, sha in report.files.items()
    ] + [
        {
            "kind": "data",
            "file": name,
            "sha256": sha,
            "amendment": report.amendment,
            "since": _since(amendments, name, sha, data=True),
        }
        for name, sha in report.data_pins.items()
    ]
    log.info("%s", report.summary())
    return pd.DataFrame.from_records(rows, columns=PINS_SCHEMA.names)

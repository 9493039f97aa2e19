"""Stage `protocol`: verify the protocol in force and write its pins table.

results/protocol/pins.parquet has one row per pinned protocol file and per pinned data
artifact: the sha256, the amendment in force, and the amendment since which the pin has held
(the record that gave the file its current content). Downstream manifests record the same pins.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pyarrow as pa

from ..config import Config
from ..protocol import gate
from ..protocol.chain import Amendment, read_amendments
from ..protocol.pins import AMENDMENTS_DIR, LOCK_FILE, PROTOCOL_DIR
from ..provenance.manifest import write_manifest
from ..provenance.parquet import write_table
from ..runtime.runner import stage_main

log = logging.getLogger("int8alibi.stages.protocol")

SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),  # protocol | data
        pa.field("file", pa.string(), nullable=False),  # project-relative path, or the data name
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("amendment", pa.string(), nullable=False),  # in force
        pa.field("since", pa.string(), nullable=False),  # first amendment of the unbroken run of this pin
    ]
)


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
    return pd.DataFrame.from_records(rows, columns=SCHEMA.names)


def run(cfg: Config, out_dir: Path, *, project_root: str | Path = ".") -> None:
    """Gate the protocol, write pins.parquet and the stage manifest."""
    root = Path(project_root)
    table = pins_table(root)
    pins_path = write_table(table, Path(out_dir) / "pins.parquet", SCHEMA, sort_by=["kind", "file"])
    amendment_files = sorted((root / AMENDMENTS_DIR).glob("A-*.yaml"))
    lock = [root / LOCK_FILE] if (root / LOCK_FILE).is_file() else []
    write_manifest(
        out_dir,
        stage="protocol",
        outputs={"pins": pins_path},
        inputs=[root / rel for rel in table.loc[table["kind"] == "protocol", "file"]] + amendment_files + lock,
        params={},
        protocol_root=root / PROTOCOL_DIR,
    )


def main(argv: list[str] | None = None) -> int:
    return stage_main(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())

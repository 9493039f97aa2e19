"""Stage `protocol`: verify the protocol in force and write its pins table (``protocol.pin_table``)
as results/protocol/pins.parquet. Downstream manifests record the same pins.
"""

from __future__ import annotations

from pathlib import Path

from ..config import Config
from ..protocol.pin_table import PINS_KEY, PINS_SCHEMA, pins_table
from ..protocol.pins import AMENDMENTS_DIR, LOCK_FILE, PROTOCOL_DIR
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table
from ..runtime.runner import stage_main


def run(cfg: Config, out_dir: Path, *, project_root: str | Path = ".") -> None:
    """Gate the protocol, write pins.parquet and the stage manifest."""
    root = Path(project_root)
    table = pins_table(root)
    pins_path = write_table(table, Path(out_dir) / "pins.parquet", PINS_SCHEMA, sort_by=PINS_KEY)
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

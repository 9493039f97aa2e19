"""The cross-model view: several configs' finished results folders in one table (paper layout).

``--param runs=results,results/a`` names the folders (the default run's ``results``, and each other
config's ``results/<name>``, written with ``--config results=results/<name>``). Writes models.parquet
(claim x run), models.md, models.html and manifest.json; each run is verified without this stage's
own folder, which the default run holds.
"""

from __future__ import annotations

from pathlib import Path

from .. import stage_spec
from ..config import Config
from ..report.crossmodel import MODELS_KEY, MODELS_SCHEMA, gather, verified_root, wide
from ..errors import InputError
from ..protocol import load
from ..files.atomic import write_bytes
from ..files.hashing import sha256_file
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table
from ..report import document
from ..runtime.runner import log, stage_main


def run(cfg: Config, out_dir: Path, runs: str = "") -> None:
    folders = [Path(r) for r in runs.split(",") if r]
    if not folders:
        raise InputError("crossmodel: --param runs=<folder>,<folder>,... names no run folder")
    protocol = load(Path("preregistration"))
    out_dir = Path(out_dir)
    frame = gather(folders, protocol, out_dir)
    table = write_table(frame, out_dir / "models.parquet", MODELS_SCHEMA, MODELS_KEY)
    doc = document.Document("int8-alibi: the papers' claims across models")
    source = document.Source(f"{out_dir.name}/models.parquet", sha256_file(table))
    view = wide(frame)
    doc.add(document.Table("Each claim of preregistration/paper.yaml measured in every run (✓ holds, ✗ does not)",
                           view, (source,), labels=tuple((c, c) for c in view.columns)))
    md, _ = document.to_markdown(doc)
    write_bytes(out_dir / "models.md", md.encode())
    write_bytes(out_dir / "models.html", document.to_html(doc).encode())
    report_manifest = stage_spec.table("report", stage_spec.MANIFEST)
    inputs = {f"{f.name}/{report_manifest}": f / report_manifest for f in folders}
    roots = {f.name: verified_root(f, out_dir) for f in folders}  # again: nothing changed while it was built
    write_manifest(out_dir, stage="crossmodel", outputs=[table, out_dir / "models.md", out_dir / "models.html"],
                   inputs=inputs, params={"runs": [str(f) for f in folders]}, extra={"root_digests": roots})
    log.info("cross-model view of %d runs written", len(folders))


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

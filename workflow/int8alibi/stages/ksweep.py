"""Stage ksweep (GPU only): INT8 versus FP8 divergence against reduction depth K (``ksweep.sweep``).

Without a GPU the stage still writes every table, each row saying "not run: no GPU", and the
manifest says so.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import Config
from ..ksweep.sweep import NO_GPU, TABLES, log, sweep_tables
from ..protocol import load
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table
from ..runtime.runner import stage_main


def run(cfg: Config, out_dir: Path, *, project_root: str | Path = ".") -> None:
    """Run the registered sweep on the GPU (or write its "not run" tables) and the stage manifest."""
    root = Path(project_root)
    spec = load(root / "preregistration").ksweep
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":
        log.warning("ksweep: %s; every table says so", NO_GPU)
    out = Path(out_dir)
    paths = {name: write_table(table, out / f"{name}.parquet", *TABLES[name])
             for name, table in sweep_tables(spec, device).items()}
    cfg_note = NO_GPU if device.type != "cuda" else "ran on " + torch.cuda.get_device_name(device)
    write_manifest(out, stage="ksweep", outputs=paths, inputs={"ksweep": root / "preregistration" / "ksweep.yaml"},
                   params={"grid": dict(spec["grid"]), "device": str(device)},
                   protocol_root=root / "preregistration", device=device,
                   extra={"ksweep": cfg_note, "pairs": {p["id"]: list(p["arms"]) for p in spec["pairs"]}})


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

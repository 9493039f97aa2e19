"""Stage 3, requant: the byte-exact gate, then the power-of-two checkpoints (``model.requant``).

The reference is the committed checkpoint when the config names one (``model.checkpoint``), else
the one llm-compressor itself made of the parent in the run (the reference stage; its manifest
names the tool and versions). Called with no reference at all (tests), the stage builds one and
labels the gate "self-built (not an independent test)" in the table and manifest. A failed gate
writes nothing. Each arm is a compressed-tensors directory under ``<out>/checkpoints/<arm>``
beside ``gate.parquet``, where downstream stages find them.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pandas as pd

from ..config import Config
from ..errors import InputError
from ..model.sources import PARENT_TABLE
from ..files.atomic import temp_dir
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table
from ..quant.gate import CHECKPOINTS_DIR, GATE_KEY, GATE_SCHEMA, GATE_TABLE
from ..model.requant import (Reference, build_arms, committed_reference, division_summary, gate_verdict, open_parent,
                             pinned_division, tool_reference)
from ..quant.variants import CHECKPOINT_VARIANTS
from ..planning.resolve import stage_device
from ..runtime.runner import stage_main

log = logging.getLogger("int8alibi.requant")


def run(cfg: Config, out_dir: Path, parent: Path | None = None, checkpoint: Path | None = None,
        reference: Path | None = None, protocol: Path = Path("preregistration")) -> None:
    """Gate the reference (committed checkpoint, or llm-compressor's from the reference stage's
    manifest ``reference``; with neither, build one), then write every arm, the table and the manifest."""
    out_dir = Path(out_dir)
    target, gate_path, manifest = out_dir / CHECKPOINTS_DIR, out_dir / GATE_TABLE, out_dir / "manifest.json"
    _remove(target, gate_path, manifest)  # a failed run must not leave an earlier run's pass behind
    parent_path = Path(parent) if parent is not None else cfg.results / "model" / PARENT_TABLE
    committed_path = checkpoint if checkpoint is not None else cfg["model"].get("checkpoint")
    if committed_path is not None and reference is not None:
        raise InputError(f"{reference}: the config names a committed checkpoint ({committed_path}), which is the "
                         "gate's reference; llm-compressor's is not used beside it")
    division = pinned_division(protocol)
    ref = (committed_reference(committed_path) if committed_path is not None
           else tool_reference(reference) if reference is not None else None)
    loaded = open_parent(cfg, parent_path)
    device = stage_device(cfg)  # the run's resolved device: the rule's bytes do not depend on it
    log.info("requant: %d layers, pinned division %s, computed on %s", len(loaded.layers), division, device)
    gate = gate_verdict(loaded, ref, division, device)
    log.info("requant gate: %s (reference: %s)", gate, ref.label if ref is not None else "none")
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = temp_dir(out_dir, CHECKPOINTS_DIR)
    try:
        table = build_arms(loaded, division, staging, gate, ref, device)
        staging.chmod(0o755)
        staging.rename(target)
        write_table(table, gate_path, GATE_SCHEMA, GATE_KEY)
        _manifest(out_dir, table, gate, division, len(loaded.layers), parent_path, ref, reference, protocol)
    except BaseException:
        _remove(staging, target, gate_path, manifest)
        raise


def _remove(*paths: Path) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _manifest(out_dir: Path, table: pd.DataFrame, gate: str, division: str, layers: int, parent_path: Path,
              ref: Reference | None, reference_manifest: Path | None, protocol: Path) -> None:
    inputs: dict[str, Path] = {"parent": parent_path, "thresholds": Path(protocol) / "thresholds.yaml"}
    if ref is not None:
        inputs["committed" if ref.kind == "committed" else "reference"] = ref.path
    if reference_manifest is not None:
        inputs["reference_manifest"] = Path(reference_manifest)
    pow2 = table[table.arm.isin(["pow2-nearest", "pow2-ceiling", "probe"])]
    write_manifest(
        out_dir, stage="requant", outputs={"gate": out_dir / GATE_TABLE, "checkpoints": out_dir / CHECKPOINTS_DIR},
        inputs=inputs,
        params={"division": division, "committed": ref.record["path"] if ref is not None and ref.kind == "committed"
                else None, "arms": list(CHECKPOINT_VARIANTS)},
        protocol_root=protocol,
        extra={"gate": gate, "layers": layers,
               "reference": ref.record if ref is not None else {"kind": "none (self-built)"},
               "division_statistics": division_summary(table),
               "pow2_arms_all_scales_pow2": bool(pow2.all_pow2.all()),
               "clipped": {arm: int(table.loc[table.arm == arm, "clipped"].sum())
                           for arm in ("own", "pow2-nearest", "pow2-ceiling")}},
    )


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

"""Stage 7, faults: the layer-level fault campaign, scored against both prediction matrices.

Every captured layer (checkpoint ``own``, prefill) runs 42 cells (9 faults x severities x 2 scale
regimes), each evaluated by the 7 checks and scored under the corrected and the original matrix.
Writes cells.parquet (one row per cell x check), scorecard.parquet, detection.parquet, flips.parquet
and totals.parquet under both scoring definitions (paper.yaml: the stated rule and arXiv:2609.00363's
figures), decisions.parquet (analysis.yaml's decision rules evaluated), ulp_distribution.parquet and
manifest.json.

``--param layers=N`` runs the first N layers (the smoke target); ``--param layer_range=A:B`` runs
a shard, and ``python -m int8alibi.stages.faults gather --shard DIR ...`` concatenates shards
into tables byte-identical to a single run's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..config import Config, load_config
from ..planning.resolve import stage_device
from ..errors import InputError, Int8AlibiError
from ..faults import CampaignSettings, run_campaign
from ..faults.sources import LayerSelection, OperandSource
from ..kernels.base import arm_evidence
from ..protocol import load
from ..provenance.chain import verify_input
from ..provenance.manifest import write_manifest
from ..provenance.manifest_format import load_manifest
from ..files.parquet import read_table, write_table
from ..analysis.decisions import DECISIONS_KEY, DECISIONS_SCHEMA
from ..analysis.decisions import evaluate as evaluate_decisions
from ..protocol.definitions import MATRICES, REVERTED, Definition
from ..protocol import Protocol
from ..analysis.scoring import (CELLS_KEY, CELLS_SCHEMA, DETECTION_KEY, DETECTION_SCHEMA, FLIPS_KEY, FLIPS_SCHEMA,
                                SCORECARD_KEY, SCORECARD_SCHEMA, TOTALS_KEY, TOTALS_SCHEMA, ULP_KEY, ULP_SCHEMA,
                                cells_table, definition_scores, detection, flips, reverted_matrix, score,
                                scorecard, totals, ulp_distribution)
from ..printable import printable
from ..runtime.runner import guarded, log_reads, read_scope, stage_main

log = logging.getLogger("int8alibi.faults")

TABLES = {
    "cells": ("cells.parquet", CELLS_SCHEMA, CELLS_KEY),
    "scorecard": ("scorecard.parquet", SCORECARD_SCHEMA, SCORECARD_KEY),
    "detection": ("detection.parquet", DETECTION_SCHEMA, DETECTION_KEY),
    "flips": ("flips.parquet", FLIPS_SCHEMA, FLIPS_KEY),
    "totals": ("totals.parquet", TOTALS_SCHEMA, TOTALS_KEY),
    "decisions": ("decisions.parquet", DECISIONS_SCHEMA, DECISIONS_KEY),
    "ulp_distribution": ("ulp_distribution.parquet", ULP_SCHEMA, ULP_KEY),
}
# Manifest params that every shard of one campaign must share (all but the layer selection).
SHARED_PARAMS = ("settings", "device", "source")


def settings_params(settings: CampaignSettings) -> dict[str, Any]:
    """The campaign settings as manifest params."""
    th = settings.thresholds
    return {
        "tile_width": settings.tile_width, "pct_fraction": str(settings.pct_fraction), "seed": settings.seed,
        "ulp_tolerance": th.ulp_tolerance, "f32_exact_bound": th.f32_exact_bound,
        "int32_product_bound": th.product_bound, "int32_limit": th.int32_limit,
    }


def reference_evidence(device: torch.device) -> dict[str, object]:
    """Manifest evidence for the campaign's arms: both are the reference pipeline, emulated."""
    return arm_evidence(
        "faults-reference-pipeline",
        "int8alibi.faults.pipeline: exact accumulator wrapped to int32, bf16_rne((f32(acc)*s_a)*s_w); "
        "arm B = the same with one fault from int8alibi.faults.catalogue",
        device, is_emulation=True,
    )


def scored_by_definition(cells: pd.DataFrame, protocol: Protocol) -> pd.DataFrame:
    """The cells scored under every registered definition (paper.yaml) and its two matrices."""
    definitions = [Definition.from_protocol(name, entry) for name, entry in protocol.paper["definitions"].items()]
    matrices: dict[str, Any] = {m: protocol.matrix(m) for m in MATRICES}
    matrices[REVERTED] = reverted_matrix(matrices["corrected"])
    return definition_scores(cells, definitions, matrices, int(protocol.thresholds["ulp_tolerance"]))


def write_tables(out_dir: Path, cells: pd.DataFrame, protocol: Protocol) -> dict[str, Path]:
    """Write the cells table and the tables derived from it; return name -> path."""
    scores = scored_by_definition(cells, protocol)
    frames = {"cells": cells, "scorecard": scorecard(scores), "detection": detection(scores),
              "flips": flips(scores), "totals": totals(scores),
              "decisions": evaluate_decisions(scores, protocol.analysis["decision_rules"]),
              "ulp_distribution": ulp_distribution(cells)}
    written = {}
    for name, (file, schema, key) in TABLES.items():
        written[name] = write_table(frames[name], Path(out_dir) / file, schema, key)
    return written


def _summary(cells: pd.DataFrame) -> dict[str, Any]:
    per_cell = cells.drop_duplicates(["layer", "fault", "severity", "regime"])
    return {"layers": int(cells["layer"].nunique()), "cells": len(per_cell),
            "observable_cells": int(per_cell["observable"].sum()), "rows": len(cells)}


def run(cfg: Config, out_dir: Path, *, operands: Path, layers: str | int | None = None,
        layer_range: str | None = None, project_root: str | Path = ".") -> None:
    """Run the campaign on the selected layers of ``operands`` and write its tables + manifest."""
    root = Path(project_root)
    protocol = load(root / "preregistration")
    settings = CampaignSettings.from_protocol(protocol)
    device = stage_device(cfg)  # resolved once per run, when it was planned
    source = OperandSource.resolve(operands)
    selection = LayerSelection.parse(layers, layer_range)
    rows = run_campaign(selection.apply(source.layers()), settings, device,
                        total=selection.count(source.layer_count()), budget=cfg.gpu_budget_bytes)
    cells = cells_table(score(rows, {m: protocol.matrix(m) for m in MATRICES}, cfg.exploratory))
    outputs = write_tables(Path(out_dir), cells, protocol)
    summary = _summary(cells)
    log.info("faults: %(cells)d cells on %(layers)d layers, %(observable_cells)d observable", summary)
    write_manifest(
        out_dir, stage="faults", outputs=outputs, inputs=source.inputs(),
        params={"settings": settings_params(settings), "device": str(device), "source": str(source.path),
                "layers": selection.describe()},
        arms=[reference_evidence(device)], exploratory=cfg.exploratory,
        protocol_root=root / "preregistration", extra=summary, device=device,
    )


def _shared_params(shard: Path) -> dict[str, Any]:
    """What every shard of one campaign must share: its manifest's params but the layer range."""
    manifest = load_manifest(shard / "manifest.json")
    return {**{key: manifest["params"].get(key) for key in SHARED_PARAMS}, "exploratory": manifest["exploratory"]}


def gather(cfg: Config, out_dir: Path, shards: Sequence[Path], project_root: str | Path = ".") -> None:
    """Concatenate shard runs (disjoint layer ranges of one campaign) into the campaign's tables.

    The cells tables are concatenated and every derived table recomputed, so the tables are
    byte-identical to a single run over the same layers. Shards must agree on settings, device,
    operand source and exploratory flag, and must not share a layer.
    """
    if not shards:
        raise InputError("faults gather: no shard directories given")
    dirs = [Path(s) for s in shards]
    for shard in dirs:  # each shard read only as its manifest records it
        verify_input(shard, own_dir=out_dir)
    shared = [_shared_params(d) for d in dirs]
    for shard, params in zip(dirs[1:], shared[1:]):
        if params != shared[0]:
            raise InputError(f"{shard}: shard parameters {params} differ from {dirs[0]}'s {shared[0]}")
    if shared[0]["exploratory"] != cfg.exploratory:
        raise InputError(f"faults gather: shards ran with exploratory={shared[0]['exploratory']}, "
                         f"the config says {cfg.exploratory}")
    frames = [read_table(d / TABLES["cells"][0], CELLS_SCHEMA) for d in dirs]
    inputs = {f"{d.name}/{kind}": d / file for d in dirs
              for kind, file in (("cells", TABLES["cells"][0]), ("manifest", "manifest.json"))}
    seen: dict[str, Path] = {}
    for shard, frame in zip(dirs, frames):
        for layer in frame["layer"].unique():
            if layer in seen:
                raise InputError(f"{shard}: layer {layer!r} is also in shard {seen[layer]}")
            seen[layer] = shard
    cells = cells_table(pd.concat(frames, ignore_index=True))
    outputs = write_tables(Path(out_dir), cells, load(Path(project_root) / "preregistration"))
    summary = _summary(cells)
    write_manifest(
        out_dir, stage="faults", outputs=outputs, inputs=inputs,
        params={**{k: shared[0][k] for k in SHARED_PARAMS}, "layers": "gathered", "shards": len(frames)},
        arms=[reference_evidence(torch.device(str(shared[0]["device"])))],
        exploratory=cfg.exploratory, protocol_root=Path(project_root) / "preregistration", extra=summary,
    )


def _gather_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="int8alibi.stages.faults gather",
                                     description="Concatenate faults shard runs into one campaign's tables.")
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--shard", action="append", required=True, type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        scope = read_scope("faults")  # the gather reads only what the faults rule digests
        cfg = load_config(args.config, args.set).scoped(scope)
    except Int8AlibiError as exc:
        print(printable(f"int8alibi: stage faults gather failed: {exc}"), file=sys.stderr)
        return 1

    def body() -> None:
        gather(cfg, args.out, args.shard)
        log_reads(scope)

    return guarded("faults gather", args.out, list(args.shard), body)


def main(argv: list[str] | None = None) -> int:
    """``python -m int8alibi.stages.faults [gather] ...``: run the stage, or gather its shards."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["gather"]:
        return _gather_main(args[1:])
    return stage_main(run, args)


if __name__ == "__main__":
    raise SystemExit(main())

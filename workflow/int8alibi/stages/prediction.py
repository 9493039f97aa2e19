"""Stage 5, prediction: what exact arithmetic says about every captured layer before a kernel runs.

For each captured layer the exact accumulator gives max |acc|, the headroom below 2**24 and the
int32 bound; from these and the scales follows whether two correct kernels *must* agree bit for
bit once the scales are powers of two. The table is pinned by an amendment before ``compare``
may read it, so the prediction cannot be adjusted after the kernels have been seen.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..arith import F32_EXACT_BOUND, INT32_PRODUCT_BOUND
from ..analysis.bitwise_prediction import POW2_SETTING, PREDICTION_KEY, PREDICTION_SCHEMA, predict_layer
from ..kernels.capture_index import index_inputs, iter_index_operands, read_index
from ..config import Config
from ..progress import Progress
from ..planning.resolve import stage_device
from ..errors import InputError, ProtocolError
from ..protocol import load
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table
from ..runtime.runner import stage_main

log = logging.getLogger("int8alibi.prediction")


def predict_index(index: Path, device: torch.device) -> pd.DataFrame:
    """One prediction row per captured layer × phase of every checkpoint with a pow2 regime."""
    frame = read_index(index)
    unknown = sorted(set(frame["checkpoint"]) - set(POW2_SETTING))
    if unknown:
        raise InputError(f"{index}: checkpoint(s) {unknown} have no power-of-two regime "
                         f"(expected {sorted(POW2_SETTING)})")
    if "own" not in set(frame["checkpoint"]):
        raise InputError(f"{index}: no operands of the own checkpoint were captured")
    rows = []
    groups = frame[["checkpoint", "phase"]].drop_duplicates().itertuples(index=False)
    for checkpoint, phase in groups:
        layers = iter_index_operands(index, checkpoint, phase)
        for entry, op in Progress(layers, desc=f"predict {checkpoint}/{phase}", unit="layer",
                              total=int(((frame.checkpoint == checkpoint) & (frame.phase == phase)).sum())):
            row = predict_layer(op, POW2_SETTING[checkpoint], device)
            row.update(checkpoint=checkpoint, phase=phase, operand_digest=entry.operand_digest)
            rows.append(row)
    return pd.DataFrame(rows, columns=PREDICTION_SCHEMA.names)


def check_thresholds(thresholds: Mapping[str, Any]) -> None:
    """The pinned bounds must be the ones this code's exactness argument rests on (ProtocolError)."""
    pinned = {"f32_exact_bound": thresholds["f32_exact_bound"],
              "int32.product_bound": thresholds["int32"]["product_bound"],
              "int32.limit": thresholds["int32"]["limit"]}
    coded = {"f32_exact_bound": F32_EXACT_BOUND, "int32.product_bound": INT32_PRODUCT_BOUND,
             "int32.limit": 2**31}
    for key, value in pinned.items():
        if value != coded[key]:
            raise ProtocolError(f"preregistration/thresholds.yaml: {key} is {value}, but the prediction code "
                                f"implements {coded[key]}; change the code with the protocol")


def run(cfg: Config, out_dir: Path, *, index: Path, project_root: str | Path = ".") -> None:
    """Predict every captured layer from ``index`` and write predictions.parquet + manifest."""
    root = Path(project_root)
    check_thresholds(load(root / "preregistration").thresholds)
    device = stage_device(cfg)  # resolved once per run, when it was planned
    table = predict_index(Path(index), device)
    out = Path(out_dir) / "predictions.parquet"
    write_table(table, out, PREDICTION_SCHEMA, PREDICTION_KEY)
    held = int(table["predicted_bitwise_pow2"].sum())
    log.info("predicted bitwise under pow2: %d of %d layer rows", held, len(table))
    write_manifest(
        out_dir, stage="prediction", outputs={"predictions": out},
        inputs={"index": Path(index), **index_inputs(Path(index))},
        params={"device": str(device)}, protocol_root=root / "preregistration", device=device,
        extra={"predicted_bitwise_pow2": held, "rows": len(table)},
    )


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

"""Two kernel arms on the same layer operands: the compare stage's rows, summary and settings.

Each layer runs under the settings that use its checkpoint (``SETTINGS``: real scales, every scale
snapped to the nearest power of two, or the pow2-nearest checkpoint as captured); a row records the
bitwise and ulp comparison, the normalized float64 errors (analysis.yaml ``layer_errors``) and
whether a pinned pow2 prediction held. The compare stage runs it on captured operands,
``synthetic_compare`` on seeded synthetic ones.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import torch

from ..arith import compare_bf16
from ..arith.bits import bit_pattern
from .bitwise_prediction import snap_operands
from ..kernels import Arm
from ..kernels.layer_operands import Operands
from ..files.parquet import write_table

log = logging.getLogger("int8alibi.compare")

# setting -> (checkpoint whose operands it uses, whether every scale is snapped to a power of two)
SETTINGS: dict[str, tuple[str, bool]] = {
    "real": ("own", False),
    "pow2-snapped": ("own", True),
    "pow2-requant": ("pow2-nearest", False),
}
SYNTHETIC = "synthetic"  # checkpoint label of synthetic operands (settings real and pow2-snapped)


LAYERS_SCHEMA = pa.schema([
    pa.field("setting", pa.string(), nullable=False),
    pa.field("phase", pa.string(), nullable=False),
    pa.field("layer", pa.string(), nullable=False),
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("block", pa.int32(), nullable=False),
    pa.field("proj", pa.string(), nullable=False),
    pa.field("m", pa.int64(), nullable=False),
    pa.field("k", pa.int64(), nullable=False),
    pa.field("n", pa.int64(), nullable=False),
    pa.field("operand_digest", pa.string(), nullable=False),
    pa.field("arm_a", pa.string(), nullable=False),
    pa.field("arm_b", pa.string(), nullable=False),
    pa.field("elements", pa.int64(), nullable=False),
    pa.field("differing", pa.int64(), nullable=False),
    pa.field("identical", pa.bool_(), nullable=False),
    pa.field("max_finite_ulp", pa.int64(), nullable=True),  # null: no pair of finite outputs
    pa.field("finite_pairs", pa.int64(), nullable=False),
    pa.field("nonfinite_a", pa.int64(), nullable=False),
    pa.field("nonfinite_b", pa.int64(), nullable=False),
    pa.field("subnormal_a", pa.int64(), nullable=False),
    pa.field("subnormal_b", pa.int64(), nullable=False),
    pa.field("predicted_bitwise", pa.bool_(), nullable=True),  # null under real scales: no claim
    pa.field("prediction_held", pa.string(), nullable=False),  # yes | no | n.a.
    pa.field("exploratory", pa.bool_(), nullable=False),
    # analysis.yaml layer_errors (float64; null where no finite pair or a zero RMS leaves nothing to normalize by)
    pa.field("reference_rms", pa.float64(), nullable=True),
    pa.field("max_normalized_error", pa.float64(), nullable=True),
    pa.field("rms_normalized_error", pa.float64(), nullable=True),
    pa.field("near_zero_elements", pa.int64(), nullable=False),
    pa.field("differing_near_zero", pa.int64(), nullable=False),
    pa.field("differing_non_near_zero", pa.int64(), nullable=False),
])
LAYERS_KEY = ["setting", "phase", "layer"]


SUMMARY_SCHEMA = pa.schema([
    pa.field("setting", pa.string(), nullable=False),
    pa.field("phase", pa.string(), nullable=False),
    pa.field("layers", pa.int64(), nullable=False),
    pa.field("layers_identical", pa.int64(), nullable=False),
    pa.field("layers_differing", pa.int64(), nullable=False),
    pa.field("elements", pa.int64(), nullable=False),
    pa.field("differing_elements", pa.int64(), nullable=False),
    pa.field("differing_per_million", pa.float64(), nullable=False),
    pa.field("max_ulp", pa.int64(), nullable=True),
    pa.field("nonfinite_a", pa.int64(), nullable=False),
    pa.field("nonfinite_b", pa.int64(), nullable=False),
    pa.field("subnormal_a", pa.int64(), nullable=False),
    pa.field("subnormal_b", pa.int64(), nullable=False),
    pa.field("predicted_bitwise", pa.int64(), nullable=False),
    pa.field("prediction_held", pa.int64(), nullable=False),
    pa.field("prediction_failed", pa.int64(), nullable=False),
    pa.field("exploratory", pa.bool_(), nullable=False),
    pa.field("near_zero_elements", pa.int64(), nullable=False),
    pa.field("differing_near_zero", pa.int64(), nullable=False),
    pa.field("differing_non_near_zero", pa.int64(), nullable=False),
    pa.field("max_normalized_error", pa.float64(), nullable=True),
])
SUMMARY_KEY = ["setting", "phase"]


def held(predicted: bool | None, identical: bool) -> str:
    """Whether a pow2 prediction held: ``n.a.`` where it makes no claim (real scales, or not predicted)."""
    if not predicted:
        return "n.a."
    return "yes" if identical else "no"


def layer_errors(y_a: torch.Tensor, y_b: torch.Tensor, near_zero_fraction: float) -> dict[str, Any]:
    """analysis.yaml ``layer_errors``: float64 errors normalized by the RMS of arm A's finite outputs,
    and the differing elements split at ``|a| < near_zero_fraction * rms`` (a = 0 included).

    Only pairs where both values are finite enter; with none, or an RMS of zero, the normalized
    errors are None. Differing means different bit patterns (signed zeros count), as in the layers table.
    """
    a, b = y_a.double(), y_b.double()
    finite_a = torch.isfinite(a)
    pair = finite_a & torch.isfinite(b)
    rms = float(torch.sqrt(torch.mean(a[finite_a] ** 2))) if bool(finite_a.any()) else None
    differ = bit_pattern(y_a) != bit_pattern(y_b)
    threshold = near_zero_fraction * (rms or 0.0)
    near = pair & ((a.abs() < threshold) | (a == 0))
    out: dict[str, Any] = {"reference_rms": rms, "max_normalized_error": None, "rms_normalized_error": None,
                           "near_zero_elements": int(near.sum()),
                           "differing_near_zero": int((differ & near).sum()),
                           "differing_non_near_zero": int((differ & pair & ~near).sum())}
    if rms and bool(pair.any()):
        error = (a[pair] - b[pair]).abs() / rms
        out["max_normalized_error"] = float(error.max())
        out["rms_normalized_error"] = float(torch.sqrt(torch.mean(error ** 2)))
    return out


def compare_layer(op: Operands, arm_a: Arm, arm_b: Arm, device: torch.device,
                  near_zero_fraction: float) -> dict[str, Any]:
    """Both arms on the same operands (moved to ``device``): the bitwise/ulp comparison and the
    normalized float64 errors with the near-zero split."""
    args = (op.a_q.to(device), op.w_q.to(device), op.s_a.to(device), op.s_w.to(device))
    y_a, y_b = arm_a.scaled_mm(*args), arm_b.scaled_mm(*args)
    result = compare_bf16(y_a, y_b)
    return {
        "elements": result.elements, "differing": result.differing, "identical": result.differing == 0,
        "max_finite_ulp": result.max_finite_ulp, "finite_pairs": result.finite_pairs,
        "nonfinite_a": result.nonfinite_a, "nonfinite_b": result.nonfinite_b,
        "subnormal_a": result.subnormal_a, "subnormal_b": result.subnormal_b,
        **layer_errors(y_a, y_b, near_zero_fraction),
    }


def settings_for(checkpoint: str) -> list[str]:
    """The settings a checkpoint's operands run under; synthetic operands stand in for the own ones."""
    source = "own" if checkpoint == SYNTHETIC else checkpoint
    return [setting for setting, (used, _) in SETTINGS.items() if used == source]


def layer_rows(op: Operands, digest: str, checkpoint: str, phase: str, predicted: bool | None,
               arm_a: Arm, arm_b: Arm, device: torch.device, exploratory: bool,
               near_zero_fraction: float) -> list[dict[str, Any]]:
    """The layers-table rows of one captured layer: one per setting that uses its checkpoint."""
    rows = []
    for setting in settings_for(checkpoint):
        claim = predicted if setting != "real" else None
        row = compare_layer(snap_operands(op) if SETTINGS[setting][1] else op, arm_a, arm_b, device,
                            near_zero_fraction)
        row.update(setting=setting, phase=phase, layer=op.layer, checkpoint=checkpoint, block=int(op.block),
                   proj=op.proj, m=int(op.m), k=int(op.k), n=int(op.n), operand_digest=digest,
                   arm_a=arm_a.name, arm_b=arm_b.name, predicted_bitwise=claim,
                   prediction_held=held(claim, row["identical"]), exploratory=exploratory)
        if row["prediction_held"] == "no":
            log.warning("%s/%s %s: predicted bitwise identical, %d of %d elements differ",
                        setting, phase, op.layer, row["differing"], row["elements"])
        rows.append(row)
    return rows


def summarize(layers: pd.DataFrame, exploratory: bool) -> pd.DataFrame:
    """Per setting × phase: layer counts, differing elements per million, max ulp, prediction tally."""
    rows = []
    for (setting, phase), group in layers.groupby(["setting", "phase"], sort=True):
        elements, differing = int(group["elements"].sum()), int(group["differing"].sum())
        ulps = group["max_finite_ulp"].dropna()
        rows.append({
            "setting": setting, "phase": phase, "layers": len(group),
            "layers_identical": int(group["identical"].sum()),
            "layers_differing": int((~group["identical"]).sum()),
            "elements": elements, "differing_elements": differing,
            "differing_per_million": differing * 1e6 / elements if elements else 0.0,
            "max_ulp": int(ulps.max()) if len(ulps) else None,
            "nonfinite_a": int(group["nonfinite_a"].sum()), "nonfinite_b": int(group["nonfinite_b"].sum()),
            "subnormal_a": int(group["subnormal_a"].sum()), "subnormal_b": int(group["subnormal_b"].sum()),
            "predicted_bitwise": int((group["predicted_bitwise"] == True).sum()),  # noqa: E712 (nullable)
            "prediction_held": int((group["prediction_held"] == "yes").sum()),
            "prediction_failed": int((group["prediction_held"] == "no").sum()),
            "exploratory": exploratory,
            "near_zero_elements": int(group["near_zero_elements"].sum()),
            "differing_near_zero": int(group["differing_near_zero"].sum()),
            "differing_non_near_zero": int(group["differing_non_near_zero"].sum()),
            "max_normalized_error": (float(group["max_normalized_error"].max())
                                     if group["max_normalized_error"].notna().any() else None),
        })
    return pd.DataFrame(rows, columns=SUMMARY_SCHEMA.names)


def _layers_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=LAYERS_SCHEMA.names)
    # keep None as a null (not NaN) in the nullable integer and boolean columns
    frame["max_finite_ulp"] = pd.array(frame["max_finite_ulp"].tolist(), dtype="Int64")
    frame["predicted_bitwise"] = pd.array(frame["predicted_bitwise"].tolist(), dtype="boolean")
    for column in ("reference_rms", "max_normalized_error", "rms_normalized_error"):
        frame[column] = pd.array(frame[column].tolist(), dtype="Float64")
    return frame


def write_tables(rows: list[dict[str, Any]], out_dir: Path, exploratory: bool) -> tuple[Path, Path, pd.DataFrame]:
    """layers.parquet and summary.parquet under ``out_dir``; returns their paths and the summary."""
    layers = _layers_frame(rows)
    summary = summarize(layers, exploratory)
    summary["max_ulp"] = pd.array(summary["max_ulp"].tolist(), dtype="Int64")
    summary["max_normalized_error"] = pd.array(summary["max_normalized_error"].tolist(), dtype="Float64")
    layers_path = write_table(layers, Path(out_dir) / "layers.parquet", LAYERS_SCHEMA, LAYERS_KEY)
    summary_path = write_table(summary, Path(out_dir) / "summary.parquet", SUMMARY_SCHEMA, SUMMARY_KEY)
    return layers_path, summary_path, summary


def near_zero_fraction(project_root: Path) -> float:
    """analysis.yaml ``layer_errors.near_zero_fraction`` of the protocol under ``project_root``."""
    from ..protocol import load

    return float(load(Path(project_root) / "preregistration").analysis["layer_errors"]["near_zero_fraction"])


def log_summary(summary: pd.DataFrame) -> None:
    """One log line per setting × phase of the summary table."""
    for row in summary.itertuples(index=False):
        log.info("%s/%s: %d layers, %d identical, %d differing, %.3f differing per million, max ulp %s, "
                 "prediction held %d, failed %d", row.setting, row.phase, row.layers, row.layers_identical,
                 row.layers_differing, row.differing_per_million, row.max_ulp, row.prediction_held,
                 row.prediction_failed)

"""Stage 6, compare: identical captured operands through both selected arms, layer by layer.

Three settings: ``real`` (the own checkpoint's operands as captured), ``pow2-snapped`` (the same
operands with every scale snapped to its nearest power of two) and ``pow2-requant`` (the
pow2-nearest checkpoint's own captured operands). Under the pow2 settings the pinned prediction
says which layers must come out bit for bit identical; a layer that does not is reported as a
failed prediction, never dropped. The predictions must be pinned by an amendment before they are
read, unless the run declares itself exploratory (then every table and the manifest say so).

``python -m int8alibi.stages.compare --synthetic-shapes qwen3-1.7b --m 512 --arms cublaslt,triton
--out DIR`` runs the same comparison on seeded synthetic operands of a real model's shapes.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import torch

from ..arith import compare_bf16
from ..arith.bits import bit_pattern
from ..config import Config
from ..device import resolve_device
from ..errors import InputError, Int8AlibiError, ProtocolError
from ..kernels import Arm, select
from ..operands import ModelShapes, Operands, operand_digest, synthetic_layers
from ..progress import Progress
from ..protocol import pinned_data_digest
from ..protocol.chain import read_amendments
from ..provenance.environment import differences, made_in
from ..protocol.pins import data_digest
from ..provenance.manifest import write_manifest
from ..provenance.parquet import read_table, write_table
from ..resolve import stage_arms
from . import stage_main
from .capture import index_inputs, iter_index_operands, read_index
from .prediction import PREDICTION_SCHEMA, POW2_SETTING, predict_layer, snap_operands

log = logging.getLogger("int8alibi.compare")

# setting -> (checkpoint whose operands it uses, whether every scale is snapped to a power of two)
SETTINGS: dict[str, tuple[str, bool]] = {
    "real": ("own", False),
    "pow2-snapped": ("own", True),
    "pow2-requant": ("pow2-nearest", False),
}
SYNTHETIC = "synthetic"  # checkpoint label of synthetic operands (settings real and pow2-snapped)
PIN_NAME = "predictions"
PIN_HOWTO = ("int8alibi amend --pin predictions={path} --summary '...' --rationale '...' "
             "--status pre-data --stages compare")

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


def pin_status(predictions: Path, project_root: Path) -> dict[str, Any]:
    """The predictions file's digest next to the one an amendment pinned (None when unpinned)."""
    return {"digest": data_digest(predictions), "pinned": pinned_data_digest(project_root, PIN_NAME)}


def require_pin(predictions: Path, status: dict[str, Any], exploratory: bool, project_root: Path) -> None:
    """Refuse unpinned or changed predictions unless the run is exploratory (ProtocolError)."""
    if exploratory or status["pinned"] == status["digest"]:
        return
    try:
        path = predictions.resolve().relative_to(project_root.resolve()).as_posix()
    except ValueError:
        path = predictions.resolve().as_posix()
    if status["pinned"] is None:
        raise ProtocolError(
            f"{predictions} (sha256 {status['digest']}) is not the pinned prediction list: no amendment pins "
            f"data '{PIN_NAME}'. Predictions must be pinned before compare reads them: "
            f"{PIN_HOWTO.format(path=path)} (or set exploratory: true to run unpinned, recorded in every "
            f"table and manifest)")
    raise ProtocolError(
        f"{predictions} (sha256 {status['digest']}) is not the pinned prediction list: the amendment in force "
        f"pins '{PIN_NAME}' at sha256 {status['pinned']}, which differs. {environment_story(predictions, project_root)} "
        f"Two ways forward: (1) reproduce the pinned environment (the facts above), or find why this one "
        f"computes other bytes; (2) pin this run's predictions by a new amendment whose status says truthfully "
        f"whether data had been seen: {PIN_HOWTO.format(path=path)} (or set exploratory: true to run "
        f"unpinned, recorded in every table and manifest)")


def environment_story(predictions: Path, project_root: Path) -> str:
    """What differs between the environment the pin was made in and the one that made ``predictions``."""
    pinned = read_amendments(project_root)[-1].data_pin_environments.get(PIN_NAME)
    here = made_in(predictions)
    if pinned is None:
        return "The amendment did not record the environment the pin was made in."
    if here is None:
        return f"No manifest beside {predictions} records the environment it was made in."
    changed = differences(pinned, here)
    if not changed:
        return "The recorded environments are identical (same libraries, CPU facts and device)."
    shown = "; ".join(changed[:12]) + (f"; and {len(changed) - 12} more" if len(changed) > 12 else "")
    return f"Environment facts that differ (pinned -> this run): {shown}."


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


def _pow2_predictions(predictions: Path, index: pd.DataFrame) -> dict[tuple[str, str, str], bool]:
    """(checkpoint, phase, layer) -> predicted bitwise under pow2; every captured layer must have one
    and it must have been made on the very operands the index names."""
    table = read_table(predictions, PREDICTION_SCHEMA)
    merged = index.merge(table, on=["checkpoint", "phase", "layer"], how="left", suffixes=("", "_pred"),
                         indicator=True)
    missing = merged[merged["_merge"] != "both"]
    if len(missing):
        first = missing.iloc[0]
        raise InputError(f"{predictions}: no prediction for captured layer {first.layer} "
                         f"({first.checkpoint}/{first.phase}; {len(missing)} missing)")
    stale = merged[merged["operand_digest"] != merged["operand_digest_pred"]]
    if len(stale):
        first = stale.iloc[0]
        raise InputError(f"{predictions}: prediction for {first.layer} ({first.checkpoint}/{first.phase}) "
                         f"was made on operands {first.operand_digest_pred}, the index has {first.operand_digest}")
    keys = zip(merged["checkpoint"], merged["phase"], merged["layer"])
    return dict(zip(keys, (bool(v) for v in merged["predicted_bitwise_pow2"])))


def run(cfg: Config, out_dir: Path, *, index: Path, predictions: Path, project_root: str | Path = ".") -> None:
    """Compare the two selected arms on every captured layer in the three settings."""
    index, predictions, root = Path(index), Path(predictions), Path(project_root)
    exploratory = cfg.exploratory
    status = pin_status(predictions, root)
    require_pin(predictions, status, exploratory, root)
    frame = read_index(index)
    missing = sorted({c for c, _ in SETTINGS.values()} - set(frame["checkpoint"]))
    if missing:
        raise InputError(f"{index}: no captured operands for checkpoint(s) {missing}")
    predicted = _pow2_predictions(predictions, frame)
    fraction = near_zero_fraction(root)
    device, arm_a, arm_b, selection = stage_arms(cfg)  # resolved once per run, when it was planned
    rows: list[dict[str, Any]] = []
    for checkpoint, phase in sorted(set(zip(frame["checkpoint"], frame["phase"]))):
        total = int(((frame.checkpoint == checkpoint) & (frame.phase == phase)).sum())
        for entry, op in Progress(iter_index_operands(index, checkpoint, phase), total=total, unit="layer",
                              desc=f"compare {checkpoint}/{phase}"):
            rows.extend(layer_rows(op, entry.operand_digest, checkpoint, phase,
                                   predicted[(checkpoint, phase, op.layer)], arm_a, arm_b, device, exploratory,
                                   fraction))
    layers_path, summary_path, summary = write_tables(rows, out_dir, exploratory)
    _log_summary(summary)
    write_manifest(
        out_dir, stage="compare", outputs={"layers": layers_path, "summary": summary_path},
        inputs={"index": index, "predictions": predictions, **index_inputs(index)},
        params={"arms": cfg["arms"], "device": str(device), "settings": _settings_record(),
                "near_zero_fraction": fraction},
        arms=[arm_a.evidence(), arm_b.evidence()], exploratory=exploratory,
        protocol_root=root / "preregistration", device=device,
        extra={"selection": selection, "prediction_pin": {**status, "pin_name": PIN_NAME},
               "prediction_failures": int(summary["prediction_failed"].sum())},
    )


def near_zero_fraction(project_root: Path) -> float:
    """analysis.yaml ``layer_errors.near_zero_fraction`` of the protocol under ``project_root``."""
    from ..protocol import load

    return float(load(Path(project_root) / "preregistration").analysis["layer_errors"]["near_zero_fraction"])


def _settings_record() -> dict[str, dict[str, Any]]:
    return {s: {"checkpoint": c, "scales_snapped_pow2_nearest": snap} for s, (c, snap) in SETTINGS.items()}


def _log_summary(summary: pd.DataFrame) -> None:
    for row in summary.itertuples(index=False):
        log.info("%s/%s: %d layers, %d identical, %d differing, %.3f differing per million, max ulp %s, "
                 "prediction held %d, failed %d", row.setting, row.phase, row.layers, row.layers_identical,
                 row.layers_differing, row.differing_per_million, row.max_ulp, row.prediction_held,
                 row.prediction_failed)


def compare_synthetic(shapes: str | ModelShapes, m: int, arms: str | list[str], out_dir: Path, *,
                      device: str = "auto", seed: int = 0, blocks: int | None = None,
                      project_root: str | Path = ".") -> pd.DataFrame:
    """The comparison tables for seeded synthetic operands of a real model's shapes (no model needed).

    Every linear layer (or those of the first ``blocks`` blocks), phases prefill (M=``m``) and
    decode (M=1, its own seed), settings ``real`` and ``pow2-snapped``; ``pow2-requant`` needs a
    requantized checkpoint and is not applicable here (the manifest says so).
    Predictions are computed in-run from the same operands, so they are not pinned: the tables and
    the manifest are marked exploratory. Returns the summary table.
    """
    torch_device = resolve_device(device)
    arm_a, arm_b, selection = select(arms, torch_device)
    fraction = near_zero_fraction(Path(project_root))
    rows: list[dict[str, Any]] = []
    for phase, rows_m, phase_seed in (("prefill", m, seed), ("decode", 1, seed + 1)):
        layers = synthetic_layers(shapes, m=rows_m, seed=phase_seed, blocks=blocks)
        for op in Progress(layers, desc=f"compare synthetic/{phase}", unit="layer"):
            predicted = bool(predict_layer(op, POW2_SETTING["own"], torch_device)["predicted_bitwise_pow2"])
            rows.extend(layer_rows(op, operand_digest(op), SYNTHETIC, phase, predicted,
                                   arm_a, arm_b, torch_device, True, fraction))
    out_dir = Path(out_dir)
    layers_path, summary_path, summary = write_tables(rows, out_dir, True)
    _log_summary(summary)
    write_manifest(
        out_dir, stage="compare", outputs={"layers": layers_path, "summary": summary_path}, inputs={},
        params={"synthetic_shapes": shapes if isinstance(shapes, str) else repr(shapes), "m": m, "seed": seed,
                "blocks": blocks, "arms": arms, "device": str(torch_device)},
        arms=[arm_a.evidence(), arm_b.evidence()], exploratory=True,
        protocol_root=Path(project_root) / "preregistration", device=torch_device,
        extra={"selection": selection, "operands": f"synthetic_layers({shapes!r}, m, seed)",
               "prediction_pin": "not applicable: synthetic operands, predictions computed in-run",
               "pow2-requant": "not applicable: synthetic operands have no requantized checkpoint"},
    )
    return summary


def synthetic_main(argv: list[str]) -> int:
    """CLI of ``compare_synthetic``."""
    parser = argparse.ArgumentParser(prog="int8alibi.stages.compare --synthetic-shapes")
    parser.add_argument("--synthetic-shapes", required=True, help="e.g. qwen3-1.7b (operands.QWEN3_SHAPES)")
    parser.add_argument("--m", type=int, default=512, help="prefill rows M")
    parser.add_argument("--arms", default="auto", help="auto or two arm names separated by a comma")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--blocks", type=int, default=None, help="only the first BLOCKS blocks (default: all)")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    arms: str | list[str] = args.arms if args.arms == "auto" else args.arms.split(",")
    try:
        compare_synthetic(args.synthetic_shapes, args.m, arms, args.out, device=args.device, seed=args.seed,
                          blocks=args.blocks)
    except Int8AlibiError as exc:
        print(f"int8alibi: compare (synthetic) failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if any(arg.startswith("--synthetic-shapes") for arg in sys.argv[1:]):
        raise SystemExit(synthetic_main(sys.argv[1:]))
    raise SystemExit(stage_main(run))

"""Stage 6, compare: identical captured operands through both selected arms, layer by layer.

Three settings: ``real`` (the own checkpoint's operands as captured), ``pow2-snapped`` (the same
operands with every scale snapped to its nearest power of two) and ``pow2-requant`` (the
pow2-nearest checkpoint's own captured operands). Under the pow2 settings the pinned prediction
says which layers must come out bit for bit identical; a layer that does not is reported as a
failed prediction, never dropped. The predictions must be pinned by an amendment before they are
read, unless the run declares itself exploratory (then every table and the manifest say so).

The comparison itself is ``int8alibi.analysis.layer_comparison``; ``python -m int8alibi.tools.synthetic_compare``
runs it on seeded synthetic operands of a real model's shapes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.bitwise_prediction import PREDICTION_SCHEMA
from ..kernels.capture_index import index_inputs, iter_index_operands, read_index
from ..config import Config
from ..errors import InputError, ProtocolError
from ..analysis.layer_comparison import SETTINGS, layer_rows, log_summary, near_zero_fraction, write_tables
from ..progress import Progress
from ..protocol import pinned_data_digest
from ..protocol.chain import read_amendments
from ..protocol.pins import PREDICTIONS_PIN, data_digest, predictions_pin
from ..provenance.environment import differences, made_in
from ..provenance.manifest import write_manifest
from ..files.parquet import read_table
from ..planning.resolve import stage_arms
from ..runtime.runner import stage_main

log = logging.getLogger("int8alibi.compare")

PIN_HOWTO = ("int8alibi amend --pin {name}={path} --summary '...' --rationale '...' "
             "--status pre-data --stages compare")


def pin_status(predictions: Path, project_root: Path, name: str = PREDICTIONS_PIN) -> dict[str, Any]:
    """The predictions file's digest next to the one an amendment pinned under ``name`` (None when unpinned)."""
    return {"digest": data_digest(predictions), "pinned": pinned_data_digest(project_root, name), "pin_name": name}


def require_pin(predictions: Path, status: dict[str, Any], exploratory: bool, project_root: Path) -> None:
    """Refuse unpinned or changed predictions unless the run is exploratory (ProtocolError)."""
    if exploratory or status["pinned"] == status["digest"]:
        return
    try:
        path = predictions.resolve().relative_to(project_root.resolve()).as_posix()
    except ValueError:
        path = predictions.resolve().as_posix()
    name = status["pin_name"]
    howto = PIN_HOWTO.format(name=name, path=path)
    if status["pinned"] is None:
        raise ProtocolError(
            f"{predictions} (sha256 {status['digest']}) is not the pinned prediction list: no amendment pins "
            f"data '{name}' (this run's predictions; each results folder has its own pin). Predictions must be "
            f"pinned before compare reads them: {howto} (or set exploratory: true to run unpinned, recorded in "
            f"every table and manifest)")
    raise ProtocolError(
        f"{predictions} (sha256 {status['digest']}) is not the pinned prediction list: the amendment in force "
        f"pins '{name}' at sha256 {status['pinned']}, which differs. "
        f"{environment_story(predictions, project_root, name)} "
        f"Two ways forward: (1) reproduce the pinned environment (the facts above), or find why this one "
        f"computes other bytes; (2) pin this run's predictions by a new amendment whose status says truthfully "
        f"whether data had been seen: {howto} (or set exploratory: true to run "
        f"unpinned, recorded in every table and manifest)")


def environment_story(predictions: Path, project_root: Path, name: str = PREDICTIONS_PIN) -> str:
    """What differs between the environment the pin was made in and the one that made ``predictions``."""
    pinned = read_amendments(project_root)[-1].data_pin_environments.get(name)
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
    status = pin_status(predictions, root, predictions_pin(str(cfg.get("results", "results"))))
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
    log_summary(summary)
    write_manifest(
        out_dir, stage="compare", outputs={"layers": layers_path, "summary": summary_path},
        inputs={"index": index, "predictions": predictions, **index_inputs(index)},
        params={"arms": cfg["arms"], "device": str(device), "settings": _settings_record(),
                "near_zero_fraction": fraction},
        arms=[arm_a.evidence(), arm_b.evidence()], exploratory=exploratory,
        protocol_root=root / "preregistration", device=device,
        extra={"selection": selection, "prediction_pin": status,
               "prediction_failures": int(summary["prediction_failed"].sum())},
    )


def _settings_record() -> dict[str, dict[str, Any]]:
    return {s: {"checkpoint": c, "scales_snapped_pow2_nearest": snap} for s, (c, snap) in SETTINGS.items()}


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

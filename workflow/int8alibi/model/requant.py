"""The requant gate and the checkpoint arms: the project's own requantization of the bf16 parent,
compared byte for byte with a reference checkpoint, then every arm's checkpoint and the gate table.

Gate: the reference W8A8 checkpoint is rebuilt from the parent under the unconstrained rule with
the division precision pinned in the protocol (thresholds.yaml, ``weight_quantization.division``)
and compared layer by layer (int8 weights and bf16 scales), together with every non-quantized
tensor it shares with the parent. Any difference raises GateError naming the first differing
layers, their counts and the first differing byte (and whether the other division would have
matched: the division is pinned, never chosen after the fact).

Arms: ``own`` (the verified checkpoint), ``pow2-nearest`` and ``pow2-ceiling`` (scales snapped,
int8 recomputed), ``probe`` (scales snapped to nearest, old int8 kept); the gate table
(``quant.gate.GATE_SCHEMA``) has one row per layer x arm, with the division statistics
(``quant.division``) of each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from safetensors import safe_open

from ..arith import is_pow2
from ..arith.bits import bit_pattern
from ..config import Config
from ..errors import GateError, InputError, ProtocolError
from ..model.layers import LayerRef, quantized_linears_stored
from ..model.sources import PARENT_TABLE, describe_source, load_hf_model, verified_parent
from ..files.hashing import listing_digest, tree_hashes
from ..provenance.manifest_format import load_manifest
from ..quant import weight as wq
from ..quant.compressed_tensors import CONFIG, INDEX_FILE, Checkpoint, CheckpointWriter, load_checkpoint
from ..quant.division import division_stats
from ..quant.gate import GATE_PASSED, GATE_PASSED_TOOL, GATE_SCHEMA, GATE_SELF_BUILT, REFERENCE_CHECKPOINT_DIR
from ..quant.variants import CHECKPOINT_VARIANTS
from ..quant.weight import QuantizedWeight

SHARD_BYTES = 2 << 30


def pinned_division(protocol_root: Path) -> wq.Division:
    """The pinned division precision; ProtocolError if the pinned rule is not the one implemented here."""
    from ..protocol import load

    thresholds = load(Path(protocol_root)).thresholds
    rule = thresholds["weight_quantization"]
    source = f"{protocol_root}/thresholds.yaml"
    implemented = {"scale_divisor": wq.SCALE_DIVISOR, "clamp": [wq.Q_MIN, wq.Q_MAX], "rounding": "half_even",
                   "scale_dtype": "bfloat16", "granularity": "per_output_channel"}
    for key, value in implemented.items():
        if rule.get(key) != value:
            raise ProtocolError(f"{source}: weight_quantization.{key} is {rule.get(key)!r}, but the implemented "
                                f"rule uses {value!r}")
    division: wq.Division = rule["division"]  # checked on the next line
    if division not in wq.DIVISIONS:
        raise ProtocolError(f"{source}: weight_quantization.division {division!r} is not one of {list(wq.DIVISIONS)}")
    return division


def _differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ (signed zeros and NaN payloads count)."""
    return int((bit_pattern(a) != bit_pattern(b)).sum())


@dataclass
class _Mismatch:
    layer: str
    int8: int
    scales: int
    first: str
    other_division_matches: bool


def _first_byte(ours: QuantizedWeight, theirs: QuantizedWeight) -> str:
    """Where the first differing element is and both values (int8 weight first, else scale)."""
    for what, a, b in (("int8", ours.w_q, theirs.w_q), ("scale", ours.s_w, theirs.s_w)):
        where = (bit_pattern(a) != bit_pattern(b)).nonzero()
        if len(where):
            row, col = (int(i) for i in where[0])
            return f"first {what} at [{row}, {col}]: rebuilt {a[row, col].item()!r}, reference {b[row, col].item()!r}"
    return "no element differs"


@dataclass(frozen=True)
class Reference:
    """What the gate compares against: a folder and how the report and table name it."""

    kind: str  # "committed" or "llm-compressor"
    path: Path
    label: str
    record: dict[str, Any]


def committed_reference(path: Path | str) -> Reference:
    """A committed checkpoint named by the config: its path and the digest of its files."""
    path = Path(path)
    digest = listing_digest(tree_hashes(path)) if path.is_dir() else "absent"
    return Reference("committed", path, f"committed {path} (files sha256 {digest[:16]})",
                     {"kind": "committed", "path": str(path), "sha256": digest})


def tool_reference(manifest_path: Path | str) -> Reference:
    """llm-compressor's checkpoint from the reference stage, checked against that stage's manifest."""
    manifest_path = Path(manifest_path)
    manifest = load_manifest(manifest_path)
    folder = manifest_path.parent / REFERENCE_CHECKPOINT_DIR
    recorded = next((o for o in manifest.get("outputs", []) if o.get("name") == REFERENCE_CHECKPOINT_DIR), None)
    tool = (manifest.get("extra") or {}).get("tool") or {}
    if manifest.get("stage") != "reference" or recorded is None or not tool.get("describe"):
        raise InputError(f"{manifest_path}: not a reference stage manifest (no checkpoint output or tool record)")
    present = tree_hashes(folder) if folder.is_dir() else {}
    if present != recorded.get("files"):
        raise InputError(f"{folder}: files differ from those its manifest {manifest_path} records; "
                         "rerun the reference stage")
    digest = listing_digest(present)
    # named within the results folder, so the gate table's bytes do not depend on where that folder is
    where = f"<results>/{manifest_path.parent.name}/{REFERENCE_CHECKPOINT_DIR}"
    return Reference("llm-compressor", folder, f"{tool['describe']}: {where} (files sha256 {digest[:16]})",
                     {"kind": "llm-compressor", "path": str(folder), "sha256": digest, "tool": tool})


@dataclass
class Parent:
    """The bf16 parent as the gate reads it: its quantized layers' weights and every other tensor."""

    directory: Path
    config: dict[str, Any]
    layers: list[LayerRef]
    weights: dict[str, torch.Tensor]  # layer name -> its bf16 weight
    other: dict[str, torch.Tensor]  # every other stored tensor, by name


def open_parent(cfg: Config, parent: Path) -> Parent:
    """The parent from the model stage (its parent.parquet or folder) or from a plain HF directory.

    The model stage's parent is read from its safetensors files, once they are the ones its record
    names (no model is built: the stage's files are the tensors it loaded and checked); a plain HF
    directory is loaded as a model first, which checks every tensor against its config."""
    parent = Path(parent)
    stage_dir = parent.parent if parent.name == PARENT_TABLE else parent
    if (stage_dir / PARENT_TABLE).is_file():
        directory, _ = verified_parent(stage_dir, expect=describe_source(cfg))
        state = None
    else:
        directory = parent
        state = load_hf_model(parent).state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                if state is not None and name not in state:
                    raise InputError(f"{directory}: stored tensor {name!r} is not in the loaded model")
                tensors[name] = handle.get_tensor(name) if state is None else state[name]
    layers = quantized_linears_stored(set(tensors), str(directory))
    weights = {r.name: tensors.pop(f"{r.name}.weight") for r in layers}
    config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
    return Parent(directory, config, layers, weights, dict(sorted(tensors.items())))


def _weight(parent: Parent, ref: LayerRef, device: torch.device) -> torch.Tensor:
    """One layer's bf16 weight on the device the rule is computed on (the same bytes on CPU and CUDA)."""
    return parent.weights[ref.name].to(device)


def _to_cpu(q: QuantizedWeight) -> QuantizedWeight:
    return QuantizedWeight(q.w_q.cpu(), q.s_w.cpu())


def verify_committed(parent: Parent, committed: Checkpoint, division: wq.Division,
                     device: torch.device = torch.device("cpu")) -> None:
    """GateError unless every layer and every shared tensor of the reference is byte-identical to the rebuild."""
    other_division = next(d for d in wq.DIVISIONS if d != division)
    mismatches: list[_Mismatch] = []
    for ref in parent.layers:
        w = _weight(parent, ref, device)
        rebuilt, stored = _to_cpu(wq.quantize_weight(w, division, what=ref.name)), committed[ref.name]
        int8, scales = _differing(rebuilt.w_q, stored.w_q), _differing(rebuilt.s_w, stored.s_w)
        if int8 or scales:
            alt = _to_cpu(wq.quantize_weight(w, other_division, what=ref.name))
            matches = not _differing(alt.w_q, stored.w_q) and not _differing(alt.s_w, stored.s_w)
            mismatches.append(_Mismatch(ref.name, int8, scales, _first_byte(rebuilt, stored), matches))
    if mismatches:
        first = "; ".join(f"{m.layer} ({m.int8} int8, {m.scales} scales; {m.first})" for m in mismatches[:5])
        alt_all = all(m.other_division_matches for m in mismatches)
        alt_some = sum(m.other_division_matches for m in mismatches)
        note = (f"dividing in {other_division} would have matched every differing layer"
                if alt_all else f"dividing in {other_division} would have matched {alt_some} of them")
        if alt_all and other_division == "float32":
            note += (": the reference was made on a path that divides in float32 (llm-compressor does wherever "
                     "an accelerator is visible to it), not on the pinned bf16 path")
        raise GateError(
            f"requant gate failed: {len(mismatches)} of {len(parent.layers)} layers of {committed.path} differ "
            f"from the rebuild under the pinned division {division!r}: {first}. {note}; the stage fails "
            f"regardless (the division is pinned in thresholds.yaml, not chosen to match)")
    foreign = sorted(n for n in committed.other_names if n not in parent.other)
    if foreign:
        raise GateError(f"requant gate failed: {committed.path} has tensor(s) {foreign[:3]} the parent "
                        f"{parent.directory} does not have")
    for name in committed.other_names:
        differing = _differing(committed.tensor(name), parent.other[name].to("cpu"))
        if differing:
            raise GateError(f"requant gate failed: {committed.path} tensor {name!r} differs from the parent in "
                            f"{differing} element(s); the checkpoint was not made from this parent")


def gate_verdict(parent: Parent, reference: Reference | None, division: wq.Division,
                 device: torch.device = torch.device("cpu")) -> str:
    """The gate's verdict: the reference verified against the rebuild (GateError otherwise), or self-built."""
    if reference is None:
        return GATE_SELF_BUILT
    stored = load_checkpoint(reference.path, [r.name for r in parent.layers], against=f"the parent {parent.directory}")
    verify_committed(parent, stored, division, device)
    return GATE_PASSED if reference.kind == "committed" else GATE_PASSED_TOOL


def _arms(w: torch.Tensor, division: wq.Division, name: str) -> dict[str, tuple[QuantizedWeight, torch.Tensor | None]]:
    """Each arm's weights and clipped counts per row (None for the probe, which recomputes nothing)."""
    own = wq.requantize_counted(w, "none", division, what=name)
    return {
        "own": own,
        "pow2-nearest": wq.requantize_counted(w, "nearest", division, what=name),
        "pow2-ceiling": wq.requantize_counted(w, "ceiling", division, what=name),
        "probe": (wq.rewritten_probe(own[0].w_q, own[0].s_w, "nearest", what=name), None),
    }


def _row(ref: LayerRef, arm: str, w: torch.Tensor, q: QuantizedWeight, clipped: torch.Tensor | None,
         own: QuantizedWeight, division: str, gate: str, reference: Reference | None) -> dict[str, Any]:
    scales = q.s_w.double().flatten()
    row: dict[str, Any] = {
        "block": ref.block, "proj": ref.proj, "arm": arm, "layer": ref.name, "n": q.w_q.shape[0],
        "k": q.w_q.shape[1], "division": division, "gate": gate,
        "scale_min": float(scales.min()), "scale_max": float(scales.max()),
        "scale_ratio": float(scales.max() / scales.min()),
        "saturated": int(((q.w_q == wq.Q_MIN) | (q.w_q == wq.Q_MAX)).sum()),
        "all_pow2": bool(is_pow2(q.s_w).all()),
        "clipped": None if clipped is None else int(clipped.sum()),
    }
    stats = None if arm == "probe" else division_stats(w, q.s_w, what=ref.name)
    row.update(f32_division_differing=None if stats is None else stats.differing,
               quotient_shift_max=None if stats is None else stats.quotient_shift_max,
               code_offset_max=None if stats is None else stats.code_offset_max)
    if arm == "own":
        if reference is not None:  # the gate compared the rebuild with the reference bytes; it passed to get here
            row.update(reference=reference.label, bytes_equal=True, differing_int8=0, differing_scales=0)
        else:
            row.update(reference="none (self-built)", bytes_equal=None, differing_int8=None, differing_scales=None)
    else:
        int8, s = _differing(q.w_q, own.w_q), _differing(q.s_w, own.s_w)
        row.update(reference="own", bytes_equal=not (int8 or s), differing_int8=int8, differing_scales=s)
    return row


def build_arms(parent: Parent, division: wq.Division, staging: Path, gate: str, reference: Reference | None,
               device: torch.device = torch.device("cpu")) -> pd.DataFrame:
    """Write every arm's checkpoint under ``staging/<arm>`` and return the gate table rows.

    The rule is computed on ``device`` (a GPU run's CUDA device: the weight rule gives the same bytes
    there, and the statistics are exact), the tensors written from host copies."""
    extra = [p for p in sorted(parent.directory.iterdir())
             if p.is_file() and p.name != CONFIG and p.name != INDEX_FILE and p.suffix != ".safetensors"]
    writers = {
        arm: CheckpointWriter(staging / arm, parent.config, copy_files=extra, shard_bytes=SHARD_BYTES,
                              provenance={"arm": arm, "division": division, "gate": gate,
                                          "rule": "llm-compressor W8A8: s_w = bf16(absmax/127.5), "
                                                  "q = round_half_even(clamp(W/s_w, -128, 127))"})
        for arm in CHECKPOINT_VARIANTS
    }
    rows: list[dict[str, Any]] = []
    try:
        for ref in parent.layers:
            w = _weight(parent, ref, device)
            arms = _arms(w, division, ref.name)
            own = arms["own"][0]
            for arm, (q, clipped) in arms.items():
                writers[arm].add_layer(ref.name, _to_cpu(q))
                rows.append(_row(ref, arm, w, q, clipped, own, division, gate, reference))
        for name, tensor in parent.other.items():
            for writer in writers.values():
                writer.add_tensor(name, tensor)
        for writer in writers.values():
            writer.close()
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    return _frame(rows)


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows as a frame whose nullable columns keep their nulls (pandas would turn them into NaN floats)."""
    nullable = {"bytes_equal": "boolean", "differing_int8": "Int64", "differing_scales": "Int64", "clipped": "Int64",
                "f32_division_differing": "Int64", "quotient_shift_max": "Float64", "code_offset_max": "Float64"}
    return pd.DataFrame({f.name: pd.Series([r[f.name] for r in rows], dtype=nullable.get(f.name, "object"))
                         for f in GATE_SCHEMA})


def division_summary(table: pd.DataFrame, arm: str = "own") -> dict[str, Any]:
    """The division statistics over every layer of one arm: counts, share and maxima."""
    rows = table[table.arm == arm]
    differing, weights = int(rows.f32_division_differing.sum()), int((rows.n * rows.k).sum())
    return {"arm": arm, "f32_division_differing": differing, "weights": weights,
            "f32_division_differing_share": differing / weights if weights else None,
            "quotient_shift_max": float(rows.quotient_shift_max.max()),
            "code_offset_max": float(rows.code_offset_max.max())}

"""Stage 5, prediction: what exact arithmetic says about every captured layer before a kernel runs.

For each captured layer the exact accumulator gives max |acc|, the headroom below 2**24 and the
int32 bound; from these and the scales follows whether two correct kernels *must* agree bit for
bit once the scales are powers of two. The table is pinned by an amendment before ``compare``
may read it, so the prediction cannot be adjusted after the kernels have been seen.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import torch

from ..arith import (F32_EXACT_BOUND, INT32_PRODUCT_BOUND, exact_accumulator, int32_bound_holds, is_pow2,
                     snap_pow2)
from ..config import Config
from ..progress import Progress
from ..resolve import stage_device
from ..errors import InputError, ProtocolError
from ..operands import Operands
from ..protocol import load
from ..provenance.manifest import write_manifest
from ..provenance.parquet import write_table
from . import stage_main
from .capture import LAYER_FIELDS, index_inputs, iter_index_operands, read_index

log = logging.getLogger("int8alibi.prediction")

# Which power-of-two regime each captured checkpoint is predicted under (compare's settings):
# the own checkpoint with every scale snapped to its nearest power of two, and the pow2-nearest
# checkpoint as captured (its weight scales are powers of two already; activations are not).
POW2_SETTING = {"own": "pow2-snapped", "pow2-nearest": "pow2-requant"}

# float32's normal range, as float64 bounds on an exact product v: round_f32(v) is a finite normal
# number whenever NORMAL_MIN <= |v| < ROUND_TO_INF (the midpoint between the largest float32,
# (2 - 2**-23) * 2**127, and 2**128 rounds to even, i.e. to infinity). Sufficient, not necessary:
# a |v| just below 2**-126 may round up to it, and is conservatively treated as leaving the range.
NORMAL_MIN = 2.0**-126
ROUND_TO_INF = 2.0**128 - 2.0**103

PREDICTION_SCHEMA = pa.schema([
    *LAYER_FIELDS,
    pa.field("operand_digest", pa.string(), nullable=False),
    pa.field("max_abs_acc", pa.int64(), nullable=False),
    pa.field("headroom_bits", pa.float64(), nullable=False),
    pa.field("int32_bound_holds", pa.bool_(), nullable=False),
    pa.field("f32_exact", pa.bool_(), nullable=False),
    pa.field("pow2_setting", pa.string(), nullable=False),
    pa.field("weight_scales_exact", pa.bool_(), nullable=False),
    pa.field("products_normal", pa.bool_(), nullable=False),
    pa.field("predicted_bitwise_pow2", pa.bool_(), nullable=False),
])
PREDICTION_KEY = ["checkpoint", "phase", "layer"]


def snap_scales(scales: torch.Tensor, *, name: str) -> torch.Tensor:
    """Every positive scale snapped to its nearest power of two; an exact zero stays zero.

    A zero scale (an all-zero activation row) multiplies exactly already; anything else that is
    not a positive normal float (negative, subnormal, inf, NaN) makes ``snap_pow2`` raise.
    """
    return snap_pow2(scales, "nearest", name=name, keep_zero=True)


def snap_operands(op: Operands) -> Operands:
    """The same operands with both scale vectors snapped to the nearest power of two."""
    return replace(op, s_a=snap_scales(op.s_a, name=f"{op.layer} s_a"),
                   s_w=snap_scales(op.s_w, name=f"{op.layer} s_w"))


def headroom_bits(max_abs_acc: int) -> float:
    """log2(2**24 / max|acc|): bits to spare before float32 stops holding every accumulator.

    Negative when max|acc| exceeds 2**24. By convention max|acc| = 0 (an all-zero product, which
    float32 holds at any depth) has +inf headroom; the value is never NaN.
    """
    if max_abs_acc < 0:
        raise InputError(f"headroom_bits: max|acc| = {max_abs_acc} is negative")
    return math.inf if max_abs_acc == 0 else 24.0 - math.log2(max_abs_acc)


def _in_normal_range(v: torch.Tensor) -> torch.Tensor:
    """Where the exact product ``v`` (float64) is zero or rounds to a finite normal float32."""
    mag = v.abs()
    return (mag == 0) | ((mag >= NORMAL_MIN) & (mag < ROUND_TO_INF))


def products_normal(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> bool:
    """Whether both epilogue orders keep every float32 intermediate normal and finite.

    With ``x = f32(acc)`` and power-of-two (or zero) weight scales ``s_w``, the CUTLASS order
    computes ``round(s_a * (s_w * x))`` and the Triton order ``round(s_a * x) * s_w``. They are the
    same float32 number when, element by element, (a) ``|s_w * x|``, (b) ``|s_a * x|`` and
    (c) ``|s_a * s_w * x|`` are each zero or in [2**-126, 2**128 - 2**103): (a) makes the first
    CUTLASS product exact, (b) and (c) make rounding commute with the power-of-two factor and the
    second Triton product exact. The products are formed exactly in float64 (24-bit scale
    significands times |acc| <= 2**24 stay below 2**53; beyond that ``f32_exact`` already fails).
    """
    x = acc.abs().to(torch.float64)
    sa = s_a.to(torch.float64)[:, None]
    sw = s_w.to(torch.float64)[None, :]
    ok = _in_normal_range(x * sw) & _in_normal_range(x * sa) & _in_normal_range(x * sa * sw)
    return bool(ok.all().item())


def predict_layer(op: Operands, pow2_setting: str, device: torch.device) -> dict[str, object]:
    """The prediction row for one layer's operands (taken as captured, or snapped when asked).

    ``predicted_bitwise_pow2`` is true iff all of these hold:
    ``16256 * K < 2**31`` (int32 cannot overflow), ``max|acc| <= 2**24`` (float32 holds every
    accumulator exactly), every weight scale of the pow2 regime is a power of two or zero, and
    ``products_normal`` (no float32 intermediate of either epilogue order leaves the normal range).
    Then both orders compute the same float32 value and round it to the same bf16.
    """
    a_q, w_q = op.a_q.to(device), op.w_q.to(device)
    acc = exact_accumulator(a_q, w_q)
    max_abs = int(acc.abs().max().item()) if acc.numel() else 0
    regime = snap_operands(op) if pow2_setting == "pow2-snapped" else op
    s_a, s_w = regime.s_a.to(device), regime.s_w.to(device)
    bound = int32_bound_holds(int(op.k))
    f32_ok = max_abs <= F32_EXACT_BOUND
    weight_exact = bool((is_pow2(s_w) | (s_w == 0)).all().item())
    normal = products_normal(acc, s_a, s_w)
    return {
        "layer": op.layer, "block": int(op.block), "proj": op.proj,
        "m": int(op.m), "k": int(op.k), "n": int(op.n),
        "max_abs_acc": max_abs, "headroom_bits": headroom_bits(max_abs),
        "int32_bound_holds": bound, "f32_exact": f32_ok, "pow2_setting": pow2_setting,
        "weight_scales_exact": weight_exact, "products_normal": normal,
        "predicted_bitwise_pow2": bound and f32_ok and weight_exact and normal,
    }


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

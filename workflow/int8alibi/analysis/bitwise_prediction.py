"""What exact arithmetic predicts for one layer GEMM before any kernel runs.

The exact accumulator gives max |acc|, the headroom below 2**24 and the int32 bound; with the
scales these say whether two correct kernels *must* agree bit for bit once the scales are powers
of two (``predict_layer``). The prediction stage writes one ``PREDICTION_SCHEMA`` row per captured
layer; compare reads them (pinned) and applies the same rule to synthetic operands.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pyarrow as pa
import torch

from ..arith import F32_EXACT_BOUND, exact_accumulator, int32_bound_holds, is_pow2, snap_pow2
from ..kernels.capture_index import LAYER_FIELDS
from ..errors import InputError
from ..kernels.layer_operands import Operands

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

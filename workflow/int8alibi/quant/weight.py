"""llm-compressor's W8A8 weight rule (channel-wise symmetric int8), reproduced byte for byte.

Per output channel: ``s_w = bf16(absmax / 127.5)`` stored as bf16 [N,1], then
``q = round_half_even(clamp(W / s_w, -128, 127))``. Every float step is defined so that CPU and
GPU give the same bytes:

* absmax of a bf16 row is exact (a maximum of magnitudes);
* a quotient of two bf16 values is computed as an IEEE float32 division of two tensors (true
  division on both devices; a Python-scalar divisor may become a reciprocal multiply on CUDA, so
  none is used) and rounded once to bf16 with torch's float32 -> bf16 cast, which rounds to
  nearest even on CPU and CUDA (the tests pin it to ``arith.bf16_round`` on both). Since float32
  carries 24 >= 2*8 + 2 significand bits, rounding the float32 quotient to bf16 equals rounding the
  exact quotient once, which is what torch's bf16 division does on CPU (llm-compressor's path);
* ``division="float32"`` keeps the float32 quotient, as compressed-tensors' GPU (Triton) path does;
* clamp and ``torch.round`` (half to even) are exact on integers and halves.

The range is asymmetric: a row whose largest-magnitude weight is negative divides to -127.5 (or
just below), which rounds to -128; a positive one clamps 127.5 to 127. A row of zeros would have
scale 0; like llm-compressor we replace a zero scale by bf16's epsilon 2^-7, so the row quantizes
to zeros and nothing divides by zero.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from ..arith import snap_pow2
from ..errors import InputError

Division = Literal["bf16", "float32"]
Mode = Literal["none", "nearest", "ceiling"]

DIVISIONS: tuple[Division, ...] = ("bf16", "float32")
MODES: tuple[str, ...] = ("none", "nearest", "ceiling")
SCALE_DIVISOR = 127.5  # (q_max - q_min) / 2 for int8: 255 / 2, exact in bf16
Q_MIN, Q_MAX = -128, 127
ZERO_ROW_SCALE = 2.0**-7  # torch.finfo(torch.bfloat16).eps, llm-compressor's stand-in for a zero scale


class QuantizedWeight(NamedTuple):
    """One layer's quantized weight as stored: ``w_q`` int8 [N,K], ``s_w`` bf16 [N,1]."""

    w_q: torch.Tensor
    s_w: torch.Tensor


def _absmax(w: torch.Tensor, what: str) -> torch.Tensor:
    """Row absmax [N,1] of a bf16 [N,K] weight; a NaN or inf anywhere makes its row's absmax non-finite."""
    if not isinstance(w, torch.Tensor) or w.dtype != torch.bfloat16 or w.dim() != 2:
        got = f"{w.dtype} {tuple(w.shape)}" if isinstance(w, torch.Tensor) else type(w).__name__
        raise InputError(f"{what}: weight must be a 2-D torch.bfloat16 tensor [N,K], got {got}")
    absmax = w.abs().amax(dim=1, keepdim=True)  # amax propagates NaN
    if not bool(torch.isfinite(absmax).all()):
        raise InputError(f"{what}: weight has {int((~torch.isfinite(w)).sum())} non-finite element(s)")
    return absmax


def _check_scale(s_w: torch.Tensor, rows: int, what: str) -> None:
    if not isinstance(s_w, torch.Tensor) or s_w.dtype != torch.bfloat16 or tuple(s_w.shape) != (rows, 1):
        got = f"{s_w.dtype} {tuple(s_w.shape)}" if isinstance(s_w, torch.Tensor) else type(s_w).__name__
        raise InputError(f"{what}: scale must be torch.bfloat16 of shape [{rows}, 1], got {got}")
    bad = ~torch.isfinite(s_w) | (s_w <= 0)
    if bool(bad.any()):
        raise InputError(f"{what}: {int(bad.sum())} scale(s) are zero, negative or non-finite")


def _bf16_quotient(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """bf16(num / den) for bf16 tensors: one float32 true division, one round-to-nearest-even cast."""
    return (num.float() / den.float()).to(torch.bfloat16)


def _scale(absmax: torch.Tensor) -> torch.Tensor:
    scale = _bf16_quotient(absmax, torch.full_like(absmax, SCALE_DIVISOR))
    return torch.where(scale == 0, torch.full_like(scale, ZERO_ROW_SCALE), scale)


def codes(quot: torch.Tensor) -> torch.Tensor:
    """int8 ``round_half_even(clamp(quot, -128, 127))`` of float32 quotients."""
    return torch.round(quot.clamp(Q_MIN, Q_MAX)).to(torch.int8)


def _clipped(quot: torch.Tensor) -> torch.Tensor:
    return ((quot < Q_MIN) | (quot > Q_MAX)).sum(dim=1)


def channel_scale(w: torch.Tensor, *, what: str = "weight") -> torch.Tensor:
    """``bf16(absmax / 127.5)`` per output row of bf16 ``w`` [N,K], as bf16 [N,1]; zero rows get 2^-7."""
    return _scale(_absmax(w, what))


def quotient(w: torch.Tensor, s_w: torch.Tensor, division: Division) -> torch.Tensor:
    """``W / s_w`` as float32 values, rounded to bf16 first when ``division == "bf16"``."""
    if division not in DIVISIONS:
        raise InputError(f"weight division {division!r} unknown (expected one of {list(DIVISIONS)})")
    if division == "bf16":
        return _bf16_quotient(w, s_w.expand_as(w)).float()
    return w.float() / s_w.float().expand_as(w)


def check_weight_and_scale(w: torch.Tensor, s_w: torch.Tensor, what: str) -> None:
    """InputError unless ``w`` is a finite bf16 [N,K] weight and ``s_w`` a positive finite bf16 [N,1] scale."""
    _absmax(w, what)
    _check_scale(s_w, w.shape[0], what)


def quantize_with_scale(w: torch.Tensor, s_w: torch.Tensor, division: Division, *,
                        what: str = "weight") -> torch.Tensor:
    """int8 ``round_half_even(clamp(W / s_w, -128, 127))`` for a given bf16 scale [N,1]."""
    check_weight_and_scale(w, s_w, what)
    return codes(quotient(w, s_w, division))


def clipped_per_row(w: torch.Tensor, s_w: torch.Tensor, division: Division, *, what: str = "weight") -> torch.Tensor:
    """Elements per row whose quotient lay outside [-128, 127], i.e. that the clamp changed (int64 [N])."""
    check_weight_and_scale(w, s_w, what)
    return _clipped(quotient(w, s_w, division))


def requantize_counted(w: torch.Tensor, mode: Mode, division: Division = "bf16", *,
                       what: str = "weight") -> tuple[QuantizedWeight, torch.Tensor]:
    """``requantize`` plus the clipped elements per row (int64 [N]), from the same quotient."""
    if mode not in MODES:
        raise InputError(f"requantize mode {mode!r} unknown (expected one of {list(MODES)})")
    s_w = _scale(_absmax(w, what))
    if mode != "none":
        s_w = snap_pow2(s_w, mode, name=f"{what} scales")
    quot = quotient(w, s_w, division)
    return QuantizedWeight(codes(quot), s_w), _clipped(quot)


def requantize(w: torch.Tensor, mode: Mode, division: Division = "bf16", *,
               what: str = "weight") -> QuantizedWeight:
    """The rule with the scale left alone (``none``) or snapped to a power of two, int8 recomputed.

    ``nearest`` is 2^round(log2 s) (may be smaller than s, so some weights clip); ``ceiling`` is
    2^ceil(log2 s) (never smaller). Dividing by a power of two is exact, so the two divisions agree
    for the snapped arms.
    """
    return requantize_counted(w, mode, division, what=what)[0]


def quantize_weight(w: torch.Tensor, division: Division = "bf16", *, what: str = "weight") -> QuantizedWeight:
    """The unconstrained llm-compressor W8A8 rule: channel scale, then int8 under it."""
    return requantize(w, "none", division, what=what)


def rewritten_probe(w_q: torch.Tensor, s_w: torch.Tensor, mode: Literal["nearest", "ceiling"] = "nearest", *,
                    what: str = "weight") -> QuantizedWeight:
    """The stored scales snapped to a power of two, the OLD int8 weights kept (a weight-scale mismatch)."""
    if not isinstance(w_q, torch.Tensor) or w_q.dtype != torch.int8 or w_q.dim() != 2:
        raise InputError(f"{what}: probe needs int8 [N,K] weights, got {getattr(w_q, 'dtype', type(w_q))}")
    _check_scale(s_w, w_q.shape[0], what)
    return QuantizedWeight(w_q, snap_pow2(s_w, mode, name=f"{what} scales"))

"""Layer-level batch invariance: every captured row computed inside batches of other sizes and other
rows, against its own output when the whole captured batch runs at once.

The reference for a row is the GEMM's output at the captured M. For each registered M, seeded draws
take M distinct rows in random order (``co_batches``), so a row sits among strangers; each drawn
batch goes through the same GEMM and every one of its rows is compared with its reference row, bit
for bit and in bf16 ulps. A GEMM here is any ``(a_q, w_q, s_a, s_w) -> bf16`` callable: a kernel
arm, or a contrast computed on the same operands in bf16 or FP8 (``contrast_gemms``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import torch

from ..arith.ulp import bf16_bits, ulp_distance
from ..errors import InputError

Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
INT8 = "int8"

# One row per (checkpoint, layer, gemm, M): what the report and the summary read.
LAYER_SCHEMA = pa.schema([
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("layer", pa.string(), nullable=False),
    pa.field("gemm", pa.string(), nullable=False),           # a kernel arm's name, or a contrast: bf16, fp8
    pa.field("kind", pa.string(), nullable=False),           # int8, bf16, fp8: which prediction applies
    pa.field("captured_m", pa.int32(), nullable=False),
    pa.field("m", pa.int32(), nullable=False),
    pa.field("draws", pa.int32(), nullable=False),
    pa.field("rows", pa.int32(), nullable=False),            # rows compared: M x draws
    pa.field("rows_differing", pa.int32(), nullable=False),  # rows with any output bit unlike the reference
    pa.field("elements_differing", pa.int64(), nullable=False),
    pa.field("max_ulp", pa.int32(), nullable=True),          # over finite pairs; null: no finite pair
    pa.field("nonfinite_differing", pa.int64(), nullable=False),  # differing pairs where either is inf/NaN
])
LAYER_KEY = ["checkpoint", "layer", "gemm", "m"]


@dataclass(frozen=True)
class CoBatch:
    """One drawn batch: ``m`` distinct captured rows (indices, in the order they are stacked)."""

    m: int
    draw: int
    rows: torch.Tensor


def co_batches(captured: int, ms: Sequence[int], draws: int, seed: int, where: str) -> list[CoBatch]:
    """``draws`` batches per M of distinct rows out of ``captured``, in random order, seeded on the
    CPU (the same rows on every device). An M outside 1..captured is refused, naming ``where``."""
    bad = [m for m in ms if not 1 <= int(m) <= captured]
    if bad or draws < 1:
        raise InputError(f"{where}: batch sizes {bad or list(ms)} (draws {draws}) do not fit the {captured} "
                         f"captured rows (each M must be 1..{captured}, draws >= 1)")
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    return [CoBatch(int(m), d, torch.randperm(captured, generator=g)[: int(m)])
            for m in ms for d in range(draws)]


def measure(gemm: Gemm, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
            batches: Sequence[CoBatch], where: str) -> list[dict[str, Any]]:
    """Per M: rows compared, rows and elements differing from the full-batch reference, max ulp.

    Bits are compared first; ulps are computed only on rows that differ (the INT8 arms' usual case
    is that none do, and then the largest distance is 0 wherever a finite pair exists)."""
    reference = gemm(a_q, w_q, s_a, s_w)
    if reference.dtype != torch.bfloat16 or tuple(reference.shape) != (a_q.shape[0], w_q.shape[0]):
        raise InputError(f"{where}: returned {reference.dtype} {tuple(reference.shape)}, expected bf16 "
                         f"[{a_q.shape[0]}, {w_q.shape[0]}]")
    reference_bits = bf16_bits(reference)
    finite_rows = torch.isfinite(reference).any(dim=1)
    per_m: dict[int, dict[str, Any]] = {}
    for batch in batches:
        idx = batch.rows.to(a_q.device)
        out = gemm(a_q.index_select(0, idx), w_q, s_a.index_select(0, idx), s_w)
        if out.dtype != torch.bfloat16 or tuple(out.shape) != (batch.m, w_q.shape[0]):
            raise InputError(f"{where}: at M={batch.m} returned {out.dtype} {tuple(out.shape)}, expected "
                             f"torch.bfloat16 ({batch.m}, {w_q.shape[0]})")
        differ = bf16_bits(out) != reference_bits.index_select(0, idx)
        row = per_m.setdefault(batch.m, {"m": batch.m, "draws": 0, "rows": 0, "rows_differing": 0,
                                         "elements_differing": 0, "max_ulp": None, "nonfinite_differing": 0})
        row["draws"] += 1
        row["rows"] += batch.m
        worst = 0 if bool(finite_rows.index_select(0, idx).any()) else None
        hit = differ.any(dim=1)
        if bool(hit.any()):
            rows = hit.nonzero().flatten()
            distance = ulp_distance(out.index_select(0, rows), reference.index_select(0, idx[rows]))
            finite = distance >= 0
            row["rows_differing"] += int(rows.numel())
            row["elements_differing"] += int(differ.sum())
            row["nonfinite_differing"] += int((differ.index_select(0, rows) & ~finite).sum())
            if bool(finite.any()):
                worst = max(worst or 0, int(distance[finite].max()))
        if worst is not None:
            row["max_ulp"] = worst if row["max_ulp"] is None else max(row["max_ulp"], worst)
    return [per_m[m] for m in sorted(per_m)]


def dequantized_bf16(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``q * s`` per row in float32, rounded to bf16: the values the INT8 operands stand for."""
    return (q.to(torch.float32) * s[:, None]).to(torch.bfloat16)


class Bf16Gemm:
    """The bf16 contrast: the dequantized operands multiplied in bf16 by ``torch.matmul``. The
    weight's dequantized copy is kept while the very same weight tensors, unchanged, come back (one
    layer's draws); they are held, so their memory cannot be reused by another layer's."""

    def __init__(self) -> None:
        self._held: tuple[torch.Tensor, torch.Tensor, int, int] | None = None
        self._weight: torch.Tensor | None = None

    def __call__(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        held = self._held
        if held is None or held[0] is not w_q or held[1] is not s_w or held[2:] != (w_q._version, s_w._version) \
                or self._weight is None:
            self._weight = dequantized_bf16(w_q, s_w).t()
            self._held = (w_q, s_w, w_q._version, s_w._version)
        return torch.matmul(dequantized_bf16(a_q, s_a), self._weight)


def fp8_gemm(device: torch.device) -> tuple[Gemm | None, str]:
    """The FP8 contrast on ``device`` (None and why where it cannot run): the dequantized values
    requantized per row to e4m3 and multiplied by ``torch._scaled_mm`` (the K sweep's FP8 arm)."""
    from ..ksweep.arms import runner
    from ..ksweep.operands import Quantized, fp8_per_row

    run, why = runner("torch-scaled-mm", "fp8", device)
    if run is None:
        return None, why

    def gemm(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        qa, sa = fp8_per_row(a_q.to(torch.float32) * s_a[:, None])
        qw, sw = fp8_per_row(w_q.to(torch.float32) * s_w[:, None])
        return run(Quantized(qa, qw, sa, sw))

    return gemm, why


def contrast_gemms(names: Sequence[str], device: torch.device) -> dict[str, tuple[Gemm | None, str]]:
    """Contrast name -> (its GEMM on ``device`` or None, what it is or why it did not run)."""
    made: dict[str, tuple[Gemm | None, str]] = {}
    for name in names:
        if name == "bf16":
            made[name] = (Bf16Gemm(), f"torch.matmul in bf16 on {device.type}")
        elif name == "fp8":
            made[name] = fp8_gemm(device)
        else:
            raise InputError(f"batch: unknown contrast {name!r} (expected bf16 or fp8)")
    return made


def layer_rows(checkpoint: str, layer: str, operands: Any, gemms: Mapping[str, tuple[str, Gemm]],
               batches: Sequence[CoBatch]) -> list[dict[str, Any]]:
    """Rows of ``LAYER_SCHEMA`` for one captured layer: every GEMM (name -> (kind, callable)) at every M."""
    rows = []
    for name, (kind, gemm) in gemms.items():
        where = f"batch {checkpoint}/{layer} on {name}"
        for r in measure(gemm, operands.a_q, operands.w_q, operands.s_a, operands.s_w, batches, where):
            rows.append({"checkpoint": checkpoint, "layer": layer, "gemm": name, "kind": kind,
                         "captured_m": int(operands.a_q.shape[0]), **r})
    return rows

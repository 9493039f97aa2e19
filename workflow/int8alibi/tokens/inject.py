"""End-to-end fault injection: the campaign's faults (faults.yaml) inside every W8A8 linear of the model.

Arm A is the campaign's reference pipeline (``faults.pipeline``: exact accumulator wrapped to
int32, ``bf16_rne((f32(acc) * s_a) * s_w)``) in every linear; arm B is the same pipeline with one
fault of ``faults.catalogue``. Both run where the kernel runs (``W8A8Linear`` calls them), so a
fault reaches the logits through the model's own code.

``InjectionArm`` serves one linear during one window for a batch of copies of that window, each
copy with its own cell (or none: the reference). Every copy's output is what the arm would give
that copy alone: seeded choices (which output elements a severity reaches, which activation
element or scales F9 moves, F6/F7's depths) depend only on the copy's own rows and on the fault
site (layer, window), through the campaign's per-cell generator. What copies can share is shared
without changing a bit: the exact accumulator (integers) is one matmul for the batch, the
reference epilogue and each epilogue fault are elementwise, and F5's tile sums are row by row.

Adapter notes (model level vs ``faults.campaign``): every fault, F9's and F7's seeded steps
included, is applied by ``faults.catalogue``, as in the campaign's two engines; severity picks use
the campaign's ``picked_elements``/``cell_rng`` with the site ``"<layer>|window <w>"`` in place of
the layer name. The regime is the checkpoint (own or pow2-nearest weight scales); activation
scales are the dynamic per-token ones in both, never snapped, because that is what the model
computes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import cast

import numpy as np
import torch

from ..arith import F32_EXACT_BOUND, INT8_PRODUCT_MAX, exact_accumulator, wrap_int32
from ..errors import InputError
from ..faults import catalogue as cat
from ..faults.campaign import CampaignSettings, cell_rng, picked_elements
from ..faults.pipeline import epilogue, tile_partial_sums
from ..kernels.base import arm_evidence, check_operands

NAME = "fault-injection"


@dataclass(frozen=True)
class Cell:
    """One injection cell: a fault, its severity rung and the regime (checkpoint) it runs in."""

    fault: str
    severity: str
    regime: str

    @property
    def label(self) -> str:
        return f"{self.fault} {self.severity}"

    @property
    def both_arms(self) -> bool:
        return self.fault in cat.INFLATING


def cells(regime: str) -> list[Cell]:
    """Every (fault, severity) of the campaign's catalogue in one regime, in catalogue order."""
    return [Cell(f, s, regime) for f, severities in cat.FAULT_SEVERITIES.items() for s in severities]


def exact_int(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """The exact accumulator (int64). On a GPU, while ``K * 16384 <= 2^24``, one float32 matmul is
    exact in any order (``faults.pipeline.tile_partial_sums`` with one tile); otherwise, and on
    the CPU, ``arith.exact_accumulator`` (the same integers by the CPU's fastest exact route)."""
    k = a_q.shape[1]
    if a_q.device.type != "cpu" and 0 < k and k * INT8_PRODUCT_MAX <= F32_EXACT_BOUND:
        return next(tile_partial_sums(a_q, w_q, k)).to(torch.int64)
    return exact_accumulator(a_q, w_q)


class InjectionArm:
    """One W8A8 linear during one window, for ``len(copies)`` copies of ``rows`` tokens each.

    ``copies[i]`` is the cell copy i runs, or None for the fault-free reference pipeline.
    """

    is_emulation = True

    def __init__(self, copies: Sequence[Cell | None], rows: int, layer: str, window: int,
                 settings: CampaignSettings, device: torch.device) -> None:
        for cell in copies:
            if cell is not None and (cell.fault not in cat.FAULT_SEVERITIES
                                     or cell.severity not in cat.FAULT_SEVERITIES[cell.fault]):
                raise InputError(f"fault injection: {cell.fault} has no severity {cell.severity!r}")
        if not copies or rows < 1:
            raise InputError(f"{layer}: an injection arm needs at least one copy of at least one row")
        self.copies, self.rows, self.layer, self.window = list(copies), rows, layer, window
        self.settings, self.device = settings, device
        self.name = NAME

    @property
    def site(self) -> str:
        """The fault site that keys the seeded draws: this linear during this window."""
        return f"{self.layer}|window {self.window}"

    def available(self) -> tuple[bool, str]:
        return True, "fault injection on the campaign's reference pipeline (torch ops, any device)"

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> None:
        """Faulted copies change what the accumulator means; the arm exposes only its output."""
        return None

    def evidence(self) -> dict[str, object]:
        return arm_evidence(NAME, "int8alibi.tokens.inject: arm A = faults.pipeline reference "
                            "(exact accumulator wrapped to int32, bf16_rne((f32(acc) * s_a) * s_w)); arm B = arm A "
                            "with one faults.catalogue fault in every W8A8 linear", self.device, is_emulation=True)

    def _rng(self, cell: Cell) -> np.random.Generator:
        return cell_rng(self.settings.seed, self.site, cell.fault, cell.severity, cell.regime)

    def scaled_mm(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        m, _, n = check_operands(a_q, w_q, s_a, s_w, f"{NAME} {self.layer}")
        if m != self.rows * len(self.copies):
            raise InputError(f"{self.layer}: {m} rows reached the injection arm, expected {len(self.copies)} copies "
                             f"x {self.rows} tokens")
        k = a_q.shape[1]
        exact = exact_int(a_q, w_q)
        acc32 = wrap_int32(exact, bound=k * INT8_PRODUCT_MAX)
        out = epilogue(acc32, s_a, s_w)
        r = self.rows
        position = 0
        for fault, run in groupby(self.copies, key=lambda c: None if c is None else c.fault):
            group = list(run)
            rows = slice(position * r, (position + len(group)) * r)
            if fault in cat.EPILOGUE_FAULTS:
                f5 = functools.partial(cat.fused_reduction, a_q[rows], w_q, s_w, self.settings.tile_width)
                y = cat.epilogue_fault(fault, acc32[rows].to(torch.float32), s_a[rows], s_w, f5)
                for i, cell in enumerate(group):
                    self._show(out, y, position + i, i, cast(Cell, cell), n)
            elif fault in cat.INFLATING or fault in cat.OPERAND_FAULTS:
                for i, cell in enumerate(group):
                    block = slice((position + i) * r, (position + i + 1) * r)
                    out[block] = self._operand_fault(cast(Cell, cell), exact[block], acc32[block], a_q[block], w_q,
                                                     s_a[block], s_w)
            position += len(group)  # None (reference) and F8 (nothing changed) keep the reference rows
        return out

    def _show(self, out: torch.Tensor, y: torch.Tensor, copy: int, within: int, cell: Cell, n: int) -> None:
        """Copy ``copy`` shows arm B's output ``y`` (rows of its group) where its severity reaches."""
        r = self.rows
        src = y[within * r:(within + 1) * r]
        picks = picked_elements(self._rng(cell), cell.severity, r * n, self.settings.pct_fraction)
        if picks is None:
            out[copy * r:(copy + 1) * r] = src
            return
        where = torch.as_tensor(picks, device=out.device)
        target = out[copy * r:(copy + 1) * r].reshape(-1)  # a view: rows of one copy are contiguous
        target[where] = src.reshape(-1)[where]

    def _operand_fault(self, cell: Cell, exact: torch.Tensor, acc32: torch.Tensor, a_q: torch.Tensor,
                       w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        """F6, F7 (inflated depth) and F9 (other operands) on one copy's rows."""
        k = a_q.shape[1]
        if cell.fault in cat.INFLATING:
            accumulate = functools.partial(exact_accumulator, w_q=w_q)
            inf = cat.inflate(cell.fault, exact, a_q, w_q, accumulate, self.settings.thresholds)
            return epilogue(wrap_int32(inf.checked(f"{self.layer} (window {self.window})").exact), s_a, s_w)
        if cell.severity == "all":
            return epilogue(wrap_int32(exact_int(cat.step_all(a_q), w_q), bound=k * INT8_PRODUCT_MAX), s_a, s_w)
        rng = self._rng(cell)
        if cell.severity == "one":
            row, col = cat.one_position(rng, a_q.shape[0], k)
            return epilogue(cat.step_one(a_q, exact, acc32, w_q, row, col).acc32, s_a, s_w)
        rows = cat.pct_rows(rng, a_q.shape[0], self.settings.pct_fraction)
        return epilogue(acc32, cat.nudge_scales(s_a, torch.as_tensor(rows, device=s_a.device)), s_w)

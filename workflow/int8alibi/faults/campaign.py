"""The fault campaign: every cell (fault x severity x regime) of one layer, then layer after layer.

Cells of a layer share almost everything, so a layer is computed once, on its device:
* one exact accumulator, and one pass over the K-tiles for fault F5's float32 reductions in
  both regimes;
* F6 and F7 inflate the depth by tiling the operands r times along K, which multiplies the exact
  accumulator by r: derived, never recomputed (F7 may first boost one activation row);
* F9's one-element rung is a rank-one update of one accumulator row;
* an epilogue fault's full output is computed once per regime, and each severity is read off its
  sparse difference to the reference at the seeded positions (``checks.ElementDiff``).
Layers stream: only one layer's tensors are alive at a time.

Cell semantics (preregistration/faults.yaml): arm A is the reference pipeline, arm B the same
pipeline with the fault. ``changed_elements`` counts the elements of arm B's output that differ
bitwise from the layer's fault-free reference output (arm A on the layer's own operands, same
regime); a cell with none is unobservable. ``max_ulp`` is the largest finite ulp distance between
the cell's two arms, what check 6 sees.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from ..arith import exact_accumulator, wrap_int32
from .checks import (CellEvidence, ElementDiff, EvidenceColumns, OperandSet, OutputComparison, Thresholds,
                     accumulator_matches, all_pow2, count_differing, nonfinite_index, operands_identical,
                     ordered_positions)
from ..errors import InputError, ProtocolError
from ..kernels.layer_operands import Operands
from . import catalogue as cat
from .catalogue import EPILOGUE_FAULTS, FAULT_SEVERITIES, INFLATING, SEVERITIES, fraction_count
from .pipeline import REGIMES, Regime, as_scales, epilogue, regime_scales
from .rows import CellColumns, check_layer, strings

CELLS_PER_LAYER = sum(len(s) for s in FAULT_SEVERITIES.values()) * len(REGIMES)


@dataclass(frozen=True)
class CampaignSettings:
    """The pinned parameters a campaign runs with (faults.yaml and thresholds.yaml)."""

    thresholds: Thresholds
    tile_width: int
    pct_fraction: Fraction
    seed: int

    @classmethod
    def from_protocol(cls, protocol: Any) -> "CampaignSettings":
        """Read the settings from a loaded ``int8alibi.protocol.Protocol``; refuse a catalogue this
        module does not implement (another fault list, severity set or regime), naming the file."""
        faults = protocol.faults
        declared = {fid: tuple(info.severities) for fid, info in protocol.fault_info().items()}
        if declared != FAULT_SEVERITIES:
            raise ProtocolError(f"faults.yaml: fault catalogue {declared} is not the one the campaign implements "
                                f"({FAULT_SEVERITIES})")
        regimes = {name: spec.get("snap") for name, spec in faults["regimes"].items()}
        if regimes != {"own": None, "pow2": "nearest"}:
            raise ProtocolError(f"faults.yaml: regimes {regimes} are not the campaign's (own as given, pow2 nearest)")
        if faults["severities"]["one"]["elements"] != 1:
            raise ProtocolError("faults.yaml: severity 'one' must reach exactly one element")
        f5 = {f["id"]: f for f in faults["faults"]}["F5"]
        return cls(
            thresholds=Thresholds.from_protocol(protocol.thresholds),
            tile_width=int(f5["params"]["tile_width"]),
            pct_fraction=Fraction(str(faults["severities"]["pct"]["fraction"])),
            seed=int(faults["seed"]),
        )


def cell_rng(seed: int, layer: str, fault: str, severity: str, regime: str) -> np.random.Generator:
    """The generator of one cell, derived from the seed and the cell's identity only.

    A cell's draws therefore do not depend on which other cells or layers run, or in what order
    (shards of a scattered campaign draw exactly what a single run draws). Drawn on the host, so
    the picks are the same on every device.
    """
    digest = hashlib.sha256(f"{seed}|{layer}|{fault}|{severity}|{regime}".encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


def picked_elements(rng: np.random.Generator, severity: str, total: int, fraction: Fraction) -> np.ndarray | None:
    """Sorted flat output positions a severity reaches (None for ``all``): one, or a fraction
    drawn without replacement."""
    if severity == "all":
        return None
    if severity == "one":
        return np.array([rng.integers(total)], dtype=np.int64)
    count = fraction_count(fraction, total)
    return np.sort(rng.choice(total, size=count, replace=False, shuffle=False)).astype(np.int64)


class _Facts:
    """Per-layer memo of facts about tensors many cells share, keyed by object identity.

    The keyed objects are held here while the memo lives, so an identity cannot be reused.
    """

    def __init__(self) -> None:
        self._values: dict[tuple[int, ...], Any] = {}
        self._held: list[tuple[object, ...]] = []

    def get(self, objects: tuple[object, ...], compute: Callable[[], Any]) -> Any:
        key = tuple(id(o) for o in objects)
        if key not in self._values:
            self._values[key] = compute()
            self._held.append(objects)
        return self._values[key]


@dataclass(frozen=True)
class _Arm:
    """One arm of a cell: what it received and the int32 accumulator it held."""

    operands: OperandSet
    acc32: torch.Tensor


@dataclass(frozen=True)
class _Reference:
    """The layer's fault-free output in one regime, with facts every comparison against it reuses."""

    y: torch.Tensor
    nonfinite: torch.Tensor
    ordered: torch.Tensor

    def diff(self, y_b: torch.Tensor) -> ElementDiff:
        return ElementDiff.of(self.y, y_b, nonfinite_a=self.nonfinite, ordered_a=self.ordered)


@dataclass(frozen=True)
class _Cell:
    fault: str
    severity: str
    regime: str
    evidence: CellEvidence
    changed: int
    repeats: int
    boosted: bool


def _validate(op: Operands) -> None:
    for name in ("a_q", "w_q"):
        t = getattr(op, name)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int8 or t.dim() != 2:
            raise InputError(f"layer {op.layer!r}: {name} must be a 2-D int8 tensor")
    if op.a_q.shape[1] != op.w_q.shape[1]:
        raise InputError(f"layer {op.layer!r}: reduction depths differ "
                         f"(a_q {tuple(op.a_q.shape)}, w_q {tuple(op.w_q.shape)})")
    if 0 in (*op.a_q.shape, op.w_q.shape[0]):
        raise InputError(f"layer {op.layer!r}: empty operands {tuple(op.a_q.shape)} x {tuple(op.w_q.shape)}")


class _LayerRun:
    """All cells of one layer on one device."""

    def __init__(self, op: Operands, settings: CampaignSettings, device: torch.device) -> None:
        _validate(op)
        self.op, self.settings = op, settings
        self.name = f"layer {op.layer!r}"
        self.facts = _Facts()
        self.a_q, self.w_q = op.a_q.to(device), op.w_q.to(device)
        self.m, self.k = self.a_q.shape
        self.n = self.w_q.shape[0]
        s_a = as_scales(op.s_a.to(device), self.m, f"{self.name} s_a")
        s_w = as_scales(op.s_w.to(device), self.n, f"{self.name} s_w")
        self.scales = {r: (regime_scales(s_a, r, f"{self.name} s_a"), regime_scales(s_w, r, f"{self.name} s_w"))
                       for r in REGIMES}
        self.acc = exact_accumulator(self.a_q, self.w_q)
        # F5's float32 reductions in both regimes, sharing one pass over the K-tiles.
        totals = cat.fused_reduction(self.a_q, self.w_q, torch.stack([self.scales[r][1] for r in REGIMES]),
                                     settings.tile_width)
        self.f5_totals = dict(zip(REGIMES, totals))
        self.absmax = int(self.acc.abs().max().item())
        self.acc32 = wrap_int32(self.acc, bound=self.absmax)
        self.acc_f32 = self.acc32.to(torch.float32)

    def _evidence(self, a: _Arm, b: _Arm, exact_a: torch.Tensor, absmax: int,
                  outputs: OutputComparison) -> CellEvidence:
        f = self.facts
        scales = (a.operands.s_a, a.operands.s_w, b.operands.s_a, b.operands.s_w)
        return CellEvidence(
            operands_identical=f.get((a.operands, b.operands), lambda: operands_identical(a.operands, b.operands)),
            k=(a.operands.k, b.operands.k),
            exact_absmax=absmax,
            accumulators=all(f.get((acc, exact_a), functools.partial(accumulator_matches, acc, exact_a))
                             for acc in (a.acc32, b.acc32)),
            scales_pow2=all(f.get((s,), functools.partial(all_pow2, s)) for s in scales),
            outputs=outputs,
        )

    def _draw(self, fault: str, severity: str, regime: str) -> np.random.Generator:
        return cell_rng(self.settings.seed, self.op.layer, fault, severity, regime)

    def cells(self) -> Iterator[_Cell]:
        """Every cell of the layer, regime by regime."""
        inflated = {fault: self._inflate(fault) for fault in INFLATING}
        operand_all = cat.step_all(self.a_q)
        acc_all = exact_accumulator(operand_all, self.w_q)
        absmax_b = int(acc_all.abs().max().item())
        acc32_all, absmax_all = wrap_int32(acc_all, bound=absmax_b), max(self.absmax, absmax_b)
        del acc_all
        for regime in REGIMES:
            s_a, s_w = self.scales[regime]
            base = _Arm(OperandSet(self.a_q, self.w_q, s_a, s_w), self.acc32)
            y_ref = epilogue(self.acc32, s_a, s_w)
            ref = _Reference(y_ref, nonfinite_index(y_ref), ordered_positions(y_ref))
            yield from self._epilogue_cells(regime, base, ref)
            for fault, (inf, acc32) in inflated.items():
                repeats, absmax = int(inf.repeats.item()), int(inf.absmax.item())
                arm = _Arm(OperandSet(inf.a_q, self.w_q, s_a, s_w, repeats=repeats), acc32)
                y = epilogue(acc32, s_a, s_w)
                changed = count_differing(ref.y, y)
                ev = self._evidence(arm, arm, inf.exact, absmax, ElementDiff.of(y, y).summary())
                yield _Cell(fault, "all", regime, ev, changed, repeats, bool(inf.boosted.item()))
            ev = self._evidence(base, base, self.acc, self.absmax, ref.diff(ref.y).summary())
            yield _Cell("F8", "all", regime, ev, ev.outputs.differing, 1, False)
            arm_all = _Arm(OperandSet(operand_all, self.w_q, s_a, s_w), acc32_all)
            yield self._operand_cell(regime, "all", base, arm_all, ref, absmax_all)
            yield self._step_one(regime, base, ref)
            yield self._nudge(regime, base, ref)

    def _epilogue_cells(self, regime: Regime, base: _Arm, ref: _Reference) -> Iterator[_Cell]:
        s_a, s_w = self.scales[regime]
        total = self.m * self.n
        for fault in EPILOGUE_FAULTS:
            diff = ref.diff(cat.epilogue_fault(fault, self.acc_f32, s_a, s_w, lambda: self.f5_totals[regime]))
            for severity in SEVERITIES:
                rng = self._draw(fault, severity, regime)
                picks = picked_elements(rng, severity, total, self.settings.pct_fraction)
                where = None if picks is None else torch.as_tensor(picks, device=ref.y.device)
                outputs = diff.summary(where)
                ev = self._evidence(base, base, self.acc, self.absmax, outputs)
                yield _Cell(fault, severity, regime, ev, outputs.differing, 1, False)

    def _inflate(self, fault: str) -> tuple[cat.Inflation, torch.Tensor]:
        """F6 or F7 (``catalogue.inflate``) and the int32 accumulator at its depth."""
        accumulate = functools.partial(exact_accumulator, w_q=self.w_q)
        inf = cat.inflate(fault, self.acc, self.a_q, self.w_q, accumulate, self.settings.thresholds).checked(self.name)
        return inf, wrap_int32(inf.exact, bound=int(inf.absmax.item()))

    def _step_one(self, regime: Regime, base: _Arm, ref: _Reference) -> _Cell:
        """One activation element moved: only accumulator row ``row`` changes (a rank-one update)."""
        s_a, s_w = self.scales[regime]
        row, col = cat.one_position(self._draw("F9", "one", regime), self.m, self.k)
        one = cat.step_one(self.a_q, self.acc, self.acc32, self.w_q, row, col)
        operand = cat.stepped_operand(self.a_q, row, col, int(one.step.item()))
        # Rows other than `row` are arm A's, so the larger of the two maxima is over A's rows and this one.
        absmax = max(self.absmax, int(one.row.abs().max().item()))
        return self._operand_cell(regime, "one", base, _Arm(OperandSet(operand, self.w_q, s_a, s_w), one.acc32),
                                  ref, absmax)

    def _nudge(self, regime: Regime, base: _Arm, ref: _Reference) -> _Cell:
        """A fraction of the activation scales moved one float32 step up; the int8 tensors untouched."""
        s_a, s_w = self.scales[regime]
        rows = cat.pct_rows(self._draw("F9", "pct", regime), self.m, self.settings.pct_fraction)
        s_a_pct = cat.nudge_scales(s_a, torch.as_tensor(rows, device=s_a.device))
        arm = _Arm(OperandSet(self.a_q, self.w_q, s_a_pct, s_w), self.acc32)
        return self._operand_cell(regime, "pct", base, arm, ref, self.absmax)

    def _operand_cell(self, regime: Regime, severity: str, base: _Arm, arm_b: _Arm, ref: _Reference,
                      absmax: int) -> _Cell:
        """An F9 cell: arm B runs the reference pipeline on its own (different) operands."""
        y_b = epilogue(arm_b.acc32, arm_b.operands.s_a, arm_b.operands.s_w)
        outputs = ref.diff(y_b).summary()
        ev = self._evidence(base, arm_b, self.acc, absmax, outputs)
        return _Cell("F9", severity, regime, ev, outputs.differing, 1, False)


def layer_cells(op: Operands, cells: Iterable[_Cell]) -> CellColumns:
    """The per-cell engine's cells of one layer as columns (``CELLS_PER_LAYER`` of them)."""
    cells = list(cells)
    check_layer(op.layer, len(cells), CELLS_PER_LAYER)
    outputs = [c.evidence.outputs for c in cells]
    evidence = EvidenceColumns(
        operands_identical=np.array([c.evidence.operands_identical for c in cells], dtype=bool),
        k=np.array([c.evidence.k for c in cells], dtype=np.int64).reshape(-1, 2),
        exact_absmax=np.array([c.evidence.exact_absmax for c in cells], dtype=np.int64),
        accumulators=np.array([c.evidence.accumulators for c in cells], dtype=bool),
        scales_pow2=np.array([c.evidence.scales_pow2 for c in cells], dtype=bool),
        elements=np.array([o.elements for o in outputs], dtype=np.int64),
        differing=np.array([o.differing for o in outputs], dtype=np.int64),
        max_finite_ulp=np.array([-1 if o.max_finite_ulp is None else o.max_finite_ulp for o in outputs],
                                dtype=np.int64),
        finiteness_mismatch=np.array([o.finiteness_mismatch for o in outputs], dtype=np.int64),
    )
    count = len(cells)
    return CellColumns(
        layer=strings(op.layer, count), block=np.full(count, int(op.block), dtype=np.int64),
        proj=strings(op.proj, count), fault=np.array([c.fault for c in cells], dtype=object),
        severity=np.array([c.severity for c in cells], dtype=object),
        regime=np.array([c.regime for c in cells], dtype=object),
        changed=np.array([c.changed for c in cells], dtype=np.int64),
        nonfinite=np.array([o.nonfinite for o in outputs], dtype=np.int64),
        repeats=np.array([c.repeats for c in cells], dtype=np.int64),
        boosted=np.array([c.boosted for c in cells], dtype=bool), evidence=evidence)


def run_layer_cells(op: Operands, settings: CampaignSettings, device: torch.device | str = "cpu") -> CellColumns:
    """The cells of one layer from the per-cell engine (``_LayerRun``)."""
    return layer_cells(op, _LayerRun(op, settings, torch.device(device)).cells())



"""The seven conformance checks (preregistration/checks.yaml) and the evidence they decide on.

A check sees what a conformance suite can see of two arms on one layer: the operands each arm
received, the depth it ran, the exact accumulator of those operands, each arm's int32
accumulator where the arm exposes it, and the two bf16 outputs. ``evaluate`` turns that evidence
into seven results; each says whether the check applies separately from whether it fired, and a
check that does not apply has ``fired = None`` (never a pass).

The campaign (``faults.campaign``) and ``conform`` build the evidence with the functions below;
``ElementDiff`` keeps output differences sparse so that a campaign cell which shows its fault at
1% of the elements is summarised without building its output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..arith import F32_EXACT_BOUND, INT32_PRODUCT_BOUND, is_pow2, ulp_distance
from ..arith.bf16 import nonfinite_bits, ordered_line, signed_bits
from ..arith.bits import bit_pattern, bits_equal
from ..errors import InputError

INT32_LIMIT = 2**31


@dataclass(frozen=True)
class Thresholds:
    """The pinned numbers the checks use (thresholds.yaml)."""

    product_bound: int = INT32_PRODUCT_BOUND
    int32_limit: int = INT32_LIMIT
    f32_exact_bound: int = F32_EXACT_BOUND
    ulp_tolerance: int = 1

    @classmethod
    def from_protocol(cls, thresholds: Mapping[str, Any]) -> "Thresholds":
        """Read the thresholds from a loaded protocol's ``thresholds`` mapping."""
        return cls(
            product_bound=int(thresholds["int32"]["product_bound"]),
            int32_limit=int(thresholds["int32"]["limit"]),
            f32_exact_bound=int(thresholds["f32_exact_bound"]),
            ulp_tolerance=int(thresholds["ulp_tolerance"]),
        )


@dataclass(frozen=True)
class OperandSet:
    """What one arm received: a_q [M,K] int8, w_q [N,K] int8, s_a [M] f32, s_w [N] f32.

    ``repeats`` says that both int8 tensors are tiled that many times along K (faults F6, F7):
    the arm runs depth ``K * repeats`` and its exact accumulator is ``repeats`` times that of
    the stored tensors, so the tiled tensors never need to exist.
    """

    a_q: torch.Tensor
    w_q: torch.Tensor
    s_a: torch.Tensor
    s_w: torch.Tensor
    repeats: int = 1

    @property
    def k(self) -> int:
        """The reduction depth the arm ran."""
        return int(self.a_q.shape[1]) * self.repeats


def operands_identical(x: OperandSet, y: OperandSet) -> bool:
    """Check 1's question: did the two arms receive bit-identical a_q, w_q, s_a, s_w (and depth)?"""
    return x.repeats == y.repeats and all(
        bits_equal(getattr(x, name), getattr(y, name)) for name in ("a_q", "w_q", "s_a", "s_w")
    )


def all_pow2(s: torch.Tensor) -> bool:
    """Whether every entry of a scale vector is a power of two (zero is not)."""
    return bool(is_pow2(s).all())


def scales_pow2(*sets: OperandSet) -> bool:
    """Whether every activation and weight scale of every given set is a power of two."""
    return all(all_pow2(s) for o in sets for s in (o.s_a, o.s_w))


def accumulator_matches(acc32: torch.Tensor, exact: torch.Tensor) -> bool:
    """Whether an arm's int32 accumulator equals the exact (int64) one, element for element."""
    if acc32.shape != exact.shape:
        return False
    return bool(torch.equal(acc32.to(device=exact.device, dtype=torch.int64), exact))


@dataclass(frozen=True)
class OutputComparison:
    """Two bf16 outputs compared element by element (Python ints).

    ``differing`` counts differing bit patterns (+0 vs -0 counts); ``max_finite_ulp`` is the
    largest bf16 spacing count over positions where both are finite (None when there is none);
    ``nonfinite`` counts positions where either is inf or NaN, and ``finiteness_mismatch`` those
    where exactly one of them is.
    """

    elements: int
    differing: int
    max_finite_ulp: int | None
    nonfinite: int
    finiteness_mismatch: int


def nonfinite_index(y: torch.Tensor) -> torch.Tensor:
    """Sorted flat indices of the inf and NaN elements of a bf16 tensor (read off the exponent bits).

    One min/max reduction settles the common all-finite case (both reductions propagate NaN).
    """
    flat = y.reshape(-1)
    if flat.numel():
        low, high = torch.aminmax(flat)
        if bool(torch.isfinite(low).item()) and bool(torch.isfinite(high).item()):
            return torch.zeros(0, dtype=torch.int64, device=flat.device)
    return nonfinite_bits(flat.view(torch.int16)).nonzero().squeeze(1)


def ordered_positions(y: torch.Tensor) -> torch.Tensor:
    """Flat int32 positions of bf16 values on the line of representable values (+0 and -0 at 0).

    ``arith.ordered_bf16`` of the flattened tensor: the dense output comparisons of the campaign run
    it on millions of elements per cell.
    """
    return ordered_line(signed_bits(y.reshape(-1)))


def dense_distance(ordered_a: torch.Tensor, ordered_b: torch.Tensor, nonfinite: torch.Tensor) -> torch.Tensor:
    """Per-element ulp distance as ``arith.ulp_distance`` defines it: |a - b| on the ordered line,
    -1 at the flat positions ``nonfinite`` (where either value is inf or NaN)."""
    distance = (ordered_a - ordered_b).abs_()
    if nonfinite.numel():
        distance[nonfinite] = -1
    return distance


def _members(values: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """Where each of the sorted indices ``values`` occurs in the sorted indices ``pool``.

    A binary search of the (small) ``values`` in ``pool``: cheap even when ``pool`` holds most of
    an output's positions, which a set membership over ``pool`` would not be.
    """
    if not values.numel() or not pool.numel():
        return torch.zeros(values.shape, dtype=torch.bool, device=values.device)
    at = torch.searchsorted(pool, values).clamp(max=pool.numel() - 1)
    return pool[at] == values


@dataclass(frozen=True)
class ElementDiff:
    """Where bf16 outputs ``y_a`` and ``y_b`` differ, kept so that restricted summaries are cheap.

    ``summary(where)`` compares ``y_a`` with the output that equals ``y_b`` at the flat positions
    ``where`` and ``y_a`` everywhere else: a fault applied at some elements only. ``where=None``
    compares ``y_a`` with ``y_b`` itself. Few differing elements are kept as flat indices
    (``differ``); many (more than one in ``DENSE_FRACTION``) as the per-element ulp distance of
    the whole output (``distance``, and ``differ`` is then empty).
    """

    DENSE_FRACTION = 8

    y_a: torch.Tensor
    y_b: torch.Tensor
    differ_mask: torch.Tensor
    differing: int
    differ: torch.Tensor
    distance: torch.Tensor | None
    nonfinite_a: torch.Tensor
    nonfinite_b: torch.Tensor

    @classmethod
    def of(cls, y_a: torch.Tensor, y_b: torch.Tensor, nonfinite_a: torch.Tensor | None = None,
           ordered_a: torch.Tensor | None = None) -> "ElementDiff":
        """Diff two same-shaped bf16 outputs; facts about ``y_a`` may be passed when already known
        (its non-finite positions, its ``ordered_positions``)."""
        for name, y in (("first", y_a), ("second", y_b)):
            if y.dtype != torch.bfloat16:
                raise InputError(f"output comparison: {name} output is {y.dtype}, not torch.bfloat16")
        if y_a.shape != y_b.shape:
            raise InputError(f"output comparison: shapes differ ({tuple(y_a.shape)} vs {tuple(y_b.shape)})")
        flat_a, flat_b = y_a.reshape(-1), y_b.reshape(-1).to(y_a.device)
        mask = bit_pattern(flat_a) != bit_pattern(flat_b)
        differing = int(torch.count_nonzero(mask).item())
        nf_a = nonfinite_index(flat_a) if nonfinite_a is None else nonfinite_a
        nf_b = nonfinite_index(flat_b)
        distance = None
        if differing * cls.DENSE_FRACTION > mask.numel():
            base = ordered_positions(flat_a) if ordered_a is None else ordered_a
            distance = dense_distance(base, ordered_positions(flat_b), torch.cat([nf_a, nf_b]))
            differ = torch.zeros(0, dtype=torch.int64, device=mask.device)
        else:
            differ = mask.nonzero().squeeze(1)
        return cls(y_a=flat_a, y_b=flat_b, differ_mask=mask, differing=differing, differ=differ,
                   distance=distance, nonfinite_a=nf_a, nonfinite_b=nf_b)

    def _largest_distance(self, where: torch.Tensor | None) -> int:
        """Largest finite ulp distance over the differing positions (within ``where``); -1 if none."""
        if self.distance is not None:
            d = self.distance if where is None else self.distance[where]
        else:
            at = self.differ if where is None else where[self.differ_mask[where]]
            d = ulp_distance(self.y_a[at], self.y_b[at])
        return int(d.max().item()) if d.numel() else -1

    def summary(self, where: torch.Tensor | None = None) -> OutputComparison:
        """The comparison of ``y_a`` with ``y_b`` restricted to positions ``where`` (sorted flat indices)."""
        elements = self.y_a.numel()
        nf_a = self.nonfinite_a
        if where is None:
            differing, nf_b = self.differing, self.nonfinite_b
        else:
            differing = int(torch.count_nonzero(self.differ_mask[where]).item())
            kept_a = nf_a[~_members(nf_a, where)]
            took_b = where[_members(where, self.nonfinite_b)]
            nf_b = torch.cat([kept_a, took_b]).sort().values
        both = int(_members(nf_a, nf_b).sum().item())
        nonfinite = nf_a.numel() + nf_b.numel() - both
        largest = self._largest_distance(where)
        # Equal finite pairs are 0 apart, so the maximum is at least 0 whenever a finite pair exists.
        max_ulp = max(largest, 0) if elements > nonfinite else None
        return OutputComparison(
            elements=elements,
            differing=differing,
            max_finite_ulp=max_ulp,
            nonfinite=nonfinite,
            finiteness_mismatch=nf_a.numel() + nf_b.numel() - 2 * both,
        )


def count_differing(y_a: torch.Tensor, y_b: torch.Tensor) -> int:
    """How many elements of two same-shaped bf16 outputs differ bitwise (signed zeros count)."""
    if y_a.dtype != torch.bfloat16 or y_b.dtype != torch.bfloat16 or y_a.shape != y_b.shape:
        raise InputError(f"count_differing: expected two bf16 tensors of one shape, got {y_a.dtype} "
                         f"{tuple(y_a.shape)} and {y_b.dtype} {tuple(y_b.shape)}")
    return int(torch.count_nonzero(bit_pattern(y_a) != bit_pattern(y_b.to(y_a.device))).item())


def compare_outputs(y_a: torch.Tensor, y_b: torch.Tensor) -> OutputComparison:
    """Compare two whole bf16 outputs (what checks 5 and 6 look at)."""
    return ElementDiff.of(y_a, y_b).summary()


@dataclass(frozen=True)
class CellEvidence:
    """Everything the checks need about one cell (one layer, two arms).

    ``exact_absmax`` is max |exact accumulator| over both arms' operands; ``accumulators`` is
    whether each arm's int32 accumulator equals the exact accumulator of arm A's operands, or
    None when an arm does not expose its accumulator; ``scales_pow2`` whether every scale either
    arm received is a power of two.
    """

    operands_identical: bool
    k: tuple[int, int]
    exact_absmax: int
    accumulators: bool | None
    scales_pow2: bool
    outputs: OutputComparison
    accumulator_note: str = ""


@dataclass(frozen=True)
class CheckResult:
    """One check on one cell. ``fired`` is None exactly when the check is not applicable."""

    check: int
    applicable: bool
    fired: bool | None
    reason: str


def _applied(check: int, fired: bool, reason: str) -> CheckResult:
    return CheckResult(check, True, fired, reason)


def _not_applicable(check: int, reason: str) -> CheckResult:
    return CheckResult(check, False, None, reason)


# Each check as a function of the evidence fields it reads: ``evaluate`` calls them per cell,
# ``evaluate_columns`` once per distinct value of those fields.

def _check1(identical: bool) -> CheckResult:
    return _applied(1, not identical, "operands bit-identical" if identical else "arms received different operands")


def _check2(k_a: int, k_b: int, th: Thresholds) -> CheckResult:
    deepest = max(k_a, k_b)
    return _applied(2, th.product_bound * deepest >= th.int32_limit,
                    f"{th.product_bound}*K = {th.product_bound * deepest} vs limit {th.int32_limit} (K = {k_a}, {k_b})")


def _check3(exact_absmax: int, th: Thresholds) -> CheckResult:
    return _applied(3, exact_absmax > th.f32_exact_bound,
                    f"max |exact acc| = {exact_absmax} vs bound {th.f32_exact_bound}")


def _check4(accumulators: bool | None, note: str = "") -> CheckResult:
    if accumulators is None:
        return _not_applicable(4, note or "an arm does not expose its accumulator")
    return _applied(4, not accumulators,
                    "both accumulators equal the exact accumulator of arm A's operands" if accumulators
                    else "an arm's int32 accumulator differs from the exact accumulator of arm A's operands")


def _check5(scales_pow2: bool, differing: int, elements: int) -> CheckResult:
    if not scales_pow2:
        return _not_applicable(5, "some scale is not a power of two (or is zero)")
    return _applied(5, differing > 0, f"{differing} of {elements} output elements differ bitwise")


def _check6(scales_pow2: bool, max_finite_ulp: int | None, mismatch: int, th: Thresholds) -> CheckResult:
    if scales_pow2:
        return _not_applicable(6, "every scale is a power of two: check 5 decides instead")
    over = max_finite_ulp is not None and max_finite_ulp > th.ulp_tolerance
    ulp_text = "no finite pair" if max_finite_ulp is None else f"max finite ulp {max_finite_ulp}"
    return _applied(6, over or mismatch > 0,
                    f"{ulp_text} vs tolerance {th.ulp_tolerance}; {mismatch} finite/non-finite mismatches")


_CHECK7 = _not_applicable(7, "token-level risk on logit margins needs logits; not evaluable on one layer")


def evaluate(ev: CellEvidence, th: Thresholds) -> list[CheckResult]:
    """Checks 1-7 on one cell's evidence, in order."""
    out = ev.outputs
    return [
        _check1(ev.operands_identical),
        _check2(*ev.k, th),
        _check3(ev.exact_absmax, th),
        _check4(ev.accumulators, ev.accumulator_note),
        _check5(ev.scales_pow2, out.differing, out.elements),
        _check6(ev.scales_pow2, out.max_finite_ulp, out.finiteness_mismatch, th),
        _CHECK7,
    ]


@dataclass(frozen=True)
class EvidenceColumns:
    """The ``CellEvidence`` of many cells, one int64 or bool array per field, every arm exposing
    its accumulator (as in the fault campaign). ``max_finite_ulp`` is -1 where there is no finite
    pair (None in ``OutputComparison``)."""

    operands_identical: np.ndarray
    k: np.ndarray                 # [cells, 2]
    exact_absmax: np.ndarray
    accumulators: np.ndarray
    scales_pow2: np.ndarray
    elements: np.ndarray
    differing: np.ndarray
    max_finite_ulp: np.ndarray
    finiteness_mismatch: np.ndarray


def _spread(keys: list[np.ndarray], decide: Callable[..., CheckResult]) -> list[np.ndarray]:
    """``decide`` once per distinct row of the key columns (as Python ints), its results spread to
    every cell: applicable (bool), fired (object: True, False or None) and reason (object)."""
    code = np.zeros(len(keys[0]), dtype=np.int64)
    for column in keys:  # one int64 code per distinct row (mixed radix): a 1-D sort, not a sort of rows
        values, at = np.unique(column, return_inverse=True)
        if code.size and (int(code.max()) + 1) * len(values) > 2**62:   # renumber before it could overflow
            code = np.unique(code, return_inverse=True)[1].reshape(-1)
        code = code * len(values) + at.reshape(-1)
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    results = [decide(*row) for row in np.stack(keys, 1)[first].tolist()]
    inverse = inverse.reshape(-1)
    return [np.array([r.applicable for r in results], dtype=bool)[inverse],
            np.array([r.fired for r in results], dtype=object)[inverse],
            np.array([r.reason for r in results], dtype=object)[inverse]]


def evaluate_columns(ev: EvidenceColumns, th: Thresholds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``evaluate`` on many cells at once: applicable, fired and reason, each [cells, 7], entry for
    entry ``evaluate``'s. Every check decides once per distinct value of the fields it reads (a
    campaign has far fewer than cells), by the functions ``evaluate`` calls."""
    cells = len(ev.exact_absmax)
    ulp = ev.max_finite_ulp
    per_check = [
        _spread([ev.operands_identical], lambda i: _check1(bool(i))),
        _spread([ev.k[:, 0], ev.k[:, 1]], lambda a, b: _check2(a, b, th)),
        _spread([ev.exact_absmax], lambda a: _check3(a, th)),
        _spread([ev.accumulators], lambda a: _check4(bool(a))),
        _spread([ev.scales_pow2, ev.differing, ev.elements], lambda p, d, e: _check5(bool(p), d, e)),
        _spread([ev.scales_pow2, ulp, ev.finiteness_mismatch],
                lambda p, u, m: _check6(bool(p), None if u < 0 else u, m, th)),
        _spread([np.zeros(cells, dtype=np.int64)], lambda _: _CHECK7),
    ]
    return tuple(np.stack([c[field] for c in per_check], 1) for field in range(3))  # type: ignore[return-value]


def evaluate_arms(
    arm_a: OperandSet, arm_b: OperandSet, exact_absmax: int,
    accumulators: Sequence[torch.Tensor | None], exact_a: torch.Tensor,
    y_a: torch.Tensor, y_b: torch.Tensor, th: Thresholds,
) -> tuple[CellEvidence, list[CheckResult]]:
    """Gather the evidence from whole tensors and evaluate: the path ``conform`` takes.

    ``accumulators`` are the two arms' int32 accumulators (None for an arm that hides it) and
    ``exact_a`` the exact accumulator of arm A's operands.
    """
    hidden = [name for name, acc in zip("AB", accumulators) if acc is None]
    matches = None if hidden else all(accumulator_matches(acc, exact_a) for acc in accumulators if acc is not None)
    ev = CellEvidence(
        operands_identical=operands_identical(arm_a, arm_b),
        k=(arm_a.k, arm_b.k),
        exact_absmax=exact_absmax,
        accumulators=matches,
        scales_pow2=scales_pow2(arm_a, arm_b),
        outputs=compare_outputs(y_a, y_b),
        accumulator_note=f"arm {' and '.join(hidden)} does not expose its accumulator" if hidden else "",
    )
    return ev, evaluate(ev, th)

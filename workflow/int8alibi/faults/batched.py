"""The campaign's layer with every cell computed at once on the device: no per-cell host synchronisation.

``campaign._LayerRun`` walks the cells one by one and reads answers back to the host dozens of
times per layer, which leaves a GPU idle. Here a layer is a fixed sequence of device operations
whose result is one small int64 table (a row of numbers per cell), read back one layer later,
while the device already works on the next layer:

* every arm B output of both regimes is one stacked tensor (epilogue faults F1-F5, the three F9
  rungs, F6, F7), compared with the fault-free reference in one pass: per element the bitwise
  difference, the ulp distance and the non-finite flags;
* a severity's restricted comparison is a gather of those per-element facts at the seeded
  positions and segment reductions (sum, max), never an output rebuilt per cell;
* data-dependent choices (F6's and F7's depths, F7's boosted row, F9-one's step direction) are
  made on the device with ``torch.where``.

The answers are the per-cell engine's by construction: the same float32 operations on the same
values in the same order, the same seeded draws. Where that engine takes another route (a NaN
reaches a bf16 rounding, a scale fails validation, F6 or F7 cannot be induced) the device raises
a flag, and the layer is rerun by ``campaign._LayerRun``, which gives its answer or its error.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ..arith import F32_EXACT_BOUND, INT8_PRODUCT_MAX, bf16_round, exact_accumulator, is_pow2, wrap_int32
from ..checks import CellEvidence, OutputComparison
from ..operands import Operands
from . import catalogue as cat
from . import compare
from .campaign import (CELLS_PER_LAYER, EPILOGUE_FAULTS, SEVERITIES, CampaignSettings, _Cell, _validate, cell_rng, fraction_count,
                       layer_rows, picked_elements, run_layer_cells)
from .pipeline import REGIMES, tile_partial_sums

R = len(REGIMES)
CELLS_PER_REGIME = CELLS_PER_LAYER // R
# Arm B slabs, in the order of the stacked output tensor.
SLABS = (*EPILOGUE_FAULTS, "F9-all", "F9-one", "F9-pct", "F6", "F7")
_F9, _F6 = 5, 8
INT32_MAX = 2**31 - 1
# Columns of the per-cell table read back from the device.
DIFFERING, MAX_D, NONFINITE, MISMATCH, CHANGED, ABSMAX, ACC_MATCH, POW2, IDENTICAL, REPEATS, BOOSTED = range(11)


@dataclass(frozen=True)
class Picks:
    """The host-drawn positions of one layer (the per-cell engine's draws, ``campaign.cell_rng``)."""

    flat: np.ndarray           # positions into the per-element facts [5 faults, R, M*N], one/pct of F1-F5
    sizes: tuple[int, ...]     # positions per segment (fault, regime, severity), in segment order
    f9_one: tuple[tuple[int, int], ...]   # (row, col) per regime
    f9_pct: tuple[np.ndarray, ...]        # activation-scale rows per regime

    @property
    def segment(self) -> np.ndarray:
        """The segment of each position."""
        return np.repeat(np.arange(len(self.sizes), dtype=np.int64), self.sizes)


def _segment(fault: int, regime: int, severity: int) -> int:
    return (fault * R + regime) * 2 + severity


def draw_picks(layer: str, m: int, k: int, n: int, settings: CampaignSettings) -> Picks:
    """Every seeded draw of one layer. Data-independent, so it runs ahead in worker processes.

    The ``pct`` positions are ``campaign.picked_elements``'s draw left unsorted: a severity
    reaches a set of elements, and the segment reductions do not depend on the order.
    """
    total = m * n
    flats, sizes = [], []
    for f, fault in enumerate(EPILOGUE_FAULTS):
        for r, regime in enumerate(REGIMES):
            one = np.array([cell_rng(settings.seed, layer, fault, "one", regime).integers(total)])
            pct = cell_rng(settings.seed, layer, fault, "pct", regime).choice(
                total, size=fraction_count(settings.pct_fraction, total), replace=False, shuffle=False)
            for picks in (one, pct):
                flats.append(picks.astype(np.int64) + (f * R + r) * total)
                sizes.append(picks.size)
    one_rows, pct_rows = [], []
    for regime in REGIMES:
        rng = cell_rng(settings.seed, layer, "F9", "one", regime)
        one_rows.append((int(rng.integers(m)), int(rng.integers(k))))
        rng = cell_rng(settings.seed, layer, "F9", "pct", regime)
        rows = rng.choice(m, size=fraction_count(settings.pct_fraction, m), replace=False, shuffle=False)
        pct_rows.append(np.sort(rows).astype(np.int64))
    return Picks(np.concatenate(flats), tuple(sizes), tuple(one_rows), tuple(pct_rows))


def _all(x: torch.Tensor) -> torch.Tensor:
    return x.all()


def _differ(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Whether two same-dtype tensors differ in any bit (a device bool)."""
    if x.dtype.is_floating_point:
        x, y = x.view(torch.int32), y.view(torch.int32)
    return (x != y).any()


class _Staging:
    """Pinned host buffers, reused in turn, for sending a layer's draws to the device.

    A copy from pageable memory may wait for the work queued on the stream, a copy from pinned
    memory does not; pinning a fresh array per layer costs more than the copy. A buffer is reused
    only after the event recorded behind its last copy has passed.
    """

    def __init__(self, count: int = 3) -> None:
        self._buffers: list[tuple[torch.Tensor, torch.cuda.Event | None]] = [
            (torch.empty(0, dtype=torch.int64), None) for _ in range(count)]
        self._turn = 0

    def send(self, values: np.ndarray, device: torch.device) -> torch.Tensor:
        if device.type != "cuda":
            return torch.from_numpy(values).to(device)
        buffer, done = self._buffers[self._turn]
        if done is not None:
            done.synchronize()
        if buffer.numel() < values.size:
            buffer = torch.empty(max(values.size, 2 * buffer.numel()), dtype=torch.int64, pin_memory=True)
        buffer[:values.size].numpy()[:] = values
        sent = buffer[:values.size].to(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._buffers[self._turn] = (buffer, event)
        self._turn = (self._turn + 1) % len(self._buffers)
        return sent


def _scales(s: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(own, pow2-nearest, bad flag): ``pipeline.regime_scales`` without reading anything back.

    Valid scales (finite, >= 0, nonzero ones normal and snapping below 2^128) give that function's
    values; anything else raises the flag and the layer is rerun by the per-cell engine, whose
    validation then names the problem.
    """
    s = s.reshape(rows).to(torch.float32)
    bits = s.view(torch.int32)
    exp, frac = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    zero = s == 0
    significand = ((1 << 23) + frac).to(torch.int64)
    up = (significand * significand >= 2 << 46).to(torch.int32)
    snapped_exp = exp + up
    bad = (~torch.isfinite(s) | (s < 0) | (~zero & ((exp == 0) | (snapped_exp >= 0xFF)))).any()
    snapped = (snapped_exp.clamp(max=0xFE) << 23).view(torch.float32)
    return s, torch.where(zero, s, snapped), bad


def _f5_totals(a_q: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor, width: int) -> torch.Tensor:
    """F5's float32 reductions of both regimes, [R, M, N]: ``total += f32(P_t) * s_w`` tile by tile
    from zero, as ``campaign._LayerRun`` does, with every tile's partial sum and product made at once.

    K is padded with zero columns to whole tiles: a zero column adds an exact zero to a partial sum
    (a partial sum is an integer below 2^24 in magnitude, exact in float32 whatever the order). The
    additions stay one per tile, in order, each rounded to float32.
    """
    m, k = a_q.shape
    n = w_q.shape[0]
    if width * INT8_PRODUCT_MAX > F32_EXACT_BOUND:  # wide tiles: the exact partial sums, one by one
        partials = torch.stack(list(tile_partial_sums(a_q, w_q, width)))
    else:
        tiles = -(-k // width)
        pad = tiles * width - k
        a32 = torch.nn.functional.pad(a_q.to(torch.float32), (0, pad)).reshape(m, tiles, width).transpose(0, 1)
        w32 = torch.nn.functional.pad(w_q.to(torch.float32), (0, pad)).reshape(n, tiles, width).permute(1, 2, 0)
        partials = torch.bmm(a32, w32)                                   # [T, M, N]
    terms = partials[:, None] * s_w[None, :, None, :]                    # [T, R, M, N]
    total = torch.zeros(terms.shape[1:], dtype=torch.float32, device=a_q.device)
    for term in terms:
        total.add_(term)
    return total


@dataclass
class _Pending:
    """A layer whose device work is queued: its answers (table, facts, flag in one int64 vector, on
    their way to the host), and what its rows need."""

    op: Operands
    packed: torch.Tensor
    done: torch.cuda.Event | None
    k: int
    elements: int

    def read(self) -> tuple[np.ndarray, list[int], bool]:
        """Wait for this layer alone (later layers' work stays queued) and unpack its answers."""
        if self.done is not None:
            self.done.synchronize()
        values = self.packed.numpy()
        cells = R * CELLS_PER_REGIME * 5
        return values[:cells].reshape(R, CELLS_PER_REGIME, 5), values[cells:-1].tolist(), bool(values[-1])


def _enqueue(op: Operands, settings: CampaignSettings, device: torch.device, picks: Picks,
             staging: _Staging) -> _Pending:
    """Queue every cell of one layer on ``device``; nothing is read back here."""
    th = settings.thresholds
    a_q, w_q = op.a_q.to(device), op.w_q.to(device)
    m, k = a_q.shape
    n = w_q.shape[0]
    mn = m * n
    sa_own, sa_pow2, bad_a = _scales(op.s_a.to(device), m)
    sw_own, sw_pow2, bad_w = _scales(op.s_w.to(device), n)
    flags = [bad_a, bad_w]
    s_a, s_w = torch.stack([sa_own, sa_pow2]), torch.stack([sw_own, sw_pow2])   # [R, M], [R, N]

    acc = exact_accumulator(a_q, w_q)
    acc_max, acc_min = acc.max(), acc.min()
    absmax = torch.maximum(acc_max, -acc_min)
    acc32 = wrap_int32(acc)
    base_match = _all(acc32.to(torch.int64) == acc)
    accf = acc32.to(torch.float32)

    def scaled(acc_f32: torch.Tensor, sa: torch.Tensor) -> torch.Tensor:
        """``pipeline.scale`` for both regimes at once: [R, M, N]."""
        return (acc_f32 * sa[:, :, None]) * s_w[:, None, :]

    f5 = _f5_totals(a_q, w_q, s_w, settings.tile_width)

    # F6: the least depth at which the accumulator wraps (``catalogue.f6_overflow_repeats``).
    big = torch.full_like(acc_max, 2**40)
    top, bottom = acc_max, -acc_min
    r6 = torch.minimum(torch.where(top > 0, -(-(2**31) // top.clamp(min=1)), big),
                       torch.where(bottom > 0, 2**31 // bottom.clamp(min=1) + 1, big))
    flags.append(r6 == big)
    r6 = torch.where(r6 == big, torch.ones_like(r6), r6)
    exact6 = acc * r6
    acc32_6 = wrap_int32(exact6)
    match6 = _all(acc32_6.to(torch.int64) == exact6)

    # F7: tile past 2^24 below the int32 bound; boost row 0 first when tiling alone cannot.
    def f7_depth(top_abs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = th.f32_exact_bound // top_abs.clamp(min=1) + 1
        return r, (top_abs > 0) & (th.product_bound * r * k < th.int32_limit)

    r0, ok0 = f7_depth(absmax)
    j = w_q.to(torch.int32).abs().sum(dim=1).argmax()
    boost_row = (127 * torch.sign(w_q.index_select(0, j.reshape(1)).to(torch.int16))).to(torch.int8)
    new_row0 = exact_accumulator(boost_row, w_q)[0]
    rest = acc[1:].abs().max() if m > 1 else torch.zeros_like(absmax)
    absmax_b = torch.maximum(rest, new_row0.abs().max())
    rb, okb = f7_depth(absmax_b)
    boosted = ~ok0
    flags.append(boosted & ~okb)
    r7 = torch.where(boosted, rb, r0)
    acc7 = acc.clone()
    acc7[0] = torch.where(boosted, new_row0, acc[0])
    exact7 = acc7 * r7
    acc32_7 = wrap_int32(exact7)
    match7 = _all(acc32_7.to(torch.int64) == exact7)
    absmax7 = r7 * torch.where(boosted, absmax_b, absmax)

    # F9 all: every activation element one step away.
    a_all = cat.f9_all(a_q)
    acc_all = exact_accumulator(a_all, w_q)
    acc32_all = wrap_int32(acc_all)
    absmax_all = torch.maximum(absmax, acc_all.abs().max())
    match_all = base_match & _all(acc32_all.to(torch.int64) == acc)
    ident_all = ~_differ(a_all, a_q)

    # F9 one, per regime: one element moved, one accumulator row changed (a rank-one update).
    acc32_one = acc32[None].repeat(R, 1, 1)
    absmax_one, match_one, ident_one = [], [], []
    for r, (row, col) in enumerate(picks.f9_one):
        step = torch.where(a_q[row, col] == 127, -1, 1).to(torch.int64)
        acc_row = acc[row] + step * w_q[:, col].to(torch.int64)
        wrapped = wrap_int32(acc_row)
        acc32_one[r, row] = wrapped
        absmax_one.append(torch.maximum(absmax, acc_row.abs().max()))
        match_one.append(base_match & _all(wrapped.to(torch.int64) == acc[row]))
        moved = a_q.clone()
        moved[row, col] += step.to(torch.int8)
        ident_one.append(~_differ(moved, a_q))

    # F9 pct, per regime: a fraction of the activation scales one float32 step up.
    host = staging.send(np.concatenate([picks.flat, np.asarray(picks.sizes, dtype=np.int64), *picks.f9_pct]), device)
    at, sizes, pct_rows = host.split([picks.flat.size, len(picks.sizes), sum(r.size for r in picks.f9_pct)])
    s_a_pct = torch.stack([cat.f9_pct(s_a[r], rows)
                           for r, rows in enumerate(pct_rows.split([r.size for r in picks.f9_pct]))])
    ident_pct = torch.stack([~_differ(s_a_pct[r], s_a[r]) for r in range(R)])

    # Every arm B output, [slab, R, M, N] bf16, each rounded from its float32 values as it is made.
    ref_f32 = scaled(accf, s_a)
    s_a16, s_w16 = bf16_round(s_a, "rne").to(torch.float32), bf16_round(s_w, "rne").to(torch.float32)
    f2_first = accf * s_a[:, :, None]
    flags.append(torch.isnan(f2_first).any())
    y_ref = ref_f32.to(torch.bfloat16)
    y = torch.empty((len(SLABS), R, m, n), dtype=torch.bfloat16, device=device)
    y[0] = (accf * s_a16[:, :, None]) * s_w16[:, None, :]
    y[1] = f2_first.to(torch.bfloat16).to(torch.float32) * s_w[:, None, :]
    del f2_first
    y[2] = accf * (s_a[:, :, None] * s_w[:, None, :])
    y[3] = (ref_f32.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)  # F4: toward zero
    del ref_f32
    y[4] = f5 * s_a[:, :, None]
    del f5
    y[5] = scaled(acc32_all.to(torch.float32), s_a)
    y[6] = (acc32_one.to(torch.float32) * s_a[:, :, None]) * s_w[:, None, :]
    y[7] = scaled(accf, s_a_pct)
    y[8] = scaled(acc32_6.to(torch.float32), s_a)
    y[9] = scaled(acc32_7.to(torch.float32), s_a)
    # A NaN before a rounding shows as a NaN after it (F4 rounds the reference's values).
    flags += [torch.isnan(y).any(), torch.isnan(y_ref).any()]

    # Comparison facts of each slab against the reference, over all elements (one pass on a GPU).
    ref_flat, outs = y_ref.reshape(R, mn), y.reshape(len(SLABS), R, mn)
    stats = compare.whole(ref_flat, outs)                                        # [slab, R, 5]
    whole = stats[..., :4]
    nf_self = stats[..., compare.OWN_NONFINITE]                                  # each output against itself
    nf_ref = ((compare.bits32(ref_flat) & compare.BF16_EXPONENT) == compare.BF16_EXPONENT).sum(-1)   # [R]

    # Severities one and pct of F1-F5: the facts at the seeded positions, reduced per segment.
    seg = torch.repeat_interleave(torch.arange(len(picks.sizes), device=device), sizes,
                                  output_size=picks.flat.size)
    segments = len(EPILOGUE_FAULTS) * R * 2
    g_differ, g_nfa, g_nfb, g_dist = compare.facts(compare.bits32(ref_flat.reshape(-1)[at % (R * mn)]),
                                                   compare.bits32(outs[:len(EPILOGUE_FAULTS)].reshape(-1)[at]))
    counts = torch.zeros(segments, 3, dtype=torch.int64, device=device)
    counts.index_add_(0, seg, torch.stack([g_differ, (g_nfa | g_nfb) & ~g_nfa, g_nfa ^ g_nfb], -1).to(torch.int64))
    top_d = torch.full((segments,), -1, dtype=torch.int32, device=device)
    top_d.scatter_reduce_(0, seg, g_dist, "amax", include_self=True)

    # Scale facts per regime: is every scale a power of two.
    pow2 = is_pow2(s_a).all(-1) & is_pow2(s_w).all(-1)                      # [R]
    pow2_pct = pow2 & is_pow2(s_a_pct).all(-1)

    # The output comparison of every cell, [R, 21, 5] (differing, max distance, non-finite,
    # mismatches, changed elements), in the per-cell engine's order (``campaign._LayerRun.cells``).
    sev = torch.stack([counts[:, 0], top_d.to(torch.int64), counts[:, 1], counts[:, 2]], -1)
    sev = sev.reshape(len(EPILOGUE_FAULTS), R, 2, 4)
    sev[..., 2] += nf_ref[None, :, None]
    epi = torch.cat([sev, whole[:len(EPILOGUE_FAULTS), :, None, :]], 2).permute(1, 0, 2, 3)
    epi = epi.reshape(R, len(EPILOGUE_FAULTS) * 3, 4)
    zeros = torch.zeros(R, dtype=torch.int64, device=device)
    inflated = torch.stack([torch.stack([zeros, zeros, nf_self[s], zeros], -1) for s in (_F6, _F6 + 1)], 1)
    null = torch.stack([zeros, zeros, nf_ref, zeros], -1)[:, None, :]
    operand = whole[_F9:_F9 + 3].permute(1, 0, 2)
    outputs = torch.cat([epi, inflated, null, operand], 1)
    changed = outputs[..., 0].clone()
    changed[:, 15:17] = whole[_F6:_F6 + 2, :, 0].T
    table = torch.cat([outputs, changed[..., None]], -1)
    numbers = torch.stack([absmax, r6, r7, absmax7, absmax_all, *absmax_one])
    truths = torch.cat([torch.stack([base_match, match6, match7, boosted, match_all, ident_all, *match_one,
                                     *ident_one]), ident_pct, pow2, pow2_pct])
    facts = torch.cat([numbers, truths.to(torch.int64)])
    flag = torch.stack([f.reshape(()) for f in flags]).any()
    packed = torch.cat([table.reshape(-1), facts, flag.reshape(1).to(torch.int64)])
    done = None
    if device.type == "cuda":  # copied into pinned memory behind this layer's work; an event marks the end
        host = torch.empty(packed.shape, dtype=torch.int64, pin_memory=True)
        packed = host.copy_(packed, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
    return _Pending(op, packed, done, k, mn)


def _cells(p: _Pending, table: np.ndarray, facts: list[int]) -> Iterator[_Cell]:
    """The layer's cells from the two tables read back, as ``campaign._LayerRun.cells`` yields them."""
    absmax, r6, r7, absmax7, absmax_all = facts[:5]
    absmax_one = facts[5:5 + R]
    base_match, match6, match7, boosted, match_all, ident_all = facts[5 + R:11 + R]
    rest = facts[11 + R:]
    match_one, ident_one, ident_pct, pow2, pow2_pct = (rest[i * R:(i + 1) * R] for i in range(5))
    kinds = [(f, s) for f in EPILOGUE_FAULTS for s in SEVERITIES] + [("F6", "all"), ("F7", "all"), ("F8", "all")]
    kinds += [("F9", "all"), ("F9", "one"), ("F9", "pct")]
    for r, regime in enumerate(REGIMES):
        for i, (fault, severity) in enumerate(kinds):
            differing, max_d, nonfinite, mismatch, changed = (int(v) for v in table[r, i])
            repeats, boost, top_abs, match, p2, ident = 1, False, absmax, base_match, pow2[r], 1
            if fault == "F6":
                repeats, top_abs, match = r6, r6 * absmax, match6
            elif fault == "F7":
                repeats, boost, top_abs, match = r7, bool(boosted), absmax7, match7
            elif (fault, severity) == ("F9", "all"):
                top_abs, match, ident = absmax_all, match_all, ident_all
            elif (fault, severity) == ("F9", "one"):
                top_abs, match, ident = absmax_one[r], match_one[r], ident_one[r]
            elif (fault, severity) == ("F9", "pct"):
                p2, ident = pow2_pct[r], ident_pct[r]
            outputs = OutputComparison(
                elements=p.elements, differing=differing,
                max_finite_ulp=max(max_d, 0) if p.elements > nonfinite else None,
                nonfinite=nonfinite, finiteness_mismatch=mismatch)
            ev = CellEvidence(operands_identical=bool(ident), k=(p.k * repeats, p.k * repeats),
                              exact_absmax=top_abs, accumulators=bool(match), scales_pow2=bool(p2), outputs=outputs)
            yield _Cell(fault, severity, regime, ev, changed, repeats, boost)


def _scales_fit(s: object, rows: int) -> bool:
    """What ``pipeline.as_scales`` checks without reading values: dtype and shape."""
    return (isinstance(s, torch.Tensor) and s.dtype in (torch.float32, torch.bfloat16)
            and tuple(s.shape) in ((rows,), (rows, 1)))


def _finish(p: _Pending, settings: CampaignSettings, device: torch.device) -> list[tuple[object, ...]]:
    """Read one layer's tables back (the one synchronisation per layer) and make its rows; a flagged
    layer is rerun by the per-cell engine."""
    table, facts, flagged = p.read()
    if flagged:
        return run_layer_cells(p.op, settings, device)
    return layer_rows(p.op, _cells(p, table, facts), settings)


_POOLS: dict[int, ProcessPoolExecutor] = {}


def _pool(workers: int) -> ProcessPoolExecutor | None:
    """The draw workers, forked once per process and kept (forking a large process costs tens of
    milliseconds per worker); None for ``workers=0``."""
    if workers <= 0:
        return None
    if workers not in _POOLS:
        _POOLS[workers] = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    return _POOLS[workers]


def run_layers(layers: Iterable[Operands], settings: CampaignSettings, device: torch.device,
               workers: int = 0) -> Iterator[list[tuple[object, ...]]]:
    """Each layer's rows, in order. A layer's work is queued before the previous layer is read back.

    The seeded draws (host work as large as the rest of a layer's) are made ``workers`` processes
    wide for the next ``2 * workers`` layers, while the device works; ``workers=0`` draws in line.
    Worker processes are forked once and kept; they only draw numbers (numpy), never touching the
    device.
    """
    pool = _pool(workers)
    ahead: deque[tuple[Operands, Future[Picks] | Picks]] = deque()
    source = iter(layers)

    def fill() -> None:
        while len(ahead) < max(1, 2 * workers):
            op = next(source, None)
            if op is None:
                return
            _validate(op)
            shape = (op.layer, op.a_q.shape[0], op.a_q.shape[1], op.w_q.shape[0], settings)
            ahead.append((op, pool.submit(draw_picks, *shape) if pool else draw_picks(*shape)))

    pending: _Pending | None = None
    staging = _Staging()
    try:
        fill()
        while ahead:
            op, draws = ahead.popleft()
            fill()
            picks = draws.result() if isinstance(draws, Future) else draws
            m, n = op.a_q.shape[0], op.w_q.shape[0]
            if _scales_fit(op.s_a, m) and _scales_fit(op.s_w, n):
                current: _Pending | list[tuple[object, ...]] = _enqueue(op, settings, device, picks, staging)
            else:
                current = run_layer_cells(op, settings, device)
            if pending is not None:
                yield _finish(pending, settings, device)
                pending = None
            if isinstance(current, list):
                yield current
            else:
                pending = current
        if pending is not None:
            yield _finish(pending, settings, device)
    finally:
        for _, draws in ahead:
            if isinstance(draws, Future):
                draws.cancel()

"""The campaign with every cell of several layers computed at once on the device: no per-cell host
synchronisation.

``campaign._LayerRun`` walks the cells one by one and reads answers back to the host dozens of
times per layer, which leaves a GPU idle. Here layers of one shape are batched (up to
``BATCH``), and a batch is a fixed sequence of device operations whose result is one small int64
table (a row of numbers per cell), read back while the device already works on the next batch:

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
a flag, and the batch's layers are rerun by ``campaign._LayerRun``, which gives its answer or its
error. Rows come out in the order of the layers given.
"""

from __future__ import annotations

import functools
import multiprocessing
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ..arith import INT8_PRODUCT_MAX, exact_accumulator, is_pow2, wrap_int32
from ..arith.bf16 import nonfinite_bits, signed_bits
from ..arith.bits import bit_pattern
from ..arith.pow2 import snapped_pow2
from .checks import EvidenceColumns, Thresholds
from ..kernels.layer_operands import Operands
from . import catalogue as cat
from . import compare
from .campaign import CELLS_PER_LAYER, CampaignSettings, _validate, cell_rng, run_layer_cells
from .catalogue import EPILOGUE_FAULTS, SEVERITIES, fraction_count
from .pipeline import REGIMES, scale
from ..campaign_budget import BATCH, MEMORY_SHARE
from .rows import CellColumns

R = len(REGIMES)
CELLS_PER_REGIME = CELLS_PER_LAYER // R
# Arm B slabs, in the order of the stacked output tensor.
SLABS = (*EPILOGUE_FAULTS, "F9-all", "F9-one", "F9-pct", "F6", "F7")
# Columns of each cell's row in the table read back from the device: the output comparison
# (``checks.OutputComparison``'s counts) and the elements the fault changed.
DIFFERING, MAX_D, NONFINITE, MISMATCH, CHANGED = range(5)
# Facts read back per layer (one value each) and per layer and regime (one per regime), by name.
LAYER_FACTS = ("absmax", "base_match", "r6", "match6", "r7", "match7", "boosted", "absmax7", "absmax_all",
               "match_all", "ident_all")
REGIME_FACTS = ("absmax_one", "match_one", "ident_one", "ident_pct", "pow2", "pow2_pct")


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
        one_rows.append(cat.one_position(cell_rng(settings.seed, layer, "F9", "one", regime), m, k))
        pct_rows.append(cat.pct_rows(cell_rng(settings.seed, layer, "F9", "pct", regime), m, settings.pct_fraction))
    return Picks(np.concatenate(flats), tuple(sizes), tuple(one_rows), tuple(pct_rows))


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


def _rowwise_all(x: torch.Tensor) -> torch.Tensor:
    """Per layer (leading dimension): whether every entry is true."""
    return x.flatten(1).all(1)


def _scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(own, pow2-nearest, bad flag) of float32 scales: ``pipeline.regime_scales`` without reading
    anything back.

    Valid scales (finite, >= 0, nonzero ones normal and snapping below 2^128) give that function's
    values; anything else raises the flag and the layers are rerun by the per-cell engine, whose
    validation then names the problem.
    """
    snapped, refused, overflow = snapped_pow2(s, "nearest", keep_zero=True)
    return s, snapped, (refused | overflow).any()


def _exact(a_q: torch.Tensor, w_q: torch.Tensor, w_t64: torch.Tensor | None = None) -> torch.Tensor:
    """Exact int64 accumulators of a batch, [L, M, N] from [L, M, K] and [L, N, K]: one float64
    batched matmul (every partial sum is an integer below 2^53, exact in any order), as
    ``arith.exact_accumulator`` computes them layer by layer. ``w_t64``: ``w_q`` already converted
    (``_weights64``), shared by the batch's three products."""
    if a_q.shape[2] * INT8_PRODUCT_MAX > 2**53:
        return torch.stack([exact_accumulator(a, w) for a, w in zip(a_q, w_q)])
    return torch.bmm(a_q.to(torch.float64), _weights64(w_q) if w_t64 is None else w_t64).to(torch.int64)


def _weights64(w_q: torch.Tensor) -> torch.Tensor:
    """[L, K, N] float64 view of int8 weights [L, N, K], as ``_exact`` multiplies them."""
    return w_q.to(torch.float64).transpose(1, 2)


@dataclass
class _Pending:
    """A batch whose device work is queued: its answers (per layer a table and facts, and one flag,
    in one int64 vector on its way to the host), and what its rows need."""

    ops: list[Operands]
    packed: torch.Tensor
    done: torch.cuda.Event | None
    k: int
    elements: int

    def read(self) -> tuple[np.ndarray, np.ndarray, bool]:
        """Wait for this batch alone (later batches stay queued) and unpack: tables [L, R, 21, 5],
        facts [L, F], flag."""
        if self.done is not None:
            self.done.synchronize()
        values = self.packed.numpy()
        layers = len(self.ops)
        cells = layers * R * CELLS_PER_REGIME * 5
        return (values[:cells].reshape(layers, R, CELLS_PER_REGIME, 5),
                values[cells:-1].reshape(layers, -1), bool(values[-1]))


def _batch_scales(ops: list[Operands], device: torch.device, m: int, n: int
                  ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Both regimes' scales, s_a [L, R, M] and s_w [L, R, N] in float32, and the flags of scales the
    snap refuses (their layers are rerun by the per-cell engine)."""
    sa_own, sa_pow2, bad_a = _scales(torch.stack([op.s_a.to(device).reshape(m) for op in ops]).to(torch.float32))
    sw_own, sw_pow2, bad_w = _scales(torch.stack([op.s_w.to(device).reshape(n) for op in ops]).to(torch.float32))
    return torch.stack([sa_own, sa_pow2], 1), torch.stack([sw_own, sw_pow2], 1), [bad_a, bad_w]


@dataclass
class _Draws:
    """A batch's seeded draws on the device: flat positions into the arm B outputs (offset to each
    layer's slabs) with the size of each segment, F9-one's (row, col) and F9-pct's rows per regime."""

    at: torch.Tensor
    sizes: torch.Tensor
    one_at: torch.Tensor
    pct_rows: torch.Tensor
    positions: int
    segments: int   # segments per layer
    pct: int        # F9-pct rows per regime


def _send_draws(draws: list[Picks], settings: CampaignSettings, staging: _Staging, device: torch.device,
                m: int, mn: int) -> _Draws:
    """Every layer's draws in one transfer."""
    layers, pct = len(draws), fraction_count(settings.pct_fraction, m)
    host = np.concatenate([
        *(d.flat + i * len(SLABS) * R * mn for i, d in enumerate(draws)),
        *(np.asarray(d.sizes, dtype=np.int64) for d in draws),
        *(np.asarray(d.f9_one, dtype=np.int64).reshape(-1) for d in draws),
        *(r for d in draws for r in d.f9_pct)])
    positions, segments = sum(d.flat.size for d in draws), len(draws[0].sizes)
    at, sizes, one_at, pct_rows = staging.send(host, device).split(
        [positions, layers * segments, layers * R * 2, layers * R * pct])
    return _Draws(at, sizes, one_at, pct_rows, positions, segments, pct)


@dataclass
class _Base:
    """The fault-free accumulators of a batch: exact (int64 [L, M, N]), as a kernel holds them
    (int32), as float32, and their extremes per layer."""

    acc: torch.Tensor
    acc_max: torch.Tensor
    acc_min: torch.Tensor
    absmax: torch.Tensor
    acc32: torch.Tensor
    accf: torch.Tensor
    match: torch.Tensor   # per layer: the int32 accumulator equals the exact one


def _base(a_q: torch.Tensor, w_q: torch.Tensor, w_t64: torch.Tensor) -> _Base:
    acc = _exact(a_q, w_q, w_t64)
    acc_max, acc_min = acc.amax((1, 2)), acc.amin((1, 2))
    acc32 = wrap_int32(acc)
    return _Base(acc, acc_max, acc_min, torch.maximum(acc_max, -acc_min), acc32, acc32.to(torch.float32),
                 _rowwise_all(acc32.to(torch.int64) == acc))


def _inflated(base: _Base, a_q: torch.Tensor, w_q: torch.Tensor, w_t64: torch.Tensor, th: Thresholds
              ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[torch.Tensor]]:
    """F6 and F7 (``catalogue.inflate``): their int32 accumulators by slab name, facts r6/match6 and
    r7/match7/boosted/absmax7, and flags of layers that cannot take them."""
    accumulate = functools.partial(_exact, w_q=w_q, w_t64=w_t64)
    f6 = cat.inflate("F6", base.acc, a_q, w_q, accumulate, th)
    f7 = cat.inflate("F7", base.acc, a_q, w_q, accumulate, th)
    acc32_6, acc32_7 = wrap_int32(f6.exact), wrap_int32(f7.exact)
    facts = {"r6": f6.repeats, "match6": _rowwise_all(acc32_6.to(torch.int64) == f6.exact),
             "r7": f7.repeats, "match7": _rowwise_all(acc32_7.to(torch.int64) == f7.exact),
             "boosted": f7.boosted, "absmax7": f7.absmax}
    return {"F6": acc32_6, "F7": acc32_7}, facts, [~f6.reachable.all(), ~f7.reachable.all()]


def _stepped_all(base: _Base, a_q: torch.Tensor, w_q: torch.Tensor, w_t64: torch.Tensor
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """F9 all (``catalogue.step_all``): (int32 accumulator, facts)."""
    a_all = cat.step_all(a_q)
    acc_all = _exact(a_all, w_q, w_t64)
    acc32_all = wrap_int32(acc_all)
    return acc32_all, {"absmax_all": torch.maximum(base.absmax, acc_all.abs().amax((1, 2))),
                       "match_all": base.match & _rowwise_all(acc32_all.to(torch.int64) == base.acc),
                       "ident_all": ~(a_all != a_q).flatten(1).any(1)}


def _stepped_one(base: _Base, a_q: torch.Tensor, w_q: torch.Tensor, one_at: torch.Tensor
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """F9 one per layer and regime (``catalogue.step_one``): (int32 accumulators [L, R, M, N], facts
    per regime)."""
    layers = a_q.shape[0]
    rows, cols = one_at.reshape(layers, R, 2).unbind(-1)                           # [L, R] each
    one = cat.step_one(a_q[:, None], base.acc[:, None], base.acc32[:, None], w_q[:, None], rows, cols)
    before = base.acc[torch.arange(layers, device=a_q.device)[:, None], rows]      # [L, R, N]
    return one.acc32, {
        "absmax_one": torch.maximum(base.absmax[:, None], one.row.abs().amax(-1)),
        "match_one": base.match[:, None] & (wrap_int32(one.row).to(torch.int64) == before).all(-1),
        "ident_one": (one.element.to(torch.int16) + one.step).to(torch.int8) == one.element}  # the only one moved


def _nudged(s_a: torch.Tensor, pct_rows: torch.Tensor, pct: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """F9 pct per layer and regime (``catalogue.nudge_scales``): (the scales, facts per regime)."""
    s_a_pct = cat.nudge_scales(s_a, pct_rows.reshape(s_a.shape[0], R, pct))
    return s_a_pct, {"ident_pct": ~(bit_pattern(s_a_pct) != bit_pattern(s_a)).any(-1)}


def _outputs(base: _Base, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
             width: int, arms: dict[str, torch.Tensor], s_a_pct: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Every arm B output, [L, slab, R, M, N] bf16 (``SLABS``), each rounded from its float32 values
    as it is made, the reference [L, R, M, N], and the NaN flags. ``arms``: the int32 accumulators
    of the operand and precondition faults by slab name, [L, M, N] or [L, R, M, N]."""
    accf = base.accf[:, None]                                                      # [L, 1, M, N]
    layers, m, n = s_a.shape[0], s_a.shape[2], s_w.shape[2]
    y_ref = cat.CAST.rne(scale(accf, s_a, s_w))
    y = torch.empty((layers, len(SLABS), R, m, n), dtype=torch.bfloat16, device=accf.device)
    slab = SLABS.index
    f5 = functools.partial(cat.fused_reduction, a_q[:, None], w_q[:, None], s_w, width)
    for fault in EPILOGUE_FAULTS:
        y[:, slab(fault)] = cat.epilogue_fault(fault, accf, s_a, s_w, f5, cat.CAST)
    for name, acc32 in arms.items():
        y[:, slab(name)] = scale((acc32 if acc32.dim() == 4 else acc32[:, None]).to(torch.float32), s_a, s_w)
    y[:, slab("F9-pct")] = scale(accf, s_a_pct, s_w)
    # A NaN before a rounding shows as a NaN after it (F4 and F2's first rounding round the
    # reference's values or a part of them).
    return y, y_ref, [torch.isnan(y).any(), torch.isnan(y_ref).any()]


def _cell_table(y: torch.Tensor, y_ref: torch.Tensor, draws: _Draws) -> torch.Tensor:
    """The output comparison of every cell, [L, R, 21, TABLE_COLUMNS], in the per-cell engine's
    order (``campaign._LayerRun.cells``): all elements for every slab (one pass on a GPU), the seeded
    positions reduced per segment for severities one and pct of F1-F5."""
    layers, slabs, _, m, n = y.shape
    mn, segments, epilogue = m * n, draws.segments, len(EPILOGUE_FAULTS)
    ref_flat, outs = y_ref.reshape(layers, R, mn), y.reshape(layers, slabs, R, mn)
    stats = compare.whole(ref_flat, outs)                                          # [L, slab, R, 5]
    whole = stats[..., :compare.OWN_NONFINITE]          # differing, max distance, either non-finite, mismatch
    nf_self = stats[..., compare.OWN_NONFINITE]                                    # each output against itself
    nf_ref = nonfinite_bits(signed_bits(ref_flat)).sum(-1)                         # [L, R]

    seg = torch.repeat_interleave(torch.arange(layers * segments, device=y.device), draws.sizes,
                                  output_size=draws.positions)
    slab_size = slabs * R * mn
    ref_at = (draws.at // slab_size) * (R * mn) + draws.at % (R * mn)
    g_differ, g_nfa, g_nfb, g_dist = compare.facts(signed_bits(ref_flat.reshape(-1)[ref_at]),
                                                   signed_bits(outs.reshape(-1)[draws.at]))
    counts = torch.zeros(layers * segments, 3, dtype=torch.int64, device=y.device)
    counts.index_add_(0, seg, torch.stack([g_differ, (g_nfa | g_nfb) & ~g_nfa, g_nfa ^ g_nfb], -1).to(torch.int64))
    top_d = torch.full((layers * segments,), -1, dtype=torch.int32, device=y.device)
    top_d.scatter_reduce_(0, seg, g_dist, "amax", include_self=True)

    sev = torch.stack([counts[:, 0], top_d.to(torch.int64), counts[:, 1], counts[:, 2]], -1)
    sev = sev.reshape(layers, epilogue, R, 2, 4)          # severities one and pct
    sev[..., NONFINITE] += nf_ref[:, None, :, None]
    epi = torch.cat([sev, whole[:, :epilogue, :, None, :]], 3).permute(0, 2, 1, 3, 4)   # then all
    epi = epi.reshape(layers, R, epilogue * len(SEVERITIES), 4)
    zeros = torch.zeros((layers, R), dtype=torch.int64, device=y.device)
    f6, f9 = SLABS.index("F6"), SLABS.index("F9-all")
    inflated = torch.stack([torch.stack([zeros, zeros, nf_self[:, s], zeros], -1) for s in (f6, f6 + 1)], 2)
    null = torch.stack([zeros, zeros, nf_ref, zeros], -1)[:, :, None, :]
    operand = whole[:, f9:f9 + 3].permute(0, 2, 1, 3)
    outputs = torch.cat([epi, inflated, null, operand], 2)                          # [L, R, 21, 4]
    changed = outputs[..., DIFFERING].clone()
    changed[:, :, _F6_CELL:_F7_CELL + 1] = whole[:, f6:f6 + 2, :, DIFFERING].permute(0, 2, 1)  # against arm A's own
    return torch.cat([outputs, changed[..., None]], -1)


def _pack(table: torch.Tensor, layer: dict[str, torch.Tensor], regime: dict[str, torch.Tensor],
          flags: list[torch.Tensor]) -> torch.Tensor:
    """One int64 vector: the cell table, the facts (``LAYER_FACTS`` [L], then ``REGIME_FACTS``
    [L, R]) and one flag (any flag raised)."""
    facts = torch.cat([torch.stack([layer[name].to(torch.int64) for name in LAYER_FACTS], 1),
                       *(regime[name].to(torch.int64) for name in REGIME_FACTS)], 1)
    flag = torch.stack([f.reshape(()) for f in flags]).any()
    return torch.cat([table.reshape(-1), facts.reshape(-1), flag.reshape(1).to(torch.int64)])


def _unpack_facts(facts: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``_pack``'s facts [L, F] by name: per layer as [L, 1, 1], per regime as [L, R]."""
    layer = {name: facts[:, i, None, None] for i, name in enumerate(LAYER_FACTS)}
    first = len(LAYER_FACTS)
    regime = {name: facts[:, first + i * R:first + (i + 1) * R] for i, name in enumerate(REGIME_FACTS)}
    return layer, regime


def _enqueue(ops: list[Operands], settings: CampaignSettings, device: torch.device, draws: list[Picks],
             staging: _Staging) -> _Pending:
    """Queue every cell of a batch of same-shaped layers on ``device``; nothing is read back here."""
    a_q = torch.stack([op.a_q.to(device) for op in ops])                          # [L, M, K]
    w_q = torch.stack([op.w_q.to(device) for op in ops])                          # [L, N, K]
    _, m, k = a_q.shape
    n = w_q.shape[1]
    s_a, s_w, flags = _batch_scales(ops, device, m, n)
    sent = _send_draws(draws, settings, staging, device, m, m * n)
    w_t64 = _weights64(w_q)
    base = _base(a_q, w_q, w_t64)
    inflated, facts_inflated, flags_inflated = _inflated(base, a_q, w_q, w_t64, settings.thresholds)
    acc32_all, facts_all = _stepped_all(base, a_q, w_q, w_t64)
    del w_t64
    acc32_one, facts_one = _stepped_one(base, a_q, w_q, sent.one_at)
    s_a_pct, facts_pct = _nudged(s_a, sent.pct_rows, sent.pct)
    arms = {"F9-all": acc32_all, "F9-one": acc32_one, **inflated}
    y, y_ref, nan_flags = _outputs(base, a_q, w_q, s_a, s_w, settings.tile_width, arms, s_a_pct)
    del arms, inflated, acc32_all, acc32_one
    table = _cell_table(y, y_ref, sent)
    pow2 = is_pow2(s_a).all(-1) & is_pow2(s_w).all(-1)                             # [L, R]: every scale a power of two
    layer = {"absmax": base.absmax, "base_match": base.match, **facts_inflated, **facts_all}
    regime = {**facts_one, **facts_pct, "pow2": pow2, "pow2_pct": pow2 & is_pow2(s_a_pct).all(-1)}
    packed = _pack(table, layer, regime, [*flags, *flags_inflated, *nan_flags])
    done = None
    if device.type == "cuda":  # copied into pinned memory behind this batch's work; an event marks the end
        host_copy = torch.empty(packed.shape, dtype=torch.int64, pin_memory=True)
        packed = host_copy.copy_(packed, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
    return _Pending(ops, packed, done, k, m * n)


_KINDS = ([(f, s) for f in EPILOGUE_FAULTS for s in SEVERITIES]
          + [("F6", "all"), ("F7", "all"), ("F8", "all"), ("F9", "all"), ("F9", "one"), ("F9", "pct")])
_F6_CELL, _F7_CELL, _F9_ALL, _F9_ONE, _F9_PCT = 15, 16, 18, 19, 20


def _columns(ops: list[Operands], k: int, elements: int, tables: np.ndarray, facts: np.ndarray) -> CellColumns:
    """The cells of a batch from its tables [L, R, 21, 5] and facts [L, F], in the order
    ``campaign._LayerRun.cells`` yields them (layer, regime, fault and severity), with its evidence."""
    layers = len(ops)
    shape = (layers, R, CELLS_PER_REGIME)
    layer, regime = _unpack_facts(facts)
    repeats = np.ones(shape, dtype=np.int64)
    repeats[..., _F6_CELL], repeats[..., _F7_CELL] = layer["r6"][..., 0], layer["r7"][..., 0]
    boost = np.zeros(shape, dtype=bool)
    boost[..., _F7_CELL] = layer["boosted"][..., 0].astype(bool)
    top_abs = np.broadcast_to(layer["absmax"], shape).copy()
    top_abs[..., _F6_CELL] = (layer["r6"] * layer["absmax"])[..., 0]
    top_abs[..., _F7_CELL], top_abs[..., _F9_ALL] = layer["absmax7"][..., 0], layer["absmax_all"][..., 0]
    top_abs[..., _F9_ONE] = regime["absmax_one"]
    match = np.broadcast_to(layer["base_match"], shape).copy()
    match[..., _F6_CELL], match[..., _F7_CELL] = layer["match6"][..., 0], layer["match7"][..., 0]
    match[..., _F9_ALL], match[..., _F9_ONE] = layer["match_all"][..., 0], regime["match_one"]
    p2 = np.broadcast_to(regime["pow2"][..., None], shape).copy()
    p2[..., _F9_PCT] = regime["pow2_pct"]
    ident = np.ones(shape, dtype=np.int64)
    ident[..., _F9_ALL], ident[..., _F9_ONE] = layer["ident_all"][..., 0], regime["ident_one"]
    ident[..., _F9_PCT] = regime["ident_pct"]
    differing, max_d, nonfinite, mismatch, changed = (tables[..., c].reshape(-1)
                                                      for c in (DIFFERING, MAX_D, NONFINITE, MISMATCH, CHANGED))
    count = layers * R * CELLS_PER_REGIME
    depth = k * repeats.reshape(-1)
    evidence = EvidenceColumns(
        operands_identical=ident.reshape(-1).astype(bool), k=np.stack([depth, depth], 1),
        exact_absmax=top_abs.reshape(-1), accumulators=match.reshape(-1).astype(bool),
        scales_pow2=p2.reshape(-1).astype(bool), elements=np.full(count, elements, dtype=np.int64),
        differing=differing, max_finite_ulp=np.where(elements > nonfinite, np.maximum(max_d, 0), -1),
        finiteness_mismatch=mismatch)
    per = R * CELLS_PER_REGIME
    return CellColumns(
        layer=np.repeat(np.array([op.layer for op in ops], dtype=object), per),
        block=np.repeat(np.array([int(op.block) for op in ops], dtype=np.int64), per),
        proj=np.repeat(np.array([op.proj for op in ops], dtype=object), per),
        fault=np.tile(np.array([f for f, _ in _KINDS * R], dtype=object), layers),
        severity=np.tile(np.array([s for _, s in _KINDS * R], dtype=object), layers),
        regime=np.tile(np.repeat(np.array(REGIMES, dtype=object), CELLS_PER_REGIME), layers),
        changed=changed, nonfinite=nonfinite, repeats=repeats.reshape(-1), boosted=boost.reshape(-1),
        evidence=evidence)


def _scales_fit(s: object, rows: int) -> bool:
    """What ``pipeline.as_scales`` checks without reading values: dtype and shape."""
    return (isinstance(s, torch.Tensor) and s.dtype in (torch.float32, torch.bfloat16)
            and tuple(s.shape) in ((rows,), (rows, 1)))


def _finish(p: _Pending, settings: CampaignSettings, device: torch.device) -> list[CellColumns]:
    """Read one batch's answers back (the one synchronisation per batch) and make each layer's cells;
    a flagged batch is rerun layer by layer by the per-cell engine."""
    tables, facts, flagged = p.read()
    if flagged:
        return [run_layer_cells(op, settings, device) for op in p.ops]
    cells = _columns(p.ops, p.k, p.elements, tables, facts)
    return [cells.part(i * CELLS_PER_LAYER, (i + 1) * CELLS_PER_LAYER) for i in range(len(p.ops))]


_POOLS: dict[int, ProcessPoolExecutor] = {}


def _pool(workers: int) -> ProcessPoolExecutor | None:
    """The draw workers, started once per process and kept; None for ``workers=0``.

    They come from a fork server (one small single-threaded process that imported this module),
    not by forking this process: forking a process that runs threads (torch's, CUDA's) can copy a
    held lock into the child, which Python 3.12 warns about, and costs tens of milliseconds per
    worker for a large process."""
    if workers <= 0:
        return None
    if workers not in _POOLS:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        _POOLS[workers] = ProcessPoolExecutor(workers, mp_context=context)
    return _POOLS[workers]




def layer_bytes(m: int, k: int, n: int, tile_width: int) -> int:
    """An upper estimate of the device memory one layer takes in a batch: F5's per-tile partial
    sums and scaled terms, the stacked bf16 outputs, the float32 and int64 intermediates, and the
    float32 and float64 copies of the operands."""
    tiles, mn = -(-k // tile_width), m * n
    per_element = tiles * R * 4 + tiles * 4 + (len(SLABS) + 1) * R * 2 + 4 * R * 4 + 12 * 8
    return mn * per_element + (m + n) * tiles * tile_width * 4 * 2 + (m + n) * k * 8


def batch_size(m: int, k: int, n: int, settings: CampaignSettings, device: torch.device, most: int = BATCH,
               budget: int | None = None) -> int:
    """How many layers of this shape one batch takes: at most ``most``, and within
    1/``MEMORY_SHARE`` of the run's memory budget in bytes (``gpu_budget_mb``), else of the device's
    memory (2 GiB on the CPU), so that a smaller budget takes smaller batches instead of running out
    of memory. A batch holds at least one layer; the campaign's rows are the same at any batch size."""
    if budget is None:
        budget = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 16 * 2**30
    return max(1, min(most, budget // MEMORY_SHARE // layer_bytes(m, k, n, settings.tile_width)))


def run_layers(layers: Iterable[Operands], settings: CampaignSettings, device: torch.device,
               workers: int = 0, batch: int = BATCH, budget: int | None = None) -> Iterator[CellColumns]:
    """Each layer's cells, in the order given.

    Layers are read ahead (``lookahead``) and the ones of one shape are batched, up to ``batch``
    and ``batch_size`` (within ``budget`` bytes, where one is given);
    a batch's work is queued before the previous batch is read back. The seeded draws (host work
    as large as the rest) are made ``workers`` processes wide while the device works; ``workers=0``
    draws in line. Worker processes are started once and kept; they only draw numbers (numpy),
    never touching the device.
    """
    pool = _pool(workers)
    lookahead = max(4 * batch, 2 * workers, 1)
    source = iter(layers)
    waiting: deque[tuple[int, Operands, Future[Picks] | Picks]] = deque()
    done: dict[int, CellColumns] = {}
    emitted = taken = 0
    pending: _Pending | None = None
    pending_index: list[int] = []
    staging = _Staging()

    def fill() -> None:
        nonlocal taken
        while len(waiting) < lookahead:
            op = next(source, None)
            if op is None:
                return
            _validate(op)
            shape = (op.layer, op.a_q.shape[0], op.a_q.shape[1], op.w_q.shape[0], settings)
            waiting.append((taken, op, pool.submit(draw_picks, *shape) if pool else draw_picks(*shape)))
            taken += 1

    def key(op: Operands) -> tuple[object, ...] | None:
        m, n = op.a_q.shape[0], op.w_q.shape[0]
        if not (_scales_fit(op.s_a, m) and _scales_fit(op.s_w, n)):
            return None
        return (tuple(op.a_q.shape), tuple(op.w_q.shape), op.a_q.device, op.w_q.device)

    try:
        fill()
        while waiting or pending is not None:
            current: _Pending | None = None
            current_index: list[int] = []
            if waiting:
                index, op, draws = waiting.popleft()
                group = key(op)
                if group is None:
                    done[index] = run_layer_cells(op, settings, device)
                else:
                    members = [(index, op, draws)]
                    most = batch_size(op.a_q.shape[0], op.a_q.shape[1], op.w_q.shape[0], settings, device, batch,
                                      budget)
                    for item in list(waiting):
                        if len(members) == most:
                            break
                        if key(item[1]) == group:
                            members.append(item)
                            waiting.remove(item)
                    picks = [d.result() if isinstance(d, Future) else d for _, _, d in members]
                    current = _enqueue([o for _, o, _ in members], settings, device, picks, staging)
                    current_index = [i for i, _, _ in members]
                fill()
            if pending is not None:
                for i, rows in zip(pending_index, _finish(pending, settings, device)):
                    done[i] = rows
            pending, pending_index = current, current_index
            while emitted in done:
                yield done.pop(emitted)
                emitted += 1
    finally:
        for _, _, draws in waiting:
            if isinstance(draws, Future):
                draws.cancel()

"""The reference arm's logit margin as a predictor of top-1 flips: ROC-AUC and a calibrated map.

A flip needs the two arms' logits to move the top-1 and top-2 tokens past each other, so the
smaller the margin, the likelier a flip. Two questions are asked of the data:

* discrimination: ROC-AUC of "small margin" for flips, ``P(margin at a flip < margin at a
  non-flip) + 1/2 P(equal)``, with a percentile interval from a cluster bootstrap over windows
  (positions of one window share their context, so the window is resampled as a whole);
* calibration: a margin -> flip-probability map from quantile bins of the fitting windows'
  margins (bins merged until each holds ``min_support`` positions, probabilities smoothed with a
  Beta(1, 1) prior), scored by its Brier score on held-out windows against the constant map
  (one bin, the same prior) fitted on the same windows.

A quantity that the data cannot define (no flip, no non-flip, no held-out window) is None with
the reason, never a number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..analysis.bootstrap import QUANTILE_METHOD, resample_indices

_CHUNK = 256  # bootstrap resamples evaluated per step (memory ~ chunk x distinct margins)


def _checked(margin: np.ndarray, flip: np.ndarray, cluster: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    m = np.asarray(margin, dtype=np.float64).reshape(-1)
    f = np.asarray(flip).reshape(-1)
    if f.dtype != np.bool_:
        raise InputError(f"margin predictor: flips must be booleans, got dtype {f.dtype}")
    if m.shape != f.shape:
        raise InputError(f"margin predictor: {m.size} margins but {f.size} flip flags")
    if np.isnan(m).any() or (m < 0).any():
        raise InputError("margin predictor: margins must be non-negative numbers (drop non-finite positions first)")
    if cluster is None:
        return m, f
    c = np.asarray(cluster).reshape(-1)
    if c.shape != m.shape or not np.issubdtype(c.dtype, np.integer):
        raise InputError(f"margin predictor: cluster ids must be integers, one per position (got {c.dtype} {c.shape})")
    return m, f, c


def _auc_from_counts(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """AUC per row from flip / non-flip counts ``[R, U]`` over distinct margins in ascending order.

    A flip at margin u beats every non-flip at a larger margin and ties half of those at u.
    NaN where a row has no flip or no non-flip.
    """
    neg_above = neg.sum(axis=1, keepdims=True) - np.cumsum(neg, axis=1)
    wins = (pos * (neg_above + 0.5 * neg)).sum(axis=1)
    pairs = pos.sum(axis=1) * neg.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, wins / pairs, np.nan)


def auc_small_margin(margin: np.ndarray, flip: np.ndarray) -> float | None:
    """ROC-AUC of small margins for flips (Mann-Whitney with half credit for ties); None if undefined."""
    m, f = _checked(margin, flip)
    values, index = np.unique(m, return_inverse=True)
    pos = np.bincount(index[f], minlength=values.size).astype(np.float64)[None, :]
    neg = np.bincount(index[~f], minlength=values.size).astype(np.float64)[None, :]
    auc = float(_auc_from_counts(pos, neg)[0])
    return None if np.isnan(auc) else auc


@dataclass(frozen=True)
class AucInterval:
    """AUC on the full sample and its cluster-bootstrap percentile interval.

    ``low``/``high`` are None when fewer than ``min_defined_share`` of the resamples define the
    AUC (resamples that drew no flip or no non-flip); ``defined`` counts those that did.
    """

    estimate: float | None
    low: float | None
    high: float | None
    level: float
    resamples: int
    defined: int
    seed: int


def cluster_bootstrap_auc(margin: np.ndarray, flip: np.ndarray, cluster: np.ndarray, *, seed: int,
                          resamples: int, level: float, min_defined_share: float) -> AucInterval:
    """AUC with a percentile interval over resamples of whole clusters (windows), with replacement.

    Cluster ids are relabelled 0..C-1 in ascending order and resampled with the project's pinned
    stream (``bootstrap.resample_indices``), so a window drawn twice counts twice. Each resample's
    AUC is computed from per-cluster counts at each distinct margin, never position by position.
    """
    m, f, c = _checked(margin, flip, cluster)
    if not 0 < level < 1 or not 0 < min_defined_share <= 1:
        raise InputError(f"cluster bootstrap: level {level} and min_defined_share {min_defined_share} must lie in (0, 1]")
    estimate = auc_small_margin(m, f)
    if m.size == 0:
        return AucInterval(None, None, None, level, resamples, 0, seed)
    labels, cl = np.unique(c, return_inverse=True)
    values, u = np.unique(m, return_inverse=True)
    pos = np.zeros((labels.size, values.size))
    neg = np.zeros((labels.size, values.size))
    np.add.at(pos, (cl[f], u[f]), 1.0)
    np.add.at(neg, (cl[~f], u[~f]), 1.0)
    draws = resample_indices(labels.size, seed=seed, resamples=resamples)
    aucs = np.empty(resamples)
    for start in range(0, resamples, _CHUNK):
        block = draws[start:start + _CHUNK]
        counts = np.zeros((block.shape[0], labels.size))
        np.add.at(counts, (np.repeat(np.arange(block.shape[0]), labels.size), block.reshape(-1)), 1.0)
        aucs[start:start + block.shape[0]] = _auc_from_counts(counts @ pos, counts @ neg)
    defined = aucs[~np.isnan(aucs)]
    if estimate is None or defined.size < min_defined_share * resamples:
        return AucInterval(estimate, None, None, level, resamples, int(defined.size), seed)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(defined, [tail, 1.0 - tail], method=QUANTILE_METHOD)
    return AucInterval(estimate, float(low), float(high), level, resamples, int(defined.size), seed)


@dataclass(frozen=True)
class BinMap:
    """Margin bins ``[edges[i-1], edges[i])`` (first from -inf, last to +inf) with their counts.

    ``probability`` is the Beta(prior_flips, prior_stays)-smoothed flip rate of each bin:
    ``(flips + prior_flips) / (positions + prior_flips + prior_stays)``.
    """

    edges: np.ndarray       # interior edges, ascending, len = bins - 1
    positions: np.ndarray   # fitting positions per bin
    flips: np.ndarray       # fitting flips per bin
    probability: np.ndarray

    def bin_of(self, margin: np.ndarray) -> np.ndarray:
        """Bin index of each margin: the number of interior edges at or below it."""
        return np.searchsorted(self.edges, np.asarray(margin, dtype=np.float64), side="right")

    def predict(self, margin: np.ndarray) -> np.ndarray:
        return self.probability[self.bin_of(margin)]


def fit_bins(margin: np.ndarray, flip: np.ndarray, *, bins: int, min_support: int, prior_flips: float = 1.0,
             prior_stays: float = 1.0) -> BinMap:
    """Quantile bins of the fitting margins, merged left to right until each holds ``min_support``.

    Interior edges are the margins' ``i / bins`` quantiles (inverted CDF: observed values, so a
    tie never splits), duplicates dropped. Bins are then merged in order: a bin closes once it
    holds ``min_support`` positions, and a remainder that never reaches it joins the last closed
    bin. Fewer than ``min_support`` positions in all gives one bin, the constant map.
    """
    m, f = _checked(margin, flip)
    if bins < 1 or min_support < 1 or prior_flips <= 0 or prior_stays <= 0:
        raise InputError(f"calibration map: bins={bins}, min_support={min_support} and the Beta prior "
                         f"({prior_flips}, {prior_stays}) must be positive")
    if m.size == 0:
        raise InputError("calibration map: no fitting positions")
    edges = np.unique(np.quantile(m, np.arange(1, bins) / bins, method="inverted_cdf")) if bins > 1 else np.empty(0)
    index = np.searchsorted(edges, m, side="right")
    support = np.bincount(index, minlength=edges.size + 1)
    kept: list[int] = []   # indices into `edges` of the edges that survive merging
    held = 0
    for i, n in enumerate(support[:-1]):
        held += int(n)
        if held >= min_support:
            kept.append(i)
            held = 0
    if kept and held + int(support[-1]) < min_support:
        kept.pop()  # the remainder after the last kept edge is too small: merge it leftwards
    final = edges[np.asarray(kept, dtype=np.int64)]
    which = np.searchsorted(final, m, side="right")
    positions = np.bincount(which, minlength=final.size + 1)
    flips = np.bincount(which[f], minlength=final.size + 1)
    probability = (flips + prior_flips) / (positions + prior_flips + prior_stays)
    return BinMap(final, positions, flips, probability)


def brier(probability: np.ndarray, flip: np.ndarray) -> float:
    """Mean squared difference between predicted flip probabilities and the 0/1 outcomes."""
    p = np.asarray(probability, dtype=np.float64).reshape(-1)
    y = np.asarray(flip, dtype=np.float64).reshape(-1)
    if p.size == 0 or p.shape != y.shape:
        raise InputError(f"Brier score: needs equally many predictions and outcomes, at least one (got {p.size}, {y.size})")
    return float(np.mean((p - y) ** 2))


def fit_windows(windows: np.ndarray) -> np.ndarray:
    """The pinned split: a position is used for fitting when its window index is even, held out when odd."""
    w = np.asarray(windows)
    if not np.issubdtype(w.dtype, np.integer) or (w < 0).any():
        raise InputError("calibration split: window indices must be non-negative integers")
    return w % 2 == 0


@dataclass(frozen=True)
class Calibration:
    """The fitted map, the constant-prevalence baseline, and their held-out Brier scores."""

    map: BinMap
    baseline: BinMap
    brier_map: float
    brier_baseline: float
    held_out_positions: int
    held_out_flips: int
    held_out_windows: int

    @property
    def skill(self) -> float | None:
        """1 - Brier(map) / Brier(baseline); None when the baseline is perfect (Brier 0)."""
        return None if self.brier_baseline == 0 else 1.0 - self.brier_map / self.brier_baseline


def calibrate(margin: np.ndarray, flip: np.ndarray, window: np.ndarray, *, bins: int, min_support: int,
              prior_flips: float = 1.0, prior_stays: float = 1.0) -> Calibration | str:
    """Fit on even windows, score on odd ones; a string saying why when the split leaves a side empty."""
    m, f, w = _checked(margin, flip, window)
    fit = fit_windows(w)
    if not fit.any():
        return "not evaluable: no fitting window (even window index)"
    if fit.all():
        return "not evaluable: no held-out window (odd window index)"
    cal = fit_bins(m[fit], f[fit], bins=bins, min_support=min_support, prior_flips=prior_flips, prior_stays=prior_stays)
    base = fit_bins(m[fit], f[fit], bins=1, min_support=1, prior_flips=prior_flips, prior_stays=prior_stays)
    held = ~fit
    return Calibration(cal, base, brier(cal.predict(m[held]), f[held]), brier(base.predict(m[held]), f[held]),
                       int(held.sum()), int(f[held].sum()), int(np.unique(w[held]).size))


def cluster_bootstrap_rate(events: np.ndarray, totals: np.ndarray, *, seed: int, resamples: int,
                           level: float) -> tuple[float, float]:
    """Percentile interval of a rate ``sum(events) / sum(totals)`` over resamples of whole clusters.

    ``events``/``totals`` are per cluster (window), every total positive; the resampling stream
    is the project's pinned one (``bootstrap.resample_indices``).
    """
    e = np.asarray(events, dtype=np.float64).reshape(-1)
    t = np.asarray(totals, dtype=np.float64).reshape(-1)
    if e.shape != t.shape or e.size == 0 or (t <= 0).any() or (e < 0).any() or (e > t).any():
        raise InputError(f"cluster bootstrap of a rate: needs per-cluster counts 0 <= events <= totals, totals > 0 "
                         f"(got {e.size} events for {t.size} totals)")
    if not 0 < level < 1:
        raise InputError(f"cluster bootstrap of a rate: level must lie in (0, 1), got {level}")
    idx = resample_indices(e.size, seed=seed, resamples=resamples)
    rates = e[idx].sum(axis=1) / t[idx].sum(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(rates, [tail, 1.0 - tail], method=QUANTILE_METHOD)
    return float(low), float(high)


def average_precision(margin: np.ndarray, flip: np.ndarray) -> float | None:
    """Average precision of small margins for flips, ties grouped; None without a flip.

    Every distinct margin (ascending) is one threshold, so tied positions enter together:
    ``AP = sum_k (R_k - R_(k-1)) * P_k`` with precision ``P_k`` and recall ``R_k`` of the set of
    positions whose margin is at most the k-th distinct margin.
    """
    m, f = _checked(margin, flip)
    total = int(f.sum())
    if total == 0:
        return None
    values, index = np.unique(m, return_inverse=True)
    flips = np.cumsum(np.bincount(index[f], minlength=values.size))
    seen = np.cumsum(np.bincount(index, minlength=values.size))
    recall_step = np.diff(np.concatenate([[0], flips])) / total
    return float(np.sum(recall_step * flips / seen))


@dataclass(frozen=True)
class IsotonicMap:
    """A non-increasing step function of the margin: ``value[i]`` from ``start[i]`` (a fitting
    margin) up to the next start; below the first start it is ``value[0]``."""

    start: np.ndarray
    value: np.ndarray

    def predict(self, margin: np.ndarray) -> np.ndarray:
        i = np.searchsorted(self.start, np.asarray(margin, dtype=np.float64), side="right") - 1
        return self.value[np.clip(i, 0, self.start.size - 1)]


def fit_isotonic_decreasing(margin: np.ndarray, flip: np.ndarray) -> IsotonicMap:
    """Decreasing isotonic regression of flip (1/0) on margin by pooling adjacent violators.

    Positions with equal margins are pooled first (one weighted point per distinct margin). Each
    pass pools every maximal run of blocks whose means increase (each such run is a chain of
    adjacent violations, so pooling it is a sequence of valid PAVA steps) until none is left.
    """
    m, f = _checked(margin, flip)
    if m.size == 0:
        raise InputError("isotonic map: no fitting positions")
    values, index = np.unique(m, return_inverse=True)
    weight = np.bincount(index, minlength=values.size).astype(np.float64)
    total = np.bincount(index[f], minlength=values.size).astype(np.float64)
    start = values
    while True:
        mean = total / weight
        rising = mean[1:] > mean[:-1]
        if not rising.any():
            return IsotonicMap(start, mean)
        # a block joins its left neighbour's group when the neighbour's mean is below its own
        group = np.cumsum(np.concatenate([[True], ~rising])) - 1
        weight = np.asarray(np.bincount(group, weights=weight), dtype=np.float64)
        total = np.asarray(np.bincount(group, weights=total), dtype=np.float64)
        first = np.concatenate([[True], group[1:] != group[:-1]])
        start = start[first]


@dataclass(frozen=True)
class IsotonicCalibration:
    map: IsotonicMap
    brier: float
    held_out_positions: int


def calibrate_isotonic(margin: np.ndarray, flip: np.ndarray, window: np.ndarray) -> IsotonicCalibration | str:
    """The isotonic sensitivity map fitted on the even windows, its Brier score on the odd ones."""
    m, f, w = _checked(margin, flip, window)
    fit = fit_windows(w)
    if not fit.any():
        return "not evaluable: no fitting window (even window index)"
    if fit.all():
        return "not evaluable: no held-out window (odd window index)"
    iso = fit_isotonic_decreasing(m[fit], f[fit])
    held = ~fit
    return IsotonicCalibration(iso, brier(iso.predict(m[held]), f[held]), int(held.sum()))


@dataclass(frozen=True)
class Influence:
    """Per cluster (window), the AUC and flip rate without it and their change from the full sample."""

    cluster: np.ndarray
    positions: np.ndarray
    flips: np.ndarray
    auc_without: np.ndarray      # NaN where the rest has no flip or no non-flip
    flip_rate_without: np.ndarray  # NaN where the rest has no position
    auc: float | None
    flip_rate: float


def leave_one_cluster_out(margin: np.ndarray, flip: np.ndarray, cluster: np.ndarray) -> Influence:
    """AUC and flip rate recomputed with each cluster's positions left out, from per-cluster counts."""
    m, f, c = _checked(margin, flip, cluster)
    if m.size == 0:
        raise InputError("leave-one-cluster-out: no positions")
    labels, cl = np.unique(c, return_inverse=True)
    values, u = np.unique(m, return_inverse=True)
    pos = np.zeros((labels.size, values.size))
    neg = np.zeros((labels.size, values.size))
    np.add.at(pos, (cl[f], u[f]), 1.0)
    np.add.at(neg, (cl[~f], u[~f]), 1.0)
    auc_without = _auc_from_counts(pos.sum(axis=0) - pos, neg.sum(axis=0) - neg)
    flips = pos.sum(axis=1)
    positions = flips + neg.sum(axis=1)
    rest = positions.sum() - positions
    with np.errstate(invalid="ignore", divide="ignore"):
        rate_without = np.where(rest > 0, (flips.sum() - flips) / rest, np.nan)
    return Influence(labels, positions.astype(np.int64), flips.astype(np.int64), auc_without, rate_without,
                     auc_small_margin(m, f), float(f.mean()))

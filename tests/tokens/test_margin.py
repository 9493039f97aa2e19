"""ROC-AUC, the cluster bootstrap, the calibration map and the Brier score on cases small enough
to compute by hand, and against brute-force restatements of their definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from int8alibi.errors import InputError
from int8alibi.analysis.bootstrap import QUANTILE_METHOD, resample_indices
from int8alibi.tokens.margin import (auc_small_margin, average_precision, brier, calibrate, calibrate_isotonic,
                                     cluster_bootstrap_auc, cluster_bootstrap_rate, fit_bins, fit_isotonic_decreasing,
                                     fit_windows, leave_one_cluster_out)

T, F = True, False


def pairwise_auc(margin: np.ndarray, flip: np.ndarray) -> float | None:
    """The definition, pair by pair: a flip scores 1 against every non-flip with a larger margin, 1/2 on a tie."""
    pos, neg = margin[flip], margin[~flip]
    if pos.size == 0 or neg.size == 0:
        return None
    wins = sum(1.0 if p < n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (pos.size * neg.size)


@pytest.mark.parametrize(("margin", "flip", "expected"), [
    ([0.1, 0.2, 0.3, 0.4], [T, T, F, F], 1.0),            # every flip below every non-flip
    ([0.1, 0.2, 0.3, 0.4], [F, F, T, T], 0.0),            # the reverse
    ([0.0, 0.0, 1.0, 1.0], [T, F, T, F], 0.5),            # (1/2 + 1 + 0 + 1/2) / 4
    ([0.1, 0.2, 0.2, 0.5, 0.9], [T, F, T, F, F], 5.5 / 6),  # a tie between a flip and a non-flip at 0.2
    ([0.0, 0.0, 0.0], [T, F, F], 0.5),                    # all tied
])
def test_auc_by_hand(margin: list[float], flip: list[bool], expected: float) -> None:
    assert auc_small_margin(np.array(margin), np.array(flip)) == pytest.approx(expected, abs=1e-15)


def test_auc_is_undefined_without_both_classes() -> None:
    assert auc_small_margin(np.array([0.1, 0.2]), np.array([F, F])) is None
    assert auc_small_margin(np.array([0.1, 0.2]), np.array([T, T])) is None
    assert auc_small_margin(np.array([]), np.array([], dtype=bool)) is None


def test_auc_matches_the_pairwise_definition_on_quantized_margins() -> None:
    rng = np.random.default_rng(7)
    margin = np.round(rng.exponential(0.5, 300) * 16) / 16  # bf16-like steps: many ties
    flip = rng.random(300) < np.exp(-4 * margin)
    assert auc_small_margin(margin, flip) == pytest.approx(pairwise_auc(margin, flip), abs=1e-12)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(InputError, match="booleans"):
        auc_small_margin(np.array([0.1]), np.array([1]))
    with pytest.raises(InputError, match="non-negative"):
        auc_small_margin(np.array([np.nan, 0.1]), np.array([T, F]))
    with pytest.raises(InputError, match="2 margins but 1"):
        auc_small_margin(np.array([0.1, 0.2]), np.array([T]))
    with pytest.raises(InputError, match="cluster ids"):
        cluster_bootstrap_auc(np.array([0.1]), np.array([T]), np.array([0.5]), seed=0, resamples=10, level=0.9,
                              min_defined_share=0.9)


def test_one_cluster_gives_a_degenerate_interval_at_the_estimate() -> None:
    m, f = np.array([0.1, 0.4, 0.2, 0.9]), np.array([T, F, T, F])
    iv = cluster_bootstrap_auc(m, f, np.zeros(4, dtype=np.int64), seed=3, resamples=200, level=0.9,
                               min_defined_share=0.9)
    assert iv.estimate == 1.0 and iv.low == 1.0 and iv.high == 1.0 and iv.defined == 200


def test_cluster_bootstrap_equals_resampling_windows_by_hand() -> None:
    """Each resample duplicates whole windows; its AUC must equal the pairwise AUC of the duplicated data."""
    rng = np.random.default_rng(11)
    window = np.repeat(np.array([3, 5, 8, 13, 21]), 12)     # non-contiguous cluster ids, relabelled in order
    margin = np.round(rng.exponential(0.4, window.size) * 8) / 8
    flip = rng.random(window.size) < 0.35
    iv = cluster_bootstrap_auc(margin, flip, window, seed=99, resamples=150, level=0.8, min_defined_share=0.5)
    labels = np.unique(window)
    expected = []
    for draw in resample_indices(labels.size, seed=99, resamples=150):
        take = np.concatenate([np.flatnonzero(window == labels[i]) for i in draw])
        expected.append(pairwise_auc(margin[take], flip[take]))
    defined = np.array([e for e in expected if e is not None])
    low, high = np.quantile(defined, [0.1, 0.9], method=QUANTILE_METHOD)
    assert iv.defined == defined.size
    assert iv.low == pytest.approx(low, abs=1e-12) and iv.high == pytest.approx(high, abs=1e-12)
    assert iv.estimate == pytest.approx(pairwise_auc(margin, flip), abs=1e-12)


def test_an_interval_needs_enough_defined_resamples() -> None:
    """Flips only in one of four windows: about (3/4)^4 = 32% of resamples draw no flip."""
    window = np.repeat(np.arange(4), 5)
    flip = np.zeros(20, dtype=bool)
    flip[:2] = True
    margin = np.linspace(0.0, 1.9, 20)
    strict = cluster_bootstrap_auc(margin, flip, window, seed=5, resamples=400, level=0.9, min_defined_share=0.9)
    assert strict.estimate == 1.0 and strict.low is None and strict.high is None
    assert 0.5 * 400 < strict.defined < 0.85 * 400
    lenient = cluster_bootstrap_auc(margin, flip, window, seed=5, resamples=400, level=0.9, min_defined_share=0.5)
    assert lenient.low == 1.0 and lenient.high == 1.0 and lenient.defined == strict.defined


# --- the calibration map ------------------------------------------------------------------------

MARGINS = np.arange(10, dtype=np.float64)         # quantiles 0.2..0.8 (inverted CDF): 1, 3, 5, 7
FLIPS = np.array([T, T, F, F, F, F, F, F, F, F])


@pytest.mark.parametrize(("min_support", "edges", "positions", "flips"), [
    (1, [1, 3, 5, 7], [1, 2, 2, 2, 3], [1, 1, 0, 0, 0]),
    (3, [3, 7], [3, 4, 3], [2, 0, 0]),                # 1+2 closes at 3; 2+2 closes at 7; 3 left over
    (4, [5], [5, 5], [2, 0]),                         # 1+2+2 closes at 5; the rest (2+3) reaches 4
    (6, [], [10], [2]),                               # 1+2+2+2 closes at 7, but 3 left over: merged back
    (11, [], [10], [2]),                              # fewer positions than min_support: one bin
])
def test_quantile_bins_merge_to_minimum_support(min_support: int, edges: list[float], positions: list[int],
                                                flips: list[int]) -> None:
    m = fit_bins(MARGINS, FLIPS, bins=5, min_support=min_support)
    assert m.edges.tolist() == edges and m.positions.tolist() == positions and m.flips.tolist() == flips
    assert m.probability.tolist() == pytest.approx([(f + 1) / (n + 2) for f, n in zip(flips, positions)])


def test_bins_are_half_open_and_ties_never_split() -> None:
    m = fit_bins(np.array([0.0, 0.0, 0.0, 0.0, 1.0]), np.array([T, T, F, F, F]), bins=4, min_support=1)
    assert m.edges.tolist() == [] and m.positions.tolist() == [5]   # every quantile is 0: no empty bin survives
    m = fit_bins(MARGINS, FLIPS, bins=5, min_support=1)
    assert m.bin_of(np.array([0.999, 1.0, 2.999, 3.0, 7.0, 100.0])).tolist() == [0, 1, 1, 2, 4, 4]
    assert m.predict(np.array([-5.0, 1.0])).tolist() == pytest.approx([2 / 3, 2 / 4])


def test_brier_and_the_held_out_split_by_hand() -> None:
    assert brier(np.array([0.2, 0.9]), np.array([F, T])) == pytest.approx((0.04 + 0.01) / 2)
    assert fit_windows(np.array([0, 1, 2, 3])).tolist() == [T, F, T, F]
    # Fit on window 0: margins 0..3 with flips at 0, 1; one bin per two positions.
    margin = np.array([0.0, 1.0, 2.0, 3.0, 0.5, 2.5])
    flip = np.array([T, T, F, F, T, F])
    window = np.array([0, 0, 0, 0, 1, 1])
    cal = calibrate(margin, flip, window, bins=2, min_support=2)
    assert not isinstance(cal, str)
    # Median edge (inverted CDF) 1.0: bins [-inf, 1) = {0} and [1, inf) = {1, 2, 3}; min_support 2 merges them
    # unless the first reaches 2: it holds 1, so everything is one bin: the map equals the baseline.
    assert cal.map.edges.tolist() == [] and cal.brier_map == cal.brier_baseline
    p = (2 + 1) / (4 + 2)
    assert cal.brier_baseline == pytest.approx(((p - 1) ** 2 + p ** 2) / 2)
    assert (cal.held_out_positions, cal.held_out_flips, cal.held_out_windows) == (2, 1, 1)
    sharp = calibrate(margin, flip, window, bins=2, min_support=1)
    assert not isinstance(sharp, str) and sharp.map.edges.tolist() == [1.0]
    low, high = (1 + 1) / (1 + 2), (1 + 1) / (3 + 2)   # {0}: 1 flip of 1; {1, 2, 3}: 1 flip of 3
    assert sharp.brier_map == pytest.approx(((low - 1) ** 2 + high ** 2) / 2)
    assert sharp.skill == pytest.approx(1 - sharp.brier_map / sharp.brier_baseline)


def test_calibration_is_not_evaluable_without_both_sides_of_the_split() -> None:
    m, f = np.array([0.1, 0.2]), np.array([T, F])
    assert calibrate(m, f, np.array([0, 2]), bins=2, min_support=1) == "not evaluable: no held-out window (odd window index)"
    assert calibrate(m, f, np.array([1, 3]), bins=2, min_support=1) == "not evaluable: no fitting window (even window index)"


def test_rate_interval_equals_resampling_windows_by_hand() -> None:
    events, totals = np.array([0, 3, 1, 0, 5]), np.array([40, 40, 40, 20, 40])
    low, high = cluster_bootstrap_rate(events, totals, seed=4, resamples=300, level=0.9)
    rates = [events[d].sum() / totals[d].sum() for d in resample_indices(5, seed=4, resamples=300)]
    assert (low, high) == pytest.approx(tuple(np.quantile(rates, [0.05, 0.95], method=QUANTILE_METHOD)), abs=1e-15)
    with pytest.raises(InputError, match="events <= totals"):
        cluster_bootstrap_rate(np.array([3]), np.array([2]), seed=0, resamples=10, level=0.9)


def brute_average_precision(margin: np.ndarray, flip: np.ndarray) -> float | None:
    """The grouped-ties definition, threshold by threshold."""
    if not flip.any():
        return None
    total, ap, previous = flip.sum(), 0.0, 0.0
    for u in sorted(set(margin.tolist())):
        chosen = margin <= u
        recall = flip[chosen].sum() / total
        ap += (recall - previous) * flip[chosen].sum() / chosen.sum()
        previous = recall
    return ap


@pytest.mark.parametrize(("margin", "flip", "expected"), [
    ([0.0, 0.0, 1.0, 2.0], [T, F, T, F], 0.5 * 0.5 + 0.5 * (2 / 3)),   # a tie at 0 enters as one threshold
    ([0.1, 0.2, 0.3], [T, T, F], 1.0),                                  # every flip ranked first
    ([0.1, 0.2, 0.3], [F, F, T], 1 / 3),                                # the flip ranked last
    ([0.5, 0.5, 0.5, 0.5], [T, F, F, F], 0.25),                         # all tied: the prevalence
])
def test_average_precision_groups_ties(margin: list[float], flip: list[bool], expected: float) -> None:
    m, f = np.array(margin), np.array(flip)
    assert average_precision(m, f) == pytest.approx(expected)
    assert average_precision(m, f) == pytest.approx(brute_average_precision(m, f))


def test_average_precision_is_undefined_without_a_flip_and_matches_brute_force() -> None:
    assert average_precision(np.array([0.1, 0.2]), np.array([F, F])) is None
    rng = np.random.default_rng(3)
    m = rng.integers(0, 6, 200).astype(float) / 4  # many ties
    f = rng.random(200) < 0.3
    assert average_precision(m, f) == pytest.approx(brute_average_precision(m, f))


def test_isotonic_fit_pools_a_monotone_violation() -> None:
    # flips at margins 0, 1, 2, 3: 1, 0, 1, 0 -- the rise from margin 1 to 2 is pooled to 1/2
    fit = fit_isotonic_decreasing(np.array([0.0, 1.0, 2.0, 3.0]), np.array([T, F, T, F]))
    assert fit.start.tolist() == [0.0, 1.0, 3.0] and fit.value.tolist() == [1.0, 0.5, 0.0]
    assert fit.predict(np.array([-1.0, 0.5, 1.0, 2.5, 3.0, 9.0])).tolist() == [1.0, 1.0, 0.5, 0.5, 0.0, 0.0]


def test_isotonic_fit_pools_ties_first_and_chains_of_violations() -> None:
    # margin 0 twice (one flip: 1/2), then rising rates 0, 1/3, 1: that chain pools into one block of 2/5
    m = np.array([0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 3.0])
    f = np.array([T, F, F, T, F, F, T])
    fit = fit_isotonic_decreasing(m, f)
    assert fit.start.tolist() == [0.0, 1.0] and fit.value.tolist() == pytest.approx([0.5, 0.4])


def brute_isotonic_decreasing(margin: np.ndarray, flip: np.ndarray) -> np.ndarray:
    """The min-max formula at each distinct margin: min over j <= i of max over k >= i of mean(j..k)."""
    values = np.unique(margin)
    w = np.array([(margin == v).sum() for v in values], dtype=float)
    y = np.array([flip[margin == v].sum() for v in values], dtype=float)
    n = values.size
    return np.array([min(max(y[j:k + 1].sum() / w[j:k + 1].sum() for k in range(i, n)) for j in range(i + 1))
                     for i in range(n)])


def test_isotonic_fit_equals_the_min_max_formula() -> None:
    rng = np.random.default_rng(7)
    m = rng.integers(0, 25, 300).astype(float)
    f = rng.random(300) < 0.6 - m / 50
    fit = fit_isotonic_decreasing(m, f)
    assert np.all(np.diff(fit.value) <= 0)
    assert fit.predict(np.unique(m)) == pytest.approx(brute_isotonic_decreasing(m, f))


def test_isotonic_calibration_fits_even_windows_and_scores_odd_ones() -> None:
    m = np.array([0.0, 1.0, 0.0, 1.0])
    f = np.array([T, F, T, T])
    w = np.array([0, 0, 1, 1])
    got = calibrate_isotonic(m, f, w)
    assert not isinstance(got, str)
    # fitted on window 0: margin 0 -> 1, margin 1 -> 0; held out: (1-1)^2 + (0-1)^2 over 2
    assert got.brier == pytest.approx(0.5) and got.held_out_positions == 2
    assert calibrate_isotonic(m, f, np.array([0, 0, 2, 2])) == "not evaluable: no held-out window (odd window index)"


def test_leave_one_cluster_out_recomputes_without_each_window() -> None:
    m = np.array([0.1, 0.9, 0.2, 0.8, 0.5, 0.5])
    f = np.array([T, F, T, F, F, T])
    c = np.array([0, 0, 1, 1, 2, 2])
    got = leave_one_cluster_out(m, f, c)
    assert got.cluster.tolist() == [0, 1, 2] and got.positions.tolist() == [2, 2, 2] and got.flips.tolist() == [1, 1, 1]
    for i in range(3):
        keep = c != i
        assert got.auc_without[i] == pytest.approx(auc_small_margin(m[keep], f[keep]))
        assert got.flip_rate_without[i] == pytest.approx(f[keep].mean())
    # leaving out window 2 (the tie at 0.5) makes the rest perfectly ranked
    assert got.auc_without[2] == 1.0 and got.auc == pytest.approx(auc_small_margin(m, f))


def test_leave_one_cluster_out_is_undefined_where_the_rest_has_no_flip() -> None:
    got = leave_one_cluster_out(np.array([0.1, 0.2, 0.3]), np.array([T, F, F]), np.array([0, 1, 1]))
    assert np.isnan(got.auc_without[0]) and got.flip_rate_without[0] == 0.0
    assert np.isnan(got.auc_without[1])  # the rest (window 0): one flip, no non-flip

"""The margin predictor's hand-written estimators (kept for their exact bytes) against SciPy on seeded
random inputs, ties and boundary cases: ROC-AUC against the Mann-Whitney U statistic, the isotonic
map against ``scipy.optimize.isotonic_regression``, the cluster bootstraps against
``scipy.stats.bootstrap`` drawing from the same pinned stream, and average precision and the Brier
score (SciPy has neither) against direct restatements of their definitions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize, stats

from int8alibi.tokens.margin import (auc_small_margin, average_precision, brier, cluster_bootstrap_auc,
                                     cluster_bootstrap_rate, fit_isotonic_decreasing, leave_one_cluster_out)

SEEDS = range(6)


def _sample(seed: int, n: int, ties: bool) -> tuple[np.ndarray, np.ndarray]:
    """Margins (on a coarse grid when ``ties``, so many positions share one) and flips likelier at small margins."""
    rng = np.random.default_rng(seed)
    margin = rng.integers(0, 6, n).astype(np.float64) / 2 if ties else rng.exponential(1.0, n)
    flip = rng.random(n) < 1 / (1 + np.exp(2 * margin - 1))
    return margin, flip


def _mann_whitney_auc(margin: np.ndarray, flip: np.ndarray) -> float:
    """U of the non-flips' margins against the flips' (a non-flip above a flip scores 1, a tie 1/2), over the pairs."""
    return float(stats.mannwhitneyu(margin[~flip], margin[flip]).statistic) / (flip.sum() * (~flip).sum())


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_auc_is_mann_whitney_u_over_the_pairs(seed: int, ties: bool) -> None:
    margin, flip = _sample(seed, 40 + 37 * seed, ties)
    assert auc_small_margin(margin, flip) == pytest.approx(_mann_whitney_auc(margin, flip), rel=1e-13)


@pytest.mark.parametrize(("margin", "flip"), [
    ([0.0, 0.0, 0.0], [True, False, False]),     # all tied, at the boundary margin 0
    ([1.0, 2.0], [True, False]),                 # one pair
    ([2.0, 1.0], [True, False]),                 # one pair, reversed
    ([0.5, 0.5, 3.0, 3.0], [True, False, True, False]),
])
def test_auc_boundary_cases_against_mann_whitney(margin: list[float], flip: list[bool]) -> None:
    m, f = np.array(margin), np.array(flip)
    assert auc_small_margin(m, f) == pytest.approx(_mann_whitney_auc(m, f), rel=1e-15)


@pytest.mark.parametrize("seed", SEEDS)
def test_leave_one_cluster_out_auc_is_mann_whitney_on_the_rest(seed: int) -> None:
    margin, flip = _sample(seed, 120, ties=True)
    cluster = np.random.default_rng(seed + 100).integers(0, 7, margin.size)
    influence = leave_one_cluster_out(margin, flip, cluster)
    for label, auc in zip(influence.cluster, influence.auc_without):
        rest = cluster != label
        if flip[rest].all() or not flip[rest].any():
            assert np.isnan(auc)
        else:
            assert auc == pytest.approx(_mann_whitney_auc(margin[rest], flip[rest]), rel=1e-13)


def _clustered(seed: int, clusters: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clusters of 2 to 9 positions, each with at least one flip and one non-flip (every resample
    then defines the AUC, so SciPy's distribution and the kept one hold the same resamples)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 10, clusters)
    cluster = np.repeat(rng.permutation(clusters) * 3 + 5, sizes)  # labels neither 0-based nor in order
    margin = rng.integers(0, 8, cluster.size).astype(np.float64) / 4
    flip = rng.random(cluster.size) < 0.3
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    flip[starts], flip[starts + 1] = True, False
    return margin, flip, cluster


@pytest.mark.parametrize("seed", range(3))
def test_cluster_bootstrap_auc_matches_scipy_on_the_same_stream(seed: int) -> None:
    margin, flip, cluster = _clustered(seed, 12)
    labels = np.unique(cluster)  # the kept code relabels clusters 0..C-1 in ascending order
    members = [np.flatnonzero(cluster == label) for label in labels]

    def auc_of(drawn: np.ndarray) -> float:
        at = np.concatenate([members[i] for i in drawn])
        return _mann_whitney_auc(margin[at], flip[at])

    resamples, level = 300, 0.9
    ours = cluster_bootstrap_auc(margin, flip, cluster, seed=seed, resamples=resamples, level=level,
                                 min_defined_share=1.0)
    theirs = stats.bootstrap((np.arange(labels.size),), auc_of, vectorized=False, n_resamples=resamples,
                             confidence_level=level, method="percentile",
                             rng=np.random.Generator(np.random.PCG64(seed)))
    assert ours.defined == resamples
    assert (ours.low, ours.high) == pytest.approx(tuple(theirs.confidence_interval), rel=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_cluster_bootstrap_rate_matches_scipy_on_the_same_stream(seed: int) -> None:
    rng = np.random.default_rng(seed)
    totals = rng.integers(1, 50, 3 + 4 * seed)
    events = rng.binomial(totals, 0.2)
    level, resamples = 0.95, 1000
    low, high = cluster_bootstrap_rate(events, totals, seed=seed, resamples=resamples, level=level)
    theirs = stats.bootstrap((events.astype(np.float64), totals.astype(np.float64)),
                             lambda e, t, axis: e.sum(axis=axis) / t.sum(axis=axis), paired=True, vectorized=True,
                             n_resamples=resamples, confidence_level=level, method="percentile",
                             rng=np.random.Generator(np.random.PCG64(seed)))
    assert (low, high) == pytest.approx(tuple(theirs.confidence_interval), rel=1e-12)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_isotonic_map_is_scipys_weighted_isotonic_regression(seed: int, ties: bool) -> None:
    """Positions at one margin form one point weighted by their count (the map's definition); without
    ties that is SciPy's fit of the raw 0/1 outcomes ordered by margin."""
    margin, flip = _sample(seed, 30 + 29 * seed, ties)
    fitted = fit_isotonic_decreasing(margin, flip)
    values, index, weight = np.unique(margin, return_inverse=True, return_counts=True)
    rate = np.bincount(index, weights=flip.astype(np.float64)) / weight
    theirs = optimize.isotonic_regression(rate, weights=weight.astype(np.float64), increasing=False)
    assert fitted.predict(values) == pytest.approx(theirs.x, rel=1e-12, abs=1e-15)
    if not ties:
        order = np.argsort(margin)
        raw = optimize.isotonic_regression(flip[order].astype(np.float64), increasing=False)
        assert fitted.predict(margin[order]) == pytest.approx(raw.x, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(("margin", "flip"), [
    ([0.3], [True]),                                          # one position
    ([0.0, 0.0, 0.0], [True, False, True]),                   # all tied
    ([0.1, 0.2, 0.3], [False, False, False]),                 # no flip
    ([0.1, 0.2, 0.3], [True, True, True]),                    # every position flips
    ([0.1, 0.2, 0.3, 0.4], [False, False, True, True]),       # the wrong way round: one pooled block
])
def test_isotonic_boundary_cases_against_scipy(margin: list[float], flip: list[bool]) -> None:
    m, f = np.array(margin), np.array(flip)
    values, index, weight = np.unique(m, return_inverse=True, return_counts=True)
    rate = np.bincount(index, weights=f.astype(np.float64)) / weight
    theirs = optimize.isotonic_regression(rate, weights=weight.astype(np.float64), increasing=False)
    assert fit_isotonic_decreasing(m, f).predict(values) == pytest.approx(theirs.x, rel=1e-15, abs=0)


def test_isotonic_pools_a_violation_of_any_size() -> None:
    """Rates 100/200 then 101/200 at a larger margin: a rise of 0.005 is still pooled, to 201/400."""
    m = np.repeat([0.1, 0.2], 200)
    f = np.concatenate([np.arange(200) < 100, np.arange(200) < 101])
    theirs = optimize.isotonic_regression([0.5, 0.505], weights=[200.0, 200.0], increasing=False)
    assert fit_isotonic_decreasing(m, f).predict(np.array([0.1, 0.2])) == pytest.approx(theirs.x, rel=1e-15)
    assert theirs.x == pytest.approx([201 / 400] * 2, rel=1e-15)


def _ap_by_threshold(margin: np.ndarray, flip: np.ndarray) -> float:
    """Every distinct margin a threshold: precision and recall of {margin <= threshold}, recall steps times precision."""
    chosen = margin[None, :] <= np.unique(margin)[:, None]
    hits = (chosen & flip[None, :]).sum(axis=1)
    recall = hits / flip.sum()
    return float(np.sum(np.diff(recall, prepend=0.0) * hits / chosen.sum(axis=1)))


@pytest.mark.parametrize("seed", SEEDS)
def test_average_precision_without_ties_is_the_mean_precision_at_each_flip(seed: int) -> None:
    """Distinct margins: AP is the mean, over flips, of the precision among positions ranked up to it."""
    margin, flip = _sample(seed, 25 + 20 * seed, ties=False)
    ranked = flip[np.argsort(margin)]
    precision_at_flips = (np.cumsum(ranked) / np.arange(1, ranked.size + 1))[ranked]
    assert average_precision(margin, flip) == pytest.approx(precision_at_flips.mean(), rel=1e-13)


@pytest.mark.parametrize("seed", SEEDS)
def test_average_precision_with_ties_enters_tied_positions_together(seed: int) -> None:
    margin, flip = _sample(seed, 25 + 20 * seed, ties=True)
    if not flip.any():
        assert average_precision(margin, flip) is None
    else:
        assert average_precision(margin, flip) == pytest.approx(_ap_by_threshold(margin, flip), rel=1e-13)


@pytest.mark.parametrize(("margin", "flip", "expected"), [
    ([0.0, 0.0, 0.0], [True, False, False], 1 / 3),   # all tied: the prevalence
    ([0.1, 0.2], [True, True], 1.0),
    ([0.1, 0.2, 0.3], [False, False, True], 1 / 3),  # the only flip ranked last
    ([0.1, 0.2], [False, False], None),
])
def test_average_precision_boundary_cases(margin: list[float], flip: list[bool], expected: float | None) -> None:
    m, f = np.array(margin), np.array(flip)
    assert average_precision(m, f) == (None if expected is None else pytest.approx(expected, rel=1e-15))
    if expected is not None:
        assert average_precision(m, f) == pytest.approx(_ap_by_threshold(m, f), rel=1e-15)


@pytest.mark.parametrize("seed", SEEDS)
def test_brier_is_the_mean_squared_error_of_the_probabilities(seed: int) -> None:
    """Against the squared norm of the residual over n, and the calibration-refinement split for binned
    forecasts: sum over distinct p of n_p (p - observed rate)^2 + n_p rate (1 - rate), over n."""
    rng = np.random.default_rng(seed)
    probability = rng.integers(0, 11, 50 + 10 * seed) / 10  # few distinct values, 0 and 1 included
    flip = rng.random(probability.size) < probability
    residual = probability - flip
    assert brier(probability, flip) == pytest.approx(float(np.linalg.norm(residual) ** 2) / flip.size, rel=1e-13)
    values, index, count = np.unique(probability, return_inverse=True, return_counts=True)
    rate = np.bincount(index, weights=flip.astype(np.float64)) / count
    split = np.sum(count * (values - rate) ** 2 + count * rate * (1 - rate)) / flip.size
    assert brier(probability, flip) == pytest.approx(split, rel=1e-12)


@pytest.mark.parametrize(("probability", "flip", "expected"), [
    ([1.0, 0.0], [True, False], 0.0),      # perfect
    ([0.0, 1.0], [True, False], 1.0),      # perfectly wrong
    ([0.5, 0.5, 0.5], [True, False, True], 0.25),
])
def test_brier_boundary_cases(probability: list[float], flip: list[bool], expected: float) -> None:
    assert brier(np.array(probability), np.array(flip)) == expected

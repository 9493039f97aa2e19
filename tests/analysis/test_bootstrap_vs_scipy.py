"""The kept paired percentile bootstrap (its exact bytes are protocol numbers) against
``scipy.stats.bootstrap`` with ``paired=True`` and the percentile method: given a generator on the
same pinned PCG64 seed, SciPy draws the same window indices (one ``integers(0, n, (R, n))`` call,
the stream ``resample_indices`` draws in chunks) and must give the same interval. There is no BCa
interval in the kept code, so there is nothing of SciPy's BCa to compare."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from int8alibi.analysis.bootstrap import paired_bootstrap_ratio, resample_indices


def _ratio(nll_a: np.ndarray, nll_b: np.ndarray, tokens: np.ndarray, axis: int) -> np.ndarray:
    """ppl_a / ppl_b - 1 over the (resampled) windows along ``axis``, perplexity token-weighted."""
    total = tokens.sum(axis=axis)
    return np.exp(nll_a.sum(axis=axis) / total) / np.exp(nll_b.sum(axis=axis) / total) - 1.0


def _windows(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 513, n)
    nll_b = tokens * rng.gamma(4.0, 0.6, n)
    nll_a = nll_b * (1 + rng.normal(0.01, 0.02, n))  # paired: arm A tracks arm B window by window
    return nll_a, nll_b, tokens


@pytest.mark.parametrize(("seed", "n", "resamples", "level"), [
    (0, 2, 500, 0.9),        # two windows: three distinct resample values
    (1, 7, 1000, 0.95),
    (2, 64, 2500, 0.95),     # more resamples than one 1,024-row chunk of resample_indices
    (3, 300, 1024, 0.99),    # exactly one chunk
])
def test_paired_percentile_interval_matches_scipy(seed: int, n: int, resamples: int, level: float) -> None:
    nll_a, nll_b, tokens = _windows(seed, n)
    ours = paired_bootstrap_ratio(nll_a, nll_b, tokens, seed=seed, resamples=resamples, level=level)
    theirs = stats.bootstrap((nll_a, nll_b, tokens.astype(np.float64)), _ratio, paired=True, vectorized=True,
                             n_resamples=resamples, confidence_level=level, method="percentile",
                             rng=np.random.Generator(np.random.PCG64(seed)))
    assert (ours.low, ours.high) == pytest.approx(tuple(theirs.confidence_interval), rel=1e-12)
    assert ours.estimate == pytest.approx(float(_ratio(nll_a, nll_b, tokens, axis=0)), rel=1e-13)


@pytest.mark.parametrize(("n", "resamples"), [(2, 3), (5, 1024), (9, 2049)])  # SciPy needs two observations
def test_resample_indices_are_the_draws_scipy_makes(n: int, resamples: int) -> None:
    """SciPy's bootstrap distribution of "the resample itself" (one index per statistic) is the same
    first column of indices, whatever the chunking."""
    drawn = resample_indices(n, seed=7, resamples=resamples)
    theirs = stats.bootstrap((np.arange(n, dtype=np.float64),), lambda x, axis: x[..., 0], vectorized=True,
                             n_resamples=resamples, method="percentile",
                             rng=np.random.Generator(np.random.PCG64(7)))
    assert np.array_equal(theirs.bootstrap_distribution, drawn[:, 0].astype(np.float64))

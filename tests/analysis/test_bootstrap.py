"""Paired percentile bootstrap: cases whose resamples can be enumerated, pairing, pinned stream."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from int8alibi.errors import InputError
from int8alibi.analysis.bootstrap import paired_bootstrap, paired_bootstrap_ratio, perplexity, resample_indices

SEED, RESAMPLES, LEVEL = 20250612, 2000, 0.90


def test_perplexity_is_token_weighted() -> None:
    # Window 0: 3 tokens at NLL ln 2 each; window 1: 1 token at NLL ln 8. Token mean = (3 ln2 + 3 ln2)/4.
    nll = np.array([3 * math.log(2), math.log(8)])
    assert perplexity(nll, np.array([3, 1])) == pytest.approx(math.exp(6 * math.log(2) / 4), rel=1e-15)
    # The mean of per-window perplexities (2 and 8) would be 5: not what is computed.
    assert perplexity(nll, np.array([3, 1])) != pytest.approx(5.0)
    with pytest.raises(InputError, match="no scored tokens"):
        perplexity(np.array([0.0]), np.array([0]))


def test_two_windows_interval_is_the_extreme_resamples() -> None:
    """n = 2: resamples are (0,0), (0,1)/(1,0), (1,1) with mass 1/4, 1/2, 1/4, so the 5% and 95%
    percentiles of 2000 draws are the smallest and largest of the three enumerable values."""
    nll_a, nll_b, tokens = np.array([2.0, 3.0]), np.array([1.0, 3.0]), np.array([1, 3])
    both = math.exp((5.0 - 4.0) / 4) - 1      # (0,1): the full sample
    only0 = math.exp((4.0 - 2.0) / 2) - 1     # (0,0)
    only1 = math.exp((6.0 - 6.0) / 6) - 1     # (1,1)
    iv = paired_bootstrap_ratio(nll_a, nll_b, tokens, seed=SEED, resamples=RESAMPLES, level=LEVEL)
    assert iv.estimate == pytest.approx(both, rel=1e-14)
    assert iv.low == pytest.approx(min(only0, only1, both), abs=1e-14)
    assert iv.high == pytest.approx(max(only0, only1, both), rel=1e-14)
    assert (iv.level, iv.resamples, iv.seed) == (LEVEL, RESAMPLES, SEED)


def test_three_windows_every_resample_is_enumerable_with_its_probability() -> None:
    """n = 3: the 27 equally likely index triples give the exact bootstrap distribution; the
    pinned draws hit only those values, each with a frequency within 5 sigma of its probability."""
    nll = np.array([[4.0, 9.0, 1.5], [3.0, 8.0, 2.5]])
    tokens = np.array([2, 5, 1])
    exact: dict[float, float] = {}
    for triple in itertools.product(range(3), repeat=3):
        idx = list(triple)
        ppl = np.exp(nll[:, idx].sum(axis=1) / tokens[idx].sum())
        key = round(float(ppl[0] / ppl[1] - 1), 12)
        exact[key] = exact.get(key, 0.0) + 1 / 27
    idx = resample_indices(3, seed=SEED, resamples=RESAMPLES)
    ppl = np.exp(nll[:, idx].sum(axis=2) / tokens[idx].sum(axis=1))
    drawn = np.round(ppl[0] / ppl[1] - 1, 12)
    assert set(drawn.tolist()) <= set(exact)
    for value, prob in exact.items():
        freq = float(np.mean(drawn == value))
        assert abs(freq - prob) <= 5 * math.sqrt(prob * (1 - prob) / RESAMPLES), (value, freq, prob)
    iv = paired_bootstrap_ratio(nll[0], nll[1], tokens, seed=SEED, resamples=RESAMPLES, level=LEVEL)
    lo, hi = np.quantile(drawn, [0.05, 0.95])
    assert iv.low == pytest.approx(lo, abs=1e-11) and iv.high == pytest.approx(hi, abs=1e-11)


def test_pairing_removes_window_to_window_variation() -> None:
    """Arm b = arm a + c per token in every window: the paired ratio is exp(-c) in every resample,
    although the windows' own perplexities vary a lot (an unpaired interval would be wide)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(50, 200, size=40)
    nll_a = tokens * rng.uniform(1.0, 4.0, size=40)
    c = 0.03
    nll_b = nll_a + c * tokens
    iv = paired_bootstrap_ratio(nll_a, nll_b, tokens, seed=SEED, resamples=RESAMPLES, level=LEVEL)
    expected = math.exp(-c) - 1
    assert iv.estimate == pytest.approx(expected, abs=1e-12)
    assert iv.low == pytest.approx(expected, abs=1e-12) and iv.high == pytest.approx(expected, abs=1e-12)
    alone = paired_bootstrap(nll_a[None, :], tokens, lambda p: p[0], seed=SEED, resamples=RESAMPLES, level=LEVEL)
    assert alone.high / alone.low > 1.1


def test_interval_is_a_pure_function_of_the_seed() -> None:
    rng = np.random.default_rng(1)
    tokens = np.full(10, 31)
    nll = rng.uniform(60, 90, size=(2, 10))
    one = paired_bootstrap_ratio(nll[0], nll[1], tokens, seed=SEED, resamples=500, level=LEVEL)
    two = paired_bootstrap_ratio(nll[0], nll[1], tokens, seed=SEED, resamples=500, level=LEVEL)
    other = paired_bootstrap_ratio(nll[0], nll[1], tokens, seed=SEED + 1, resamples=500, level=LEVEL)
    assert one == two
    assert (one.low, one.high) != (other.low, other.high)


def test_resample_stream_does_not_depend_on_chunking() -> None:
    """Drawn in chunks of rows, the indices equal one single draw from the same seeded generator."""
    chunked = resample_indices(7, seed=SEED, resamples=2500)
    single = np.random.Generator(np.random.PCG64(SEED)).integers(0, 7, size=(2500, 7), dtype=np.int64)
    assert np.array_equal(chunked, single)


@pytest.mark.parametrize(
    ("nll", "tokens", "level", "match"),
    [
        (np.array([[1.0, np.nan]]), np.array([1, 1]), 0.9, "not finite"),
        (np.array([[1.0, 2.0]]), np.array([1, 0]), 0.9, "at least one token"),
        (np.array([[1.0, 2.0]]), np.array([1, 1]), 1.0, "level"),
        (np.array([1.0, 2.0]), np.array([1, 1]), 0.9, "expected nll sums"),
    ],
)
def test_bad_input_is_refused(nll: np.ndarray, tokens: np.ndarray, level: float, match: str) -> None:
    with pytest.raises(InputError, match=match):
        paired_bootstrap(nll, tokens, lambda p: p[0], seed=0, resamples=10, level=level)

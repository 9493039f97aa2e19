"""Perplexity and the paired percentile bootstrap over corpus windows.

Arms are scored on the same windows, so their per-window NLLs are strongly correlated; resampling
the same window indices for every arm (paired) keeps that correlation and gives intervals for a
difference that an unpaired bootstrap would blur. The resampling stream is fixed by the
protocol's seed, so an interval is a reproducible number, not a draw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np

from ..errors import InputError

QUANTILE_METHOD: Final = "linear"  # numpy's default (Hyndman-Fan type 7), pinned here
_CHUNK_ROWS = 1024          # resamples drawn per step; the stream is the same for any chunking


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval at ``level``."""

    estimate: float
    low: float
    high: float
    level: float
    resamples: int
    seed: int


def perplexity(nll_sum: np.ndarray, tokens: np.ndarray) -> float:
    """exp(total NLL / total scored tokens): the mean is over tokens, not over windows."""
    total = float(np.asarray(tokens, dtype=np.float64).sum())
    if total <= 0:
        raise InputError("perplexity: no scored tokens")
    return float(np.exp(np.asarray(nll_sum, dtype=np.float64).sum() / total))


def resample_indices(n: int, *, seed: int, resamples: int) -> np.ndarray:
    """The pinned resampling: ``resamples`` rows of ``n`` window indices drawn uniformly with
    replacement from numpy's PCG64 generator seeded with ``seed``. int64 ``[resamples, n]``."""
    if n < 1 or resamples < 1:
        raise InputError(f"bootstrap: needs at least one window and one resample (got {n}, {resamples})")
    rng = np.random.Generator(np.random.PCG64(seed))
    return np.concatenate([rng.integers(0, n, size=(min(_CHUNK_ROWS, resamples - start), n), dtype=np.int64)
                           for start in range(0, resamples, _CHUNK_ROWS)])


def _check(nll_sums: np.ndarray, tokens: np.ndarray) -> None:
    if nll_sums.ndim != 2 or tokens.ndim != 1 or nll_sums.shape[1] != tokens.shape[0]:
        raise InputError(f"bootstrap: expected nll sums [arms, windows] and tokens [windows], got "
                         f"{tuple(nll_sums.shape)} and {tuple(tokens.shape)}")
    if not np.all(np.isfinite(nll_sums)):
        raise InputError("bootstrap: a window's NLL is not finite")
    if np.any(tokens <= 0):
        raise InputError("bootstrap: every window must score at least one token")


def paired_bootstrap(nll_sums: np.ndarray, tokens: np.ndarray,
                     statistic: Callable[[np.ndarray], np.ndarray], *,
                     seed: int, resamples: int, level: float) -> Interval:
    """Percentile interval of ``statistic`` over paired window resamples.

    ``nll_sums`` is ``[arms, windows]`` (every arm scored on the same windows), ``tokens`` the
    scored tokens per window. For each resample the perplexity of every arm is computed over the
    resampled windows (same indices for all arms), and ``statistic`` maps perplexities
    ``[arms, R]`` to ``[R]``. The estimate is the statistic on the full sample.
    """
    sums = np.asarray(nll_sums, dtype=np.float64)
    toks = np.asarray(tokens, dtype=np.float64)
    _check(sums, toks)
    if not 0 < level < 1:
        raise InputError(f"bootstrap: level must lie in (0, 1), got {level}")
    full = np.exp(sums.sum(axis=1) / toks.sum())[:, None]
    estimate = float(np.asarray(statistic(full)).reshape(-1)[0])
    idx = resample_indices(toks.shape[0], seed=seed, resamples=resamples)
    ppl = np.exp(sums[:, idx].sum(axis=2) / toks[idx].sum(axis=1)[None, :])
    values = np.asarray(statistic(ppl), dtype=np.float64).reshape(-1)
    if values.shape[0] != resamples:
        raise InputError(f"bootstrap: statistic returned {values.shape[0]} values for {resamples} resamples")
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail], method=QUANTILE_METHOD)
    return Interval(estimate=estimate, low=float(low), high=float(high), level=float(level),
                    resamples=int(resamples), seed=int(seed))


def paired_bootstrap_ratio(nll_a: np.ndarray, nll_b: np.ndarray, tokens: np.ndarray, *,
                           seed: int, resamples: int, level: float) -> Interval:
    """Relative perplexity change ``ppl_a / ppl_b - 1`` with its paired percentile interval."""
    return paired_bootstrap(np.stack([np.asarray(nll_a), np.asarray(nll_b)]), tokens,
                            lambda ppl: ppl[0] / ppl[1] - 1.0,
                            seed=seed, resamples=resamples, level=level)

"""Candidate models of prevalence against K, their held-out comparison, and the INT8 constant-rate test.

All models are fitted by one objective, least squares on prevalence, so their errors compare on the
same scale. The two nonlinear models are solved by SciPy's Levenberg-Marquardt (MINPACK, through
``scipy.optimize.least_squares``) started from their log-linearized fit, with the exponent on
ln(K / K0) (K0 the grid's geometric mean) for conditioning; the t quantile and the chi-square
test are SciPy's too. Selection takes the lowest held-out error (the rule of arXiv:2608.13756);
the registered sensitivity prefers fewer parameters when the held-out error is within a margin of
the best, so one can see whether a flexible model won only by drawing a flat line a little better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import optimize, stats

from ..errors import InputError

_EPS = 1e-12

Predict = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (theta, ln(K/K0)) -> prevalence


def _constant(theta: np.ndarray, u: np.ndarray) -> np.ndarray:
    return np.full_like(u, theta[0])


def _log_linear(theta: np.ndarray, u: np.ndarray) -> np.ndarray:
    return theta[0] + theta[1] * u


def _power(theta: np.ndarray, u: np.ndarray) -> np.ndarray:
    return np.exp(np.clip(theta[0] + theta[1] * u, -700.0, 700.0))


def _saturation(theta: np.ndarray, u: np.ndarray) -> np.ndarray:
    return -np.expm1(-np.exp(np.clip(theta[0] + theta[1] * u, -700.0, 700.0)))


# model id -> (prediction on internal parameters, linearizing transform of p or None, parameter names)
MODELS: dict[str, tuple[Predict, Callable[[np.ndarray], np.ndarray] | None, tuple[str, ...]]] = {
    "constant": (_constant, None, ("c",)),
    "log-linear": (_log_linear, None, ("a", "b")),
    "power": (_power, lambda p: np.log(np.clip(p, _EPS, None)), ("c", "alpha")),
    "generalized-saturation": (_saturation, lambda p: np.log(-np.log1p(-np.clip(p, _EPS, 1 - _EPS))),
                               ("c", "alpha")),
}


@dataclass(frozen=True)
class Fit:
    """One model fitted to (K, p) points: reported parameters (in K's own units) and training RMSE."""

    model: str
    params: dict[str, float]
    rmse: float
    theta: np.ndarray
    k0: float

    def predict(self, k: np.ndarray) -> np.ndarray:
        return MODELS[self.model][0](self.theta, np.log(np.asarray(k, dtype=float) / self.k0))


def _linear(u: np.ndarray, y: np.ndarray) -> np.ndarray:
    design = np.stack([np.ones_like(u), u], axis=1)
    return np.linalg.lstsq(design, y, rcond=None)[0]


# MINPACK's tolerances near machine precision: the seed jackknife differences refits that agree to
# about 1e-3, and at MINPACK's default 1e-8 its SE moved by up to 1e-4 (relative) with the stopping point.
_TOLERANCE = 1e-14
_MAX_EVALUATIONS = 10_000


def _least_squares(model: str, f: Predict, theta: np.ndarray, u: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Levenberg-Marquardt (forward-difference Jacobian) from ``theta``; a fit that ran out of
    evaluations without meeting a tolerance is refused rather than reported."""
    result = optimize.least_squares(lambda t: f(t, u) - p, theta, method="lm", xtol=_TOLERANCE,
                                    ftol=_TOLERANCE, gtol=_TOLERANCE, max_nfev=_MAX_EVALUATIONS)
    if result.status < 1:
        raise InputError(f"ksweep fit: {model} did not converge on {p.size} points ({result.message})")
    return np.asarray(result.x, dtype=float)


def fit(model: str, k: Sequence[float], p: Sequence[float], k0: float | None = None) -> Fit:
    """Least-squares fit of ``model`` to prevalence ``p`` at depths ``k`` (one point per K x seed)."""
    if model not in MODELS:
        raise InputError(f"ksweep fit: unknown model {model!r} (expected one of {sorted(MODELS)})")
    kk, pp = np.asarray(k, dtype=float), np.asarray(p, dtype=float)
    if kk.shape != pp.shape or kk.size < 2 or np.any(kk <= 0) or not np.all(np.isfinite(pp)):
        raise InputError(f"ksweep fit: need at least two finite points with K > 0 (got {kk.size})")
    k0 = float(np.exp(np.mean(np.log(np.unique(kk))))) if k0 is None else k0
    u = np.log(kk / k0)
    f, transform, names = MODELS[model]
    if model == "constant":
        theta = np.array([pp.mean()])
    elif transform is None:
        theta = _linear(u, pp)
    else:
        theta = _least_squares(model, f, _linear(u, transform(pp)), u, pp)
    params = dict(zip(names, (float(v) for v in theta)))
    if model in ("power", "generalized-saturation"):
        params["c"] = math.exp(theta[0] - theta[1] * math.log(k0))  # c for K in its own units
    if model == "log-linear":
        params["a"] = float(theta[0] - theta[1] * math.log(k0))  # a for ln K, not ln(K / K0)
    rmse = float(np.sqrt(np.mean((f(theta, u) - pp) ** 2)))
    return Fit(model, params, rmse, theta, k0)


def held_out_rmse(model: str, k: Sequence[float], p: Sequence[float]) -> float:
    """Leave-one-K-out: fit without every point of one K, predict them; RMSE over all held-out points."""
    kk, pp = np.asarray(k, dtype=float), np.asarray(p, dtype=float)
    k0 = float(np.exp(np.mean(np.log(np.unique(kk)))))
    errors = []
    for held in np.unique(kk):
        train = kk != held
        if len(np.unique(kk[train])) < len(MODELS[model][2]):
            raise InputError(f"ksweep fit: leave-one-K-out leaves too few K values for {model}")
        errors.append(fit(model, kk[train], pp[train], k0).predict(kk[~train]) - pp[~train])
    return float(np.sqrt(np.mean(np.concatenate(errors) ** 2)))


def select_lowest(held_out: dict[str, float]) -> str:
    """The primary rule: the lowest held-out error; an exact tie goes to fewer parameters, then the name."""
    if not held_out:
        raise InputError("ksweep fit: no model to select from")
    return min(held_out, key=lambda m: (held_out[m], len(MODELS[m][2]), m))


def select_parsimonious(held_out: dict[str, float], parsimony: float) -> str:
    """The sensitivity: fewest parameters among models within ``parsimony`` (relative) of the lowest error."""
    if not held_out:
        raise InputError("ksweep fit: no model to select from")
    best = min(held_out.values())
    near = [m for m, e in held_out.items() if e <= best * (1 + parsimony) + _EPS]
    return min(near, key=lambda m: (len(MODELS[m][2]), held_out[m], m))


def jackknife(estimates: Sequence[float], full: float, level: float) -> tuple[float, float, float]:
    """(SE, lower, upper): leave-one-out standard error and full +- t(R-1) * SE."""
    e = np.asarray(estimates, dtype=float)
    r = e.size
    if r < 2:
        raise InputError(f"jackknife: need at least two leave-one-out estimates, got {r}")
    if not 0 < level < 1:
        raise InputError(f"jackknife: the interval's level must lie in (0, 1), got {level}")
    se = float(np.sqrt((r - 1) / r * np.sum((e - e.mean()) ** 2)))
    half = float(stats.t.ppf(0.5 + level / 2, r - 1)) * se
    return se, full - half, full + half


@dataclass(frozen=True)
class RateTest:
    """Pearson chi-square test of one differing-rate across groups (None statistic: not applicable)."""

    statistic: float | None
    df: int
    p_value: float | None
    differing: int
    elements: int


def constant_rate_test(differing: Sequence[int], elements: Sequence[int]) -> RateTest:
    """Pearson chi-square on the 2 x G table (differing, equal) per group; df = G - 1.

    Not applicable (statistic None) when no element or every element differs: the pooled rate is
    then 0 or 1, every expected count of one row is zero, and the statistic is undefined.
    """
    d = np.asarray(differing, dtype=float)
    n = np.asarray(elements, dtype=float)
    if d.shape != n.shape or d.size < 2 or np.any(n <= 0) or np.any(d < 0) or np.any(d > n):
        raise InputError("constant-rate test: need >= 2 groups with 0 <= differing <= elements and elements > 0")
    total_d, total_n = float(d.sum()), float(n.sum())
    df = d.size - 1
    if total_d == 0 or total_d == total_n:
        return RateTest(None, df, None, int(total_d), int(total_n))
    result = stats.chi2_contingency(np.stack([d, n - d]), correction=False)
    return RateTest(float(result.statistic), int(result.dof), float(result.pvalue), int(total_d), int(total_n))

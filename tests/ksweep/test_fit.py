"""Model fitting, selection, the jackknife interval and the constant-rate test on synthetic counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from int8alibi.errors import InputError
from int8alibi.ksweep import fit as F

GRID = np.array([512, 1024, 2048, 4096, 8192, 16384, 32768], dtype=float)
ELEMENTS = 524_288
SEEDS = 5


def _points(rate: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Binomial prevalence per K x seed for per-K true rates."""
    rng = np.random.default_rng(seed)
    k = np.repeat(GRID, SEEDS)
    seeds = np.tile(np.arange(SEEDS), len(GRID))
    p = rng.binomial(ELEMENTS, np.repeat(rate, SEEDS)) / ELEMENTS
    return k, p, seeds


def _held(k: np.ndarray, p: np.ndarray) -> dict[str, float]:
    return {m: F.held_out_rmse(m, k, p) for m in F.MODELS}


@pytest.mark.parametrize("seed", range(5))
def test_a_constant_rate_series_under_both_rules(seed: int) -> None:
    """The parsimony sensitivity never calls a constant series saturating; the primary rule takes
    whichever model has the lowest held-out error, even a flexible one fitting noise."""
    k, p, _ = _points(np.full(len(GRID), 5e-6), seed)
    held = _held(k, p)
    assert F.select_parsimonious(held, 0.10) == "constant"
    assert held[F.select_lowest(held)] == min(held.values())


@pytest.mark.parametrize("alpha", [0.3, 0.518, 0.8])
def test_a_saturating_series_recovers_its_exponent(alpha: float) -> None:
    c = 0.08 / 512**alpha  # 8% at K=512, like the paper's first point
    k, p, seeds = _points(-np.expm1(-c * GRID**alpha), 1)
    held = _held(k, p)
    assert F.select_lowest(held) == F.select_parsimonious(held, 0.10) == "generalized-saturation"
    result = F.fit("generalized-saturation", k, p)
    assert result.params["alpha"] == pytest.approx(alpha, abs=0.01)
    assert result.params["c"] == pytest.approx(c, rel=0.1)
    loo = [F.fit("generalized-saturation", k[seeds != s], p[seeds != s]).params["alpha"] for s in range(SEEDS)]
    se, lower, upper = F.jackknife(loo, result.params["alpha"], 0.95)
    assert se > 0 and lower < alpha < upper


def test_noise_free_curves_are_fitted_exactly_by_their_own_model() -> None:
    k = GRID
    cases = {"constant": np.full(len(k), 0.2), "log-linear": 0.01 + 0.05 * np.log(k),
             "power": 0.002 * k**0.4, "generalized-saturation": -np.expm1(-0.004 * k**0.55)}
    for model, p in cases.items():
        result = F.fit(model, k, p)
        assert result.rmse < 1e-9, model
        assert np.allclose(result.predict(k), p, atol=1e-9), model


def test_reported_parameters_are_in_k_units() -> None:
    p = 0.01 + 0.05 * np.log(GRID)
    assert F.fit("log-linear", GRID, p).params == pytest.approx({"a": 0.01, "b": 0.05})
    assert F.fit("power", GRID, 0.002 * GRID**0.4).params == pytest.approx({"c": 0.002, "alpha": 0.4})


def test_the_rules_disagree_when_a_simpler_model_is_within_the_margin() -> None:
    held = {"constant": 1.05, "power": 1.0, "generalized-saturation": 0.99}
    assert F.select_lowest(held) == "generalized-saturation"  # 0.99 is the lowest
    assert F.select_parsimonious(held, 0.10) == "constant"    # 1.05 <= 0.99 * 1.10, one parameter


def test_the_rules_agree_when_no_simpler_model_is_within_the_margin() -> None:
    held = {"constant": 1.2, "power": 1.0, "generalized-saturation": 0.99}
    assert F.select_lowest(held) == F.select_parsimonious(held, 0.10) == "generalized-saturation"


def test_selection_boundaries() -> None:
    """An exact tie goes to fewer parameters, then the name; the margin's edge is inside it."""
    assert F.select_lowest({"power": 1.0, "constant": 1.0}) == "constant"
    assert F.select_lowest({"power": 1.0, "generalized-saturation": 1.0}) == "generalized-saturation"
    at_edge = {"constant": 1.0 * (1 + 0.10), "power": 1.0}
    assert F.select_parsimonious(at_edge, 0.10) == "constant"
    assert F.select_parsimonious({**at_edge, "constant": at_edge["constant"] + 1e-9}, 0.10) == "power"
    assert F.select_parsimonious(at_edge, 0.0) == F.select_lowest(at_edge) == "power"
    for rule in (F.select_lowest, lambda h: F.select_parsimonious(h, 0.1)):
        with pytest.raises(InputError, match="no model"):
            rule({})


def test_held_out_error_is_computed_on_left_out_k_only() -> None:
    """A series with one off point: the constant's held-out error exceeds its training error."""
    p = np.full(len(GRID), 0.1)
    p[3] = 0.5
    assert F.held_out_rmse("constant", GRID, p) > F.fit("constant", GRID, p).rmse


def test_jackknife_interval_is_full_plus_minus_students_t_times_se() -> None:
    """Two estimates 1 and 2: SE 0.5 on 1 df, so the 95% half-width is 0.5 * t(0.975, 1) = 0.5 * 12.7062
    (the table value); at 5 estimates, 4 df, t(0.975, 4) = 2.7764."""
    se, lower, upper = F.jackknife([1.0, 2.0], 10.0, 0.95)
    assert se == pytest.approx(0.5)
    assert (lower, upper) == pytest.approx((10.0 - 0.5 * 12.7062, 10.0 + 0.5 * 12.7062), abs=1e-4)
    five = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    se, lower, upper = F.jackknife(five, 2.0, 0.95)
    assert se == pytest.approx(math.sqrt(4 / 5 * 10))
    assert upper - 2.0 == pytest.approx(se * 2.7764, rel=1e-4)
    for level in (0.0, 1.0, 1.5):
        with pytest.raises(InputError, match="level"):
            F.jackknife(five, 2.0, level)


def test_a_fit_that_does_not_converge_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(F, "_MAX_EVALUATIONS", 1)
    with pytest.raises(InputError, match="generalized-saturation did not converge"):
        F.fit("generalized-saturation", GRID, 0.01 + 0.05 * np.log(GRID))  # not its own curve: steps needed


def test_chi_square_against_a_hand_computed_table() -> None:
    """Two groups, 10/100 and 30/100: pooled 0.2, statistic 12.5 on 1 df, p = erfc(sqrt(6.25))."""
    test = F.constant_rate_test([10, 30], [100, 100])
    assert test.statistic == pytest.approx(12.5)
    assert test.df == 1
    assert test.p_value == pytest.approx(math.erfc(math.sqrt(12.5 / 2)), rel=1e-9)
    equal = F.constant_rate_test([7, 7, 7], [1000, 1000, 1000])
    assert equal.statistic == 0.0 and equal.p_value == pytest.approx(1.0)


def test_chi_square_is_not_applicable_at_a_pooled_rate_of_zero_or_one() -> None:
    for d in ([0, 0, 0], [5, 5, 5]):
        test = F.constant_rate_test(d, [5, 5, 5])
        assert test.statistic is None and test.p_value is None and test.df == 2


def test_chi_square_rejects_a_rising_rate_and_not_a_constant_one() -> None:
    k, p, _ = _points(np.full(len(GRID), 5e-6), 3)
    counts = np.round(p * ELEMENTS).astype(int).reshape(len(GRID), SEEDS).sum(axis=1)
    assert F.constant_rate_test(counts, [ELEMENTS * SEEDS] * len(GRID)).p_value > 0.01
    rising = np.array([10, 20, 40, 80, 160, 320, 640])
    assert F.constant_rate_test(rising, [ELEMENTS] * len(GRID)).p_value < 1e-12


@pytest.mark.parametrize(("d", "n"), [([1], [10]), ([1, 2], [10]), ([11, 1], [10, 10]), ([-1, 1], [10, 10]),
                                      ([1, 1], [0, 10])])
def test_chi_square_refuses_malformed_counts(d: list[int], n: list[int]) -> None:
    with pytest.raises(InputError, match="constant-rate test"):
        F.constant_rate_test(d, n)


def test_fit_refuses_bad_input() -> None:
    with pytest.raises(InputError, match="unknown model"):
        F.fit("cubic", GRID, GRID)
    with pytest.raises(InputError, match="at least two finite points"):
        F.fit("power", [512.0], [0.1])
    with pytest.raises(InputError, match="at least two finite points"):
        F.fit("power", GRID, np.full(len(GRID), np.nan))

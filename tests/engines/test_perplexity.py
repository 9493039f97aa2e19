"""Perplexity summary: intervals, the decomposition, H1 and the gate, on NLLs with known answers.
(The stage end to end on the tiny synthetic model: tests/stages/test_perplexity.py.)"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from int8alibi.errors import ProtocolError
from int8alibi.protocol import load
from int8alibi.engines.perplexity import MODELS, _gate, analyse

ROOT = Path(__file__).resolve().parents[2]
ANALYSIS = load(ROOT / "preregistration").analysis
(G1,) = [g for g in ANALYSIS["gates"] if g["id"] == "G1"]
WINDOWS = 12


def offsets(**per_token: float) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """NLLs whose per-token mean exceeds own's by a constant in every window (windows differ)."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(20, 40, size=WINDOWS)
    own = tokens * rng.uniform(1.5, 3.0, size=WINDOWS)
    return {arm: own + per_token.get(arm, 0.0) * tokens for arm in MODELS}, tokens


def by_quantity(frame: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["quantity"], r["arm"]): r for r in frame.to_dict("records")}


def test_constant_offsets_give_known_values_and_degenerate_paired_intervals() -> None:
    nll, tokens = offsets(parent=-0.01, **{"pow2-nearest": 0.10, "pow2-ceiling": 0.02, "probe": 0.30})
    rows = by_quantity(analyse(nll, tokens, ANALYSIS))
    own = math.exp(sum(nll["own"]) / sum(tokens))
    assert rows[("perplexity", "own")]["value"] == pytest.approx(own, rel=1e-13)
    for arm, d in (("parent", -0.01), ("pow2-nearest", 0.10), ("pow2-ceiling", 0.02), ("probe", 0.30)):
        r = rows[("relative_change_vs_own", arm)]
        assert r["value"] == pytest.approx(math.exp(d) - 1, abs=1e-12)
        assert r["low"] == pytest.approx(r["value"], abs=1e-12) and r["high"] == pytest.approx(r["value"], abs=1e-12)
        assert r["level"] == ANALYSIS["bootstrap"]["level"]
    share = rows[("mismatch_share", "probe")]
    expected = (math.exp(0.30) - math.exp(0.10)) / (math.exp(0.30) - 1)
    assert share["value"] == pytest.approx(expected, rel=1e-11)
    assert share["low"] == pytest.approx(expected, rel=1e-9) and share["high"] == pytest.approx(expected, rel=1e-9)
    assert rows[("constraint_share", "probe")]["value"] == pytest.approx(1 - expected, rel=1e-10)
    h1 = rows[("hypothesis:H1", "pow2-ceiling")]
    assert h1["value"] == pytest.approx(math.exp(0.02) - math.exp(0.10), rel=1e-11)
    assert h1["verdict"] == "supported"
    g1 = rows[("gate:G1", "pow2-ceiling")]
    assert g1["value"] == pytest.approx(math.exp(0.02) - 1, rel=1e-11) and g1["verdict"] == "gate not triggered"
    assert ("relative_change_vs_own", "own") not in rows


def test_a_costly_ceiling_arm_contradicts_h1_and_triggers_the_gate_honestly() -> None:
    nll, tokens = offsets(**{"pow2-nearest": 0.04, "pow2-ceiling": 0.08, "probe": 0.30})
    rows = by_quantity(analyse(nll, tokens, ANALYSIS))
    assert rows[("hypothesis:H1", "pow2-ceiling")]["verdict"].startswith("not supported")
    assert rows[("gate:G1", "pow2-ceiling")]["verdict"] == "triggered: search arm not in this study's build"


def test_noisy_windows_widen_the_interval_around_the_estimate() -> None:
    nll, tokens = offsets(**{"pow2-nearest": 0.10, "pow2-ceiling": 0.02, "probe": 0.30})
    nll["pow2-ceiling"] = nll["pow2-ceiling"] + np.random.default_rng(9).normal(0, 0.5, size=WINDOWS) * tokens
    r = by_quantity(analyse(nll, tokens, ANALYSIS))[("relative_change_vs_own", "pow2-ceiling")]
    assert r["low"] < r["value"] < r["high"] and r["high"] - r["low"] > 0.05


def test_a_probe_without_excess_has_no_decomposition() -> None:
    nll, tokens = offsets(**{"pow2-nearest": 0.10, "pow2-ceiling": 0.02})
    r = by_quantity(analyse(nll, tokens, ANALYSIS))[("mismatch_share", "probe")]
    assert r["value"] is None or np.isnan(r["value"])
    assert r["detail"].startswith("not applicable")


# H1 and G1 on constructed windows whose verdict follows by hand. The rules as pinned:
# H1 supported iff the paired percentile interval (level 0.90: the 5% and 95% quantiles of 2000
# resamples) of change(pow2-ceiling) - change(pow2-nearest) = (ppl_ceiling - ppl_nearest) / ppl_own lies
# entirely below zero; G1 triggered iff the point estimate ppl_ceiling / ppl_own - 1 > its threshold (read
# from analysis.yaml: the G1 tests hold for any positive one, so amending it breaks none). Within a
# resample every arm sums the same windows' tokens, so the sign of ppl_ceiling - ppl_nearest is the sign
# of the resample's summed NLL difference: a window-by-window sign argument decides every resample.

def test_the_pinned_h1_and_g1_are_the_rules_derived_by_hand_below() -> None:
    (h1,) = [h for h in ANALYSIS["hypotheses"] if h["id"] == "H1"]
    assert h1["arms"] == ["pow2-ceiling", "pow2-nearest"] and h1["reference"] == "own"
    assert "entirely below zero" in " ".join(h1["supported_when"].split())
    assert (G1["arm"], G1["reference"], G1["comparison"]) == ("pow2-ceiling", "own", "greater")
    assert isinstance(G1["threshold"], (int, float)) and G1["threshold"] > 0
    assert (ANALYSIS["bootstrap"]["level"], ANALYSIS["bootstrap"]["resamples"]) == (0.90, 2000)


def equal_windows(ceiling_minus_nearest: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """12 windows of 30 tokens with varied NLLs; pow2-ceiling = pow2-nearest + the given per-window
    NLL differences (exactly pow2-nearest's values where a difference is 0)."""
    tokens = np.full(WINDOWS, 30)
    rng = np.random.default_rng(5)
    own = tokens * rng.uniform(1.5, 3.0, size=WINDOWS)
    nearest = own + 0.01 * tokens + rng.uniform(-0.5, 0.5, size=WINDOWS)
    return {"parent": own - 0.01 * tokens, "own": own, "pow2-nearest": nearest,
            "pow2-ceiling": nearest + ceiling_minus_nearest, "probe": own + 0.30 * tokens}, tokens


def test_h1_supported_when_ceiling_beats_nearest_in_every_window() -> None:
    """Every window's difference is negative, so every resample's is: both quantiles lie below zero."""
    gaps = -np.random.default_rng(6).uniform(0.1, 2.0, size=WINDOWS)
    rows = by_quantity(analyse(*equal_windows(gaps), ANALYSIS))
    h1 = rows[("hypothesis:H1", "pow2-ceiling")]
    assert h1["verdict"] == "supported"
    assert h1["low"] < h1["high"] < 0 and h1["value"] < 0   # a real interval, not a degenerate one


def test_h1_not_supported_when_one_window_can_outweigh_the_rest() -> None:
    """Ceiling beats nearest by g in 11 windows and loses by 8g in one. A resample holding that window
    c times sums (9c - 12)g: negative for c = 0, 1 (the full sample has c = 1: the point estimate
    favours H1), positive for c >= 2. P(c >= 2) = 1 - (11/12)^11 * 23/12 = 0.264 > 0.05, so the 95%
    quantile is positive (about 528 of 2000 resamples, against the 100 the quantile needs) and H1 is
    not supported; P(c <= 1) = 0.736 puts the 5% quantile below zero."""
    g = 0.3
    gaps = np.full(WINDOWS, -g)
    gaps[7] = 8 * g
    rows = by_quantity(analyse(*equal_windows(gaps), ANALYSIS))
    h1 = rows[("hypothesis:H1", "pow2-ceiling")]
    assert h1["value"] < 0
    assert h1["low"] < 0 < h1["high"]
    assert h1["verdict"].startswith("not supported: the 90% interval [")


def test_h1_boundary_an_interval_reaching_zero_is_not_entirely_below_it() -> None:
    """Ceiling equals nearest bit for bit except in one window, where it is better. A resample without
    that window (probability (11/12)^12 = 0.352, about 704 of 2000) gives exactly 0, and those are the
    largest values, so the 95% quantile is exactly 0: not below zero, H1 not supported, although the
    point estimate and every other resample favour it. With no difference at all the interval is [0, 0]."""
    gaps = np.zeros(WINDOWS)
    gaps[5] = -0.5
    h1 = by_quantity(analyse(*equal_windows(gaps), ANALYSIS))[("hypothesis:H1", "pow2-ceiling")]
    assert h1["value"] < 0 and h1["low"] < 0
    assert h1["high"] == 0.0
    assert h1["verdict"].startswith("not supported")
    same = by_quantity(analyse(*equal_windows(np.zeros(WINDOWS)), ANALYSIS))[("hypothesis:H1", "pow2-ceiling")]
    assert (same["value"], same["low"], same["high"]) == (0.0, 0.0, 0.0)
    assert same["verdict"].startswith("not supported")


@pytest.mark.parametrize("excess,verdict", [
    (1e-9, "triggered: search arm not in this study's build"),
    (-1e-9, "gate not triggered"),
    (-0.04, "gate not triggered"),
    (0.30, "triggered: search arm not in this study's build"),
])
def test_g1_on_either_side_of_its_threshold(excess: float, verdict: str) -> None:
    """pow2-ceiling's NLL is own's plus log(1 + threshold + excess) per token in every window, so
    ppl_ceiling / ppl_own - 1 = threshold + excess up to float rounding (~1e-15), far inside the 1e-9
    margin."""
    nll, tokens = equal_windows(np.zeros(WINDOWS))
    nll["pow2-ceiling"] = nll["own"] + np.log1p(G1["threshold"] + excess) * tokens
    g1 = by_quantity(analyse(nll, tokens, ANALYSIS))[("gate:G1", "pow2-ceiling")]
    assert g1["value"] == pytest.approx(G1["threshold"] + excess, abs=1e-13)
    assert g1["verdict"] == verdict


def test_gate_threshold_is_strict_at_the_boundary() -> None:
    gate = {"id": "G9", "arm": "pow2-ceiling", "metric": "relative_perplexity_change", "reference": "own",
            "threshold": 0.5, "comparison": "greater"}
    assert _gate(gate, {"own": 2.0, "pow2-ceiling": 3.0})["verdict"] == "gate not triggered"
    above = np.nextafter(3.0, 4.0)
    assert _gate(gate, {"own": 2.0, "pow2-ceiling": above})["verdict"].startswith("triggered")
    with pytest.raises(ProtocolError, match="comparison 'between'"):
        _gate({**gate, "comparison": "between"}, {"own": 2.0, "pow2-ceiling": 3.0})
    with pytest.raises(ProtocolError, match="metric 'accuracy'"):
        _gate({**gate, "metric": "accuracy"}, {"own": 2.0, "pow2-ceiling": 3.0})


# End to end on the tiny synthetic model: real model + requant stages, then the perplexity stage twice.

"""Check 7: silent on identical arms, the budget and the confident-flip rule at their boundaries,
not applicable without logits, and the pinned rule as tokens.yaml states it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from int8alibi.errors import InputError, ProtocolError
from int8alibi.protocol import load
from int8alibi.tokens.check7 import Check7Rule, evaluate, not_applicable
from int8alibi.tokens.replay import compare

ROOT = Path(__file__).resolve().parents[2]
RULE = Check7Rule(margin_threshold=1.0, flip_budget=0.05, confident_flips_allowed=0)


def test_an_identical_arm_pair_gives_zero_flips_and_a_silent_check() -> None:
    logits = (torch.randn(64, 300, generator=torch.Generator().manual_seed(1)) * 4).to(torch.bfloat16)
    p = compare(logits, logits.clone())
    assert not p.flip.any() and not p.differ.any()
    result = evaluate(p.margin, p.flip, RULE)
    assert (result.applicable, result.fired, result.flips, result.fraction) == (True, False, 0, 0.0)


def test_the_flip_budget_is_a_strict_bound() -> None:
    margin = np.full(100, 0.25)  # every position a near-tie
    at_budget = np.arange(100) < 5
    assert evaluate(margin, at_budget, RULE).fired is False      # 5/100 is not above 0.05
    over = np.arange(100) < 6
    result = evaluate(margin, over, RULE)
    assert result.fired is True and result.flips == 6 and result.confident_flips == 0
    assert "above the budget" in result.reason


def test_one_confident_flip_fires_and_the_threshold_is_inclusive() -> None:
    flip = np.zeros(1000, dtype=bool)
    flip[0] = True
    below = np.full(1000, 5.0)
    below[0] = np.nextafter(1.0, 0.0)
    assert evaluate(below, flip, RULE).fired is False
    at = below.copy()
    at[0] = 1.0
    result = evaluate(at, flip, RULE)
    assert result.fired is True and result.confident_flips == 1 and result.fraction == 0.001
    lenient = Check7Rule(margin_threshold=1.0, flip_budget=0.05, confident_flips_allowed=1)
    assert evaluate(at, flip, lenient).fired is False


def test_a_flip_without_a_finite_margin_is_never_confident() -> None:
    margin = np.array([np.nan, 3.0, 3.0, 3.0])
    flip = np.array([True, False, False, False])
    result = evaluate(margin, flip, Check7Rule(1.0, 0.5, 0))
    assert result.confident_flips == 0 and result.fired is False


def test_without_logits_the_check_is_not_applicable_never_passed() -> None:
    result = not_applicable("the faulted model failed closed")
    assert result.applicable is False and result.fired is None and result.fraction is None
    assert result.reason.startswith("not applicable")
    empty = evaluate(np.array([]), np.array([], dtype=bool), RULE)
    assert empty.applicable is False and empty.fired is None
    with pytest.raises(InputError, match="boolean flip flag"):
        evaluate(np.array([0.1]), np.array([1]), RULE)


def test_the_pinned_rule_and_its_validation() -> None:
    tokens = load(ROOT / "preregistration").tokens
    written = yaml.safe_load((ROOT / "preregistration" / "tokens.yaml").read_text(encoding="utf-8"))["check7"]
    assert Check7Rule.from_protocol(tokens) == Check7Rule(  # each number from its own key, as amended
        written["margin_threshold"], written["flip_budget"], written["confident_flips_allowed"])
    bad = {"check7": {**tokens["check7"], "flip_budget": 1.0}}
    with pytest.raises(ProtocolError, match="tokens.yaml: check7"):
        Check7Rule.from_protocol(bad)

"""Check 7 at model level: do two arms pick different tokens more than rounding-level differences can?

Two arms that may differ by one bf16 spacing per layer output can still resolve a near-tie in the
logits differently, so some top-1 flips are admissible; the protocol (tokens.yaml ``check7``)
bounds them in two ways. The check fires when

* the fraction of scored positions whose top-1 token differs exceeds ``flip_budget``, or
* more than ``confident_flips_allowed`` positions whose reference margin is at least
  ``margin_threshold`` (a confident reference) have a differing top-1 token.

A position whose reference margin is not a number (non-finite logits) is never confident. The
check needs both arms' logits at every position; without them it is not applicable, never passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError, ProtocolError

SOURCE = "preregistration/tokens.yaml"


@dataclass(frozen=True)
class Check7Rule:
    """The pinned numbers of check 7."""

    margin_threshold: float
    flip_budget: float
    confident_flips_allowed: int

    @classmethod
    def from_protocol(cls, tokens: Mapping[str, Any]) -> "Check7Rule":
        c = tokens["check7"]
        rule = cls(float(c["margin_threshold"]), float(c["flip_budget"]), int(c["confident_flips_allowed"]))
        if not rule.margin_threshold > 0 or not 0 <= rule.flip_budget < 1 or rule.confident_flips_allowed < 0:
            raise ProtocolError(f"{SOURCE}: check7 needs margin_threshold > 0, 0 <= flip_budget < 1 and "
                                f"confident_flips_allowed >= 0 (got {rule})")
        return rule


@dataclass(frozen=True)
class Check7Result:
    """Check 7 on one comparison: the counts it decided on, and its verdict (None: not applicable)."""

    positions: int
    flips: int
    confident_flips: int
    applicable: bool
    fired: bool | None
    reason: str

    @property
    def fraction(self) -> float | None:
        return self.flips / self.positions if self.positions else None


def evaluate(margin: np.ndarray, flip: np.ndarray, rule: Check7Rule) -> Check7Result:
    """Check 7 from the reference margin and the flip flag of every scored position."""
    m = np.asarray(margin, dtype=np.float64).reshape(-1)
    f = np.asarray(flip).reshape(-1)
    if f.dtype != np.bool_ or m.shape != f.shape:
        raise InputError(f"check 7: needs one boolean flip flag per margin (got {f.dtype} {f.shape} for {m.shape})")
    if m.size == 0:
        return not_applicable("no scored positions")
    flips = int(f.sum())
    confident = int((f & (m >= rule.margin_threshold)).sum())  # NaN >= t is False: never confident
    over_budget = flips > rule.flip_budget * m.size
    too_confident = confident > rule.confident_flips_allowed
    fired = over_budget or too_confident
    reasons = [f"{flips}/{m.size} positions flip ({'above' if over_budget else 'within'} the budget "
               f"{rule.flip_budget:g})",
               f"{confident} flip(s) at a reference margin >= {rule.margin_threshold:g} "
               f"({'more than' if too_confident else 'at most'} the {rule.confident_flips_allowed} allowed)"]
    return Check7Result(int(m.size), flips, confident, True, fired, "; ".join(reasons))


def not_applicable(why: str) -> Check7Result:
    """The result when the comparison has no logits to compare; the reason says why."""
    return Check7Result(0, 0, 0, False, None, f"not applicable: {why}")

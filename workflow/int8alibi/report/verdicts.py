"""The one rule that turns a paper's claim and this run's measured value into a verdict.

The rule is registered in preregistration/paper.yaml (`verdict_rule` and the header that explains
it) before it is applied; this module is its only implementation, so every table of the report
(claims, verdict box, findings) says the same thing for the same evidence. A verdict names what
was tested: a dependency the run does not meet (synthetic weights, emulated arms, another engine,
another model or GPU) gives "no verdict" with that reason, or qualifies a verdict that still
applies; a magnitude is judged against an interval, never by equality of rounded decimals.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
CONSTRUCTION = "holds by construction"
NO_VERDICT = "no verdict"
NOT_COMPUTED = "not computed here"
NOT_APPLICABLE = "not applicable"
PROTOCOL = "protocol"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, CONSTRUCTION, NO_VERDICT, NOT_COMPUTED, NOT_APPLICABLE, PROTOCOL)


@dataclass(frozen=True)
class Measured:
    """This run's value of a measure.

    ``text`` is shown; ``number`` is the value a magnitude is judged on; ``numbers`` the counts a
    counts claim is judged on (``"1,176 / 439 / 0"``); ``low``/``high`` a sampling interval of
    ``number`` (``level`` its coverage); ``exact`` says the value is a deterministic count or rate
    (no sampling), judged at the paper's stated precision; ``holds`` whether a yes/no claim holds;
    ``evidence`` names the cells or layers a yes/no outcome rests on; ``why`` (set only when the
    measure cannot be evaluated) starts with "not applicable:"."""

    text: str
    number: float | None = None
    holds: bool | None = None
    why: str = ""
    source: str = ""
    numbers: tuple[float, ...] = ()
    low: float | None = None
    high: float | None = None
    level: float | None = None
    exact: bool = False
    evidence: str = ""


@dataclass(frozen=True)
class RunFacts:
    """What the verdict rule needs to know about the run (built once by the report stage).

    ``model`` is the canonical id of the run's model when its weights are a real checkpoint
    (``qwen3-1.7b``; None otherwise), ``shape`` the preset its layer shapes follow (also for a
    synthetic parent), ``engines`` the engine that produced each stage's tokens (``vllm`` or
    ``own``), ``gpu`` the compute capability of the K sweep's device (``sm_90``; None: not run)."""

    model: str | None
    shape: str | None
    synthetic: bool
    emulated: bool | None
    engines: Mapping[str, str] = field(default_factory=dict)
    gpu: str | None = None


@dataclass(frozen=True)
class Verdict:
    kind: str  # one of VERDICTS
    text: str  # what the report shows

    def __str__(self) -> str:
        return self.text


# The stage whose engine a claim with `depends_on: [engine]` rests on, by its measure's prefix.
_ENGINE_STAGE = {"determinism": "determinism", "tokens": "tokens", "prefill_decode": "prefill_decode"}
PAPERS_ENGINE = "vllm"
PAPERS_GPU = "sm_89"  # the K sweep of 2608.13756 ran on one RTX 4090


def claim_stage(claim: Mapping[str, Any]) -> str:
    """The stage a claim's measure reads, for its engine (``determinism_own_none_identical`` -> determinism)."""
    measure = str(claim.get("measure", ""))
    for prefix, stage in _ENGINE_STAGE.items():
        if measure.startswith(prefix):
            return stage
    return "determinism"


def _unmet(claim: Mapping[str, Any], run: RunFacts, reasons: Mapping[str, str]) -> dict[str, str]:
    """Each dependency of the claim this run does not meet -> the registered reason, as shown."""
    deps = list(claim.get("depends_on", ()))
    models = list(claim.get("models", ()))
    out: dict[str, str] = {}
    if "language" in deps and run.synthetic:
        out["language"] = reasons["language"]
    if "kernels" in deps and run.emulated:
        out["kernels"] = reasons["kernels"]
    engine = run.engines.get(claim_stage(claim), "own")
    if "engine" in deps and engine != PAPERS_ENGINE:
        out["engine"] = f"{reasons['engine']}: {_engine_name(engine)}"
    if "model" in deps:
        if not models:
            out["model"] = "model not stated (the paper names no single model for this value)"
        elif run.synthetic:
            out["language"] = reasons["language"]
        elif run.model not in models:
            out["model"] = reasons["model"]
    if "shape" in deps and run.shape not in models:
        out["shape"] = reasons["shape"]
    if "device" in deps and run.gpu is not None and run.gpu != PAPERS_GPU:
        out["device"] = f"{reasons['device']} ({run.gpu}; the paper's {PAPERS_GPU})"
    return out


def _engine_name(engine: str) -> str:
    return "vLLM's" if engine == PAPERS_ENGINE else "this project's own, not vLLM's"


def _counts(text: str) -> tuple[float, ...]:
    return tuple(float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", text))


def _half_unit(value: Any) -> float:
    """Half a unit of the last digit the paper states (75.0 -> 0.05; 392 -> 0.5)."""
    text = str(value).replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0 ** (-decimals)


def _magnitude(claim: Mapping[str, Any], got: Measured) -> Verdict:
    value, unit = claim["value"], claim["unit"]
    if unit == "counts" or (unit == "count" and got.numbers):
        counts = _counts(str(value))
        if not got.numbers or len(got.numbers) != len(counts):
            return Verdict(NO_VERDICT, "no verdict: the paper's counts have no like-for-like value here")
        if got.numbers == counts:
            return Verdict(REPRODUCED, REPRODUCED)
        return Verdict(NOT_REPRODUCED, f"{NOT_REPRODUCED}: {got.text} against the paper's {value}")
    if isinstance(value, str) and not re.fullmatch(r"[+\-−]?\d[\d,]*(\.\d+)?%?", value.strip()):
        return Verdict(NO_VERDICT, "no verdict: the paper gives a range or words, not one number (both shown)")
    if got.number is None:
        return Verdict(NO_VERDICT, "no verdict: this run's value is not a single number")
    paper = float(str(value).replace("−", "-").replace("%", "").replace(",", "").replace("+", ""))
    if got.low is not None and got.high is not None:
        inside = got.low <= paper <= got.high
        level = f"{100 * got.level:.0f}% " if got.level else ""
        if inside:
            return Verdict(REPRODUCED, f"{REPRODUCED} (the paper's value lies in this run's {level}interval)")
        return Verdict(NOT_REPRODUCED, f"{NOT_REPRODUCED}: the paper's {value} lies outside this run's {level}interval")
    if got.exact:
        if math.isclose(got.number, paper, abs_tol=_half_unit(value) + 1e-12):
            return Verdict(REPRODUCED, f"{REPRODUCED} (within the paper's stated precision)")
        return Verdict(NOT_REPRODUCED, f"{NOT_REPRODUCED}: {got.text} against the paper's {value}")
    return Verdict(NO_VERDICT, "no verdict: this run gives no interval for this estimate")


def decide(claim: Mapping[str, Any], got: Measured, run: RunFacts, rule: Mapping[str, Any]) -> Verdict:
    """The verdict for one claim (``rule`` is paper.yaml's ``verdict_rule``)."""
    kind = claim["kind"]
    if kind == "not_computed":
        return Verdict(NOT_COMPUTED, f"{NOT_COMPUTED}: {' '.join(str(claim['why']).split())}")
    if got.why:
        return Verdict(NOT_APPLICABLE, got.why)
    if kind == "protocol":
        return Verdict(PROTOCOL, "protocol: as the paper states" if got.holds else "protocol: differs from the paper")
    unmet = _unmet(claim, run, rule["no_verdict_reasons"])
    # no language, no verdict on anything that rests on it; a magnitude needs every dependency met,
    # a direction all but the engine, which qualifies it (as it qualifies the other kinds)
    blocking = [r for d, r in unmet.items()
                if d == "language" or kind == "magnitude" or (kind == "direction" and d != "engine")]
    if blocking:
        return Verdict(NO_VERDICT, f"{NO_VERDICT}: {'; '.join(blocking)}")
    if kind == "magnitude":
        return _magnitude(claim, got)
    if got.holds is None:
        return Verdict(NO_VERDICT, "no verdict: this run's value does not decide the claim")
    evidence = f": {got.evidence}" if got.evidence and not got.holds else ""
    if kind == "construction":
        return (Verdict(CONSTRUCTION, f"{CONSTRUCTION}: {' '.join(str(claim['construction']).split())}") if got.holds
                else Verdict(NOT_REPRODUCED, f"{NOT_REPRODUCED}: this run breaks a bound that holds by construction"))
    reasons = rule["no_verdict_reasons"]
    qualifiers = [r for d, r in unmet.items() if d not in ("kernels", "language")]
    if "kernels" in unmet:  # a structural or empirical claim on emulated arms
        if got.holds and kind == "structural":
            return Verdict(CONSTRUCTION, f"{CONSTRUCTION} ({reasons['kernels']})" + _qualify(qualifiers))
        qualifiers.insert(0, reasons["kernels"])
    if kind == "empirical":
        on = " on this model" + (f" ({reasons['language']})" if run.synthetic else "")
        word = REPRODUCED if got.holds else NOT_REPRODUCED
        return Verdict(word, f"{word}{on}{_qualify(qualifiers)}{evidence}")
    word = REPRODUCED if got.holds else NOT_REPRODUCED
    return Verdict(word, f"{word}{_qualify(qualifiers)}{evidence}")


def _qualify(qualifiers: Sequence[str]) -> str:
    return f" ({'; '.join(qualifiers)})" if qualifiers else ""

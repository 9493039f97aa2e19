"""What the power-of-two scale arms cost in perplexity, and where the probe's cost comes from.

Every arm scores the same pinned corpus windows (teacher-forced NLL), so arms are compared with a
paired bootstrap over windows. The rewritten probe (pow2 scales with the old int8 weights) costs
more than pow2-nearest (the same scales with int8 weights recomputed for them); the share of the
probe's excess that the weight-scale mismatch explains is
``(ppl_probe - ppl_nearest) / (ppl_probe - ppl_own)``. The pre-registered hypothesis (H1) and the
gate for an extra scale-search arm (G1) are evaluated exactly as the protocol states them.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from ..config import Config
from ..engines.own import SharedParent, load_parent_engine, load_w8a8
from ..errors import ProtocolError
from ..inputs.corpus import CorpusText, encode, windows
from ..quant.variants import CHECKPOINT_VARIANTS
from ..analysis.bootstrap import Interval, paired_bootstrap, perplexity

log = logging.getLogger("int8alibi.perplexity")

REFERENCE = "own"
# The models scored: the bf16 parent and every checkpoint variant.
MODELS = ("parent", *CHECKPOINT_VARIANTS)
METRIC = "relative_perplexity_change"
SEARCH_ARM_BUILT = False  # no scale-search arm is built: a triggered gate G1 (analysis.yaml) is reported, not run

WINDOWS_SCHEMA = pa.schema([
    pa.field("arm", pa.string(), nullable=False),
    pa.field("window", pa.int32(), nullable=False),
    pa.field("tokens", pa.int32(), nullable=False),
    pa.field("nll_sum", pa.float64(), nullable=False),
    pa.field("nll_mean", pa.float64(), nullable=False),
])
SUMMARY_SCHEMA = pa.schema([
    pa.field("quantity", pa.string(), nullable=False),
    pa.field("arm", pa.string(), nullable=False),
    pa.field("value", pa.float64(), nullable=True),
    pa.field("low", pa.float64(), nullable=True),
    pa.field("high", pa.float64(), nullable=True),
    pa.field("level", pa.float64(), nullable=True),
    pa.field("verdict", pa.string(), nullable=True),
    pa.field("detail", pa.string(), nullable=False),
])

Statistic = Callable[[np.ndarray], np.ndarray]


def _row(quantity: str, arm: str, value: float | None, detail: str, *, interval: Interval | None = None,
         verdict: str | None = None) -> dict[str, Any]:
    return {"quantity": quantity, "arm": arm, "value": value, "detail": detail, "verdict": verdict,
            "low": interval.low if interval else None, "high": interval.high if interval else None,
            "level": interval.level if interval else None}


def _interval(sums: np.ndarray, tokens: np.ndarray, statistic: Statistic, boot: Mapping[str, Any]) -> Interval | None:
    """The paired interval, or None when the statistic is undefined on some resample (0/0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        iv = paired_bootstrap(sums, tokens, statistic, seed=int(boot["seed"]), resamples=int(boot["resamples"]),
                              level=float(boot["level"]))
    return iv if np.isfinite([iv.estimate, iv.low, iv.high]).all() else None


def _change(i: int, ref: int) -> Statistic:
    return lambda p: p[i] / p[ref] - 1.0


def analyse(nll: Mapping[str, np.ndarray], tokens: np.ndarray, analysis: Mapping[str, Any]) -> pd.DataFrame:
    """The summary rows: perplexities, changes vs own with intervals, decomposition, H1, G1."""
    boot = analysis["bootstrap"]
    if not boot.get("paired", False) or boot.get("unit") != "window" or boot.get("interval") != "percentile":
        raise ProtocolError("preregistration/analysis.yaml: bootstrap must be a paired percentile bootstrap over "
                            "windows; this stage implements no other")
    names = list(nll)
    sums = np.stack([nll[a] for a in names])
    idx = {a: i for i, a in enumerate(names)}
    ref = idx[REFERENCE]
    ppl = {a: perplexity(nll[a], tokens) for a in names}
    n_tok, n_win = int(tokens.sum()), len(tokens)
    rows = [_row("perplexity", a, ppl[a], f"exp(mean NLL over {n_tok} scored tokens in {n_win} windows)")
            for a in names]
    for a in names:
        if a != REFERENCE:
            iv = _interval(sums, tokens, _change(idx[a], ref), boot)
            rows.append(_row("relative_change_vs_own", a, ppl[a] / ppl[REFERENCE] - 1.0,
                             f"ppl({a}) / ppl(own) - 1; paired percentile bootstrap over windows", interval=iv))

    probe, nearest = idx["probe"], idx["pow2-nearest"]
    share: Statistic = lambda p: (p[probe] - p[nearest]) / (p[probe] - p[ref])  # noqa: E731
    excess = ppl["probe"] - ppl[REFERENCE]
    if excess == 0:
        rows.append(_row("mismatch_share", "probe", None, "not applicable: the probe costs nothing relative to own"))
    else:
        iv = _interval(sums, tokens, share, boot)
        rows.append(_row("mismatch_share", "probe", (ppl["probe"] - ppl["pow2-nearest"]) / excess,
                         "(ppl_probe - ppl_pow2-nearest) / (ppl_probe - ppl_own): share of the probe's excess "
                         "due to the weight-scale mismatch" + ("" if iv else "; interval undefined on some "
                                                                "resample (zero excess)"), interval=iv))
        rows.append(_row("constraint_share", "probe", (ppl["pow2-nearest"] - ppl[REFERENCE]) / excess,
                         "(ppl_pow2-nearest - ppl_own) / (ppl_probe - ppl_own): share due to the pow2 constraint"))
    rows += [_hypothesis(h, sums, tokens, idx, ppl, boot) for h in analysis["hypotheses"]]
    rows += [_gate(g, ppl) for g in analysis["gates"]]
    return pd.DataFrame(rows, columns=SUMMARY_SCHEMA.names)


def _require(rule: Mapping[str, Any], idx: Mapping[str, object], arms: list[str]) -> None:
    if rule["metric"] != METRIC or rule["reference"] != REFERENCE:
        raise ProtocolError(f"preregistration/analysis.yaml: {rule['id']} uses metric {rule['metric']!r} against "
                            f"{rule['reference']!r}; this stage evaluates only {METRIC} against {REFERENCE!r}")
    unknown = [a for a in arms if a not in idx]
    if unknown:
        raise ProtocolError(f"preregistration/analysis.yaml: {rule['id']} names arm {unknown[0]!r}, not one of {list(idx)}")


def _hypothesis(h: Mapping[str, Any], sums: np.ndarray, tokens: np.ndarray, idx: Mapping[str, int],
                ppl: Mapping[str, float], boot: Mapping[str, Any]) -> dict[str, Any]:
    """change(arms[0]) - change(arms[1]) with its paired interval; supported iff it lies below zero."""
    arms = list(h["arms"])
    _require(h, idx, arms)
    if len(arms) != 2 or "entirely below zero" not in " ".join(str(h["supported_when"]).split()):
        raise ProtocolError(f"preregistration/analysis.yaml: {h['id']}: only 'interval of change(arm 1) - "
                            f"change(arm 2) lies entirely below zero' is implemented")
    i, j, ref = idx[arms[0]], idx[arms[1]], idx[REFERENCE]
    iv = _interval(sums, tokens, lambda p: (p[i] - p[j]) / p[ref], boot)
    value = (ppl[arms[0]] - ppl[arms[1]]) / ppl[REFERENCE]
    if iv is None:
        verdict = "not evaluable: interval undefined"
    elif iv.high < 0:
        verdict = "supported"
    else:
        verdict = f"not supported: the {iv.level:.0%} interval [{iv.low:.6g}, {iv.high:.6g}] does not lie entirely below zero"
    return _row(f"hypothesis:{h['id']}", arms[0], value,
                f"change({arms[0]}) - change({arms[1]}) vs {REFERENCE}; {' '.join(h['statement'].split())}",
                interval=iv, verdict=verdict)


def _gate(g: Mapping[str, Any], ppl: Mapping[str, float]) -> dict[str, Any]:
    """The point estimate against the threshold; the extra arm is recorded as not built if triggered."""
    _require(g, ppl, [g["arm"]])
    value = ppl[g["arm"]] / ppl[REFERENCE] - 1.0
    threshold = float(g["threshold"])
    compare = {"greater": value > threshold, "less": value < threshold}
    if g["comparison"] not in compare:
        raise ProtocolError(f"preregistration/analysis.yaml: {g['id']}: comparison {g['comparison']!r} not implemented")
    triggered = compare[g["comparison"]]
    verdict = ("gate not triggered" if not triggered else
               "triggered: search arm built and run" if SEARCH_ARM_BUILT else
               "triggered: search arm not in this study's build")
    return _row(f"gate:{g['id']}", g["arm"], value,
                f"point estimate of change({g['arm']}) vs {REFERENCE} {g['comparison']} than {threshold:g}",
                verdict=verdict)


def score_models(cfg: Config, checkpoints: Mapping[str, Path], kernel: Any, device: torch.device,
                 corpus: CorpusText, profile: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], np.ndarray, torch.Tensor]:
    """(model -> per-window NLL sums, per-window scored tokens, the windows): every model of ``MODELS``
    scores the same pinned windows, each W8A8 checkpoint's linears on ``kernel`` (the parent loaded once)."""
    shared = SharedParent(cfg)  # loaded once, copied per arm
    engine = load_parent_engine(cfg, device, shared=shared)
    cut = windows(encode(engine.tokenizer, corpus.text), int(profile["window_tokens"]), int(profile["windows"]),
                  source=f"corpus {corpus.name}")
    nll: dict[str, np.ndarray] = {}
    tokens = np.zeros(0)
    for name in MODELS:
        if name != "parent":
            engine = load_w8a8(cfg, checkpoints[name], kernel, device, label=f"{name} on {kernel.name}",
                               shared=shared)
        sums, toks = engine.score(cut)
        nll[name], tokens = sums.numpy(), toks.numpy()
        log.info("perplexity: %s = %.6g", name, perplexity(nll[name], tokens))
        del engine
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return nll, tokens, cut


def windows_table(nll: Mapping[str, np.ndarray], tokens: np.ndarray) -> pd.DataFrame:
    """Per model and window: scored tokens, NLL sum and mean (``WINDOWS_SCHEMA``)."""
    return pd.concat([pd.DataFrame({"arm": name, "window": np.arange(len(tokens)), "tokens": tokens,
                                    "nll_sum": nll[name], "nll_mean": nll[name] / tokens}) for name in MODELS],
                     ignore_index=True)

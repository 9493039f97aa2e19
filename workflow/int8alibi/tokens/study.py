"""The token-level study of check 7: top-1 flips between arms, the margin as their predictor, and
check 7 under end-to-end fault injection (preregistration/tokens.yaml), with the five tables it writes.

For each regime (checkpoint), every replay window runs once as a batch of three copies: the
selected kernel pair (arm A, arm B, and arm A again as the batch's null control). On the first
injection windows every fault cell then runs in a batch of two copies of its own: the injection's
reference pipeline and the cell (F8's batch is their null control); F6 and F7 change both arms, so
their two copies both carry the fault. No batch grows with the catalogue, so the stage's device
memory is that of three copies of a window at any model size. Per position the replay
records both arms' top-1 tokens and the reference margin; the tables score check 7 per comparison
against the pinned predictions and evaluate the margin as a predictor of flips.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from ..analysis.scoring import outcome
from ..errors import InputError, ProtocolError
from ..faults.campaign import CampaignSettings
from ..inputs.corpus import CorpusText, encode, windows
from ..progress import Progress
from .check7 import Check7Result, Check7Rule, evaluate, not_applicable
from .inject import Cell, InjectionArm, cells
from .margin import (average_precision, calibrate, calibrate_isotonic, cluster_bootstrap_auc, cluster_bootstrap_rate,
                     leave_one_cluster_out)
from .replay import Positions, RowBlockArm, compare, copies_identical, replay_window

KERNELS = "kernels"   # the comparison label of the selected kernel pair

POSITIONS_SCHEMA = pa.schema([
    pa.field("comparison", pa.string(), nullable=False),
    pa.field("regime", pa.string(), nullable=False),
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("window", pa.int32(), nullable=False),
    pa.field("position", pa.int32(), nullable=False),
    pa.field("token", pa.int64(), nullable=False),
    pa.field("margin", pa.float64(), nullable=False),   # NaN where the reference logits are not finite
    pa.field("top1_a", pa.int64(), nullable=False),
    pa.field("top1_b", pa.int64(), nullable=False),
    pa.field("flip", pa.bool_(), nullable=False),
    pa.field("logits_differ", pa.bool_(), nullable=False),
    pa.field("changed", pa.bool_(), nullable=False),
])
POSITIONS_KEY = ["comparison", "regime", "window", "position"]

PAIRS_SCHEMA = pa.schema([
    pa.field("comparison", pa.string(), nullable=False),
    pa.field("regime", pa.string(), nullable=False),
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("arm_a", pa.string(), nullable=False),
    pa.field("arm_b", pa.string(), nullable=False),
    pa.field("windows", pa.int32(), nullable=False),
    pa.field("positions", pa.int64(), nullable=False),
    pa.field("differing_positions", pa.int64(), nullable=False),
    pa.field("flips", pa.int64(), nullable=False),
    pa.field("flip_rate", pa.float64(), nullable=False),
    pa.field("flip_rate_low", pa.float64(), nullable=True),
    pa.field("flip_rate_high", pa.float64(), nullable=True),
    pa.field("level", pa.float64(), nullable=False),
    pa.field("confident_flips", pa.int64(), nullable=False),
    pa.field("fired", pa.bool_(), nullable=True),
    pa.field("prediction", pa.string(), nullable=False),
    pa.field("predicted_observable", pa.bool_(), nullable=False),
    pa.field("score", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
])
PAIRS_KEY = ["comparison", "regime"]

PREDICTOR_SCHEMA = pa.schema([
    pa.field("comparison", pa.string(), nullable=False),
    pa.field("regime", pa.string(), nullable=False),
    pa.field("quantity", pa.string(), nullable=False),
    pa.field("bin", pa.int32(), nullable=False),          # 0 for whole-comparison quantities, 1.. for map bins
    pa.field("value", pa.float64(), nullable=True),
    pa.field("low", pa.float64(), nullable=True),
    pa.field("high", pa.float64(), nullable=True),
    pa.field("level", pa.float64(), nullable=True),
    pa.field("positions", pa.int64(), nullable=False),
    pa.field("flips", pa.int64(), nullable=False),
    pa.field("windows", pa.int32(), nullable=False),
    pa.field("margin_from", pa.float64(), nullable=True),
    pa.field("margin_to", pa.float64(), nullable=True),
    pa.field("detail", pa.string(), nullable=False),
])
PREDICTOR_KEY = ["comparison", "regime", "quantity", "bin"]

INFLUENCE_SCHEMA = pa.schema([
    pa.field("comparison", pa.string(), nullable=False),
    pa.field("regime", pa.string(), nullable=False),
    pa.field("window", pa.int32(), nullable=False),            # the window left out
    pa.field("positions", pa.int64(), nullable=False),         # its positions with a finite margin
    pa.field("flips", pa.int64(), nullable=False),
    pa.field("auc_without", pa.float64(), nullable=True),      # null: the rest has no flip or no non-flip
    pa.field("auc_change", pa.float64(), nullable=True),       # auc_without - the full-sample AUC
    pa.field("flip_rate_without", pa.float64(), nullable=True),
    pa.field("flip_rate_change", pa.float64(), nullable=True),
])
INFLUENCE_KEY = ["comparison", "regime", "window"]

CHECK7_SCHEMA = pa.schema([
    pa.field("fault", pa.string(), nullable=False),
    pa.field("severity", pa.string(), nullable=False),
    pa.field("regime", pa.string(), nullable=False),
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("windows", pa.int32(), nullable=False),
    pa.field("positions", pa.int64(), nullable=False),
    pa.field("changed_positions", pa.int64(), nullable=False),
    pa.field("observable", pa.bool_(), nullable=False),
    pa.field("flips", pa.int64(), nullable=False),
    pa.field("confident_flips", pa.int64(), nullable=False),
    pa.field("fraction", pa.float64(), nullable=True),
    pa.field("applicable", pa.bool_(), nullable=False),
    pa.field("fired", pa.bool_(), nullable=True),
    pa.field("prediction", pa.string(), nullable=False),
    pa.field("predicted_miss", pa.bool_(), nullable=False),
    pa.field("predicted_observable", pa.bool_(), nullable=False),
    pa.field("score", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
])
CHECK7_KEY = ["fault", "severity", "regime"]

# Each table the study writes, by name: its schema and sort key (the file is ``<name>.parquet``).
TABLES: dict[str, tuple[pa.Schema, list[str]]] = {
    "positions": (POSITIONS_SCHEMA, POSITIONS_KEY), "pairs": (PAIRS_SCHEMA, PAIRS_KEY),
    "predictor": (PREDICTOR_SCHEMA, PREDICTOR_KEY), "check7": (CHECK7_SCHEMA, CHECK7_KEY),
    "influence": (INFLUENCE_SCHEMA, INFLUENCE_KEY),
}


@dataclass(frozen=True)
class Sizes:
    """One size profile of tokens.yaml: replay windows x tokens, and how many of them inject."""

    windows: int
    tokens: int
    injection_windows: int


def sizes(tokens: Mapping[str, Any], profile: str) -> Sizes:
    profiles = tokens["size_profiles"]
    if profile not in profiles:
        raise ProtocolError(f"preregistration/tokens.yaml: no size profile {profile!r} (defined: {sorted(profiles)})")
    p = profiles[profile]
    return Sizes(int(p["replay_windows"]), int(p["replay_window_tokens"]), int(p["injection_windows"]))


@dataclass
class Outcome:
    """What one comparison produced over its windows: per-position rows, or why it could not run."""

    comparison: str
    regime: str
    frames: list[pd.DataFrame]
    failure: str | None = None


def _rows(label: str, regime: str, checkpoint: str, window: int, ids: torch.Tensor, p: Positions,
          changed: np.ndarray) -> pd.DataFrame:
    n = p.flip.size
    return pd.DataFrame({
        "comparison": label, "regime": regime, "checkpoint": checkpoint, "window": np.full(n, window, np.int32),
        "position": np.arange(n, dtype=np.int32), "token": ids.numpy().astype(np.int64), "margin": p.margin,
        "top1_a": p.top1_a.astype(np.int64), "top1_b": p.top1_b.astype(np.int64), "flip": p.flip,
        "logits_differ": p.differ, "changed": changed,
    })


class RegimeReplay:
    """Every comparison of one regime, window by window, on one loaded W8A8 model."""

    def __init__(self, model: torch.nn.Module, arms: tuple[Any, Any], regime: str, checkpoint: str,
                 settings: CampaignSettings, device: torch.device) -> None:
        self.model, self.arms, self.regime, self.checkpoint = model, arms, regime, checkpoint
        self.settings, self.device = settings, device
        every = cells(regime)
        self.main = [c for c in every if not c.both_arms]
        self.both = [c for c in every if c.both_arms]
        self.outcomes: dict[str, Outcome] = {KERNELS: Outcome(KERNELS, regime, [])}
        for c in every:
            self.outcomes[c.label] = Outcome(c.label, regime, [])

    def window(self, w: int, ids: torch.Tensor, inject: bool) -> None:
        """Replay window ``w`` under the kernel pair; with ``inject``, also every injection cell, each in a
        batch of two copies of its own (tokens.yaml injection.batches: the largest batch is the kernel
        pair's three copies, whatever the catalogue holds)."""
        arm_a, arm_b = self.arms
        logits = replay_window(self.model, ids, 3, lambda layer, window: RowBlockArm(
            [(arm_a, 1), (arm_b, 1), (arm_a, 1)], ids.numel(), layer), w, self.device)
        if not copies_identical(logits, 0, 2):
            raise InputError(f"window {w} ({self.regime}): arm A's two copies in one batch gave different logits, so "
                             "a copy's result depends on its place in the batch; the replay cannot compare arms")
        kernels = compare(logits[0], logits[1])
        self._add(KERNELS, w, ids, kernels, kernels.differ)
        if not inject:
            return
        del logits
        ref: torch.Tensor | None = None
        for cell in self.main:
            pair = self._injected(w, ids, [None, cell])
            if cell.fault == "F8" and not copies_identical(pair, 0, 1):
                raise InputError(f"window {w} ({self.regime}): the null cell F8 differs from the reference copy in its "
                                 "batch; the injection batches are not a valid comparison")
            p = compare(pair[0], pair[1])
            self._add(cell.label, w, ids, p, p.differ)
            ref = pair[0] if ref is None else ref  # the first batch's reference: what F6/F7's arm B is set against
        assert ref is not None, "the catalogue has cells that change only arm B"
        for cell in self.both:
            self._both_arms(cell, w, ids, ref)

    def _injected(self, w: int, ids: torch.Tensor, copies: Sequence[Cell | None]) -> torch.Tensor:
        """bf16 logits of one injection batch: one copy per entry of ``copies`` (None: the reference)."""
        rows = ids.numel()
        return replay_window(self.model, ids, len(copies), lambda layer, window: InjectionArm(
            copies, rows, layer, window, self.settings, self.device), w, self.device)

    def _both_arms(self, cell: Cell, w: int, ids: torch.Tensor, ref: torch.Tensor) -> None:
        """F6/F7: arm A and arm B both carry the fault; a forward that fails closed is recorded, not raised."""
        out = self.outcomes[cell.label]
        if out.failure is not None:
            return
        try:
            logits = self._injected(w, ids, [cell, cell])
        except InputError as exc:
            out.failure = f"window {w}: the faulted model failed closed: {exc}"
            out.frames.clear()
            return
        self._add(cell.label, w, ids, compare(logits[0], logits[1]), compare(ref, logits[1]).differ)

    def _add(self, label: str, w: int, ids: torch.Tensor, p: Positions, changed: np.ndarray) -> None:
        out = self.outcomes[label]
        if out.failure is None:
            out.frames.append(_rows(label, self.regime, self.checkpoint, w, ids.cpu(), p, changed))


def _check7(frame: pd.DataFrame | None, failure: str | None, rule: Check7Rule) -> Check7Result:
    if failure is not None:
        return not_applicable(failure)
    if frame is None or frame.empty:
        return not_applicable("no positions replayed")
    return evaluate(frame["margin"].to_numpy(), frame["flip"].to_numpy(dtype=bool), rule)


def _score(prediction: str, observable: bool, result: Check7Result) -> str:
    return outcome(prediction, observable, result.applicable, result.fired)


def _frame(out: Outcome) -> pd.DataFrame | None:
    return pd.concat(out.frames, ignore_index=True) if out.frames and out.failure is None else None


def predictions(tokens: Mapping[str, Any]) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """(fault, severity, regime) -> its pinned prediction entry (the loader checked that every
    injection cell has exactly one)."""
    return {(e["fault"], e["severity"], e["regime"]): e for e in tokens["predictions"]["injection"]}


def check7_table(outcomes: Mapping[tuple[str, str], Outcome], injected: Sequence[Cell],
                 table: Mapping[tuple[str, str, str], Mapping[str, Any]], rule: Check7Rule,
                 checkpoints: Mapping[str, str]) -> pd.DataFrame:
    """One row per injection cell: what changed, check 7's verdict, the prediction and the score."""
    rows = []
    for cell in injected:
        out = outcomes[(cell.label, cell.regime)]
        frame = _frame(out)
        result = _check7(frame, out.failure, rule)
        changed = int(frame["changed"].sum()) if frame is not None else 0
        observable = changed > 0 or out.failure is not None  # a model that fails closed was changed
        entry = table[(cell.fault, cell.severity, cell.regime)]
        rows.append({
            "fault": cell.fault, "severity": cell.severity, "regime": cell.regime,
            "checkpoint": checkpoints[cell.regime],
            "windows": int(frame["window"].nunique()) if frame is not None else 0,
            "positions": result.positions, "changed_positions": changed, "observable": observable,
            "flips": result.flips, "confident_flips": result.confident_flips, "fraction": result.fraction,
            "applicable": result.applicable, "fired": result.fired, "prediction": entry["prediction"],
            "predicted_miss": bool(entry["predicted_miss"]), "predicted_observable": bool(entry["observable"]),
            "score": _score(entry["prediction"], observable, result), "reason": result.reason,
        })
    return pd.DataFrame(rows, columns=CHECK7_SCHEMA.names)


def pairs_table(outcomes: Mapping[tuple[str, str], Outcome], regimes: Sequence[str], arm_names: tuple[str, str],
                tokens: Mapping[str, Any], rule: Check7Rule, boot: Mapping[str, Any],
                checkpoints: Mapping[str, str]) -> pd.DataFrame:
    """The kernel pair per regime: flip rate with its window-cluster interval, and check 7."""
    rows = []
    for regime in regimes:
        frame = _frame(outcomes[(KERNELS, regime)])
        if frame is None:
            raise InputError(f"kernel pair ({regime}): no replayed positions")
        result = _check7(frame, None, rule)
        per_window = frame.groupby("window", sort=True).agg(flips=("flip", "sum"), positions=("flip", "size"))
        iv = cluster_bootstrap_rate(per_window["flips"].to_numpy(), per_window["positions"].to_numpy(),
                                    seed=int(boot["seed"]), resamples=int(boot["resamples"]), level=float(boot["level"]))
        entry = tokens["predictions"]["kernel_pair"][regime]
        prediction = entry["prediction"]
        rows.append({
            "comparison": KERNELS, "regime": regime, "checkpoint": checkpoints[regime],
            "arm_a": arm_names[0], "arm_b": arm_names[1], "windows": len(per_window),
            "positions": len(frame), "differing_positions": int(frame["logits_differ"].sum()),
            "flips": result.flips, "flip_rate": result.flips / len(frame), "flip_rate_low": iv[0],
            "flip_rate_high": iv[1], "level": float(boot["level"]), "confident_flips": result.confident_flips,
            "fired": result.fired, "prediction": prediction, "predicted_observable": bool(entry["observable"]),
            "score": _score(prediction, bool(frame["logits_differ"].any()), result), "reason": result.reason,
        })
    return pd.DataFrame(rows, columns=PAIRS_SCHEMA.names)


def _ranking_rows(base: Mapping[str, Any], m: np.ndarray, f: np.ndarray, w: np.ndarray, spec: Mapping[str, Any],
                  boot: Mapping[str, Any], note: str) -> list[dict[str, Any]]:
    """The margin as a ranking of flips: the window-cluster AUC and the average precision."""
    auc = cluster_bootstrap_auc(m, f, w, seed=int(boot["seed"]), resamples=int(boot["resamples"]),
                                level=float(boot["level"]), min_defined_share=float(spec["min_defined_share"]))
    if auc.estimate is None:
        detail = "not evaluable: the comparison has no flip or no non-flip"
    elif auc.low is None:
        detail = (f"interval not evaluable: only {auc.defined}/{auc.resamples} window resamples define the AUC "
                  f"(at least {spec['min_defined_share']:g} required)")
    else:
        detail = (f"P(margin at a flip < at a non-flip) + 1/2 P(tie); percentile interval over {auc.defined}/"
                  f"{auc.resamples} window-cluster resamples")
    rows = [{**base, "quantity": "auc", "bin": 0, "value": auc.estimate, "low": auc.low, "high": auc.high,
             "level": auc.level, "positions": len(m), "flips": int(f.sum()), "windows": int(np.unique(w).size),
             "detail": detail + note}]
    ap = average_precision(m, f)
    rows.append({**base, "quantity": "average_precision", "bin": 0, "value": ap, "low": None, "high": None,
                 "level": None, "positions": len(m), "flips": int(f.sum()), "windows": int(np.unique(w).size),
                 "detail": ("not evaluable: the comparison has no flip" if ap is None else
                            f"ties grouped (one threshold per distinct margin); prevalence {f.mean():.6g} is the "
                            "value of an uninformative ranking") + note})
    return rows


def _calibration_rows(base: Mapping[str, Any], m: np.ndarray, f: np.ndarray, w: np.ndarray,
                      spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The margin as a flip probability: held-out Brier scores of the binned and isotonic maps, and the map."""
    cal_spec = spec["calibration"]
    cal = calibrate(m, f, w, bins=int(cal_spec["bins"]), min_support=int(cal_spec["min_support"]),
                    prior_flips=float(cal_spec["prior_flips"]), prior_stays=float(cal_spec["prior_stays"]))
    iso = calibrate_isotonic(m, f, w)
    if isinstance(cal, str):
        return [{**base, "quantity": q, "bin": 0, "value": None, "low": None, "high": None, "level": None,
                 "positions": 0, "flips": 0, "windows": 0, "detail": cal}
                for q in ("brier_map", "brier_baseline", "brier_isotonic")]
    assert not isinstance(iso, str)  # the same split decides both
    rows = [{**base, "quantity": "brier_isotonic", "bin": 0, "value": iso.brier, "low": None, "high": None,
             "level": None, "positions": cal.held_out_positions, "flips": cal.held_out_flips,
             "windows": cal.held_out_windows,
             "detail": f"held-out Brier of the decreasing isotonic map ({iso.map.start.size} steps, fitted on even "
                       "windows, no prior): the pre-specified sensitivity analysis of the binned map"}]
    held = {"low": None, "high": None, "level": None, "positions": cal.held_out_positions,
            "flips": cal.held_out_flips, "windows": cal.held_out_windows}
    skill = "undefined (baseline Brier 0)" if cal.skill is None else f"{cal.skill:.6g}"
    rows.append({**base, **held, "quantity": "brier_map", "bin": 0, "value": cal.brier_map,
                 "detail": f"held-out (odd windows) Brier of the {len(cal.map.probability)}-bin map; skill vs "
                           f"baseline {skill}"})
    rows.append({**base, **held, "quantity": "brier_baseline", "bin": 0, "value": cal.brier_baseline,
                 "detail": "held-out Brier of the constant map (fitting prevalence, same Beta prior)"})
    edges = np.concatenate([[-np.inf], cal.map.edges, [np.inf]])
    for i, p in enumerate(cal.map.probability):
        rows.append({**base, "quantity": "map_bin", "bin": i + 1, "value": float(p), "low": None, "high": None,
                     "level": None, "positions": int(cal.map.positions[i]), "flips": int(cal.map.flips[i]),
                     "windows": int(np.unique(w[w % 2 == 0]).size),
                     "margin_from": None if i == 0 else float(edges[i]),
                     "margin_to": None if i == len(cal.map.probability) - 1 else float(edges[i + 1]),
                     "detail": "fitted on even windows: (flips + prior) / (positions + priors) for margins in "
                               "[margin_from, margin_to)"})
    return rows


def _predictor_rows(label: str, regime: str, frame: pd.DataFrame, spec: Mapping[str, Any],
                    boot: Mapping[str, Any]) -> list[dict[str, Any]]:
    finite = frame[np.isfinite(frame["margin"])]
    dropped = len(frame) - len(finite)
    note = f"; {dropped} position(s) without a finite reference margin left out" if dropped else ""
    m, f = finite["margin"].to_numpy(), finite["flip"].to_numpy(dtype=bool)
    w = finite["window"].to_numpy(dtype=np.int64)
    base = {"comparison": label, "regime": regime, "margin_from": None, "margin_to": None}
    return _ranking_rows(base, m, f, w, spec, boot, note) + _calibration_rows(base, m, f, w, spec)


def predictor_table(outcomes: Mapping[tuple[str, str], Outcome], spec: Mapping[str, Any],
                    boot: Mapping[str, Any]) -> pd.DataFrame:
    """The kernel pair in every regime, and every injection comparison with at least one flip."""
    rows: list[dict[str, Any]] = []
    for (label, regime), out in sorted(outcomes.items()):
        frame = _frame(out)
        if frame is None or (label != KERNELS and not frame["flip"].any()):
            continue
        rows += _predictor_rows(label, regime, frame, spec, boot)
    return pd.DataFrame(rows, columns=PREDICTOR_SCHEMA.names)


def influence_table(outcomes: Mapping[tuple[str, str], Outcome]) -> pd.DataFrame:
    """Leave-one-window-out AUC and flip rate for every comparison the predictor evaluates."""
    rows: list[dict[str, Any]] = []
    for (label, regime), out in sorted(outcomes.items()):
        frame = _frame(out)
        if frame is None or (label != KERNELS and not frame["flip"].any()):
            continue
        finite = frame[np.isfinite(frame["margin"])]
        if finite.empty:
            continue
        got = leave_one_cluster_out(finite["margin"].to_numpy(), finite["flip"].to_numpy(dtype=bool),
                                    finite["window"].to_numpy(dtype=np.int64))
        for i, window in enumerate(got.cluster):
            auc = got.auc_without[i]
            rate = got.flip_rate_without[i]
            rows.append({
                "comparison": label, "regime": regime, "window": int(window), "positions": int(got.positions[i]),
                "flips": int(got.flips[i]), "auc_without": None if np.isnan(auc) else float(auc),
                "auc_change": None if np.isnan(auc) or got.auc is None else float(auc) - got.auc,
                "flip_rate_without": None if np.isnan(rate) else float(rate),
                "flip_rate_change": None if np.isnan(rate) else float(rate) - got.flip_rate,
            })
    return pd.DataFrame(rows, columns=INFLUENCE_SCHEMA.names)


def replay_regimes(load: Callable[[str, str], Any], regimes: Mapping[str, str], arms: tuple[Any, Any],
                   corpus: CorpusText, cut_profile: Mapping[str, Any], size: Sizes, settings: CampaignSettings,
                   device: torch.device) -> tuple[dict[tuple[str, str], Outcome], torch.Tensor]:
    """(comparison, regime) -> its outcome, and the replayed windows: every regime's W8A8 model in turn
    (``load(regime, label)``: an engine with ``model`` and ``tokenizer``, which the stage builds), its
    windows replayed under the kernel pair and, on the first injection windows, every injection cell."""
    arm_a, arm_b = arms
    cells_per_regime = sum(len(cells(r)) for r in regimes) // len(regimes)
    outcomes: dict[tuple[str, str], Outcome] = {}
    cut: torch.Tensor | None = None
    bar = Progress(total=len(regimes) * size.windows, desc="tokens replay", unit="window")
    for regime, name in regimes.items():
        engine = load(regime, f"{name} on {arm_a.name}/{arm_b.name}")
        if cut is None:
            cut = windows(encode(engine.tokenizer, corpus.text), int(cut_profile["window_tokens"]),
                          int(cut_profile["windows"]), source=f"corpus {corpus.name}")[:size.windows, :size.tokens]
        replay = RegimeReplay(engine.model, arms, regime, name, settings, device)
        for w in range(size.windows):
            inject = w < size.injection_windows
            bar.set_postfix_str(f"{regime} window {w}" + (f": kernel pair + {cells_per_regime} injection cells"
                                                          if inject else ": kernel pair"))
            replay.window(w, cut[w], inject=inject)
            bar.update(1)
        outcomes.update({(label, regime): out for label, out in replay.outcomes.items()})
        del engine, replay
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    bar.close()
    assert cut is not None
    return outcomes, cut


def study_tables(outcomes: Mapping[tuple[str, str], Outcome], spec: Mapping[str, Any], boot: Mapping[str, Any],
                 arm_names: tuple[str, str], regimes: Mapping[str, str]) -> dict[str, pd.DataFrame]:
    """The five tables by name (``TABLES``): positions, pairs, predictor, check 7 and influence."""
    rule = Check7Rule.from_protocol(spec)
    injected = [c for r in regimes for c in cells(r)]
    check7 = check7_table(outcomes, injected, predictions(spec), rule, regimes)
    return {
        "positions": pd.concat([f for out in outcomes.values() if out.failure is None for f in out.frames],
                               ignore_index=True),
        "pairs": pairs_table(outcomes, list(regimes), arm_names, spec, rule, boot, regimes),
        "predictor": predictor_table(outcomes, spec["predictor"], boot),
        "check7": check7,
        "influence": influence_table(outcomes),
    }

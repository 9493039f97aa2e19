"""The token-level study's tables on constructed comparisons, every expected value derived by hand:
check 7 per injection cell, the kernel pair with its window-cluster interval, and the
leave-one-window-out influence. (The stage end to end on the tiny model: tests/stages/test_tokens.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.faults.campaign import CampaignSettings
from int8alibi.kernels.registry import get
from int8alibi.model.synthetic import build_synthetic
from int8alibi.model.w8a8 import quantize_linears, swap_linears
from int8alibi.protocol import load
from int8alibi.tokens import study
from int8alibi.tokens.check7 import Check7Rule
from int8alibi.tokens.inject import Cell

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = load(ROOT / "preregistration")


def positions_frame(label: str, regime: str, window: int, flips: dict[int, float], changed: int,
                    n: int = 20) -> pd.DataFrame:
    """``n`` positions of one window; ``flips`` maps a position to its reference margin (every other
    position keeps the top-1 token at margin 3.0); the first ``changed`` positions' logits changed."""
    margin = np.full(n, 3.0)
    flip = np.zeros(n, dtype=bool)
    for pos, m in flips.items():
        margin[pos], flip[pos] = m, True
    moved = np.arange(n) < changed
    return pd.DataFrame({"comparison": label, "regime": regime, "checkpoint": regime, "window": np.full(n, window, np.int32),
                         "position": np.arange(n, dtype=np.int32), "token": np.arange(n, dtype=np.int64), "margin": margin,
                         "top1_a": np.zeros(n, np.int64), "top1_b": flip.astype(np.int64), "flip": flip,
                         "logits_differ": moved, "changed": moved})


def test_check7_table_scores_constructed_comparisons_as_derived_by_hand() -> None:
    """Two windows of 20 positions per cell (40 positions: the budget 0.05 allows 2 flips), against a
    constructed prediction table; every expected value below is worked out from tokens.yaml's check7
    and analysis.yaml's reading rule, not from the code."""
    #  fault sev    prediction  flips (window 0)       changed  | positions flips confident observable applicable fired  score
    spec = [
        ("F1", "one", "silent", {0: 0.5, 1: 0.5}, 3,     40, 2, 0, True, True, False, "TN"),   # 2/40 = budget: within
        ("F1", "pct", "fire", {0: 0.1, 1: 0.2, 2: 0.3}, 3, 40, 3, 0, True, True, True, "TP"),   # 3/40 above the budget
        ("F1", "all", "silent", {4: 1.0}, 1,              40, 1, 1, True, True, True, "FP"),    # margin 1.0 is confident
        ("F2", "one", "fire", {}, 5,                     40, 0, 0, True, True, False, "FN"),
        ("F2", "pct", "fire", {}, 0,                     40, 0, 0, False, True, False, "excluded-unobservable"),
        ("F2", "all", "silent", {0: np.nan, 1: 0.99}, 2, 40, 2, 0, True, True, False, "TN"),    # NaN, 0.99: not confident
        ("F7", "all", "n/a", {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1, 4: 0.1}, 5, 40, 5, 0, True, True, True, "not-applicable"),
    ]
    outcomes, table, injected = {}, {}, []
    for fault, sev, prediction, flips, changed, *_ in spec:
        cell = Cell(fault, sev, "own")
        injected.append(cell)
        frames = [positions_frame(cell.label, "own", 0, flips, changed), positions_frame(cell.label, "own", 1, {}, 0)]
        outcomes[(cell.label, "own")] = study.Outcome(cell.label, "own", frames)
        table[(fault, sev, "own")] = {"prediction": prediction, "predicted_miss": False, "observable": True}
    f6 = Cell("F6", "all", "own")
    injected.append(f6)
    outcomes[(f6.label, "own")] = study.Outcome(f6.label, "own", [], "window 0: the faulted model failed closed: x")
    table[("F6", "all", "own")] = {"prediction": "fire", "predicted_miss": False, "observable": True}
    rows = study.check7_table(outcomes, injected, table, Check7Rule(1.0, 0.05, 0), {"own": "own"})
    got = rows.set_index(["fault", "severity"])
    for fault, sev, prediction, _, changed, positions, flips, confident, observable, applicable, fired, score in spec:
        row = got.loc[(fault, sev)]
        assert (row["positions"], row["changed_positions"], row["flips"], row["confident_flips"]) == (
            positions, changed, flips, confident), (fault, sev)
        assert (bool(row["observable"]), bool(row["applicable"]), bool(row["fired"]), row["score"]) == (
            observable, applicable, fired, score), (fault, sev)
        assert row["windows"] == 2 and row["fraction"] == flips / 40 and row["prediction"] == prediction
    row = got.loc[("F6", "all")]   # failed closed: changed (observable), nothing to compare, not scored
    assert (row["positions"], bool(row["observable"]), bool(row["applicable"]), row["fired"], row["score"]) == (
        0, True, False, None, "not-applicable")
    assert row["reason"] == "not applicable: window 0: the faulted model failed closed: x"


def test_pairs_table_scores_the_kernel_pair_as_derived_by_hand() -> None:
    """own: 3 flips in window 0 of two 20-position windows, margins below 1: 3/40 > 0.05 fires; the
    logits differ, the pinned prediction is silent: FP. The window-cluster interval by hand: a resample
    of two windows holds window 0 twice (rate 6/40), once (3/40) or never (0) with probabilities 1/4,
    1/2, 1/4 (about 500 of 2000 resamples each way, far more than the 100 each 5% tail needs), so the
    90% interval is [0, 0.15]. pow2: nothing differs: excluded as unobservable, silent."""
    outcomes = {
        ("kernels", "own"): study.Outcome("kernels", "own", [
            positions_frame("kernels", "own", 0, {3: 0.2, 9: 0.4, 15: 0.6}, 4),
            positions_frame("kernels", "own", 1, {}, 2)]),
        ("kernels", "pow2"): study.Outcome("kernels", "pow2", [
            positions_frame("kernels", "pow2", 0, {}, 0), positions_frame("kernels", "pow2", 1, {}, 0)]),
    }
    rows = study.pairs_table(outcomes, ["own", "pow2"], ("arm-a", "arm-b"), PROTOCOL.tokens, Check7Rule(1.0, 0.05, 0),
                             PROTOCOL.analysis["bootstrap"], {"own": "own", "pow2": "pow2-nearest"}).set_index("regime")
    own, pow2 = rows.loc["own"], rows.loc["pow2"]
    assert (own["positions"], own["differing_positions"], own["flips"], own["confident_flips"]) == (40, 6, 3, 0)
    assert (bool(own["fired"]), own["prediction"], own["score"]) == (True, "silent", "FP")
    assert (own["flip_rate"], own["flip_rate_low"], own["flip_rate_high"]) == (3 / 40, 0.0, 6 / 40)
    assert (pow2["differing_positions"], pow2["flips"], bool(pow2["fired"]), pow2["score"]) == (
        0, 0, False, "excluded-unobservable")
    assert (pow2["flip_rate_low"], pow2["flip_rate_high"], pow2["checkpoint"]) == (0.0, 0.0, "pow2-nearest")


def _positions(label: str, margins: list[float], flips: list[bool], windows: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"comparison": label, "regime": "own", "window": windows, "margin": margins, "flip": flips})


def test_influence_table_leaves_each_window_out_of_every_evaluated_comparison() -> None:
    outcomes = {
        (study.KERNELS, "own"): study.Outcome(study.KERNELS, "own", [
            _positions(study.KERNELS, [0.1, 0.9], [True, False], [0, 0]),
            _positions(study.KERNELS, [0.5, 0.5, float("nan")], [True, False, False], [1, 1, 1])]),
        ("F3 all", "own"): study.Outcome("F3 all", "own", [_positions("F3 all", [0.2], [False], [0])]),  # no flip
    }
    table = study.influence_table(outcomes)
    assert table["comparison"].tolist() == [study.KERNELS] * 2 and table["window"].tolist() == [0, 1]
    assert table["positions"].tolist() == [2, 2]  # the non-finite margin is left out
    # full sample: AUC of [0.1 T, 0.9 F, 0.5 T, 0.5 F] = (1 + 1 + 1 + 0.5) / 4; without window 0: the tie, 0.5
    assert table.loc[0, "auc_without"] == pytest.approx(0.5)
    assert table.loc[0, "auc_change"] == pytest.approx(0.5 - 0.875)
    assert table.loc[1, "auc_without"] == 1.0 and table.loc[1, "flip_rate_change"] == pytest.approx(0.0)


def _replay_model() -> torch.nn.Module:
    model = build_synthetic("tiny", seed=0, vocab_size=256)
    return swap_linears(model, quantize_linears(model), get("exact-cutlass-order", torch.device("cpu")))


def test_every_injection_cell_runs_in_a_batch_of_two_and_the_kernel_pair_in_one_of_three(monkeypatch) -> None:
    """tokens.yaml injection.batches: no forward grows with the catalogue; every main cell is set against
    the reference copy of its own batch, F6/F7 against the first cell's."""

    cpu = torch.device("cpu")
    sizes: list[int] = []
    real = study.replay_window

    def counted(model, ids, copies, arm_for, window, device):
        sizes.append(copies)
        return real(model, ids, copies, arm_for, window, device)

    monkeypatch.setattr(study, "replay_window", counted)
    arms = (get("exact-cutlass-order", cpu), get("exact-triton-order", cpu))
    replay = study.RegimeReplay(_replay_model(), arms, "own", "own", CampaignSettings.from_protocol(PROTOCOL), cpu)
    replay.window(0, torch.arange(10, 22), inject=False)
    assert sizes == [3]
    replay.window(1, torch.arange(30, 42), inject=True)
    main = [c for c in study.cells("own") if not c.both_arms]
    assert sizes[1:] == [3] + [2] * (len(main) + 2)  # the kernel pair, each main cell, F6 and F7
    for c in study.cells("own"):
        out = replay.outcomes[c.label]
        assert out.failure is not None or [int(f["window"].iloc[0]) for f in out.frames] == [1], c.label
    f8 = replay.outcomes["F8 all"].frames[0]
    assert not f8["logits_differ"].any() and not f8["changed"].any()  # the null cell equals its batch's reference


def test_an_f8_batch_whose_copies_differ_stops_the_replay(monkeypatch) -> None:

    cpu = torch.device("cpu")
    real = study.replay_window

    def f8_broken(model, ids, copies, arm_for, window, device):
        logits = real(model, ids, copies, arm_for, window, device).clone()
        arm = arm_for("model.layers.0.mlp.down_proj", window)
        if copies == 2 and getattr(arm, "copies", [None])[-1] is not None and arm.copies[-1].fault == "F8":
            logits[1, 0, 0] += 1
        return logits

    monkeypatch.setattr(study, "replay_window", f8_broken)
    arms = (get("exact-cutlass-order", cpu), get("exact-triton-order", cpu))
    replay = study.RegimeReplay(_replay_model(), arms, "own", "own", CampaignSettings.from_protocol(PROTOCOL), cpu)
    with pytest.raises(InputError, match=r"window 0 \(own\): the null cell F8 differs from the reference copy in its batch"):
        replay.window(0, torch.arange(10, 22), inject=True)

"""The tokens stage end to end on the tiny synthetic model: tables, identical pairs that give zero
flips and a silent check 7, scores against the pinned predictions, a verified manifest, the same
bytes on a rerun; and a precondition fault whose model fails closed is not applicable."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from int8alibi.config import Config
from int8alibi.engines.checkpoints import checkpoint_dir
from int8alibi.engines.own import load_w8a8
from int8alibi.errors import InputError, ProtocolError
from int8alibi.faults.campaign import CampaignSettings
from int8alibi.kernels.registry import get
from int8alibi.protocol import load
from int8alibi.provenance.audit import verify
from int8alibi.provenance.hashing import sha256_file
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.provenance.parquet import read_table
from int8alibi.stages import tokens as stage
from int8alibi.tokens import study
from int8alibi.tokens.check7 import Check7Rule
from int8alibi.tokens.inject import Cell, InjectionArm, cells

ROOT = Path(__file__).resolve().parents[2]
ARMS = ["exact-cutlass-order", "exact-triton-order"]
PROTOCOL = load(ROOT / "preregistration")
SIZES = study.sizes(PROTOCOL.tokens, "tiny")
TABLES = {"positions": study.POSITIONS_SCHEMA, "pairs": study.PAIRS_SCHEMA, "predictor": study.PREDICTOR_SCHEMA,
          "check7": study.CHECK7_SCHEMA}


# analysis.yaml's reading rule written out by hand: (prediction, fired) -> score on an applicable check
# of an observable comparison; an unobservable comparison is excluded, and an n/a prediction or a
# check that is not applicable is not scored.
READING_RULE = {("fire", True): "TP", ("fire", False): "FN", ("silent", True): "FP", ("silent", False): "TN"}


def expected_score(prediction: str, observable: bool, applicable: bool, fired: bool | None) -> str:
    if not observable:
        return "excluded-unobservable"
    if prediction == "n/a" or not applicable:
        return "not-applicable"
    return READING_RULE[(prediction, fired)]


CHECK7 = PROTOCOL.tokens["check7"]


def expected_fired(flips: int, positions: int, confident: int) -> bool:
    """tokens.yaml check7 in exact fractions (so the budget's own edge is not blurred by float
    rounding): fires when flips / positions > flip_budget (1/20 when pinned at 0.05), or when more flips
    than confident_flips_allowed have a reference margin >= margin_threshold."""
    return (Fraction(flips) > Fraction(str(CHECK7["flip_budget"])) * positions
            or confident > CHECK7["confident_flips_allowed"])


def test_the_hand_written_rules_are_the_pinned_ones() -> None:
    assert PROTOCOL.analysis["reading_rule"]["scores"] == {"fire": {"fired": "TP", "silent": "FN"},
                                                          "silent": {"fired": "FP", "silent": "TN"}}


@pytest.fixture(scope="module")
def pipe(tiny_pipeline) -> Config:
    """The tiny synthetic model through the real model and requant stages."""
    return tiny_pipeline("tokens-pipeline", ARMS)[1]


def _run(cfg: Config, out: Path) -> Path:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        out.mkdir(parents=True, exist_ok=True)
        stage.run(cfg, out, gate=cfg.results / "requant" / "gate.parquet",
                  parent=cfg.results / "model" / "parent.parquet")
    return out


@pytest.fixture(scope="module")
def tables(pipe: Config) -> dict[str, object]:
    out = _run(pipe, pipe.results / "tokens")
    return {name: read_table(out / f"{name}.parquet", schema) for name, schema in TABLES.items()} | {"out": out}


@pytest.mark.slow
def test_tables_cover_every_comparison_and_position(tables: dict) -> None:
    positions, check7 = tables["positions"], tables["check7"]
    per = positions.groupby(["comparison", "regime"]).size()
    assert per[("kernels", "own")] == per[("kernels", "pow2")] == SIZES.windows * SIZES.tokens
    cells = per.drop("kernels", level="comparison")
    assert (cells == SIZES.injection_windows * SIZES.tokens).all() and len(cells) <= 42
    assert len(check7) == 42 and not check7.duplicated(["fault", "severity", "regime"]).any()
    assert set(positions.loc[positions["comparison"] == "kernels", "window"]) == set(range(SIZES.windows))


@pytest.mark.slow
def test_identical_pairs_give_zero_flips_and_a_silent_check(tables: dict) -> None:
    pairs = tables["pairs"].set_index("regime")
    pow2 = pairs.loc["pow2"]   # power-of-two weight scales: the two epilogue orders give the same bits
    assert (pow2["differing_positions"], pow2["flips"], pow2["fired"]) == (0, 0, False)
    assert pow2["score"] == "excluded-unobservable" and pow2["flip_rate_low"] == pow2["flip_rate_high"] == 0.0
    null = tables["check7"][tables["check7"]["fault"] == "F8"]
    assert len(null) == 2 and (null["changed_positions"] == 0).all() and (null["flips"] == 0).all()
    assert (~null["fired"].astype(bool)).all() and (null["score"] == "excluded-unobservable").all()


@pytest.mark.slow
def test_scores_follow_the_pinned_predictions_and_the_reading_rule(tables: dict) -> None:
    check7 = tables["check7"]
    pinned = {(e["fault"], e["severity"], e["regime"]): e for e in PROTOCOL.tokens["predictions"]["injection"]}
    positions = tables["positions"]
    for row in check7.itertuples():
        entry = pinned[(row.fault, row.severity, row.regime)]
        assert (row.prediction, row.predicted_miss, row.predicted_observable) == (
            entry["prediction"], entry["predicted_miss"], entry["observable"])
        fired = None if row.fired is None or (isinstance(row.fired, float) and np.isnan(row.fired)) else bool(row.fired)
        mine = positions[(positions["comparison"] == f"{row.fault} {row.severity}") & (positions["regime"] == row.regime)]
        failed_closed = len(mine) == 0  # such a cell leaves no positions: changed, but nothing to compare
        assert bool(row.applicable) == (not failed_closed)
        assert bool(row.observable) == (failed_closed or bool(mine["changed"].any()))
        if row.applicable:
            flips = mine["flip"].to_numpy()
            confident = int((flips & (mine["margin"].to_numpy() >= CHECK7["margin_threshold"])).sum())
            assert (row.positions, row.flips, row.confident_flips) == (len(mine), int(flips.sum()), confident)
            assert fired is expected_fired(int(flips.sum()), len(mine), confident)
        assert row.score == expected_score(row.prediction, bool(row.observable), bool(row.applicable), fired)
    # Under power-of-two weight scales F2, F3 and F5 give the reference's bits (the pinned reason).
    pow2 = check7[(check7["regime"] == "pow2") & check7["fault"].isin(["F2", "F3", "F5"])]
    assert (pow2["changed_positions"] == 0).all()


@pytest.mark.slow
def test_predictor_rows_for_the_kernel_pair(tables: dict) -> None:
    predictor = tables["predictor"]
    kernels = predictor[predictor["comparison"] == "kernels"]
    for regime in ("own", "pow2"):
        quantities = set(kernels.loc[kernels["regime"] == regime, "quantity"])
        assert {"auc", "brier_map", "brier_baseline"} <= quantities
    auc = predictor[predictor["quantity"] == "auc"]
    defined = auc["value"].notna()
    assert auc.loc[defined, "value"].between(0, 1).all()
    assert auc.loc[~defined, "detail"].str.startswith("not evaluable").all()


@pytest.mark.slow
def test_manifest_verifies_and_a_rerun_gives_the_same_bytes(pipe: Config, tables: dict) -> None:
    out = tables["out"]
    manifest = load_manifest(out / "manifest.json")
    assert manifest["stage"] == "tokens" and manifest["protocol"]["pins"]["files"]["preregistration/tokens.yaml"]
    assert [a["arm"] for a in manifest["arms"]] == [*ARMS, "fault-injection"]
    assert all(a["is_emulation"] for a in manifest["arms"])
    assert [f for f in verify(pipe.results, ROOT) if f.level == "error"] == []
    again = _run(pipe, pipe.results / "tokens-again")
    for name in TABLES:
        assert sha256_file(again / f"{name}.parquet") == sha256_file(out / f"{name}.parquet"), name


@pytest.mark.slow
def test_a_precondition_fault_whose_model_fails_closed_is_not_applicable(pipe: Config,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    class FailsClosed(InjectionArm):
        def scaled_mm(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
            if any(c is not None and c.fault == "F6" for c in self.copies):
                raise InputError(f"{self.layer} input: 3 non-finite element(s); no int8 scale represents them")
            return super().scaled_mm(a_q, w_q, s_a, s_w)

    monkeypatch.setattr(study, "InjectionArm", FailsClosed)
    cpu = torch.device("cpu")
    arms = (get(ARMS[0], cpu), get(ARMS[1], cpu))
    engine = load_w8a8(pipe, checkpoint_dir(pipe.results / "requant" / "gate.parquet", "own"), arms[0], cpu, "own")
    replay = study.RegimeReplay(engine.model, arms, "own", "own", CampaignSettings.from_protocol(PROTOCOL), cpu)
    replay.window(0, torch.arange(100, 100 + SIZES.tokens), inject=True)
    f6 = replay.outcomes["F6 all"]
    assert f6.failure is not None and "non-finite" in f6.failure and not f6.frames
    assert replay.outcomes["F7 all"].failure is None and replay.outcomes["F7 all"].frames
    table = {(e["fault"], e["severity"], e["regime"]): e for e in PROTOCOL.tokens["predictions"]["injection"]}
    rows = study.check7_table({(k, "own"): v for k, v in replay.outcomes.items()},
                              [c for c in cells("own") if c.fault in ("F6", "F7")], table,
                              Check7Rule.from_protocol(PROTOCOL.tokens), {"own": "own"})
    f6_row = rows[rows["fault"] == "F6"].iloc[0]
    assert (f6_row["applicable"], f6_row["fired"], f6_row["score"]) == (False, None, "not-applicable")
    assert f6_row["reason"].startswith("not applicable: window 0: the faulted model failed closed")


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


def test_unknown_size_profile_and_missing_gate_fail_closed(tmp_path: Path) -> None:
    with pytest.raises(ProtocolError, match="tokens.yaml: no size profile 'huge'"):
        study.sizes(PROTOCOL.tokens, "huge")
    cfg = Config(data={"model": {"source": "synthetic", "synthetic": {"preset": "tiny", "seed": 0}},
                       "size_profile": "tiny", "corpus": {"source": "synthetic"}, "device": "cpu", "arms": ARMS,
                       "exploratory": False, "results": str(tmp_path / "results")}, path=tmp_path / "config.yaml")
    with pytest.raises(InputError, match="requant gate table not found"):
        stage.run(cfg, tmp_path / "tokens", gate=tmp_path / "results" / "requant" / "gate.parquet")


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

"""The tokens stage end to end on the tiny synthetic model: tables, identical pairs that give zero
flips and a silent check 7, scores against the pinned predictions, a verified manifest, the same
bytes on a rerun; and a precondition fault whose model fails closed is not applicable."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
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
from int8alibi.files.hashing import sha256_file
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.files.parquet import read_table
from int8alibi.stages import tokens as stage
from int8alibi.tokens import study
from int8alibi.tokens.check7 import Check7Rule
from int8alibi.tokens.inject import InjectionArm, cells

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


def test_unknown_size_profile_and_missing_gate_fail_closed(tmp_path: Path) -> None:
    with pytest.raises(ProtocolError, match="tokens.yaml: no size profile 'huge'"):
        study.sizes(PROTOCOL.tokens, "huge")
    cfg = Config(data={"model": {"source": "synthetic", "synthetic": {"preset": "tiny", "seed": 0}},
                       "size_profile": "tiny", "corpus": {"source": "synthetic"}, "device": "cpu", "arms": ARMS,
                       "exploratory": False, "results": str(tmp_path / "results")}, path=tmp_path / "config.yaml")
    with pytest.raises(InputError, match="requant gate table not found"):
        stage.run(cfg, tmp_path / "tokens", gate=tmp_path / "results" / "requant" / "gate.parquet")

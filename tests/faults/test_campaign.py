"""Structural facts of the campaign, computed from its cells table, and cross-checks of its shortcuts.

Every expectation here follows from the definitions (preregistration/faults.yaml, checks.yaml), never from a recorded
output: cell counts, which checks the precondition faults must trip, the one-spacing behaviour of
the epilogue faults, and that the vectorized shortcuts (tiling by multiplication, rank-one
updates, sparse severities) give what a direct recomputation gives.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
import torch

from int8alibi.arith import exact_accumulator, wrap_int32
from int8alibi.faults.checks import compare_outputs
from int8alibi.errors import InputError, ProtocolError
from int8alibi.faults import CELLS_PER_LAYER, CampaignSettings, reference, run_layer
from int8alibi.faults import catalogue as cat
from int8alibi.faults.campaign import cell_rng, picked_elements
from int8alibi.faults.catalogue import FAULT_SEVERITIES, fraction_count
from int8alibi.faults.pipeline import regime_scales
from int8alibi.kernels.layer_operands import Operands

CELL = ["layer", "fault", "severity", "regime"]


def per_cell(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.drop_duplicates(CELL)


def test_42_cells_per_layer_each_with_7_checks(campaign_rows: pd.DataFrame, layers: list[Operands]) -> None:
    assert CELLS_PER_LAYER == 42
    cells = per_cell(campaign_rows)
    assert len(cells) == 42 * len(layers)
    assert (campaign_rows.groupby(CELL).size() == 7).all()
    assert sorted(campaign_rows["check"].unique()) == [1, 2, 3, 4, 5, 6, 7]
    for layer, group in cells.groupby("layer"):
        got = {(f, s, r) for f, s, r in zip(group.fault, group.severity, group.regime)}
        want = {(f, s, r) for f, sevs in FAULT_SEVERITIES.items() for s in sevs for r in ("own", "pow2")}
        assert got == want, layer


def test_applicability_is_never_a_pass(campaign_rows: pd.DataFrame) -> None:
    not_applicable = campaign_rows[~campaign_rows["applicable"]]
    assert not_applicable["fired"].isna().all()
    assert campaign_rows[campaign_rows["applicable"]]["fired"].notna().all()
    assert not campaign_rows[campaign_rows["check"] == 7]["applicable"].any()


def test_check_5_applies_exactly_where_every_scale_is_a_power_of_two(campaign_rows: pd.DataFrame) -> None:
    five = campaign_rows[campaign_rows["check"] == 5].set_index(CELL)["applicable"]
    six = campaign_rows[campaign_rows["check"] == 6].set_index(CELL)["applicable"]
    assert (five != six).all()
    for (_, fault, severity, regime), applicable in five.items():
        # pow2 regime: every scale is a power of two, except F9-pct, whose arm B has nudged scales.
        assert applicable == (regime == "pow2" and not (fault == "F9" and severity == "pct")), (fault, severity)


def test_epilogue_faults_stay_within_one_spacing(campaign_rows: pd.DataFrame) -> None:
    cells = per_cell(campaign_rows)
    epilogue = cells[cells["fault"].isin(["F1", "F2", "F3", "F4", "F5"])]
    assert set(epilogue["max_ulp"].unique()) <= {0, 1}
    assert set(epilogue[epilogue["observable"]]["max_ulp"].unique()) == {1}


def test_epilogue_faults_other_than_truncation_vanish_under_pow2(campaign_rows: pd.DataFrame) -> None:
    cells = per_cell(campaign_rows)
    pow2 = cells[(cells["regime"] == "pow2") & cells["fault"].isin(["F1", "F2", "F3", "F5"])]
    assert (pow2["changed_elements"] == 0).all()
    f4 = cells[(cells["fault"] == "F4") & (cells["regime"] == "pow2") & (cells["severity"] == "all")]
    assert (f4["changed_elements"] > 0).all()


def test_the_null_fault_never_fires_and_is_unobservable(campaign_rows: pd.DataFrame) -> None:
    f8 = campaign_rows[campaign_rows["fault"] == "F8"]
    assert not f8["fired"].fillna(False).astype(bool).any()
    assert (f8["changed_elements"] == 0).all()


def fired(rows: pd.DataFrame, fault: str) -> pd.DataFrame:
    """Cells of ``fault`` x check -> fired (False where not applicable)."""
    sub = rows[rows["fault"] == fault]
    return sub.pivot_table(index=CELL, columns="check", values="fired", aggfunc="first").fillna(False).astype(bool)


def test_precondition_faults_trip_their_checks_in_every_cell(campaign_rows: pd.DataFrame) -> None:
    f6 = fired(campaign_rows, "F6")
    assert f6[[2, 3, 4]].all().all() and not f6[[1, 5, 6]].any().any()
    f7 = fired(campaign_rows, "F7")
    assert f7[3].all() and not f7[[1, 2, 4, 5, 6]].any().any()
    cells = per_cell(campaign_rows)
    for fault in ("F6", "F7"):
        sub = cells[cells["fault"] == fault]
        assert (sub["max_ulp"] == 0).all() and (sub["changed_elements"] > 0).all()


def test_operand_mismatch_fires_check_1_in_every_cell(campaign_rows: pd.DataFrame) -> None:
    f9 = fired(campaign_rows, "F9")
    assert f9[1].all()
    by_severity = f9.groupby(level="severity")[4].all()
    assert by_severity["all"] and by_severity["one"] and not f9.xs("pct", level="severity")[4].any()


def test_severities_reach_one_element_and_one_percent(campaign_rows: pd.DataFrame, layers: list[Operands],
                                                      settings: CampaignSettings) -> None:
    cells = per_cell(campaign_rows)
    sizes = {op.layer: op.m * op.n for op in layers}
    epi = cells[cells["fault"].isin(["F1", "F2", "F3", "F4", "F5"])]
    assert (epi[epi["severity"] == "one"]["changed_elements"] <= 1).all()
    pct = epi[epi["severity"] == "pct"]
    limit = [fraction_count(settings.pct_fraction, sizes[layer]) for layer in pct["layer"]]
    assert (pct["changed_elements"] <= limit).all()
    full = epi[epi["severity"] == "all"].set_index(["layer", "fault", "regime"])["changed_elements"]
    for row in pct.itertuples():
        assert row.changed_elements <= full[(row.layer, row.fault, row.regime)]


def test_fraction_count_rounds_up_and_never_below_one() -> None:
    assert fraction_count(Fraction(1, 100), 1024) == 11
    assert fraction_count(Fraction(1, 100), 1000) == 10
    assert fraction_count(Fraction(1, 100), 5) == 1


def test_cell_draws_depend_on_the_cell_identity_only() -> None:
    a = picked_elements(cell_rng(7, "L", "F1", "pct", "own"), "pct", 5000, Fraction(1, 100))
    b = picked_elements(cell_rng(7, "L", "F1", "pct", "own"), "pct", 5000, Fraction(1, 100))
    c = picked_elements(cell_rng(7, "L", "F1", "pct", "pow2"), "pct", 5000, Fraction(1, 100))
    assert a is not None and b is not None and c is not None
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert len(a) == 50 and len(np.unique(a)) == 50 and (np.diff(a) > 0).all()
    assert picked_elements(cell_rng(7, "L", "F1", "all", "own"), "all", 5000, Fraction(1, 100)) is None


def test_full_severity_cells_match_a_direct_recomputation(campaign_rows: pd.DataFrame, layers: list[Operands]) -> None:
    """The campaign's F1 and F5 'all' cells against the catalogue run on whole tensors."""
    op = layers[1]  # K = 320: the last F5 tile is narrower
    cells = per_cell(campaign_rows).set_index(CELL)
    for regime in ("own", "pow2"):
        s_a, s_w = regime_scales(op.s_a, regime, "s_a"), regime_scales(op.s_w, regime, "s_w")
        acc32, y = reference(op.a_q, op.w_q, s_a, s_w)
        for fault in ("F1", "F5"):
            f5 = functools.partial(cat.fused_reduction, op.a_q, op.w_q, s_w, 128)
            y_fault = cat.epilogue_fault(fault, acc32.float(), s_a, s_w, f5)
            out = compare_outputs(y, y_fault)
            row = cells.loc[(op.layer, fault, "all", regime)]
            assert (row["changed_elements"], row["max_ulp"]) == (out.differing, out.max_finite_ulp)


def test_operand_cells_match_recomputed_operands(campaign_rows: pd.DataFrame, layers: list[Operands],
                                                 settings: CampaignSettings) -> None:
    """F9 one (a rank-one update in the campaign) and F9 all against the pipeline on rebuilt operands."""
    op = layers[0]
    cells = per_cell(campaign_rows).set_index(CELL)
    for regime in ("own", "pow2"):
        s_a, s_w = regime_scales(op.s_a, regime, "s_a"), regime_scales(op.s_w, regime, "s_w")
        _, y = reference(op.a_q, op.w_q, s_a, s_w)
        rng = cell_rng(settings.seed, op.layer, "F9", "one", regime)
        row, col = int(rng.integers(op.m)), int(rng.integers(op.k))
        moved = op.a_q.clone()
        moved[row, col] += -1 if int(moved[row, col]) == 127 else 1
        for severity, a_b in (("one", moved), ("all", cat.step_all(op.a_q))):
            _, y_b = reference(a_b, op.w_q, s_a, s_w)
            out = compare_outputs(y, y_b)
            got = cells.loc[(op.layer, "F9", severity, regime)]
            assert (got["changed_elements"], got["max_ulp"]) == (out.differing, out.max_finite_ulp)


def test_overflow_tiling_against_materialized_operands(settings: CampaignSettings) -> None:
    """A layer with large accumulators, small enough to build F6's and F7's tiled operands."""
    g = torch.Generator().manual_seed(5)
    m, k, n = 4, 256, 8
    a = torch.randint(100, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(100, 128, (n, k), generator=g, dtype=torch.int8)
    op = Operands("big", 0, "up_proj", a, torch.full((m,), 0.01), w, torch.full((n,), 0.002))
    rows = run_layer(op, settings)
    cells = per_cell(rows).set_index(CELL)
    acc = exact_accumulator(a, w)
    for fault in ("F6", "F7"):
        cell = cells.loc[("big", fault, "all", "own")]
        r = int(cell["tile_repeats"])
        assert cell["k_effective"] == r * k and not cell["f7_boost"]
        tiled = exact_accumulator(a.repeat(1, r), w.repeat(1, r))
        assert torch.equal(tiled, r * acc)
        wraps = bool((wrap_int32(tiled).to(torch.int64) != tiled).any())
        assert wraps == (fault == "F6")
        if fault == "F6":
            previous = exact_accumulator(a.repeat(1, r - 1), w.repeat(1, r - 1))
            assert torch.equal(wrap_int32(previous).to(torch.int64), previous)  # r is the least depth
        else:
            assert int(tiled.abs().max()) > 2**24 and 16256 * r * k < 2**31


def test_f7_boosts_a_row_when_tiling_alone_cannot_pass_2_24(settings: CampaignSettings) -> None:
    """With |a| <= 1 at K = 4096, max|acc| <= 127 * 4096 < 2^24 / 32 while the int32 bound allows
    at most 32 repeats: only a boosted activation row gets past 2^24."""
    g = torch.Generator().manual_seed(6)
    m, k, n = 3, 4096, 5
    a = torch.randint(-1, 2, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    least = 2**24 // int(exact_accumulator(a, w).abs().max()) + 1
    assert 16256 * least * k >= 2**31
    rows = run_layer(Operands("tiny-acts", 0, "down_proj", a, torch.full((m,), 0.01), w, torch.full((n,), 0.002)),
                     settings)
    cells = per_cell(rows).set_index(CELL)
    cell = cells.loc[("tiny-acts", "F7", "all", "own")]
    r = int(cell["tile_repeats"])
    assert cell["f7_boost"] and cell["k_effective"] == r * k and 16256 * r * k < 2**31
    boosted = a.clone()
    boosted[0] = (127 * torch.sign(w[int(w.to(torch.int64).abs().sum(1).argmax())].to(torch.int16))).to(torch.int8)
    tiled = exact_accumulator(boosted.repeat(1, r), w.repeat(1, r))
    assert 2**24 < int(tiled.abs().max()) < 2**31
    flags = fired(rows, "F7").loc[("tiny-acts", "F7", "all", "own")]
    assert flags[3] and not flags[2] and not flags[4]


def test_f7_that_cannot_be_induced_names_the_layer(settings: CampaignSettings) -> None:
    a = torch.zeros(2, 8, dtype=torch.int8)
    w = torch.zeros(3, 8, dtype=torch.int8)
    op = Operands("zero-layer", 0, "q_proj", a, torch.ones(2), w, torch.ones(3))
    with pytest.raises(InputError, match="zero-layer"):
        run_layer(op, settings)


def test_settings_refuse_a_catalogue_the_campaign_does_not_implement(protocol) -> None:
    from dataclasses import replace as dc_replace

    faults = dict(protocol.faults)
    faults["regimes"] = {"own": {"snap": None}, "pow2": {"snap": "ceiling"}}
    with pytest.raises(ProtocolError, match="regimes"):
        CampaignSettings.from_protocol(dc_replace(protocol, faults=faults))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_gives_the_same_cells(campaign_rows: pd.DataFrame, layers: list[Operands],
                                  settings: CampaignSettings) -> None:
    from int8alibi.faults import run_campaign

    gpu = run_campaign(layers, settings, torch.device("cuda"), progress=False)
    pd.testing.assert_frame_equal(gpu, campaign_rows)

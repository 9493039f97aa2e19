"""The column builder (``faults.rows``, ``checks.evaluate_columns``) gives the rows the tuple path
gave (``row_reference``): same values, dtypes and Parquet bytes, on the small layers, Qwen3-shaped
layers and the boundary layers (non-finite outputs without a finite pair, checks not applicable)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

import hashlib
from pathlib import Path

from int8alibi.faults.checks import CellEvidence, EvidenceColumns, OutputComparison, Thresholds, evaluate, evaluate_columns
from int8alibi.errors import InputError
from int8alibi.faults import CampaignSettings, run_campaign
from int8alibi.faults.campaign import CELLS_PER_LAYER
from int8alibi.faults.rows import check_layer
from int8alibi.kernels.layer_operands import Operands, synthetic_layers
from int8alibi.files.parquet import write_table
from int8alibi.protocol.definitions import MATRICES
from int8alibi.analysis.scoring import CELLS_KEY, CELLS_SCHEMA, cells_table, score

from .row_reference import reference_frame
from .test_batched import boundary_layers


def _digest(rows: pd.DataFrame, protocol, folder: Path) -> str:
    """SHA-256 of the cells table the faults stage writes from these rows."""
    cells = cells_table(score(rows, {m: protocol.matrix(m) for m in MATRICES}, False))
    path = folder / "cells.parquet"
    write_table(cells, path, CELLS_SCHEMA, CELLS_KEY)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _same_table(layers: list[Operands], settings: CampaignSettings, protocol, folder: Path) -> pd.DataFrame:
    reference = reference_frame(layers, settings)
    expected = _digest(reference, protocol, folder)
    for engine in ("cells", "batched"):
        built = run_campaign(layers, settings, "cpu", progress=False, engine=engine)
        assert built.dtypes.to_dict() == reference.dtypes.to_dict()
        pd.testing.assert_frame_equal(built, reference, check_exact=True)
        assert _digest(built, protocol, folder) == expected
    return reference


def test_small_layers(layers: list[Operands], settings: CampaignSettings, protocol, tmp_path: Path) -> None:
    _same_table(layers, settings, protocol, tmp_path)


def test_qwen3_shaped_layers(settings: CampaignSettings, protocol, tmp_path: Path) -> None:
    _same_table(list(synthetic_layers("qwen3-1.7b", m=8, seed=3, blocks=1)), settings, protocol, tmp_path)


def test_boundary_layers(settings: CampaignSettings, protocol, tmp_path: Path) -> None:
    layers, _ = boundary_layers()
    reference = _same_table(layers, settings, protocol, tmp_path)
    # The edge routes are in the table: cells without a finite pair (max_ulp missing, a float64
    # column), checks not applicable (fired None) and both outcomes of every applicable check.
    assert reference["max_ulp"].isna().any() and reference["max_ulp"].dtype == np.float64
    assert reference.loc[~reference["applicable"], "fired"].isna().all()
    for check in (1, 3, 4, 5, 6):
        assert set(reference.loc[(reference["check"] == check) & reference["applicable"], "fired"]) == {True, False}


def test_all_finite_table_keeps_integer_ulps(layers: list[Operands], settings: CampaignSettings,
                                             campaign_rows: pd.DataFrame) -> None:
    assert campaign_rows["max_ulp"].dtype == np.int64


def test_evaluate_columns_is_evaluate_on_every_edge() -> None:
    th = Thresholds()
    ks = ((256, 256), (256, 512), (2**17, 2**17), (2**17 - 1, 2**17))
    bound = th.f32_exact_bound
    grid = list(itertools.product(
        (True, False), ks, (0, bound, bound + 1), (True, False), (True, False),
        ((0, None, 10, 0), (3, 0, 0, 0), (3, 1, 0, 0), (3, 2, 2, 2), (10, None, 10, 4), (1, th.ulp_tolerance + 1, 0, 0))))
    cells = [CellEvidence(operands_identical=i, k=k, exact_absmax=a, accumulators=acc, scales_pow2=p,
                          outputs=OutputComparison(elements=10, differing=d, max_finite_ulp=u, nonfinite=nf,
                                                   finiteness_mismatch=mm))
             for i, k, a, acc, p, (d, u, nf, mm) in grid]
    columns = EvidenceColumns(
        operands_identical=np.array([c.operands_identical for c in cells]),
        k=np.array([c.k for c in cells], dtype=np.int64),
        exact_absmax=np.array([c.exact_absmax for c in cells], dtype=np.int64),
        accumulators=np.array([c.accumulators for c in cells]),
        scales_pow2=np.array([c.scales_pow2 for c in cells]),
        elements=np.array([c.outputs.elements for c in cells], dtype=np.int64),
        differing=np.array([c.outputs.differing for c in cells], dtype=np.int64),
        max_finite_ulp=np.array([-1 if c.outputs.max_finite_ulp is None else c.outputs.max_finite_ulp for c in cells],
                                dtype=np.int64),
        finiteness_mismatch=np.array([c.outputs.finiteness_mismatch for c in cells], dtype=np.int64))
    applicable, fired, reason = evaluate_columns(columns, th)
    expected = [evaluate(c, th) for c in cells]
    assert applicable.tolist() == [[r.applicable for r in rs] for rs in expected]
    assert fired.tolist() == [[r.fired for r in rs] for rs in expected]
    assert all(type(v) is bool or v is None for v in fired.reshape(-1))
    assert reason.tolist() == [[r.reason for r in rs] for rs in expected]
    assert {None, True, False} <= set(fired[:, 5].tolist())     # check 6 took every route


def test_a_layer_with_missing_cells_is_refused() -> None:
    check_layer("x", CELLS_PER_LAYER, CELLS_PER_LAYER)
    with pytest.raises(InputError, match="layer 'x'.*rows, expected"):
        check_layer("x", CELLS_PER_LAYER - 1, CELLS_PER_LAYER)

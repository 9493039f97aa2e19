"""The batched engine gives the per-cell engine's rows bit for bit: seeded layers of small and Qwen3
shapes, and boundary layers that take every data-dependent route (F7's boost, zero, overflowing
and subnormal scales, a NaN before a bf16 rounding, a wrapping accumulator, errors)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.faults import CampaignSettings, run_campaign
from int8alibi.faults.batched import draw_picks
from int8alibi.faults.run import resolve_engine
from int8alibi.kernels.layer_operands import Operands, synthetic_layers

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def both(layers: list[Operands], settings: CampaignSettings, device: str = "cpu") -> tuple[pd.DataFrame, pd.DataFrame]:
    cells = run_campaign(layers, settings, "cpu", progress=False, engine="cells")
    batched = run_campaign([op.to(device) for op in layers], settings, device, progress=False, engine="batched")
    return cells, batched


def boundary_layers() -> list[Operands]:
    g = torch.Generator().manual_seed(11)

    def ints(m: int, k: int, low: int = -128, high: int = 128) -> torch.Tensor:
        return torch.randint(low, high, (m, k), generator=g, dtype=torch.int8)

    m, k, n = 6, 256, 16
    tiny = ints(3, 4096, -1, 2)          # F7 needs a boosted row (see test_campaign)
    zero_row = ints(m, k)
    zero_row[2] = 0
    s_zero = torch.rand(m, generator=g) * 0.01
    s_zero[2] = 0.0                      # an all-zero activation row has scale 0
    s_huge = torch.full((n,), 1.0e38)    # acc * s_a * s_w overflows to inf
    s_sub = torch.full((m,), 1e-40)      # subnormal activation scales: the own regime runs, pow2 refuses
    pow2_w = torch.full((n,), 2.0**-7)
    extreme = torch.full((2, 65536), 127, dtype=torch.int8)   # |acc| near 2^30: F6 wraps at 2 repeats
    extreme[:, ::2] = -128
    extreme[1] = extreme[1].roll(1)
    return [
        Operands("tiny-acts", 0, "down_proj", tiny, torch.full((3,), 0.01), ints(5, 4096), torch.full((5,), 0.002)),
        Operands("zero-scale", 0, "q_proj", zero_row, s_zero, ints(n, k), torch.rand(n, generator=g) * 0.01),
        Operands("overflow", 0, "k_proj", ints(m, k), torch.full((m,), 1.0e30), ints(n, k), s_huge),
        Operands("pow2", 0, "v_proj", ints(m, k), torch.full((m,), 0.25), ints(n, k), pow2_w),
        Operands("extreme", 0, "o_proj", extreme, torch.full((2,), 0.03), extreme.clone(), torch.full((2,), 2e-9)),
    ], Operands("subnormal", 0, "q_proj", ints(m, k), s_sub, ints(n, k), pow2_w)


def test_small_layers_give_identical_rows(layers: list[Operands], settings: CampaignSettings,
                                          campaign_rows: pd.DataFrame) -> None:
    _, batched = both(layers, settings)
    pd.testing.assert_frame_equal(batched, campaign_rows, check_exact=True)


def test_qwen3_shaped_layers_give_identical_rows(settings: CampaignSettings) -> None:
    layers = list(synthetic_layers("qwen3-1.7b", m=8, seed=3, blocks=1))
    cells, batched = both(layers, settings)
    pd.testing.assert_frame_equal(batched, cells, check_exact=True)


def test_boundary_layers_give_identical_rows(settings: CampaignSettings) -> None:
    layers, _ = boundary_layers()
    cells, batched = both(layers, settings)
    pd.testing.assert_frame_equal(batched, cells, check_exact=True)
    # The routes were taken: a boosted F7, non-finite outputs, a power-of-two layer, F6 wrapping near 2^31.
    assert batched["f7_boost"].any()
    assert (batched.loc[batched["layer"] == "overflow", "nonfinite"] > 0).all()
    pow2 = batched[(batched["layer"] == "pow2") & (batched["check"] == 5) & (batched["fault"] != "F9")]
    assert pow2["applicable"].all()
    extreme = batched[(batched["layer"] == "extreme") & (batched["fault"] == "F6") & (batched["check"] == 4)]
    assert (extreme["tile_repeats"] == 3).all() and extreme["fired"].all()  # 2^31 / (32768 * 32513) = 2.02


def test_refusals_are_the_per_cell_engines(settings: CampaignSettings) -> None:
    """A layer the batched engine flags is rerun per cell, so the error is the same, word for word."""
    _, subnormal = boundary_layers()
    zero = Operands("zero-layer", 0, "q_proj", torch.zeros(2, 8, dtype=torch.int8), torch.ones(2),
                    torch.zeros(3, 8, dtype=torch.int8), torch.ones(3))
    negative = Operands("negative", 0, "q_proj", zero.a_q + 1, torch.tensor([0.5, -0.5]), zero.w_q + 1, torch.ones(3))
    for op in (subnormal, zero, negative):
        with pytest.raises(InputError) as per_cell:
            run_campaign([op], settings, progress=False, engine="cells")
        with pytest.raises(InputError) as batched:
            run_campaign([op], settings, progress=False, engine="batched")
        assert str(batched.value) == str(per_cell.value)


def test_draws_are_the_per_cell_engines(settings: CampaignSettings) -> None:
    picks = draw_picks("layer", 16, 32, 64, settings)
    assert picks.flat.size == sum(picks.sizes)
    again = draw_picks("layer", 16, 32, 64, settings)
    assert (picks.flat == again.flat).all() and picks.f9_one == again.f9_one
    total = 16 * 64
    # one position per "one" segment, ceil(fraction of M*N) and never below one per "pct" segment
    # (the fraction as faults.yaml pins it: 11 at 1%), each inside its slab
    sizes = pd.Series(picks.segment).value_counts().sort_index().tolist()
    assert sizes == [1, max(1, math.ceil(settings.pct_fraction * total))] * 10
    assert ((picks.flat // total) == picks.segment // 2).all()


def test_auto_engine_is_per_cell_on_cpu_and_batched_on_gpu() -> None:
    assert resolve_engine("auto", torch.device("cpu")) == "cells"
    assert resolve_engine("auto", torch.device("cuda")) == "batched"
    with pytest.raises(InputError, match="engine"):
        resolve_engine("fast", torch.device("cpu"))  # type: ignore[arg-type]


@CUDA
def test_gpu_batched_gives_the_cpu_rows(settings: CampaignSettings) -> None:
    layers = [*boundary_layers()[0], *synthetic_layers("qwen3-1.7b", m=32, seed=5, blocks=1)]
    cells, batched = both(layers, settings, "cuda")
    pd.testing.assert_frame_equal(batched, cells, check_exact=True)


def test_worker_processes_draw_what_the_per_cell_engine_draws(layers: list[Operands], settings: CampaignSettings,
                                                              campaign_rows: pd.DataFrame) -> None:
    from int8alibi.faults.batched import run_layers
    from int8alibi.faults.rows import CellColumns, frame

    cells = CellColumns.concat(list(run_layers(layers, settings, torch.device("cpu"), workers=2)))
    pd.testing.assert_frame_equal(frame(cells, settings.thresholds), campaign_rows, check_exact=True)


def test_batches_of_any_size_keep_the_layer_order(settings: CampaignSettings) -> None:
    from int8alibi.faults.batched import run_layers
    from int8alibi.faults.rows import CellColumns, frame

    layers = list(synthetic_layers("qwen3-1.7b", m=4, seed=9, blocks=2))
    cells = run_campaign(layers, settings, "cpu", progress=False, engine="cells")
    for batch in (1, 3):
        parts = list(run_layers(layers, settings, torch.device("cpu"), batch=batch))
        assert [p.layer[0] for p in parts] == [op.layer for op in layers]
        pd.testing.assert_frame_equal(frame(CellColumns.concat(parts), settings.thresholds), cells, check_exact=True)


def test_batch_size_stays_within_its_memory_share(settings: CampaignSettings) -> None:
    from int8alibi.campaign_budget import BATCH, MEMORY_SHARE
    from int8alibi.faults.batched import batch_size, layer_bytes

    cpu = torch.device("cpu")
    budget = 16 * 2**30 // MEMORY_SHARE  # the CPU's stand-in for device memory
    for m, k, n in ((4, 64, 32), (512, 2048, 2048), (512, 2048, 6144), (512, 6144, 2048), (4096, 6144, 6144)):
        size = batch_size(m, k, n, settings, cpu)
        assert 1 <= size <= BATCH
        assert size == 1 or size * layer_bytes(m, k, n, settings.tile_width) <= budget
        assert size == BATCH or (size + 1) * layer_bytes(m, k, n, settings.tile_width) > budget
    assert batch_size(4, 64, 32, settings, cpu, most=3) == 3
    # the largest term, F5's scaled partial sums: tiles x regimes x 4 bytes per output element
    assert layer_bytes(512, 6144, 2048, 128) > 48 * 2 * 4 * 512 * 2048

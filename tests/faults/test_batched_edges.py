"""The batched engine on the CPU against the per-cell engine, on edge layers built by hand: outputs
that overflow bf16 but not float32 (finiteness differs between the faults), a negative scale, a
scale whose nearest power of two is 2^128 and the largest one that is not, F6's depth where the
extreme accumulator is a power of two; and the batch's own route: which layers it computes on the
device and which it hands back to the per-cell engine. The GPU equivalence test is skipped on a
CPU machine, so these carry the cases there."""

from __future__ import annotations

import types

import pandas as pd
import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.faults import CampaignSettings, run_campaign
from int8alibi.faults import batched
from int8alibi.kernels.layer_operands import Operands

BF16_MAX = float.fromhex("0x1.fep127")      # largest finite bf16
F32_MAX = float.fromhex("0x1.fffffep127")   # largest finite float32


def _cells_and_batched(layers: list[Operands], settings: CampaignSettings) -> tuple[pd.DataFrame, pd.DataFrame]:
    cells = run_campaign(layers, settings, "cpu", progress=False, engine="cells")
    fast = run_campaign(layers, settings, "cpu", progress=False, engine="batched")
    return cells, fast


def _count_fallbacks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every layer the batched engine hands back to the per-cell engine."""
    handed: list[str] = []
    original = batched.run_layer_cells

    def counted(op: Operands, settings: CampaignSettings, device: torch.device):  # type: ignore[no-untyped-def]
        handed.append(op.layer)
        return original(op, settings, device)

    monkeypatch.setattr(batched, "run_layer_cells", counted)
    return handed


def _ramp(m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """acc[i, j] = i + 1 exactly: a_q[i] = i+1 in column 0 and zeros elsewhere, w_q = 1 in column 0;
    w_q's other columns alternate +-127 (they meet zeros, but let F7 boost a row, as the campaign needs)."""
    a = torch.zeros(m, k, dtype=torch.int8)
    a[:, 0] = torch.arange(1, m + 1, dtype=torch.int8)
    w = torch.ones(n, k, dtype=torch.int8)
    w[:, 1::2], w[:, 2::2] = 127, -127
    return a, w


def overflow_edge() -> Operands:
    """Outputs from far below to beyond bf16's largest finite value but within float32's: the
    reference (round to nearest) gives inf where F4 (toward zero) stays finite, so the two differ
    in finiteness without any NaN; and some products overflow float32 itself."""
    m, k, n = 8, 64, 4
    a, w = _ramp(m, k, n)
    # acc = 1..8; s_a * s_w puts acc = 6 just above the midpoint between bf16's largest value and
    # 2^128 (where round to nearest goes to inf), and acc = 7 beyond float32's largest value.
    s_w = torch.full((n,), 2.0**100)
    unit = (BF16_MAX + 2.0**119) * 1.001 / 6 / 2.0**100
    s_a = torch.full((m,), unit, dtype=torch.float32)
    return Operands("bf16-overflow", 0, "o_proj", a, s_a, w, s_w)


def test_outputs_overflowing_bf16_but_not_float32_give_the_per_cell_rows(settings: CampaignSettings,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    op = overflow_edge()
    y = (torch.arange(1, 9, dtype=torch.float32) * op.s_a) * op.s_w[0]
    assert (y[:5] < BF16_MAX).all() and bool(torch.isfinite(y[5])) and y[5] > BF16_MAX  # the edge is where meant
    assert not torch.isnan(y).any()
    handed = _count_fallbacks(monkeypatch)
    cells, fast = _cells_and_batched([op], settings)
    pd.testing.assert_frame_equal(fast, cells, check_exact=True)
    assert handed == []                                   # computed on the device path, no NaN flag
    assert (fast["nonfinite"] > 0).any()
    f4 = fast[(fast["fault"] == "F4") & (fast["severity"] == "all") & (fast["check"] == 6)]
    assert f4["fired"].all()                              # finiteness differs: check 6 sees it


@pytest.mark.parametrize(("s_a", "s_w"), [
    ([0.5, 0.25, -0.5, 1.0], [1.0, 1.0, 1.0]),
    ([1.0, 1.0, 1.0, 1.0], [1.0, -(2.0**-20), 1.0]),
])
def test_a_negative_scale_is_refused_with_the_per_cell_engines_words(settings: CampaignSettings, s_a: list[float],
                                                                    s_w: list[float],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    a, w = _ramp(4, 64, 3)
    op = Operands("negative", 0, "q_proj", a, torch.tensor(s_a), w, torch.tensor(s_w))
    handed = _count_fallbacks(monkeypatch)
    with pytest.raises(InputError) as per_cell:
        run_campaign([op], settings, "cpu", progress=False, engine="cells")
    with pytest.raises(InputError) as fast:
        run_campaign([op], settings, "cpu", progress=False, engine="batched")
    assert str(fast.value) == str(per_cell.value) and "negative" in str(per_cell.value)
    assert handed == ["negative"]                         # flagged on the device, then refused per cell


def test_a_minus_zero_scale_is_a_zero_scale_on_both_engines(settings: CampaignSettings,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    a, w = _ramp(4, 64, 3)
    a[2] = 0                                              # the row a zero activation scale belongs to
    op = Operands("minus-zero", 0, "q_proj", a, torch.tensor([1.0, 0.5, -0.0, 0.25]), w, torch.ones(3))
    handed = _count_fallbacks(monkeypatch)
    cells, fast = _cells_and_batched([op], settings)
    pd.testing.assert_frame_equal(fast, cells, check_exact=True)
    assert handed == []


def _float32(exponent_field: int, fraction: int) -> float:
    return torch.tensor([(exponent_field << 23) | fraction], dtype=torch.int32).view(torch.float32).item()


# sqrt(2) * 2^127 splits "nearest power of two" between 2^127 and 2^128: the least significand
# 1.f with (1.f)^2 >= 2 is 11863284 / 2^23 (11863284^2 >= 2^47 > 11863283^2).
LAST_TO_2_127 = _float32(254, 11863283 - 2**23)
FIRST_TO_2_128 = _float32(254, 11863284 - 2**23)


def test_the_largest_scales_snap_as_the_per_cell_engine_snaps(settings: CampaignSettings,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert 11863283**2 < 2**47 <= 11863284**2
    a, w = _ramp(3, 64, 2)
    tiny_a = torch.full((3,), 2.0**-140 * 2**14)          # keeps acc * s_a * s_w finite
    kept = Operands("to-2^127", 0, "v_proj", a, tiny_a, w, torch.tensor([LAST_TO_2_127, 1.0]))
    handed = _count_fallbacks(monkeypatch)
    cells, fast = _cells_and_batched([kept], settings)
    pd.testing.assert_frame_equal(fast, cells, check_exact=True)
    assert handed == []
    lost = Operands("to-2^128", 0, "v_proj", a, tiny_a, w, torch.tensor([FIRST_TO_2_128, 1.0]))
    with pytest.raises(InputError) as per_cell:
        run_campaign([lost], settings, "cpu", progress=False, engine="cells")
    with pytest.raises(InputError) as fast_error:
        run_campaign([lost], settings, "cpu", progress=False, engine="batched")
    assert str(fast_error.value) == str(per_cell.value)
    assert handed == ["to-2^128"]


def _extremes(values: list[int], k: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Operands whose accumulator column 0 is ``values`` and column 1 is zero: a_q[i] is +-1 over its
    first |values[i]| columns (|values[i]| even), w_q row 0 is ones, row 1 alternates +-127 (so F7
    can be induced by boosting row 0, as the campaign needs)."""
    a = torch.zeros(len(values), k, dtype=torch.int8)
    for i, v in enumerate(values):
        assert v % 2 == 0
        a[i, : abs(v)] = 1 if v > 0 else -1
    w = torch.ones(2, k, dtype=torch.int8)
    w[1, 0::2], w[1, 1::2] = 127, -127
    return a, w


@pytest.mark.parametrize(("values", "repeats"), [
    ([1024, 4], 2**21),             # top = 2^10: 2^21 * 2^10 = 2^31 is the first product past int32's max
    ([-1024, 4], 2**21 + 1),        # bottom = 2^10: -2^31 still fits, one more repeat wraps
    ([512, -1024], 2**21 + 1),      # the negative side decides: ceil(2^31 / 512) = 2^22 is later
    ([1000, -6], 2147484),          # neither a power of two: ceil(2^31 / 1000)
])
def test_f6_depth_where_the_extreme_accumulator_is_a_power_of_two(settings: CampaignSettings, values: list[int],
                                                                   repeats: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    a, w = _extremes(values)
    acc = a.double() @ w.double().T
    assert acc[:, 0].tolist() == values and acc[:, 1].tolist() == [0.0] * len(values)
    op = Operands(f"f6-{values[0]}", 0, "up_proj", a, torch.full((len(values),), 0.5), w, torch.full((2,), 0.25))
    handed = _count_fallbacks(monkeypatch)
    cells, fast = _cells_and_batched([op], settings)
    pd.testing.assert_frame_equal(fast, cells, check_exact=True)
    assert handed == []
    f6 = fast[fast["fault"] == "F6"]
    assert len(f6) and (f6["tile_repeats"] == repeats).all()


def test_each_edge_layer_takes_the_device_path_unless_a_nan_meets_a_rounding(
        settings: CampaignSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flag is for where the per-cell engine takes another route; raising it more often would
    keep the answers (the per-cell engine gives them) and lose the batching, so it is tested, layer
    by layer (one flagged layer sends its whole batch back)."""
    from .test_batched import boundary_layers

    valid, subnormal = boundary_layers()
    for op in valid:
        handed = _count_fallbacks(monkeypatch)
        cells, fast = _cells_and_batched([op], settings)
        pd.testing.assert_frame_equal(fast, cells, check_exact=True)
        # 'overflow': s_a * s_w = 1e68 is inf in float32, and F3 multiplies it by zero accumulators.
        assert handed == (["overflow"] if op.layer == "overflow" else []), op.layer
    handed = _count_fallbacks(monkeypatch)
    with pytest.raises(InputError):
        run_campaign([subnormal], settings, "cpu", progress=False, engine="batched")
    assert handed == ["subnormal"]


# ------------------------------------------------------------------ batch sizing against the device


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, total_memory: int) -> torch.device:
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(
        total_memory=total_memory))
    return torch.device("cuda")


def test_batch_size_follows_the_devices_memory(settings: CampaignSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    m, k, n = 512, 2048, 2048
    one = batched.layer_bytes(m, k, n, settings.tile_width)
    # an eighth of the device's memory is what a batch may take
    for layers in (1, 3, 7):
        device = _fake_cuda(monkeypatch, 8 * layers * one)
        assert batched.batch_size(m, k, n, settings, device) == layers
        device = _fake_cuda(monkeypatch, 8 * layers * one - 8)
        assert batched.batch_size(m, k, n, settings, device) == max(1, layers - 1)
    assert batched.batch_size(m, k, n, settings, _fake_cuda(monkeypatch, 4 * one)) == 1    # never zero
    assert batched.batch_size(m, k, n, settings, _fake_cuda(monkeypatch, 2**50)) == 8     # at most 8 layers
    assert batched.batch_size(m, k, n, settings, _fake_cuda(monkeypatch, 2**50), most=3) == 3
    # the CPU counts as a 16 GiB device: 2 GiB per batch
    cpu = torch.device("cpu")
    assert batched.batch_size(m, k, n, settings, cpu) == min(8, 2**31 // one)


def test_layer_bytes_covers_the_batchs_largest_tensors(settings: CampaignSettings) -> None:
    """The estimate is at least what the batch's big tensors of one layer take (counted here from
    their shapes): the stacked bf16 outputs and reference, F5's float32 partial sums and terms of
    both regimes, the int64 accumulators, the float64 operand copies."""
    for m, k, n in ((512, 2048, 2048), (16, 320, 48), (1, 128, 1)):
        tiles = -(-k // settings.tile_width)
        outputs = (len(batched.SLABS) + 1) * 2 * m * n * 2
        f5 = tiles * m * n * 4 + tiles * 2 * m * n * 4
        accumulators = 8 * m * n
        operands64 = (m + n) * k * 8
        padded32 = (m + n) * tiles * settings.tile_width * 4
        assert batched.layer_bytes(m, k, n, settings.tile_width) >= outputs + f5 + accumulators + operands64 + padded32


def test_the_measured_configuration_fits_and_a_small_device_takes_fewer(settings: CampaignSettings,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight Qwen3-1.7B layers (M = 512) per batch ran on an H200 (141 GB) within 10 GiB; a 16 GiB
    device must take fewer than eight of the widest ones, and any device at least one."""
    shapes = [(512, 2048, 2048), (512, 2048, 6144), (512, 6144, 2048)]     # q/o, gate/up, down
    for m, k, n in shapes:
        assert batched.batch_size(m, k, n, settings, _fake_cuda(monkeypatch, 141 * 10**9)) == 8
    assert 1 <= batched.batch_size(512, 2048, 6144, settings, _fake_cuda(monkeypatch, 16 * 2**30)) < 8
    assert batched.batch_size(512, 2048, 6144, settings, _fake_cuda(monkeypatch, 2**30)) == 1


# ------------------------------------------------------------------ batch sizing against the run's budget

def test_a_budget_sizes_the_batches_instead_of_the_device(settings: CampaignSettings,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    m, k, n = 512, 2048, 2048
    one = batched.layer_bytes(m, k, n, settings.tile_width)
    big = _fake_cuda(monkeypatch, 2**50)
    assert batched.batch_size(m, k, n, settings, big, budget=8 * 3 * one) == 3
    assert batched.batch_size(m, k, n, settings, torch.device("cpu"), budget=8 * 2 * one) == 2
    assert batched.batch_size(m, k, n, settings, big, budget=one) == 1  # never zero


def test_a_small_budget_gives_the_same_rows_in_batches_within_its_share(settings: CampaignSettings,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched campaign under a budget of one widest layer's batch gives the rows of the
    unconstrained one (and of the per-cell engine), bit for bit; every batch it enqueues holds at most
    the budget's ``MEMORY_SHARE``-th by ``layer_bytes``, while unconstrained (2 GiB per batch on the
    CPU) it batches several layers, so the bound is the budget's doing. (Host RSS is no measure here:
    on the CPU the batch's tensors are far below ``layer_bytes``, an upper estimate for the device.)"""
    from int8alibi.kernels.layer_operands import synthetic_layers

    layers = list(synthetic_layers("qwen3-1.7b", m=8, seed=5, blocks=2))
    sizes = {op.layer: batched.layer_bytes(op.a_q.shape[0], op.a_q.shape[1], op.w_q.shape[0], settings.tile_width)
             for op in layers}
    budget = batched.MEMORY_SHARE * max(sizes.values())
    held: list[int] = []
    enqueue = batched._enqueue
    monkeypatch.setattr(batched, "_enqueue", lambda ops, *rest: held.append(sum(sizes[o.layer] for o in ops))
                        or enqueue(ops, *rest))
    free = run_campaign(layers, settings, "cpu", progress=False, engine="batched")
    free_peak, held[:] = max(held), []
    small = run_campaign(layers, settings, "cpu", progress=False, engine="batched", budget=budget)
    pd.testing.assert_frame_equal(small, free, check_exact=True)
    pd.testing.assert_frame_equal(small, run_campaign(layers, settings, "cpu", progress=False, engine="cells"),
                                  check_exact=True)
    assert max(held) <= budget // batched.MEMORY_SHARE < free_peak

"""The injection arm: each copy is the campaign's reference pipeline with its fault, exactly as the
catalogue defines it, whatever else shares the batch; exact accumulators at the depth boundaries;
and the power-of-two identities that the pinned predictions rely on."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from int8alibi.arith import exact_accumulator, snap_pow2, wrap_int32
from int8alibi.faults.checks import Thresholds
from int8alibi.errors import InputError
from int8alibi.faults import catalogue as cat
from int8alibi.faults.campaign import CampaignSettings, cell_rng
from int8alibi.faults.catalogue import fraction_count
from int8alibi.faults.pipeline import epilogue, reference
from int8alibi.protocol import load
from int8alibi.tokens.inject import Cell, InjectionArm, cells, exact_int

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
SETTINGS = CampaignSettings.from_protocol(load(ROOT / "preregistration"))
LAYER, WINDOW = "model.layers.0.mlp.down_proj", 3


def operands(m: int, k: int, n: int, seed: int = 0, amax: int = 127) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    a_q = torch.randint(-amax, amax + 1, (m, k), generator=g, dtype=torch.int8)
    w_q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s_a = torch.rand(m, generator=g) * 0.05 + 1e-3
    s_w = (torch.rand(n, generator=g) * 0.01 + 1e-4).to(torch.bfloat16).to(torch.float32)
    return a_q, w_q, s_a, s_w


def run(copies: list[Cell | None], a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
        rows: int | None = None, settings: CampaignSettings = SETTINGS) -> torch.Tensor:
    arm = InjectionArm(copies, rows or a_q.shape[0], LAYER, WINDOW, settings, CPU)
    return arm.scaled_mm(a_q, w_q, s_a, s_w)


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16)


def same(x: torch.Tensor, y: torch.Tensor) -> bool:
    return bool(torch.equal(bits(x), bits(y)))


def test_the_reference_copy_is_the_campaign_reference_pipeline() -> None:
    a_q, w_q, s_a, s_w = operands(16, 96, 48)
    assert same(run([None], a_q, w_q, s_a, s_w), reference(a_q, w_q, s_a, s_w)[1])
    assert same(run([Cell("F8", "all", "own")], a_q, w_q, s_a, s_w), reference(a_q, w_q, s_a, s_w)[1])


@pytest.mark.parametrize("fault", ["F1", "F2", "F3", "F4", "F5"])
def test_epilogue_faults_at_every_severity(fault: str) -> None:
    a_q, w_q, s_a, s_w = operands(24, 300, 40, seed=2)      # K = 300: F5 sums three tiles, the last short
    acc_f32 = wrap_int32(exact_accumulator(a_q, w_q)).to(torch.float32)
    y_fault = cat.epilogue_fault(fault, acc_f32, s_a, s_w, lambda: cat.fused_reduction(a_q, w_q, s_w, 128))
    y_ref = reference(a_q, w_q, s_a, s_w)[1]
    assert same(run([Cell(fault, "all", "own")], a_q, w_q, s_a, s_w), y_fault)
    for severity, reach in (("one", 1), ("pct", fraction_count(Fraction("0.01"), y_ref.numel()))):
        out = run([Cell(fault, severity, "own")], a_q, w_q, s_a, s_w)
        shows_fault = bits(out) == bits(y_fault)
        shows_ref = bits(out) == bits(y_ref)
        assert bool((shows_fault | shows_ref).all())       # every element is one arm's or the other's
        assert int((~shows_ref).sum()) <= reach             # the fault shows at most where it was placed
        assert int((shows_fault & ~shows_ref).sum()) == int((~shows_ref).sum())


def test_picks_are_keyed_by_the_fault_site() -> None:
    """Picks are keyed by the site (layer, window) and the cell: another window draws elsewhere."""
    a_q, w_q, s_a, s_w = operands(32, 64, 64, seed=3)
    cell = Cell("F4", "pct", "own")
    one = InjectionArm([cell], 32, LAYER, 0, SETTINGS, CPU).scaled_mm(a_q, w_q, s_a, s_w)
    again = InjectionArm([cell], 32, LAYER, 0, SETTINGS, CPU).scaled_mm(a_q, w_q, s_a, s_w)
    other = InjectionArm([cell], 32, LAYER, 1, SETTINGS, CPU).scaled_mm(a_q, w_q, s_a, s_w)
    assert same(one, again) and not same(one, other)


def test_every_copy_in_a_batch_is_what_it_would_be_alone() -> None:
    rows = 8
    every = [None, *cells("own")]
    blocks = [operands(rows, 200, 32, seed=10 + i) for i in range(len(every))]
    a_q = torch.cat([b[0] for b in blocks])
    s_a = torch.cat([b[2] for b in blocks])
    _, w_q, _, s_w = blocks[0]
    batched = run(every, a_q, w_q, s_a, s_w, rows=rows)
    for i, cell in enumerate(every):
        alone = run([cell], blocks[i][0], w_q, blocks[i][2], s_w)
        assert same(batched[i * rows:(i + 1) * rows], alone), cell


def test_f6_wraps_at_the_least_depth_and_f7_passes_two_to_the_24_below_two_to_the_31() -> None:
    a_q, w_q, s_a, s_w = operands(8, 64, 16, seed=4)
    exact = exact_accumulator(a_q, w_q)
    th = SETTINGS.thresholds
    r6, r7 = (int(cat.inflate(f, exact, a_q, w_q, lambda rows: exact_accumulator(rows, w_q), th).repeats)
              for f in ("F6", "F7"))

    def wraps(acc: torch.Tensor) -> bool:
        return bool(((acc > 2**31 - 1) | (acc < -(2**31))).any())

    assert wraps(exact * r6) and not wraps(exact * (r6 - 1))
    assert same(run([Cell("F6", "all", "own")], a_q, w_q, s_a, s_w), epilogue(wrap_int32(exact * r6), s_a, s_w))
    assert th == Thresholds.from_protocol(load(ROOT / "preregistration").thresholds)
    assert int((exact * r7).abs().max()) > 2**24 >= int((exact * (r7 - 1)).abs().max())
    assert th.product_bound * r7 * 64 < 2**31
    assert same(run([Cell("F7", "all", "own")], a_q, w_q, s_a, s_w), epilogue((exact * r7).to(torch.int32), s_a, s_w))


def test_f7_boosts_row_zero_when_depth_alone_cannot_pass_two_to_the_24() -> None:
    a_q, w_q, s_a, s_w = operands(4, 1536, 8, seed=5, amax=2)   # small activations: r would break the int32 bound
    exact = exact_accumulator(a_q, w_q)
    th = SETTINGS.thresholds
    assert th.product_bound * (th.f32_exact_bound // int(exact.abs().max()) + 1) * 1536 >= th.int32_limit
    j = int(w_q.to(torch.int64).abs().sum(1).argmax())
    exact_b = exact.clone()
    exact_b[0] = exact_accumulator((127 * torch.sign(w_q[j:j + 1].to(torch.int16))).to(torch.int8), w_q)[0]
    r = th.f32_exact_bound // int(exact_b.abs().max()) + 1
    assert th.product_bound * r * 1536 < th.int32_limit
    out = run([Cell("F7", "all", "own")], a_q, w_q, s_a, s_w)
    assert same(out, epilogue((exact_b * r).to(torch.int32), s_a, s_w))


def test_f9_rungs_run_the_reference_on_other_operands() -> None:
    a_q, w_q, s_a, s_w = operands(20, 80, 24, seed=6)
    a_q[0, :5] = 127                                              # f9 steps down at the top of the range
    assert same(run([Cell("F9", "all", "own")], a_q, w_q, s_a, s_w), reference(cat.step_all(a_q), w_q, s_a, s_w)[1])
    arm = InjectionArm([Cell("F9", "one", "own")], 20, LAYER, WINDOW, SETTINGS, CPU)
    rng = cell_rng(SETTINGS.seed, arm.site, "F9", "one", "own")
    row, col = int(rng.integers(20)), int(rng.integers(80))
    moved = cat.stepped_operand(a_q, row, col, -1 if int(a_q[row, col]) == 127 else 1)
    one = arm.scaled_mm(a_q, w_q, s_a, s_w)
    assert same(one, reference(moved, w_q, s_a, s_w)[1])
    changed_rows = (bits(one) != bits(reference(a_q, w_q, s_a, s_w)[1])).any(dim=1).nonzero().flatten().tolist()
    assert changed_rows in ([], [row])
    rng = cell_rng(SETTINGS.seed, arm.site, "F9", "pct", "own")
    rows = np.sort(rng.choice(20, size=fraction_count(SETTINGS.pct_fraction, 20), replace=False, shuffle=False))
    pct = run([Cell("F9", "pct", "own")], a_q, w_q, s_a, s_w)
    assert same(pct, reference(a_q, w_q, cat.nudge_scales(s_a, torch.as_tensor(rows)), s_w)[1])


def test_under_power_of_two_weight_scales_f2_f3_f5_give_the_reference_bits() -> None:
    """The reason the pinned predictions expect these cells unobservable in the pow2 regime (activation
    scales stay real there), checked on realistic operands; F1 and F4 still differ."""
    a_q, w_q, s_a, s_w = operands(64, 576, 96, seed=8)
    s_w2 = snap_pow2(s_w, "nearest")
    y_ref = reference(a_q, w_q, s_a, s_w2)[1]
    for fault in ("F2", "F3", "F5"):
        assert same(run([Cell(fault, "all", "pow2")], a_q, w_q, s_a, s_w2), y_ref), fault
    for fault in ("F1", "F4"):
        assert not same(run([Cell(fault, "all", "pow2")], a_q, w_q, s_a, s_w2), y_ref), fault


@pytest.mark.parametrize("k", [1023, 1024, 1025])
def test_exact_accumulator_at_the_float32_depth_boundary(k: int) -> None:
    """16384 * 1024 = 2^24: up to K = 1024 one float32 matmul is exact, beyond it the exact path runs."""
    extreme = torch.full((2, k), -128, dtype=torch.int8)
    w_q = torch.full((3, k), -128, dtype=torch.int8)
    w_q[1] = 127
    w_q[2, ::2] = 127
    acc = exact_int(extreme, w_q)
    assert acc.dtype == torch.int64 and torch.equal(acc, exact_accumulator(extreme, w_q))
    assert int(acc[0, 0]) == 16384 * k
    a_q, w_r, _, _ = operands(5, k, 7, seed=k)
    assert torch.equal(exact_int(a_q, w_r), exact_accumulator(a_q, w_r))


def test_the_depth_bound_wraps_exactly_where_int8_products_can_leave_int32() -> None:
    k = 2**31 // 16384                                    # 131072: 16384 * k = 2^31, just past int32
    a_q = torch.full((1, k), -128, dtype=torch.int8)
    exact = exact_accumulator(a_q, a_q)
    assert int(exact) == 2**31 and int(wrap_int32(exact, bound=k * 16384)) == -(2**31)
    small = torch.tensor([[2**31 - 1]], dtype=torch.int64)
    assert int(wrap_int32(small, bound=(k - 1) * 16384)) == 2**31 - 1


def test_bad_cells_and_shapes_are_refused() -> None:
    with pytest.raises(InputError, match="F6 has no severity 'one'"):
        InjectionArm([Cell("F6", "one", "own")], 4, LAYER, 0, SETTINGS, CPU)
    a_q, w_q, s_a, s_w = operands(6, 32, 8)
    with pytest.raises(InputError, match="6 rows reached the injection arm, expected 2 copies x 4 tokens"):
        run([None, None], a_q, w_q, s_a, s_w, rows=4)

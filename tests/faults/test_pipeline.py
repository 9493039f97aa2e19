"""The reference pipeline: fast bf16 casts equal the integer-bit reference, kernel semantics at boundaries."""

from __future__ import annotations

import pytest
import torch

from int8alibi.arith import bf16_round, exact_accumulator, wrap_int32
from int8alibi.errors import InputError
from int8alibi.faults.pipeline import (as_scales, bf16_rne, bf16_rtz, epilogue, float32_tiles, reference,
                                       regime_scales, tile_partial_sums)
from int8alibi.kernels.registry import get

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def every_neighbourhood() -> torch.Tensor:
    """Every bf16 pattern as the top half of a float32, with low halves that hit each rounding case:
    exact (0), just above/below the midpoint, the midpoint itself (ties) and just below the next
    value. Covers zeros, subnormals, the largest finite values (overflow under rne) and inf; NaN
    patterns are dropped (the fast path hands them to the reference, tested separately)."""
    high = torch.arange(0, 1 << 16, dtype=torch.int64) << 16
    low = torch.tensor([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int64)
    bits = (high[:, None] | low[None, :]).reshape(-1)
    values = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)
    return values[~torch.isnan(values)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["rne", "rtz"])
def test_fast_casts_equal_the_integer_reference_everywhere(device: str, mode: str) -> None:
    x = every_neighbourhood().to(device)
    fast = bf16_rne(x) if mode == "rne" else bf16_rtz(x)
    ref = bf16_round(x, mode)
    assert torch.equal(fast.view(torch.int16), ref.view(torch.int16))


@pytest.mark.parametrize("mode", ["rne", "rtz"])
def test_nan_goes_through_the_reference_and_keeps_sign_and_payload(mode: str) -> None:
    bits = torch.tensor([0x7FC00000, 0xFFC12345 - 2**32, 0x7F800001, 0x3F800000], dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32)
    fast = bf16_rne(x) if mode == "rne" else bf16_rtz(x)
    assert torch.equal(fast.view(torch.int16), bf16_round(x, mode).view(torch.int16))
    assert bool(torch.isnan(fast[:3]).all())  # 0x7F800001 has its payload in the dropped bits only


def test_casts_refuse_other_dtypes() -> None:
    with pytest.raises(InputError, match="float32"):
        bf16_rne(torch.zeros(2, dtype=torch.float64))


def test_epilogue_rounds_the_accumulator_to_float32_like_hardware() -> None:
    # 2^24 + 2^16 + 1 is not a float32: the conversion rounds it (a tie) to 2^24 + 2^16, which is
    # itself the bf16 tie between 2^24 and 2^24 + 2^17 and goes to even, 2^24. Rounding the exact
    # value once would give 2^24 + 2^17: the kernel's two roundings are what arm A must reproduce.
    acc = torch.tensor([[2**24 + 2**16 + 1, 2**24 + 2**16 + 3, -(2**31)]], dtype=torch.int32)
    y = epilogue(acc, torch.ones(1), torch.ones(3))
    assert y.float().tolist() == [[2.0**24, 2.0**24 + 2**17, -(2.0**31)]]


def test_reference_wraps_an_overflowing_accumulator() -> None:
    k = 133_200  # 127 * 127 * k = 2,148,382,800 > 2^31 - 1: the int32 register wraps
    a = torch.full((1, k), 127, dtype=torch.int8)
    w = torch.full((1, k), 127, dtype=torch.int8)
    acc32, y = reference(a, w, torch.ones(1), torch.ones(1))
    assert acc32.item() == 127 * 127 * k - 2**32
    assert y.item() < 0  # the wrapped value is what the epilogue scales
    assert wrap_int32(torch.tensor([2**31 - 1, 2**31, -(2**31), -(2**31) - 1])).tolist() == [
        2**31 - 1, -(2**31), -(2**31), 2**31 - 1]


@pytest.mark.parametrize("device", DEVICES)
def test_reference_is_bitwise_the_triton_order_arm(device: str) -> None:
    """(acc*s_a)*s_w is Triton's s_w*(s_a*acc): an independent implementation must give the same bits."""
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-127, 128, (8, 300), generator=g, dtype=torch.int8).to(device)
    w = torch.randint(-128, 128, (24, 300), generator=g, dtype=torch.int8).to(device)
    s_a = (torch.rand(8, generator=g) * 1e-2 + 1e-4).to(device)
    s_w = (torch.rand(24, generator=g) * 1e-3 + 1e-5).to(torch.bfloat16).to(torch.float32).to(device)
    _, y = reference(a, w, s_a, s_w)
    arm = get("exact-triton-order", device)
    assert torch.equal(y.view(torch.int16), arm.scaled_mm(a, w, s_a, s_w).view(torch.int16))


def test_as_scales_accepts_checkpoint_layout_and_refuses_bad_scales() -> None:
    s = torch.tensor([[0.5], [0.25]], dtype=torch.bfloat16)
    assert as_scales(s, 2, "w").tolist() == [0.5, 0.25]
    with pytest.raises(InputError, match="layer x s_w: scales of shape"):
        as_scales(torch.ones(3), 2, "layer x s_w")
    with pytest.raises(InputError, match="negative or not finite"):
        as_scales(torch.tensor([1.0, float("nan")]), 2, "s")
    with pytest.raises(InputError, match="negative or not finite"):
        as_scales(torch.tensor([1.0, -1.0]), 2, "s")
    with pytest.raises(InputError, match="float32 or bfloat16"):
        as_scales(torch.ones(2, dtype=torch.float64), 2, "s")


def test_pow2_regime_snaps_to_nearest_and_keeps_zero() -> None:
    s = torch.tensor([0.0, 1.0, 1.4142, 1.4143, 3.0e-3, 6.0])
    snapped = regime_scales(s, "pow2", "s")
    assert snapped.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0**-8, 8.0]
    assert regime_scales(s, "own", "s") is s
    with pytest.raises(InputError, match="unknown scale regime"):
        regime_scales(s, "ceiling", "s")  # type: ignore[arg-type]


@pytest.mark.parametrize("width", [128, 100, 2048])
def test_tile_partial_sums_are_exact_and_sum_to_the_accumulator(width: int) -> None:
    """Extreme operands: every product is (-128)*(-128) = 2^14, so a 128-wide tile sums to 2^21;
    the CPU's exact route, the GPU's float32 route (width <= 1024) and wide tiles must all be exact."""
    k = 2200
    a = torch.full((3, k), -128, dtype=torch.int8)
    w = torch.full((5, k), -128, dtype=torch.int8)
    w[1] = 127
    parts = list(tile_partial_sums(a, w, width))
    assert len(parts) == -(-k // width)
    if width * 16384 <= 2**24:  # the GPU's float32 route gives the same exact sums
        assert all(torch.equal(p, q) for p, q in zip(parts, float32_tiles(a, w, width), strict=True))
    for i, part in enumerate(parts):
        cols = slice(i * width, (i + 1) * width)
        assert part.dtype == torch.float32
        assert torch.equal(part.to(torch.int64), exact_accumulator(a[:, cols], w[:, cols]))
    if width == 2048:  # the exact path: 2048 * 2^14 = 2^25 is past 2^24 yet a float32
        assert parts[0][0, 0].item() == 2.0**25
    total = torch.stack([p.to(torch.float64) for p in parts]).sum(0).to(torch.int64)
    assert torch.equal(total, exact_accumulator(a, w))
    with pytest.raises(InputError, match="tile width"):
        list(tile_partial_sums(a, w, 0))

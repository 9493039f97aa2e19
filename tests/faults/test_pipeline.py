"""The reference pipeline: kernel semantics at boundaries, scales, tile sums."""

from __future__ import annotations

import pytest
import torch

from int8alibi.arith import exact_accumulator, wrap_int32
from int8alibi.errors import InputError
from int8alibi.faults.pipeline import (as_scales, epilogue, float32_tiles, reference, regime_scales,
                                       tile_partial_sums)
from int8alibi.kernels.registry import get

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


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

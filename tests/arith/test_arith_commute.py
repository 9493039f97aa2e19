"""Scaling by a power of two commutes with bf16 rounding for normal values, and fails for subnormals.

This is the arithmetic behind the pow2 prediction: with power-of-two scales, rounding then scaling
equals scaling then rounding, so the epilogue order cannot matter, except where the result leaves
the normal range.
"""

from __future__ import annotations

import pytest
import torch

from int8alibi.arith import bf16_bits, bf16_round

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))]
NORMAL = torch.arange(-126, 128, dtype=torch.int64)


def f32(exponent: torch.Tensor, frac: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """float32 from fields (broadcast): (-1)^negative * (1 + frac/2^23) * 2^exponent."""
    bits = ((exponent + 127) << 23) | frac
    return torch.where(negative, bits - 2**31, bits).to(torch.int32).view(torch.float32)


def sweep(device: str, target_exponents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Values x at every normal exponent and scales 2^k with every normal k whose product lands at an
    exponent in ``target_exponents``; float32 significands random, with forced bf16 ties."""
    gen = torch.Generator().manual_seed(8)
    frac = torch.randint(0, 2**23, (12,), generator=gen, dtype=torch.int64)
    frac[:4] = (frac[:4] & ~0xFFFF) | 0x8000  # exactly halfway between two bf16 values
    frac[4:6] = (frac[4:6] | 0xFFFF) & (2**23 - 1)  # round-up that carries into the exponent
    ex, k, fr = torch.meshgrid(NORMAL, NORMAL, frac, indexing="ij")
    keep = torch.isin(ex + k, target_exponents)
    ex, k, fr = ex[keep], k[keep], fr[keep]
    negative = torch.arange(fr.numel()) % 2 == 1
    x = f32(ex, fr, negative)
    scale = f32(k, torch.zeros_like(k), torch.zeros_like(negative))
    return x.to(device), scale.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["rne", "rtz"])
def test_pow2_scaling_commutes_with_rounding_over_the_whole_normal_range(device: str, mode: str) -> None:
    x, scale = sweep(device, NORMAL[:-1])  # products up to 2^126 * 1.99..: the rounded value stays finite
    assert x.numel() > 500_000  # every (exponent, scale) pair with a normal product, 12 significands each
    scaled_then_rounded = bf16_round(x * scale, mode)  # x * scale is exact: the product is normal
    rounded_then_scaled = bf16_round(bf16_round(x, mode).float() * scale, mode)
    assert torch.equal(bf16_bits(scaled_then_rounded), bf16_bits(rounded_then_scaled))

    zeros = torch.tensor([0.0, -0.0], device=device).repeat_interleave(NORMAL.numel())
    zero_scales = torch.exp2(NORMAL.double()).float().repeat(2).to(device)
    left = bf16_round(zeros * zero_scales, mode)
    right = bf16_round(bf16_round(zeros, mode).float() * zero_scales, mode)
    assert torch.equal(bf16_bits(left), bf16_bits(right))
    assert int(torch.signbit(left).sum()) == NORMAL.numel()  # -0 stayed -0 at every scale


def test_a_subnormal_result_breaks_commutation() -> None:
    x = torch.tensor([1.5 - 2**-10], dtype=torch.float32)  # bf16 rounds it up to 1.5
    scale = torch.tensor([2.0**-133], dtype=torch.float32)  # bf16's smallest subnormal
    assert (x * scale).double().item() == (1.5 - 2**-10) * 2.0**-133  # the float32 product is still exact
    scaled_then_rounded = bf16_round(x * scale, "rne")  # 1.4990*2^-133: nearest subnormal is 2^-133
    rounded_then_scaled = bf16_round(bf16_round(x, "rne").float() * scale, "rne")  # 1.5*2^-133: tie -> 2^-132
    assert scaled_then_rounded.double().item() == 2.0**-133
    assert rounded_then_scaled.double().item() == 2.0**-132
    assert not torch.equal(bf16_bits(scaled_then_rounded), bf16_bits(rounded_then_scaled))


def test_nearest_rounding_fails_often_in_the_subnormal_range_but_truncation_does_not() -> None:
    # Products landing at exponents -133..-127 (bf16 subnormals); keep those float32 forms exactly,
    # so only the bf16 rounding is under test.
    x, scale = sweep("cpu", torch.arange(-133, -126))
    exact = (x * scale).double() == x.double() * scale.double()
    x, scale = x[exact], scale[exact]
    assert x.numel() > 1000
    product = x * scale
    rounded_then_scaled = bf16_round(bf16_round(x, "rne").float() * scale, "rne")
    differs = bf16_bits(bf16_round(product, "rne")) != bf16_bits(rounded_then_scaled)
    assert int(differs.sum()) > 0
    # Truncation composes on nested grids (the subnormal grid is coarser than the scaled bf16 grid).
    rtz = bf16_bits(bf16_round(product, "rtz")) == bf16_bits(bf16_round(bf16_round(x, "rtz").float() * scale, "rtz"))
    assert bool(rtz.all())

"""snap_pow2 / is_pow2 at exact powers and around sqrt(2)*2^e, float32 and bf16, over every exponent."""

from __future__ import annotations

import math

import pytest
import torch

from int8alibi.arith import is_pow2, snap_pow2
from int8alibi.arith.pow2 import snapped_pow2
from int8alibi.errors import InputError

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))]

EXPONENTS = torch.arange(-126, 128, dtype=torch.int64)  # every normal exponent of float32 and bf16
# Significands bracketing sqrt(2) = 1.41421356...: the float32 and bf16 values just below and above.
F32_BELOW, F32_ABOVE = 0x3FB504F3, 0x3FB504F4  # 1.41421354 < sqrt(2) < 1.41421366
BF16_BELOW, BF16_ABOVE = 0x3FB5, 0x3FB6  # 1.4140625 < sqrt(2) < 1.421875


def with_exponents(significand_bits: int, dtype: torch.dtype, exponents: torch.Tensor) -> torch.Tensor:
    """The value with the significand of ``significand_bits`` (an exponent-0 pattern) times 2^e, per e."""
    frac_bits = 23 if dtype == torch.float32 else 7
    int_dtype = torch.int32 if dtype == torch.float32 else torch.int16
    frac = significand_bits & ((1 << frac_bits) - 1)
    return (((exponents + 127) << frac_bits) | frac).to(int_dtype).view(dtype)


def powers(exponents: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return with_exponents(0, dtype, exponents)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_powers_stay_in_both_modes(device: str, dtype: torch.dtype) -> None:
    p = powers(EXPONENTS, dtype).to(device)
    assert bool(is_pow2(p).all())
    for mode in ("nearest", "ceiling"):
        out = snap_pow2(p, mode)
        assert out.dtype == dtype and torch.equal(out, p)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "below", "above"), [(torch.float32, F32_BELOW, F32_ABOVE),
                                                       (torch.bfloat16, BF16_BELOW, BF16_ABOVE)])
def test_nearest_and_ceiling_just_below_and_above_sqrt2(
    device: str, dtype: torch.dtype, below: int, above: int
) -> None:
    e = EXPONENTS[:-1]  # at 2^127 the upward snap would be 2^128 (tested below)
    lo, hi = with_exponents(below, dtype, e).to(device), with_exponents(above, dtype, e).to(device)
    assert bool((lo.double() / powers(e, dtype).to(device).double() < math.sqrt(2)).all())
    assert bool((hi.double() / powers(e, dtype).to(device).double() > math.sqrt(2)).all())
    assert torch.equal(snap_pow2(lo, "nearest").cpu(), powers(e, dtype))
    assert torch.equal(snap_pow2(hi, "nearest").cpu(), powers(e + 1, dtype))
    assert torch.equal(snap_pow2(lo, "ceiling").cpu(), powers(e + 1, dtype))
    assert torch.equal(snap_pow2(hi, "ceiling").cpu(), powers(e + 1, dtype))
    # Just above an exact power: nearest goes down, ceiling up.
    one_up = with_exponents(1, dtype, e)
    assert torch.equal(snap_pow2(one_up, "nearest"), powers(e, dtype))
    assert torch.equal(snap_pow2(one_up, "ceiling"), powers(e + 1, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_random_scales_against_float64_log2(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    s = torch.exp2(torch.empty(1 << 16, dtype=torch.float64).uniform_(-126, 127, generator=gen)).to(dtype)
    s = s[(s >= 2.0**-126) & (s < 2.0**127)]
    log2 = torch.log2(s.double())  # far from the .5 boundaries: m*m = 2 is never close for these formats
    assert torch.equal(snap_pow2(s, "nearest").double(), torch.exp2(torch.round(log2)))
    assert torch.equal(snap_pow2(s, "ceiling").double(), torch.exp2(torch.ceil(log2)))
    assert bool(is_pow2(snap_pow2(s, "nearest")).all()) and bool(is_pow2(snap_pow2(s, "ceiling")).all())


def test_overflowing_snap_raises() -> None:
    top = with_exponents(F32_ABOVE, torch.float32, torch.tensor([127]))
    with pytest.raises(InputError, match="2\\^128"):
        snap_pow2(top, "nearest")
    with pytest.raises(InputError, match="2\\^128"):
        snap_pow2(torch.tensor([torch.finfo(torch.float32).max]), "ceiling")
    assert snap_pow2(with_exponents(F32_BELOW, torch.float32, torch.tensor([127])), "nearest").item() == 2.0**127


@pytest.mark.parametrize("bad", [0.0, -0.0, -1.0, float("inf"), float("nan"), 2.0**-140])
def test_non_positive_non_finite_and_subnormal_scales_raise(bad: float) -> None:
    s = torch.tensor([0.5, bad, 2.0])
    with pytest.raises(InputError, match="layer7.s_w.*not positive finite normal"):
        snap_pow2(s, "nearest", name="layer7.s_w")
    with pytest.raises(InputError):
        snap_pow2(s.bfloat16(), "ceiling")


def test_bad_mode_and_dtype_raise() -> None:
    with pytest.raises(InputError, match="unknown mode"):
        snap_pow2(torch.ones(2), "floor")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="dtype"):
        snap_pow2(torch.ones(2, dtype=torch.float64), "nearest")


def test_is_pow2_on_specials_and_subnormals() -> None:
    x = torch.tensor([1.0, 0.5, 3.0, -2.0, 0.0, -0.0, float("inf"), float("nan"), 2.0**-149, 3 * 2.0**-149, 2.0**-127])
    want = [True, True, False, False, False, False, False, False, True, False, True]
    assert is_pow2(x).tolist() == want
    assert is_pow2(x.double()).tolist() == want
    assert is_pow2(torch.tensor([2.0**-133, 3 * 2.0**-133, 1.5], dtype=torch.bfloat16)).tolist() == [True, False, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keep_zero_keeps_both_zeros_and_still_refuses_the_rest(dtype: torch.dtype) -> None:
    s = torch.tensor([0.0, -0.0, 3.0, 0.75], dtype=dtype)
    out = snap_pow2(s, "nearest", keep_zero=True)
    assert out.view(torch.int16 if dtype == torch.bfloat16 else torch.int32).tolist()[:2] == \
        s.view(torch.int16 if dtype == torch.bfloat16 else torch.int32).tolist()[:2]  # +0 and -0, bit for bit
    assert out.tolist()[2:] == [4.0, 1.0]  # 3 = 1.5 * 2: above sqrt(2), up; 0.75 = 1.5 / 2: up to 1
    for bad in (-1.0, float("inf"), float("nan"), 2.0**-130):  # 2^-130: subnormal in both formats
        with pytest.raises(InputError, match="not positive finite normal"):
            snap_pow2(torch.tensor([0.0, bad], dtype=dtype), "ceiling", keep_zero=True)


def test_snapped_pow2_flags_what_snap_pow2_refuses_without_raising() -> None:
    top = with_exponents(F32_ABOVE, torch.float32, torch.tensor([127])).item()
    s = torch.tensor([0.0, -0.0, 1.5, 0.25, -1.0, float("inf"), float("nan"), 2.0**-140, top, 2.0**-126])
    for keep_zero in (False, True):
        snapped, refused, overflow = snapped_pow2(s, "nearest", keep_zero=keep_zero)
        zeros = [not keep_zero] * 2
        assert refused.tolist() == [*zeros, False, False, True, True, True, True, False, False]
        assert overflow.tolist() == [False] * 8 + [True, False]
        fine = ~(refused | overflow)
        for i in fine.nonzero().flatten().tolist():  # each accepted scale: snap_pow2's own answer
            alone = s[i:i + 1]
            assert torch.equal(snapped[i:i + 1].view(torch.int32),
                               snap_pow2(alone, "nearest", keep_zero=keep_zero).view(torch.int32))
    assert snapped_pow2(s, "ceiling")[0][2:4].tolist() == [2.0, 0.25]  # ceiling keeps an exact power

"""The bf16 bit toolkit (``arith.bf16``) and bit patterns of any float (``arith.bits``), on every
bf16 pattern and at the boundaries: ±0, subnormals, the smallest normal, max finite, ±inf, NaN
payloads, one spacing across zero."""

from __future__ import annotations

import math

import pytest
import torch

from int8alibi.arith import bf16, ulp_distance
from int8alibi.arith.bits import bit_pattern, bits_equal
from int8alibi.errors import InputError

ALL = torch.arange(0x10000, dtype=torch.int64)


def from_bits(bits: list[int] | torch.Tensor) -> torch.Tensor:
    b = torch.as_tensor(bits, dtype=torch.int64)
    return torch.where(b >= 0x8000, b - 0x10000, b).to(torch.int16).view(torch.bfloat16)


EVERY = from_bits(ALL)


def test_the_views_give_each_pattern_back() -> None:
    assert bf16.unsigned_bits(EVERY).tolist() == ALL.tolist()
    signed = bf16.signed_bits(EVERY)
    assert signed.dtype == torch.int32
    assert signed.tolist() == [b - 0x10000 if b >= 0x8000 else b for b in ALL.tolist()]


def test_value_classes_agree_with_torch_on_every_pattern() -> None:
    values = EVERY.float()
    for view in (bf16.signed_bits(EVERY), bf16.unsigned_bits(EVERY), EVERY.view(torch.int16)):
        assert torch.equal(bf16.nonfinite_bits(view), ~torch.isfinite(values))
        tiny = torch.finfo(torch.bfloat16).tiny  # the smallest normal
        assert torch.equal(bf16.subnormal_bits(view), (values != 0) & (values.abs() < tiny) & torch.isfinite(values))


@pytest.mark.parametrize(("bits", "nonfinite", "subnormal"), [
    (0x0000, False, False), (0x8000, False, False),    # ±0: neither
    (0x0001, False, True), (0x8001, False, True),      # smallest subnormals
    (0x007F, False, True), (0x0080, False, False),     # largest subnormal, smallest normal
    (0x7F7F, False, False), (0xFF7F, False, False),    # ±max finite
    (0x7F80, True, False), (0xFF80, True, False),      # ±inf
    (0x7FC0, True, False), (0x7F81, True, False), (0xFFFF, True, False),  # NaN payloads
])
def test_value_classes_at_the_boundaries(bits: int, nonfinite: bool, subnormal: bool) -> None:
    view = bf16.signed_bits(from_bits([bits]))
    assert bool(bf16.nonfinite_bits(view)) is nonfinite and bool(bf16.subnormal_bits(view)) is subnormal


def test_the_ordered_line_is_value_order_with_unit_steps_and_one_zero() -> None:
    finite = EVERY[torch.isfinite(EVERY)]
    line = bf16.ordered_line(bf16.signed_bits(finite))
    order = torch.argsort(finite.float(), stable=True)
    steps = torch.diff(line[order])
    assert int((steps == 0).sum()) == 1 and bool((steps[steps != 0] == 1).all())  # only -0 and +0 share a place
    # ... and is the sign-magnitude reading: -magnitude for a set sign bit
    magnitude = bf16.unsigned_bits(finite) & bf16.MAGNITUDE
    negative = (bf16.unsigned_bits(finite) & bf16.SIGN) != 0
    assert torch.equal(line, torch.where(negative, -magnitude, magnitude))


@pytest.mark.parametrize(("a", "b", "distance"), [
    (0x0000, 0x8000, 0),            # +0 and -0 are one place
    (0x0001, 0x8000, 1),            # smallest subnormal to -0: one spacing
    (0x0001, 0x8001, 2),            # one spacing across zero each way
    (0x007F, 0x0080, 1),            # subnormal to normal
    (0x7F7F, 0xFF7F, 2 * 0x7F7F),   # max finite to its negative
])
def test_spacings_on_the_line(a: int, b: int, distance: int) -> None:
    line = bf16.ordered_line(bf16.signed_bits(from_bits([a, b])))
    assert abs(int(line[0]) - int(line[1])) == distance
    assert ulp_distance(from_bits([a]), from_bits([b])).item() == distance


def test_the_bf16_views_refuse_other_dtypes() -> None:
    with pytest.raises(InputError, match="not torch.bfloat16"):
        bf16.signed_bits(torch.zeros(2, dtype=torch.float16))


def test_bit_patterns_have_the_width_of_the_float() -> None:
    for dtype, width in ((torch.bfloat16, torch.int16), (torch.float16, torch.int16), (torch.float32, torch.int32),
                         (torch.float64, torch.int64), (torch.float8_e4m3fn, torch.uint8)):
        x = torch.zeros(3, dtype=dtype)
        assert bit_pattern(x).dtype == width and bit_pattern(x).shape == (3,)
    ints = torch.arange(3, dtype=torch.int8)
    assert bit_pattern(ints) is ints
    strided = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # not contiguous: still viewable
    assert bit_pattern(strided).tolist() == strided.contiguous().view(torch.int32).tolist()


def test_bits_equal_counts_signed_zeros_nan_payloads_dtype_and_shape() -> None:
    z = torch.tensor([0.0], dtype=torch.bfloat16)
    assert bits_equal(z, z.clone()) and not bits_equal(z, -z)
    nan = torch.tensor([math.nan])
    other_nan = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert bits_equal(nan, nan.clone()) and not bits_equal(nan, other_nan)
    assert not bits_equal(z, z.float()) and not bits_equal(z, torch.zeros(2, dtype=torch.bfloat16))
    one = torch.tensor([1.0], dtype=torch.bfloat16)
    assert not bits_equal(one, from_bits([0x3F81]))  # one spacing apart
    assert bits_equal(torch.tensor([1, -1], dtype=torch.int8), torch.tensor([1, -1], dtype=torch.int8))

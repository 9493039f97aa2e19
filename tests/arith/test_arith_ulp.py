"""ulp_distance / compare_bf16: across zero, signed zeros, adjacency, non-finite kept apart."""

from __future__ import annotations

import pytest
import torch

from int8alibi.arith import bf16_bits, compare_bf16, ordered_bf16, ulp_distance
from int8alibi.errors import InputError

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))]


def bf16_from_bits(bits: list[int] | torch.Tensor) -> torch.Tensor:
    b = torch.as_tensor(bits, dtype=torch.int64)
    return torch.where(b >= 0x8000, b - 0x10000, b).to(torch.int16).view(torch.bfloat16)


ALL_BITS = torch.arange(0x10000, dtype=torch.int64)


def test_ordered_line_is_exhaustively_monotone_with_unit_steps() -> None:
    x = bf16_from_bits(ALL_BITS)
    finite = x[torch.isfinite(x)]
    order = torch.argsort(finite.float(), stable=True)
    steps = torch.diff(ordered_bf16(finite[order]))
    # Every finite bf16 is one step from its neighbour, except -0 and +0 which share position 0.
    zero_pairs = (finite[order][:-1] == 0) & (finite[order][1:] == 0)
    assert int(zero_pairs.sum()) == 1
    assert bool((steps[zero_pairs] == 0).all()) and bool((steps[~zero_pairs] == 1).all())
    assert bf16_bits(x).tolist() == ALL_BITS.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_distances_at_the_boundaries(device: str) -> None:
    a = bf16_from_bits([0x0001, 0x0000, 0x3F80, 0x7F7F, 0x7F7F, 0x007F, 0xBF80]).to(device)
    b = bf16_from_bits([0x8001, 0x8000, 0x3F81, 0xFF7F, 0x7F80, 0x0080, 0xBF7F]).to(device)
    # smallest subnormals of both signs: 2; ±0: 0; adjacent: 1; ±max: 2*0x7F7F; finite vs inf: -1;
    # largest subnormal vs smallest normal: 1; adjacent negatives: 1.
    assert ulp_distance(a, b).tolist() == [2, 0, 1, 2 * 0x7F7F, -1, 1, 1]
    assert ulp_distance(a, b).dtype == torch.int32


def test_random_adjacent_values_are_one_apart_in_either_order() -> None:
    gen = torch.Generator().manual_seed(4)
    magnitude = torch.randint(0, 0x7F7F, (1 << 16,), generator=gen, dtype=torch.int64)  # next one is finite
    sign = torch.randint(0, 2, magnitude.shape, generator=gen, dtype=torch.int64) << 15
    a, b = bf16_from_bits(magnitude | sign), bf16_from_bits((magnitude + 1) | sign)
    assert bool((ulp_distance(a, b) == 1).all()) and bool((ulp_distance(b, a) == 1).all())


def test_nonfinite_pairs_are_reported_apart() -> None:
    inf, ninf, nan, nan2 = 0x7F80, 0xFF80, 0x7FC0, 0x7FC1
    a = bf16_from_bits([inf, inf, nan, nan, 0x3F80, ninf])
    b = bf16_from_bits([inf, ninf, nan, nan2, nan, 0x3F80])
    assert ulp_distance(a, b).tolist() == [-1] * 6

    c = compare_bf16(a, b)
    # inf==inf and NaN==NaN with the same bits are no difference; another payload is.
    assert (c.elements, c.differing, c.nonfinite_a, c.nonfinite_b) == (6, 4, 5, 5)
    assert c.max_finite_ulp is None and c.finite_pairs == 0


def test_compare_counts_signed_zeros_bitwise_and_subnormals() -> None:
    a = bf16_from_bits([0x0000, 0x3F80, 0x0001, 0x807F, 0x4000, 0x7F80])
    b = bf16_from_bits([0x8000, 0x3F80, 0x8001, 0x807F, 0x4003, 0x4000])
    c = compare_bf16(a, b)
    assert c.elements == 6
    assert c.differing == 4  # ±0, the subnormals across zero, 0x4000 vs 0x4003, inf vs 2
    assert c.max_finite_ulp == 3 and c.finite_pairs == 5
    assert (c.nonfinite_a, c.nonfinite_b) == (1, 0)
    assert (c.subnormal_a, c.subnormal_b) == (2, 2)

    zeros = compare_bf16(bf16_from_bits([0x0000]), bf16_from_bits([0x8000]))
    assert zeros.differing == 1 and zeros.max_finite_ulp == 0


def test_bad_inputs_raise() -> None:
    x = bf16_from_bits([0x3F80, 0x4000])
    with pytest.raises(InputError, match="shapes differ"):
        ulp_distance(x, x[:1])
    with pytest.raises(InputError, match="not torch.bfloat16"):
        compare_bf16(x, x.float())
    with pytest.raises(InputError, match="not torch.bfloat16"):
        bf16_bits(torch.ones(2))

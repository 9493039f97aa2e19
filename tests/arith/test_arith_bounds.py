"""int32_bound_holds and f32_exact at their edges, checked against float32 itself."""

from __future__ import annotations

import pytest
import torch

from int8alibi.arith import F32_EXACT_BOUND, INT32_PRODUCT_BOUND, f32_exact, int32_bound_holds
from int8alibi.errors import InputError


def test_int32_bound_edge() -> None:
    assert INT32_PRODUCT_BOUND == 127 * 128
    assert int32_bound_holds(0) and int32_bound_holds(6144)
    assert int32_bound_holds(132_104) and 132_104 * 16256 == 2**31 - 1024
    assert not int32_bound_holds(132_105)
    for bad in (-1, 1.5, True, "6144"):
        with pytest.raises(InputError, match="reduction depth"):
            int32_bound_holds(bad)  # type: ignore[arg-type]


def test_f32_exact_around_2_pow_24() -> None:
    b = F32_EXACT_BOUND
    values = torch.tensor([b - 1, -(b - 1), b, -b, b + 1, -(b + 1), b + 2, -(b + 2), 0], dtype=torch.int64)
    float32_holds = values.to(torch.float32).to(torch.int64) == values  # float32's own verdict
    assert float32_holds.tolist() == [True, True, True, True, False, False, True, True, True]
    assert f32_exact(values).tolist() == [True, True, True, True, False, False, False, False, True]
    assert torch.equal(f32_exact(values, exact_repr=True), float32_holds)


def test_exact_repr_equals_float32_round_trip_over_all_magnitudes() -> None:
    gen = torch.Generator().manual_seed(6)
    bits = torch.randint(1, 63, (1 << 16,), generator=gen, dtype=torch.int64)
    values = torch.randint(0, 2**62, bits.shape, generator=gen, dtype=torch.int64) >> (62 - bits)
    values = values & ~((torch.ones_like(bits) << torch.randint(0, 40, bits.shape, generator=gen)) - 1)
    values = torch.where(torch.rand(bits.shape, generator=gen) < 0.5, -values, values)
    values = torch.cat([values, torch.tensor([torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max])])
    round_trip = values.to(torch.float32).double() == values.double()  # exact: float64 holds both sides here
    exact_sample = values.abs() < 2**53
    assert torch.equal(f32_exact(values, exact_repr=True)[exact_sample], round_trip[exact_sample])
    assert f32_exact(values, exact_repr=True)[-2:].tolist() == [True, False]  # -2**63 is a float32, 2**63-1 is not
    representable = f32_exact(values, exact_repr=True)
    assert int(representable.sum()) > 1000 and int((~representable).sum()) > 1000  # both classes sampled


def test_f32_exact_rejects_other_dtypes() -> None:
    with pytest.raises(InputError, match="not torch.int64"):
        f32_exact(torch.zeros(2, dtype=torch.int32))

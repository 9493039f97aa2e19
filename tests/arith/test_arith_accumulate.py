"""exact_accumulator and wrap_int32 at the depths where int32 stops being enough."""

from __future__ import annotations

import pytest
import torch

from int8alibi.arith import INT32_PRODUCT_BOUND, exact_accumulator, int32_bound_holds, wrap_int32
from int8alibi.errors import InputError

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))]

K_MAX = 132_104  # the deepest K with 16256*K < 2**31


def python_wrap(v: int) -> int:
    """Two's-complement int32 wrap, in Python integers (an independent route)."""
    return (v + 2**31) % 2**32 - 2**31


@pytest.mark.parametrize("device", DEVICES)
def test_paths_agree_with_integer_matmul_on_random_operands(device: str) -> None:
    gen = torch.Generator().manual_seed(5)
    a = torch.randint(-128, 128, (7, 301), generator=gen, dtype=torch.int8)
    w = torch.randint(-128, 128, (5, 301), generator=gen, dtype=torch.int8)
    reference = a.to(torch.int64) @ w.to(torch.int64).T  # CPU int64 matmul, no float involved
    for path, chunk in (("auto", None), ("fp64", None), ("int64", 7), ("int64", 301), ("int64", 1000)):
        kwargs = {"path": path} if chunk is None else {"path": path, "chunk": chunk}
        acc = exact_accumulator(a.to(device), w.to(device), **kwargs)
        assert acc.dtype == torch.int64 and acc.device.type == device
        assert torch.equal(acc.cpu(), reference), (path, chunk)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [1, 4096, K_MAX, K_MAX + 1])
def test_extreme_operands_up_to_the_int32_bound(device: str, k: int) -> None:
    a = torch.full((2, k), -128, dtype=torch.int8, device=device)
    w = torch.full((3, k), -127, dtype=torch.int8, device=device)
    closed_form = k * INT32_PRODUCT_BOUND
    fp64 = exact_accumulator(a, w, path="fp64")
    chunked = exact_accumulator(a, w, path="int64", chunk=4096)
    assert torch.equal(fp64, chunked)
    assert bool((fp64 == closed_form).all())

    wrapped = wrap_int32(fp64)
    assert bool((wrapped == python_wrap(closed_form)).all())
    assert torch.equal(wrapped.to(torch.int64), fp64) == int32_bound_holds(k)
    if not int32_bound_holds(k):
        assert bool((wrapped < 0).all())  # the positive exact sum wraps negative


@pytest.mark.parametrize("device", DEVICES)
def test_minus128_squared_wraps_exactly_at_2_pow_31(device: str) -> None:
    # (-128)*(-128) = 16384 = 2**14 is outside the quantizers' range, and reaches 2**31 at K = 2**17.
    for k, expected_wrap in ((2**17 - 1, 2**31 - 2**14), (2**17, -(2**31))):
        a = torch.full((1, k), -128, dtype=torch.int8, device=device)
        acc = exact_accumulator(a, a, path="int64", chunk=10_000)
        assert int(acc.item()) == k * 2**14 == int(exact_accumulator(a, a).item())
        assert int(wrap_int32(acc).item()) == expected_wrap == python_wrap(k * 2**14)


def test_wrap_int32_boundaries_match_python_wrap() -> None:
    values = [0, 1, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**32 + 5, -(2**32) - 5,
              2**62 + 2**31, -(2**63), 2**63 - 1]
    got = wrap_int32(torch.tensor(values, dtype=torch.int64))
    assert got.dtype == torch.int32
    assert got.tolist() == [python_wrap(v) for v in values]


def test_a_known_bound_within_int32_converts_in_one_pass_and_beyond_it_wraps() -> None:
    inside = torch.tensor([0, 1, -1, 2**31 - 1, -(2**31)], dtype=torch.int64)
    for bound in (0, 2**31 - 1):  # a bound below 2^31 promises every entry is representable
        assert wrap_int32(inside, bound=bound).tolist() == inside.tolist()
    past = torch.tensor([2**31, -(2**31) - 1, 2**32 + 5], dtype=torch.int64)
    for bound in (2**31, 2**40, None):  # at 2^31 the sum may wrap: the wrap it is
        assert wrap_int32(past, bound=bound).tolist() == [python_wrap(v) for v in past.tolist()]
        assert wrap_int32(inside, bound=bound).tolist() == inside.tolist()
    with pytest.raises(InputError, match="bound -1"):
        wrap_int32(inside, bound=-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int32, torch.int8])
def test_only_exact_int64_sums_convert(dtype: torch.dtype) -> None:
    for bound in (None, 0):  # the fast path refuses what the wrap refuses
        with pytest.raises(InputError, match="not torch.int64"):
            wrap_int32(torch.zeros(2, dtype=dtype), bound=bound)


def test_empty_reduction_is_zero() -> None:
    a = torch.zeros((2, 0), dtype=torch.int8)
    w = torch.zeros((3, 0), dtype=torch.int8)
    assert torch.equal(exact_accumulator(a, w), torch.zeros(2, 3, dtype=torch.int64))
    assert torch.equal(exact_accumulator(a, w, path="int64"), torch.zeros(2, 3, dtype=torch.int64))


def test_bad_operands_raise() -> None:
    a = torch.zeros((2, 4), dtype=torch.int8)
    with pytest.raises(InputError, match="a_q must be a 2-D int8"):
        exact_accumulator(a.to(torch.int32), a)
    with pytest.raises(InputError, match="w_q must be a 2-D int8"):
        exact_accumulator(a, a[0])
    with pytest.raises(InputError, match="reduction depths differ"):
        exact_accumulator(a, a[:, :3])
    with pytest.raises(InputError, match="unknown path"):
        exact_accumulator(a, a, path="int32")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="chunk=0"):
        exact_accumulator(a, a, path="int64", chunk=0)
    with pytest.raises(InputError, match="chunk="):
        exact_accumulator(a, a, path="int64", chunk=2**39 + 1)
    with pytest.raises(InputError, match="not torch.int64"):
        wrap_int32(torch.zeros(2, dtype=torch.int32))


def test_reused_weight_is_recomputed_after_an_in_place_change() -> None:
    """The float64 weight cache must never serve a stale copy of a weight changed in place."""
    g = torch.Generator().manual_seed(7)
    a = torch.randint(-127, 128, (3, 64), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (5, 64), dtype=torch.int8, generator=g)
    first = exact_accumulator(a, w)
    assert torch.equal(first, a.long() @ w.long().T)
    w[0, 0] = -w[0, 0] if w[0, 0] != -128 else 0
    second = exact_accumulator(a, w)
    assert torch.equal(second, a.long() @ w.long().T)
    assert not torch.equal(first, second)


@pytest.mark.parametrize("k", [1, 1023, 1024, 1025, 2048, 6144])
def test_float32_chunked_path_is_exact_at_its_chunk_boundary(k: int) -> None:
    """float32 is exact only while every partial sum is <= 2**24: K <= 1024 at |product| 2**14.

    All -128 x -128 products (16384 each) make the partial sums reach exactly 2**24 at K = 1024;
    beyond, the path must chunk. Every path agrees with the int64 closed form.
    """
    a = torch.full((2, k), -128, dtype=torch.int8)
    w = torch.full((3, k), -128, dtype=torch.int8)
    expected = torch.full((2, 3), 16384 * k, dtype=torch.int64)
    for path in ("fp32", "fp64", "int64", "auto"):
        assert torch.equal(exact_accumulator(a, w, path=path), expected), path


def test_one_float32_matmul_beyond_the_boundary_would_not_be_exact() -> None:
    """Why the float32 path chunks: an unchunked float32 sum past 2**24 loses odd integers."""
    a = torch.tensor([[127] * 1032 + [1]], dtype=torch.int8)
    w = torch.tensor([[127] * 1032 + [1]], dtype=torch.int8)
    exact = 127 * 127 * 1032 + 1  # 16,645,129: odd, below 2**24 -- representable
    assert exact < 2**24 and float(torch.tensor(exact, dtype=torch.float32)) == exact
    big = torch.tensor([[127] * 1100 + [1]], dtype=torch.int8)
    exact_big = 127 * 127 * 1100 + 1  # 17,741,901: odd, above 2**24 -- not representable in float32
    assert float(torch.tensor(exact_big, dtype=torch.float32)) != exact_big
    assert int(exact_accumulator(big, big, path="fp32")) == exact_big
    assert int(exact_accumulator(a, w, path="fp32")) == exact

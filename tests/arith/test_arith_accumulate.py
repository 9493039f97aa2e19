"""exact_accumulator and wrap_int32 at the depths where int32 stops being enough."""

from __future__ import annotations

import pytest
import torch

from int8alibi.arith import INT32_PRODUCT_BOUND, exact_accumulator, exact_int32, int32_bound_holds, wrap_int32
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


def test_numpy_blas_follows_torchs_thread_count_and_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU chunk products run in numpy's OpenBLAS at torch's intra-op thread count (more threads
    than the job was given would fight side-by-side jobs for cores); without that BLAS, torch's
    matmul gives the same integers."""
    import scipy.linalg  # noqa: F401  (loads SciPy's own OpenBLAS beside numpy's: it must stay untouched)
    from threadpoolctl import threadpool_info

    from int8alibi.arith import accumulate

    blas = accumulate._numpy_blas()
    if blas is None:
        pytest.skip("not applicable: this numpy is not built on scipy-openblas")
    [mine] = [info["filepath"] for info in blas.controller.info()]
    assert "numpy.libs" in mine

    def threads_of(path: str) -> int:
        return next(int(info["num_threads"]) for info in threadpool_info() if info["filepath"] == path)

    others = {info["filepath"]: info["num_threads"] for info in threadpool_info()
              if info["internal_api"] == "openblas" and info["filepath"] != mine}
    gen = torch.Generator().manual_seed(11)
    a = torch.randint(-128, 128, (9, 1024), generator=gen, dtype=torch.int8)
    w = torch.randint(-128, 128, (6, 1024), generator=gen, dtype=torch.int8)
    a[0], w[0] = -128, -128  # one partial sum reaches 2**24 exactly
    reference = a.to(torch.int64) @ w.to(torch.int64).T
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.equal(exact_accumulator(a, w, path="fp32"), reference)
            assert threads_of(mine) == threads
            assert {path: threads_of(path) for path in others} == others
    finally:
        torch.set_num_threads(before)
    monkeypatch.setattr(accumulate, "_numpy_blas", lambda: None)
    assert torch.equal(exact_accumulator(a, w, path="fp32"), reference)
    assert torch.equal(exact_accumulator(a, w, path="int64", chunk=100), reference)


def _saturating_pairs(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """A kernel that adds u8(a+128)·s8(w) products in pairs saturated to int16 (AVX2's vpmaddubsw),
    then removes the shift: what oneDNN does on CPUs without VNNI."""
    u = a_q.to(torch.int64) + 128
    w = w_q.to(torch.int64)
    k = a_q.shape[1] - a_q.shape[1] % 2
    pairs = (u[:, None, 0:k:2] * w[None, :, 0:k:2] + u[:, None, 1:k:2] * w[None, :, 1:k:2]).clamp(-32768, 32767)
    tail = u[:, None, k:] * w[None, :, k:]
    return (pairs.sum(-1) + tail.sum(-1) - 128 * w.sum(1)[None, :]).to(torch.int32)


@pytest.mark.parametrize("inference", [False, True])
def test_onednn_int8_sums_are_used_only_where_proven_exact(inference: bool) -> None:
    """On this CPU oneDNN's int8 GEMM either proves exact for a shape (and then gives the exact sums,
    inside inference mode too) or is not used; the accumulator is exact either way."""
    from int8alibi.arith import accumulate

    gen = torch.Generator().manual_seed(13)
    onednn = accumulate._OneDnnInt8()
    with torch.inference_mode(inference):
        for m, n, k in ((1, 576, 576), (1, 192, 1536), (37, 64, 1000), (128, 1536, 576)):
            a = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
            w = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
            a[0], w[-1] = 127, -128
            reference = (a.double() @ w.double().T).to(torch.int64)
            got = onednn.product(a, w)
            if accumulate._int8_dot_products():
                assert (got is None) == (not onednn._exact[(m, n, k)])
            else:  # no VNNI/AMX here: the route is never tried
                assert got is None and not onednn._exact
            if got is not None:
                assert got.dtype == torch.int32 and torch.equal(got.to(torch.int64), reference)
            assert torch.equal(exact_accumulator(a, w), reference)
            assert torch.equal(exact_int32(a, w).to(torch.int64), reference)


def test_a_saturating_int8_kernel_fails_the_proof_and_the_float_route_takes_over(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from int8alibi.arith import accumulate

    onednn = accumulate._OneDnnInt8()
    monkeypatch.setattr(accumulate, "_int8_dot_products", lambda: True)  # as on a VNNI host
    monkeypatch.setattr(onednn, "_int_mm", _saturating_pairs)
    monkeypatch.setattr(accumulate, "_ONEDNN", onednn)
    a = torch.full((2, 64), 127, dtype=torch.int8)
    assert not torch.equal(_saturating_pairs(a, a).long(), torch.full((2, 2), 127 * 127 * 64))  # it does saturate
    assert onednn.product(a, a) is None and onednn._exact == {(2, 2, 64): False}
    assert torch.equal(exact_accumulator(a, a), torch.full((2, 2), 127 * 127 * 64))
    assert torch.equal(exact_int32(a, a), torch.full((2, 2), 127 * 127 * 64, dtype=torch.int32))


def test_onednn_is_not_tried_on_a_cpu_without_int8_dot_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without VNNI/AMX oneDNN's int8 GEMM is never called (not even proven): the float route gives
    the exact sums, including the extreme ones."""
    from int8alibi.arith import accumulate

    def refuse(*_: object) -> torch.Tensor:
        raise AssertionError("oneDNN's int8 GEMM was called on a CPU without int8 dot products")

    onednn = accumulate._OneDnnInt8()
    monkeypatch.setattr(accumulate, "_int8_dot_products", lambda: False)
    monkeypatch.setattr(onednn, "_int_mm", refuse)
    monkeypatch.setattr(accumulate, "_ONEDNN", onednn)
    a = torch.full((3, 1000), -128, dtype=torch.int8)
    w = torch.full((2, 1000), -128, dtype=torch.int8)
    assert onednn.product(a, w) is None and onednn._exact == {}
    assert torch.equal(exact_accumulator(a, w), torch.full((3, 2), 16384 * 1000))
    assert torch.equal(exact_int32(a, w), torch.full((3, 2), 16384 * 1000, dtype=torch.int32))


def test_the_float_route_takes_operands_made_in_inference_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inference tensors have no version counter: the widened-weights cache passes them through."""
    from int8alibi.arith import accumulate

    monkeypatch.setattr(accumulate, "_int8_dot_products", lambda: False)
    with torch.inference_mode():
        a = torch.full((2, 1500), 127, dtype=torch.int8)
        w = torch.full((3, 1500), -128, dtype=torch.int8)
        assert w.is_inference()
        kept = len(accumulate._WEIGHTS._entries)
        assert torch.equal(exact_accumulator(a, w), torch.full((2, 3), -127 * 128 * 1500))
        assert len(accumulate._WEIGHTS._entries) == kept


def test_int8_dot_products_reads_torchs_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    from int8alibi.arith import accumulate

    for found, expected in (({"avx2": True, "avx512_vnni": False, "avx_vnni": False}, False),
                            ({"avx2": True, "avx_vnni": True}, True), ({"amx_int8": True}, True), ({}, False)):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda found=found: found)
        accumulate._int8_dot_products.cache_clear()
        try:
            assert accumulate._int8_dot_products() is expected
        finally:
            accumulate._int8_dot_products.cache_clear()


def test_onednn_limited_to_avx2_is_refused_on_this_host() -> None:
    """The real library: oneDNN held to AVX2 (no VNNI) saturates, and the proof refuses it. Not
    applicable on a CPU without VNNI/AMX, where the route is never tried."""
    import os
    import subprocess
    import sys

    from int8alibi.arith import accumulate

    if not accumulate._int8_dot_products():
        pytest.skip("not applicable: this CPU has no int8 dot products, so oneDNN's int8 route is never tried")
    code = ("import torch; from int8alibi.arith import accumulate as A; "
            "print(A._OneDnnInt8()._proven(1, 576, 576), A._OneDnnInt8()._proven(128, 1536, 576))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_exact_int32_refuses_depths_where_int32_could_wrap() -> None:
    a = torch.zeros(1, 2**17, dtype=torch.int8)
    with pytest.raises(InputError, match="too deep"):
        exact_int32(a, a)

"""The exact arms against an independent construction, on random and boundary operands."""

from __future__ import annotations

import pytest
import torch

from int8alibi.arith import bf16_bits, compare_bf16, ulp_distance
from int8alibi.errors import InputError
from int8alibi.kernels import get
from int8alibi.kernels.base import EMULATION_NOTE
from int8alibi.kernels.exact import ExactArm, epilogue

ORDERS = ("cutlass", "triton")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


def operands(m: int, k: int, n: int, seed: int, sa=(1e-3, 1e-1), sw=(1e-4, 1e-3)):
    g = torch.Generator().manual_seed(seed)
    a_q = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    w_q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s_a = (sa[0] + (sa[1] - sa[0]) * torch.rand(m, generator=g, dtype=torch.float64)).to(torch.float32)
    s_w = (sw[0] + (sw[1] - sw[0]) * torch.rand(n, generator=g, dtype=torch.float64)).to(torch.float32)
    return a_q, w_q, s_a, s_w


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("shape", [(1, 16, 8), (7, 48, 33), (64, 2048, 96), (3, 1000, 5)])
def test_random_operands_match_reference(order, shape, reference, bits_match):
    a_q, w_q, s_a, s_w = operands(*shape, seed=sum(shape))
    arm = get(f"exact-{order}-order", "cpu")
    y = arm.scaled_mm(a_q, w_q, s_a, s_w)
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (shape[0], shape[2])
    assert bits_match(y, reference(a_q, w_q, s_a, s_w, order))


@pytest.mark.parametrize("order", ORDERS)
def test_boundary_operands_match_reference(order, reference, bits_match):
    arm = get(f"exact-{order}-order", "cpu")
    cases = []
    # Scales at and below float32's smallest normal: products land among bf16 subnormals.
    cases.append(operands(8, 256, 16, 1, sa=(1e-44, 1.2e-38)))
    cases.append(operands(8, 256, 16, 2, sa=(1.17e-38, 1.18e-38), sw=(1e-7, 1e-6)))
    # Zero rows with zero scale (the per-token rule for an all-zero token).
    a_q, w_q, s_a, s_w = operands(9, 64, 16, 3)
    a_q[::2] = 0
    s_a[::2] = 0.0
    cases.append((a_q, w_q, s_a, s_w))
    # All -128: the largest product, |acc| = 2**14 * K well above 2**24 at K=6144.
    _, _, s_a, s_w = operands(4, 6144, 8, 4)
    minus_128 = torch.full((4, 6144), -128, dtype=torch.int8)
    cases.append((minus_128, torch.full((8, 6144), -128, dtype=torch.int8), s_a, s_w))
    # |acc| ~ 1e8 with odd parts: int32 -> float32 must round to nearest even.
    g = torch.Generator().manual_seed(5)

    def pick(shape: tuple[int, int]) -> torch.Tensor:
        return torch.tensor([-128, -127], dtype=torch.int8)[torch.randint(0, 2, shape, generator=g)]

    cases.append((pick((4, 6144)), pick((8, 6144)), s_a, s_w))
    # Outputs beyond bf16's range: inf.
    cases.append(operands(4, 512, 8, 6, sa=(1e30, 1e31), sw=(1e3, 1e4)))
    # inf * 0: |acc| = 2**14 * 6144 times a scale of 1e38 overflows float32; a zero scale then makes
    # NaN, in the order that multiplies it last (CUTLASS: s_a, Triton: s_w), and 0 in the other.
    a_q = torch.full((3, 6144), -128, dtype=torch.int8)
    a_q[2] = 127  # a negative accumulator row
    cases.append((a_q, torch.full((3, 6144), -128, dtype=torch.int8), torch.tensor([1e38, 0.0, 0.0]),
                  torch.tensor([1e38, 0.0, 1e38])))
    for a_q, w_q, s_a, s_w in cases:
        assert bits_match(arm.scaled_mm(a_q, w_q, s_a, s_w), reference(a_q, w_q, s_a, s_w, order))
    big = arm.scaled_mm(*cases[3])
    assert bool((big.float().abs() > 0).all())
    assert bool(torch.isinf(arm.scaled_mm(*cases[-2])).any())
    nan = torch.isnan(arm.scaled_mm(*cases[-1]))
    # CUTLASS order: s_a = 0 times s_w*acc = +-inf at (1, 0), (1, 2), (2, 0), (2, 2); Triton order:
    # s_w = 0 times s_a*acc = inf at (0, 1).
    expected = [(1, 0), (1, 2), (2, 0), (2, 2)] if order == "cutlass" else [(0, 1)]
    assert sorted(map(tuple, nan.nonzero().tolist())) == expected


def test_same_bits_counts_nan_payloads_and_signed_zeros(bits_match):
    """The comparison the kernel tests use is bitwise: NaN sign and payload bits count, as do signed zeros."""
    def bf16(*bits: int) -> torch.Tensor:
        return torch.tensor([b - 0x10000 if b >= 0x8000 else b for b in bits], dtype=torch.int16).view(torch.bfloat16)

    assert bits_match(bf16(0x7FC0, 0xFFC1, 0x0000), bf16(0x7FC0, 0xFFC1, 0x0000))
    assert not bits_match(bf16(0x7FC0), bf16(0xFFC0))   # NaN sign
    assert not bits_match(bf16(0x7FC0), bf16(0x7FC1))   # NaN payload
    assert not bits_match(bf16(0x7FC0), bf16(0x7FFF))   # NaN payload (CUDA's canonical NaN, rounded)
    assert not bits_match(bf16(0x0000), bf16(0x8000))   # +0 vs -0
    assert not bits_match(bf16(0x3F80, 0x3F80), bf16(0x3F80))  # shape


@pytest.mark.parametrize("order", ORDERS)
def test_int32_overflow_wraps_by_contract(order, reference, bits_match):
    """16256*K >= 2**31: the emulation wraps in two's complement (the project's kernel semantics).

    Real H200 kernels saturate there instead (validate_gpu records it); this is outside the
    precondition, where no equality between arms is claimed.
    """
    k = 132112
    a_q = torch.full((2, k), -128, dtype=torch.int8)
    w_q = torch.full((3, k), -128, dtype=torch.int8)
    w_q[1, ::2] = 127
    arm = get(f"exact-{order}-order", "cpu")
    acc = arm.accumulator(a_q, w_q)
    exact = a_q.to(torch.int64) @ w_q.to(torch.int64).T
    assert acc.dtype == torch.int32
    assert int(exact.max()) >= 2**31  # the case really overflows
    assert torch.equal(acc.to(torch.int64), torch.remainder(exact + 2**31, 2**32) - 2**31)
    s_a, s_w = torch.tensor([1e-3, 2e-3]), torch.tensor([1e-4, 3e-4, 5e-4])
    assert bits_match(arm.scaled_mm(a_q, w_q, s_a, s_w), reference(a_q, w_q, s_a, s_w, order))


def test_orders_differ_by_one_spacing_under_real_scales():
    """Over millions of realistic epilogues the two orders disagree rarely, and only by one spacing."""
    g = torch.Generator().manual_seed(11)
    m, n = 2048, 2048
    acc = torch.randint(-2**20, 2**20, (m, n), generator=g, dtype=torch.int32)
    s_a = (torch.rand(m, generator=g) * 0.2 + 1e-3).to(torch.float32)
    s_w = (torch.rand(n, generator=g) * 1e-3 + 1e-4).to(torch.bfloat16).to(torch.float32)
    c, t = epilogue(acc, s_a, s_w, "cutlass"), epilogue(acc, s_a, s_w, "triton")
    cmp = compare_bf16(c, t)
    assert 0 < cmp.differing < cmp.elements // 1000
    assert cmp.max_finite_ulp == 1
    assert int(ulp_distance(c, t).max()) == 1


def test_orders_agree_bitwise_under_pow2_scales():
    g = torch.Generator().manual_seed(12)
    acc = torch.randint(-2**24, 2**24, (512, 512), generator=g, dtype=torch.int32)
    s_a = torch.exp2(torch.randint(-12, -2, (512,), generator=g).to(torch.float32))
    s_w = torch.exp2(torch.randint(-14, -8, (512,), generator=g).to(torch.float32))
    assert torch.equal(bf16_bits(epilogue(acc, s_a, s_w, "cutlass")), bf16_bits(epilogue(acc, s_a, s_w, "triton")))


def test_orders_can_disagree_on_nan_versus_zero():
    """inf * 0 is order-dependent: CUTLASS order overflows s_w*acc first, Triton order zeroes s_a*acc."""
    acc = torch.tensor([[2**30]], dtype=torch.int32)
    s_a, s_w = torch.tensor([0.0]), torch.tensor([1e30])
    assert torch.isnan(epilogue(acc, s_a, s_w, "cutlass")).all()
    triton = epilogue(acc, s_a, s_w, "triton")
    assert bf16_bits(triton).item() == 0


def test_nan_output_is_quiet_and_signed():
    acc = torch.tensor([[2**30, -(2**30)]], dtype=torch.int32)
    y = epilogue(acc, torch.tensor([0.0]), torch.tensor([1e30, 1e30]), "cutlass")
    bits = bf16_bits(y).tolist()[0]
    assert all((b & 0x7FC0) == 0x7FC0 for b in bits)  # exponent all ones, quiet bit set


@pytest.mark.parametrize("bad", ["dtype", "shape", "scale_shape", "scale_dtype", "k"])
def test_bad_operands_are_refused(bad):
    a_q, w_q, s_a, s_w = operands(4, 32, 8, 0)
    if bad == "dtype":
        a_q = a_q.to(torch.int16)
    elif bad == "shape":
        w_q = w_q[None]
    elif bad == "scale_shape":
        s_a = s_a[:, None]
    elif bad == "scale_dtype":
        s_w = s_w.to(torch.bfloat16)
    else:
        w_q = w_q[:, :16]
    with pytest.raises(InputError, match="exact-cutlass-order"):
        get("exact-cutlass-order", "cpu").scaled_mm(a_q, w_q, s_a, s_w)


def test_operands_on_another_device_than_selected_are_refused():
    arm = ExactArm("triton", "cuda")
    with pytest.raises(InputError, match="selected for cuda"):
        arm.scaled_mm(*operands(2, 16, 8, 0))
    assert arm.available()[0] == torch.cuda.is_available()


def test_evidence_labels_the_emulation():
    ev = get("exact-triton-order", "cpu").evidence()
    assert ev["arm"] == "exact-triton-order" and ev["is_emulation"] is True
    assert ev["note"] == EMULATION_NOTE
    assert ev["device"] == "cpu" and ev["epilogue_order"] == "triton"
    assert set(ev["versions"]) == {"torch", "triton", "vllm"}


@CUDA
@pytest.mark.parametrize("order", ORDERS)
def test_cpu_and_gpu_emulations_agree(order):
    cases = [operands(33, 2048, 128, 21), operands(5, 512, 64, 22, sa=(1e-44, 1.2e-38)),
             operands(4, 512, 64, 23, sa=(1e30, 1e31), sw=(1e3, 1e4))]
    cpu, gpu = get(f"exact-{order}-order", "cpu"), get(f"exact-{order}-order", "cuda")
    for case in cases:
        y_cpu = cpu.scaled_mm(*case)
        y_gpu = gpu.scaled_mm(*(t.cuda() for t in case))
        assert torch.equal(bf16_bits(y_cpu), bf16_bits(y_gpu.cpu()))

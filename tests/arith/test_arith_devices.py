"""The same bits on CPU and GPU: the contract that lets a CPU emulation stand in for a GPU check."""

from __future__ import annotations

import pytest
import torch

from int8alibi.arith import bf16_bits, bf16_round, exact_accumulator, snap_pow2, ulp_distance

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: cross-device check not applicable")


def random_floats(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    """Every bit pattern is equally likely: all value classes, NaNs and subnormals included."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.float32:
        bits = torch.randint(-(2**31), 2**31, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
    else:
        bits = torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen, dtype=torch.int64)
    return bits.view(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["rne", "rtz"])
def test_bf16_round_is_bitwise_identical_on_cpu_and_cuda(dtype: torch.dtype, mode: str) -> None:
    x = random_floats(dtype, 1 << 20, seed=9)
    cpu = bf16_round(x, mode)
    cuda = bf16_round(x.cuda(), mode)
    assert torch.equal(bf16_bits(cpu), bf16_bits(cuda).cpu())
    assert torch.equal(ulp_distance(cpu, cpu), ulp_distance(cuda, cuda).cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["nearest", "ceiling"])
def test_snap_pow2_is_identical_on_cpu_and_cuda(dtype: torch.dtype, mode: str) -> None:
    gen = torch.Generator().manual_seed(10)
    s = torch.exp2(torch.empty(1 << 16, dtype=torch.float64).uniform_(-120, 120, generator=gen)).to(dtype)
    assert torch.equal(snap_pow2(s, mode), snap_pow2(s.cuda(), mode).cpu())


def test_exact_accumulator_is_identical_on_cpu_and_cuda() -> None:
    gen = torch.Generator().manual_seed(11)
    a = torch.randint(-128, 128, (64, 6144), generator=gen, dtype=torch.int8)
    w = torch.randint(-128, 128, (96, 6144), generator=gen, dtype=torch.int8)
    cpu = exact_accumulator(a, w)
    assert torch.equal(cpu, exact_accumulator(a.cuda(), w.cuda()).cpu())
    assert torch.equal(cpu, exact_accumulator(a.cuda(), w.cuda(), path="int64", chunk=1000).cpu())

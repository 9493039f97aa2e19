"""An independent reference for the kernel epilogues, built without ``int8alibi.arith``.

Accumulator: int64 matmul on CPU, int32 wrap by ``remainder``. Each float32 multiply is done as an
exact float64 product (24-bit x 24-bit significands fit in 53 bits) rounded once to float32, which
is what IEEE float32 multiplication means; the bf16 rounding is torch's own CPU cast (round to
nearest even) for every number. torch's cast does not keep NaN bits (its CPU cast gives 0xFFFF for
every NaN), and the kernels' NaN is not the CPU's: an NVIDIA GPU's float32 multiply returns the
canonical NaN 0x7FFFFFFF whatever the operands (x86 gives 0xFFC00000 for inf * 0), which rounds to
bf16 0x7FFF under the project's rule (sign and leading payload bits kept, quiet bit set). So every
NaN of the reference is 0x7FFF, written out here. Nothing here shares code with the arms under test.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


def reference_output(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
                     order: str) -> torch.Tensor:
    """bf16 [M,N] of the named epilogue order, from an independent construction (CPU)."""
    a_q, w_q, s_a, s_w = (t.cpu() for t in (a_q, w_q, s_a, s_w))
    exact = a_q.to(torch.int64) @ w_q.to(torch.int64).T
    acc = torch.remainder(exact + 2**31, 2**32) - 2**31
    acc_f32 = acc.to(torch.float64).to(torch.float32).to(torch.float64)  # int -> f32 rounding, once

    def mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.float64) * y.to(torch.float64)).to(torch.float32)

    sa, sw = s_a[:, None], s_w[None, :]
    y = mul(sa, mul(sw, acc_f32)) if order == "cutlass" else mul(sw, mul(sa, acc_f32))
    out = y.to(torch.bfloat16)
    nan = torch.isnan(y)
    if bool(nan.any()):
        gpu_nan_bf16 = (0x7FFFFFFF >> 16) | 0x0040  # the GPU's canonical NaN, rounded: 0x7FFF
        bits = out.view(torch.int16).to(torch.int64) & 0xFFFF
        bits = torch.where(nan, torch.full_like(bits, gpu_nan_bf16), bits)
        out = torch.where(bits >= 0x8000, bits - 0x10000, bits).to(torch.int16).view(torch.bfloat16)
    return out


@pytest.fixture
def reference() -> Callable[..., torch.Tensor]:
    return reference_output


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bitwise equality of two bf16 tensors: signed zeros and NaN sign and payload bits all count."""
    x, y = x.cpu(), y.cpu()
    return x.shape == y.shape and x.dtype == y.dtype and bool(torch.equal(x.view(torch.int16), y.view(torch.int16)))


@pytest.fixture
def bits_match() -> Callable[[torch.Tensor, torch.Tensor], bool]:
    return same_bits

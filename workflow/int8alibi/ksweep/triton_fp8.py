"""The project's own Triton FP8 (e4m3) GEMM: the sweep's second FP8 arm where vLLM is absent.

One fixed program: 128 x 128 output tiles, K consumed in steps of 128 by ``tl.dot`` into a float32
accumulator (Triton picks the tensor-core instruction and its accumulation), then the Triton-order
epilogue ``bf16(s_w * (s_a * acc))`` in float32, rounded to nearest even by the GPU's cast. GPU
only: the interpreter rounds that cast differently (see ``kernels.triton_arm``), and no CPU test
stands in for the GPU's float accumulation, which is the very thing the sweep measures.
Import this module only where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import InputError
from .operands import FP8

BLOCK = (128, 128, 128)  # (M, N, K) per program and per accumulation step
NUM_WARPS, NUM_STAGES = 8, 3


@triton.jit
def _fp8_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_cm,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + rn[None, :] * stride_bn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K),
                    other=0.0)
        acc = tl.dot(a, b, acc)
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
    sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)
    out = sb[None, :] * (sa[:, None] * acc)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], out.to(tl.bfloat16),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def scaled_mm_fp8(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """``a_q`` [M,K] and ``w_q`` [N,K] e4m3 (row-major), ``s_a`` [M], ``s_w`` [N] float32 -> bf16 [M,N]."""
    if a_q.dtype != FP8 or w_q.dtype != FP8 or a_q.dim() != 2 or w_q.dim() != 2 or a_q.shape[1] != w_q.shape[1]:
        raise InputError(f"triton-fp8: expected e4m3 [M,K] and [N,K], got {a_q.dtype} {tuple(a_q.shape)} and "
                         f"{w_q.dtype} {tuple(w_q.shape)}")
    if not a_q.is_cuda:
        raise InputError("triton-fp8: runs on a CUDA device only")
    m, k = a_q.shape
    n = w_q.shape[0]
    a, w = a_q.contiguous(), w_q.contiguous()
    sa, sw = s_a.contiguous().float().view(m), s_w.contiguous().float().view(n)
    out = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, BLOCK[0]), triton.cdiv(n, BLOCK[1]))
    _fp8_kernel[grid](a, w, sa, sw, out, m, n, k, a.stride(0), w.stride(0), out.stride(0),
                      BLOCK_M=BLOCK[0], BLOCK_N=BLOCK[1], BLOCK_K=BLOCK[2], num_warps=NUM_WARPS,
                      num_stages=NUM_STAGES)
    return out

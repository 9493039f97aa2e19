"""vLLM's dynamic per-token int8 activation rule as one Triton kernel: the CUDA path of the W8A8 layers.

``quant.activation.quantize_per_token`` states the rule with torch operations (about a dozen
launches per call); at decode sizes a W8A8 model spends most of a step launching them. This
kernel computes the same bits in one launch, one program per token row:

* ``absmax = max |f32(x)|`` (a maximum: exact in any order);
* ``s_a = absmax / 127`` and ``inverse = 127 / absmax`` by IEEE round-to-nearest division
  (PTX ``div.rn.f32``: not Triton's default approximate ``/``, and not libdevice's, which Triton
  builds with subnormals flushed to zero), ``inverse = 0`` where ``absmax == 0``;
* ``q = rint(f32(x) * inverse)`` (one IEEE float32 product, ``mul.rn.f32``, nothing to contract
  into an FMA; ``rint`` rounds half to even), clamped to [-128, 127] and converted to int8 (exact
  on integers; the clamp propagates NaN, as torch's does);
* a count of non-finite elements (one counter per call), so such input is refused as the torch rule
  refuses it.

The GPU test compares it bit for bit with the torch rule on boundary rows (zeros, exact halves,
subnormals, bf16's largest values, every K tail) and at the papers' shapes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..errors import InputError
from ..quant.activation import Q_MAX, Q_MIN, SCALE_DIVISOR
from .triton_arm import LAUNCHERS

BLOCK_K = 1024


@triton.jit
def _div_rn(a, b):
    """IEEE float32 division that keeps subnormals (PTX ``div.rn.f32``): Triton compiles its own float
    arithmetic and libdevice calls with denormals flushed to zero."""
    return tl.inline_asm_elementwise("div.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _mul_rn(a, b):
    """IEEE float32 product that keeps subnormals (PTX ``mul.rn.f32``; see ``_div_rn``)."""
    return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _per_token_kernel(x_ptr, q_ptr, s_ptr, bad_ptr, K, stride_x, stride_q,
                      DIVISOR: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    # magnitudes as float32 bit patterns: for non-negative floats the integer order is the float order,
    # so the absmax is an integer maximum (exact, subnormals included)
    absmax_bits = tl.zeros((BLOCK,), dtype=tl.int32)
    bad = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, K, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        mag = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        finite = mag < 0x7F800000
        bad += (~finite).to(tl.int32)
        absmax_bits = tl.maximum(absmax_bits, tl.where(finite, mag, 0))
    amax_bits = tl.max(absmax_bits, axis=0)
    amax = amax_bits.to(tl.float32, bitcast=True)
    divisor = tl.full((), DIVISOR, tl.float32)
    scale = _div_rn(amax, divisor)
    inverse = _div_rn(divisor, tl.where(amax_bits == 0, 1.0, amax))
    inverse = tl.where(amax_bits == 0, 0.0, inverse)
    tl.store(s_ptr + row, scale)
    tl.atomic_add(bad_ptr, tl.sum(bad, axis=0))  # one counter for the call: no reduction launch after it
    for start in range(0, K, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        q = libdevice.rint(_mul_rn(x, tl.zeros_like(x) + inverse))
        q = tl.minimum(tl.maximum(q, QMIN, propagate_nan=tl.PropagateNan.ALL), QMAX, propagate_nan=tl.PropagateNan.ALL)
        tl.store(q_ptr + row * stride_q + offs, q.to(tl.int8), mask=offs < K)


def quantize_per_token_cuda(x: torch.Tensor, *, what: str = "activations",
                            nonfinite: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_per_token`` for a contiguous-rows CUDA ``x`` [M,K] (bf16, f16 or f32), in one launch.

    Non-finite elements have no int8 scale: without ``nonfinite`` the call reads its count back and
    raises. Given ``nonfinite`` (an int32 CUDA scalar), the count is added to it on the device and
    nothing is read back: the caller checks it later (``model.w8a8.NonFiniteGuard``, once per forward
    instead of once per layer, which would stall the host 196 times a decode step).
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point() or not x.is_cuda:
        got = f"{x.dtype} {tuple(x.shape)} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise InputError(f"{what}: expected a 2-D floating CUDA tensor [M,K], got {got}")
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    a_q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    s_a = torch.empty((m,), dtype=torch.float32, device=x.device)
    bad = torch.zeros((), dtype=torch.int32, device=x.device) if nonfinite is None else nonfinite
    if m:  # launched directly after the first call with these shapes (see triton_arm._Launchers)
        LAUNCHERS.launch(_per_token_kernel, (m,), (x, a_q, s_a, bad, k, x.stride(0), a_q.stride(0),
                                                    SCALE_DIVISOR, float(Q_MIN), float(Q_MAX), BLOCK_K))
    if nonfinite is None:
        count = int(bad)
        if count:
            raise InputError(f"{what}: {count} non-finite element(s); no int8 scale represents them")
    return a_q, s_a

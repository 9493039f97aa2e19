"""vLLM's dynamic per-token int8 activation rule, as its quantization kernel computes it.

Per token row, in float32: ``absmax = max |x|``, scale ``s_a = absmax / 127`` and inverse scale
``127 / absmax`` (both IEEE divisions of tensors, so CUDA does not turn them into reciprocal
multiplies), then each element ``round_half_even(f32(x) * inverse)`` saturated to int8. An all-zero
row has absmax 0: the kernel sets the inverse to 0, so the scale and every quantized element are 0.
The product never exceeds 127 * (1 + 2^-23)^2 < 127.5 in magnitude, so the saturation to
[-128, 127] never acts and |a_q| <= 127, the activation half of the int32 product bound.
"""

from __future__ import annotations

import torch

from ..errors import InputError

SCALE_DIVISOR = 127.0
Q_MIN, Q_MAX = -128, 127


def quantize_per_token(x: torch.Tensor, *, what: str = "activations") -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M,K] (bf16, f16 or f32) -> ``(a_q int8 [M,K], s_a float32 [M])`` on ``x``'s device."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise InputError(f"{what}: expected a 2-D floating tensor [M,K], got {got}")
    xf = x.to(torch.float32, copy=True)  # a copy of its own: the scaling below is taken in place
    absmax = xf.abs().amax(dim=1)
    if not bool(torch.isfinite(absmax).all()):  # amax propagates NaN: a row is finite iff its absmax is
        raise InputError(f"{what}: {int((~torch.isfinite(xf)).sum())} non-finite element(s); "
                         "no int8 scale represents them")
    divisor = torch.full_like(absmax, SCALE_DIVISOR)
    s_a = absmax / divisor
    inverse = (divisor / absmax).masked_fill_(absmax == 0, 0.0)  # an all-zero row: 0, not 127 / 0
    a_q = xf.mul_(inverse[:, None]).round_().clamp_(Q_MIN, Q_MAX).to(torch.int8)
    return a_q, s_a

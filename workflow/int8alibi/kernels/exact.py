"""The two epilogue orders of the real kernels, and the exact arms that emulate them on any device.

The int32 accumulator is exact (int64/float64 sum); only the float32 epilogue differs between
kernels. Where the sum does not fit int32 (16256·K >= 2**31, outside the alibi's precondition) the
emulation wraps in two's complement, the kernel semantics the project specifies
(``arith.wrap_int32``). Measured on an H200, cuBLASLt (``torch._int_mm``) and Triton's ``tl.dot``
saturate instead, at every accumulation step, which no order-free emulation can reproduce;
``validate_gpu`` records it. vLLM's CUTLASS
kernel computes ``bf16_rne(s_a · (s_w · f32(acc)))``, its Triton kernel
``bf16_rne(s_w · (s_a · f32(acc)))``. Each multiply here is one IEEE float32 multiply on the
device, and the bf16 rounding is ``arith.bf16_round``'s (on the CPU without a NaN, torch's cast,
which rounds the same: ``arith.bf16_rne``). NaN is the one
place where devices disagree: x86 makes 0xFFC00000 for inf·0 and keeps operand payloads, while an
NVIDIA GPU's float32 multiply returns the canonical NaN 0x7FFFFFFF whatever the operands (measured
on an H200, emulation and real kernels). The emulation gives every NaN product the GPU's bits, so
CPU and GPU give the same bits, NaNs included, and they are the kernels' bits.
"""

from __future__ import annotations

from typing import Literal

import torch

from ..arith import INT8_PRODUCT_MAX, INT32_LIMIT, bf16_round, exact_accumulator, exact_int32, has_nan, wrap_int32
from .base import arm_evidence, as_device, check_device, check_operands, check_pair

EpilogueOrder = Literal["cutlass", "triton"]


def epilogue(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, order: EpilogueOrder) -> torch.Tensor:
    """Scale an int32 accumulator [M,N] in float32 in the given kernel's order, round once to bf16.

    The two products are taken in place on the converted accumulator (an IEEE product does not
    depend on its operands' order, so ``y * s_w`` is ``s_w * y`` bit for bit).
    """
    y = acc.to(torch.float32, copy=True)  # int32 -> float32 rounds to nearest even above 2**24
    if order == "cutlass":
        y.mul_(s_w).mul_(s_a[:, None])
    else:
        y.mul_(s_a[:, None]).mul_(s_w)
    if y.device.type != "cpu" or has_nan(y):  # on the CPU the check is cheaper than the where
        return bf16_round(torch.where(torch.isnan(y), _gpu_nan(y.device), y), "rne")
    return y.to(torch.bfloat16)  # no NaN on the CPU: torch's cast is this rounding (``arith.bf16_rne``)


def _gpu_nan(device: torch.device) -> torch.Tensor:
    """The canonical NaN an NVIDIA GPU's float32 multiply returns (bits 0x7FFFFFFF)."""
    return torch.tensor(0x7FFFFFFF, dtype=torch.int32, device=device).view(torch.float32)


def kernel_accumulator(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """The int32 accumulator: the exact sum, wrapped to int32 where it does not fit (see module doc).
    Every int8 product is at most 2**14 in magnitude, so below K = 2**17 nothing can wrap."""
    if INT8_PRODUCT_MAX * a_q.shape[1] < INT32_LIMIT:
        return exact_int32(a_q, w_q)
    return wrap_int32(exact_accumulator(a_q, w_q))


class ExactArm:
    """Exact accumulator + one kernel's epilogue order; an emulation, labelled as such everywhere."""

    is_emulation = True

    def __init__(self, order: EpilogueOrder, device: torch.device | str | None = None) -> None:
        self.order: EpilogueOrder = order
        self.name = f"exact-{order}-order"
        self.device = as_device(device)

    def available(self) -> tuple[bool, str]:
        if self.device.type == "cuda" and not torch.cuda.is_available():
            return False, "no CUDA GPU visible to torch"
        return True, f"exact emulation runs on any device ({self.device.type} here)"

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
        check_pair(a_q, w_q, self.name)
        check_device(a_q, self.device, self.name)
        return kernel_accumulator(a_q, w_q)

    def scaled_mm(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        check_operands(a_q, w_q, s_a, s_w, self.name)
        check_device(a_q, self.device, self.name)
        return epilogue(kernel_accumulator(a_q, w_q), s_a, s_w, self.order)

    def evidence(self) -> dict[str, object]:
        tree = "s_a*(s_w*f32(acc))" if self.order == "cutlass" else "s_w*(s_a*f32(acc))"
        return arm_evidence(
            self.name,
            f"int8alibi.kernels.exact: int64-exact accumulator wrapped to int32, float32 epilogue {tree}, "
            "bf16 round-to-nearest-even on integer bits",
            self.device,
            is_emulation=True,
            epilogue_order=self.order,
        )

"""The cuBLASLt arm: ``torch._int_mm`` computes the int32 accumulator, then the CUTLASS-order epilogue.

``torch._int_mm`` on CUDA dispatches to cuBLASLt's int8 GEMM with int32 output and requires
M > 16 and K, N multiples of 8. Shorter activations (decode, M=1) are padded with zero rows,
which add zero rows to the product and are sliced off: the accumulator of the real rows is
unchanged. The arm keeps one padded buffer per (M, K, device) whose zero rows are never written, so
a decode step copies its row in (one kernel) instead of building the padding anew (two).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .base import OperandCheckCache, arm_evidence, as_device, check_device, check_multiple, check_operands, check_pair
from .exact import epilogue

INT_MM_MIN_ROWS = 17  # torch._int_mm needs M > 16 on CUDA


def pad_rows(a_q: torch.Tensor, min_rows: int = INT_MM_MIN_ROWS) -> torch.Tensor:
    """``a_q`` with zero rows appended up to ``min_rows`` (unchanged when it already has enough)."""
    missing = min_rows - a_q.shape[0]
    if missing <= 0:
        return a_q
    return torch.cat([a_q, a_q.new_zeros(missing, a_q.shape[1])])


def int_mm_accumulator(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """``a_q · w_qᵀ`` in int32 through ``torch._int_mm``, padding and slicing M as it requires."""
    m = a_q.shape[0]
    return torch._int_mm(pad_rows(a_q.contiguous()), w_q.contiguous().t())[:m]


class CublasLtArm:
    """cuBLASLt int8 GEMM (binary) + CUTLASS-order float32 epilogue (torch ops, bf16 by integer bits)."""

    name = "cublaslt"
    is_emulation = False

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = as_device(device)
        self._plans = OperandCheckCache()
        self._pads: dict[tuple[int, int, torch.device], torch.Tensor] = {}

    def available(self) -> tuple[bool, str]:
        if self.device.type != "cuda":
            return False, "cublaslt needs a CUDA device (torch._int_mm's cuBLASLt path); selected device is cpu"
        if not torch.cuda.is_available():
            return False, "no CUDA GPU visible to torch"
        return True, "torch._int_mm on CUDA"

    def _check(self, a_q: torch.Tensor, w_q: torch.Tensor) -> None:
        check_device(a_q, self.device, self.name)
        _, k, n = check_pair(a_q, w_q, self.name)
        check_multiple(k, 8, "K", self.name)
        check_multiple(n, 8, "N", self.name)

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
        self._plans.once((a_q, w_q), lambda: self._check(a_q, w_q))
        return int_mm_accumulator(a_q, w_q)

    def scaled_mm(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        def build() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
            check_operands(a_q, w_q, s_a, s_w, self.name)
            self._check(a_q, w_q)
            if self.device.type != "cuda":  # the torch-op emulation of the epilogue
                return lambda acc, sa, sw: epilogue(acc, sa, sw, "cutlass")
            from .triton_arm import CutlassEpiloguePlan, cutlass_epilogue

            if s_a.is_contiguous() and s_w.is_contiguous():
                return CutlassEpiloguePlan()  # one fused Triton kernel, launched directly after the first call
            return lambda acc, sa, sw: cutlass_epilogue(acc, sa.contiguous(), sw.contiguous())

        finish = self._plans.plan((a_q, w_q, s_a, s_w), build)
        m = a_q.shape[0]
        if m >= INT_MM_MIN_ROWS and a_q.is_contiguous() and w_q.is_contiguous():
            acc = torch._int_mm(a_q, w_q.t())
        elif 0 < m and a_q.is_cuda and w_q.is_contiguous():
            acc = torch._int_mm(self._padded(a_q), w_q.t())[:m]
        else:
            acc = int_mm_accumulator(a_q, w_q)
        return finish(acc, s_a, s_w)

    def _padded(self, a_q: torch.Tensor) -> torch.Tensor:
        """``a_q`` (M < 17 rows) copied over the first rows of this shape's buffer, whose other rows stay zero."""
        key = (a_q.shape[0], a_q.shape[1], a_q.device)
        pad = self._pads.get(key)
        if pad is None:
            pad = self._pads[key] = a_q.new_zeros(INT_MM_MIN_ROWS, a_q.shape[1])
        pad[:a_q.shape[0]].copy_(a_q)
        return pad

    def evidence(self) -> dict[str, object]:
        return arm_evidence(
            self.name,
            "torch._int_mm (cuBLASLt int8 GEMM, int32 output; M padded to >= 17 with zero rows) + "
            "float32 epilogue s_a*(s_w*f32(acc)), bf16 round-to-nearest-even on integer bits, "
            "as one Triton kernel (int8alibi.kernels.triton_arm.cutlass_epilogue)",
            self.device,
            is_emulation=False,
            epilogue_order="cutlass",
        )

"""Thin adapters over vLLM's own W8A8 kernels: ``cutlass_scaled_mm`` and ``triton_scaled_mm``.

The operands are laid out the way vLLM's compressed-tensors W8A8 layer passes them: activations
row-major [M,K], the weight as a column-major [K,N] view of the stored [N,K] tensor (``w_q.t()``),
per-token scales float32 [M,1], per-channel scales float32 [N,1], bf16 output. Argument
preparation is pure torch and is tested without vLLM; vLLM itself is imported only when an arm
runs, so importing int8alibi never needs it.

``cutlass_scaled_mm`` silently routes to vLLM's Triton kernel when K or N is not a multiple of
16, or on ROCm; the adapter refuses those cases so that the evidence cannot name the wrong binary.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import InputError
from .base import arm_evidence, as_device, check_device, check_multiple, check_operands, package_version

VllmKernel = Literal["cutlass", "triton"]

# Where each vLLM function lives (module, attribute). The Triton kernel has kept this module path
# across vLLM releases; ``cutlass_scaled_mm`` is the public custom-op wrapper.
VLLM_FUNCTIONS: dict[str, tuple[str, str]] = {
    "cutlass": ("vllm._custom_ops", "cutlass_scaled_mm"),
    "triton": ("vllm.model_executor.layers.quantization.compressed_tensors.triton_scaled_mm", "triton_scaled_mm"),
}


@dataclass(frozen=True)
class ScaledMMArgs:
    """The positional arguments of both vLLM functions: (a, b, scale_a, scale_b, out_dtype)."""

    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    out_dtype: torch.dtype


def prepare_args(
    a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, who: str = "vllm"
) -> ScaledMMArgs:
    """vLLM's layout for our operands: a row-major, b = column-major [K,N] view, scales [M,1], [N,1]."""
    m, k, n = check_operands(a_q, w_q, s_a, s_w, who)
    check_multiple(k, 16, "K", who)
    check_multiple(n, 16, "N", who)
    return ScaledMMArgs(
        a=a_q.contiguous(),
        b=w_q.contiguous().t(),
        scale_a=s_a.contiguous().view(m, 1),
        scale_b=s_w.contiguous().view(n, 1),
        out_dtype=torch.bfloat16,
    )


def resolve(kernel: VllmKernel) -> Callable[..., torch.Tensor]:
    """The vLLM function for ``kernel``; InputError naming the module when vLLM cannot provide it."""
    module_name, attr = VLLM_FUNCTIONS[kernel]
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # vLLM import failures are many kinds (missing, CUDA mismatch, ...)
        raise InputError(f"vllm-{kernel}: cannot import {module_name}: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise InputError(f"vllm-{kernel}: {module_name} has no function {attr} (vLLM {package_version('vllm')})")
    return fn


class VllmArm:
    """vLLM's ``cutlass_scaled_mm`` or ``triton_scaled_mm`` run as-is (binary, no emulation)."""

    is_emulation = False

    def __init__(self, kernel: VllmKernel, device: torch.device | str | None = None) -> None:
        self.kernel: VllmKernel = kernel
        self.name = f"vllm-{kernel}"
        self.device = as_device(device)

    def available(self) -> tuple[bool, str]:
        if self.device.type != "cuda":
            return False, f"{self.name} runs on a CUDA device; selected device is {self.device.type}"
        if importlib.util.find_spec("vllm") is None:
            return False, "vLLM is not installed"
        if self.kernel == "cutlass" and torch.version.hip is not None:
            return False, "ROCm build: vLLM routes cutlass_scaled_mm to its Triton kernel"
        if not torch.cuda.is_available():
            return False, "no CUDA GPU visible to torch"
        try:
            resolve(self.kernel)
        except InputError as exc:
            return False, str(exc)
        return True, f"vLLM {package_version('vllm')} importable"

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> None:
        """vLLM's kernels fuse the epilogue; their accumulator is not observable."""
        return None

    def scaled_mm(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        args = prepare_args(a_q, w_q, s_a, s_w, self.name)
        check_device(args.a, self.device, self.name)
        out = resolve(self.kernel)(args.a, args.b, args.scale_a, args.scale_b, args.out_dtype)
        m, n = a_q.shape[0], w_q.shape[0]
        if out.dtype != torch.bfloat16 or tuple(out.shape) != (m, n):
            raise InputError(f"{self.name}: returned {out.dtype} {tuple(out.shape)}, expected bfloat16 [{m}, {n}]")
        return out

    def evidence(self) -> dict[str, object]:
        module_name, attr = VLLM_FUNCTIONS[self.kernel]
        return arm_evidence(
            self.name,
            f"{module_name}.{attr} (vLLM's own kernel; weight as column-major [K,N] view, "
            "float32 scales [M,1] and [N,1], bf16 out)",
            self.device,
            is_emulation=False,
            epilogue_order=self.kernel,
        )

"""The parent model's own float arithmetic, computed the same way on every CPU.

A bf16 ``nn.Linear`` on CPU takes oneDNN's AVX-512-BF16 kernels on some CPUs and ATen's scalar
loop on others, and the fused attention kernel packs its operands differently where the CPU has
AMX: the same model gives other logits on another machine. ``make_portable`` keeps every rounding
point of the bf16 model and fixes only the accumulation path: an unquantized linear multiplies in
float32 (exact products of bf16 values, MKL's reproducible branch, see ``int8alibi.portable``) and
rounds once to bf16, which is what a bf16 GEMM with a float32 accumulator computes; attention
runs the model's eager code (matmul, float32 softmax, matmul) instead of the fused CPU kernel.
On a GPU the linear keeps torch's own bf16 path: GPU bytes are a property of the GPU, recorded.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION = "eager"


class PortableLinear(nn.Linear):
    """``nn.Linear`` whose CPU bf16 forward is a float32 GEMM rounded once to bf16 (same parameters).

    The float32 copy of the weight is kept between calls (decoding calls a layer once per token)
    unless ``keep_float32`` is False: a model run once, as the model stage's round-trip check runs
    two of them, would otherwise hold twice its own bytes in copies (``keep_float32_copies``)."""

    keep_float32 = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dtype != torch.bfloat16 or self.weight.dtype != torch.bfloat16:
            return super().forward(x)
        bias = None if self.bias is None else self.bias.float()
        weight = self._weight32() if self.keep_float32 else self.weight.detach().float()
        return F.linear(x.float().contiguous(), weight, bias).to(torch.bfloat16)

    def _weight32(self) -> torch.Tensor:
        """The float32 copy of the weight (exact), made once and remade when the weight is replaced or
        modified in place through the parameter (edits through ``.data`` are not tracked by torch)."""
        key = (self.weight.data_ptr(), self.weight._version)
        if getattr(self, "_w32_key", None) != key:
            self._w32 = self.weight.detach().float().contiguous()
            self._w32_key = key
        return self._w32


def keep_float32_copies(model: Any, keep: bool) -> None:
    """Whether ``model``'s portable linears keep their float32 weight copies; dropping them frees
    the copies already made. The products are the same either way (the copy is exact)."""
    for module in model.modules():
        if isinstance(module, PortableLinear):
            module.keep_float32 = keep
            if not keep:
                module.__dict__.pop("_w32", None)
                module.__dict__.pop("_w32_key", None)


def make_portable(model: Any) -> Any:
    """Switch ``model`` (in place) to eager attention and ``PortableLinear``; returns it.

    Only plain ``nn.Linear`` modules change class; parameters, names and saved files stay as they
    were, and W8A8 modules swapped in later are untouched.
    """
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTENTION)
    else:
        model.config._attn_implementation = ATTENTION
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PortableLinear
    return model

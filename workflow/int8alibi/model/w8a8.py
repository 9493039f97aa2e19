"""W8A8 linear layers: a model's projections replaced by int8 GEMMs that run on a kernel arm.

Only the seven projections of each block are replaced; attention, norms, rotary embeddings, the
embeddings and lm_head stay the model's own bf16 code. So two arms differ only inside the scaled
GEMM. A ``W8A8Linear`` quantizes its input per token (vLLM's dynamic rule), hands the operands to
the arm exactly as a kernel receives them (``s_w`` widened to float32 and flattened), and reshapes
the bf16 result.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from ..quant.activation import quantize_per_token
from ..quant.weight import Division, Mode, QuantizedWeight, requantize
from .layers import quantized_linears, set_module

Tap = Callable[["W8A8Linear", torch.Tensor, torch.Tensor], None]


class W8A8Linear(nn.Module):
    """``y = arm.scaled_mm(quantize_per_token(x), w_q, s_a, f32(s_w))`` for bf16 ``x`` [..., K]."""

    w_q: torch.Tensor  # buffers, registered in __init__
    s_w: torch.Tensor
    s_w32: torch.Tensor

    def __init__(self, w_q: torch.Tensor, s_w: torch.Tensor, arm: Any, *, name: str = "") -> None:
        super().__init__()
        if w_q.dtype != torch.int8 or w_q.dim() != 2:
            raise InputError(f"W8A8Linear {name}: w_q must be int8 [N,K], got {w_q.dtype} {tuple(w_q.shape)}")
        if s_w.dtype != torch.bfloat16 or tuple(s_w.shape) != (w_q.shape[0], 1):
            raise InputError(f"W8A8Linear {name}: s_w must be bf16 [{w_q.shape[0]}, 1], got {s_w.dtype} {tuple(s_w.shape)}")
        self.name = name
        self.out_features, self.in_features = w_q.shape
        self.register_buffer("w_q", w_q)
        self.register_buffer("s_w", s_w)
        self.register_buffer("s_w32", s_w.float().flatten(), persistent=False)
        self.arm = arm
        self.taps: list[Tap] = []  # called with the operands each forward hands to the arm
        self.nonfinite: torch.Tensor | None = None  # this layer's counter in a NonFiniteGuard, if any
        self.group: Any = None  # its model.projection_groups.ProjectionGroup: the layers reading its input as one GEMM

    def quantized(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` [..., K] quantized per token: int8 rows [M, K] and their float32 scales [M]."""
        if x.dtype != torch.bfloat16 or x.shape[-1] != self.in_features:
            raise InputError(f"W8A8Linear {self.name}: input must be bf16 [..., {self.in_features}], "
                             f"got {x.dtype} {tuple(x.shape)}")
        flat, what = x.reshape(-1, self.in_features), f"{self.name} input"
        if x.is_cuda:
            from ..kernels.activation_quant import quantize_per_token_cuda

            return quantize_per_token_cuda(flat, what=what, nonfinite=self.nonfinite)
        return quantize_per_token(flat, what=what)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is not None and self.group.active:
            y = self.group.output(self, x)
            if y is not None:
                return y
        a_q, s_a = self.quantized(x)
        for tap in self.taps:
            tap(self, a_q, s_a)
        y = self.arm.scaled_mm(a_q, self.w_q, s_a, self.s_w32)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, arm={getattr(self.arm, 'name', self.arm)}"


class NonFiniteGuard:
    """One int32 counter per W8A8 layer of a CUDA model, on the device, for the non-finite elements
    of the layer's input; checked after each forward of the model (one read-back, not one per layer).

    A non-finite activation has no int8 scale, so the forward fails closed, naming the first layer
    (in execution order) whose input held one; its outputs are never returned.
    """

    def __init__(self, layers: list[W8A8Linear], device: torch.device) -> None:
        self.names = [layer.name for layer in layers]
        self.counts = torch.zeros(len(layers), dtype=torch.int32, device=device)
        for i, layer in enumerate(layers):
            layer.nonfinite = self.counts[i]  # a view: the layer's kernel adds into this slot

    def check(self) -> None:
        if not bool(self.counts.any()):
            return
        counts = self.counts.tolist()
        self.counts.zero_()
        hits = [(name, count) for name, count in zip(self.names, counts) if count]
        name, count = hits[0]
        later = f" (and {len(hits) - 1} later layer(s))" if len(hits) > 1 else ""
        raise InputError(f"{name} input: {count} non-finite element(s); no int8 scale represents them{later}")


_GUARDS: weakref.WeakKeyDictionary[nn.Module, NonFiniteGuard] = weakref.WeakKeyDictionary()


def guard_of(model: nn.Module) -> NonFiniteGuard | None:
    """The guard ``swap_linears`` gave a CUDA model, for a caller that bypasses its forward hook (a
    CUDA graph's replay checks it after each step); None on the CPU."""
    return _GUARDS.get(model)


def _guard_hook(guard: NonFiniteGuard) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        guard.check()

    return hook


def quantize_linears(model: nn.Module, mode: Mode = "none", division: Division = "bf16") -> dict[str, QuantizedWeight]:
    """Every projection of ``model`` quantized by the weight rule (``mode`` = none/nearest/ceiling)."""
    out: dict[str, QuantizedWeight] = {}
    for ref in quantized_linears(model):
        module = model.get_submodule(ref.name)
        if not isinstance(module, nn.Linear):
            raise InputError(f"{ref.name}: is {type(module).__name__}, expected a bf16 nn.Linear to quantize")
        out[ref.name] = requantize(module.weight.detach(), mode, division, what=ref.name)
    return out


def swap_linears(model: nn.Module, checkpoint: Mapping[str, QuantizedWeight], arm: object,
                 device: torch.device | None = None) -> nn.Module:
    """Replace every projection of ``model`` by a ``W8A8Linear`` on ``arm``, in place; returns ``model``.

    The checkpoint must quantize exactly the model's projections, with matching shapes; a linear
    with a bias is refused (the W8A8 path under study has none). Each W8A8 layer is made on
    ``device``, else on its projection's device (a projection may be a shape on the meta device,
    never materialized: ``engines.own.SharedParent.load``'s ``without``).
    """
    refs = quantized_linears(model)
    source = getattr(checkpoint, "path", "checkpoint")
    want, have = {r.name for r in refs}, set(checkpoint)
    if want != have:
        missing, extra = sorted(want - have), sorted(have - want)
        raise InputError(f"{source}: quantized layers differ from the model's projections: {len(missing)} missing "
                         f"(first: {missing[:3]}), {len(extra)} extra (first: {extra[:3]})")
    replacements: list[tuple[str, W8A8Linear]] = []
    for ref in refs:  # check everything before replacing anything: a failed swap leaves the model as it was
        module = model.get_submodule(ref.name)
        if not isinstance(module, nn.Linear):
            raise InputError(f"{ref.name}: is {type(module).__name__}, expected an nn.Linear to replace")
        if module.bias is not None:
            raise InputError(f"{ref.name}: has a bias; the W8A8 path supports bias-free linears only")
        w_q, s_w = checkpoint[ref.name]
        if tuple(w_q.shape) != tuple(module.weight.shape):
            raise InputError(f"{source}: {ref.name} weight is {list(w_q.shape)}, the model's is {list(module.weight.shape)}")
        target = module.weight.device if device is None else device
        if target.type == "meta":
            raise InputError(f"{ref.name}: its weight was never materialized (meta device); name the device to swap onto")
        replacements.append((ref.name, W8A8Linear(w_q.to(target), s_w.to(target), arm, name=ref.name)))
    for name, layer in replacements:
        set_module(model, name, layer)
    cuda = [layer for _, layer in replacements if layer.w_q.is_cuda]
    if cuda:
        guard = NonFiniteGuard(cuda, cuda[0].w_q.device)
        model.register_forward_hook(_guard_hook(guard))
        _GUARDS[model] = guard
    return model

"""Operand capture: what each W8A8 layer hands its kernel during one forward pass.

The taps sit inside ``W8A8Linear.forward``, between activation quantization and the arm call, so
the recorded ``a_q``, ``s_a`` are the very tensors the kernel received and ``w_q``, ``s_w`` are the
layer's buffers (``s_w`` as the float32 vector the kernel reads). Nothing is recomputed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..errors import InputError
from ..kernels.layer_operands import Operands
from .layers import LayerRef, quantized_linears
from .w8a8 import W8A8Linear


def _w8a8_layers(model: nn.Module, layers: Iterable[str] | None) -> list[tuple[LayerRef, W8A8Linear]]:
    refs = quantized_linears(model)
    if layers is not None:
        wanted = set(layers)
        unknown = sorted(wanted - {r.name for r in refs})
        if unknown:
            raise InputError(f"capture: layer(s) {unknown[:3]} are not projections of this model")
        refs = [r for r in refs if r.name in wanted]
    out = []
    for ref in refs:
        module = model.get_submodule(ref.name)
        if not isinstance(module, W8A8Linear):
            raise InputError(f"capture: {ref.name} is {type(module).__name__}, not a W8A8Linear; swap_linears first")
        out.append((ref, module))
    return out


@contextmanager
def tapped(model: nn.Module, layers: Iterable[str] | None = None) -> Iterator[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Record ``(a_q, s_a)`` per layer while the block runs; each layer may run once."""
    records: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def tap(module: W8A8Linear, a_q: torch.Tensor, s_a: torch.Tensor) -> None:
        if module.name in records:
            raise InputError(f"capture: {module.name} ran twice in one captured forward pass")
        records[module.name] = (a_q, s_a)

    modules = _w8a8_layers(model, layers)
    for _, module in modules:
        module.taps.append(tap)
    try:
        yield records
    finally:
        for _, module in modules:
            module.taps.remove(tap)


def capture(model: nn.Module, token_ids: torch.Tensor, layers: Iterable[str] | None = None) -> dict[str, Operands]:
    """Run one forward pass on ``token_ids`` ([T] or [B,T]); the operands of every (or each named)
    W8A8 layer, in layer order. The M dimension is B*T tokens."""
    ids = token_ids if token_ids.dim() == 2 else token_ids[None, :]
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32) or ids.numel() == 0:
        raise InputError(f"capture: token_ids must be a non-empty integer [T] or [B,T] tensor, got "
                         f"{token_ids.dtype} {tuple(token_ids.shape)}")
    modules = _w8a8_layers(model, layers)
    device = modules[0][1].w_q.device
    with tapped(model, [ref.name for ref, _ in modules]) as records, torch.no_grad():
        model(input_ids=ids.to(device, torch.int64), use_cache=False)
    missing = [ref.name for ref, _ in modules if ref.name not in records]
    if missing:
        raise InputError(f"capture: {len(missing)} layer(s) did not run (first: {missing[:3]})")
    return {
        ref.name: Operands(ref.name, ref.block, ref.proj, *records[ref.name], module.w_q, module.s_w32)
        for ref, module in modules
    }

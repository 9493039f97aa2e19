"""Every intermediate of one forward pass at one sequence position, in execution order.

To say where a decode step and a prefill first part ways, both passes record, for one query
position, the output of every module that computes something (embedding, rotary tables, norms,
each linear's input and output, the MLP activation, each block's output after its residual adds,
the final norm, the head) and, inside attention, the three computations that are not modules: the
scores ``Q·Kᵀ``, the float32 softmax and the probabilities times ``V``. The attention pieces are
seen through a ``TorchFunctionMode`` that only watches ``torch.matmul`` and ``softmax`` calls while
an attention module runs, so the model computes exactly what it computes without the trace.

Only the traced position is kept (a row; for attention, that query's row over the keys it may
attend to), copied, so the trace costs memory per position, not per sequence.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..arith.bits import bits_equal
from ..errors import InputError
from .w8a8 import W8A8Linear

# Event kinds, in the words of the attribution table.
KINDS = ("embedding", "rotary", "norm", "linear_input", "linear_output", "attention_scores", "softmax",
         "attention_output", "activation", "block_output", "head_input", "head")


@dataclass(frozen=True)
class Event:
    """One recorded intermediate: where it ran (``name``), what it is (``kind``), its row."""

    name: str
    kind: str
    value: torch.Tensor


def _kind(name: str, module: nn.Module) -> str | None:
    """The kind of a module's output, or None for modules that only group others."""
    cls = type(module).__name__
    if isinstance(module, nn.Embedding):
        return "embedding"
    if name.endswith("lm_head"):
        return "head"
    if isinstance(module, (nn.Linear, W8A8Linear)):
        return "linear_output"
    if cls.endswith("RMSNorm") or isinstance(module, nn.LayerNorm):
        return "norm"
    if "RotaryEmbedding" in cls:
        return "rotary"
    if name.endswith("act_fn"):
        return "activation"
    if cls.endswith("DecoderLayer"):
        return "block_output"
    return None


def _first_tensor(out: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and all(isinstance(t, torch.Tensor) for t in out):
        return tuple(out)  # rotary: (cos, sin)
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise InputError(f"trace: a module returned {type(out).__name__}, not a tensor")


class _AttentionSteps(TorchFunctionMode):
    """Records matmul, softmax, matmul inside one attention module, untouched."""

    def __init__(self, record: Any, name: str, inside: list[int]) -> None:
        super().__init__()
        self.record, self.name, self.matmuls, self.inside = record, name, 0, inside

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.inside[0]:  # a projection's own arithmetic (a kernel arm may use matmul), not attention's
            return out
        if func is torch.matmul:
            kind = "attention_scores" if self.matmuls == 0 else "attention_output"
            self.matmuls += 1
            self.record(f"{self.name}.{kind.removeprefix('attention_')}", kind, out, attention=True)
        elif func is torch.nn.functional.softmax:
            self.record(f"{self.name}.softmax", "softmax", out, attention=True)
        return out


@contextmanager
def traced(model: nn.Module, row: int, position: int, *, batch: int = 0,
           key_offset: int = 0) -> Iterator[list[Event]]:
    """Record every intermediate of the forward passes run inside the block at sequence ``row``
    (index in this pass's tokens) of batch member ``batch``, the token at absolute ``position`` (for
    attention: its scores over keys ``0..position``, which lie at ``key_offset`` onwards in the cache:
    a left-padded member's pads come first). Hooks are removed afterwards, also on failure."""
    events: list[Event] = []

    def record(name: str, kind: str, out: Any, attention: bool = False) -> None:
        value = _first_tensor(out)
        parts = value if isinstance(value, tuple) else (value,)
        rows = []
        for t in parts:
            if attention:  # [B, H, Tq, Tk] or [B, H, Tq, D]
                r = t[batch, :, row]
                rows.append(r[..., key_offset: key_offset + position + 1] if kind != "attention_output" else r)
            else:  # [B, T, ...]
                rows.append(t[batch if t.shape[0] > 1 else 0, row])
        events.append(Event(name, kind, torch.stack(rows).detach().clone() if len(rows) > 1 else rows[0].detach().clone()))

    inside = [0]  # > 0 while a linear runs

    def linear_in(name: str, kind: str, x: torch.Tensor) -> None:
        record(f"{name}.input", kind, x)
        inside[0] += 1

    def linear_out(name: str, kind: str, out: torch.Tensor) -> None:
        inside[0] -= 1
        record(name, kind, out)

    handles = []
    for name, module in model.named_modules():
        kind = _kind(name, module)
        if kind in ("linear_output", "head"):
            in_kind = "head_input" if kind == "head" else "linear_input"
            handles.append(module.register_forward_pre_hook(
                lambda m, args, n=name, k=in_kind: linear_in(n, k, args[0])))
            handles.append(module.register_forward_hook(lambda m, args, out, n=name, k=kind: linear_out(n, k, out)))
        elif kind is not None:
            handles.append(module.register_forward_hook(lambda m, args, out, n=name, k=kind: record(n, k, out)))
        if name.endswith("self_attn"):
            modes: list[_AttentionSteps] = []

            def enter(m: nn.Module, args: Any, n: str = name, stack: list[_AttentionSteps] = modes) -> None:
                stack.append(_AttentionSteps(record, n, inside))
                stack[-1].__enter__()

            def leave(m: nn.Module, args: Any, out: Any, stack: list[_AttentionSteps] = modes) -> None:
                stack.pop().__exit__(None, None, None)

            handles.append(module.register_forward_pre_hook(enter))
            handles.append(module.register_forward_hook(leave))
    try:
        yield events
    finally:
        for handle in handles:
            handle.remove()


def first_difference(reference: list[Event], other: list[Event], where: str) -> int | None:
    """Index of the first event whose value differs bitwise between two traces of the same
    computation, or None; traces that did not run the same modules in the same order are refused."""
    names_a, names_b = [(e.name, e.kind) for e in reference], [(e.name, e.kind) for e in other]
    if names_a != names_b:
        at = next((i for i, (x, y) in enumerate(zip(names_a, names_b)) if x != y), min(len(names_a), len(names_b)))
        raise InputError(f"{where}: the two traces ran different modules (event {at}: "
                         f"{names_a[at:at + 1]} vs {names_b[at:at + 1]}; {len(names_a)} vs {len(names_b)} events)")
    return next((i for i, (a, b) in enumerate(zip(reference, other)) if not bits_equal(a.value, b.value)), None)

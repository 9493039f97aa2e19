"""Teacher-forced replay: one window through the W8A8 model under several arms at once.

The window is repeated once per arm as a batch, and every ``W8A8Linear`` hands each copy's rows
to that copy's own arm (``RowBlockArm``), so an arm sees exactly the [L, K] operands an
unbatched forward of the window would give it, while attention, norms and the LM head run once
for the batch. Copies therefore differ only inside the scaled GEMM. Batching assumes that a
copy's logits do not depend on its position in the batch; ``copies_identical`` is the test a
caller runs on two copies given the same arm (a null control), and a replay whose control
differs must not be used.

Per position, a comparison of two copies records each arm's top-1 token (argmax of the bf16
logits; ties to the lowest id), the margin of the first (reference) copy (its largest logit minus
its second largest, from the bf16 values in float64; 0 at a tie, NaN where the row is not
finite), whether the top-1 tokens differ (a flip) and whether the logit rows differ at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..arith.bits import bit_pattern, bits_equal
from ..errors import InputError
from ..model.w8a8 import W8A8Linear

LayerArm = Callable[[str, int], Any]  # (linear's name, window index) -> the arm it runs that window on


class RowBlockArm:
    """Hands consecutive blocks of a W8A8 linear's rows to their own arms.

    ``blocks`` lists ``(arm, copies)``: the first arm gets the first ``copies * rows`` rows, and
    so on. Each arm therefore sees exactly the rows of its copies, as it would in a batch of its
    own copies only.
    """

    is_emulation = True

    def __init__(self, blocks: Sequence[tuple[Any, int]], rows: int, layer: str) -> None:
        if not blocks or rows < 1 or any(c < 1 for _, c in blocks):
            raise InputError(f"{layer}: a row-block arm needs at least one arm, each with at least one copy of >= 1 row")
        self.blocks, self.rows, self.layer = [(arm, int(c)) for arm, c in blocks], rows, layer
        self.copies = sum(c for _, c in self.blocks)
        self.name = "row-blocks[" + ", ".join(f"{getattr(a, 'name', a)} x{c}" for a, c in self.blocks) + "]"

    def scaled_mm(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        if a_q.shape[0] != self.rows * self.copies:
            raise InputError(f"{self.layer}: {a_q.shape[0]} rows reached the row-block arm, expected "
                             f"{self.copies} copies x {self.rows} tokens = {self.rows * self.copies}")
        out, start = [], 0
        for arm, copies in self.blocks:
            stop = start + copies * self.rows
            out.append(arm.scaled_mm(a_q[start:stop], w_q, s_a[start:stop], s_w))
            start = stop
        return torch.cat(out)


def w8a8_layers(model: nn.Module) -> list[W8A8Linear]:
    """The model's W8A8 linears; a model without any is refused (nothing would be compared)."""
    layers = [m for m in model.modules() if isinstance(m, W8A8Linear)]
    if not layers:
        raise InputError(f"{type(model).__name__}: no W8A8Linear layers; swap the checkpoint's linears in first")
    return layers


@contextmanager
def _arms_set(model: nn.Module, arm_for: LayerArm, window: int) -> Iterator[None]:
    layers = w8a8_layers(model)
    saved = [layer.arm for layer in layers]
    try:
        for layer in layers:
            layer.arm = arm_for(layer.name, window)
        yield
    finally:
        for layer, arm in zip(layers, saved):
            layer.arm = arm


@torch.inference_mode()
def replay_window(model: nn.Module, ids: torch.Tensor, copies: int, arm_for: LayerArm, window: int,
                  device: torch.device) -> torch.Tensor:
    """bf16 logits ``[copies, L, V]`` of one window (token ids ``[L]``) repeated ``copies`` times.

    Every W8A8 linear runs on ``arm_for(layer name, window)`` for this forward, which receives
    the rows of all copies (copy i is rows ``i*L .. (i+1)*L - 1``); the model's arms are restored
    afterwards, also on failure.
    """
    if ids.dim() != 1 or ids.numel() < 1 or copies < 1:
        raise InputError(f"window {window}: expected a 1-D tensor of token ids and >= 1 copy, got shape "
                         f"{tuple(ids.shape)} and {copies} copies")
    batch = ids.to(device=device, dtype=torch.int64).unsqueeze(0).expand(copies, -1).contiguous()
    with _arms_set(model, arm_for, window):
        logits = model(input_ids=batch, use_cache=False).logits
    if logits.shape[:2] != batch.shape:
        raise InputError(f"window {window}: logits of shape {tuple(logits.shape)} for a batch of {tuple(batch.shape)}")
    return logits


def copies_identical(logits: torch.Tensor, i: int, j: int) -> bool:
    """Whether two copies' logits are bit-identical (a null control of the batch)."""
    return bits_equal(logits[i], logits[j])


@dataclass(frozen=True)
class Positions:
    """Per-position comparison of arm B's logits with arm A's (the reference), numpy arrays [L]."""

    top1_a: np.ndarray
    top1_b: np.ndarray
    margin: np.ndarray
    flip: np.ndarray
    differ: np.ndarray


def margins(logits: torch.Tensor) -> torch.Tensor:
    """Largest minus second-largest logit per row, float64 of the two values; NaN for a non-finite row."""
    if logits.shape[-1] < 2:
        raise InputError(f"margin: needs at least two logits per position, got {logits.shape[-1]}")
    top = torch.topk(logits, 2, dim=-1).values.to(torch.float64)
    finite = torch.isfinite(logits).all(dim=-1)
    return torch.where(finite, top[..., 0] - top[..., 1], torch.full_like(top[..., 0], float("nan")))


def compare(logits_a: torch.Tensor, logits_b: torch.Tensor) -> Positions:
    """Arm B against arm A (the reference) at every position of one window: ``[L, V]`` each."""
    if logits_a.shape != logits_b.shape or logits_a.dim() != 2:
        raise InputError(f"compare: logits must be two equal [L, V] tensors, got {tuple(logits_a.shape)} "
                         f"and {tuple(logits_b.shape)}")
    top_a, top_b = logits_a.argmax(dim=-1), logits_b.argmax(dim=-1)
    differ = (bit_pattern(logits_a) != bit_pattern(logits_b)).any(dim=-1)
    return Positions(top1_a=top_a.cpu().numpy(), top1_b=top_b.cpu().numpy(), margin=margins(logits_a).cpu().numpy(),
                     flip=(top_a != top_b).cpu().numpy(), differ=differ.cpu().numpy())

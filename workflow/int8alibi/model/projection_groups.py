"""Projections of one block that read the same input, computed as one int8 GEMM in a decode step.

q, k and v read the block's normed hidden state, gate and up the MLP's input. At M = 1 each GEMM is
bound by its launch and latency, not by the weights it reads (about 8 us for a 4 MB weight on an
H100), so a CUDA-graph decode step at Qwen3-1.7B's shapes spends more than a millisecond in them. One
GEMM over the rows of all members' weights, with the input quantized once, gives every member the
same bits it would compute alone: the int8 products accumulate exactly in int32 whatever the GEMM's N
or tiling, quantizing per token is a function of the input row alone, and the epilogue is elementwise
(each output column with its own weight scale). vLLM serves these projections fused in the same way.

The members' weights become row views of one buffer (``w_q`` is [N, K], so the rows of each member
are contiguous): the values and the bytes held do not change. A group computes only while
``grouped(model)`` is active, only when its members share one arm object and no member has a tap, and
only for the members called in order with the very tensor the first one received; any other call runs
its member alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
import torch
from torch import nn

from .w8a8 import W8A8Linear

GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class ProjectionGroup:
    """Members of one block reading one input; their weights and scales share one buffer each."""

    def __init__(self, layers: list[W8A8Linear]) -> None:
        self.layers = layers
        self.sizes = [layer.out_features for layer in layers]
        first = layers[0]
        self.w_q = torch.empty((sum(self.sizes), first.in_features), dtype=torch.int8, device=first.w_q.device)
        self.s_w32 = torch.empty((sum(self.sizes),), dtype=torch.float32, device=first.w_q.device)
        start = 0
        for layer, n in zip(layers, self.sizes):  # copy, then point each member at its rows of the buffer
            self.w_q[start:start + n].copy_(layer.w_q)
            self.s_w32[start:start + n].copy_(layer.s_w32)
            layer.w_q = self.w_q[start:start + n]
            layer.s_w32 = self.s_w32[start:start + n]
            start += n
        self._pending: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        self.active = False  # set by ``grouped``

    def _fusable(self) -> bool:
        arm = self.layers[0].arm
        return all(layer.arm is arm and not layer.taps for layer in self.layers)

    def output(self, layer: W8A8Linear, x: torch.Tensor) -> torch.Tensor | None:
        """``layer``'s output from the group's one GEMM, or None: the caller computes it alone."""
        if layer is self.layers[0]:
            self._pending = None
            if not self._fusable():
                return None
            outputs = self._compute(x)
            self._pending = (x, outputs[1:])
            return outputs[0]
        pending, self._pending = self._pending, None
        if pending is None or pending[0] is not x or not pending[1] or layer is not self.layers[-len(pending[1])]:
            return None
        if len(pending[1]) > 1:
            self._pending = (x, pending[1][1:])
        return pending[1][0]

    def _compute(self, x: torch.Tensor) -> list[torch.Tensor]:
        first = self.layers[0]
        lead = x.shape[:-1]
        a_q, s_a = first.quantized(x)
        y = first.arm.scaled_mm(a_q, self.w_q, s_a, self.s_w32)
        parts = torch.split(y, self.sizes, dim=1)  # a member's columns: contiguous at M = 1, copied otherwise
        return [part.contiguous().reshape(*lead, n) for part, n in zip(parts, self.sizes)]


def projection_groups(model: nn.Module) -> list[ProjectionGroup]:
    """The model's groups, built once (its members' weights moved into shared buffers on the first call)."""
    groups: list[ProjectionGroup] = []
    for parent in model.modules():
        for names in GROUPS:
            members = [getattr(parent, name, None) for name in names]
            if not all(isinstance(m, W8A8Linear) for m in members):
                continue
            layers = [m for m in members if isinstance(m, W8A8Linear)]
            if layers[0].group is None:
                if len({(m.in_features, m.w_q.device) for m in layers}) != 1:
                    continue
                group = ProjectionGroup(layers)
                for m in layers:
                    m.group = group
            groups.append(layers[0].group)
    return groups


@contextlib.contextmanager
def grouped(model: nn.Module) -> Iterator[list[ProjectionGroup]]:
    """Within the block, each group of ``model`` computes as one GEMM (see the module doc)."""
    groups = projection_groups(model)
    for group in groups:
        group.active = True
    try:
        yield groups
    finally:
        for group in groups:
            group.active = False
            group._pending = None

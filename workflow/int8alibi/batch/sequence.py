"""Sequence-level batch invariance: each prompt generated alone and inside batches of other prompts.

The engine's batched greedy decoding pads on the left (pad id 0, attention mask 0 on pads, positions
counted from each prompt's first real token) and keeps a dynamic KV cache; a prompt alone is the
same code with a batch of one and no padding, so the only difference between the two runs is the
batch. Per prompt and batch size the comparison records the first generated step whose bf16 logits
differ from the alone run in any bit, whether the top-1 token differs there, the first step whose
token differs, and, at the first differing step, the first module in execution order whose bits
differ (``model.trace``, as the prefill_decode stage attributes its divergences).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from ..arith.bits import bit_pattern, bits_equal
from ..engines.own import cache_argument
from ..errors import InputError
from ..model.trace import Event, first_difference, traced

PAD_ID = 0

# One row per (checkpoint, arm, batch size, prompt).
SEQUENCE_SCHEMA = pa.schema([
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("arm", pa.string(), nullable=False),
    pa.field("batch_size", pa.int32(), nullable=False),
    pa.field("prompt", pa.int32(), nullable=False),          # index in analysis.yaml's prompt list
    pa.field("batch", pa.int32(), nullable=False),           # which batch of this size it ran in
    pa.field("slot", pa.int32(), nullable=False),            # its place in that batch
    pa.field("pad", pa.int32(), nullable=False),             # pads before it (left padding)
    pa.field("steps", pa.int32(), nullable=False),
    pa.field("identical", pa.bool_(), nullable=False),       # every step's logits bitwise equal to alone
    pa.field("first_step", pa.int32(), nullable=True),       # first step whose logits differ in any bit
    pa.field("flip_at_step", pa.bool_(), nullable=True),     # top-1 differs at that step
    pa.field("first_token_step", pa.int32(), nullable=True),  # first step whose generated token differs
    pa.field("module", pa.string(), nullable=True),          # first intermediate whose bits differ there
    pa.field("module_index", pa.int32(), nullable=True),
    pa.field("module_kind", pa.string(), nullable=True),
    pa.field("traced", pa.int32(), nullable=True),
])
SEQUENCE_KEY = ["checkpoint", "arm", "batch_size", "prompt"]


@dataclass(frozen=True)
class Generated:
    """A batch's greedy run: tokens per member, bf16 logits ``[B, steps, V]``, pads per member, and the
    traced intermediates of the members asked for (``generate``'s ``trace``)."""

    tokens: list[list[int]]
    logits: torch.Tensor
    pads: list[int]
    events: dict[int, list[Event]]


def left_padded(prompts: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``(input ids [B, L], attention mask [B, L], pads)`` with every prompt right-aligned."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InputError("batch: every prompt of a batch needs at least one token")
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.int64)
    mask = torch.zeros((len(prompts), width), dtype=torch.int64)
    for b, (p, pad) in enumerate(zip(prompts, pads)):
        ids[b, pad:] = torch.tensor(list(p), dtype=torch.int64)
        mask[b, pad:] = 1
    return ids.to(device), mask.to(device), pads


@torch.inference_mode()
def generate(model: nn.Module, prompts: Sequence[Sequence[int]], new_tokens: int, *,
             device: torch.device = torch.device("cpu"),
             trace: tuple[int, Sequence[int]] | None = None) -> Generated:
    """Greedy decoding of a left-padded batch for ``new_tokens`` steps (argmax ties to the lowest id).
    ``trace=(step, members)`` records those members' intermediates at that step (one trace each, in
    the same forward) and stops there."""
    if new_tokens < 1:
        raise InputError(f"batch: new_tokens must be >= 1, got {new_tokens}")
    ids, mask, pads = left_padded(prompts, device)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    cache = cache_argument(model)
    steps = new_tokens if trace is None else trace[0] + 1
    tokens: list[list[int]] = [[] for _ in prompts]
    rows: list[torch.Tensor] = []
    events: dict[int, list[Event]] = {}
    past: Any = None
    feed, feed_positions = ids, positions
    for step in range(steps):
        kwargs = {cache: past} if past is not None else {}
        with ExitStack() as stack:
            if trace is not None and step == trace[0]:
                events = {m: stack.enter_context(traced(model, row=feed.shape[1] - 1, position=len(prompts[m]) - 1 + step,
                                                        batch=m, key_offset=pads[m])) for m in trace[1]}
            out = model(input_ids=feed, attention_mask=mask, position_ids=feed_positions, use_cache=True, **kwargs)
        logits = out.logits[:, -1]
        nxt = logits.argmax(dim=-1)
        rows.append(logits.clone())
        for b, t in enumerate(nxt.tolist()):
            tokens[b].append(int(t))
        past = getattr(out, cache)
        feed = nxt[:, None]
        feed_positions = feed_positions[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return Generated(tokens, torch.stack(rows, dim=1), pads, events)


def batches_of(count: int, size: int, seed: int) -> list[list[int]]:
    """Prompt indices ``0..count-1`` in a seeded order cut into batches of ``size``; a last batch
    short of ``size`` is filled with the indices that follow (``count``, ``count + 1``, ...)."""
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    order = torch.randperm(count, generator=g).tolist()
    filler = list(range(count, count + (-count) % size))
    order += filler
    return [order[i: i + size] for i in range(0, len(order), size)]


def first_step(alone: torch.Tensor, batched: torch.Tensor) -> int | None:
    """The first step ``[steps, V]`` whose logits differ in any bit, or None."""
    differ = (bit_pattern(alone) != bit_pattern(batched)).any(dim=1).cpu().numpy()
    hits = np.flatnonzero(differ)
    return int(hits[0]) if hits.size else None


def compare_batch(model: nn.Module, prompts: Sequence[Sequence[int]], alone: Sequence[Generated], batched: Generated,
                  *, device: torch.device, where: str) -> list[dict[str, Any]]:
    """Each batch member against its alone run: the ``SEQUENCE_SCHEMA`` measures (no key columns).

    A member whose logits differ somewhere is attributed at its first differing step: its alone run
    and the batch are rerun traced to that step (one batch rerun for all members that first differ
    at the same step); both must reproduce their untraced logits there."""
    rows: list[dict[str, Any]] = []
    for member, solo in enumerate(alone):
        ref, got = solo.logits[0], batched.logits[member]
        step = first_step(ref, got)
        token_step = next((i for i, (x, y) in enumerate(zip(solo.tokens[0], batched.tokens[member])) if x != y), None)
        rows.append({"steps": len(solo.tokens[0]), "identical": step is None, "first_step": step,
                     "flip_at_step": None if step is None else bool(ref[step].argmax() != got[step].argmax()),
                     "first_token_step": token_step, "module": None, "module_index": None, "module_kind": None,
                     "traced": None})
    steps = sorted({r["first_step"] for r in rows if r["first_step"] is not None})
    for step in steps:
        members = [m for m, r in enumerate(rows) if r["first_step"] == step]
        new_tokens = rows[members[0]]["steps"]
        again_b = generate(model, prompts, new_tokens, device=device, trace=(step, members))
        for m in members:
            here = f"{where}, member {m}"
            again_a = generate(model, [prompts[m]], new_tokens, device=device, trace=(step, [0]))
            if not (bits_equal(again_a.logits[0, step], alone[m].logits[0, step])
                    and bits_equal(again_b.logits[m, step], batched.logits[m, step])):
                raise InputError(f"{here}: a traced rerun did not reproduce the untraced logits at step {step}")
            index = first_difference(again_a.events[0], again_b.events[m], here)
            if index is None:
                raise InputError(f"{here}: logits differ at step {step} but no traced intermediate does")
            event = again_a.events[0][index]
            rows[m].update(module=event.name, module_index=index, module_kind=event.kind,
                           traced=len(again_a.events[0]))
    return rows


def sequence_rows(model: nn.Module, checkpoint: str, arm: str, prompt_ids: Sequence[Sequence[int]], count: int,
                  new_tokens: int, batch_sizes: Sequence[int], seed: int, *,
                  device: torch.device = torch.device("cpu")) -> list[dict[str, Any]]:
    """Rows of ``SEQUENCE_SCHEMA`` for one engine: the first ``count`` prompts of ``prompt_ids`` (and
    the fillers after them) alone and in seeded batches of each size."""
    alone: dict[int, Generated] = {}
    rows = []
    for size in batch_sizes:
        for b, members in enumerate(batches_of(count, size, seed + size)):
            if max(members) >= len(prompt_ids):
                raise InputError(f"batch: batches of {size} need prompt {max(members)}, only {len(prompt_ids)} given")
            group = [prompt_ids[i] for i in members]
            batched = generate(model, group, new_tokens, device=device)
            for p in members:
                if p not in alone:
                    alone[p] = generate(model, [prompt_ids[p]], new_tokens, device=device)
            where = f"batch {checkpoint}/{arm} batch {b} of {size} (prompts {members})"
            measures = compare_batch(model, group, [alone[p] for p in members], batched, device=device, where=where)
            for slot, (p, m) in enumerate(zip(members, measures)):
                rows.append({"checkpoint": checkpoint, "arm": arm, "batch_size": size, "prompt": p, "batch": b,
                             "slot": slot, "pad": batched.pads[slot], **m})
    return rows

"""Prefill versus decode on one arm: the same sequence's logits from the KV-cache loop and from one pass.

Greedy decoding computes the logits of generated position i from a forward over one new token
(position 0: over the whole prompt) with the earlier positions' keys and values taken from the
cache; replaying the finished sequence as one prefill computes every position in one pass of M = T
rows. Mathematically the same function, the two can still differ wherever a reduction's order
depends on the shape (a GEMM with M = 1 versus M = T, attention over a cache versus a masked
square). Per generated position the comparison records whether the bf16 logits differ at all and
whether their top-1 token differs (a flip; argmax with ties to the lowest id, ``tokens.replay``).

The first position whose logits differ bitwise is then attributed: both passes are run again with
every intermediate traced at that position (``model.trace``), and the first one in execution order
whose bits differ is named. ``sequence_rows`` and ``summary`` build the two tables the
prefill_decode stage writes, whose schemas live here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from torch import nn

from ..arith.bits import bits_equal
from .own import greedy_steps
from ..errors import InputError
from ..model.trace import Event, first_difference, traced
from ..tokens.margin import cluster_bootstrap_rate
from ..tokens.replay import Positions, compare


@dataclass(frozen=True)
class Divergence:
    """The first traced intermediate that differs, at the first position whose logits differ."""

    position: int
    index: int
    module: str
    kind: str
    events: int


@torch.inference_mode()
def decode(model: nn.Module, prompt: Sequence[int], new_tokens: int, *, trace_at: int | None = None,
           stop: int | None = None,
           device: torch.device = torch.device("cpu")) -> tuple[list[int], torch.Tensor, list[Event]]:
    """Greedy KV-cache decoding as the own engine does it: ``(tokens, bf16 logits [steps, V], trace)``,
    the trace (``model.trace``) of the step that computes position ``trace_at`` if asked. The cache is
    sized for ``new_tokens``; ``stop`` ends the decode after that many steps (a re-run up to a position
    keeps the cache, and so the attention's shapes, of the run it reproduces)."""
    if new_tokens < 1 or not prompt:
        raise InputError(f"decode: needs a non-empty prompt and new_tokens >= 1, got {len(prompt)} and {new_tokens}")
    steps_taken = new_tokens if stop is None else stop
    if not 1 <= steps_taken <= new_tokens:
        raise InputError(f"decode: stop={stop} outside 1..{new_tokens}")
    # A traced decode runs every step eagerly (a CUDA graph's replay calls no hook); on CUDA its steps
    # are the graph's kernels over the same static cache, so its bits are the untraced decode's.
    steps = greedy_steps(model, torch.tensor([list(prompt)], dtype=torch.int64, device=device), new_tokens,
                         graph=trace_at is None)
    tokens: list[int] = []
    rows: list[torch.Tensor] = []
    events: list[Event] = []
    for i in range(steps_taken):
        if i == trace_at:  # the step's newest row: the prompt's last at step 0, the one fed token after
            with traced(model, row=len(prompt) - 1 if i == 0 else 0, position=len(prompt) - 1 + i) as events:
                logits, nxt = next(steps)
        else:
            logits, nxt = next(steps)
        rows.append(logits.clone())
        tokens.append(int(nxt))
    return tokens, torch.stack(rows), events


@torch.inference_mode()
def prefill(model: nn.Module, prompt: Sequence[int], tokens: Sequence[int], *, trace_at: int | None = None,
            device: torch.device = torch.device("cpu")) -> tuple[torch.Tensor, list[Event]]:
    """The sequence ``prompt + tokens[:-1]`` in one forward without cache: the bf16 logits of every
    generated position ``[len(tokens), V]``, and the trace at position ``trace_at`` if asked."""
    if not tokens or not prompt:
        raise InputError(f"prefill: needs a non-empty prompt and tokens, got {len(prompt)} and {len(tokens)}")
    seq = torch.tensor([list(prompt) + list(tokens[:-1])], dtype=torch.int64, device=device)
    start = len(prompt) - 1
    events: list[Event] = []
    if trace_at is None:
        out = model(input_ids=seq, use_cache=False)
    else:
        with traced(model, row=start + trace_at, position=start + trace_at) as events:
            out = model(input_ids=seq, use_cache=False)
    return out.logits[0, start:].clone(), events


def positions(decoded: torch.Tensor, prefilled: torch.Tensor) -> Positions:
    """Per generated position: prefill against decode (the reference), top-1 and bitwise."""
    return compare(decoded, prefilled)


def first_differing(differ: np.ndarray) -> int | None:
    """The first position whose logits differ bitwise, or None."""
    hits = np.flatnonzero(np.asarray(differ, dtype=bool))
    return int(hits[0]) if hits.size else None


def attribute(model: nn.Module, prompt: Sequence[int], tokens: Sequence[int], position: int, decoded: torch.Tensor,
              prefilled: torch.Tensor, *, device: torch.device = torch.device("cpu"), where: str = "") -> Divergence:
    """Trace decode and prefill at ``position`` and name the first intermediate whose bits differ.

    Both traced passes must reproduce the untraced logits bit for bit (the trace only observes),
    and their logits at ``position`` must differ; otherwise the attribution is refused.
    """
    again, _, dec = decode(model, prompt, len(tokens), trace_at=position, stop=position + 1, device=device)
    if again != list(tokens[: position + 1]) or not bits_equal(_head(dec, where), decoded[position]):
        raise InputError(f"{where}: the traced decode did not reproduce the untraced one at position {position}")
    _, pre = prefill(model, prompt, tokens, trace_at=position, device=device)
    if not bits_equal(_head(pre, where), prefilled[position]):
        raise InputError(f"{where}: the traced prefill did not reproduce the untraced one at position {position}")
    index = first_difference(dec, pre, where)
    if index is None:
        raise InputError(f"{where}: logits differ at position {position} but no traced intermediate does")
    return Divergence(position, index, dec[index].name, dec[index].kind, len(dec))


def _head(events: list[Event], where: str) -> torch.Tensor:
    heads = [e.value for e in events if e.kind == "head"]
    if len(heads) != 1:
        raise InputError(f"{where}: the trace holds {len(heads)} head outputs, expected one")
    return heads[0]


SUMMARY_SCHEMA = pa.schema([
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("arm", pa.string(), nullable=False),
    pa.field("sequences", pa.int32(), nullable=False),
    pa.field("positions", pa.int32(), nullable=False),
    pa.field("differing_positions", pa.int32(), nullable=False),   # bf16 logits differ in any bit
    pa.field("flips", pa.int32(), nullable=False),                 # top-1 differs
    pa.field("flip_rate", pa.float64(), nullable=False),
    pa.field("flip_rate_low", pa.float64(), nullable=False),
    pa.field("flip_rate_high", pa.float64(), nullable=False),
    pa.field("level", pa.float64(), nullable=False),
    pa.field("sequences_diverging", pa.int32(), nullable=False),   # sequences with a first divergence
])
SUMMARY_KEY = ["checkpoint", "arm"]
DIVERGENCE_SCHEMA = pa.schema([
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("arm", pa.string(), nullable=False),
    pa.field("sequence", pa.int32(), nullable=False),
    pa.field("positions", pa.int32(), nullable=False),
    pa.field("differing_positions", pa.int32(), nullable=False),
    pa.field("flips", pa.int32(), nullable=False),
    pa.field("diverged", pa.bool_(), nullable=False),
    pa.field("position", pa.int32(), nullable=True),        # first generated position whose logits differ
    pa.field("flip_at_position", pa.bool_(), nullable=True),
    pa.field("module", pa.string(), nullable=True),         # first intermediate whose bits differ there
    pa.field("module_index", pa.int32(), nullable=True),    # its index in execution order
    pa.field("kind", pa.string(), nullable=True),
    pa.field("traced", pa.int32(), nullable=True),          # intermediates traced in that forward pass
])
DIVERGENCE_KEY = ["checkpoint", "arm", "sequence"]


def sequence_rows(model: Any, checkpoint: str, arm: str, prompt_ids: list[list[int]], new_tokens: int,
                  device: Any) -> list[dict[str, Any]]:
    """One row per sequence: positions, differing positions, flips and the attributed first divergence."""
    rows = []
    for s, prompt in enumerate(prompt_ids):
        where = f"prefill_decode {checkpoint}/{arm} sequence {s}"
        tokens, decoded, _ = decode(model, prompt, new_tokens, device=device)
        prefilled, _ = prefill(model, prompt, tokens, device=device)
        pos = positions(decoded, prefilled)
        first = first_differing(pos.differ)
        row: dict[str, Any] = {
            "checkpoint": checkpoint, "arm": arm, "sequence": s, "positions": len(tokens),
            "differing_positions": int(pos.differ.sum()), "flips": int(pos.flip.sum()), "diverged": first is not None,
            "position": None, "flip_at_position": None, "module": None, "module_index": None, "kind": None,
            "traced": None,
        }
        if first is not None:
            d = attribute(model, prompt, tokens, first, decoded, prefilled, device=device, where=where)
            row.update(position=first, flip_at_position=bool(pos.flip[first]), module=d.module,
                       module_index=d.index, kind=d.kind, traced=d.events)
        rows.append(row)
    return rows


def divergence_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as ``DIVERGENCE_SCHEMA``'s frame, its nullable columns keeping their nulls."""
    return pd.DataFrame(rows, columns=DIVERGENCE_SCHEMA.names).astype(
        {"position": "Int32", "module_index": "Int32", "traced": "Int32", "flip_at_position": "boolean"})


def summary(divergence: pd.DataFrame, boot: dict[str, Any]) -> pd.DataFrame:
    """Per checkpoint x arm: the flip rate over all generated positions with a sequence-cluster
    percentile interval (``tokens.margin.cluster_bootstrap_rate``, the pinned bootstrap settings)."""
    rows = []
    for (checkpoint, arm), part in divergence.groupby(SUMMARY_KEY, sort=True):
        part = part.sort_values("sequence")
        low, high = cluster_bootstrap_rate(part["flips"].to_numpy(), part["positions"].to_numpy(),
                                           seed=int(boot["seed"]), resamples=int(boot["resamples"]),
                                           level=float(boot["level"]))
        total = int(part["positions"].sum())
        rows.append({"checkpoint": checkpoint, "arm": arm, "sequences": len(part), "positions": total,
                     "differing_positions": int(part["differing_positions"].sum()), "flips": int(part["flips"].sum()),
                     "flip_rate": float(part["flips"].sum()) / total, "flip_rate_low": low, "flip_rate_high": high,
                     "level": float(boot["level"]), "sequences_diverging": int(part["diverged"].sum())})
    return pd.DataFrame(rows, columns=SUMMARY_SCHEMA.names)

"""Greedy decode steps on CUDA over a static KV cache, each step after the prompt replayed as one CUDA graph.

A decode step at M = 1 launches some 2,400-3,000 small kernels; launched one by one from Python it is
bound by the host (68-120 ms a step at Qwen3-1.7B's shapes on an H200), replayed as a graph it is not.
A graph needs fixed shapes and addresses, so the cache is a transformers ``StaticCache`` of exactly
the prompt plus the new tokens, and the step reads its token, position and attention mask from fixed
tensors, written before each step (the model's own mask builder copies a host scalar to the device,
which a capture forbids; a 4-D mask is used as given: 0 where a key is at or before the position, the
dtype's minimum after it, the values that builder would write). What
runs is the model's eager code: the graph replays the kernels the eager step launched, and
``graph=False`` runs that eager step itself (a step that is traced must run eagerly; its bits are the
graph's). Measured on the H200: logits bitwise equal to the eager step's, static or dynamic cache, at
every position.

Within the steps the projections of a block that read one input (q, k, v; gate, up) run as one int8
GEMM each (``model.projection_groups``): the same bits, 84 fewer GEMMs and activation quantizations a
step at Qwen3-1.7B's 28 blocks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..model.projection_groups import grouped
from ..model.w8a8 import guard_of

Step = Callable[[], tuple[torch.Tensor, torch.Tensor]]
WARMUP_STEPS = 2  # eager runs on a side stream before capture: compiles and allocates what the step needs


def static_steps(model: Any, prompt_ids: torch.Tensor, new_tokens: int, cache_argument: str, *,
                 graph: bool = True) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``own.greedy_steps`` for a CUDA model and a known number of steps: yields ``new_tokens`` times
    the newest position's logits ``[V]`` and argmax ``[1]`` (copies: nothing the caller keeps is
    overwritten by the next step)."""
    with grouped(model):  # q/k/v and gate/up as one int8 GEMM each: the same bits, fewer launches
        yield from _static_steps(model, prompt_ids, new_tokens, cache_argument, graph)


def _static_steps(model: Any, prompt_ids: torch.Tensor, new_tokens: int, cache_argument: str,
                  graph: bool) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    from transformers import StaticCache

    device, p = prompt_ids.device, prompt_ids.shape[1]
    cache = StaticCache(config=model.config, max_cache_len=p + new_tokens)
    guard = guard_of(model)  # checked after each replay: the graph runs no hook
    out = model(input_ids=prompt_ids, use_cache=True, cache_position=torch.arange(p, device=device),
                **{cache_argument: cache})
    logits = out.logits[0, -1]
    nxt = logits.argmax(dim=-1, keepdim=True)
    yield logits.clone(), nxt.clone()
    token = torch.zeros((1, 1), dtype=torch.int64, device=device)
    position = torch.zeros((1,), dtype=torch.int64, device=device)
    masks = _causal_rows(p + new_tokens, logits.dtype, device)
    mask = torch.empty_like(masks[0]).view(1, 1, 1, -1)

    def step(call: Callable[..., Any]) -> tuple[torch.Tensor, torch.Tensor]:
        out = call(input_ids=token, attention_mask=mask, use_cache=True, cache_position=position,
                   **{cache_argument: cache})
        newest = out.logits[0, -1]
        return newest, newest.argmax(dim=-1, keepdim=True)

    replay: Step | None = None
    for i in range(1, new_tokens):
        token.copy_(nxt.view(1, 1))
        position.fill_(p + i - 1)
        mask.view(-1).copy_(masks[p + i - 1])
        seek = functools.partial(_seek, cache, p + i - 1)
        seek()
        if not graph:
            logits, nxt = step(model)  # the model's hooks run: the guard's check, a trace
        else:
            if replay is None:
                replay = _captured(lambda: step(model.forward), seek)  # forward: the guard's hook would read back
                seek()  # the warm-up advanced it
                if guard is not None:
                    guard.counts.zero_()  # the warm-up's counts: the replay below counts the same step again
            logits, nxt = replay()
            if guard is not None:
                guard.check()
        yield logits.clone(), nxt.clone()


def _seek(cache: Any, position: int) -> None:
    """Sets the cache's write position where a version of transformers keeps one per layer on the device
    (``cumulative_length``, advanced by each update and ignoring ``cache_position``): the warm-up steps
    before a capture advanced it, and the step must write, and attend, at ``position`` whatever ran before."""
    for layer in getattr(cache, "layers", ()):
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor):
            counter.fill_(position)


def _causal_rows(length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[length, length]`` additive masks, row t for a query at position t over the whole cache: 0 at
    keys 0..t, the dtype's minimum after t (the eager mask's two values)."""
    keys = torch.arange(length, device=device)
    allowed = keys[None, :] <= keys[:, None]
    return torch.where(allowed, torch.zeros((), dtype=dtype, device=device),
                       torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device))


def _captured(step: Step, seek: Callable[[], None]) -> Step:
    """``step`` run eagerly on a side stream, then captured as a CUDA graph; returns a function that
    replays the graph and returns its output tensors. Each warm-up step, and the capture, starts at the
    first replay's cache position (``seek``) and computes with its inputs, so they change nothing it
    computes; the caller seeks again before the replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP_STEPS):
            seek()
            step()
        seek()
    torch.cuda.current_stream().wait_stream(stream)
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph, stream=stream):
        outputs = step()

    def replay() -> tuple[torch.Tensor, torch.Tensor]:
        cuda_graph.replay()
        return outputs

    return replay

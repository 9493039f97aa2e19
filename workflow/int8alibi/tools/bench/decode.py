"""``int8alibi bench decode``: one greedy decode step of the own engine under each arm, against its floor.

A decode step at M = 1 must at least read every weight it multiplies by: the int8 projections with
their scales and the bf16 LM head (the embedding matrix when the head is tied). That many bytes at
the device's bandwidth is the floor; the benchmark prints the measured milliseconds a step and the
ratio. It builds a seeded synthetic parent of a preset's shapes (``--layers`` keeps the first N
blocks, for a quick look), quantizes its projections by the weight rule, and times ``--steps`` steps
of ``engines.own.greedy_steps`` after the prompt and the first step (which, on CUDA, holds the graph
capture): on CUDA both the graph-replayed and the eager static-cache steps, on the CPU the dynamic
cache's. It also checks that both CUDA paths chose the same tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from . import refusing
from ...device import resolve_device
from ...errors import InputError
from ...engines.own import greedy_steps
from ...kernels.registry import get
from ...model.synthetic import build_synthetic, synthetic_config
from ...model.w8a8 import W8A8Linear, quantize_linears, swap_linears
from ...planning.floors import RATES

PROMPT_TOKENS = 32


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="int8alibi bench decode", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen3-1.7b", help="synthetic preset whose shapes the model takes")
    p.add_argument("--layers", type=int, default=None, help="keep the first N blocks only (default: all)")
    p.add_argument("--arms", default=None,
                   help="comma-separated arms (default: cublaslt,triton on CUDA, exact-cutlass-order on the CPU)")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per path")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--rates", choices=sorted(RATES), default=None, help="floor rates (default: h200 on CUDA, cpu on the CPU)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one line per (arm, path); 2 on bad input."""
    return refusing("decode", _bench, _parser().parse_args(argv))


def step_bytes(model: Any) -> int:
    """The bytes one decode step must read at least: every W8A8 layer's int8 weight and float32 scales
    (the kernels' operands), and the LM head's weight."""
    layers = [m for m in model.modules() if isinstance(m, W8A8Linear)]
    head = model.get_output_embeddings().weight
    return sum(m.w_q.numel() + 4 * m.out_features for m in layers) + head.numel() * head.element_size()


def time_steps(model: Any, prompt: torch.Tensor, steps: int, **kw: bool) -> tuple[float, list[int]]:
    """Seconds a step over ``steps`` steps after the prompt and the first step, and every token chosen."""
    device = prompt.device
    with torch.inference_mode():
        it = greedy_steps(model, prompt, steps + 2, **kw)  # on the CPU: the dynamic cache, whatever kw says
        chosen = [int(next(it)[1]) for _ in range(2)]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        nxt = [next(it)[1] for _ in range(steps)]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - start) / steps
    return seconds, chosen + [int(t) for t in nxt]


def _bench(args: argparse.Namespace) -> int:
    if args.steps < 1 or (args.layers is not None and args.layers < 1):
        raise InputError("--steps and --layers must be >= 1")
    device = resolve_device(args.device)
    arms = (args.arms or ("cublaslt,triton" if device.type == "cuda" else "exact-cutlass-order")).split(",")
    overrides = {} if args.layers is None else {"num_hidden_layers": args.layers}
    config = synthetic_config(args.preset, **overrides)
    rates = RATES[args.rates or ("h200" if device.type == "cuda" else "cpu")]
    model = build_synthetic(args.preset, seed=0, **overrides).to(device)
    weights = quantize_linears(model, "none")
    prompt = (torch.arange(PROMPT_TOKENS, device=device) % config.vocab_size)[None, :]
    print(f"int8alibi bench decode: preset {args.preset}, {config.num_hidden_layers} blocks, device {device}, "
          f"prompt {PROMPT_TOKENS} tokens, {args.steps} timed steps; device_bw={rates.device_bw:.3g} B/s")
    print("| arm | path | ms / step | floor ms (weights read at device_bw) | ms / floor |")
    print("| --- | --- | ---: | ---: | ---: |")
    swap_linears(model, weights, get(arms[0], device.type))
    for arm in arms:
        _rearm(model, get(arm, device.type))
        floor = step_bytes(model) / rates.device_bw
        paths = [("CUDA graph", {"graph": True}), ("eager static cache", {"graph": False})] if device.type == "cuda" \
            else [("eager dynamic cache", {})]
        tokens: list[list[int]] = []
        for label, kw in paths:
            seconds, chosen = time_steps(model, prompt, args.steps, **kw)
            tokens.append(chosen)
            print(f"| {arm} | {label} | {seconds * 1e3:.2f} | {floor * 1e3:.3f} | {seconds / floor:.1f} |")
        if any(t != tokens[0] for t in tokens):
            print(f"int8alibi bench decode: {arm}: the paths chose different tokens", file=sys.stderr)
            return 1
    return 0


def _rearm(model: torch.nn.Module, arm: Any) -> None:
    """Every W8A8 layer of ``model`` on ``arm`` (its weights unchanged)."""
    for layer in model.modules():
        if isinstance(layer, W8A8Linear):
            layer.arm = arm

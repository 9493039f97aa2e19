"""``int8alibi bench kernels``: how fast each arm runs, relative to a plain baseline of the same shape.

On a GPU the baseline is ``torch._int_mm`` (cuBLASLt int8 GEMM, int32 out, no epilogue): each arm's
achieved TOPS (2·M·N·K integer operations per second) and its throughput ratio to that baseline,
timed with CUDA events after a warmup, over CUDA-graph replays (GPU time; the eager time with
Python launch overhead is recorded too), and the per-call time a stage pays (CUDA events around
one Python call on an idle device, host work included) with its ratio to ``_int_mm``'s per-call
time (``call x``). Every timed GPU output is first compared bit for bit
with its emulation (exit 1 if any differs), so a fast configuration cannot be a wrong one. On CPU
the exact emulation is timed against a plain float64 matmul of the same shape (the cost of
exactness). The same operands are reused call after call, for every arm alike (a warm L2 cache
holds the weights at these sizes); the ratios compare kernels, not memory systems.
``--sweep-triton`` also times every candidate tile configuration of the Triton kernel, which is how
its fixed tile table was chosen.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...arith import compare_bf16
from ...device import describe, resolve_device
from ...errors import InputError
from ...kernels.base import library_versions
from ...kernels.cublaslt import int_mm_accumulator
from ...kernels.registry import ARM_NAMES, EMULATION_OF, get
from ...kernels.layer_operands import QWEN3_SHAPES, ModelShapes, Operands, synthetic_layers

if TYPE_CHECKING:  # Triton is imported only when its tiles are swept
    from ...kernels.triton_arm import TileConfig


def time_cuda(fn: Callable[[], object], warmup: int, iters: int, reps: int = 5) -> tuple[dict[str, float], bool]:
    """Seconds per call, median over ``reps`` batches of ``iters`` calls, timed with CUDA events;
    and whether the batch could be captured in a CUDA graph.

    ``graph``: the batch captured once in a CUDA graph and replayed, so the time is the GPU's alone
    (at these sizes a Python launch takes longer than the kernel); if capture fails, the eager time
    and a message on stderr. ``eager``: the same calls issued from Python, launch overhead included.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()

    def batch() -> None:
        for _ in range(iters):
            fn()

    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    try:
        with torch.cuda.graph(graph):
            batch()
        replay: Callable[[], None] = graph.replay
        captured = True
    except RuntimeError as exc:  # an op that cannot be captured: time it eagerly and say so
        print(f"bench kernels: CUDA graph capture failed ({exc}); timing eagerly", file=sys.stderr)
        torch.cuda.synchronize()
        replay, captured = batch, False
    result: dict[str, float] = {}
    for method, run in (("graph", replay), ("eager", batch)):
        samples = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / iters)
        result[method] = statistics.median(samples)
    return result, captured


def time_call(fn: Callable[[], object], warmup: int, iters: int) -> float:
    """Seconds of one Python call as a stage pays it, host work included: the median over ``iters``
    calls of CUDA events recorded just before the call and just after it returns, on an idle device."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def time_cpu(fn: Callable[[], object], warmup: int, iters: int) -> float:
    """Median seconds per call over ``iters`` calls (wall clock)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _parse_shape(text: str) -> tuple[int, int]:
    try:
        k, n = (int(v) for v in text.lower().split("x"))
    except ValueError as exc:
        raise InputError(f"bench kernels: --shape {text!r} is not KxN (e.g. 2048x6144)") from exc
    return k, n


def _operands(args: argparse.Namespace, m: int, device: torch.device) -> list[Operands]:
    """One operand set per distinct (K, N): the ``--shape`` list, else the model's distinct layer shapes."""
    if args.shape:
        shapes = ModelShapes(1, tuple(("bench", f"{k}x{n}", k, n) for k, n in map(_parse_shape, args.shape)))
    else:
        shapes = QWEN3_SHAPES[args.model]
    seen: set[tuple[int, int]] = set()
    ops = []
    for op in synthetic_layers(shapes, m=m, seed=0, blocks=1, device=device):
        if (op.k, op.n) not in seen:
            seen.add((op.k, op.n))
            ops.append(op)
    return ops


def _gpu_rows(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    arms = [arm for arm in (get(name, device) for name in args.arms) if arm.available()[0]]
    rows = []
    for m in args.m:
        for op in _operands(args, m, device):
            ops = 2 * op.m * op.n * op.k
            base, _ = time_cuda(partial(int_mm_accumulator, op.a_q, op.w_q), args.warmup, args.iters)
            base_call = time_call(partial(int_mm_accumulator, op.a_q, op.w_q), args.warmup, args.iters)
            timed: list[tuple[str, TileConfig | None, Callable[[], torch.Tensor]]] = [
                (arm.name, None, partial(arm.scaled_mm, op.a_q, op.w_q, op.s_a, op.s_w)) for arm in arms]
            if args.sweep_triton:
                from ...kernels.triton_arm import SWEEP_CONFIGS, TritonArm

                tri = TritonArm(device)
                timed += [("triton", cfg, partial(tri.scaled_mm, op.a_q, op.w_q, op.s_a, op.s_w, config=cfg))
                          for cfg in SWEEP_CONFIGS if cfg.block_m <= max(16, m)]  # taller tiles only waste rows
            reference = {name: get(name, device).scaled_mm(op.a_q, op.w_q, op.s_a, op.s_w)
                         for name in set(EMULATION_OF.values())}
            for name, cfg, fn in timed:
                exact = compare_bf16(reference[EMULATION_OF[name]], fn()).differing == 0
                t, captured = time_cuda(fn, args.warmup, args.iters)
                call = time_call(fn, args.warmup, args.iters)
                rows.append({
                    "arm": name, "config": asdict(cfg) if cfg else None, "m": op.m, "k": op.k, "n": op.n,
                    "seconds": t["graph"], "tops": ops / t["graph"] / 1e12, "baseline": "torch._int_mm",
                    "baseline_seconds": base["graph"], "baseline_tops": ops / base["graph"] / 1e12,
                    "ratio": base["graph"] / t["graph"],
                    "timing": "cuda-graph replay" if captured else "eager (capture failed)",
                    "eager_seconds": t["eager"], "baseline_eager_seconds": base["eager"],
                    "call_seconds": call, "baseline_call_seconds": base_call, "call_ratio": call / base_call,
                    "bits_equal_emulation": exact,
                })
    return rows


def _cpu_rows(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    arms = [get(name, device) for name in ("exact-cutlass-order", "exact-triton-order")]
    rows = []
    for m in args.m:
        for op in _operands(args, m, device):
            a64, w64 = op.a_q.to(torch.float64), op.w_q.to(torch.float64)
            base = time_cpu(partial(torch.matmul, a64, w64.T), args.warmup, args.iters)
            for arm in arms:
                seconds = time_cpu(partial(arm.scaled_mm, op.a_q, op.w_q, op.s_a, op.s_w), args.warmup, args.iters)
                rows.append({
                    "arm": arm.name, "config": None, "m": op.m, "k": op.k, "n": op.n, "seconds": seconds,
                    "tops": 2 * op.m * op.n * op.k / seconds / 1e12, "baseline": "float64 matmul",
                    "baseline_seconds": base, "baseline_tops": 2 * op.m * op.n * op.k / base / 1e12,
                    "ratio": base / seconds, "timing": "wall clock",
                })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="int8alibi bench kernels", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--model", default="qwen3-1.7b", choices=sorted(QWEN3_SHAPES))
    parser.add_argument("--shape", action="append", default=[], metavar="KxN", help="instead of the model's shapes")
    parser.add_argument("--m", type=int, nargs="+", help="activation rows (default 512 on GPU, 16 on CPU)")
    parser.add_argument("--arms", nargs="+", default=[n for n in ARM_NAMES if not n.startswith("exact-")],
                        help="GPU arms to time (unavailable ones are skipped)")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--sweep-triton", action="store_true", help="also time every candidate Triton tile config")
    parser.add_argument("--json", type=Path, help="write the rows and environment here")
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)
        gpu = device.type == "cuda"
        args.m = args.m or ([512] if gpu else [16])
        args.warmup = args.warmup if args.warmup is not None else (10 if gpu else 1)
        args.iters = args.iters if args.iters is not None else (50 if gpu else 3)
        rows = _gpu_rows(args, device) if gpu else _cpu_rows(args, device)
    except InputError as exc:
        print(f"int8alibi bench kernels: {exc}", file=sys.stderr)
        return 1
    print(f"{'arm':<20} {'M':>4} {'K':>6} {'N':>6} {'us':>9} {'TOPS':>8} {'baseline':<15} {'base us':>8} "
          f"{'ratio':>6} {'call us':>8} {'base call':>9} {'call x':>6}  config")
    for r in rows:
        if r["config"]:
            cfg = "/".join(str(v) for v in r["config"].values())
        else:
            cfg = "table" if r["arm"] == "triton" else ""
        bits = "  BITS DIFFER FROM EMULATION" if r.get("bits_equal_emulation") is False else ""
        call = (f"{r['call_seconds'] * 1e6:>8.2f} {r['baseline_call_seconds'] * 1e6:>9.2f} {r['call_ratio']:>6.2f}"
                if "call_seconds" in r else f"{'-':>8} {'-':>9} {'-':>6}")
        print(f"{r['arm']:<20} {r['m']:>4} {r['k']:>6} {r['n']:>6} {r['seconds'] * 1e6:>9.2f} {r['tops']:>8.2f} "
              f"{r['baseline']:<15} {r['baseline_seconds'] * 1e6:>8.2f} {r['ratio']:>6.3f} {call}  {cfg}{bits}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            {"device": describe(device), "versions": library_versions(), "rows": rows}, indent=1))
    if any(r.get("bits_equal_emulation") is False for r in rows):
        print("int8alibi bench kernels: a timed kernel's output differs from its emulation", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``int8alibi bench faults``: how fast the fault campaign runs, against the floor of its work.

The floor is the time of the exact accumulators alone (one float64 matmul per layer) on the same
device: the campaign cannot be cheaper than computing them once. The benchmark runs the full
campaign (42 cells x 7 checks per layer, scored under both matrices) on seeded synthetic operands
of a real model's shapes (``synthetic_layers``; 196 layers, 8,232 cells for qwen3-1.7b at M=512),
generating each layer outside both timings, and prints cells/s and the ratio to the floor.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..arith import exact_accumulator
from ..device import describe, resolve_device
from ..errors import InputError, Int8AlibiError
from ..faults import CELLS_PER_LAYER, CampaignSettings, run_layer
from ..operands import QWEN3_SHAPES, synthetic_layers
from ..protocol import load
from ..scoring import MATRICES, detection, score


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="int8alibi bench faults", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="qwen3-1.7b", help=f"model shapes ({', '.join(QWEN3_SHAPES)})")
    p.add_argument("--m", type=int, default=512, help="tokens per layer (prefill tile)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=None, help="run the first N layers only")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--protocol", type=Path, default=Path("preregistration"))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its numbers; 2 on bad input."""
    args = _parser().parse_args(argv)
    try:
        return _bench(args)
    except Int8AlibiError as exc:
        print(f"int8alibi bench faults: {exc}", file=sys.stderr)
        return 2


def _bench(args: argparse.Namespace) -> int:
    if args.shapes not in QWEN3_SHAPES:
        raise InputError(f"--shapes {args.shapes!r}: unknown (known: {', '.join(QWEN3_SHAPES)})")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    protocol = load(args.protocol)
    settings = CampaignSettings.from_protocol(protocol)
    total_layers = len(QWEN3_SHAPES[args.shapes].layers())
    wanted = total_layers if args.layers is None else min(args.layers, total_layers)
    floor = campaign = 0.0
    frames = []
    for index, op in enumerate(synthetic_layers(args.shapes, m=args.m, seed=args.seed)):
        if index >= wanted:
            break
        op = op.to(device)
        _, spent = _timed(lambda op=op: exact_accumulator(op.a_q, op.w_q), device)
        floor += spent
        frame, spent = _timed(lambda op=op: run_layer(op, settings, device), device)
        campaign += spent
        frames.append(frame)
        print(f"  {index + 1}/{wanted} {op.layer} [{op.m}x{op.k}]x[{op.n}]: "
              f"floor {floor:.1f}s campaign {campaign:.1f}s", file=sys.stderr)
    rows = pd.concat(frames, ignore_index=True)
    cells, scoring = _timed(lambda: score(rows, {m: protocol.matrix(m) for m in MATRICES}, False), device)
    campaign += scoring
    n_cells = wanted * CELLS_PER_LAYER
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB on Linux
    facts = describe(device)
    print(f"bench faults: {args.shapes}, M={args.m}, {wanted} layers, {n_cells} cells on {facts['device']} "
          f"({torch.get_num_threads()} CPU threads)")
    print(f"  campaign   {campaign:9.1f} s   {n_cells / campaign:8.2f} cells/s (scoring {scoring:.1f} s)")
    print(f"  floor      {floor:9.1f} s   exact accumulators alone")
    print(f"  ratio      {campaign / floor:9.2f} x the floor")
    gpu = (f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"
           if device.type == "cuda" else "")
    print(f"  peak RSS   {peak_rss:9.2f} GiB{gpu}")
    table = detection(cells)
    per_cell = cells.drop_duplicates(["layer", "fault", "severity", "regime"])
    worst = per_cell.groupby("fault")["max_ulp"].max()
    table["max_ulp"] = [int(worst[f]) if pd.notna(worst[f]) else None for f in table["fault"]]
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

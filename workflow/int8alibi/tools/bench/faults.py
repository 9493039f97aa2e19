"""``int8alibi bench faults``: how fast the fault campaign runs, against the floor of its work.

The floor is the time of the exact accumulators alone (one float64 matmul per layer) on the same
device: the campaign cannot be cheaper than computing them once. The benchmark runs the full
campaign (42 cells x 7 checks per layer, scored under both matrices) on seeded synthetic operands
of a real model's shapes (``synthetic_layers``; 196 layers, 8,232 cells for qwen3-1.7b at M=512),
made on CPU threads before both timings, and prints cells/s, the ratio to the floor and the
command's wall time. The campaign is timed as one call, host work included (on a GPU the batched
engine, warmed on the first block beforehand so that kernel compilation and starting the draw workers
are not counted).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from functools import partial
from typing import Any

import pandas as pd
import torch

from ...arith import exact_accumulator
from . import refusing
from ...device import describe, resolve_device
from ...errors import InputError
from ...faults import CELLS_PER_LAYER, CampaignSettings, run_campaign
from ...faults.run import ENGINES, resolve_engine
from ...kernels.layer_operands import QWEN3_SHAPES, Operands, synthetic_layer
from ...files.parquet import write_table
from ...protocol.definitions import MATRICES
from ...protocol import load
from ...analysis.scoring import CELLS_KEY, CELLS_SCHEMA, detection, score


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
    p.add_argument("--engine", default="auto", choices=ENGINES, help="campaign engine (auto: batched on a GPU)")
    p.add_argument("--digest", action="store_true", help="print the SHA-256 of the scored cells table's Parquet bytes")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its numbers; 2 on bad input."""
    return refusing("faults", _bench, _parser().parse_args(argv))


def _generate(shapes: str, m: int, seed: int, wanted: int, device: torch.device) -> list[Operands]:
    """The synthetic layers, made on parallel CPU threads (each layer has its own generators, so the
    bytes are ``synthetic_layers``'s) and moved to ``device``."""
    rows = QWEN3_SHAPES[shapes].layers()[:wanted]
    workers = max(1, min(16, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        made = list(pool.map(lambda r: synthetic_layer(r[0], r[1], r[2], r[3], r[4], m, seed), rows))
    return [op.to(device) for op in made]


def _bench(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.shapes not in QWEN3_SHAPES:
        raise InputError(f"--shapes {args.shapes!r}: unknown (known: {', '.join(QWEN3_SHAPES)})")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    protocol = load(args.protocol)
    settings = CampaignSettings.from_protocol(protocol)
    total_layers = len(QWEN3_SHAPES[args.shapes].layers())
    wanted = total_layers if args.layers is None else min(args.layers, total_layers)
    layers, generation = _timed(lambda: _generate(args.shapes, args.m, args.seed, wanted, device), device)
    engine = resolve_engine(args.engine, device)
    if device.type == "cuda":  # compile the kernels and start the draw workers outside the timings
        first_block = [op for op in layers if op.block == layers[0].block]
        run_campaign(first_block, settings, device, progress=False, engine=engine)
    floor = 0.0
    for op in layers:
        _, spent = _timed(partial(exact_accumulator, op.a_q, op.w_q), device)
        floor += spent
    rows, campaign = _timed(lambda: run_campaign(layers, settings, device, progress=False, engine=engine), device)
    cells, scoring = _timed(lambda: score(rows, {m: protocol.matrix(m) for m in MATRICES}, False), device)
    campaign += scoring
    n_cells = wanted * CELLS_PER_LAYER
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB on Linux
    facts = describe(device)
    print(f"bench faults: {args.shapes}, M={args.m}, {wanted} layers, {n_cells} cells on {facts['device']} "
          f"({torch.get_num_threads()} CPU threads, {engine} engine)")
    print(f"  campaign   {campaign:9.2f} s   {n_cells / campaign:8.2f} cells/s (one call, host included; "
          f"scoring {scoring:.2f} s)")
    print(f"  floor      {floor:9.2f} s   exact accumulators alone")
    print(f"  ratio      {campaign / floor:9.2f} x the floor")
    print(f"  operands   {generation:9.2f} s   synthetic layers made on CPU threads (outside the timings)")
    gpu = (f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"
           if device.type == "cuda" else "")
    print(f"  peak RSS   {peak_rss:9.2f} GiB{gpu}")
    table = detection(cells)
    per_cell = cells.drop_duplicates(["layer", "fault", "severity", "regime"])
    worst = per_cell.groupby("fault")["max_ulp"].max()
    table["max_ulp"] = [int(worst[f]) if pd.notna(worst[f]) else None for f in table["fault"]]
    print(table.to_string(index=False))
    if args.digest:
        print(f"  cells sha256 {_digest(cells)}")
    print(f"  wall       {time.perf_counter() - started:9.2f} s   the whole command")
    return 0


def _digest(cells: pd.DataFrame) -> str:
    """SHA-256 of the scored cells table as the pipeline writes it (deterministic Parquet bytes)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cells.parquet"
        write_table(cells[[f.name for f in CELLS_SCHEMA]], path, CELLS_SCHEMA, CELLS_KEY)
        return hashlib.sha256(path.read_bytes()).hexdigest()


if __name__ == "__main__":
    raise SystemExit(main())

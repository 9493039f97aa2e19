"""``int8alibi bench seeded``: the synthetic parents' seeded weights, one process against worker processes.

A paper-scale synthetic parent is billions of counter-hash weights (``model.seeded_weights``); the
model stage builds them before anything else can start. The benchmark fills the linear weights of a
preset's first ``--blocks`` blocks once in this process and once with ``--workers`` processes,
checks the two give the same bytes, and prints the weights per second of each and the speed-up
over one process (the peer).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

from . import refusing
from ...errors import InputError
from ...model.seeded_weights import default_threads, seeded_tensor
from ...model.synthetic import WEIGHT_STD, parameter_shapes, synthetic_config
from ...model.synthetic_presets import PRESETS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="int8alibi bench seeded", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen3-1.7b", choices=sorted(PRESETS), help="whose shapes the weights take")
    p.add_argument("--blocks", type=int, default=1, help="fill the linear weights of the first N blocks")
    p.add_argument("--workers", type=int, default=None,
                   help=f"worker processes (default: the CPUs this process may use, {default_threads()})")
    return p


def block_matrices(preset: str, blocks: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the 2-D weights of the preset's first ``blocks`` blocks, in module order."""
    shapes = parameter_shapes(synthetic_config(preset))
    prefixes = tuple(f"model.layers.{b}." for b in range(blocks))
    return {name: shape for name, shape in shapes.items() if name.startswith(prefixes) and len(shape) == 2}


def _fill_all(shapes: dict[str, tuple[int, ...]], workers: int) -> tuple[float, str]:
    """Seconds to fill every tensor with ``workers`` processes, and a digest of their bytes (not timed)."""
    import torch

    start = time.perf_counter()
    tensors = [seeded_tensor(shape, 0, name, WEIGHT_STD, threads=workers) for name, shape in shapes.items()]
    seconds = time.perf_counter() - start
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.view(torch.int16).numpy().tobytes())
    return seconds, digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    """Print one line per process count; 1 when the bytes differ, 2 on bad input."""
    return refusing("seeded", _bench, _parser().parse_args(argv))


def _bench(args: argparse.Namespace) -> int:
    workers = default_threads() if args.workers is None else args.workers
    if args.blocks < 1 or workers < 1:
        raise InputError("--blocks and --workers must be >= 1")
    shapes = block_matrices(args.preset, args.blocks)
    if not shapes:
        raise InputError(f"preset {args.preset!r} has no block 0")
    _fill_all(shapes, workers)  # starts the worker processes once, outside the timing
    count = sum(r * c for r, c in shapes.values())
    one, one_digest = _fill_all(shapes, 1)
    many, many_digest = _fill_all(shapes, workers)
    print(f"int8alibi bench seeded: preset {args.preset}, {args.blocks} block(s), {len(shapes)} matrices, "
          f"{count:,} weights")
    print("| processes | seconds | M weights / s | speed-up over 1 process |")
    print("| ---: | ---: | ---: | ---: |")
    print(f"| 1 | {one:.3f} | {count / one / 1e6:.0f} | 1.00 |")
    print(f"| {workers} | {many:.3f} | {count / many / 1e6:.0f} | {one / many:.2f} |")
    if one_digest != many_digest:
        print("int8alibi bench seeded: the worker processes wrote different bytes from one process", file=sys.stderr)
        return 1
    print(f"bytes identical (sha256 {one_digest[:16]}...)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the Snakefile needs to decide reruns: per-stage code digests, config digests, GPU use.

Snakemake does not see changes inside imported package code, so each rule takes the digest of the
code its stage runs as a param: a code change reruns exactly the stages whose code changed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import torch

PACKAGE = Path(__file__).resolve().parent

# The package modules (files or subpackages, relative to the package) each stage executes.
_COMMON = ["__init__.py", "config.py", "device.py", "errors.py", "provenance", "stages/__init__.py"]
STAGE_CODE: dict[str, list[str]] = {
    "protocol": ["protocol", "stages/protocol.py"],
    "model": ["model", "stages/model.py"],
    "requant": ["arith", "quant", "model", "protocol", "stages/requant.py"],
    "capture": ["arith", "quant", "model", "kernels", "operands.py", "corpus.py", "stages/capture.py"],
    "prediction": ["arith", "operands.py", "stages/prediction.py"],
    "compare": ["arith", "kernels", "operands.py", "protocol", "stages/compare.py"],
    "faults": ["arith", "faults", "checks.py", "scoring.py", "operands.py", "protocol", "stages/faults.py"],
    "determinism": ["arith", "quant", "model", "kernels", "corpus.py", "engines", "stages/determinism.py"],
    "perplexity": ["arith", "quant", "model", "kernels", "corpus.py", "stats.py", "stages/perplexity.py"],
    "report": ["report", "stages/report.py"],
}


def code_digest(stage: str) -> str:
    """sha256 over the sorted paths and bytes of the code a stage runs (missing paths skipped)."""
    h = hashlib.sha256()
    for rel in sorted(_COMMON + STAGE_CODE[stage]):
        target = PACKAGE / rel
        files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
        for f in files:
            if f.is_file():
                h.update(str(f.relative_to(PACKAGE)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def config_digest(config: Mapping[str, Any], keys: list[str]) -> str:
    """Digest of the config keys a stage reads: changing another key does not rerun it."""
    subset = {k: config.get(k) for k in sorted(keys)}
    return hashlib.sha256(json.dumps(subset, sort_keys=True, default=str).encode()).hexdigest()[:16]


def use_gpu(config: Mapping[str, Any]) -> int:
    """GPUs a GPU-capable rule declares: 1 when the run will use CUDA, else 0."""
    device = config.get("device", "auto")
    if device == "cpu":
        return 0
    return 1 if device == "cuda" or torch.cuda.is_available() else 0


def selected_arm_names(config: Mapping[str, Any]) -> list[str]:
    """The two arm names the run uses (``arms: auto`` resolved on this machine), for wildcards."""
    from .device import resolve_device
    from .kernels.registry import select

    arm_a, arm_b, _ = select(config["arms"], resolve_device(config.get("device", "auto")))
    return [arm_a.name, arm_b.name]


def shard_ranges(index_path: str, shards: int) -> list[tuple[int, int]]:
    """Split the captured layers of the faults campaign into ``shards`` contiguous [start, stop) ranges."""
    from .faults.sources import OperandSource

    total = OperandSource.resolve(index_path).layer_count() or 0
    bounds = [round(i * total / shards) for i in range(shards + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]

"""What the Snakefile needs to decide reruns: per-stage code digests, config digests, GPU use.

Snakemake does not see changes inside imported package code, so each rule takes the digest of the
code its stage runs as a param: a code change reruns exactly the stages whose code changed. The
code a stage runs is found by following its module's int8alibi imports transitively.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import torch

from .provenance.hashing import stage_code_digest


def code_digest(stage: str) -> str:
    """Digest of the package code that ``int8alibi.stages.<stage>`` can run."""
    return stage_code_digest([f"int8alibi.stages.{stage}"])[:16]


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

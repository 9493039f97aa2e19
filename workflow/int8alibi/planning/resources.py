"""Host memory and wall time for each heavy rule, computed at plan time from the parent's size.

A cluster job asks SLURM for ``mem_mb`` and ``runtime`` up front; a fixed request either wastes a
node on a small model or kills a 14B job. The request here follows what each stage holds, in
multiples of the bf16 parent P and of one W8A8 checkpoint Q (``model.size.ModelSize``), plus a fixed
process overhead, with headroom:

* model: 3 P (the parent and its reloaded copy each run one CPU forward, converting one weight at a
  time to float32: 2.6 P above the process was measured at 1.7B's width with 4 blocks, where the
  head's float32 copy weighs most);
* reference (llm-compressor): 2 P + Q; requant: P + 2 Q (the parent, the reference, writers' shards);
* generate, prefill_decode: P + Q (a fresh parent, then its linears swapped for the checkpoint's);
* perplexity, tokens: P + Q + float32 logits and log-probabilities of one window per arm;
* capture: P + Q + one phase's captured operands (int8 weights and activations of every linear);
* prediction, compare, faults, ksweep: operands of a batch of layers (16 of the largest).

``gpu_mem_mb`` (a CUDA run's device memory) lets one GPU serve several jobs at once on a
workstation: every GPU job asks for what it holds on the device (the CUDA context plus the host
estimate above, which counts the model it loads), so the analysis chain (capture, prediction,
compare, faults) runs beside the forward-pass jobs instead of waiting for the whole device; tokens
adds its largest batch's logits (one copy of a 2,048-token window per kernel arm, null control and
injection cell, at ``TOKENS_LOGIT_BYTES`` an element: bf16 logits and a float32 copy, 6.3 measured
at 1.7B on an H200); faults adds its batch budget, ``campaign_budget.MEMORY_SHARE``-th of the
device (the profile's ``gpu_mem_mb``, passed in as ``device_mb``; without one it asks for the whole
device, ``WHOLE_DEVICE_MB``, which Snakemake lowers to any limit given). A CPU run asks for none.
Which jobs share the device changes no byte: each is its own process computing the same thing.
``PRIORITY`` starts the longest chains first when a requant finishes (tokens, the analysis chain,
prefill_decode, perplexity), ahead of the sixteen short generate jobs that would otherwise fill the
device or the cores and leave a chain to run last, alone. The analysis chain takes one thread
(``stage_needs.StageNeeds.pinned``), so on a CPU it runs beside the forward jobs from the moment
capture finishes.

``runtime`` (minutes) is a fixed allowance plus a multiple of the job's floor (``floors``) at the
run device's default rates: measured stages take up to ~500x their floor (generate's one-token
steps at 1.7B on an H200; 9-90x on a 2-core CPU), so the multiple (1000) leaves a factor of two.
The SLURM executor plugin takes no device-memory request (GPUs are requested by count and model
only): ``gpu_mem_mb`` constrains Snakemake's own scheduler, SLURM never sees it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from ..campaign_budget import MEMORY_SHARE
from ..errors import Int8AlibiError
from .floors import KERNEL_ARMS, CHECKPOINTS, GENERATE_RUNS, RATES, Workload, operand_bytes, stage_work
from ..model.size import ModelSize, model_size

MIB = 1 << 20
PROCESS_BYTES = 3 << 30  # interpreter, torch, CUDA context, libraries
HEADROOM = 1.2
RUNTIME_FIXED_MIN = 10
RUNTIME_FLOOR_MULTIPLE = 1000
OPERAND_BATCH = 16
FALLBACK_MEM_MB, FALLBACK_RUNTIME = 16000, 120  # when the parent's size cannot be known at plan time
CUDA_CONTEXT_BYTES = 1 << 30
WHOLE_DEVICE_MB = 1 << 30  # more than any device: Snakemake caps it at the profile's gpu_mem_mb
TOKENS_LOGIT_BYTES = 7
TOKENS_CONTROL_COPIES = 4  # arm A, arm B, arm A again, the injection's fault-free reference
BOTH_ARMS_CELLS = 2  # F6 and F7 run in batches of their own (tokens.inject.BOTH_ARMS)
CAMPAIGN_REGIMES = 2  # a campaign cell per regime (faults.pipeline.REGIMES): cells_per_layer counts both
PRIORITY = {"tokens": 2, "capture": 2, "prediction": 2, "compare": 2, "faults": 2, "faults_shard": 2,
            "prefill_decode": 1, "perplexity": 1, "batch": 1}
RULE_STAGE = {  # rule -> the stage whose work it does (faults_shard: its share of the campaign)
    "model": "model", "reference_checkpoint": "reference", "requant": "requant", "capture": "capture",
    "generate": "generate", "prefill_decode": "prefill_decode", "perplexity": "perplexity", "tokens": "tokens",
    "prediction": "prediction", "compare": "compare", "faults": "faults", "faults_shard": "faults",
    "ksweep": "ksweep", "batch": "batch",
}


@dataclass(frozen=True)
class Resources:
    """What one job of a rule requests: host memory in MiB, wall time in minutes, device memory in MiB."""

    mem_mb: int
    runtime: int
    gpu_mem_mb: int = 0


def held_bytes(rule: str, size: ModelSize, load: Workload) -> int:
    """Host bytes a job of ``rule`` holds beyond the process overhead (see the module doc)."""
    p, q = size.parent_bytes, size.checkpoint_bytes
    window_logits = 2 * 4 * size.vocab * max(load.window_tokens, load.replay_window_tokens)
    layer_operands = size.max_linear_params + load.prefill_tokens * max(size.hidden, size.intermediate)
    held = {
        "model": 3 * p,
        "reference_checkpoint": 2 * p + q,
        "requant": p + 2 * q,
        "capture": p + q + operand_bytes(size, load.prefill_tokens),
        "generate": p + q,
        "prefill_decode": p + q,
        "batch": p + q + operand_bytes(size, load.prefill_tokens),
        "perplexity": p + q + window_logits,
        "tokens": p + q + KERNEL_ARMS * window_logits,
    }
    return held.get(rule, OPERAND_BATCH * layer_operands)


def _jobs(rule: str, faults_shards: int) -> int:
    if rule == "generate":
        return KERNEL_ARMS * CHECKPOINTS * GENERATE_RUNS
    return faults_shards if rule == "faults_shard" else 1


def rule_resources(rule: str, size: ModelSize, load: Workload, device: str, faults_shards: int = 1,
                   device_mb: int | None = None) -> Resources:
    """``Resources`` of one job of ``rule`` for a parent of ``size`` at sizes ``load`` on ``device``."""
    if rule not in RULE_STAGE:
        raise Int8AlibiError(f"resources: no estimate for rule {rule!r} (known: {sorted(RULE_STAGE)})")
    mem = math.ceil(HEADROOM * (PROCESS_BYTES + held_bytes(rule, size, load)) / MIB)
    mem_mb = 1024 * math.ceil(mem / 1024)
    work = stage_work(size, load).get(RULE_STAGE[rule])
    floor = 0.0 if work is None else work.seconds(RATES["h200" if device == "cuda" else "cpu"])
    runtime = RUNTIME_FIXED_MIN + math.ceil(RUNTIME_FLOOR_MULTIPLE * floor / _jobs(rule, faults_shards) / 60)
    return Resources(mem_mb=mem_mb, runtime=runtime, gpu_mem_mb=device_memory_mb(rule, size, load, device, device_mb))


def rule_priority(rule: str) -> int:
    """The rule's ``priority:`` (see the module doc)."""
    return PRIORITY.get(rule, 0)


def tokens_batch_copies(load: Workload) -> int:
    """Copies of a window in tokens' largest batch: the controls and every injection cell of one
    regime that runs with them (the campaign's cells of a regime, less the two both-arms faults)."""
    return TOKENS_CONTROL_COPIES + load.cells_per_layer // CAMPAIGN_REGIMES - BOTH_ARMS_CELLS


def device_memory_mb(rule: str, size: ModelSize, load: Workload, device: str, device_mb: int | None = None) -> int:
    """Device MiB one job of ``rule`` asks for on a CUDA run (see the module doc); 0 on the CPU."""
    if device != "cuda":
        return 0
    held = held_bytes(rule, size, load)
    if rule == "tokens":
        held += tokens_batch_copies(load) * load.replay_window_tokens * size.vocab * TOKENS_LOGIT_BYTES
    elif rule in ("faults", "faults_shard"):
        if device_mb is None:
            return WHOLE_DEVICE_MB
        held += device_mb * MIB // MEMORY_SHARE
    return 1024 * math.ceil(HEADROOM * (CUDA_CONTEXT_BYTES + held) / MIB / 1024)


def plan_resources(run_config: Mapping[str, Any], protocol: Any, device_mb: int | None = None) -> dict[str, Resources]:
    """Rule -> ``Resources`` for a run config (its ``resolved`` device) and the loaded protocol, on a
    device of ``device_mb`` MiB (the run's ``gpu_mem_mb`` limit; None: not known).

    A parent whose size cannot be read at plan time (an unset variable, a missing folder: the model
    stage stops on it) gets the fixed fallback request.
    """
    device = (run_config.get("resolved") or {}).get("device", run_config.get("device", "cpu"))
    try:
        size = model_size(run_config["model"])
    except Int8AlibiError:  # unknown size: every GPU job runs alone on the device
        fallback = Resources(FALLBACK_MEM_MB, FALLBACK_RUNTIME, WHOLE_DEVICE_MB if device == "cuda" else 0)
        return {rule: fallback for rule in RULE_STAGE}
    load = Workload.from_protocol(protocol.analysis, protocol.tokens, protocol.faults, run_config["size_profile"])
    shards = int(run_config.get("faults_shards") or 1)
    return {rule: rule_resources(rule, size, load, device, shards, device_mb) for rule in RULE_STAGE}

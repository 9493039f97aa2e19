"""Host memory and wall time for each heavy rule, computed at plan time from the parent's size.

A cluster job asks SLURM for ``mem_mb`` and ``runtime`` up front; a fixed request either wastes a
node on a small model or kills a 14B job. The request here follows what each stage holds, in
multiples of the bf16 parent P and of one W8A8 checkpoint Q (``model.size.ModelSize``), plus a fixed
process overhead, with headroom; each stage names its formula (``stage_spec.Stage.memory_model``,
given here in brackets):

* model (reload): 3 P (the parent and its reloaded copy each run one CPU forward, converting one weight at a
  time to float32: 2.6 P above the process was measured at 1.7B's width with 4 blocks, where the
  head's float32 copy weighs most);
* reference (llmcompressor): 2 P + Q; requant (writers): P + 2 Q (the parent, the reference, writers'
  shards);
* generate, prefill_decode (forward): P + Q (a fresh parent, then its linears swapped for the checkpoint's;
  on the device Q alone: the projections are swapped before the model moves there, ``device_held_bytes``);
* perplexity (window_forward), tokens (replay_forward): P + Q + float32 logits and log-probabilities of one
  window per arm;
* capture, batch (captured_forward): P + Q + one phase's captured operands (int8 weights and activations of
  every linear);
* prediction, compare, ksweep (layer_batch), faults (campaign): operands of a batch of layers (16 of the
  largest).

``gpu_mem_mb`` (a CUDA run's device memory) lets one GPU serve several jobs at once on a
workstation: every GPU job asks for what it holds on the device (the CUDA context plus the host
estimate above, which counts the model it loads), so the analysis chain (capture, prediction,
compare, faults) runs beside the forward-pass jobs instead of waiting for the whole device; tokens
adds its largest batch's logits (the kernel pair's three copies of a 2,048-token window: arm A, arm B,
arm A again; each injection cell runs in a batch of two, at ``TOKENS_LOGIT_BYTES`` an element: bf16
logits and a float32 copy, 6.3 measured at 1.7B on an H200); faults adds its batch budget,
``campaign_budget.MEMORY_SHARE``-th of the device (the profile's ``gpu_mem_mb``, passed in as
``device_mb``; without one it asks for the whole device, ``WHOLE_DEVICE_MB``, which Snakemake lowers
to any limit given). A CPU run asks for none.
Which jobs share the device changes no byte: each is its own process computing the same thing.
A stage's ``priority`` (``stage_spec``) starts the longest chains first when a requant finishes
(tokens, the analysis chain, prefill_decode, perplexity), ahead of the sixteen short generate jobs that would otherwise fill the
device or the cores and leave a chain to run last, alone. The analysis chain takes one thread
(``stage_needs.StageNeeds.pinned``), so on a CPU it runs beside the forward jobs from the moment
capture finishes.

The run's device-memory budget (``gpu_budget_mb``, resolved once when the run is planned:
``planning.resolve.resolve_budget``) caps every GPU job's request (``fit_budget``), so a job fits
any one of the run's devices (``gpus``: ``runtime.gpu_slots`` pins it to one); Snakemake's limit is
the budget times the number of devices (``device_limit``). What a stage can
chunk without changing a byte is chunked by it: the fault campaign's batches of layers take
``MEMORY_SHARE``-th of the budget (the campaign's tables are the same at any batch size). The forward
passes (capture, generate, prefill_decode, perplexity, tokens, batch) cannot: a bf16 GEMM's result
can depend on its M (batch x tokens), so their batch is the shape the protocol fixes, tokens' largest
being ``TOKENS_BATCH_COPIES`` copies of a replay window whose logits are computed at once. A job
whose estimate exceeds the budget is therefore refused when the run is planned, naming the stage,
its figure and what would fit (a size profile, more free device memory, the CPU); the analysis jobs
(prediction, compare, ksweep) work layer by layer and ask for at most the budget. The refusal
compares the estimate itself (``gpu_need_mb``), not the request with its headroom: the estimates
run high (tokens at Qwen3-1.7B: 58,880 MiB estimated, 44,900 MiB measured on an H200), and a plan
must not refuse what would run; the request is the estimate with headroom, capped at the budget.

``runtime`` (minutes) is a fixed allowance plus a multiple of the job's floor (``floors``) at the
run device's default rates: measured stages take up to ~500x their floor (generate's one-token
steps at 1.7B on an H200; 9-90x on a 2-core CPU), so the multiple (1000) leaves a factor of two.
The SLURM executor plugin takes no device-memory request (GPUs are requested by count and model
only): ``gpu_mem_mb`` constrains Snakemake's own scheduler, SLURM never sees it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from ..campaign_budget import MEMORY_SHARE
from .. import stage_spec
from ..errors import InputError, Int8AlibiError
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
TOKENS_BATCH_COPIES = 3  # tokens' largest forward: arm A, arm B, arm A again (an injection cell's has two)
_RULES = stage_spec.rule_stages()
# the rules with a memory model, each to its stage (faults_shard: its share of the campaign)
RULE_STAGE = {rule: s.name for rule, s in _RULES.items() if s.memory_model}
GPU_RULES = tuple(rule for rule, s in _RULES.items() if s.gpu)  # the rules that declare gpu_mem_mb
FORWARD_RULES = tuple(rule for rule, s in _RULES.items() if s.forward)  # batch shapes fixed by the protocol


@dataclass(frozen=True)
class Resources:
    """What one job of a rule requests: host memory in MiB, wall time in minutes, device memory in MiB
    (with headroom), and the device memory it is estimated to hold (``gpu_need_mb``, no headroom)."""

    mem_mb: int
    runtime: int
    gpu_mem_mb: int = 0
    gpu_need_mb: int = 0


def _window_logits(size: ModelSize, load: Workload) -> int:
    """Two float32 copies of the logits of the longest window a stage scores (perplexity's or tokens')."""
    return 2 * 4 * size.vocab * max(load.window_tokens, load.replay_window_tokens)


def held_bytes(rule: str, size: ModelSize, load: Workload) -> int:
    """Host bytes a job of ``rule`` holds beyond the process overhead, by its stage's memory model
    (``stage_spec.Stage.memory_model``; see the module doc)."""
    p, q = size.parent_bytes, size.checkpoint_bytes
    window_logits = _window_logits(size, load)
    layer_operands = size.max_linear_params + load.prefill_tokens * max(size.hidden, size.intermediate)
    layer_batch = OPERAND_BATCH * layer_operands
    held = {
        "reload": 3 * p,
        "llmcompressor": 2 * p + q,
        "writers": p + 2 * q,
        "captured_forward": p + q + operand_bytes(size, load.prefill_tokens),
        "forward": p + q,
        "window_forward": p + q + window_logits,
        "replay_forward": p + q + KERNEL_ARMS * window_logits,
        "layer_batch": layer_batch,
        "campaign": layer_batch,
    }
    return held[_RULES[rule].memory_model]


def device_held_bytes(rule: str, size: ModelSize, load: Workload) -> int:
    """Device bytes a job of ``rule`` holds beyond the CUDA context, before tokens' batch of logits and the
    campaign's batch budget: a W8A8 engine holds the checkpoint (its projections are swapped before they
    reach the device: ``engines.own.load_w8a8``), the perplexity stage's reference engine the parent,
    one engine at a time, with a window's bf16 logits beside their float32 copies (7,467 MiB allocated
    at 1.7B on an H100, against 7,274 estimated); the other models hold on the device what they hold
    on the host."""
    p, q = size.parent_bytes, size.checkpoint_bytes
    window_logits = _window_logits(size, load)
    lean = {
        "forward": q,
        "captured_forward": q + operand_bytes(size, load.prefill_tokens),
        "window_forward": max(p, q) + window_logits + 2 * size.vocab * load.window_tokens,  # and the bf16 logits
        "replay_forward": q + KERNEL_ARMS * window_logits,
    }
    return lean.get(_RULES[rule].memory_model) or held_bytes(rule, size, load)


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
    held = device_bytes(rule, size, load, device, device_mb)
    request = 0 if held is None else 1024 * math.ceil(HEADROOM * held / MIB / 1024)
    if held is not None and held < 0:  # the whole device: the campaign without a known device size
        request = WHOLE_DEVICE_MB
    return Resources(mem_mb=mem_mb, runtime=runtime, gpu_mem_mb=request,
                     gpu_need_mb=0 if held is None or held < 0 else math.ceil(held / MIB))


def rule_priority(rule: str) -> int:
    """The rule's ``priority:``, its stage's (see the module doc)."""
    return _RULES[rule].priority if rule in _RULES else 0


def device_bytes(rule: str, size: ModelSize, load: Workload, device: str, device_mb: int | None = None) -> int | None:
    """Device bytes one job of ``rule`` is estimated to hold on a CUDA run, the CUDA context included
    (see the module doc); None on the CPU; -1 for the campaign where the device's size is unknown
    (it then asks for the whole device)."""
    if device != "cuda":
        return None
    held, model = device_held_bytes(rule, size, load), _RULES[rule].memory_model
    if model == "replay_forward":
        held += TOKENS_BATCH_COPIES * load.replay_window_tokens * size.vocab * TOKENS_LOGIT_BYTES
    elif model == "campaign":
        if device_mb is None:
            return -1
        held += device_mb * MIB // MEMORY_SHARE
    return CUDA_CONTEXT_BYTES + held


def budget_mb(run_config: Mapping[str, Any]) -> int | None:
    """The run's device-memory budget in MiB (the ``resolved`` block's ``gpu_budget``), or None: no budget."""
    mb = ((run_config.get("resolved") or {}).get("gpu_budget") or {}).get("mb")
    return None if mb is None else int(mb)


def device_count(run_config: Mapping[str, Any]) -> int:
    """How many devices the run's GPU jobs spread over (the ``resolved`` block's ``gpus``), at least
    one: a run with none resolved (planned before devices were, or where the scheduler assigns them)
    counts as one device."""
    devices = ((run_config.get("resolved") or {}).get("gpus") or {}).get("devices") or []
    return max(1, len(devices))


def device_limit(given: Any, run_config: Mapping[str, Any]) -> int | None:
    """Snakemake's ``gpu_mem_mb`` limit for the run: the one given (``--resources gpu_mem_mb=N``),
    else a CUDA run's budget times its number of devices (each job fits one device: it asks for at
    most the budget), else None (no limit: every GPU job runs alone)."""
    if isinstance(given, int):
        return given
    device = (run_config.get("resolved") or {}).get("device", run_config.get("device"))
    budget = budget_mb(run_config) if device == "cuda" else None
    return None if budget is None else budget * device_count(run_config)


def _over(plan: Mapping[str, Resources], budget: int) -> dict[str, int]:
    return {rule: r.gpu_need_mb for rule, r in plan.items() if rule in FORWARD_RULES and r.gpu_need_mb > budget}


def fit_budget(plan: Mapping[str, Resources], budget: int, what_fits: Mapping[str, bool], why: str) -> dict[str, Resources]:
    """``plan`` with every GPU job's ``gpu_mem_mb`` at most ``budget`` MiB, or ``InputError`` naming each
    forward-pass stage whose estimate exceeds it (see the module doc); ``what_fits`` says, per other
    size profile, whether all of its forward passes would fit, and ``why`` how the budget was decided."""
    over = _over(plan, budget)
    if over:
        named = "; ".join(f"stage {RULE_STAGE[rule]} needs about {mb} MiB" for rule, mb in sorted(over.items()))
        fits = [name for name, ok in what_fits.items() if ok]
        raise InputError(
            f"device memory: {named}, above this run's budget gpu_budget_mb={budget} ({why}); a forward pass runs at "
            "the batch shape the protocol fixes (a bf16 GEMM's result can depend on it), so it is not chunked to fit. "
            f"What would fit: a device with about {max(over.values())} MiB free (or gpu_budget_mb raised to it where "
            "the card has it), " + (f"size_profile {' or '.join(fits)}, " if fits else "") + "or device: cpu")
    return {rule: replace(r, gpu_mem_mb=min(r.gpu_mem_mb, budget)) for rule, r in plan.items()}


def plan_resources(run_config: Mapping[str, Any], protocol: Any, device_mb: int | None = None) -> dict[str, Resources]:
    """Rule -> ``Resources`` for a run config (its ``resolved`` device and budget) and the loaded
    protocol, on a device of ``device_mb`` MiB (the run's ``gpu_mem_mb`` limit; None: not known).

    With a budget (a CUDA run's ``gpu_budget``) every GPU job asks for at most the budget, the
    campaign's batches take a share of the budget, and a forward pass that cannot fit is refused
    (``fit_budget``). A parent whose size cannot be read at plan time (an unset variable, a missing
    folder: the model stage stops on it) gets the fixed fallback request.
    """
    device = (run_config.get("resolved") or {}).get("device", run_config.get("device", "cpu"))
    budget = budget_mb(run_config) if device == "cuda" else None
    device_mb = device_mb if budget is None else budget
    try:
        size = model_size(run_config["model"])
    except Int8AlibiError:  # unknown size: every GPU job runs alone on the device
        whole = (WHOLE_DEVICE_MB if budget is None else budget) if device == "cuda" else 0
        fallback = Resources(FALLBACK_MEM_MB, FALLBACK_RUNTIME, whole)
        return {rule: fallback for rule in RULE_STAGE}
    shards = int(run_config.get("faults_shards") or 1)

    def at(profile: str) -> dict[str, Resources]:
        load = Workload.from_protocol(protocol.analysis, protocol.tokens, protocol.faults, profile)
        return {rule: rule_resources(rule, size, load, device, shards, device_mb) for rule in RULE_STAGE}

    plan = at(run_config["size_profile"])
    if budget is None:
        return plan
    others = [p for p in protocol.analysis["size_profiles"] if p != run_config["size_profile"]]
    fits = {p: not _over(at(p), budget) for p in others} if _over(plan, budget) else {}
    why = str(run_config["resolved"]["gpu_budget"]["reason"])
    return fit_budget(plan, budget, fits, why)

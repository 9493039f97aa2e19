"""What each stage must at least do, and the fewest seconds that takes at stated hardware rates.

A stage's work is counted from the parent's shape (``model.size.ModelSize``) and the run's sizes
(``Workload``, from the protocol's size profiles): the distinct bytes it must read from and write to disk,
the bytes it must move from host to device (each model it loads), the bytes it must stream through
memory (every weight once per forward pass), and the FLOPs of its linear layers and head (2 per
multiply-add; attention scores, norms and Python overhead are not counted). The floor is the
largest of work / rate over those five: a lower bound, since no stage can beat the slowest of them
even with perfect overlap. Stages marked ``host`` run on the CPU of a
GPU run too (model, reference); the others on the run's device.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..errors import InputError
from ..model.size import ModelSize
from ..quant.variants import CHECKPOINT_VARIANTS

CHECKPOINTS = len(CHECKPOINT_VARIANTS)  # requant writes each; generate runs each
CAPTURED_CHECKPOINTS = 2  # capture: own and pow2-nearest, each for the prefill tile and one decode step
KERNEL_ARMS = 2
GENERATE_RUNS = 2  # determinism: every (arm, checkpoint) generated twice
PERPLEXITY_MODELS = 1 + CHECKPOINTS  # the parent and every checkpoint
TOKENS_REGIMES = 2  # own and pow2 replay, both arms
ROUND_TRIP_TOKENS = 32  # the model stage's save/reload logits check, one forward per copy


@dataclass(frozen=True)
class Workload:
    """The run sizes a stage's work depends on (the protocol's size profiles)."""

    prefill_tokens: int
    prompts: int
    new_tokens: int
    windows: int
    window_tokens: int
    replay_windows: int
    replay_window_tokens: int
    cells_per_layer: int

    @classmethod
    def from_protocol(cls, analysis: Mapping[str, Any], tokens: Mapping[str, Any], faults: Mapping[str, Any],
                      profile: str) -> Workload:
        """The sizes of size profile ``profile`` in analysis.yaml, tokens.yaml and faults.yaml."""
        try:
            a, t = analysis["size_profiles"][profile], tokens["size_profiles"][profile]
            return cls(int(a["prefill_tokens"]), int(a["prompts"]), int(a["new_tokens"]), int(a["windows"]),
                       int(a["window_tokens"]), int(t["replay_windows"]), int(t["replay_window_tokens"]),
                       int(faults["cells_per_layer"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"size profile {profile!r}: not defined in analysis.yaml and tokens.yaml "
                             f"({type(exc).__name__}: {exc})") from exc


@dataclass(frozen=True)
class Rates:
    """Hardware rates in bytes/s and FLOP/s: the run's device, the host CPU, the host-device link, the disk."""

    device_bw: float
    device_flops: float
    host_bw: float
    host_flops: float
    link: float
    disk_read: float
    disk_write: float

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise InputError(f"rate {f.name}={value!r} must be > 0")


RATES: dict[str, Rates] = {
    # H200 SXM: 4.8e12 B/s HBM3e, 989e12 bf16 dense FLOP/s, PCIe Gen5 x16 ~5e10 B/s to the host;
    # its host: 16 cores (~1e11 B/s, ~1e12 FLOP/s); local NVMe ~5e9 B/s read, ~2e9 B/s sustained write.
    "h200": Rates(device_bw=4.8e12, device_flops=989e12, host_bw=1e11, host_flops=1e12, link=5e10,
                  disk_read=5e9, disk_write=2e9),
    # A 2-core x86-64 VM: ~1e10 B/s memory, ~5e10 FLOP/s (two cores' float32 GEMM), a network disk
    # ~1e9 B/s read, ~5e8 B/s write. The device is the host: the link is a memory copy.
    "cpu": Rates(device_bw=1e10, device_flops=5e10, host_bw=1e10, host_flops=5e10, link=1e10,
                 disk_read=1e9, disk_write=5e8),
}


@dataclass(frozen=True)
class Work:
    """A stage's irreducible work: distinct disk bytes in and out, bytes moved from host to device,
    bytes streamed through the computing side's memory, FLOPs; ``on_host``: computed on the CPU."""

    disk_read: int
    disk_write: int
    transfer: int
    memory: int
    flops: int
    on_host: bool = False

    def terms(self, rates: Rates) -> dict[str, float]:
        """Seconds of each kind of work at ``rates``."""
        bw, flops = (rates.host_bw, rates.host_flops) if self.on_host else (rates.device_bw, rates.device_flops)
        return {"disk read": self.disk_read / rates.disk_read, "disk write": self.disk_write / rates.disk_write,
                "transfer": 0.0 if self.on_host else self.transfer / rates.link,
                "memory": self.memory / bw, "compute": self.flops / flops}

    def seconds(self, rates: Rates) -> float:
        """The floor: the largest term."""
        return max(self.terms(rates).values())

    def limit(self, rates: Rates) -> str:
        """Which kind of work sets the floor."""
        terms = self.terms(rates)
        return max(terms, key=lambda k: terms[k])


def operand_bytes(size: ModelSize, tokens: int) -> int:
    """One phase's captured operands for every linear: int8 activations and weights, float32 scales."""
    return size.linear_params + 4 * size.linear_rows + tokens * size.linear_inputs + 4 * tokens * size.blocks * 7


def stage_work(size: ModelSize, load: Workload) -> dict[str, Work]:
    """The work of every stage whose floor is counted (protocol, determinism, report: negligible;
    ksweep: sizes of its own, not counted). A file read by several loads counts once on disk (the
    page cache serves the rest) and once per load on the link."""
    p, q, fwd = size.parent_bytes, size.checkpoint_bytes, size.forward_flops_per_token
    t = load.prefill_tokens
    captured = CAPTURED_CHECKPOINTS * (operand_bytes(size, t) + operand_bytes(size, 1))
    steps = load.prompts * load.new_tokens  # decoding one token at a time: every step streams every weight
    generated = KERNEL_ARMS * CHECKPOINTS  # (arm, checkpoint) pairs
    jobs = generated * GENERATE_RUNS
    return {
        "model": Work(p, p, 0, 2 * p, 2 * ROUND_TRIP_TOKENS * fwd, on_host=True),
        "reference": Work(p, q, 0, p + q, 4 * size.linear_params, on_host=True),
        "requant": Work(p + q, CHECKPOINTS * q, p, p + (CHECKPOINTS + 1) * q, 4 * CHECKPOINTS * size.linear_params),
        "capture": Work(p + CAPTURED_CHECKPOINTS * q, captured, CAPTURED_CHECKPOINTS * q,
                        CAPTURED_CHECKPOINTS * 2 * q, CAPTURED_CHECKPOINTS * (t + 1) * fwd),
        "generate": Work(p + CHECKPOINTS * q, 0, jobs * q, jobs * steps * q, jobs * steps * fwd),
        "prefill_decode": Work(p + CHECKPOINTS * q, 0, generated * q, generated * steps * q,
                               generated * steps * fwd),
        "perplexity": Work(p + CHECKPOINTS * q, 0, p + CHECKPOINTS * q, load.windows * (p + CHECKPOINTS * q),
                           PERPLEXITY_MODELS * load.windows * load.window_tokens * fwd),
        "tokens": Work(p + TOKENS_REGIMES * q, 0, TOKENS_REGIMES * q, TOKENS_REGIMES * KERNEL_ARMS * load.replay_windows * q,
                       TOKENS_REGIMES * KERNEL_ARMS * load.replay_windows * load.replay_window_tokens * fwd),
        "prediction": Work(captured, 0, captured, captured, CAPTURED_CHECKPOINTS * 2 * (t + 1) * size.linear_params),
        "compare": Work(captured, 0, captured, KERNEL_ARMS * captured,
                        KERNEL_ARMS * CAPTURED_CHECKPOINTS * 2 * (t + 1) * size.linear_params),
        "faults": Work(operand_bytes(size, t), 0, operand_bytes(size, t), load.cells_per_layer * operand_bytes(size, t),
                       load.cells_per_layer * 2 * t * size.linear_params),
    }

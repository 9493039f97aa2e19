"""Disk a run needs under its results folder, known when it is planned, and the refusal of a run that won't fit.

Without it an 8B run on a 64 GiB disk failed 14 minutes in, when requant filled the disk. Each stage's
bytes are the distinct bytes it writes (``floors.stage_work``'s ``disk_write``: the saved parent, the
reference checkpoint, the requant checkpoints, the captured operands) plus what that figure leaves out:
the tokenizer and config files and safetensors headers beside each saved tensor folder
(``FILES_MARGIN`` on the tensor bytes) and each stage's tables, manifest and figures
(``TABLES_BYTES``). Nothing is written twice at once on a first run: every stage builds its folders
under a temporary name beside the target and renames them (``files.atomic``), and its transaction
moves the previous outputs aside by renaming (``files.transaction``), so the peak is the sum.

What remains to write is the run's stages whose manifest is missing under the results folder (a
finished stage's folder already occupies its space). A run that needs more than the free space of
the filesystem holding the results folder (its nearest existing ancestor) stops when Snakemake plans,
with one line naming the figure, the free space, the folder and the largest items.
``INT8ALIBI_DISK_FREE_MB`` states the free space in MiB instead (tests; planning for another disk).

Not counted: a rerun of a finished stage (changed code or params) holds its previous outputs in the
transaction's snapshot while it writes new ones, so it needs its own size again for its length; and
what is written outside the results folder (Snakemake's ``.snakemake/``, logs, library caches).
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import stage_spec
from ..errors import InputError, Int8AlibiError
from ..model.size import ModelSize, model_size
from .floors import Workload, stage_work

ENV = "INT8ALIBI_DISK_FREE_MB"
MIB = 1 << 20
GB = 10**9
# Tokenizer and config files beside each saved parent and checkpoint, and safetensors headers: measured
# +1.3 % (parent) and +2.0 % (requant's checkpoints) over the tensor bytes on the CPU default's
# SmolLM2-135M, whose 3.5 MB tokenizer is the largest share of any parent here (Qwen3's ~16 MB of
# tokenizer files beside a 2 GB checkpoint is 0.8 %).
FILES_MARGIN = 0.02
# A stage's tables, manifest and figures: at most 4.1 MB (the report) in the 1.7B run at size profile
# study on an H100 (docs/measured/h100-vs-h200-qwen3-1.7b), 3.1 MB in the CPU default's run.
TABLES_BYTES = 8 * MIB
SHOWN = 4  # items named in the refusal


def run_stages(device: str) -> tuple[stage_spec.Stage, ...]:
    """The stages a run makes, each with a manifest of its own: those up to the report, which reads them
    all (after it only the cross-model view, a target of its own), the GPU-only ones unless the device
    is the CPU (``auto`` counts them: an upper bound)."""
    upto = [s.name for s in stage_spec.STAGES].index("report") + 1
    return tuple(s for s in stage_spec.STAGES[:upto]
                 if stage_spec.MANIFEST in s.outputs and not (s.gpu_only and device == "cpu"))


def stage_bytes(size: ModelSize, load: Workload, stages: tuple[stage_spec.Stage, ...]) -> dict[str, int]:
    """Stage -> the bytes it leaves under the results folder (see the module doc)."""
    work = stage_work(size, load)
    tensors = {s.name: work[s.name].disk_write if s.name in work else 0 for s in stages}
    return {name: math.ceil(written * (1 + FILES_MARGIN)) + TABLES_BYTES for name, written in tensors.items()}


def item(stage: str) -> str:
    """How a stage's bytes are named: its tensor folders (``requant/checkpoints``), else the stage."""
    spec = stage_spec.stage(stage)
    folders = [f"{spec.directory}/{f}" for f in spec.folders.values() if "*" not in f]
    return ", ".join(folders) or stage


def still_to_write(need: Mapping[str, int], results: Path) -> dict[str, int]:
    """``need`` less the stages whose manifest exists under ``results`` (finished: their bytes are there)."""
    return {name: b for name, b in need.items()
            if not (results / stage_spec.table(name, stage_spec.MANIFEST)).exists()}


def free_bytes(results: Path, env: Mapping[str, str] | None = None) -> int:
    """Free bytes on the filesystem that holds (or will hold) ``results``, or ``INT8ALIBI_DISK_FREE_MB``'s."""
    env = os.environ if env is None else env
    if env.get(ENV):
        text = env[ENV].strip()
        if not text.isdigit():
            raise InputError(f"{ENV}: the free space in MiB must be a whole number, got {text[:40]!r}")
        return int(text) * MIB
    where = results.absolute()
    while not where.exists():
        where = where.parent
    return shutil.disk_usage(where).free


def size_text(n: int) -> str:
    """Bytes as GB (10^9) with one decimal, or MB / bytes below that, so a shortfall is never 0.0."""
    if n >= GB:
        return f"{n / GB:.1f} GB"
    return f"{n / 10**6:.1f} MB" if n >= 10**6 else f"{n} byte{'' if n == 1 else 's'}"


def check(need: Mapping[str, int], free: int, results: Path) -> None:
    """``InputError`` in one line when ``need`` (stage -> bytes) exceeds ``free`` bytes; exactly equal fits."""
    total = sum(need.values())
    if total <= free:
        return
    ranked = sorted(need.items(), key=lambda kv: (-kv[1], kv[0]))
    named = [f"{item(name)} {size_text(b)}" for name, b in ranked[:SHOWN]]
    rest = ranked[SHOWN:]
    if rest:
        named.append(f"{len(rest)} more stages {size_text(sum(b for _, b in rest))}")
    raise InputError(
        f"disk: this run still writes about {size_text(total)} ({total} bytes) under {results.absolute()} "
        f"({', '.join(named)}); the filesystem holding it has {size_text(free)} ({free} bytes) free, "
        f"{size_text(total - free)} short; free space, move the results (--config results_root=/absolute/folder), "
        "or plan a smaller size_profile")


def run_need(run_config: Mapping[str, Any], protocol: Any) -> dict[str, int] | None:
    """Stage -> bytes of every stage of the run ``run_config`` describes, at its size profile; None when
    the parent's size cannot be known at plan time (an unset variable, a missing folder: the model
    stage stops on it)."""
    device = (run_config.get("resolved") or {}).get("device", run_config.get("device", "cpu"))
    try:
        size = model_size(run_config["model"])
    except Int8AlibiError:
        return None
    load = Workload.from_protocol(protocol.analysis, protocol.tokens, protocol.faults, run_config["size_profile"])
    return stage_bytes(size, load, run_stages(device))


@dataclass(frozen=True)
class DiskPlan:
    """What a run needs on disk: every stage's bytes, those still to write, and the free bytes."""

    results: Path
    need: dict[str, int]
    to_write: dict[str, int]
    free: int


def plan_disk(run_config: Mapping[str, Any], protocol: Any, results: str | Path,
              free: Callable[[Path], int] = free_bytes) -> DiskPlan | None:
    """The run's ``DiskPlan`` (None: the parent's size is unknown, see ``run_need``)."""
    need = run_need(run_config, protocol)
    if need is None:
        return None
    folder = Path(results)
    return DiskPlan(folder, need, still_to_write(need, folder), free(folder))


def check_disk(run_config: Mapping[str, Any], protocol: Any, results: str | Path,
               free: Callable[[Path], int] = free_bytes) -> None:
    """Refuse (``InputError``, one line) a run whose stages still to write exceed the free space."""
    plan = plan_disk(run_config, protocol, results, free)
    if plan is not None:
        check(plan.to_write, plan.free, plan.results)

"""What the Snakefile decides once per invocation, before any rule: the checked config and protocol
gate, the run config, and the run's folders, targets and job environments.

common.smk calls these and keeps only what needs Snakemake's own objects (``workflow``, ``rules``,
``checkpoints``, ``directory()``). Planning runs them on every invocation, dry runs included: nothing
here imports torch when the config names its device and arms (``int8alibi.planning.resolve``).
"""

from __future__ import annotations

import glob
import os
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import stage_spec, strict_yaml
from ..config import (check_bounded, command_line_booleans, current_run_config, earlier_plan, expand_env,
                      results_dir, run_config_path, validate, write_run_config)
from ..errors import InputError
from ..protocol import GateReport, gate
from ..files.atomic import write_bytes
from ..files.hashing import sha256_file
from ..tools.venv_stamp import ENVS
from ..planning.resolve import plan
from .rerun import shard_ranges, use_gpu

# What the strict checks call the config Snakemake assembled.
SOURCE = "config (after --configfile/--config)"
# Beside each run config, the SHA-256 of its bytes as written (``config.yaml.sha256``).
SEAL_SUFFIX = ".sha256"
# The rule files' folder, relative to the checkout's root: what a rule's conda environment is named from.
RULES = "workflow/rules"


def checked_config(config: dict[str, Any], configfiles: Iterable[str | Path],
                   overrides: Mapping[str, Any], root: Path) -> tuple[str, GateReport]:
    """``(results folder, protocol gate)`` once the config Snakemake loaded is trusted.

    Snakemake reads the config files with its own YAML loader: each is read again strictly (no
    anchors or aliases, no duplicate keys, bounded size: ``strict_yaml``), the merged config is
    bounded, ``--config key=true`` is typed as the schema says (``config`` is changed in place),
    validated, its results folder checked (``config.results_dir``), the protocol gate run, and the
    size profile looked up. Any failure is an ``Int8AlibiError`` naming the file and the reason.
    """
    for path in configfiles:
        strict_yaml.read(path)
    check_bounded(config, SOURCE)
    command_line_booleans(config, overrides)
    validate(config, SOURCE)
    results = results_dir(config, root, SOURCE)
    checked = gate(root)
    checked.protocol.size_profile(config["size_profile"])  # the named profile exists in analysis.yaml
    return results, checked


@dataclass(frozen=True)
class RunPlan:
    """The run config (``config``'s docstring says what it is and where it lives) and the variables
    left unexpanded because they are not set (every job of the run stops until they are)."""

    path: str
    run: dict[str, Any]
    unset: list[str]


def run_plan(config: Mapping[str, Any], results: str) -> RunPlan:
    """Expand the config's environment variables and resolve ``auto`` once, reusing an earlier plan's
    resolution made for the same device and arms values (``config.earlier_plan``); the run config that
    resolution is read from must be as it was written (``check_unedited``)."""
    expanded, unset = expand_env(config)
    path = run_config_path(results, expanded)
    earlier = Path(path) if Path(path).exists() else current_run_config(results)
    if earlier is not None and earlier.exists():
        check_unedited(earlier)
    run = plan(expanded, earlier_plan(path, results, expanded))
    validate(run, path)
    return RunPlan(path, run, unset)


def seal_path(run_config: str | Path) -> Path:
    """Where the digest of a run config's written bytes lies: beside it, ``config.yaml.sha256``."""
    return Path(f"{run_config}{SEAL_SUFFIX}")


def check_unedited(run_config: Path) -> None:
    """Refuse a run config whose bytes are no longer those written: its ``resolved`` block is the
    choice made once when the run was planned, so a hand edit (two arms swapped) is neither honoured as a
    new choice nor replaced by one. A file written before seals existed has none and is sealed by its
    next executing run (``write_run``)."""
    seal = seal_path(run_config)
    if seal.exists() and seal.read_text(encoding="utf-8", errors="replace").strip() != sha256_file(run_config):
        raise InputError(f"{run_config}: this run config was edited after it was written (its SHA-256 is no longer "
                         f"the one {seal.name} beside it records; e.g. a hand-edited resolved block): a run's "
                         "resolution is made once and read, never rechosen; delete its folder to plan the run again")


def write_run(run: Mapping[str, Any], path: str) -> None:
    """When a run starts executing (Snakemake's ``onstart``): the run config written once
    (``config.write_run_config``) and, beside it, the digest of its bytes that later plans check."""
    new = not Path(path).exists()
    written = write_run_config(run, path)
    seal = seal_path(written)
    if new or not seal.exists():  # a seal left beside a deleted run config does not describe the new one
        write_bytes(seal, f"{sha256_file(written)}\n".encode())


def side_folders(config: Mapping[str, Any], results: str) -> tuple[str, str]:
    """``(logs, benchmarks)``: ``logs/`` and ``benchmarks/``, with the results folder's name below
    them for a run that is not the default ``results`` (one folder per config)."""
    run = [] if config.get("results", "results") == "results" else [Path(results).name]
    return Path("logs", *run).as_posix(), Path("benchmarks", *run).as_posix()


def report_inputs(results: str, run: Mapping[str, Any]) -> list[str]:
    """The manifests the report reads (and so the target of `all`): every reported stage's
    (``stage_spec.Stage.reported``), the GPU-only ones (the K sweep) only in a CUDA run, else left out
    (the report says so)."""
    gpu = use_gpu(run)
    stages = [s for s in stage_spec.STAGES if s.reported and not s.gpu_only]
    stages += [s for s in stage_spec.STAGES if s.reported and s.gpu_only and gpu]
    return [f"{results}/{s.path(stage_spec.MANIFEST)}" for s in stages]


def software_env(run: Mapping[str, Any], gpu_capable: bool = False) -> str:
    """The conda environment file (for ``--sdm conda``, see workflow/envs/README.md) a job runs in,
    relative to the rule files as Snakemake reads it: the GPU set for a GPU-capable stage of a CUDA
    run, else the CPU lock."""
    group = "gpu" if gpu_capable and use_gpu(run) else "cpu"
    return posixpath.relpath(f"{ENVS}/{group}.yaml", RULES)


def deleted_paths(patterns: Mapping[str, str]) -> dict[str, tuple[str, bool]]:
    """``{name_i: (path, is_folder)}`` for every match of each glob pattern, in sorted order: the
    tensor folders and figures a manifest lists, declared as outputs for ``--delete-all-output``."""
    out = {}
    for name, pattern in patterns.items():
        for i, path in enumerate(sorted(glob.glob(pattern))):
            out[f"{name}_{i}"] = (path, os.path.isdir(path))
    return out


def crossmodel_manifests(runs: Iterable[str] | None) -> list[str]:
    """The report manifests of the finished runs the cross-model view combines; none named is an
    ``InputError`` saying what to give."""
    runs = list(runs or [])
    if not runs:
        raise InputError("the cross-model view combines finished results folders, and none are named; give them "
                         "as snakemake crossmodel --config "
                         "'crossmodel=[results/qwen3-1.7b,results/qwen3-8b,results/qwen3-14b]' "
                         "(each the `results` of its own config's run)")
    return [f"{run}/{stage_spec.table('report', stage_spec.MANIFEST)}" for run in runs]


def shard_dirs(results: str, index: str, shards: int) -> list[str]:
    """The fault campaign's layer-range shard folders for the captured layers of ``index``."""
    return [f"{results}/faults/shards/{a}_{b}" for a, b in shard_ranges(index, shards)]

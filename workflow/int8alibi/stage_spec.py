"""Every stage of the pipeline, declared once: the one table the rules, the pins, the chain's required
upstream, the planning tables and the report's table readers are derived from.

Adding a stage is its module (``int8alibi.stages.<name>``), its rule file (``workflow/rules/``, which the
Snakefile includes from here), its entry here and its name in the amendment schema's ``stages`` enum
(a JSON schema cannot import this; a test holds them equal). ``tests/structure/test_stage_spec.py``
checks that they agree and that no other module writes a stage's output paths or file names, or a
table over stage names. Pure data and the standard
library only: planning reads it on every invocation, dry runs included, and every layer may import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# Output names every stage has: the manifest that lists and hashes its other outputs.
MANIFEST = "manifest"
MANIFEST_FILE = "manifest.json"


def _frozen(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Stage:
    """One stage. ``outputs`` maps each rule output name to its file in the stage folder (the manifest
    last); ``folders`` the tensor folders and figures its manifest lists beside them (declared as
    outputs only for ``--delete-all-output``: common.smk's ``deleted_with`` says why)."""

    name: str
    rules: tuple[str, ...]  # the rules doing its work, the main one first
    outputs: Mapping[str, str]
    protocol: tuple[str, ...] = ()  # protocol files it reads, as names inside preregistration/
    config: tuple[str, ...] = ()  # top-level config keys its rules digest (and it alone may read)
    sources: tuple[str, ...] = ()  # source-file roles (snakefile.rerun.source_files) its rules digest
    requires: tuple[str, ...] = ()  # stages whose manifest it must record upstream when present beside it
    folders: Mapping[str, str] = field(default_factory=dict)
    forward: bool = False  # a forward pass at the batch shape the protocol fixes: never chunked to fit memory
    float_statistics: bool = False  # sums float64 statistics of layer outputs on the host
    cpu_threads: int = 2
    priority: int = 0
    gpu: bool = False  # its rules ask for device memory (gpu_mem_mb) on a CUDA run
    gpu_only: bool = False  # in the run only when the device resolves to CUDA
    reported: bool = False  # the report reads its manifest (part of rule all's targets)
    kernel_arms: bool = False  # its manifest records the two kernel arms, arm A and arm B first
    memory_model: str = ""  # planning.resources' held-bytes formula for its jobs; "" for a fixed request
    mem_mb: int = 0  # the fixed host-memory request where there is no memory model
    part_of: str = ""  # the stage it does a share of (its folder lies inside that one's; amended with it)
    folder: str = ""  # its folder under the results folder, when not its name (wildcards in braces)
    rule_file: str = ""  # its rule file's name without .smk, when not its name

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", _frozen(self.outputs))
        object.__setattr__(self, "folders", _frozen(self.folders))

    @property
    def module(self) -> str:
        """The stage's module, run as ``python -m``."""
        return f"int8alibi.stages.{self.name}"

    @property
    def directory(self) -> str:
        """Its folder relative to the results folder."""
        return self.folder or self.name

    @property
    def rules_file(self) -> str:
        """Its rule file, relative to ``workflow/rules/``."""
        return f"{self.rule_file or self.name}.smk"

    def path(self, output: str) -> str:
        """``<folder>/<file>`` of one output, relative to the results folder; an unknown output is a
        KeyError naming the stage and what it writes."""
        try:
            return f"{self.directory}/{self.outputs[output]}"
        except KeyError:
            raise KeyError(f"stage {self.name!r} has no output {output!r} (int8alibi.stage_spec: "
                           f"{', '.join(self.outputs)})") from None


_MODEL_RUN = ("model", "size_profile", "device", "arms")
_ANALYSIS = ("thresholds.yaml", "analysis.yaml")
_PREDICTIONS = ("predictions-original.yaml", "predictions-corrected.yaml")

# Topological order: a stage comes after every stage it reads.
STAGES: tuple[Stage, ...] = (
    Stage("protocol", ("protocol",), {"pins": "pins.parquet", MANIFEST: MANIFEST_FILE}, reported=True,
          protocol=("analysis.yaml", "batch.yaml", "checks.yaml", "faults.yaml", "ksweep.yaml", "paper.yaml",
                    "predictions-corrected.yaml", "predictions-original.yaml", "thresholds.yaml", "tokens.yaml"),
          cpu_threads=1, mem_mb=1000),
    Stage("model", ("model",), {"info": "parent.parquet", MANIFEST: MANIFEST_FILE}, folders={"parent": "parent"},
          config=("model",), sources=("parent",), memory_model="reload"),
    Stage("reference", ("reference_checkpoint",), {MANIFEST: MANIFEST_FILE}, folders={"checkpoint": "checkpoint"},
          requires=("model",), memory_model="llmcompressor"),
    Stage("requant", ("requant",), {"gate": "gate.parquet", MANIFEST: MANIFEST_FILE},
          folders={"checkpoints": "checkpoints"}, protocol=("thresholds.yaml",), config=("model", "device"),
          sources=("checkpoint",), requires=("model",), gpu=True, reported=True, memory_model="writers"),
    Stage("capture", ("capture",), {"index": "index.parquet", MANIFEST: MANIFEST_FILE},
          folders={"operands": "operands"}, protocol=_ANALYSIS,
          config=("model", "size_profile", "corpus", "device", "arms"), sources=("corpus",), requires=("requant",),
          forward=True, priority=2, gpu=True, memory_model="captured_forward"),
    Stage("prediction", ("prediction",), {"predictions": "predictions.parquet", MANIFEST: MANIFEST_FILE},
          protocol=_ANALYSIS, config=("device",), requires=("capture",), float_statistics=True, priority=2, gpu=True,
          memory_model="layer_batch"),
    Stage("compare", ("compare",),
          {"layers": "layers.parquet", "summary": "summary.parquet", MANIFEST: MANIFEST_FILE}, protocol=_ANALYSIS,
          config=("arms", "device", "exploratory"), requires=("capture", "prediction"), float_statistics=True,
          priority=2, gpu=True, reported=True, kernel_arms=True, memory_model="layer_batch"),
    Stage("faults", ("faults", "faults_shard"),
          {"cells": "cells.parquet", "scorecard": "scorecard.parquet", "detection": "detection.parquet",
           "ulp": "ulp_distribution.parquet", "flips": "flips.parquet", "totals": "totals.parquet",
           "decisions": "decisions.parquet", MANIFEST: MANIFEST_FILE},
          protocol=("faults.yaml", "checks.yaml", "thresholds.yaml", *_PREDICTIONS, "analysis.yaml", "paper.yaml"),
          config=("device", "exploratory"), float_statistics=True, priority=2, gpu=True, reported=True,
          memory_model="campaign"),
    Stage("generate", ("generate",), {"tokens": "tokens.parquet", "identity": "identity.json"},
          protocol=("analysis.yaml",), config=("model", "size_profile", "device"), forward=True, gpu=True,
          memory_model="forward", part_of="determinism", folder="determinism/runs/{arm}/{checkpoint}/run{run}",
          rule_file="determinism"),
    Stage("determinism", ("determinism",),
          {"generations": "generations.parquet", "agreement": "agreement.parquet", "summary": "summary.parquet",
           "kernels": "kernels.parquet", MANIFEST: MANIFEST_FILE},
          protocol=("analysis.yaml",), config=("arms", "device"), cpu_threads=1, reported=True, mem_mb=2000),
    Stage("prefill_decode", ("prefill_decode",),
          {"prefill_decode": "prefill_decode.parquet", "first_divergence": "first_divergence.parquet",
           MANIFEST: MANIFEST_FILE},
          protocol=("analysis.yaml",), config=_MODEL_RUN, requires=("requant",), forward=True, priority=1, gpu=True,
          reported=True, kernel_arms=True, memory_model="forward"),
    Stage("perplexity", ("perplexity",),
          {"windows": "windows.parquet", "summary": "summary.parquet", MANIFEST: MANIFEST_FILE},
          protocol=("analysis.yaml",), config=(*_MODEL_RUN, "corpus"), sources=("corpus",), requires=("requant",),
          forward=True, priority=1, gpu=True, reported=True, memory_model="window_forward"),
    Stage("tokens", ("tokens",),
          {"positions": "positions.parquet", "pairs": "pairs.parquet", "predictor": "predictor.parquet",
           "check7": "check7.parquet", "influence": "influence.parquet", MANIFEST: MANIFEST_FILE},
          protocol=("analysis.yaml", "faults.yaml", "thresholds.yaml", "tokens.yaml"), config=(*_MODEL_RUN, "corpus"),
          sources=("corpus",), requires=("model", "requant"), forward=True, priority=2, gpu=True, reported=True,
          kernel_arms=True, memory_model="replay_forward"),
    Stage("ksweep", ("ksweep",),
          {"counts": "counts.parquet", "ulp": "ulp.parquet", "fits": "fits.parquet", "summary": "summary.parquet",
           "evidence": "evidence.parquet", MANIFEST: MANIFEST_FILE},
          protocol=("ksweep.yaml",), gpu=True, gpu_only=True, reported=True, memory_model="layer_batch"),
    Stage("batch", ("batch",),
          {"layers": "layers.parquet", "by_m": "by_m.parquet", "sequences": "sequences.parquet",
           "summary": "summary.parquet", MANIFEST: MANIFEST_FILE},
          protocol=("analysis.yaml", "batch.yaml"), config=_MODEL_RUN, requires=("capture", "requant"), forward=True,
          priority=1, gpu=True, reported=True, kernel_arms=True, memory_model="captured_forward"),
    Stage("report", ("report",),
          {"md": "report.md", "html": "report.html", "appendix_md": "appendix.md", "appendix_html": "appendix.html",
           MANIFEST: MANIFEST_FILE},
          folders={"figure": "*.svg"},
          protocol=("analysis.yaml", *_PREDICTIONS, "paper.yaml", "ksweep.yaml", "batch.yaml"),
          config=("model", "size_profile", "corpus", "arms", "device"), cpu_threads=1, mem_mb=2000),
    Stage("crossmodel", ("crossmodel",),
          {"table": "models.parquet", "md": "models.md", "html": "models.html", MANIFEST: MANIFEST_FILE},
          protocol=(*_PREDICTIONS, "paper.yaml"), cpu_threads=1, mem_mb=2000),
)

BY_NAME: Mapping[str, Stage] = MappingProxyType({s.name: s for s in STAGES})


def stage(name: str) -> Stage:
    """The entry of ``name``; a name the spec does not hold is a KeyError naming the spec."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"stage {name!r} is not in int8alibi.stage_spec.STAGES") from None


def table(name: str, output: str) -> str:
    """``<folder>/<file>`` of stage ``name``'s output ``output``, relative to the results folder: how the
    report names the tables it reads."""
    return stage(name).path(output)


def rule_stages() -> dict[str, Stage]:
    """Rule name -> the stage whose work it does, over every stage's rules."""
    return {rule: s for s in STAGES for rule in s.rules}

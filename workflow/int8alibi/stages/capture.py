"""Stage 4, capture: the operands each W8A8 linear layer hands its kernel, for the pinned tokens.

The bf16 parent is run as a W8A8 model with the own and the pow2-nearest checkpoints built by
``requant``; at every linear layer the kernel's operands (``a_q``, ``s_a``, ``w_q``, ``s_w``) are
stored for the prefill tile (the first M corpus tokens) and for one decode step (M = 1: the first
generated token after prefilling the first protocol prompt). Later stages (prediction, compare,
faults) read only these files, through the index, so every comparison uses exactly these bytes.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..inputs.corpus import load_corpus
from ..engines.checkpoints import checkpoint_dir, gate_verdict
from ..engines.own import SharedParent, greedy_steps
from ..errors import InputError
from ..kernels import Arm
from ..model.hooks import capture, tapped
from ..model.layers import quantized_linears
from ..model.w8a8 import swap_linears
from ..kernels.capture_index import OPERANDS_DIR, save_phase, write_index
from ..kernels.layer_operands import Operands
from ..progress import Progress
from ..inputs.prompts import TokenSelection, capture_sizes, decode_prompt, prefill_tile, token_digest
from ..protocol import load
from ..files.atomic import temp_dir
from ..provenance.manifest import write_manifest
from ..provenance.manifest_format import MANIFEST_NAME
from ..quant.compressed_tensors import load_checkpoint
from ..planning.resolve import stage_arms
from ..runtime.runner import stage_main

log = logging.getLogger("int8alibi.capture")

CHECKPOINTS = ("own", "pow2-nearest")  # subfolders of results/requant/checkpoints/ that are captured
PHASES = ("prefill", "decode")


def capture_decode(model: Any, prompt_ids: torch.Tensor) -> tuple[dict[str, Operands], int]:
    """Prefill ``prompt_ids`` with the KV cache on, take the greedy next token, and capture the
    decode step that feeds it (M = 1). Returns the operands by layer and the generated token id."""
    refs = quantized_linears(model)
    modules = {ref.name: model.get_submodule(ref.name) for ref in refs}
    device = modules[refs[0].name].w_q.device
    with torch.no_grad():
        steps = greedy_steps(model, prompt_ids[None, :].to(device))
        next_id = int(next(steps)[1])  # ties: the lowest id, on every device
        with tapped(model) as records:
            next(steps)
    missing = [ref.name for ref in refs if ref.name not in records]
    if missing:
        raise InputError(f"capture decode: {len(missing)} layer(s) did not run (first: {missing[:3]})")
    return {ref.name: Operands(ref.name, ref.block, ref.proj, *records[ref.name], modules[ref.name].w_q,
                               modules[ref.name].s_w32) for ref in refs}, next_id


def capture_checkpoint(model: Any, checkpoint: Any, arm: Arm, device: torch.device, prefill: TokenSelection,
                       prompt: TokenSelection, name: str, out_dir: Path,
                       progress: Progress) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Swap ``model``'s projections for W8A8 ones on ``arm``, capture both phases and save them under
    ``out_dir``; return the index rows and the generated decode token's record."""
    model = swap_linears(model, checkpoint, arm, device).to(device)
    rows = save_phase(out_dir, list(capture(model, prefill.token_ids).values()), name, "prefill", prefill.sha256)
    progress.update()
    decode_ops, next_id = capture_decode(model, prompt.token_ids)
    sequence = torch.cat([prompt.token_ids, torch.tensor([next_id])])
    rows += save_phase(out_dir, list(decode_ops.values()), name, "decode", token_digest(sequence))
    progress.update()
    return rows, {"token_id": next_id, "sequence_sha256": token_digest(sequence)}


def run(cfg: Config, out_dir: Path, *, gate: Path, project_root: str | Path = ".") -> None:
    """Capture prefill and decode operands of the own and pow2-nearest checkpoints (see module doc).

    Operand files are written to a staging folder and moved into place only when every checkpoint
    and phase was captured; an earlier run's index and manifest are removed first, so a failed run
    leaves nothing that looks complete.
    """
    root, out_dir, gate = Path(project_root), Path(out_dir), Path(gate)
    for stale in (out_dir / "index.parquet", out_dir / MANIFEST_NAME):
        stale.unlink(missing_ok=True)
    analysis = load(root / "preregistration").analysis
    sizes = capture_sizes(analysis, cfg["size_profile"])
    device, arm, _, selection = stage_arms(cfg)  # resolved once per run; the model runs on arm A, compare on both
    corpus = load_corpus(cfg, analysis)
    checkpoint_dirs = {name: checkpoint_dir(gate, name) for name in CHECKPOINTS}  # the gate checked
    gate_labels = {name: [gate_verdict(gate)] for name in CHECKPOINTS}  # one verdict covers every checkpoint
    rows: list[dict[str, Any]] = []
    generated: dict[str, Any] = {}
    shared = SharedParent(cfg)  # loaded once; every checkpoint gets a fresh copy
    model, tokenizer, parent = shared.load(device, without_projections=True)  # swapped before they reach it
    prefill = prefill_tile(tokenizer, corpus, sizes.prefill_tokens, analysis)
    prompt = decode_prompt(tokenizer, analysis)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = temp_dir(out_dir, "capture")
    try:
        with Progress(total=len(CHECKPOINTS) * len(PHASES), desc="capture", unit="phase") as progress:
            for i, name in enumerate(CHECKPOINTS):
                if i:  # a fresh parent for every checkpoint: nothing carries over between them
                    model, _, _ = shared.load(device, without_projections=True)
                checkpoint = load_checkpoint(checkpoint_dirs[name], [r.name for r in quantized_linears(model)],
                                             against="the parent")
                new_rows, generated[name] = capture_checkpoint(model, checkpoint, arm, device, prefill, prompt,
                                                               name, staging, progress)
                rows += new_rows
                log.info("%s: captured %d layers (prefill M=%d, decode M=1 after prompt 0, generated token %d)",
                         name, len(new_rows) // 2, sizes.prefill_tokens, generated[name]["token_id"])
                del model, checkpoint
        shutil.rmtree(out_dir / OPERANDS_DIR, ignore_errors=True)
        (staging / OPERANDS_DIR).rename(out_dir / OPERANDS_DIR)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    index = write_index(out_dir, rows)
    write_manifest(
        out_dir, stage="capture", outputs={"index": index, "operands": out_dir / OPERANDS_DIR},
        inputs={"gate": gate, **{f"checkpoint {n}": d for n, d in checkpoint_dirs.items()}},
        params={"size_profile": sizes.profile, "prefill_tokens": sizes.prefill_tokens,
                "decode_tokens": sizes.decode_tokens, "device": str(device), "capture_arm": arm.name},
        arms=[arm.evidence()], protocol_root=root / "preregistration", device=device,
        extra={"parent": {"source": parent.source, "origin": parent.origin, "sha256": parent.sha256,
                          "tokenizer_digest": parent.tokenizer_digest},
               "prefill": _selection_record(prefill), "decode_prompt": _selection_record(prompt),
               "generated": generated, "gate": gate_labels, "selection": selection, "layers": len(rows),
               "corpus": {"name": corpus.name, "sha256": corpus.sha256, "pin": corpus.pin}},
    )


def _selection_record(selection: TokenSelection) -> dict[str, Any]:
    return {"tokens": int(selection.token_ids.numel()), "sha256": selection.sha256,
            "source": selection.source, "rule": selection.rule}


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

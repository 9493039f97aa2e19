"""Stage batch: does a row's output depend on what it is batched with? (This project's extension.)

Layer level: every captured prefill layer of the registered checkpoints through both kernel arms of
the run and the registered contrasts (bf16; FP8 where the GPU has it), each row inside seeded
batches of every registered M, against its output at the captured M. Sequence level: greedy
generation with the own engine under each arm and registered checkpoint, every prompt alone and
inside left-padded batches, with the first differing step and module. The design and the
predictions are ``preregistration/batch.yaml``; the logic is ``int8alibi.batch``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..batch.layer import INT8, LAYER_KEY, LAYER_SCHEMA, Gemm, co_batches, contrast_gemms, layer_rows
from ..batch.sequence import SEQUENCE_KEY, SEQUENCE_SCHEMA, sequence_rows
from ..batch.summary import BY_M_KEY, BY_M_SCHEMA, SUMMARY_KEY, SUMMARY_SCHEMA, by_m, summary
from ..config import Config
from ..engines.checkpoints import checkpoint_dir
from ..engines.own import SharedParent, load_w8a8
from ..inputs.corpus import prompt_digest, prompts
from ..kernels.capture_index import index_inputs, iter_index_operands
from ..progress import Progress
from ..protocol import load
from ..protocol.load import batch_prompts_needed
from ..protocol.pins import BATCH
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table
from ..planning.resolve import stage_arms
from ..runtime.runner import log, stage_main


def run(cfg: Config, out_dir: Path, *, index: Path, gate: Path) -> None:
    """Both levels of the batch-invariance design for the run's arms (see the module doc)."""
    protocol = load()
    spec, profile_name = protocol.batch, str(cfg["size_profile"])
    protocol.size_profile(profile_name)  # an unknown name stops here, naming analysis.yaml (batch.yaml has the same names)
    layer_spec, seq_spec = spec["layer"], spec["sequence"]
    seq = seq_spec["size_profiles"][profile_name]
    device, arm_a, arm_b, selection = stage_arms(cfg)
    contrasts = contrast_gemms(layer_spec["contrasts"], device)
    arms: dict[str, tuple[str, Gemm]] = {arm.name: (INT8, arm.scaled_mm) for arm in (arm_a, arm_b)}
    with_contrasts = {**arms, **{name: (name, gemm) for name, (gemm, _) in contrasts.items() if gemm is not None}}
    for name, (gemm, why) in contrasts.items():
        log.info("batch: contrast %s: %s", name, why if gemm is not None else f"not run: {why}")

    ms = layer_spec["ms"][profile_name]
    layer_table: list[dict[str, Any]] = []
    for checkpoint in layer_spec["checkpoints"]:
        gemms = with_contrasts if checkpoint in layer_spec["contrast_checkpoints"] else arms
        captured = iter_index_operands(index, checkpoint, layer_spec["phase"])
        for i, (row, op) in enumerate(Progress(captured, desc=f"batch {checkpoint}", unit="layer")):
            where = f"{BATCH}: layer.ms.{profile_name} for {checkpoint}/{row.layer}"
            batches = co_batches(op.m, ms, int(layer_spec["draws"]), int(layer_spec["seed"]) + i, where)
            layer_table += layer_rows(checkpoint, row.layer, op.to(device), gemms, batches)
    layers_frame = pd.DataFrame(layer_table, columns=LAYER_SCHEMA.names).astype({"max_ulp": "Int32"})

    seq_table: list[dict[str, Any]] = []
    digest = None
    shared = SharedParent(cfg)
    needed = batch_prompts_needed(seq)
    for checkpoint in seq_spec["checkpoints"]:
        for arm in (arm_a, arm_b):
            engine = load_w8a8(cfg, checkpoint_dir(gate, checkpoint), arm, device, label=f"{checkpoint}/{arm.name}",
                               shared=shared)
            ids = prompts(engine.tokenizer, protocol.analysis, needed)
            digest = prompt_digest(ids)
            seq_table += sequence_rows(engine.model, checkpoint, arm.name, ids, int(seq["prompts"]),
                                       int(seq["new_tokens"]), seq["batch_sizes"], int(seq_spec["seed"]), device=device)
            log.info("batch: sequences of %s on %s done", checkpoint, arm.name)
    seq_frame = pd.DataFrame(seq_table, columns=SEQUENCE_SCHEMA.names).astype(
        {"first_step": "Int32", "first_token_step": "Int32", "module_index": "Int32", "traced": "Int32",
         "flip_at_step": "boolean"})

    table = summary(layers_frame, seq_frame, spec["predictions"])
    for r in table.itertuples():
        log.info("batch: %s %s/%s (%s): %d of %d %s differ: %s", r.level, r.checkpoint, r.gemm, r.kind,
                 r.differing, r.compared, r.unit, r.outcome)
    outputs = {
        "layers": write_table(layers_frame, out_dir / "layers.parquet", LAYER_SCHEMA, LAYER_KEY),
        "by_m": write_table(by_m(layers_frame), out_dir / "by_m.parquet", BY_M_SCHEMA, BY_M_KEY),
        "sequences": write_table(seq_frame, out_dir / "sequences.parquet", SEQUENCE_SCHEMA, SEQUENCE_KEY),
        "summary": write_table(table, out_dir / "summary.parquet", SUMMARY_SCHEMA, SUMMARY_KEY),
    }
    write_manifest(
        out_dir, stage="batch", outputs=outputs,
        inputs={"index": index, **index_inputs(index), "gate": gate,
                **{f"checkpoint:{c}": checkpoint_dir(gate, c) for c in seq_spec["checkpoints"]}},
        params={"size_profile": profile_name, "layer": {**layer_spec, "ms": ms},
                "sequence": {"checkpoints": seq_spec["checkpoints"], "seed": seq_spec["seed"], **seq},
                "predictions": spec["predictions"], "kernel_arms": [arm_a.name, arm_b.name],
                "contrasts": {name: why for name, (_, why) in contrasts.items()}},
        arms=[arm_a.evidence(), arm_b.evidence()],
        extra={"prompt_digest": digest, "arm_selection": selection, "extension": True,
               "comparison": "layer: each row in seeded co-batches of every M against its row at the captured M, "
                             "bitwise and in bf16 ulps; sequence: greedy generation alone against inside left-padded "
                             "batches, first bitwise differing step's logits, first differing traced intermediate"},
        device=device,
    )


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

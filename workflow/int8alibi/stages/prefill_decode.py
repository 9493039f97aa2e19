"""Stage prefill_decode: the same arm, the same sequence, decoded with a KV cache and replayed as one
prefill — how often the top-1 token flips, and which module first makes the two differ.

arXiv:2608.13756 measured this residual (same arm, prefill versus decode: 8.6% of tokens flip under
real scales, 2.9% under the probe) and could not attribute it to a module; this engine can trace
every intermediate, so for every sequence whose logits differ anywhere the first module in
execution order whose output bits differ at the first differing position is named. A sequence
whose logits never differ says so (no first divergence). Every checkpoint the determinism stage
generates runs on both of the run's kernel arms, with the protocol's prompts and the size
profile's prompt count and length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import Config
from ..inputs.corpus import prompt_digest, prompts
from ..engines.checkpoints import checkpoint_dir
from ..engines.own import SharedParent, load_w8a8
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table
from ..quant.variants import CHECKPOINT_VARIANTS
from ..planning.resolve import stage_arms
from ..engines.prefill_decode import (DIVERGENCE_KEY, DIVERGENCE_SCHEMA, SUMMARY_KEY, SUMMARY_SCHEMA, divergence_frame,
                                      sequence_rows, summary)
from ..runtime.runner import log, stage_main

def run(cfg: Config, out_dir: Path, gate: Path) -> None:
    """Decode and prefill every protocol prompt of the size profile for each checkpoint x arm."""
    from ..protocol import load

    protocol = load()
    profile = protocol.size_profile(cfg["size_profile"])
    boot = protocol.analysis["bootstrap"]
    device, arm_a, arm_b, selection = stage_arms(cfg)  # resolved once per run, when it was planned
    ckpts = {name: checkpoint_dir(gate, name) for name in CHECKPOINT_VARIANTS}
    rows: list[dict[str, Any]] = []
    digest = None
    shared = SharedParent(cfg)  # loaded once, copied per checkpoint x arm
    for name, ckpt in ckpts.items():
        for arm in (arm_a, arm_b):
            engine = load_w8a8(cfg, ckpt, arm, device, label=f"{name}/{arm.name}", shared=shared)
            ids = prompts(engine.tokenizer, protocol.analysis, int(profile["prompts"]))
            digest = prompt_digest(ids)
            rows += sequence_rows(engine.model, name, arm.name, ids, int(profile["new_tokens"]), device)
            log.info("prefill_decode: %s on %s done", name, arm.name)
    divergence = divergence_frame(rows)
    table = summary(divergence, boot)
    for r in table.itertuples():
        log.info("prefill_decode: %s/%s: %d of %d positions flip, %d differ bitwise, %d of %d sequences diverge",
                 r.checkpoint, r.arm, r.flips, r.positions, r.differing_positions, r.sequences_diverging, r.sequences)
    outputs = {
        "prefill_decode": write_table(table, out_dir / "prefill_decode.parquet", SUMMARY_SCHEMA, SUMMARY_KEY),
        "first_divergence": write_table(divergence, out_dir / "first_divergence.parquet", DIVERGENCE_SCHEMA,
                                        DIVERGENCE_KEY),
    }
    write_manifest(
        out_dir, stage="prefill_decode", outputs=outputs,
        inputs={"gate": gate, **{f"checkpoint:{n}": p for n, p in ckpts.items()}},
        params={"size_profile": cfg["size_profile"], "prompts": int(profile["prompts"]),
                "new_tokens": int(profile["new_tokens"]), "checkpoints": list(CHECKPOINT_VARIANTS),
                "kernel_arms": [arm_a.name, arm_b.name],
                "bootstrap": {k: boot[k] for k in ("seed", "resamples", "level", "interval")},
                "cluster": "sequence"},
        arms=[arm_a.evidence(), arm_b.evidence()],
        extra={"prompt_digest": digest, "arm_selection": selection,
               "comparison": "prefill logits against decode logits per generated position, same arm; flip = "
                             "top-1 differs (ties to the lowest id); attribution at the first position whose bf16 "
                             "logits differ in any bit, first traced intermediate in execution order (model.trace)"},
        device=device,
    )


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

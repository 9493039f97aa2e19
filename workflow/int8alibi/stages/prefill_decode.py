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

import pandas as pd
import pyarrow as pa

from ..config import Config
from ..inputs.corpus import prompt_digest, prompts
from ..engines.checkpoints import checkpoint_dir
from ..engines.own import SharedParent, load_w8a8
from ..provenance.manifest import write_manifest
from ..provenance.parquet import write_table
from ..quant.variants import CHECKPOINT_VARIANTS
from ..planning.resolve import stage_arms
from ..tokens.margin import cluster_bootstrap_rate
from ..engines.prefill_decode import attribute, decode, first_differing, positions, prefill
from ..runtime.runner import log, stage_main

SUMMARY_SCHEMA = pa.schema([
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("arm", pa.string(), nullable=False),
    pa.field("sequences", pa.int32(), nullable=False),
    pa.field("positions", pa.int32(), nullable=False),
    pa.field("differing_positions", pa.int32(), nullable=False),   # bf16 logits differ in any bit
    pa.field("flips", pa.int32(), nullable=False),                 # top-1 differs
    pa.field("flip_rate", pa.float64(), nullable=False),
    pa.field("flip_rate_low", pa.float64(), nullable=False),
    pa.field("flip_rate_high", pa.float64(), nullable=False),
    pa.field("level", pa.float64(), nullable=False),
    pa.field("sequences_diverging", pa.int32(), nullable=False),   # sequences with a first divergence
])
SUMMARY_KEY = ["checkpoint", "arm"]
DIVERGENCE_SCHEMA = pa.schema([
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("arm", pa.string(), nullable=False),
    pa.field("sequence", pa.int32(), nullable=False),
    pa.field("positions", pa.int32(), nullable=False),
    pa.field("differing_positions", pa.int32(), nullable=False),
    pa.field("flips", pa.int32(), nullable=False),
    pa.field("diverged", pa.bool_(), nullable=False),
    pa.field("position", pa.int32(), nullable=True),        # first generated position whose logits differ
    pa.field("flip_at_position", pa.bool_(), nullable=True),
    pa.field("module", pa.string(), nullable=True),         # first intermediate whose bits differ there
    pa.field("module_index", pa.int32(), nullable=True),    # its index in execution order
    pa.field("kind", pa.string(), nullable=True),
    pa.field("traced", pa.int32(), nullable=True),          # intermediates traced in that forward pass
])
DIVERGENCE_KEY = ["checkpoint", "arm", "sequence"]


def sequence_rows(model: Any, checkpoint: str, arm: str, prompt_ids: list[list[int]], new_tokens: int,
                  device: Any) -> list[dict[str, Any]]:
    """One row per sequence: positions, differing positions, flips and the attributed first divergence."""
    rows = []
    for s, prompt in enumerate(prompt_ids):
        where = f"prefill_decode {checkpoint}/{arm} sequence {s}"
        tokens, decoded, _ = decode(model, prompt, new_tokens, device=device)
        prefilled, _ = prefill(model, prompt, tokens, device=device)
        pos = positions(decoded, prefilled)
        first = first_differing(pos.differ)
        row: dict[str, Any] = {
            "checkpoint": checkpoint, "arm": arm, "sequence": s, "positions": len(tokens),
            "differing_positions": int(pos.differ.sum()), "flips": int(pos.flip.sum()), "diverged": first is not None,
            "position": None, "flip_at_position": None, "module": None, "module_index": None, "kind": None,
            "traced": None,
        }
        if first is not None:
            d = attribute(model, prompt, tokens, first, decoded, prefilled, device=device, where=where)
            row.update(position=first, flip_at_position=bool(pos.flip[first]), module=d.module,
                       module_index=d.index, kind=d.kind, traced=d.events)
        rows.append(row)
    return rows


def divergence_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=DIVERGENCE_SCHEMA.names).astype(
        {"position": "Int32", "module_index": "Int32", "traced": "Int32", "flip_at_position": "boolean"})


def summary(divergence: pd.DataFrame, boot: dict[str, Any]) -> pd.DataFrame:
    """Per checkpoint x arm: the flip rate over all generated positions with a sequence-cluster
    percentile interval (``tokens.margin.cluster_bootstrap_rate``, the pinned bootstrap settings)."""
    rows = []
    for (checkpoint, arm), part in divergence.groupby(SUMMARY_KEY, sort=True):
        part = part.sort_values("sequence")
        low, high = cluster_bootstrap_rate(part["flips"].to_numpy(), part["positions"].to_numpy(),
                                           seed=int(boot["seed"]), resamples=int(boot["resamples"]),
                                           level=float(boot["level"]))
        total = int(part["positions"].sum())
        rows.append({"checkpoint": checkpoint, "arm": arm, "sequences": len(part), "positions": total,
                     "differing_positions": int(part["differing_positions"].sum()), "flips": int(part["flips"].sum()),
                     "flip_rate": float(part["flips"].sum()) / total, "flip_rate_low": low, "flip_rate_high": high,
                     "level": float(boot["level"]), "sequences_diverging": int(part["diverged"].sum())})
    return pd.DataFrame(rows, columns=SUMMARY_SCHEMA.names)


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

"""Stage 8b, determinism: do the two arms generate the same tokens, and does each repeat itself?

Reads every generate artifact (arm x checkpoint x run), proves through the identity contract that
compared artifacts differ only in the arm (or only in the run), then tabulates agreement per
prompt with the first diverging position. A contract violation stops the stage, naming the field
and both values, unless ``--param allow_unverified=true``, which is then written into every row
and the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import torch

from ..config import Config
from ..engines.generation import RUNS, TOKENS_SCHEMA, artifact_dir, artifact_paths, parse_ids, sequence_sha256
from ..engines.identity import Identity, Mismatch, Treatment, engine_log, join, read_identity
from ..errors import InputError
from ..provenance.hashing import canonical_json
from ..provenance.manifest import write_manifest
from ..provenance.parquet import read_table, write_table
from ..quant.variants import CHECKPOINT_VARIANTS
from ..runtime.runner import log, stage_main

GENERATIONS_SCHEMA = pa.schema([
    pa.field("arm", pa.string(), nullable=False),
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("run", pa.int32(), nullable=False),
    pa.field("prompt", pa.int32(), nullable=False),
    pa.field("n_tokens", pa.int32(), nullable=False),
    pa.field("sequence_sha256", pa.string(), nullable=False),
    pa.field("token_ids", pa.string(), nullable=False),
    pa.field("allow_unverified", pa.bool_(), nullable=False),
])
AGREEMENT_SCHEMA = pa.schema([
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("comparison", pa.string(), nullable=False),
    pa.field("prompt", pa.int32(), nullable=False),
    pa.field("identical", pa.bool_(), nullable=False),
    pa.field("first_divergence", pa.int32(), nullable=True),
    pa.field("allow_unverified", pa.bool_(), nullable=False),
])
# Per artifact: the engine that generated it and the kernel it ran, as the artifact's identity records
# them (for vLLM the kernel class its own selection log named, verified against the requested one).
KERNELS_SCHEMA = pa.schema([
    pa.field("arm", pa.string(), nullable=False),
    pa.field("checkpoint", pa.string(), nullable=False),
    pa.field("run", pa.int32(), nullable=False),
    pa.field("engine", pa.string(), nullable=False),
    pa.field("kernel", pa.string(), nullable=False),
    pa.field("selection_environment", pa.string(), nullable=False),
    pa.field("emulation", pa.bool_(), nullable=False),
])
SUMMARY_SCHEMA = pa.schema([
    pa.field("arm_a", pa.string(), nullable=False),
    pa.field("arm_b", pa.string(), nullable=False),
    pa.field("emulation", pa.bool_(), nullable=False),
    *[pa.field(name, pa.string(), nullable=False) for name in CHECKPOINT_VARIANTS],
    pa.field("self_consistent", pa.string(), nullable=False),
    pa.field("identity", pa.string(), nullable=False),
    pa.field("allow_unverified", pa.bool_(), nullable=False),
])


@dataclass(frozen=True)
class Artifact:
    """One generate output: its identity and token ids ``[prompts, n_tokens]`` (-1 padded)."""

    identity: Identity
    tokens: torch.Tensor
    lengths: torch.Tensor
    frame: pd.DataFrame
    paths: tuple[Path, ...]  # tokens table, identity, and the engine's log where it keeps one


def parse_flag(value: Any, name: str) -> bool:
    """A boolean ``--param``: exactly true or false."""
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise InputError(f"--param {name}={value!r}: expected true or false")
    return text == "true"


def read_artifact(runs: Path, arm: str, checkpoint: str, run: int) -> Artifact:
    table_path, identity_path = artifact_paths(artifact_dir(runs, arm, checkpoint, run))
    if not table_path.is_file():
        raise InputError(f"{table_path}: generate artifact missing (arm {arm}, checkpoint {checkpoint}, run {run})")
    identity = read_identity(identity_path)
    for field, expected in (("arm", arm), ("checkpoint", checkpoint), ("run", run)):
        if getattr(identity, field) != expected:
            raise InputError(f"{identity_path}: identity says {field}={getattr(identity, field)!r}, "
                             f"but the file lies at {field}={expected!r}")
    frame = read_table(table_path, TOKENS_SCHEMA).sort_values("prompt", ignore_index=True)
    if frame["prompt"].tolist() != list(range(len(frame))):
        raise InputError(f"{table_path}: prompts are not 0..{len(frame) - 1}")
    seqs = [parse_ids(text, f"{table_path}: prompt {p}") for p, text in zip(frame["prompt"], frame["token_ids"])]
    for prompt, ids, n, digest in zip(frame["prompt"], seqs, frame["n_tokens"], frame["sequence_sha256"]):
        if len(ids) != n or sequence_sha256(ids) != digest:
            raise InputError(f"{table_path}: prompt {prompt}: token ids do not match their count or sha256")
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    width = int(lengths.max()) if len(seqs) else 0
    tokens = torch.full((len(seqs), width), -1, dtype=torch.int64)
    for i, ids in enumerate(seqs):
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    log_file = engine_log(identity, identity_path.parent)
    return Artifact(identity, tokens, lengths, frame, (table_path, identity_path, *([log_file] if log_file else [])))


def agreement(a: Artifact, b: Artifact) -> tuple[torch.Tensor, torch.Tensor]:
    """Per prompt: identical sequences?, and the first position where they differ (-1 if none).

    Sequences of different lengths diverge where the shorter one ends, if not before.
    """
    if a.tokens.shape[0] != b.tokens.shape[0]:
        raise InputError(f"{a.paths[0]} has {a.tokens.shape[0]} prompts, {b.paths[0]} has {b.tokens.shape[0]}")
    width = max(a.tokens.shape[1], b.tokens.shape[1])
    ta = torch.nn.functional.pad(a.tokens, (0, width - a.tokens.shape[1]), value=-1)
    tb = torch.nn.functional.pad(b.tokens, (0, width - b.tokens.shape[1]), value=-1)
    differs = (ta != tb) | (torch.arange(width)[None, :] >= torch.minimum(a.lengths, b.lengths)[:, None])
    differs &= torch.arange(width)[None, :] < torch.maximum(a.lengths, b.lengths)[:, None]
    identical = ~differs.any(dim=1)
    first = torch.where(identical, torch.full_like(a.lengths, -1), differs.to(torch.int8).argmax(dim=1))
    return identical, first


def _rows(checkpoint: str, comparison: str, identical: torch.Tensor, first: torch.Tensor,
          allow: bool) -> list[dict[str, Any]]:
    return [
        {"checkpoint": checkpoint, "comparison": comparison, "prompt": p, "identical": bool(same),
         "first_divergence": None if same else int(pos), "allow_unverified": allow}
        for p, (same, pos) in enumerate(zip(identical.tolist(), first.tolist()))
    ]


def kernel_row(identity: Identity) -> dict[str, Any]:
    """One ``KERNELS_SCHEMA`` row: the engine, and the kernel the engine's own evidence names (vLLM's
    logged selection where there is one, else the arm's implementation)."""
    evidence = identity.kernel_evidence
    selected = evidence.get("selected")
    kernel = "; ".join(str(k) for k in selected) if selected else str(evidence.get("implementation", evidence.get("arm")))
    return {"arm": identity.arm, "checkpoint": identity.checkpoint, "run": identity.run,
            "engine": f"{identity.engine.get('name')} {identity.engine.get('version')}", "kernel": kernel,
            "selection_environment": canonical_json(evidence.get("environment") or {}),
            "emulation": bool(evidence.get("is_emulation", False))}


def run(cfg: Config, out_dir: Path, runs: Path, allow_unverified: str = "false") -> None:
    """Join every artifact under the identity contract and tabulate agreement."""
    allow = parse_flag(allow_unverified, "allow_unverified")
    arm_a, arm_b = cfg.resolved_arms  # resolved once per run, when it was planned (the generate jobs' arms)
    arms = [arm_a, arm_b]
    arts = {(arm, c, k): read_artifact(Path(runs), arm, c, k) for arm in arms for c in CHECKPOINT_VARIANTS for k in RUNS}

    violations: list[tuple[str, str, Mismatch]] = []
    for c in CHECKPOINT_VARIANTS:
        pairs: list[tuple[Any, Any, Treatment]] = [((arm_a, c, k), (arm_b, c, k), "arm") for k in RUNS]
        pairs += [((arm, c, 1), (arm, c, 2), "run") for arm in arms]
        for ka, kb, treatment in pairs:
            a, b = arts[ka].identity, arts[kb].identity
            violations += [(a.source, b.source, m) for m in join(a, b, treatment, allow_unverified=allow)]
    if violations:
        log.warning("determinism: %d identity violation(s) allowed by allow_unverified=true", len(violations))
    identity_note = ("verified: every compared pair differs only in its treatment" if not violations else
                     f"UNVERIFIED ({len(violations)} violation(s), allowed by allow_unverified=true): "
                     + "; ".join(f"{m.describe()} [{Path(sa).name} vs {Path(sb).name}]" for sa, sb, m in violations[:5]))

    generations = pd.concat([
        art.frame.assign(arm=arm, checkpoint=c, run=k, allow_unverified=allow)
        [[f.name for f in GENERATIONS_SCHEMA]]
        for (arm, c, k), art in arts.items()
    ], ignore_index=True)
    rows: list[dict[str, Any]] = []
    for c in CHECKPOINT_VARIANTS:
        rows += _rows(c, "arms", *agreement(arts[(arm_a, c, 1)], arts[(arm_b, c, 1)]), allow)
        for arm in arms:
            rows += _rows(c, f"runs-of-{arm}", *agreement(arts[(arm, c, 1)], arts[(arm, c, 2)]), allow)
    table = pd.DataFrame(rows, columns=AGREEMENT_SCHEMA.names).astype({"first_divergence": "Int64"})

    def count(c: str, comparison: str) -> str:
        sel = table[(table["checkpoint"] == c) & (table["comparison"] == comparison)]
        return f"{int(sel['identical'].sum())}/{len(sel)}"

    self_consistent = bool(table.loc[table["comparison"] != "arms", "identical"].all())
    emulation = any(bool(arts[(arm, CHECKPOINT_VARIANTS[0], 1)].identity.kernel_evidence.get("is_emulation", False))
                    for arm in arms)
    summary = pd.DataFrame([{
        "arm_a": arm_a, "arm_b": arm_b, "emulation": emulation,
        **{c: count(c, "arms") for c in CHECKPOINT_VARIANTS},
        "self_consistent": "yes" if self_consistent else "no",
        "identity": identity_note, "allow_unverified": allow,
    }])
    outputs = {
        "generations": write_table(generations, out_dir / "generations.parquet", GENERATIONS_SCHEMA,
                                   sort_by=["arm", "checkpoint", "run", "prompt"]),
        "agreement": write_table(table, out_dir / "agreement.parquet", AGREEMENT_SCHEMA,
                                 sort_by=["checkpoint", "comparison", "prompt"]),
        "summary": write_table(summary, out_dir / "summary.parquet", SUMMARY_SCHEMA, sort_by=["arm_a", "arm_b"]),
        "kernels": write_table(pd.DataFrame([kernel_row(art.identity) for art in arts.values()]),
                               out_dir / "kernels.parquet", KERNELS_SCHEMA, sort_by=["arm", "checkpoint", "run"]),
    }
    write_manifest(
        out_dir, stage="determinism", outputs=outputs,
        inputs=[p for art in arts.values() for p in art.paths],
        params={"allow_unverified": allow, "arms": arms, "device": cfg.resolved_device,
                "engine": sorted({str(art.identity.engine.get("name")) for art in arts.values()}),
                "checkpoints": list(CHECKPOINT_VARIANTS), "runs": list(RUNS)},
        arms=[dict(arts[(arm, CHECKPOINT_VARIANTS[0], 1)].identity.kernel_evidence) for arm in arms],
        extra={"identity": {"verified": not violations, "allow_unverified": allow,
                            "violations": [{"a": sa, "b": sb, "field": m.field, "value_a": m.a, "value_b": m.b}
                                           for sa, sb, m in violations]}},
        device="cpu",  # determinism only reads tables; the arms' devices are in their identity files
    )
    log.info("determinism: %s", summary.iloc[0].to_dict())


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

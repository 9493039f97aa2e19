"""Generation determinism: do the two arms generate the same tokens, and does each repeat itself?

Every generate artifact (arm x checkpoint x run) is read and checked; the identity contract proves
that compared artifacts differ only in the arm (or only in the run); agreement is tabulated per
prompt with the first diverging position. A contract violation stops the study, naming the field
and both values, unless ``allow_unverified``, which is then written into every row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import torch

from ..engines.generation import RUNS, TOKENS_SCHEMA, artifact_dir, artifact_paths, parse_ids, sequence_sha256
from ..engines.identity import Identity, Mismatch, Treatment, engine_log, join, read_identity
from ..errors import InputError
from ..files.hashing import canonical_json
from ..files.parquet import read_table
from ..quant.variants import CHECKPOINT_VARIANTS

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


def read_artifact(runs: Path, arm: str, checkpoint: str, run: int) -> Artifact:
    """One artifact, trusted only where it lies where its identity says and every sequence matches its digest."""
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


ArtifactKey = tuple[str, str, int]  # (arm, checkpoint, run)
Violation = tuple[str, str, Mismatch]  # (source a, source b, the mismatch)


def read_artifacts(runs: Path, arms: Sequence[str]) -> dict[ArtifactKey, Artifact]:
    """Every generate artifact of ``arms``: each checkpoint variant, each run."""
    return {(arm, c, k): read_artifact(Path(runs), arm, c, k) for arm in arms for c in CHECKPOINT_VARIANTS for k in RUNS}


def identity_violations(arts: Mapping[ArtifactKey, Artifact], arms: tuple[str, str],
                        allow: bool) -> list[Violation]:
    """Every compared pair's identity join: the arms per run, and the runs per arm (InputError unless ``allow``)."""
    arm_a, arm_b = arms
    violations: list[Violation] = []
    for c in CHECKPOINT_VARIANTS:
        pairs: list[tuple[ArtifactKey, ArtifactKey, Treatment]] = [((arm_a, c, k), (arm_b, c, k), "arm") for k in RUNS]
        pairs += [((arm, c, 1), (arm, c, 2), "run") for arm in arms]
        for ka, kb, treatment in pairs:
            a, b = arts[ka].identity, arts[kb].identity
            violations += [(a.source, b.source, m) for m in join(a, b, treatment, allow_unverified=allow)]
    return violations


def identity_note(violations: Sequence[Violation]) -> str:
    """The summary's identity column: verified, or the allowed violations (the first five)."""
    if not violations:
        return "verified: every compared pair differs only in its treatment"
    return (f"UNVERIFIED ({len(violations)} violation(s), allowed by allow_unverified=true): "
            + "; ".join(f"{m.describe()} [{Path(sa).name} vs {Path(sb).name}]" for sa, sb, m in violations[:5]))


def generations_table(arts: Mapping[ArtifactKey, Artifact], allow: bool) -> pd.DataFrame:
    """Every artifact's sequences, labelled with its arm, checkpoint and run."""
    return pd.concat([
        art.frame.assign(arm=arm, checkpoint=c, run=k, allow_unverified=allow)
        [[f.name for f in GENERATIONS_SCHEMA]]
        for (arm, c, k), art in arts.items()
    ], ignore_index=True)


def agreement_table(arts: Mapping[ArtifactKey, Artifact], arms: tuple[str, str], allow: bool) -> pd.DataFrame:
    """Per checkpoint and prompt: the arms on run 1, and each arm's two runs."""
    arm_a, arm_b = arms
    rows: list[dict[str, Any]] = []
    for c in CHECKPOINT_VARIANTS:
        rows += _rows(c, "arms", *agreement(arts[(arm_a, c, 1)], arts[(arm_b, c, 1)]), allow)
        for arm in arms:
            rows += _rows(c, f"runs-of-{arm}", *agreement(arts[(arm, c, 1)], arts[(arm, c, 2)]), allow)
    return pd.DataFrame(rows, columns=AGREEMENT_SCHEMA.names).astype({"first_divergence": "Int64"})


def is_emulation(arts: Mapping[ArtifactKey, Artifact], arms: Sequence[str]) -> bool:
    """Whether either arm is an emulation, as its first artifact's kernel evidence says."""
    return any(bool(arts[(arm, CHECKPOINT_VARIANTS[0], 1)].identity.kernel_evidence.get("is_emulation", False))
               for arm in arms)


def summary_table(table: pd.DataFrame, arts: Mapping[ArtifactKey, Artifact], arms: tuple[str, str],
                  violations: Sequence[Violation], allow: bool) -> pd.DataFrame:
    """One row: identical prompts of the arms per checkpoint, self-consistency, and the identity note."""
    def count(c: str, comparison: str) -> str:
        sel = table[(table["checkpoint"] == c) & (table["comparison"] == comparison)]
        return f"{int(sel['identical'].sum())}/{len(sel)}"

    self_consistent = bool(table.loc[table["comparison"] != "arms", "identical"].all())
    return pd.DataFrame([{
        "arm_a": arms[0], "arm_b": arms[1], "emulation": is_emulation(arts, arms),
        **{c: count(c, "arms") for c in CHECKPOINT_VARIANTS},
        "self_consistent": "yes" if self_consistent else "no",
        "identity": identity_note(violations), "allow_unverified": allow,
    }])


def kernels_table(arts: Mapping[ArtifactKey, Artifact]) -> pd.DataFrame:
    """One ``KERNELS_SCHEMA`` row per artifact."""
    return pd.DataFrame([kernel_row(art.identity) for art in arts.values()])


# Each table the study writes, by name: its schema and sort key (the file is ``<name>.parquet``).
TABLES: dict[str, tuple[pa.Schema, list[str]]] = {
    "generations": (GENERATIONS_SCHEMA, ["arm", "checkpoint", "run", "prompt"]),
    "agreement": (AGREEMENT_SCHEMA, ["checkpoint", "comparison", "prompt"]),
    "summary": (SUMMARY_SCHEMA, ["arm_a", "arm_b"]),
    "kernels": (KERNELS_SCHEMA, ["arm", "checkpoint", "run"]),
}

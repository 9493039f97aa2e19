"""Stage 8a, generate: one greedy-generation artifact (arm x checkpoint x run) in this process.

The rule starts a fresh process per artifact, so "the same arm twice" really is two processes.
The artifact is the token table plus its identity contract (``engines.identity``): everything
the tokens may depend on, so that ``determinism`` can prove two artifacts differ only in the arm
or only in the run before comparing them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from .. import portable
from ..config import Config
from ..inputs.corpus import prompt_digest, prompts
from ..device import describe
from ..engines.checkpoints import checkpoint_dir, parent_digest
from ..engines.generation import RUNS, TOKENS_SCHEMA, artifact_paths, ids_text, sequence_sha256
from ..engines.identity import Identity, checkpoint_digest, quant_config_digest, rails_digest, write_identity
from ..engines.own import engine_record, load_w8a8
from ..errors import InputError
from ..provenance.environment import library_versions
from ..files.parquet import write_table
from ..model.sources import tokenizer_digest
from ..quant.variants import CHECKPOINT_VARIANTS
from ..planning.resolve import require_arm, stage_device
from ..runtime.runner import log, stage_main

ENGINES = ("own", "vllm")


def parse_run(value: Any) -> int:
    """The run number from ``--param run=<k>``: one of ``RUNS``."""
    try:
        k = int(str(value))
    except ValueError:
        raise InputError(f"--param run={value!r}: not an integer") from None
    if k not in RUNS:
        raise InputError(f"--param run={k}: expected one of {list(RUNS)}")
    return k


@dataclass(frozen=True)
class Generated:
    """What an engine produced and the facts about it that enter the identity contract."""

    prompt_ids: list[list[int]]
    tokens: list[list[int]]
    tokenizer: Any
    parent_digest: str
    engine: dict[str, Any]
    kernel_evidence: dict[str, Any]
    process: dict[str, Any]


def _own(cfg: Config, ckpt: Path, arm: str, device: torch.device, analysis: Any, profile: Any) -> Generated:
    kernel = require_arm(cfg, arm, device)  # fails closed, naming the arm and this host
    engine = load_w8a8(cfg, ckpt, kernel, device, label=f"{arm}/{ckpt.name}")
    ids = prompts(engine.tokenizer, analysis, int(profile["prompts"]))
    tokens = engine.generate(ids, int(profile["new_tokens"]))
    return Generated(ids, tokens, engine.tokenizer, parent_digest(engine.info), engine_record(device), kernel.evidence(),
                     {})


def _vllm(cfg: Config, ckpt: Path, arm: str, work_dir: Path, analysis: Any, profile: Any) -> Generated:
    from transformers import AutoTokenizer

    from ..engines import vllm_engine
    from ..model.sources import saved_parent_info

    tokenizer = AutoTokenizer.from_pretrained(ckpt)  # the prompts' ids; vLLM itself gets ids, not text
    ids = prompts(tokenizer, analysis, int(profile["prompts"]))
    result = vllm_engine.generate(arm, ckpt, ids, int(profile["new_tokens"]), work_dir)
    engine = {"name": "vllm", "version": result.evidence["vllm"], "decoding": "greedy, one prompt per call",
              "settings": result.settings, "environment_sha256": result.environment_sha256}
    return Generated(ids, result.tokens, tokenizer, parent_digest(saved_parent_info(cfg)), engine, result.evidence,
                     {"log": f"{work_dir.name}/{arm}.vllm.log", "log_sha256": result.log_sha256})


def run(cfg: Config, out_dir: Path, gate: Path, arm: str, checkpoint: str, run: str,
        engine: str = "own") -> None:
    """Generate the pinned prompts greedily with ``arm`` on ``checkpoint``; write tokens + identity."""
    k = parse_run(run)
    if checkpoint not in CHECKPOINT_VARIANTS:
        raise InputError(f"--param checkpoint={checkpoint!r}: expected one of {list(CHECKPOINT_VARIANTS)}")
    if engine not in ENGINES:
        raise InputError(f"--param engine={engine!r}: expected one of {list(ENGINES)}")
    from ..protocol import load

    protocol = load()
    profile = protocol.size_profile(cfg["size_profile"])
    ckpt = checkpoint_dir(gate, checkpoint)
    device = stage_device(cfg, [arm])  # resolved once per run, when it was planned
    log.info("generate: arm %s, checkpoint %s, run %d, engine %s, device %s", arm, checkpoint, k, engine, device)
    if engine == "own":
        out = _own(cfg, ckpt, arm, device, protocol.analysis, profile)
    else:
        out = _vllm(cfg, ckpt, arm, out_dir / "vllm", protocol.analysis, profile)
    generation = {"prompts": len(out.prompt_ids), "new_tokens": int(profile["new_tokens"]), "decoding": "greedy",
                  "size_profile": cfg["size_profile"]}
    frame = pd.DataFrame({
        "prompt": range(len(out.prompt_ids)),
        "prompt_tokens": [len(p) for p in out.prompt_ids],
        "n_tokens": [len(t) for t in out.tokens],
        "sequence_sha256": [sequence_sha256(t) for t in out.tokens],
        "token_ids": [ids_text(t) for t in out.tokens],
    })
    identity = Identity(
        arm=arm, checkpoint=checkpoint, run=k,
        prompt_digest=prompt_digest(out.prompt_ids),
        rails_digest=rails_digest(generation, out.engine),
        checkpoint_digest=checkpoint_digest(ckpt),
        parent_digest=out.parent_digest,
        tokenizer_digest=tokenizer_digest(out.tokenizer),
        quant_config_digest=quant_config_digest(ckpt),
        generation=generation,
        engine=out.engine,
        libraries=library_versions(),
        device=describe(device),
        kernel_evidence=out.kernel_evidence,
        cpu=portable.facts(),
        process=out.process,
    )
    tokens_path, identity_path = artifact_paths(out_dir)
    write_table(frame, tokens_path, TOKENS_SCHEMA, sort_by=["prompt"])
    write_identity(identity_path, identity)
    log.info("generate: wrote %s and %s", tokens_path, identity_path)


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

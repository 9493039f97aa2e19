"""Stage tokens: check 7 at model level (``tokens.study``): top-1 flips between arms, the margin as
their predictor, and check 7 under end-to-end fault injection (preregistration/tokens.yaml).

The stage resolves the run's arms, checkpoints and corpus, has ``tokens.study`` replay every regime
and build the five tables, and writes them with the manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..analysis.scoring import NOT_APPLICABLE, OUTCOMES, UNOBSERVABLE
from ..config import Config
from ..engines.checkpoints import checkpoint_dir
from ..faults.campaign import CampaignSettings
from ..inputs.corpus import CorpusText, load_corpus
from ..planning.resolve import stage_arms
from ..files.hashing import canonical_json, sha256_bytes
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table
from ..engines.own import OwnEngine, SharedParent, load_w8a8
from ..runtime.runner import log, stage_main
from ..tokens.check7 import Check7Rule
from ..tokens.inject import InjectionArm
from ..tokens.study import TABLES, Sizes, replay_regimes, sizes, study_tables


@dataclass(frozen=True)
class _Plan:
    """What one run of the stage replays: the protocol's settings and the run's resolved arms and inputs."""

    spec: Mapping[str, Any]
    boot: Mapping[str, Any]
    size: Sizes
    cut_profile: Mapping[str, Any]
    settings: CampaignSettings
    regimes: dict[str, str]
    checkpoints: dict[str, Path]
    arms: tuple[Any, Any]
    device: torch.device
    selection: dict[str, Any]
    corpus: CorpusText


def _plan(cfg: Config, gate: Path) -> _Plan:
    from ..protocol import load

    protocol = load()
    spec = protocol.tokens
    size, cut_profile = sizes(spec, cfg["size_profile"]), protocol.size_profile(cfg["size_profile"])
    settings = CampaignSettings.from_protocol(protocol)
    regimes: dict[str, str] = dict(spec["regimes"])
    device, arm_a, arm_b, selection = stage_arms(cfg)  # resolved once per run, when it was planned
    return _Plan(spec, protocol.analysis["bootstrap"], size, cut_profile, settings, regimes,
                 {regime: checkpoint_dir(gate, name) for regime, name in regimes.items()}, (arm_a, arm_b), device,
                 selection, load_corpus(cfg, protocol.analysis))


def run(cfg: Config, out_dir: Path, gate: Path, parent: Path | None = None) -> None:
    """Replay, inject, score check 7 and the margin predictor; write five tables and the manifest."""
    plan = _plan(cfg, gate)
    shared = SharedParent(cfg)  # the parent loaded once, copied per regime

    def load(regime: str, label: str) -> OwnEngine:
        return load_w8a8(cfg, plan.checkpoints[regime], plan.arms[0], plan.device, label=label, shared=shared)

    outcomes, cut = replay_regimes(load, plan.regimes, plan.arms, plan.corpus, plan.cut_profile, plan.size,
                                   plan.settings, plan.device)
    tables = study_tables(outcomes, plan.spec, plan.boot, (plan.arms[0].name, plan.arms[1].name), plan.regimes)
    check7, pairs = tables["check7"], tables["pairs"]
    scores = {s: int((check7["score"] == s).sum()) for s in (*OUTCOMES, UNOBSERVABLE, NOT_APPLICABLE)}
    log.info("tokens: kernel-pair flips %s; check 7 under injection %s",
             dict(zip(pairs["regime"], pairs["flips"])), scores)
    outputs = {name: write_table(frame, out_dir / f"{name}.parquet", *TABLES[name]) for name, frame in tables.items()}
    inputs: dict[str, Path] = {"gate": gate, **{f"checkpoint:{plan.regimes[r]}": p
                                                for r, p in plan.checkpoints.items()}}
    if parent is not None:
        inputs["parent"] = parent
    if cfg["corpus"]["source"] == "wikitext":
        inputs["corpus"] = Path(cfg["corpus"]["path"])
    _manifest(cfg, out_dir, plan, outputs, inputs, cut, scores)


def _manifest(cfg: Config, out_dir: Path, plan: _Plan, outputs: dict[str, Path], inputs: dict[str, Path],
              cut: torch.Tensor, scores: dict[str, int]) -> None:
    (arm_a, arm_b), size, boot, corpus = plan.arms, plan.size, plan.boot, plan.corpus
    rule = Check7Rule.from_protocol(plan.spec)
    write_manifest(
        out_dir, stage="tokens", outputs=outputs, inputs=inputs,
        params={"size_profile": cfg["size_profile"], "replay_windows": size.windows,
                "replay_window_tokens": size.tokens, "injection_windows": size.injection_windows,
                "regimes": plan.regimes, "kernel_arms": [arm_a.name, arm_b.name],
                "check7": {"margin_threshold": rule.margin_threshold, "flip_budget": rule.flip_budget,
                           "confident_flips_allowed": rule.confident_flips_allowed},
                "bootstrap": {k: boot[k] for k in ("seed", "resamples", "level", "interval")},
                "fault_seed": plan.settings.seed},
        arms=[arm_a.evidence(), arm_b.evidence(),
              InjectionArm([None], 1, "(evidence)", 0, plan.settings, plan.device).evidence()],
        extra={"corpus": {"name": corpus.name, "sha256": corpus.sha256, "pin": corpus.pin},
               "windows_sha256": sha256_bytes(canonical_json(cut.tolist()).encode()),
               "arm_selection": plan.selection, "check7_scores": scores,
               "controls": "every kernel-pair batch: arm A twice (bit-identical, else the stage fails); F8's "
                           "injection batch: bit-identical to its reference copy, else the stage fails"},
        device=plan.device,
    )


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

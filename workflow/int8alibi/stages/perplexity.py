"""Stage 9, perplexity: what the power-of-two scale arms cost (``engines.perplexity``).

The stage resolves the run's kernel arm, checkpoints and corpus, has every model score the pinned
windows, and writes the per-window NLLs, the summary (changes vs own, the probe's decomposition,
H1 and G1) and the manifest.
"""

from __future__ import annotations

from pathlib import Path

from ..engines.perplexity import (MODELS, SUMMARY_SCHEMA, WINDOWS_SCHEMA, analyse, score_models,
                                   windows_table)
from ..config import Config
from ..engines.checkpoints import checkpoint_dir
from ..inputs.corpus import load_corpus
from ..planning.resolve import stage_arms
from ..files.hashing import canonical_json, sha256_bytes
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table
from ..runtime.runner import stage_main


def run(cfg: Config, out_dir: Path, gate: Path) -> None:
    """Score every arm on the pinned windows; write per-window NLLs, the summary and the manifest."""
    from ..protocol import load

    protocol = load()
    analysis = protocol.analysis
    profile = protocol.size_profile(cfg["size_profile"])
    device, kernel, _, selection = stage_arms(cfg)  # resolved once per run; every W8A8 arm runs on arm A
    ckpts = {name: checkpoint_dir(gate, name) for name in MODELS if name != "parent"}
    corpus = load_corpus(cfg, analysis)

    nll, tokens, cut = score_models(cfg, ckpts, kernel, device, corpus, profile)
    frame = windows_table(nll, tokens)
    summary = analyse(nll, tokens, analysis)
    outputs = {
        "windows": write_table(frame, out_dir / "windows.parquet", WINDOWS_SCHEMA, sort_by=["arm", "window"]),
        "summary": write_table(summary, out_dir / "summary.parquet", SUMMARY_SCHEMA, sort_by=["quantity", "arm"]),
    }
    inputs: dict[str, Path] = {"gate": gate, **{f"checkpoint:{k}": v for k, v in ckpts.items()}}
    if cfg["corpus"]["source"] == "wikitext":
        inputs["corpus"] = Path(cfg["corpus"]["path"])
    write_manifest(
        out_dir, stage="perplexity", outputs=outputs, inputs=inputs,
        params={"size_profile": cfg["size_profile"], "windows": int(profile["windows"]),
                "window_tokens": int(profile["window_tokens"]), "kernel_arm": kernel.name,
                "bootstrap": dict(analysis["bootstrap"])},
        arms=[kernel.evidence()],
        extra={"corpus": {"name": corpus.name, "sha256": corpus.sha256, "pin": corpus.pin},
               "windows_sha256": sha256_bytes(canonical_json(cut.tolist()).encode()),
               "arm_selection": selection,
               "note": f"every W8A8 arm runs its linears on kernel arm A ({kernel.name})"},
        device=device,
    )


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

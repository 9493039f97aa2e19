"""The perplexity stage end to end on the tiny synthetic model: windows that follow the rule, scores
that match an independent computation, a complete summary and byte-identical reruns. (The summary's
statistics on NLLs with known answers: tests/analysis/test_perplexity.py.)"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from int8alibi.engines.perplexity import MODELS
from int8alibi.config import Config
from int8alibi.inputs.corpus import encode, load_corpus
from int8alibi.model.sources import load_parent
from int8alibi.protocol import load
from int8alibi.files.hashing import canonical_json, sha256_bytes, sha256_file
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.files.parquet import read_table
from int8alibi.stages.perplexity import run as perplexity_stage

ROOT = Path(__file__).resolve().parents[2]
ANALYSIS = load(ROOT / "preregistration").analysis
(G1,) = [g for g in ANALYSIS["gates"] if g["id"] == "G1"]


def by_quantity(frame: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["quantity"], r["arm"]): r for r in frame.to_dict("records")}


@pytest.fixture(scope="module")
def scored(tiny_pipeline) -> tuple[Config, Path, Path]:
    """(config, first output folder, second output folder) of two perplexity runs on the tiny model."""
    _, cfg = tiny_pipeline("tiny-perplexity", ["exact-cutlass-order", "exact-triton-order"])
    outs = (cfg.results / "perplexity-a", cfg.results / "perplexity-b")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        for out in outs:
            out.mkdir()
            perplexity_stage(cfg, out, gate=cfg.results / "requant" / "gate.parquet")
    return cfg, *outs


@pytest.mark.slow
def test_tiny_model_windows_follow_the_rule_and_scores_match_an_independent_computation(
        scored: tuple[Config, Path, Path]) -> None:
    cfg, out, _ = scored
    profile = load(ROOT / "preregistration").size_profile("tiny")
    frame = read_table(out / "windows.parquet")
    assert sorted(set(frame["arm"])) == sorted(MODELS)
    assert len(frame) == len(MODELS) * profile["windows"]
    assert set(frame["tokens"]) == {profile["window_tokens"] - 1}
    assert np.allclose(frame["nll_mean"], frame["nll_sum"] / frame["tokens"], rtol=0, atol=0)

    model, tokenizer, _ = load_parent(cfg)
    ids = encode(tokenizer, load_corpus(cfg).text)
    cut = torch.tensor(ids[: profile["windows"] * profile["window_tokens"]]).reshape(profile["windows"], -1)
    manifest = load_manifest(out / "manifest.json")
    assert manifest["extra"]["windows_sha256"] == sha256_bytes(canonical_json(cut.tolist()).encode())
    parent = frame[frame["arm"] == "parent"].sort_values("window")
    with torch.inference_mode():
        for w in range(profile["windows"]):
            logits = model(input_ids=cut[w:w + 1]).logits[0, :-1].float()
            reference = torch.nn.functional.cross_entropy(logits, cut[w, 1:], reduction="sum").item()
            assert parent["nll_sum"].iloc[w] == pytest.approx(reference, rel=1e-5)
    by_arm = {a: frame[frame["arm"] == a].sort_values("window")["nll_sum"].to_numpy() for a in MODELS}
    assert not np.array_equal(by_arm["parent"], by_arm["own"])          # the W8A8 layers really ran
    assert not np.array_equal(by_arm["probe"], by_arm["pow2-nearest"])  # the probe is its own checkpoint


@pytest.mark.slow
def test_tiny_model_summary_is_complete_and_runs_are_byte_identical(scored: tuple[Config, Path, Path]) -> None:
    _, first, second = scored
    for name in ("windows.parquet", "summary.parquet"):
        assert sha256_file(first / name) == sha256_file(second / name)
    rows = by_quantity(read_table(first / "summary.parquet"))
    assert {arm for q, arm in rows if q == "perplexity"} == set(MODELS)
    assert {arm for q, arm in rows if q == "relative_change_vs_own"} == set(MODELS) - {"own"}
    for arm in set(MODELS) - {"own"}:
        r = rows[("relative_change_vs_own", arm)]
        assert r["low"] <= r["value"] <= r["high"] or r["low"] is None
    # H1 and G1 recomputed from the per-window NLLs, independently of the stage's statistics code:
    # the pinned resampling (PCG64 seeded by analysis.yaml, one draw of [resamples, windows] indices),
    # perplexity over the resampled windows' tokens, numpy's linear quantiles.
    windows = read_table(first / "windows.parquet")
    by_arm = {a: windows[windows["arm"] == a].sort_values("window") for a in MODELS}
    tokens = by_arm["own"]["tokens"].to_numpy(dtype=np.float64)
    sums = {a: f["nll_sum"].to_numpy() for a, f in by_arm.items()}
    ppl = {a: math.exp(sums[a].sum() / tokens.sum()) for a in MODELS}
    boot = ANALYSIS["bootstrap"]
    idx = np.random.Generator(np.random.PCG64(boot["seed"])).integers(0, len(tokens), size=(boot["resamples"], len(tokens)))
    boot_ppl = {a: np.exp(sums[a][idx].sum(axis=1) / tokens[idx].sum(axis=1)) for a in MODELS}
    diff = (boot_ppl["pow2-ceiling"] - boot_ppl["pow2-nearest"]) / boot_ppl["own"]
    low, high = np.quantile(diff, [0.05, 0.95])
    h1 = rows[("hypothesis:H1", "pow2-ceiling")]
    assert (h1["low"], h1["high"]) == (pytest.approx(low, rel=1e-12, abs=1e-15), pytest.approx(high, rel=1e-12, abs=1e-15))
    assert h1["verdict"] == ("supported" if high < 0 else
                             f"not supported: the 90% interval [{low:.6g}, {high:.6g}] does not lie entirely below zero")
    g1 = rows[("gate:G1", "pow2-ceiling")]
    change = ppl["pow2-ceiling"] / ppl["own"] - 1
    assert g1["value"] == pytest.approx(change, rel=1e-12)
    assert g1["verdict"] == ("triggered: search arm not in this study's build" if change > G1["threshold"] else
                             "gate not triggered")
    assert ("mismatch_share", "probe") in rows
    manifest = load_manifest(first / "manifest.json")
    assert manifest["params"]["kernel_arm"] == "exact-cutlass-order"
    assert manifest["extra"]["corpus"]["pin"].startswith("not applicable")
    assert {r["name"] for r in manifest["inputs"]} >= {"gate", "checkpoint:own", "checkpoint:probe"}

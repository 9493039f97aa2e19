"""The report's first screens: language-dependent findings on a synthetic parent, the weights row
against the uniform bound, the answer sentence, the verdict box and the run's identity."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from int8alibi.protocol import load
from int8alibi.report import summary
from int8alibi.report.document import Box
from int8alibi.report.sections import Tables
from int8alibi.report.verdicts import RunFacts

PROTOCOL = load(Path(__file__).resolve().parents[2] / "preregistration")
SYNTHETIC = RunFacts(model=None, shape="qwen3-1.7b", synthetic=True, emulated=False, engines={"determinism": "vllm"})
TRAINED = RunFacts(model="qwen3-1.7b", shape="qwen3-1.7b", synthetic=False, emulated=False)


def _write(root: Path, rel: str, frame: pd.DataFrame) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False)


def _perplexity(root: Path, parent_ppl: float) -> None:
    _write(root, "perplexity/summary.parquet", pd.DataFrame({
        "quantity": ["hypothesis:H1", "gate:G1", "perplexity", "relative_change_vs_own"],
        "arm": ["pow2-ceiling", "pow2-ceiling", "parent", "pow2-nearest"],
        "value": [-0.0167, -0.0121, parent_ppl, 0.01], "low": [-0.0214, None, None, 0.0],
        "high": [-0.0122, None, None, 0.02], "level": [0.9, None, None, 0.9],
        "verdict": ["supported", "gate not triggered", None, None], "detail": ["", "", "", ""]}))
    _write(root, "tokens/pairs.parquet", pd.DataFrame({
        "regime": ["own"], "flips": [11725], "positions": [81920], "prediction": ["silent"], "score": ["FP"]}))


def test_language_dependent_findings_read_no_verdict_on_synthetic_weights(tmp_path: Path) -> None:
    _perplexity(tmp_path, 1.88e5)
    rows = summary.findings(Tables(tmp_path), PROTOCOL, emulated=False, run=SYNTHETIC)[1].frame
    verdicts = dict(zip(rows["item"], rows["verdict"]))
    assert verdicts["H1"] == "no verdict: synthetic weights (this run's outcome: supported)"
    assert verdicts["G1"] == "no verdict: synthetic weights (this run's outcome: gate not triggered)"
    assert verdicts["kernel pair, own scales"] == "no verdict: synthetic weights (this run's outcome: false positive)"
    trained = summary.findings(Tables(tmp_path), PROTOCOL, emulated=False, run=TRAINED)[1].frame
    assert dict(zip(trained["item"], trained["verdict"]))["H1"] == "supported"
    # nothing here credits a paper by position: the papers are named by arXiv id
    assert not rows["finding"].str.contains(r"\b(?:first|second)\b").any()
    assert rows["finding"].str.contains("arXiv:2609.00363").any()


def test_the_weights_row_sets_the_parents_perplexity_against_the_uniform_bound(tmp_path: Path) -> None:
    _perplexity(tmp_path, 1.88e5)
    (tmp_path / "model" / "parent").mkdir(parents=True)
    (tmp_path / "model" / "parent" / "config.json").write_text(json.dumps({"vocab_size": 151936}))
    row = summary._language_row(Tables(tmp_path), tmp_path, SYNTHETIC)
    assert row.startswith("synthetic (seeded random) weights: the bf16 parent's perplexity on this corpus is "
                          "188,000, against 151,936 for a uniform guess")
    assert "no better than a uniform guess" in row and "no verdict: synthetic weights" in row
    _perplexity(tmp_path, 23.47)
    assert summary._language_row(Tables(tmp_path), tmp_path, TRAINED).endswith(": a language model")


def _run_tables(root: Path) -> None:
    _write(root, "compare/summary.parquet", pd.DataFrame({
        "setting": ["real", "pow2-snapped", "pow2-requant"], "phase": ["prefill"] * 3, "layers": [196] * 3,
        "layers_identical": [14, 196, 196], "layers_differing": [182, 0, 0], "differing_per_million": [3.6, 0, 0],
        "max_ulp": [1, 0, 0], "prediction_held": [0, 196, 196], "prediction_failed": [0, 0, 0]}))
    _write(root, "determinism/agreement.parquet", pd.DataFrame({
        "checkpoint": ["own"] * 2 + ["pow2-nearest"] * 2, "comparison": ["arms"] * 4, "prompt": [0, 1, 0, 1],
        "identical": [False, False, True, True]}))


def test_the_answer_is_one_sentence_computed_from_the_tables(tmp_path: Path) -> None:
    _run_tables(tmp_path)
    said = summary.answer(Tables(tmp_path), PROTOCOL, SYNTHETIC, "vllm-cutlass vs vllm-triton")
    assert said == ("Answer: under the checkpoint's own scales the binaries of the two kernels (vllm-cutlass vs "
                    "vllm-triton) are not interchangeable bit for bit (182 of 196 (prefill) layers differ, max ulp 1 "
                    "(prefill and decode); 0/2 greedy sequences identical); under power-of-two scales they are (392 "
                    "of 392 layer comparisons identical; 2/2 sequences identical across arms).")


def test_the_verdict_box_lists_every_headline_claim_with_its_verdict(tmp_path: Path) -> None:
    _run_tables(tmp_path)
    box = summary.verdict_box(Tables(tmp_path), PROTOCOL, SYNTHETIC, "a vs b")
    assert isinstance(box, Box)
    headline = [c for c in PROTOCOL.paper["claims"] if c.get("headline")]
    verdict_lines = [line for line in box.lines[1:] if isinstance(line, tuple)]
    assert len(verdict_lines) == len(headline) >= 8
    kinds = dict((text.split(" [")[0], kind) for kind, text in verdict_lines)
    assert kinds["Under the checkpoint's own scales the two kernels agree on no greedy sequence"] == "reproduced"
    assert kinds["Perplexity change of pow2-nearest against own"] == "not applicable"
    assert box.lines[0][0] == "Answer:" and str(box.lines[-1]).startswith("All ")


def test_the_run_identity_has_commit_versions_and_device_but_no_time(tmp_path: Path) -> None:
    manifest = {"stage": "capture", "code": {"git": {"commit": "0" * 40, "dirty": False}},
                "recorded_at": "2026-12-05T23:00:00Z",
                "environment": {"python": "3.12.3", "libraries": {"torch": "2.11.0", "vllm": "0.26.0"},
                                "device": {"device": "NVIDIA H200", "compute_capability": "9.0", "cuda": "12.8",
                                           "driver": "570.1"}}}
    (tmp_path / "capture").mkdir()
    (tmp_path / "capture" / "manifest.json").write_text(json.dumps(manifest))
    text = summary.identity(tmp_path)
    assert "commit 000000000000 (1 stages)" in text and "torch 2.11.0, vllm 0.26.0" in text
    assert "device NVIDIA H200 (compute capability 9.0, CUDA 12.8, driver 570.1)" in text
    assert "23:00" not in text and "2026-12-05T" not in text


def test_the_setup_names_the_engine_of_each_stage() -> None:
    """Only the determinism stage's tokens can come from vLLM's engine; the others are always this
    project's own, and the setup says so whatever the run's engine."""
    assert summary._engines(SYNTHETIC).startswith("greedy generations (determinism): vLLM's engine")
    own = summary._engines(TRAINED)
    assert own.startswith("greedy generations (determinism): this project's own engine")
    for engine in (own, summary._engines(SYNTHETIC)):
        assert engine.endswith("perplexity and the layer captures: this project's own engine, not vLLM's")

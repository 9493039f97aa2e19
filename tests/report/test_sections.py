"""Report sections that quote the papers: determinism's probe sentence and prefill versus decode."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from int8alibi.protocol import load
from int8alibi.report.document import Document, Paragraph, Table
from int8alibi.report.sections import Tables, determinism, prefill_decode

CLAIMS = tuple(load(Path(__file__).resolve().parents[2] / "preregistration").paper["claims"])


def _write(root: Path, rel: str, frame: pd.DataFrame) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False)


def test_prefill_decode_sentence_sets_flips_and_first_modules_beside_the_papers_rates(tmp_path: Path) -> None:
    assert "not produced" in prefill_decode(Tables(tmp_path, CLAIMS), Document("t"))[1].text
    _write(tmp_path, "prefill_decode/prefill_decode.parquet", pd.DataFrame({
        "checkpoint": ["own", "probe"], "arm": ["a", "a"], "sequences": [2, 2], "positions": [8, 8],
        "differing_positions": [5, 0], "flips": [1, 0], "flip_rate": [0.125, 0.0], "flip_rate_low": [0.0, 0.0],
        "flip_rate_high": [0.25, 0.0], "level": [0.9, 0.9], "sequences_diverging": [2, 0]}))
    _write(tmp_path, "prefill_decode/first_divergence.parquet", pd.DataFrame({
        "checkpoint": ["own", "own", "probe", "probe"], "arm": ["a"] * 4, "sequence": [0, 1, 0, 1],
        "diverged": [True, True, False, False], "module": ["lm_head", "lm_head", None, None],
        "kind": ["head", "head", None, None]}))
    blocks = prefill_decode(Tables(tmp_path, CLAIMS), Document("t"))
    text = next(b.text for b in blocks if isinstance(b, Paragraph))
    assert "own: 1 of 8 generated positions flip top-1 (a 12.5% (90% sequence-cluster interval 0.0–25.0%))" in text
    assert "first diverging module in 2 of 2 sequences: lm_head (head) in 2" in text
    assert "probe: 0 of 8 generated positions flip top-1" in text and "at 0; no first divergence" in text
    assert "8.6% of tokens flipping under real scales and 2.9% under the probe" in text
    assert sum(isinstance(b, Table) for b in blocks) == 1  # the per-sequence table went to the appendix
    assert "First diverging module per sequence: appendix A1." in [b.text for b in blocks if isinstance(b, Paragraph)]


def test_determinism_states_the_probe_beside_the_paper(tmp_path: Path) -> None:
    _write(tmp_path, "determinism/summary.parquet", pd.DataFrame({
        "arm_a": ["a"], "arm_b": ["b"], "own": ["3/4"], "probe": ["4/4"]}))
    text = determinism(Tables(tmp_path, CLAIMS), Document("t"))[1].text
    assert text.startswith("Under the rewritten-scale probe") and "4/4 sequences are identical" in text
    assert "8/8 and 16/16 prompts" in text

"""The batch-invariance section and findings rows on hand-made tables: what is said on emulated and
real arms, a failed INT8 prediction named, the figure, the appendix tables, and the missing-stage note."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from int8alibi.batch.summary import by_m, summary
from int8alibi.report import batch
from int8alibi.report.document import Document, Figure, Paragraph, Table
from int8alibi.report.sections import Tables

PREDICTIONS = {"int8": {"identical": True}, "bf16": {"identical": None}, "fp8": {"identical": None},
               "sequence": {"identical": None}}


def _write(root: Path, rel: str, frame: pd.DataFrame) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False)


def _tables(root: Path, b_differs: int) -> None:
    rows = []
    for gemm, kind, differ in (("cublaslt", "int8", 0), ("triton", "int8", b_differs), ("bf16", "bf16", 3)):
        for m in (1, 8):
            rows.append({"checkpoint": "own", "layer": "l0", "gemm": gemm, "kind": kind, "captured_m": 8, "m": m,
                         "draws": 2, "rows": 2 * m, "rows_differing": differ if m == 1 else 0,
                         "elements_differing": differ, "max_ulp": 2 if differ else 0, "nonfinite_differing": 0})
    layers = pd.DataFrame(rows)
    seqs = pd.DataFrame([{"checkpoint": "own", "arm": "cublaslt", "batch_size": 4, "prompt": p, "identical": p != 2,
                          "module": "model.layers.0.self_attn.softmax" if p == 2 else None} for p in range(4)])
    _write(root, "batch/layers.parquet", layers)
    _write(root, "batch/by_m.parquet", by_m(layers))
    _write(root, "batch/sequences.parquet", seqs)
    _write(root, "batch/summary.parquet", summary(layers, seqs, PREDICTIONS))


def test_not_in_this_run_without_the_stage(tmp_path: Path) -> None:
    blocks = batch.section(Tables(tmp_path), Document("t"), None)
    assert blocks[1].text == "Not in this run: batch/summary.parquet was not produced."
    assert batch.finding_rows(Tables(tmp_path), [], None) == []


def test_real_arms_that_hold_and_a_sequence_that_differs(tmp_path: Path) -> None:
    _tables(tmp_path, b_differs=0)
    doc = Document("t")
    blocks = batch.section(Tables(tmp_path), doc, emulated=False)
    text = next(b.text for b in blocks if isinstance(b, Paragraph))
    assert "Neither paper varies the batch" in text
    assert "Layer level: the prediction held on every INT8 arm and checkpoint; contrasts: bf16 on own: 3 of 18 rows" \
           " differ" in text
    assert "cublaslt on own: 1 of 4 prompts differ (first differing module: model.layers.0.self_attn.softmax (1))" in text
    assert "by construction" not in text
    assert any(isinstance(b, Figure) and b.name == "batch-by-m" for b in blocks)
    assert sum(isinstance(b, Table) for b in blocks) == 1 and len(doc.appendix) == 2
    findings = batch.finding_rows(Tables(tmp_path), [], emulated=False)
    verdicts = {r["item"]: r["verdict"] for r in findings}
    assert verdicts["batch invariance, layer level: cublaslt (int8, own)"] == "held"
    assert verdicts["batch invariance, layer level: bf16 (bf16, own)"] == "no prediction"
    assert all("this project's extension" in r["pre-registered as"] for r in findings)


def test_an_int8_arm_that_is_not_invariant_fails_by_name_and_emulations_hold_by_construction(tmp_path: Path) -> None:
    _tables(tmp_path, b_differs=1)
    text = next(b.text for b in batch.section(Tables(tmp_path), Document("t"), emulated=False)
                if isinstance(b, Paragraph))
    assert "the prediction failed on triton" in text
    rows = {r["item"]: r for r in batch.finding_rows(Tables(tmp_path), [], emulated=True)}
    failed = rows["batch invariance, layer level: triton (int8, own)"]
    assert failed["verdict"] == "failed" and "1 of 18 rows differ" in failed["finding"] and "most at M=1" in \
        failed["finding"] and "up to 2 ulp" in failed["finding"]
    assert rows["batch invariance, layer level: cublaslt (int8, own)"]["verdict"] == \
        "held by construction (emulated arms)"


def test_the_findings_keep_the_extension_in_a_table_of_its_own_that_stays_on_the_main_page(tmp_path: Path) -> None:
    from int8alibi.protocol import load
    from int8alibi.report.document import MAIN_ROWS
    from int8alibi.report.summary import findings

    _tables(tmp_path, b_differs=0)
    blocks = findings(Tables(tmp_path), load(Path(__file__).resolve().parents[2] / "preregistration"), emulated=False)
    registered, extension = blocks[1], blocks[2]
    assert isinstance(registered, Table) and isinstance(extension, Table)
    assert not registered.frame["item"].str.startswith("batch invariance").any()
    assert extension.caption.startswith("This project's extension, not either paper's")
    assert len(extension.frame) == 4 <= MAIN_ROWS   # three GEMMs at layer level, one arm at sequence level
    assert extension.sources[0].path.endswith("batch/summary.parquet")

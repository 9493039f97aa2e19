"""The batch-invariance section and its findings rows: this project's extension, not either paper's.

Neither arXiv:2608.13756 nor arXiv:2609.00363 varies the batch, so nothing here is set beside a
paper's number. The registered prediction (``preregistration/batch.yaml``) is that every INT8 arm's
rows are identical at every M and in every co-batch; bf16, FP8 and the whole model carry no
prediction, only the share that differs. An outcome on emulated arms holds by construction (an
emulation computes each row on its own): only kernel binaries can test the prediction.
"""

from __future__ import annotations

import pandas as pd

from . import svg
from .. import stage_spec
from .document import Block, Document, Figure, Heading, Paragraph, Source, Table
from .sections import Tables

SUMMARY = stage_spec.table("batch", "summary")
BY_M = stage_spec.table("batch", "by_m")
LAYERS = stage_spec.table("batch", "layers")
SEQUENCES = stage_spec.table("batch", "sequences")
EXTENSION = "this project's extension (batch.yaml, amendment A-0021)"
PREDICTED = "INT8 rows identical at every M and co-batch"


def _share(value: float) -> str:
    return f"{100 * value:.3g}%"


def _outcome(row: pd.Series, emulated: bool | None) -> str:
    if row["outcome"] == "holds" and emulated and row["kind"] == "int8":
        return "held by construction (emulated arms)"
    return {"holds": "held", "fails": "failed"}.get(str(row["outcome"]), str(row["outcome"]))


def finding_rows(t: Tables, sources: list[Source], emulated: bool | None) -> list[dict[str, str]]:
    """Findings rows (item, pre-registered as, verdict, finding) from the stage's summary, if it ran."""
    got = t.get(SUMMARY)
    if got is None:
        return []
    table, src = got
    sources.append(src)
    rows = []
    for level, part in table.groupby("level", sort=False):
        for r in part.itertuples(index=False):
            row = pd.Series(r._asdict())
            what = f"{r.differing:,} of {r.compared:,} {r.unit} differ ({_share(r.share)})"
            if level == "layer":
                where = "" if pd.isna(r.worst_m) else f"; most at M={int(r.worst_m)}"
                ulp = "" if pd.isna(r.max_ulp) or not r.differing else f", up to {int(r.max_ulp)} ulp"
                item = f"batch invariance, layer level: {r.gemm} ({r.kind}, {r.checkpoint})"
                kind = f"structural: {PREDICTED}" if r.kind == "int8" else "measure (no prediction)"
                finding = (f"Each captured row inside seeded batches of every M against its row at the captured M: "
                           f"{what}{ulp}{where}.")
            else:
                item = f"batch invariance, sequence level: {r.gemm} ({r.checkpoint})"
                kind = "measure (no prediction)"
                modules = "" if pd.isna(r.first_modules) else f"; first differing module: {r.first_modules}"
                finding = f"Greedy generation alone against inside left-padded batches: {what}{modules}."
            rows.append({"item": item, "pre-registered as": f"{kind}; {EXTENSION}", "verdict": _outcome(row, emulated),
                         "finding": finding})
    return rows


def _figure(by_m: pd.DataFrame, src: Source) -> Figure:
    series = {f"{r_kind}: {gemm} ({checkpoint})": [(float(r.m), float(r.share), float(r.share), float(r.share))
                                                  for r in part.sort_values("m").itertuples()]
              for (checkpoint, gemm, r_kind), part in by_m.groupby(["checkpoint", "gemm", "kind"], sort=True)}
    note = ("Share of rows whose output differs in any bit from the same row at the captured M; INT8 arms are "
            "predicted at zero everywhere.")
    return Figure("batch-by-m", "Batch invariance: share of rows that differ, by batch size M and GEMM",
                  svg.line_chart("Rows differing from the captured-M output, by M", series,
                                 x_label="batch size M (log2)", y_label="share of rows differing", note=note),
                  (src,))


def section(t: Tables, doc: Document, emulated: bool | None) -> list[Block]:
    """The section: what was varied, the outcome per GEMM and level, the figure, per-row tables in the appendix."""
    blocks: list[Block] = [Heading("Batch invariance (this project's extension)")]
    got = t.get(SUMMARY)
    if got is None:
        return blocks + [Paragraph(f"Not in this run: {SUMMARY} was not produced.")]
    table, src = got
    layer = table[table["level"] == "layer"]
    seq = table[table["level"] == "sequence"]
    int8 = layer[layer["kind"] == "int8"]
    failed = int8[int8["outcome"] == "fails"]
    verdict = ("held on every INT8 arm and checkpoint" if failed.empty and not int8.empty else
               f"failed on {', '.join(sorted(set(failed['gemm'])))}" if not failed.empty else "not tested")
    text = (f"Neither paper varies the batch. With per-token activation scales, an exact int32 sum and an element-wise "
            f"epilogue, every output row of an INT8 W8A8 GEMM depends on its own input row only, so the registered "
            f"prediction is that each INT8 arm gives every row the same bits at every batch size M and among any other "
            f"rows; bf16 and FP8 GEMMs (float accumulators) and the whole model (attention, norms and padding change "
            f"with the batch) carry no prediction. Layer level: the prediction {verdict}")
    if emulated and failed.empty and not int8.empty:
        text += " (the arms are exact emulations, which compute each row on its own by construction: only kernel " \
                "binaries can test it)"
    contrasts = layer[layer["kind"] != "int8"]
    if not contrasts.empty:
        text += "; contrasts: " + "; ".join(f"{r.gemm} on {r.checkpoint}: {r.differing:,} of {r.compared:,} rows differ"
                                            for r in contrasts.itertuples())
    if not seq.empty:
        diff = seq[seq["differing"] > 0]
        text += (". Sequence level (this project's own engine, greedy, left padding): "
                 + ("every prompt generated the same logits, bit for bit, alone and inside every batch"
                    if diff.empty else
                    "; ".join(f"{r.gemm} on {r.checkpoint}: {r.differing} of {r.compared} prompts differ"
                              + ("" if pd.isna(r.first_modules) else f" (first differing module: {r.first_modules})")
                              for r in diff.itertuples())))
    blocks.append(Paragraph(text + "."))
    shown = ["level", "checkpoint", "gemm", "kind", "unit", "compared", "differing", "share", "max_ulp", "worst_m",
             "outcome"]
    blocks.append(Table("Batch invariance per level, checkpoint and GEMM or arm, against the registered prediction",
                        table[shown], (src,)))
    by_m = t.get(BY_M)
    if by_m is not None and not by_m[0].empty:
        blocks.append(_figure(by_m[0], by_m[1]))
    for rel, caption in ((LAYERS, "Batch invariance per captured layer, GEMM and M"),
                         (SEQUENCES, "Batch invariance per prompt, batch size and arm: first differing step and module")):
        got_rows = t.get(rel)
        if got_rows is not None:
            ref = doc.add_appendix(caption, got_rows[0], (got_rows[1],))
            blocks.append(Paragraph(f"{caption}: appendix {ref}."))
    return blocks

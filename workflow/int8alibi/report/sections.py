"""The report's sections. Each reads its Parquet tables and returns blocks; nothing is typed in.

A section shows what a reader needs on the main page (summaries, charts, tables of at most
``MAIN_ROWS`` rows) and puts its per-row tables (per layer, per cell, per bin) in the appendix, each
with its source. Jargon is explained where it is first used and again in the glossary. A table that
a run did not produce (e.g. the optional tokens stage) gives a one-line note saying so, never an
empty table that could be read as "nothing found".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.scoring import UNOBSERVABLE
from ..model.layers import PROJECTIONS
from ..files.hashing import sha256_file
from ..files.parquet import read_table
from ..tokens.margin import fit_windows
from . import svg
from .. import stage_spec
from .document import Block, Definitions, Document, Figure, Heading, Paragraph, Source, Table
from .measures import DIVISION_COLUMNS, division_summary

IA, PT = "arXiv:2608.13756", "arXiv:2609.00363"   # the two papers, [IA] and [PT]


@dataclass(frozen=True)
class Tables:
    """Reads result tables under one results folder and names each one's source."""

    results: Path
    claims: tuple[dict, ...] = ()   # paper.yaml's claims, for sections that quote a paper's value
    # each table read and hashed once while its file stays the same: the claims alone ask for the same
    # few tables ~90 times (pandas' copy-on-write keeps a caller's column edits out of the shared frame)
    _read: dict[tuple[str, int, int], tuple[pd.DataFrame, Source]] = field(default_factory=dict, compare=False,
                                                                           repr=False)

    def claim(self, claim_id: str) -> dict | None:
        return next((c for c in self.claims if c["id"] == claim_id), None)

    def get(self, rel: str) -> tuple[pd.DataFrame, Source] | None:
        path = self.results / rel
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        key = (rel, st.st_mtime_ns, st.st_size)
        if key not in self._read:
            self._read[key] = read_table(path), Source(f"{self.results.name}/{rel}", sha256_file(path))
        return self._read[key]


def _missing(rel: str) -> Paragraph:
    return Paragraph(f"Not in this run: {rel} was not produced.")


def run_facts(t: Tables, doc: Document) -> list[Block]:
    blocks: list[Block] = [Heading("Protocol in force")]
    got = t.get(stage_spec.table("protocol", "pins"))
    if got is None:
        return blocks + [_missing(stage_spec.table("protocol", "pins"))]
    pins, src = got
    ref = doc.add_appendix("Pinned protocol files and data", pins, (src,))
    return blocks + [Paragraph(f"{len(pins)} protocol files and data artifacts are pinned (each with its SHA-256: "
                               f"appendix {ref}); every stage checked them before it ran.")]


def requant(t: Tables, doc: Document) -> list[Block]:
    blocks: list[Block] = [Heading("Requantization gate")]
    got = t.get(stage_spec.table("requant", "gate"))
    if got is None:
        return blocks + [_missing(stage_spec.table("requant", "gate"))]
    gate, src = got
    # One verdict for the run (the own arm against the reference, stated below the table); per arm the
    # table shows how each checkpoint's bytes stand against that reference.
    summary = gate.groupby("arm", sort=True).agg(
        layers=("layer", "size"),
        # null = not applicable (a self-built checkpoint has nothing independent to equal)
        bytes_equal=("bytes_equal", lambda s: None if s.isna().all() else int(s.fillna(False).sum())),
        differing_int8=("differing_int8", lambda s: int(s.fillna(0).sum())),
        all_pow2=("all_pow2", "all"),
        scale_min=("scale_min", "min"),
        scale_max=("scale_max", "max"),
        clipped=("clipped", lambda s: int(s.fillna(0).sum())),
        saturated=("saturated", "sum"),
    ).reset_index()
    blocks.append(Table("Per arm: layers byte-equal to the gate's reference, clipping and saturation", summary, (src,),
                        labels=(("clipped", "clipped weights"), ("saturated", "saturated weights"))))
    blocks.append(_gate_reference(gate))
    blocks += _division(t, gate, src)
    return blocks


def _gate_reference(gate: pd.DataFrame) -> Paragraph:
    """Which checkpoint the own arm was compared with, and which tool and versions made it."""
    own = gate[gate["arm"] == "own"]
    references, verdicts = sorted(set(own["reference"])), sorted(set(own["gate"]))
    if own["bytes_equal"].isna().all():
        return Paragraph(f"Reference: none. The gate is {verdicts[0] if verdicts else 'absent'}: the own checkpoint "
                         "was built here and compared with nothing independent.")
    equal = int(own["bytes_equal"].fillna(False).sum())
    return Paragraph(f"Reference: {'; '.join(references)}. Gate: {'; '.join(verdicts)} ({equal} of {len(own)} "
                     "layers byte-equal in every int8 weight and every scale).")


def _division(t: Tables, gate: pd.DataFrame, src: Source) -> list[Block]:
    """The float32-versus-bf16 division statistics of the own arm, beside the paper's values."""
    d = division_summary(gate) if all(c in gate.columns for c in DIVISION_COLUMNS) else None
    if d is None:
        return [Paragraph("Division statistics: not in this run (requant/gate.parquet was written before they "
                          "existed, or has no own rows; rerun requant).")]

    def paper(claim_id: str, unit: str) -> str:
        claim = t.claim(claim_id)
        return "not registered" if claim is None else f"{claim['value']}{unit} ({claim['model']})"

    rows = [
        {"quantity": "int8 weights that differ when W / s_w is divided in float32 instead of bf16",
         "this_run": f"{d.share_percent:.2f}% ({d.differing:,} of {d.weights:,})",
         "paper": paper("division-f32-differing", "%")},
        {"quantity": "largest |int8 - clamp(q_f32, -128, 127)|: the stored weight's distance from the float32 quotient",
         "this_run": f"{d.code_offset_max:.3f}", "paper": paper("division-bf16-shift", "")},
        {"quantity": "largest |q_bf16 - q_f32|: the bf16 rounding of the quotient alone",
         "this_run": f"{d.quotient_shift_max:.3f}", "paper": "not reported"},
    ]
    return [Table("Division statistics over every own layer (per layer: requant/gate.parquet); the pinned "
                  "division is bf16, float32 the alternative; same bf16 scales under both", pd.DataFrame(rows),
                  (src,))]


COMPARE_COLUMNS = ["setting", "phase", "layers", "layers_identical", "layers_differing", "differing_per_million",
                   "max_ulp", "prediction_held", "prediction_failed"]
LAYER_ERROR_COLUMNS = ["differing_near_zero", "differing_non_near_zero", "max_normalized_error"]


def agreement(t: Tables, doc: Document) -> list[Block]:
    blocks: list[Block] = [Heading("Per-layer agreement between the two arms")]
    got = t.get(stage_spec.table("compare", "summary"))
    if got is None:
        return blocks + [_missing(stage_spec.table("compare", "summary"))]
    summary, src = got
    columns = COMPARE_COLUMNS + [c for c in LAYER_ERROR_COLUMNS if c in summary.columns]
    blocks.append(Table("Layers identical / differing, differing elements per million, max ulp and the pinned pow2 "
                        "predictions, per setting and phase", summary[columns], (src,)))
    layers = t.get(stage_spec.table("compare", "layers"))
    if layers is not None:
        df, lsrc = layers
        failed = df[df["prediction_held"] == "no"]
        text = (f"Pinned pow2 predictions that failed: {len(failed)} of "
                f"{int((df['prediction_held'] != 'n.a.').sum())} layer comparisons that carry one.")
        shown = [c for c in ("setting", "phase", "layer", "k", "n", "differing", "max_finite_ulp", "reference_rms",
                             "max_normalized_error", "rms_normalized_error", "near_zero_elements",
                             "differing_near_zero", "prediction_held") if c in df.columns]
        ref = doc.add_appendix("Every layer comparison: differing elements, max ulp, float64 errors normalized by the "
                               "reference RMS, near-zero split", df[shown], (lsrc,))
        blocks.append(Paragraph(f"{text} Every layer comparison: appendix {ref}."))
        blocks.append(layer_figure(df, lsrc))
    pred = t.get(stage_spec.table("prediction", "predictions"))
    if pred is not None:
        df, psrc = pred
        own = df[(df["phase"] == "prefill")].sort_values(["block", "proj"])
        if len(df):
            blocks.append(Paragraph(
                f"Smallest headroom below 2^24 over every captured layer: {float(df['headroom_bits'].min()):.2f} "
                f"bits; largest |accumulator|: {int(df['max_abs_acc'].max()):,} "
                f"({int(len(df)):,} layer captures; {psrc.line()})."))
        if len(own):
            per_block = own.groupby("block")["headroom_bits"].min()
            finite = per_block.replace([np.inf, -np.inf], np.nan)
            blocks.append(Figure(
                "headroom", "Smallest headroom below 2^24 per block (bits, prefill)",
                svg.column_chart("Headroom below 2^24, min over the block's layers", [str(b) for b in per_block.index],
                                 [float(v) if math.isfinite(v) else 0.0 for v in finite.fillna(0.0)],
                                 x_label="transformer block", y_label="headroom (bits)", width=svg.HALF_WIDTH),
                (psrc,)))
    return blocks


SETTING_ORDER = ("real", "pow2-snapped", "pow2-requant")
PHASE_ORDER = ("prefill", "decode")


def execution_order(layers: pd.DataFrame) -> pd.DataFrame:
    """Each captured layer's position in execution order (block, then projection as the model runs
    them), one row per layer name: columns layer, block, position."""
    rank = layers["proj"].map({p: i for i, p in enumerate(PROJECTIONS)}).fillna(len(PROJECTIONS))
    keys = (layers.assign(rank=rank)[["block", "rank", "layer"]].drop_duplicates("layer")
            .sort_values(["block", "rank", "layer"], kind="stable").reset_index(drop=True))
    return keys.assign(position=np.arange(len(keys)))[["layer", "block", "position"]]


def _strip_note(part: pd.DataFrame) -> str:
    """A strip's one-line summary, printed beside it: how many layers differ, by how much."""
    differing = int((part["differing"] > 0).sum())
    ulp = part["max_finite_ulp"].max()
    return (f"{differing} of {len(part)} layers differ, {int(part['differing'].sum()):,} elements"
            + ("" if pd.isna(ulp) or differing == 0 else f", max {int(ulp)} ulp"))


def strips(layers: pd.DataFrame) -> list[tuple[str, str, list[svg.LayerMark]]]:
    """One strip per (setting, phase): real scales first, then the power-of-two settings."""
    order = execution_order(layers)
    df = layers.merge(order[["layer", "position"]], on="layer").sort_values("position", kind="stable")
    settings = [x for x in SETTING_ORDER if x in set(df["setting"])] + sorted(set(df["setting"]) - set(SETTING_ORDER))
    phases = [x for x in PHASE_ORDER if x in set(df["phase"])] + sorted(set(df["phase"]) - set(PHASE_ORDER))
    out = []
    for setting in settings:
        for phase in phases:
            part = df[(df["setting"] == setting) & (df["phase"] == phase)]
            if len(part):
                ulps = part["max_finite_ulp"].astype("Float64")
                marks = [svg.LayerMark(int(p), str(n), int(d), None if pd.isna(u) else int(u))
                         for p, n, d, u in zip(part["position"], part["layer"], part["differing"], ulps)]
                out.append((f"{setting}, {phase}", _strip_note(part), marks))
    return out


def layer_figure(layers: pd.DataFrame, src: Source) -> Figure:
    """Per captured layer: how many output elements differ between the two arms, under real and
    under power-of-two scales, and the largest ulp difference (the colour)."""
    order = execution_order(layers)
    blocks = order.groupby("block", sort=True)["position"].min()
    chart = svg.layer_strips("Differing output elements per captured layer, arm A vs arm B", strips(layers),
                             len(order), [(int(p), str(b)) for b, p in blocks.items()],
                             x_label="transformer block (its projections in execution order: "
                                     + ", ".join(p.removesuffix("_proj") for p in PROJECTIONS) + ")",
                             y_label="differing elements (log)")
    return Figure("layers", "Differing output elements per captured layer between the two arms (log scale; a grey "
                            "tick: bitwise identical), in execution order, under the checkpoint's real scales and "
                            "under power-of-two scales (snapped, requantized); colour: the layer's max ulp", chart,
                  (src,))


def _definition_caption(name: str) -> str:
    return {"stated": "stated rule (analysis.yaml)", "paper": "paper-figure definition (paper.yaml)"}.get(name, name)


DECISION_COLUMNS = ["rule", "definition", "faults", "counted_cells", "caught_cells", "caught_by", "triggered"]


def detection_beside(detection: pd.DataFrame) -> pd.DataFrame:
    """Detection by fault with the two definitions side by side (counted and detected cells each)."""
    key = ["fault", "regime"]
    frames = []
    for definition in ("stated", "paper"):
        part = detection[detection["definition"] == definition].set_index(key)
        frames.append(part[["observable", "detected"]].rename(columns={
            "observable": f"counted_{definition}", "detected": f"detected_{definition}"}))
    first = detection[detection["definition"] == "stated"].set_index(key)
    out = first[["cells"]].join(frames, how="outer").join(first[["detected_by"]])
    return out.reset_index()


UNOBSERVABLE_NOTE = (f"{UNOBSERVABLE}: the fault (or the kernel pair) changed no output element, so no "
                      "output comparison can see it; it enters neither denominator (TP + FN, FP + TN) and is counted "
                      "apart")
DEFINITIONS_NOTE = (
    "Two scoring definitions are reported side by side. stated: the rule registered in analysis.yaml (check 6 read "
    "only where some scale is not a power of two; a cell counts only when its fault changed an output element). "
    f"paper: the reading that reproduces the figures of {PT} (paper.yaml; check 6 read in both regimes; a cell also "
    "counts when its fault changed the operands an arm received). Each scores two prediction matrices: corrected "
    f"(77 cells, {PT} §III-E) and an earlier form, original under stated (the registered 63-cell matrix) or reverted "
    "under paper (the corrected matrix with exactly its three post-data corrections, the starred cells, undone: what "
    f"the paper's figures call original). Score {UNOBSERVABLE_NOTE}.")


def ulp_buckets(max_ulp: pd.Series) -> pd.Series:
    """Each cell's max-ulp bucket (``svg.ULP_BUCKETS``); a null max ulp (no finite pair) is non-finite."""
    bins = [-np.inf, 0, 1, 15, 255, 4095, np.inf]
    cut = pd.cut(max_ulp.astype("Float64").astype(float), bins=bins, labels=svg.ULP_BUCKETS[:-1])
    return cut.astype(object).where(cut.notna(), svg.ULP_BUCKETS[-1])


def ulp_ranges(ulp: pd.DataFrame, faults_: list[str]) -> list[str]:
    """Per fault: the range of its cells' max ulp ("0–34,463"; "no finite pair" when none has one)."""
    finite = ulp.dropna(subset=["max_ulp"]).groupby("fault")["max_ulp"].agg(["min", "max"]).reindex(faults_)
    ranges = finite["min"].map("{:,.0f}".format) + "–" + finite["max"].map("{:,.0f}".format)
    return ranges.where(finite["min"].notna(), "no finite pair").tolist()


def faults(t: Tables, doc: Document) -> list[Block]:
    blocks: list[Block] = [Heading("Fault campaign (checks 1–6, layer level)")]
    got = t.get(stage_spec.table("faults", "detection"))
    if got is None:
        return blocks + [_missing(stage_spec.table("faults", "detection"))]
    detection, dsrc = got
    blocks.append(Paragraph(DEFINITIONS_NOTE))
    tot = t.get(stage_spec.table("faults", "totals"))
    if tot is not None:
        df, tsrc = tot
        both = df[df["matrix"] == "both"].pivot(index="definition", columns="quantity", values="value")
        blocks.append(Table("Totals per definition: cells, counted cells, counted epilogue cells no check caught, "
                            "and cells whose score changes between the definition's two matrices",
                            both.reset_index().sort_values("definition", ascending=False), (tsrc,)))
        per = df[df["matrix"] != "both"].pivot(index=["definition", "matrix"], columns="quantity", values="value")
        blocks.append(Table("TP / FN / FP / TN summed over the checks, per definition and matrix",
                            per.reset_index()[["definition", "matrix", "tp", "fn", "fp", "tn"]]
                            .sort_values(["definition", "matrix"], ascending=[False, True]), (tsrc,)))
    dec = t.get(stage_spec.table("faults", "decisions"))
    if dec is not None:
        df, decsrc = dec
        blocks.append(Table("Decision rule D1 as registered (strict reading: any check, any regime); the real-scale "
                            "reading is in the findings", df[[c for c in DECISION_COLUMNS if c in df.columns]],
                            (decsrc,)))
    if {"stated", "paper"} <= set(detection["definition"]):
        blocks.append(Table("Detection by fault (F4 split by regime): counted and detected cells under the stated rule "
                            "and under the paper-figure definition; detected by: the checks that fired (stated rule)",
                            detection_beside(detection), (dsrc,),
                            labels=(("counted_stated", "counted (stated)"), ("detected_stated", "detected (stated)"),
                                    ("counted_paper", "counted (paper)"), ("detected_paper", "detected (paper)"))))
    else:
        for definition in sorted(detection["definition"].unique(), reverse=True):
            part = detection[detection["definition"] == definition].drop(columns="definition")
            blocks.append(Table(f"Detection by fault (F4 split by regime), {_definition_caption(definition)}", part,
                                (dsrc,)))
    refs = []
    score = t.get(stage_spec.table("faults", "scorecard"))
    if score is not None:
        df, ssrc = score
        refs.append(doc.add_appendix("Scorecard per definition, matrix and check", df, (ssrc,)))
    fl = t.get(stage_spec.table("faults", "flips"))
    if fl is not None:
        df, fsrc = fl
        refs.append(doc.add_appendix("Predictions that differ between a definition's two matrices: cell rows and how "
                                     "many change score", df, (fsrc,)))
    if refs:
        blocks.append(Paragraph(f"Scorecards per check and the predictions the two matrices disagree on: appendix "
                                f"{', '.join(refs)}."))
    ulp = t.get(stage_spec.table("faults", "ulp"))
    if ulp is not None:
        df, usrc = ulp
        pivot = df.assign(bucket=ulp_buckets(df["max_ulp"])).pivot_table(
            index="fault", columns="bucket", values="cells", aggfunc="sum", fill_value=0, observed=True)
        series = {b: [int(v) for v in pivot[b]] for b in svg.ULP_BUCKETS if b in pivot}
        blocks.append(Figure("ulp", "Cells by max ulp between the arms, per fault, with the range of its cells' max "
                                    "ulp at the bar's end (buckets grow by powers of 16; a bucket of a "
                                    "few cells is drawn at least 2 px wide, its count in the tooltip)",
                             svg.stacked_bars("Cells by max ulp (arm A vs arm B)", list(pivot.index), series,
                                              x_label="cells (count)", y_label="fault", colours=svg.ULP_COLOURS,
                                              ends=ulp_ranges(df, list(pivot.index)), width=svg.HALF_WIDTH),
                             (usrc,)))
    cells = t.get(stage_spec.table("faults", "cells"))
    if cells is not None:
        df, csrc = cells
        scored = df[df["observable"] & df["applicable"]]
        rate = scored.assign(fired=scored["fired"].astype(float)).pivot_table(
            index="fault", columns="check", values="fired", aggfunc="mean")
        faults_ = sorted(df["fault"].unique())
        checks = [c for c in sorted(df["check"].unique()) if c != 7]
        grid = [[None if (f not in rate.index or c not in rate.columns or math.isnan(rate.loc[f, c]))
                 else float(rate.loc[f, c]) for c in checks] for f in faults_]
        blocks.append(Figure("detection", "Share of observable, applicable cells where the check fired (check 7 is "
                                          "model level: see the token-level section)",
                             svg.heat_map("Detection heat map (fault × check)", faults_, [str(c) for c in checks], grid,
                                          x_label="check", y_label="fault", scale_label="share fired",
                                          width=svg.HALF_WIDTH),
                             (csrc,)))
    return blocks


def determinism(t: Tables, doc: Document) -> list[Block]:
    blocks: list[Block] = [Heading("End-to-end determinism (greedy generation)")]
    got = t.get(stage_spec.table("determinism", "summary"))
    if got is None:
        return blocks + [_missing(stage_spec.table("determinism", "summary"))]
    summary, src = got
    if "probe" in summary.columns:
        c = t.claim("probe-arms-agree")
        blocks.append(Paragraph(
            f"Under the rewritten-scale probe (snapped scales, the own int8 weights kept) {summary['probe'].iloc[0]} "
            "sequences are identical across the two arms" + ("." if c is None else
                                                             f"; {IA}: {c['statement']} ({c['size']}).")))
    blocks.append(Table("Identical sequences across arms, per checkpoint; self-consistency",
                        summary.drop(columns=[c for c in ("identity",) if c in summary.columns]), (src,)))
    if "identity" in summary.columns:
        blocks.append(Paragraph(f"Identity contract: {summary['identity'].iloc[0]}."))
    kernels = t.get(stage_spec.table("determinism", "kernels"))
    if kernels is not None:
        df, ksrc = kernels
        per_arm = (df.groupby(["arm", "engine", "kernel", "selection_environment", "emulation"], sort=True)
                   .size().rename("artifacts").reset_index())
        engines = ", ".join(sorted(set(df["engine"])))
        blocks.append(Paragraph(
            f"Generated by {engines}; each artifact's identity names the kernel that ran"
            + (" (vLLM's own selection log, checked against the requested class)" if df["engine"].str.startswith(
                "vllm").any() else "") + ":"))
        blocks.append(Table("Engine and kernel per arm (every checkpoint and run)", per_arm, (ksrc,)))
    agree = t.get(stage_spec.table("determinism", "agreement"))
    if agree is not None:
        df, asrc = agree
        blocks.append(Table("Identical sequences of all prompts per checkpoint: across the arms, and each arm's run "
                            "against its own rerun; the earliest diverging token in any comparison",
                            agreement_wide(df), (asrc,)))
    return blocks


def agreement_wide(agreement: pd.DataFrame) -> pd.DataFrame:
    """One row per checkpoint: "identical/prompts" per comparison, and the earliest divergence."""
    counts = agreement.groupby(["checkpoint", "comparison"], sort=True).agg(
        prompts=("prompt", "size"), identical=("identical", "sum"))
    cells = (counts["identical"].astype(str) + "/" + counts["prompts"].astype(str)).unstack("comparison")
    earliest = agreement.groupby("checkpoint", sort=True)["first_divergence"].min().rename("earliest_divergence")
    return cells.join(earliest).reset_index().rename_axis(columns=None)


def _paper_rate(t: Tables, claim_id: str) -> str:
    c = t.claim(claim_id)
    return "not registered" if c is None else f"{c['value']}%"


def prefill_decode(t: Tables, doc: Document) -> list[Block]:
    blocks: list[Block] = [Heading("Prefill versus decode on one arm")]
    got = t.get(stage_spec.table("prefill_decode", "prefill_decode"))
    if got is None:
        return blocks + [_missing(stage_spec.table("prefill_decode", "prefill_decode"))]
    table, src = got
    seqs = t.get(stage_spec.table("prefill_decode", "first_divergence"))
    sentences = []
    for c in table["checkpoint"].unique():
        part = table[table["checkpoint"] == c]
        flips, positions, differ = int(part["flips"].sum()), int(part["positions"].sum()), int(
            part["differing_positions"].sum())
        text = f"{c}: {flips:,} of {positions:,} flip, the logits differ at {differ:,}"
        if seqs is not None:
            div = seqs[0][(seqs[0]["checkpoint"] == c) & seqs[0]["diverged"]]
            modules = div.groupby(["module", "kind"]).size().sort_values(ascending=False)
            text += (", no first divergence" if div.empty else
                     f", first diverging module in {len(div)} of {int(part['sequences'].sum())} sequences: "
                     + ", ".join(f"{m} ({k}) in {n}" for (m, k), n in modules.items()))
        sentences.append(text)
    blocks.append(Paragraph(
        "Each sequence is decoded greedily with the KV cache and replayed as one prefill on the same arm, in this "
        "project's own engine (not vLLM's, whatever engine generated the determinism stage's tokens); a flip is a "
        "generated position whose top-1 token differs. Per checkpoint, generated positions that flip and positions "
        "whose bf16 logits differ in some bit (per arm, with intervals: the table below): " + "; ".join(sentences)
        + f". {IA} reports "
        f"{_paper_rate(t, 'prefill-decode-flips-real')} of tokens flipping under real scales and "
        f"{_paper_rate(t, 'prefill-decode-flips-probe')} under the probe, not attributed to a module, in vLLM's engine; here the "
        "first differing intermediate of this project's engine is named (every module traced at the first position "
        "whose logits differ), which says where this engine's prefill and decode part, not where vLLM's do."))
    shown = [c for c in ("checkpoint", "arm", "sequences", "positions", "differing_positions", "flips", "flip_rate",
                         "flip_rate_low", "flip_rate_high") if c in table.columns]
    blocks.append(Table("Prefill versus decode per checkpoint and arm: flips with a sequence-cluster interval",
                        table[shown], (src,)))
    if seqs is not None:
        ref = doc.add_appendix("First diverging module per sequence (execution order; empty where nothing differs)",
                               seqs[0], (seqs[1],))
        blocks.append(Paragraph(f"First diverging module per sequence: appendix {ref}."))
    return blocks


def _percent(value: Any, digits: int = 2) -> str:
    if value is None or pd.isna(value):
        return "—"
    return f"{100 * float(value):+.{digits}f}%"


def perplexity_display(summary: pd.DataFrame) -> pd.DataFrame:
    """The perplexity summary for people: changes and shares as percents, the interval as one cell."""
    rows = []
    for r in summary.itertuples():
        ratio = str(r.quantity).startswith(("relative_change", "hypothesis", "gate", "mismatch", "constraint"))
        value = _percent(r.value) if ratio else ("—" if pd.isna(r.value) else f"{float(r.value):.4g}")
        interval = ("—" if pd.isna(r.low) or pd.isna(r.high) else
                    f"[{_percent(r.low)}, {_percent(r.high)}]" if ratio else f"[{float(r.low):.4g}, {float(r.high):.4g}]")
        rows.append({"quantity": r.quantity, "arm": r.arm, "value": value, "interval": interval,
                     "verdict": "—" if r.verdict is None or pd.isna(r.verdict) else str(r.verdict)})
    return pd.DataFrame(rows)


PER_ARM = ("perplexity", "relative_change_vs_own")


def perplexity_per_arm(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per arm: its perplexity beside its relative change vs own and that change's interval."""
    shown = perplexity_display(summary)
    quantity = summary["quantity"].to_numpy()
    ppl = shown[quantity == "perplexity"].set_index("arm")["value"].rename("perplexity")
    change = (shown[quantity == "relative_change_vs_own"].set_index("arm")[["value", "interval"]]
              .rename(columns={"value": "change_vs_own"}))
    return ppl.to_frame().join(change, how="outer").fillna("—").reset_index()


def perplexity(t: Tables, doc: Document) -> list[Block]:
    blocks: list[Block] = [Heading("Perplexity cost of power-of-two scales")]
    got = t.get(stage_spec.table("perplexity", "summary"))
    if got is None:
        return blocks + [_missing(stage_spec.table("perplexity", "summary"))]
    summary, src = got
    blocks.append(Table("Perplexity per arm and its relative change vs own in percent (90% paired bootstrap "
                        "interval)", perplexity_per_arm(summary), (src,)))
    rest = summary[~summary["quantity"].isin(PER_ARM)]
    if len(rest):
        blocks.append(Table("H1, G1 and the decomposition of the probe's cost (mismatch: its int8 weights were quantized "
                            "for other scales; constraint: what power-of-two scales cost by themselves)",
                            perplexity_display(rest.reset_index(drop=True)), (src,)))
    change = summary[(summary["quantity"] == "relative_change_vs_own") & summary["low"].notna()
                     & summary["high"].notna()]
    # One panel per scale: the probe's cost (weight-scale mismatch) is orders of magnitude above the
    # power-of-two arms', which a shared axis would flatten to a point.
    for name, part in (("perplexity", change[change["arm"] != "probe"]), ("perplexity-probe",
                                                                         change[change["arm"] == "probe"])):
        if len(part):
            labels = [str(arm) for arm in part["arm"]]
            blocks.append(Figure(name, "Relative change vs own in percent: point estimates with their 90% paired "
                                       "bootstrap intervals" + (" (the probe, on its own axis)" if name.endswith("probe")
                                                                else ""),
                                 svg.interval_plot("Relative perplexity change vs own (%)", labels,
                                                   (100 * part["value"].astype(float)).tolist(),
                                                   (100 * part["low"].astype(float)).tolist(),
                                                   (100 * part["high"].astype(float)).tolist(), unit="%",
                                                   x_label="relative perplexity change vs own (%)", y_label="arm",
                                                   width=svg.HALF_WIDTH),
                                 (src,)))
    return blocks


PAIRS_COLUMNS = ["regime", "arm_a", "arm_b", "windows", "positions", "differing_positions", "flips", "flip_rate",
                 "flip_rate_low", "flip_rate_high", "confident_flips", "prediction", "score"]
CHECK7_COLUMNS = ["fault", "severity", "regime", "positions", "changed_positions", "flips", "confident_flips",
                  "fraction", "fired", "prediction", "predicted_miss", "score"]


KERNEL_PAIR = "kernels"   # the tokens stage's comparison label of the selected kernel pair
ROC_GRID = 1 / 600        # ROC points closer than this (half a pixel of the plot) are drawn as one


PREDICTOR_ROWS = {"auc": "ROC-AUC (a small margin predicts a flip)", "average_precision": "average precision",
                  "brier_map": "held-out Brier, binned map", "brier_isotonic": "held-out Brier, isotonic map",
                  "brier_baseline": "held-out Brier, constant baseline"}


def _counts(rows: pd.DataFrame) -> pd.Series:
    """"positions / flips" per regime."""
    per = rows.set_index("regime")
    return per["positions"].map("{:,}".format) + " / " + per["flips"].map("{:,}".format)


def predictor_summary(predictor: pd.DataFrame) -> pd.DataFrame:
    """The kernel pair's whole-comparison predictor quantities: one row per quantity, one column per
    regime ("value [low, high]"), and the positions / flips each rests on (details: the appendix)."""
    part = predictor[(predictor["comparison"] == KERNEL_PAIR) & (predictor["bin"] == 0)
                     & predictor["quantity"].isin(list(PREDICTOR_ROWS))]
    interval = (" [" + part["low"].map("{:.4g}".format) + ", " + part["high"].map("{:.4g}".format) + "]")
    cell = (part["value"].map("{:.4g}".format) + interval.where(part["low"].notna() & part["high"].notna(), "")
            ).where(part["value"].notna(), "—")
    wide = part.assign(cell=cell).pivot(index="quantity", columns="regime", values="cell")
    wide = wide.reindex([q for q in PREDICTOR_ROWS if q in wide.index]).rename(index=PREDICTOR_ROWS)
    quantity = part["quantity"]
    wide.loc["positions / flips (AUC, precision)"] = _counts(part[quantity == "auc"])
    wide.loc["held-out positions / flips (Brier)"] = _counts(part[quantity == "brier_map"])
    return wide.fillna("—").rename_axis(index="quantity", columns=None).reset_index()


def roc_points(positions: pd.DataFrame) -> pd.DataFrame:
    """The ROC of "a smaller reference margin means a flip" (columns fpr, tpr) from (0, 0), one
    point per distinct margin in ascending order: tied positions enter together, so the area under
    the curve is the tokens stage's AUC (ties counted half). Needs a flip and a non-flip."""
    per = positions.groupby("margin", sort=True)["flip"].agg(flips="sum", positions="size")
    tp, fp = per["flips"].cumsum(), (per["positions"] - per["flips"]).cumsum()
    curve = pd.DataFrame({"fpr": fp / fp.iloc[-1], "tpr": tp / tp.iloc[-1]})
    return pd.concat([pd.DataFrame({"fpr": [0.0], "tpr": [0.0]}), curve], ignore_index=True)


def roc_area(curve: pd.DataFrame) -> float:
    """The trapezoid area under an ROC curve."""
    return float((curve["fpr"].diff() * (curve["tpr"] + curve["tpr"].shift()) / 2).sum())


def thinned(curve: pd.DataFrame) -> pd.DataFrame:
    """The curve's points with those closer than ``ROC_GRID`` merged (the last point always kept)."""
    cells = (curve[["fpr", "tpr"]] / ROC_GRID).round()
    keep = ~cells.duplicated() | (curve.index == curve.index[-1])
    return curve[keep]


def _scored(positions: pd.DataFrame) -> pd.DataFrame:
    """The kernel pair's positions with a finite reference margin (the predictor's sample)."""
    part = positions[positions["comparison"] == KERNEL_PAIR]
    return part[np.isfinite(part["margin"].astype(float))]


def roc_figure(positions: pd.DataFrame, src: Source) -> Figure:
    """ROC of the margin predictor per regime; a regime without both flips and non-flips is named, not drawn."""
    curves: dict[str, list[tuple[float, float]]] = {}
    notes = []
    for regime, part in _scored(positions).groupby("regime", sort=True):
        flips = int(part["flip"].sum())
        if 0 < flips < len(part):
            curve = roc_points(part)
            curves[f"{regime}: AUC {roc_area(curve):.3f} ({flips:,} flips of {len(part):,})"] = list(
                thinned(curve).itertuples(index=False, name=None))
        else:
            notes.append(f"{regime}: no curve: {flips:,} flips among {len(part):,} positions (a curve needs both)")
    chart = svg.roc_curve("ROC: the margin as a flip predictor", curves,
                          x_label="false-positive rate (non-flips at or below)",
                          y_label="true-positive rate (flips)", notes=notes)
    return Figure("roc", "ROC of the reference margin as a predictor of teacher-forced top-1 flips between the arms, "
                         "per regime: one point per distinct margin threshold (ties together)", chart, (src,))


def calibration_bins(predictor: pd.DataFrame, positions: pd.DataFrame) -> pd.DataFrame:
    """Per regime and bin of the kernel pair's margin map: the flip probability it predicts (fitted on
    even windows) beside the share of flips among the held-out positions (odd windows) in that bin."""
    bins = predictor[(predictor["comparison"] == KERNEL_PAIR) & (predictor["quantity"] == "map_bin")]
    bins = (bins.assign(margin_from=bins["margin_from"].astype(float).fillna(-np.inf))
            [["regime", "bin", "margin_from", "margin_to", "value"]].rename(columns={"value": "predicted"}))
    scored = _scored(positions)
    held = scored[~fit_windows(scored["window"].to_numpy())]
    placed = pd.merge_asof(held.assign(margin=held["margin"].astype(float)).sort_values("margin"),
                           bins.sort_values("margin_from")[["regime", "margin_from", "bin"]],
                           left_on="margin", right_on="margin_from", by="regime", direction="backward")
    observed = placed.groupby(["regime", "bin"]).agg(held_out_positions=("flip", "size"),
                                                    held_out_flips=("flip", "sum")).reset_index()
    out = bins.merge(observed, on=["regime", "bin"], how="left").fillna({"held_out_positions": 0, "held_out_flips": 0})
    out = out.astype({"held_out_positions": "int64", "held_out_flips": "int64"})
    rate = out["held_out_flips"] / out["held_out_positions"].where(out["held_out_positions"] > 0)
    return (out.assign(observed=rate, margin_from=out["margin_from"].replace(-np.inf, np.nan))
            .sort_values(["regime", "bin"]).reset_index(drop=True))


def calibration_figure(bins: pd.DataFrame, sources: tuple[Source, ...]) -> Figure:
    """Predicted against held-out observed flip probability, one marker per map bin and regime."""
    drawn = bins[bins["held_out_positions"] > 0]
    series = {f"{regime} ({int(part['held_out_flips'].sum()):,} held-out flips)":
              list(zip(part["predicted"].astype(float), part["observed"].astype(float), part["held_out_positions"]))
              for regime, part in drawn.groupby("regime", sort=True)}
    empty = bins[bins["held_out_positions"] == 0]
    notes = [f"{len(empty)} bin(s) without a held-out position not drawn"] if len(empty) else []
    chart = svg.calibration_plot("Calibration of the margin map", series,
                                 x_label="predicted flip probability (even windows)",
                                 y_label="observed flip share (odd windows)", notes=notes)
    return Figure("calibration", "Calibration of the binned margin map: each merged quantile bin's predicted flip "
                                 "probability against the share of flips among held-out positions in that bin",
                  chart, sources)


def _predictor_figures(t: Tables, doc: Document) -> list[Block]:
    """The ROC (per-position margins and flips) and the calibration of the margin map (its bins
    beside the held-out positions), each from the tables that hold them."""
    positions = t.get(stage_spec.table("tokens", "positions"))
    if positions is None:
        return [Paragraph("ROC and calibration: not drawn: tokens/positions.parquet (per-position margins and flips) "
                          "was not produced.")]
    df, src = positions
    blocks: list[Block] = [roc_figure(df, src)]
    predictor = t.get(stage_spec.table("tokens", "predictor"))
    if predictor is None:
        return blocks + [Paragraph("Calibration: not drawn: tokens/predictor.parquet (the margin map) was not "
                                   "produced.")]
    bins = calibration_bins(predictor[0], df)
    ref = doc.add_appendix("Calibration of the kernel pair's margin map: predicted flip probability per merged "
                           "quantile bin (even windows) and the held-out flips (odd windows)", bins,
                           (predictor[1], src))
    return blocks + [calibration_figure(bins, (predictor[1], src)),
                     Paragraph(f"Calibration bins, predicted beside observed: appendix {ref}.")]


def tokens(t: Tables, doc: Document) -> list[Block]:
    blocks: list[Block] = [Heading("Token-level check 7 (this project's rule; the papers left it unmeasured)")]
    pairs = t.get(stage_spec.table("tokens", "pairs"))
    if pairs is None:
        return blocks + [_missing("tokens/")]
    blocks.append(Paragraph(
        "The papers registered check 7 (token-level risk on logit margins) but measured nothing for it; the rule "
        "applied here is this project's own (tokens.yaml: it fires when more than the flip budget of teacher-forced "
        "positions flip top-1, or when any position with a reference margin of at least one logit flips)."))
    blocks.append(Table("The kernel pair per regime: teacher-forced top-1 flips with a window-cluster interval, and "
                        "check 7", pairs[0][[c for c in PAIRS_COLUMNS if c in pairs[0].columns]], (pairs[1],)))
    unobservable = (pairs[0]["score"] == UNOBSERVABLE).any()
    blocks.append(Paragraph("Score: check 7's verdict against its pinned prediction (TP, FN, FP, TN); "
                            + UNOBSERVABLE_NOTE + (" (here: the two arms' logits never differed)" if unobservable
                                                   else "") + "."))
    predictor = t.get(stage_spec.table("tokens", "predictor"))
    if predictor is not None:
        df, psrc = predictor
        blocks.append(Table("Margin as a predictor of flips (kernel pair), per regime: ROC-AUC with its window-cluster "
                            "interval, average precision, held-out Brier of the binned map, the isotonic sensitivity "
                            "map and the constant baseline", predictor_summary(df), (psrc,)))
        ref = doc.add_appendix("Every predictor quantity, map bins and injection comparisons included", df, (psrc,))
        blocks.append(Paragraph(f"Every comparison's predictor rows and calibration bins: appendix {ref}."))
    blocks += _predictor_figures(t, doc)
    influence = t.get(stage_spec.table("tokens", "influence"))
    if influence is not None:
        df, isrc = influence
        if len(df):
            worst = df.loc[df["auc_change"].abs().fillna(-1).groupby([df["comparison"], df["regime"]]).idxmax().dropna()]
            kern = worst[worst["comparison"] == KERNEL_PAIR]
            text = "; ".join(f"{r.regime}: leaving out window {int(r.window)} moves the AUC by "
                             f"{'—' if pd.isna(r.auc_change) else f'{float(r.auc_change):+.3f}'} and the flip rate by "
                             f"{100 * float(r.flip_rate_change):+.2f} points" for r in kern.itertuples())
            ref = doc.add_appendix("Leave-one-window-out influence on the AUC and the flip rate", df, (isrc,))
            blocks.append(Paragraph(f"Largest leave-one-window-out influence on the kernel pair: {text or 'none'} "
                                    f"(every window: appendix {ref})."))
    check7 = t.get(stage_spec.table("tokens", "check7"))
    if check7 is not None:
        df, csrc = check7
        counts = df["score"].value_counts()
        ref = doc.add_appendix("Check 7 under end-to-end fault injection, per cell", df[[c for c in CHECK7_COLUMNS
                                                                                            if c in df.columns]],
                               (csrc,))
        blocks.append(Paragraph("Check 7 under end-to-end fault injection: " + ", ".join(
            f"{k} {int(v)}" for k, v in sorted(counts.items())) + f" (per cell: appendix {ref})."))
    return blocks


GLOSSARY = [
    ("cell", "one fault at one severity and scale regime on one captured layer, scored once per check"),
    ("TP / FN", "a cell predicted to fire whose check fired / stayed silent (FN: a missed detection)"),
    ("FP / TN", "a cell predicted silent whose check fired / stayed silent (FP: a false alarm)"),
    ("observable, unobservable", "a cell is observable when its fault changed some output element; an "
                                 "unobservable cell cannot be detected by comparing outputs"),
    ("excluded-unobservable", "the score of an unobservable cell (or comparison): it enters neither denominator, "
                              "TP + FN nor FP + TN, and is counted apart"),
    ("not applicable", "the check does not apply to the cell (e.g. check 5 needs every scale to be a power of two); "
                       "never counted as a pass"),
    ("stated, paper", "the two scoring definitions: stated is analysis.yaml's registered rule; paper is the reading "
                      f"that reproduces the figures of {PT} (paper.yaml), which also counts cells whose fault changed "
                      "an arm's operands and reads check 6 in both regimes"),
    ("original, corrected, reverted", "the prediction matrices: corrected has 77 cells; original is the registered "
                                      "63-cell matrix (stated); reverted is the corrected matrix with its three "
                                      "post-data corrections undone (paper)"),
    ("regime", "own: the checkpoint's real scales; pow2: every scale a power of two"),
    ("setting", "how compare feeds the two arms: real (the own checkpoint's captured operands), pow2-snapped (the "
                "same operands, every scale snapped to its nearest power of two), pow2-requant (the pow2-nearest "
                "checkpoint's own captured operands)"),
    ("ulp", "unit in the last place: the distance between two bf16 values counted in representable steps "
            "(1 ulp = adjacent values)"),
    ("pow2", "power-of-two scales: every scale snapped to 2^n (nearest or ceiling), which makes the scale "
             "multiplications exact"),
    ("probe", "the rewritten-scale checkpoint: scales snapped to powers of two, the old int8 weights kept"),
    ("flip, margin", "a flip: a teacher-forced position whose top-1 token differs between the arms; the margin: "
                     "the reference arm's top-1 minus top-2 logit there"),
    ("emulated arm", "an exact CPU emulation of a kernel's arithmetic and epilogue order, not the kernel binary"),
    ("[IA], [PT]", f"the two papers: {IA} (localizing cross-kernel divergence) and {PT} "
                   "(power-of-two scales and the limits of tolerance-based conformance)"),
]


def glossary() -> list[Block]:
    return [Heading("Glossary"), Definitions("Terms used in this report", tuple(GLOSSARY))]


SECTIONS = [run_facts, requant, agreement, faults, determinism, prefill_decode, perplexity, tokens]

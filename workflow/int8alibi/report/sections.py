"""The report's sections. Each reads its Parquet tables and returns blocks; nothing is typed in.

A table that a run did not produce (e.g. the optional tokens stage) gives a one-line note saying
so, never an empty table that could be read as "nothing found".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..provenance.hashing import sha256_file
from ..provenance.parquet import read_table
from . import svg
from .document import Block, Figure, Heading, Paragraph, Source, Table


@dataclass(frozen=True)
class Tables:
    """Reads result tables under one results folder and names each one's source."""

    results: Path
    claims: tuple[dict, ...] = ()   # paper.yaml's claims, for sections that quote a paper's value

    def claim(self, claim_id: str) -> dict | None:
        return next((c for c in self.claims if c["id"] == claim_id), None)

    def get(self, rel: str) -> tuple[pd.DataFrame, Source] | None:
        path = self.results / rel
        if not path.exists():
            return None
        return read_table(path), Source(f"{self.results.name}/{rel}", sha256_file(path))


def _missing(rel: str) -> Paragraph:
    return Paragraph(f"Not in this run: {rel} was not produced.")


def run_facts(t: Tables) -> list[Block]:
    blocks: list[Block] = [Heading("Protocol in force")]
    got = t.get("protocol/pins.parquet")
    if got is None:
        return blocks + [_missing("protocol/pins.parquet")]
    pins, src = got
    blocks.append(Table("Pinned protocol files and data", pins, (src,)))
    return blocks


def requant(t: Tables) -> list[Block]:
    blocks: list[Block] = [Heading("Requantization gate")]
    got = t.get("requant/gate.parquet")
    if got is None:
        return blocks + [_missing("requant/gate.parquet")]
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
    blocks.append(Table("Per arm: layers byte-equal to the gate's reference, clipping and saturation", summary, (src,)))
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
    columns = ("f32_division_differing", "quotient_shift_max", "code_offset_max")
    if any(c not in gate.columns for c in columns):
        return [Paragraph("Division statistics: not in this run (requant/gate.parquet was written before they "
                          "existed; rerun requant).")]
    own = gate[gate["arm"] == "own"]
    differing, weights = int(own["f32_division_differing"].sum()), int((own["n"] * own["k"]).sum())

    def paper(claim_id: str, unit: str) -> str:
        claim = t.claim(claim_id)
        return "not registered" if claim is None else f"{claim['value']}{unit} ({claim['model']})"

    rows = [
        {"quantity": "int8 weights that differ when W / s_w is divided in float32 instead of bf16",
         "this_run": f"{100 * differing / weights:.2f}% ({differing:,} of {weights:,})",
         "paper": paper("division-f32-differing", "%")},
        {"quantity": "largest |int8 - clamp(q_f32, -128, 127)|: the stored weight's distance from the float32 quotient",
         "this_run": f"{float(own['code_offset_max'].max()):.3f}", "paper": paper("division-bf16-shift", "")},
        {"quantity": "largest |q_bf16 - q_f32|: the bf16 rounding of the quotient alone",
         "this_run": f"{float(own['quotient_shift_max'].max()):.3f}", "paper": "not reported"},
    ]
    return [Table("Division statistics over every own layer (per layer: requant/gate.parquet); the pinned "
                  "division is bf16, float32 the alternative; same bf16 scales under both", pd.DataFrame(rows),
                  (src,))]


def agreement(t: Tables) -> list[Block]:
    blocks: list[Block] = [Heading("Per-layer agreement between the two arms")]
    got = t.get("compare/summary.parquet")
    if got is None:
        return blocks + [_missing("compare/summary.parquet")]
    summary, src = got
    blocks.append(Table("Layers identical / differing and max ulp, per setting and phase", summary, (src,)))
    layers = t.get("compare/layers.parquet")
    if layers is not None:
        df, lsrc = layers
        failed = df[df["prediction_held"] == "no"]
        blocks.append(Paragraph(
            f"Pinned pow2 predictions that failed: {len(failed)} of "
            f"{int((df['prediction_held'] != 'n.a.').sum())} layer comparisons that carry one."))
        if len(failed):
            blocks.append(Table("Layers whose bitwise prediction failed", failed[
                ["setting", "phase", "layer", "differing", "max_finite_ulp"]], (lsrc,)))
    pred = t.get("prediction/predictions.parquet")
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
                svg.bar_chart("Headroom below 2^24 (bits), min over the block's layers",
                              [f"block {b}" for b in per_block.index],
                              [float(v) if math.isfinite(v) else 0.0 for v in finite.fillna(0.0)]),
                (psrc,)))
    return blocks


def _definition_caption(name: str) -> str:
    return {"stated": "stated rule (analysis.yaml)", "paper": "paper-figure definition (paper.yaml)"}.get(name, name)


def faults(t: Tables) -> list[Block]:
    blocks: list[Block] = [Heading("Fault campaign")]
    got = t.get("faults/detection.parquet")
    if got is None:
        return blocks + [_missing("faults/detection.parquet")]
    detection, dsrc = got
    tot = t.get("faults/totals.parquet")
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
    dec = t.get("faults/decisions.parquet")
    if dec is not None:
        df, decsrc = dec
        blocks.append(Table("Decision rules evaluated on the campaign (D1: narrow the claim if no check catches an "
                            "epilogue fault)", df, (decsrc,)))
    for definition in sorted(detection["definition"].unique(), reverse=True):
        part = detection[detection["definition"] == definition].drop(columns="definition")
        blocks.append(Table(f"Detection by fault (F4 split by regime), {_definition_caption(definition)}", part, (dsrc,)))
    score = t.get("faults/scorecard.parquet")
    if score is not None:
        df, ssrc = score
        for definition in sorted(df["definition"].unique(), reverse=True):
            for matrix in df.loc[df["definition"] == definition, "matrix"].unique():
                part = df[(df["definition"] == definition) & (df["matrix"] == matrix)].drop(
                    columns=["definition", "matrix"])
                blocks.append(Table(f"Scorecard, {matrix} matrix, {_definition_caption(definition)}", part, (ssrc,)))
    fl = t.get("faults/flips.parquet")
    if fl is not None:
        df, fsrc = fl
        blocks.append(Table("Predictions that differ between a definition's two matrices: cell rows and how many "
                            "change score", df, (fsrc,)))
    ulp = t.get("faults/ulp_distribution.parquet")
    if ulp is not None:
        df, usrc = ulp
        ranges = df.dropna(subset=["max_ulp"]).groupby("fault")["max_ulp"].agg(["min", "max"]).reset_index()
        ranges.columns = ["fault", "smallest max ulp", "largest max ulp"]
        blocks.append(Table("Range of the per-cell max ulp between the arms, per fault", ranges, (usrc,)))
        buckets = svg.ULP_BUCKETS
        names = [svg.ulp_bucket(v) for v in df["max_ulp"]]
        pivot = df.assign(bucket=names).pivot_table(index="fault", columns="bucket", values="cells",
                                                    aggfunc="sum", fill_value=0)
        series = {b: [int(v) for v in pivot[b]] for b in buckets if b in pivot}
        blocks.append(Figure("ulp", "Cells by max ulp between the arms, per fault (buckets grow by powers of 16)",
                             svg.stacked_bars("Cells by max ulp (arm A vs arm B)", list(pivot.index), series),
                             (usrc,)))
    cells = t.get("faults/cells.parquet")
    if cells is not None:
        df, csrc = cells
        scored = df[df["observable"] & df["applicable"]]
        rate = scored.assign(fired=scored["fired"].astype(float)).pivot_table(
            index="fault", columns="check", values="fired", aggfunc="mean")
        faults_ = sorted(df["fault"].unique())
        checks = sorted(df["check"].unique())
        grid = [[None if (f not in rate.index or c not in rate.columns or math.isnan(rate.loc[f, c]))
                 else float(rate.loc[f, c]) for c in checks] for f in faults_]
        blocks.append(Figure("detection", "Fraction of observable, applicable cells where the check fired",
                             svg.heat_map("Detection heat map (fault × check)", faults_, [str(c) for c in checks], grid),
                             (csrc,)))
    return blocks


def determinism(t: Tables) -> list[Block]:
    blocks: list[Block] = [Heading("End-to-end determinism (greedy generation)")]
    got = t.get("determinism/summary.parquet")
    if got is None:
        return blocks + [_missing("determinism/summary.parquet")]
    summary, src = got
    if "probe" in summary.columns:
        c = t.claim("probe-arms-agree")
        blocks.append(Paragraph(
            f"Under the rewritten-scale probe (snapped scales, the own int8 weights kept) {summary['probe'].iloc[0]} "
            "sequences are identical across the two arms" + ("." if c is None else
                                                             f"; the second paper: {' '.join(c['statement'].split())}.")))
    blocks.append(Table("Identical sequences across arms, per checkpoint; self-consistency", summary, (src,)))
    agree = t.get("determinism/agreement.parquet")
    if agree is not None:
        df, asrc = agree
        counts = df.groupby(["checkpoint", "comparison"]).agg(
            prompts=("prompt", "size"), identical=("identical", "sum"),
            earliest_divergence=("first_divergence", "min")).reset_index()
        blocks.append(Table("Agreement per checkpoint and comparison", counts, (asrc,)))
    return blocks


def _paper_rate(t: Tables, claim_id: str) -> str:
    c = t.claim(claim_id)
    return "not registered" if c is None else f"{c['value']}%"


def prefill_decode(t: Tables) -> list[Block]:
    blocks: list[Block] = [Heading("Prefill versus decode on one arm")]
    got = t.get("prefill_decode/prefill_decode.parquet")
    if got is None:
        return blocks + [_missing("prefill_decode/prefill_decode.parquet")]
    table, src = got
    seqs = t.get("prefill_decode/first_divergence.parquet")
    sentences = []
    for c in table["checkpoint"].unique():
        part = table[table["checkpoint"] == c]
        flips, positions, differ = int(part["flips"].sum()), int(part["positions"].sum()), int(
            part["differing_positions"].sum())
        arms = ", ".join(f"{r.arm} {100 * r.flip_rate:.1f}% ({100 * r.level:.0f}% sequence-cluster interval "
                         f"{100 * r.flip_rate_low:.1f}–{100 * r.flip_rate_high:.1f}%)" for r in part.itertuples())
        text = (f"{c}: {flips:,} of {positions:,} generated positions flip top-1 ({arms}); the bf16 logits differ "
                f"in some bit at {differ:,}")
        if seqs is not None:
            div = seqs[0][(seqs[0]["checkpoint"] == c) & seqs[0]["diverged"]]
            modules = div.groupby(["module", "kind"]).size().sort_values(ascending=False)
            text += ("; no first divergence" if div.empty else
                     f"; first diverging module in {len(div)} of {int(part['sequences'].sum())} sequences: "
                     + ", ".join(f"{m} ({k}) in {n}" for (m, k), n in modules.items()))
        sentences.append(text + ".")
    blocks.append(Paragraph(
        "Each sequence is decoded greedily with the KV cache and replayed as one prefill on the same arm; a flip is a "
        "generated position whose top-1 token differs. " + " ".join(sentences) + " The second paper reports "
        f"{_paper_rate(t, 'prefill-decode-flips-real')} of tokens flipping under real scales and "
        f"{_paper_rate(t, 'prefill-decode-flips-probe')} under the probe, not attributed to a module; here the first "
        "differing intermediate is named (every module traced at the first position whose logits differ)."))
    blocks.append(Table("Prefill versus decode per checkpoint and arm: flips with a sequence-cluster interval",
                        table, (src,)))
    if seqs is not None:
        blocks.append(Table("First diverging module per sequence (execution order; empty where nothing differs)",
                            seqs[0], (seqs[1],)))
    return blocks


def perplexity(t: Tables) -> list[Block]:
    blocks: list[Block] = [Heading("Perplexity cost of power-of-two scales")]
    got = t.get("perplexity/summary.parquet")
    if got is None:
        return blocks + [_missing("perplexity/summary.parquet")]
    summary, src = got
    blocks.append(Table("Perplexity, relative change vs own (paired bootstrap), decomposition, H1, G1",
                        summary, (src,)))
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
                                                   (100 * part["high"].astype(float)).tolist(), unit="%"),
                                 (src,)))
    return blocks


def tokens(t: Tables) -> list[Block]:
    blocks: list[Block] = [Heading("Token-level check 7")]
    found = False
    for rel, caption in [("tokens/pairs.parquet", "Flip rate per arm pair and checkpoint"),
                         ("tokens/predictor.parquet", "Margin as a predictor of flips: ROC-AUC and Brier"),
                         ("tokens/check7.parquet", "Check 7 under end-to-end fault injection")]:
        got = t.get(rel)
        if got is not None:
            found = True
            blocks.append(Table(caption, got[0], (got[1],)))
    return blocks if found else blocks + [_missing("tokens/")]


def stage_times(t: Tables, benchmarks: Path) -> list[Block]:
    blocks: list[Block] = [Heading("Stage times (Snakemake benchmark files)")]
    files = sorted(benchmarks.rglob("*.tsv")) if benchmarks.exists() else []
    if not files:
        return blocks + [Paragraph(f"No benchmark files under {benchmarks}.")]
    rows = []
    for f in files:
        df = pd.read_csv(f, sep="\t")
        rows.append({"rule": str(f.relative_to(benchmarks).with_suffix("")), "seconds": float(df["s"].iloc[0]),
                     "max_rss_mb": float(df["max_rss"].iloc[0]) if "max_rss" in df else float("nan")})
    frame = pd.DataFrame(rows)
    src = Source(str(benchmarks), "per-file; timings are not part of any digest")
    total = Paragraph(f"Sum of stage times: {frame['seconds'].sum():.1f} s over {len(frame)} jobs.")
    return blocks + [Table("Wall time per job", frame, (src,)), total]


SECTIONS = [run_facts, requant, agreement, faults, determinism, prefill_decode, perplexity, tokens]

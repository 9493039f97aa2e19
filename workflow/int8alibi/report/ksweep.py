"""The report's K-sweep section: INT8 versus FP8 divergence against K, beside the paper's values.

The sweep is GPU only. When its tables are absent (a CPU run leaves the stage out of the DAG) or
say "not run", the section says so in words and still shows the paper's values, with this run's
column reading "not run", so the absence cannot be read as agreement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from . import svg
from .document import Block, Document, Figure, Heading, Paragraph, Table
from .sections import Tables

HEADING = "INT8 versus FP8 divergence against reduction depth (K sweep, GPU only)"
NOT_IN_DAG = ("Not run: the K sweep needs a GPU and is left out of the DAG when the run resolves to the CPU "
              "(ksweep/ was not produced). On a GPU run, or with `snakemake ksweep`, it writes its tables; the "
              "paper's values are shown below with this run's column reading \"not run\".")
RUN = "run"


def _pct(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * float(x):.3g}%"


def _share(x: float) -> str:
    return f"{100 * x:.2f}%" if x >= 1e-3 else f"{x * 1e6:.2f} per million"


def _device(evidence: pd.DataFrame | None) -> str:
    if evidence is None:
        return "device not recorded"
    facts = dict(zip(evidence.loc[evidence["pair"] == "*", "item"], evidence.loc[evidence["pair"] == "*", "value"]))
    return f"{facts.get('device', '?')} ({facts.get('compute_capability', '?')})"


def per_k(counts: pd.DataFrame) -> pd.DataFrame:
    """Per pair x K over seeds: mean, min and max prevalence, pooled per million, tail and magnitudes."""
    ran = counts[counts["status"] == RUN]
    g = ran.groupby(["pair", "k"], sort=True)
    out = g.agg(seeds=("seed", "size"), prevalence_mean=("prevalence", "mean"), prevalence_min=("prevalence", "min"),
                prevalence_max=("prevalence", "max"), differing=("differing", "sum"), elements=("elements", "sum"),
                differing_non_near_zero=("differing_non_near_zero", "sum"),
                ge2_ulp_non_near_zero=("ge2_ulp_non_near_zero", "sum"),
                max_ulp=("max_ulp", "max"), max_relative_difference=("max_relative_difference", "max")).reset_index()
    out["per_million"] = out["differing"] * 1e6 / out["elements"]
    nz = out["differing_non_near_zero"].astype(float)
    out["ge2_ulp_share"] = (out["ge2_ulp_non_near_zero"] / nz).where(nz > 0)
    return out


def paper_rows(paper: Mapping[str, Any], table: pd.DataFrame, summary: pd.DataFrame | None,
               fits: pd.DataFrame | None) -> pd.DataFrame:
    """The paper's Section VII values with this run's, per pair where the quantity is per pair."""
    pairs = sorted(table["pair"].unique()) if len(table) else []
    int8 = [p for p in pairs if p.startswith("int8")]
    fp8 = [p for p in pairs if p.startswith("fp8")]
    rows: list[dict[str, Any]] = []

    def cell(pair: str, k: int, column: str, fmt: Any = _pct) -> str:
        hit = table[(table["pair"] == pair) & (table["k"] == k)]
        return fmt(hit[column].iloc[0]) if len(hit) else "not run"

    p8 = paper["int8"]
    for pair in int8 or ["INT8 pair"]:
        mine = table[table["pair"] == pair]
        rows.append({"quantity": "INT8 differing elements (total over the grid)", "paper": str(p8["differing_total"]),
                     "this_run": f"{int(mine['differing'].sum())} ({int(mine['seeds'].max())} seeds)" if len(mine)
                     else "not run", "pair": pair})
        rows.append({"quantity": "INT8 differing per million (range over K)",
                     "paper": f"{p8['per_million_range'][0]}–{p8['per_million_range'][1]}",
                     "this_run": f"{mine['per_million'].min():.2f}–{mine['per_million'].max():.2f}" if len(mine)
                     else "not run", "pair": pair})
        test = summary[summary["pair"] == pair] if summary is not None else pd.DataFrame()
        stat = test["chi_square"].iloc[0] if len(test) else None
        rows.append({"quantity": "INT8 constant-rate chi-square (df)", "paper": f"{p8['chi_square']} ({p8['df']})",
                     "this_run": (f"{float(stat):.2f} ({int(test['df'].iloc[0])}), p = {float(test['p_value'].iloc[0]):.3g}"
                                  if stat is not None and not pd.isna(stat) else "not run"), "pair": pair})
    f8 = paper["fp8"]
    for pair in fp8 or ["FP8 pair"]:
        for at in f8["at_k"]:
            k = at["k"]
            rows.append({"quantity": f"FP8 prevalence at K={k}", "paper": f"{at['prevalence_percent']}%",
                         "this_run": cell(pair, k, "prevalence_mean"), "pair": pair})
            rows.append({"quantity": f"FP8 >= 2 ulp share (non-near-zero) at K={k}",
                         "paper": f"{at['ge2_ulp_share_percent']}%", "this_run": cell(pair, k, "ge2_ulp_share"),
                         "pair": pair})
            rows.append({"quantity": f"FP8 largest relative difference at K={k}",
                         "paper": f"{at['max_relative_difference_percent']}%",
                         "this_run": cell(pair, k, "max_relative_difference"), "pair": pair})
        chosen = fits[(fits["pair"] == pair) & (fits["selected"] == True)] if fits is not None else pd.DataFrame()  # noqa: E712
        sat = fits[(fits["pair"] == pair) & (fits["model"] == "generalized-saturation")] if fits is not None else chosen
        rows.append({"quantity": "FP8 best model (held-out)", "paper": f8["best_model"],
                     "this_run": chosen["model"].iloc[0] if len(chosen) else "not run", "pair": pair})
        alpha = sat["alpha"].iloc[0] if len(sat) else None
        rows.append({"quantity": "generalized-saturation alpha (seed-jackknife 95% interval)",
                     "paper": f"{f8['alpha']} ({f8.get('alpha_stability', 'seed jackknife')})",
                     "this_run": (f"{float(alpha):.3f} [{float(sat['alpha_lower'].iloc[0]):.3f}, "
                                  f"{float(sat['alpha_upper'].iloc[0]):.3f}]")
                     if alpha is not None and not pd.isna(alpha) else "not run", "pair": pair})
    return pd.DataFrame(rows, columns=["quantity", "pair", "paper", "this_run"])


def verdicts(summary: pd.DataFrame, fits: pd.DataFrame | None) -> list[str]:
    """One sentence per pair that ran: share differing, the constant-rate test, the selected model."""
    lines = []
    for r in summary[summary["status"] == RUN].itertuples():
        text = (f"{r.pair} ({r.arm_a} vs {r.arm_b}): {int(r.differing):,} of {int(r.elements):,} elements differ "
                f"({_share(r.differing / r.elements)}); constant rate over K {r.rate_test}")
        if not pd.isna(r.chi_square):
            text += f" (chi-square {float(r.chi_square):.4g}, df {int(r.df)}, p = {float(r.p_value):.3g})"
        text += f"; selected model: {r.selected_model}"
        chosen = fits[(fits["pair"] == r.pair) & (fits["model"] == r.selected_model)] if fits is not None else None
        if chosen is not None and len(chosen) and not pd.isna(chosen["alpha"].iloc[0]):
            c = chosen.iloc[0]
            text += (f", alpha {float(c['alpha']):.3f} (seed jackknife 95% [{float(c['alpha_lower']):.3f}, "
                     f"{float(c['alpha_upper']):.3f}]; disjoint half ranges {float(c['alpha_low_half']):.3f} / "
                     f"{float(c['alpha_high_half']):.3f})")
        lines.append(text + ".")
    return lines


def _figures(table: pd.DataFrame, paper: Mapping[str, Any], device: str, sources: tuple) -> list[Block]:
    prevalence = {pair: [(float(r.k), float(r.prevalence_mean), float(r.prevalence_min), float(r.prevalence_max))
                         for r in g.itertuples()] for pair, g in table.groupby("pair", sort=True)}
    at = paper["fp8"]["at_k"]
    prevalence[f"paper FP8 ({paper['device']})"] = [(float(a["k"]), a["prevalence_percent"] / 100, math.nan, math.nan)
                                                   for a in at]
    tail = {pair: [(float(r.k), float(r.ge2_ulp_share), math.nan, math.nan) for r in g.itertuples()]
            for pair, g in table.groupby("pair", sort=True)}
    tail[f"paper FP8 ({paper['device']})"] = [(float(a["k"]), a["ge2_ulp_share_percent"] / 100, math.nan, math.nan)
                                             for a in at]
    note = f"This run: {device}; the paper's sweep ran on {paper['device']}. Bars: min-max over seeds."
    hollow = [f"paper FP8 ({paper['device']})"]
    return [
        Figure("ksweep-prevalence", f"Share of differing output elements against K, both formats, on {device}",
               svg.line_chart(f"Differing elements vs K ({device})", prevalence, x_label="reduction depth K (log2)",
                              y_label="share differing (log)", log_y=True, note=note, hollow=hollow), sources),
        Figure("ksweep-ulp-tail", f"Share at >= 2 ulp among differing non-near-zero elements, on {device}",
               svg.line_chart(f">= 2 ulp share of differing elements vs K ({device})", tail,
                              x_label="reduction depth K (log2)", y_label="share >= 2 ulp", note=note, hollow=hollow),
               sources),
    ]


def section(t: Tables, paper: Mapping[str, Any], doc: Document | None = None) -> list[Block]:
    """The K-sweep section; ``paper`` is ksweep.yaml's ``paper`` block. With ``doc``, the per-K, fit
    and evidence tables go to its appendix and the section links them."""
    blocks: list[Block] = [Heading(HEADING)]
    counts = t.get("ksweep/counts.parquet")
    summary = t.get("ksweep/summary.parquet")
    fits = t.get("ksweep/fits.parquet")
    evidence = t.get("ksweep/evidence.parquet")
    if counts is None:
        blocks.append(Paragraph(NOT_IN_DAG))
        return blocks + [Table("The paper's Section VII beside this run", paper_rows(paper, pd.DataFrame(
            columns=["pair", "k"]), None, None), ())]
    frame, csrc = counts
    statuses = sorted(set(frame["status"]))
    if RUN not in statuses:
        blocks.append(Paragraph(f"Not run: every pair says {'; '.join(statuses)}. No number below is measured."))
    elif len(statuses) > 1:
        blocks.append(Paragraph("Some pairs did not run: " + "; ".join(
            f"{p}: {s}" for p, s in sorted(set(zip(frame["pair"], frame["status"]))) if s != RUN) + "."))
    table = per_k(frame)
    device = _device(evidence[0] if evidence else None)
    sources = tuple(x[1] for x in (counts, summary, fits, evidence) if x is not None)
    refs: list[str] = []
    if len(table):
        blocks.extend(_figures(table, paper, device, (csrc,)))
        caption = f"Per pair and K, over seeds ({device})"
        if doc is None:
            blocks.append(Table(caption, table, (csrc,)))
        else:
            refs.append(doc.add_appendix(f"K sweep: {caption}", table, (csrc,)))
    blocks.append(Table("The paper's Section VII beside this run",
                        paper_rows(paper, table, summary[0] if summary else None, fits[0] if fits else None), sources))
    if summary is not None:
        blocks.extend(Paragraph(line) for line in verdicts(summary[0], fits[0] if fits else None))
    for got, caption in ((summary, "Constant-rate chi-square over K (counts summed over seeds) and selected model"),
                         (fits, "Candidate models: least squares on prevalence, leave-one-K-out held-out RMSE, "
                                "alpha's seed-jackknife interval, disjoint half-range and leave-one-K-out refits"),
                         (evidence, "Which binaries ran (versions, library digests, CUDA kernel names)")):
        if got is None:
            continue
        if doc is None or got is summary:
            blocks.append(Table(caption, got[0], (got[1],)))
        else:
            refs.append(doc.add_appendix(f"K sweep: {caption}", got[0], (got[1],)))
    if refs:
        blocks.append(Paragraph(f"Per K, the candidate models and the binaries that ran: appendix {', '.join(refs)}."))
    return blocks

"""The report's K-sweep section: INT8 versus FP8 divergence against K, beside arXiv:2608.13756 (Section VII).

Every pair that ran is shown. The paper's values are set beside one pair per format, named by the
registered comparator rule (ksweep.yaml ``paper.comparator``: the first pair in registration order
that ran), never by row order or name, and the section says which pair and why. Per K, each
statistic uses the paper's estimator (seed means of the per-seed largest relative difference, the
lowest held-out error); the project's variants appear beside them labelled as sensitivities.

The sweep is GPU only. When its tables are absent (a CPU run leaves the stage out of the DAG) or
say "not run", the section says so in words and still shows the paper's values, with this run's
column reading "not run", so the absence cannot be read as agreement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..errors import InputError
from . import svg
from .. import stage_spec
from .document import Block, Document, Figure, Heading, Paragraph, Table
from .sections import Tables

HEADING = "INT8 versus FP8 divergence against reduction depth (K sweep, GPU only)"
NOT_IN_DAG = ("Not run: the K sweep needs a GPU and is left out of the DAG when the run resolves to the CPU "
              "(ksweep/ was not produced). On a GPU run, or with `snakemake ksweep`, it writes its tables; the "
              "paper's values are shown below with this run's column reading \"not run\".")
RUN = "run"
FORMATS = {"int8": "INT8", "fp8": "FP8"}
NOT_COMPARED = "—"
NONE_FAR = "no differing non-near-zero element"
# counts columns that per_k sums over seeds (null when no seed has one) and every column it reads as numbers
_SUMMED = ["differing", "elements", "differing_non_near_zero", "ge2_ulp_non_near_zero"]
_NUMERIC = [*_SUMMED, "prevalence", "max_ulp", "max_relative_difference", "median_relative_difference"]


def _pct(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * float(x):.3g}%"


def _sci(x: Any) -> str:
    return NONE_FAR if x is None or pd.isna(x) else f"{float(x):.2e}"


def _sci_range(values: pd.Series) -> str:
    """min–max of a per-K column, or why there is none."""
    return NONE_FAR if values.isna().all() else f"{_sci(values.min())}–{_sci(values.max())}"


def _share(x: float) -> str:
    return f"{100 * x:.2f}%" if x >= 1e-3 else f"{x * 1e6:.2f} per million"


def _device(evidence: pd.DataFrame | None) -> str:
    if evidence is None:
        return "device not recorded"
    facts = dict(zip(evidence.loc[evidence["pair"] == "*", "item"], evidence.loc[evidence["pair"] == "*", "value"]))
    return f"{facts.get('device', '?')} ({facts.get('compute_capability', '?')})"


def per_k(counts: pd.DataFrame) -> pd.DataFrame:
    """Per pair x K over the seeds that ran, by ksweep.yaml ``statistics.per_k``.

    prevalence_mean (min, max): seed mean (range); per_million, ge2_ulp_share and
    ge2_ulp_share_of_all: pooled over seeds; max_relative_difference: the seed mean of the per-seed
    maxima (the paper's estimator; max_relative_difference_seeds says over how many seeds one was
    defined); max_relative_difference_seed_max: the max over seeds (the sensitivity, and INT8's
    bound); median_relative_difference: the seed mean of the per-seed medians; max_ulp: the max.
    """
    ran = counts[counts["status"] == RUN]
    ran = ran.assign(**{c: pd.to_numeric(ran[c]) for c in _NUMERIC})
    g = ran.groupby(["pair", "k"], sort=True)
    out = pd.concat([
        g.agg(format=("format", "first"), seeds=("seed", "size"), prevalence_mean=("prevalence", "mean"),
              prevalence_min=("prevalence", "min"), prevalence_max=("prevalence", "max")),
        g[_SUMMED].sum(min_count=1),
        g.agg(max_ulp=("max_ulp", "max"), max_relative_difference=("max_relative_difference", "mean"),
              max_relative_difference_seeds=("max_relative_difference", "count"),
              max_relative_difference_seed_max=("max_relative_difference", "max"),
              median_relative_difference=("median_relative_difference", "mean")),
    ], axis=1).reset_index()
    out["per_million"] = out["differing"] * 1e6 / out["elements"]
    nz = out["differing_non_near_zero"].astype(float)
    out["ge2_ulp_share"] = (out["ge2_ulp_non_near_zero"] / nz).where(nz > 0)
    out["ge2_ulp_share_of_all"] = out["ge2_ulp_non_near_zero"] / out["elements"]
    return out


def paper_pair(table: pd.DataFrame, paper: Mapping[str, Any], fmt: str) -> tuple[str | None, str]:
    """(pair id or None, one-sentence reason): the pair the paper's ``fmt`` values are set beside.

    ``table``: any frame with a ``pair`` column; with a ``status`` column (the counts or summary
    table) a pair ran when one of its rows says "run", without one (``per_k``'s table) every listed
    pair ran. ``paper``: ksweep.yaml's ``paper`` block, whose ``comparator.order`` lists each format's
    pairs in registration order; the first of them that ran is the comparator. Row order and pair
    names play no part, so the answer cannot drift to whichever pair sorts first.
    """
    if fmt not in FORMATS:
        raise InputError(f"ksweep comparator: format {fmt!r} is not one of {sorted(FORMATS)}")
    rule = paper["comparator"]["rule"]
    order = list(paper["comparator"]["order"][fmt])
    rows = table[table["status"] == RUN] if "status" in table.columns else table
    ran = set(rows["pair"])
    chosen = next((p for p in order if p in ran), None)
    where = f"rule {rule} of ksweep.yaml paper.comparator, registration order {', '.join(order)}"
    if chosen is None:
        return None, f"No {FORMATS[fmt]} pair ran, so the paper's {FORMATS[fmt]} values stand beside none ({where})."
    skipped = order[:order.index(chosen)]
    note = f"; {', '.join(skipped)} did not run" if skipped else ""
    return chosen, (f"The paper's {FORMATS[fmt]} values stand beside {chosen}, the first {FORMATS[fmt]} pair in "
                    f"registration order that ran{note} ({where}).")


def _ran_pairs(table: pd.DataFrame, paper: Mapping[str, Any], fmt: str) -> list[str | None]:
    """The pairs of ``fmt`` that ran, in registration order; [None] (one set of "not run" rows) if none did."""
    ran = set(table["pair"])
    return [p for p in paper["comparator"]["order"][fmt] if p in ran] or [None]


def _one(frame: pd.DataFrame | None, pair: str, **match: Any) -> pd.Series | None:
    """The first row of ``frame`` for ``pair`` (and ``match``), or None."""
    if frame is None:
        return None
    mask = frame["pair"] == pair
    for column, value in match.items():
        mask &= frame[column] == value
    hit = frame[mask]
    return hit.iloc[0] if len(hit) else None


def _rate_test(row: pd.Series | None) -> str:
    if row is None or pd.isna(row["chi_square"]):
        return "not run" if row is None or row["status"] != RUN else str(row["rate_test"])
    return (f"{float(row['chi_square']):.2f} ({int(row['df'])}), p = {float(row['p_value']):.3g}; "
            f"{row['rate_test']}")


def paper_rows(paper: Mapping[str, Any], table: pd.DataFrame, summary: pd.DataFrame | None,
               fits: pd.DataFrame | None) -> pd.DataFrame:
    """The paper's values beside every pair that ran; ``beside_paper`` marks the comparator's rows.

    The paper column is filled on the comparator's rows only (and on the rows of a format none of
    whose pairs ran, whose this-run column reads "not run"); sensitivity rows have no paper value.
    """
    rows: list[dict[str, Any]] = []

    def add(pair: str | None, comparator: str | None, quantity: str, estimator: str, paper_value: str,
            this_run: str) -> None:
        beside = pair is None or pair == comparator
        rows.append({"quantity": quantity, "estimator": estimator, "pair": pair or "none ran",
                     "beside_paper": "yes" if beside else "no", "paper": paper_value if beside else NOT_COMPARED,
                     "this_run": this_run if pair is not None else "not run"})

    def at(pair: str | None, k: int, column: str, fmt: Any = _pct) -> str:
        hit = table[(table["pair"] == pair) & (table["k"] == k)]
        return fmt(hit[column].iloc[0]) if len(hit) else "not run"

    p8 = paper["int8"]
    comparator = paper_pair(table, paper, "int8")[0]
    for pair in _ran_pairs(table, paper, "int8"):
        mine = table[table["pair"] == pair]
        seeds = int(mine["seeds"].max()) if len(mine) else 0
        total = int(mine["differing"].sum())
        add(pair, comparator, "INT8 differing elements, total over the grid",
            f"sum over K and seeds (the paper: {p8['sweeps']} sweep)", str(p8["differing_total"]),
            f"{total:,} over {seeds} seeds ({total / max(seeds, 1):.1f} per seed)")
        add(pair, comparator, "INT8 differing per million, range over K", "pooled over seeds per K",
            f"{p8['per_million_range'][0]}–{p8['per_million_range'][1]}",
            f"{mine['per_million'].min():.2f}–{mine['per_million'].max():.2f}" if len(mine) else "")
        add(pair, comparator, "INT8 constant-rate chi-square (df)", "Pearson, 2 x K table, counts summed over seeds",
            f"{p8['chi_square']} ({p8['df']})", _rate_test(_one(summary, pair) if pair else None))
        bound = f"≤ {p8['max_relative_difference_at_most']:.2g} at every K"
        add(pair, comparator, "INT8 max relative difference, largest over K", "max over seeds and K", bound,
            _sci(mine["max_relative_difference_seed_max"].max()) if len(mine) else "")
        for r in mine.itertuples():
            add(pair, comparator, f"INT8 max relative difference at K={int(r.k)}", "max over seeds", bound,
                _sci(r.max_relative_difference_seed_max))
    f8 = paper["fp8"]
    comparator = paper_pair(table, paper, "fp8")[0]
    for pair in _ran_pairs(table, paper, "fp8"):
        mine = table[table["pair"] == pair]
        for a in f8["at_k"]:
            k = a["k"]
            add(pair, comparator, f"FP8 prevalence at K={k}", "seed mean", f"{a['prevalence_percent']}%",
                at(pair, k, "prevalence_mean"))
            add(pair, comparator, f"FP8 >= 2 ulp share among differing non-near-zero at K={k}", "pooled over seeds",
                f"{a['ge2_ulp_share_percent']}%", at(pair, k, "ge2_ulp_share"))
            add(pair, comparator, f"FP8 >= 2 ulp share of all outputs at K={k}", "pooled over seeds",
                f"{a['ge2_ulp_share_of_all_percent']}%", at(pair, k, "ge2_ulp_share_of_all"))
            add(pair, comparator, f"FP8 largest relative difference at K={k}",
                "seed mean of the per-seed maxima (the paper's)", f"{a['max_relative_difference_percent']}%",
                at(pair, k, "max_relative_difference"))
            add(pair, comparator, f"FP8 largest relative difference at K={k}, sensitivity", "max over seeds",
                NOT_COMPARED, at(pair, k, "max_relative_difference_seed_max"))
        low, high = f8["median_relative_difference_range"]
        add(pair, comparator, "FP8 median relative difference, range over K", "seed mean of the per-seed medians",
            f"{low:.1e}–{high:.1e}", _sci_range(mine["median_relative_difference"]))
        top = mine["max_ulp"].max()
        add(pair, comparator, "FP8 max ulp distance, largest over K", "max over seeds and K",
            f"about 1e{f8['max_ulp_orders_above_one']:g}",
            "no differing finite element" if pd.isna(top) else f"{int(top):,}")
        row = _one(summary, pair) if pair else None
        primary, parsimony = ((str(row["selected_model"]), str(row["selected_model_parsimony"]))
                              if row is not None and row["status"] == RUN else ("not run", "not run"))
        add(pair, comparator, "FP8 best model", "lowest held-out RMSE (the paper's rule)", f8["best_model"], primary)
        add(pair, comparator, "FP8 best model, sensitivity",
            "fewest parameters within the parsimony margin of the lowest held-out RMSE", NOT_COMPARED, parsimony)
        sat = _one(fits, pair, model="generalized-saturation") if pair else None
        alpha = None if sat is None or pd.isna(sat["alpha"]) else sat
        add(pair, comparator, "generalized-saturation alpha",
            "seed-jackknife 95% interval; disjoint half ranges; leave-one-K-out range",
            f"{f8['alpha']} ({f8['alpha_stability']})",
            f"{float(alpha['alpha']):.3f} [{float(alpha['alpha_lower']):.3f}, {float(alpha['alpha_upper']):.3f}]; "
            f"halves {float(alpha['alpha_low_half']):.3f} / {float(alpha['alpha_high_half']):.3f}; leave-one-K-out "
            f"{float(alpha['alpha_leave_k_min']):.3f}–{float(alpha['alpha_leave_k_max']):.3f}"
            if alpha is not None else "not run")
    return pd.DataFrame(rows, columns=["quantity", "estimator", "pair", "beside_paper", "paper", "this_run"])


@dataclass(frozen=True)
class Direction:
    """The direction claim "FP8 divergence grows with K, INT8 does not", on the comparator pairs.

    ``*_rejected``: the constant-rate chi-square rejected at ksweep.yaml's alpha (the summary table's
    decision; False where the test is not applicable because the pooled rate is 0 or 1, a constant).
    ``fp8_rises``: the seed-mean prevalence at the largest K exceeds that at the smallest K and the
    constant rate is rejected. ``holds``: FP8 rises and INT8's constant rate is not rejected.
    """

    int8_pair: str
    fp8_pair: str
    int8_chi_square: float | None
    int8_df: int
    int8_p_value: float | None
    int8_rejected: bool
    fp8_chi_square: float | None
    fp8_df: int
    fp8_p_value: float | None
    fp8_rejected: bool
    fp8_k: tuple[int, int]
    fp8_prevalence: tuple[float, float]
    fp8_rises: bool
    holds: bool
    text: str


def _test(row: pd.Series) -> tuple[float | None, int, float | None, bool, str]:
    """(statistic, df, p, rejected, words) of one summary row's constant-rate test."""
    if pd.isna(row["chi_square"]):
        return None, int(row["df"]), None, False, f"constant rate {row['rate_test']}"
    stat, df, p = float(row["chi_square"]), int(row["df"]), float(row["p_value"])
    rejected = bool(row["constant_rate_rejected"])
    return stat, df, p, rejected, (f"constant rate {'rejected' if rejected else 'not rejected'} "
                                   f"(chi-square {stat:.4g}, df {df}, p = {p:.3g})")


def direction(counts: pd.DataFrame, summary: pd.DataFrame, paper: Mapping[str, Any]) -> Direction | None:
    """Whether FP8 divergence grows with K while INT8's does not, on the comparator pairs (``paper_pair``).

    ``counts`` and ``summary``: the stage's tables; ``paper``: ksweep.yaml's ``paper`` block. None
    when no INT8 or no FP8 pair ran (the claim then has nothing to be judged on).
    """
    int8, fp8 = paper_pair(counts, paper, "int8")[0], paper_pair(counts, paper, "fp8")[0]
    if int8 is None or fp8 is None:
        return None
    i_stat, i_df, i_p, i_rej, i_words = _test(summary[summary["pair"] == int8].iloc[0])
    f_stat, f_df, f_p, f_rej, f_words = _test(summary[summary["pair"] == fp8].iloc[0])
    mine = per_k(counts[counts["pair"] == fp8]).sort_values("k")
    first, last = mine.iloc[0], mine.iloc[-1]
    rises = bool(last["prevalence_mean"] > first["prevalence_mean"]) and f_rej
    holds = rises and not i_rej
    text = (f"FP8 divergence grows with K, INT8 does not: {'holds' if holds else 'does not hold'}. {fp8}: "
            f"{_share(float(first['prevalence_mean']))} differ at K={int(first['k'])}, "
            f"{_share(float(last['prevalence_mean']))} at K={int(last['k'])} (seed means), {f_words}; "
            f"{int8}: {i_words}.")
    return Direction(int8, fp8, i_stat, i_df, i_p, i_rej, f_stat, f_df, f_p, f_rej,
                     (int(first["k"]), int(last["k"])),
                     (float(first["prevalence_mean"]), float(last["prevalence_mean"])), rises, holds, text)


def verdicts(summary: pd.DataFrame, fits: pd.DataFrame | None) -> list[str]:
    """One sentence per pair that ran: share differing, the constant-rate test, the model of each rule."""
    lines = []
    for r in summary[summary["status"] == RUN].itertuples():
        text = (f"{r.pair} ({r.arm_a} vs {r.arm_b}): {int(r.differing):,} of {int(r.elements):,} elements differ "
                f"({_share(r.differing / r.elements)}); constant rate over K {r.rate_test}")
        if not pd.isna(r.chi_square):
            text += f" (chi-square {float(r.chi_square):.4g}, df {int(r.df)}, p = {float(r.p_value):.3g})"
        text += (f"; selected model (lowest held-out RMSE): {r.selected_model}; with the parsimony rule "
                 f"(sensitivity): {r.selected_model_parsimony}")
        chosen = _one(fits, r.pair, model=r.selected_model)
        if chosen is not None and not pd.isna(chosen["alpha"]):
            text += (f"; alpha {float(chosen['alpha']):.3f} (seed jackknife 95% [{float(chosen['alpha_lower']):.3f}, "
                     f"{float(chosen['alpha_upper']):.3f}]; disjoint half ranges {float(chosen['alpha_low_half']):.3f}"
                     f" / {float(chosen['alpha_high_half']):.3f})")
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
    comparator = paper_pair(table, paper, "fp8")[0]
    note = (f"This run: {device}; the paper's sweep ran on {paper['device']}; its FP8 values stand beside "
            f"{comparator or 'no pair'}. Bars: min-max over seeds.")
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


BESIDE = "arXiv:2608.13756 Section VII beside this run (every pair; the paper's values on its comparator's rows)"


def section(t: Tables, paper: Mapping[str, Any], doc: Document | None = None) -> list[Block]:
    """The K-sweep section; ``paper`` is ksweep.yaml's ``paper`` block. With ``doc``, the per-K, fit
    and evidence tables go to its appendix and the section links them."""
    blocks: list[Block] = [Heading(HEADING)]
    counts = t.get(stage_spec.table("ksweep", "counts"))
    summary = t.get(stage_spec.table("ksweep", "summary"))
    fits = t.get(stage_spec.table("ksweep", "fits"))
    evidence = t.get(stage_spec.table("ksweep", "evidence"))
    if counts is None:
        blocks.append(Paragraph(NOT_IN_DAG))
        return blocks + [Table(BESIDE, paper_rows(paper, per_k(pd.DataFrame(columns=["pair", "format", "k", "seed",
                                                                                       "status", *_NUMERIC])),
                                                  None, None), ())]
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
        caption = (f"Per pair and K, over seeds ({device}): largest relative difference as the seed mean of the "
                   f"per-seed maxima (the paper's estimator), the max over seeds beside it (sensitivity)")
        if doc is None:
            blocks.append(Table(caption, table, (csrc,)))
        else:
            refs.append(doc.add_appendix(f"K sweep: {caption}", table, (csrc,)))
    blocks.append(Paragraph(" ".join(paper_pair(frame, paper, fmt)[1] for fmt in FORMATS)))
    blocks.append(Table(BESIDE, paper_rows(paper, table, summary[0] if summary else None, fits[0] if fits else None),
                        sources))
    if summary is not None:
        found = direction(frame, summary[0], paper)
        if found is not None:
            blocks.append(Paragraph(found.text))
        blocks.extend(Paragraph(line) for line in verdicts(summary[0], fits[0] if fits else None))
    for got, caption in ((summary, "Constant-rate chi-square over K (counts summed over seeds) and the model each "
                                   "rule selects (lowest held-out RMSE; parsimony sensitivity)"),
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

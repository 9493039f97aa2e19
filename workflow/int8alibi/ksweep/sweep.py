"""The K sweep: INT8 versus FP8 divergence against reduction depth K (ksweep.yaml), and its tables.

Per seed the operands are drawn once; per K both formats are quantized and every registered pair
runs its two arms on the very same operands. The tables hold counts and magnitudes per
pair x K x seed, the ulp histogram, the constant-rate test and the model comparison per pair (the
model each selection rule picks: the primary lowest held-out error and the parsimony sensitivity),
and the evidence of which binaries ran. Without a GPU (or without vLLM for a pair that has no
fallback) the rows say "not run: <why>" and every measurement is null: nothing is emulated in a
binary's place.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from ..arith.bits import bits_equal
from . import fit as fitting
from .arms import Runner, kernel_names, library_evidence, runner
from .operands import Quantized, draw, quantize
from .stats import PairStats, bin_labels, compare

log = logging.getLogger("int8alibi.ksweep")

RUN = "run"
NO_GPU = "not run: no GPU"
# The exact emulation whose epilogue order each INT8 arm follows (a validation, not a pair).
EMULATION_OF = {"vllm-cutlass": "exact-cutlass-order", "cublaslt": "exact-cutlass-order",
                "vllm-triton": "exact-triton-order", "triton": "exact-triton-order"}


def _f(name: str, kind: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, kind, nullable=nullable)


COUNTS_SCHEMA = pa.schema([
    _f("pair", pa.string(), False), _f("format", pa.string(), False), _f("k", pa.int64(), False),
    _f("seed", pa.int64(), False), _f("arm_a", pa.string(), False), _f("arm_b", pa.string(), False),
    _f("status", pa.string(), False), _f("m", pa.int64(), False), _f("n", pa.int64(), False),
    _f("operand_digest", pa.string()), _f("elements", pa.int64()), _f("differing", pa.int64()),
    _f("prevalence", pa.float64()), _f("nonfinite_pairs", pa.int64()), _f("signed_zero_pairs", pa.int64()),
    _f("near_zero_threshold", pa.float64()), _f("near_zero_elements", pa.int64()),
    _f("differing_near_zero", pa.int64()), _f("differing_non_near_zero", pa.int64()),
    _f("ge2_ulp_non_near_zero", pa.int64()), _f("ge2_ulp_share", pa.float64()),
    _f("ge2_ulp_share_of_all", pa.float64()), _f("max_ulp", pa.int64()), _f("max_relative_difference", pa.float64()),
    _f("median_relative_difference", pa.float64()), _f("a_repeatable", pa.bool_()), _f("b_repeatable", pa.bool_()),
    _f("a_equals_emulation", pa.bool_()), _f("b_equals_emulation", pa.bool_()),
])
COUNTS_KEY = ["pair", "k", "seed"]

ULP_SCHEMA = pa.schema([
    _f("pair", pa.string(), False), _f("k", pa.int64(), False), _f("seed", pa.int64(), False),
    _f("region", pa.string(), False), _f("bin_lower", pa.int64(), False), _f("bin_upper", pa.int64()),
    _f("count", pa.int64(), False),
])
ULP_KEY = ["pair", "k", "seed", "region", "bin_lower"]

FITS_SCHEMA = pa.schema([
    _f("pair", pa.string(), False), _f("model", pa.string(), False), _f("status", pa.string(), False),
    _f("parameters", pa.int64(), False), _f("c", pa.float64()), _f("a", pa.float64()), _f("b", pa.float64()),
    _f("alpha", pa.float64()), _f("train_rmse", pa.float64()), _f("heldout_rmse", pa.float64()),
    _f("selected", pa.bool_()), _f("selected_parsimony", pa.bool_()), _f("alpha_jackknife_se", pa.float64()),
    _f("alpha_lower", pa.float64()), _f("alpha_upper", pa.float64()), _f("alpha_low_half", pa.float64()),
    _f("alpha_high_half", pa.float64()), _f("alpha_leave_k_min", pa.float64()), _f("alpha_leave_k_max", pa.float64()),
])
FITS_KEY = ["pair", "model"]

SUMMARY_SCHEMA = pa.schema([
    _f("pair", pa.string(), False), _f("format", pa.string(), False), _f("arm_a", pa.string(), False),
    _f("arm_b", pa.string(), False), _f("status", pa.string(), False), _f("elements", pa.int64()),
    _f("differing", pa.int64()), _f("chi_square", pa.float64()), _f("df", pa.int64()), _f("p_value", pa.float64()),
    _f("constant_rate_rejected", pa.bool_()), _f("rate_test", pa.string(), False),
    _f("selected_model", pa.string()), _f("selected_model_parsimony", pa.string()), _f("saturating", pa.bool_()),
])
SUMMARY_KEY = ["pair"]

EVIDENCE_SCHEMA = pa.schema([
    _f("pair", pa.string(), False), _f("arm", pa.string(), False), _f("item", pa.string(), False),
    _f("value", pa.string(), False),
])
EVIDENCE_KEY = ["pair", "arm", "item"]


def frame(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pd.DataFrame:
    """Rows as object columns, so a None stays a null in every column type."""
    return pd.DataFrame({f.name: pd.Series([r.get(f.name) for r in rows], dtype=object) for f in schema})


def choose_arms(pair: Mapping[str, Any], device: torch.device) -> tuple[list[str], dict[str, Runner] | None, str]:
    """(arm names, their runners or None, status): the registered arms, else the fallback, else why not."""
    reasons = []
    for arms in (pair["arms"], pair["fallback"]):
        if arms is None:
            continue
        found = {name: runner(name, pair["format"], device) for name in arms}
        if all(r is not None for r, _ in found.values()):
            return list(arms), {name: r for name, (r, _) in found.items() if r is not None}, RUN
        reasons.append("; ".join(f"{name}: {why}" for name, (r, why) in found.items() if r is None))
    status = NO_GPU if all(NO_GPU in r for r in reasons) else (
        "not run: vLLM absent" if any("vLLM absent" in r for r in reasons) else f"not run: {reasons[0]}")
    return list(pair["arms"]), None, status


def _stat_row(s: PairStats) -> dict[str, Any]:
    return {"elements": s.elements, "differing": s.differing, "prevalence": s.prevalence,
            "nonfinite_pairs": s.nonfinite_pairs, "signed_zero_pairs": s.signed_zero_pairs,
            "near_zero_threshold": s.near_zero_threshold, "near_zero_elements": s.near_zero_elements,
            "differing_near_zero": s.differing_near_zero, "differing_non_near_zero": s.differing_non_near_zero,
            "ge2_ulp_non_near_zero": s.ge2_ulp_non_near_zero, "ge2_ulp_share": s.ge2_ulp_share,
            "ge2_ulp_share_of_all": s.ge2_ulp_share_of_all, "max_ulp": s.max_ulp,
            "max_relative_difference": s.max_relative_difference,
            "median_relative_difference": s.median_relative_difference}


def _measure(names: Sequence[str], runners: Mapping[str, Runner], q: Quantized, fmt: str,
             outputs: dict[tuple[str, str], tuple[torch.Tensor, bool]], emulators: Mapping[str, Any],
             fraction: float, edges: Sequence[int]) -> tuple[PairStats, dict[str, Any]]:
    """One pair on one K's operands: its statistics and counts fields (each arm run twice, once per K and
    format, its outputs kept in ``outputs`` for the other pairs; INT8 arms checked against their emulation)."""
    for name in names:
        if (fmt, name) not in outputs:
            first, second = runners[name](q), runners[name](q)
            outputs[(fmt, name)] = (first, bits_equal(first, second))
    (ya, rep_a), (yb, rep_b) = outputs[(fmt, names[0])], outputs[(fmt, names[1])]
    s = compare(ya, yb, near_zero_fraction=fraction, edges=edges)
    fields: dict[str, Any] = {**_stat_row(s), "a_repeatable": rep_a, "b_repeatable": rep_b}
    if fmt == "int8":
        for side, name, y in (("a", names[0], ya), ("b", names[1], yb)):
            emulated = emulators[EMULATION_OF[name]].scaled_mm(q.a_q, q.w_q, q.s_a, q.s_w)
            fields[f"{side}_equals_emulation"] = bits_equal(y, emulated)
    return s, fields


def _ulp_rows(pair: str, k: int, seed: int, s: PairStats, edges: Sequence[int]) -> list[dict[str, Any]]:
    return [{"pair": pair, "k": k, "seed": seed, "region": region, "bin_lower": lo, "bin_upper": hi, "count": count}
            for region, hist in s.histogram.items() for (lo, hi), count in zip(bin_labels(edges), hist)]


def _status_evidence(spec: Mapping[str, Any],
                     chosen: Mapping[str, tuple[list[str], dict[str, Runner] | None, str]]) -> list[dict[str, Any]]:
    """The libraries, then each pair's status and arms."""
    evidence = [{"pair": "*", "arm": "*", "item": key, "value": value} for key, value in library_evidence().items()]
    for p in spec["pairs"]:
        names, _, status = chosen[p["id"]]
        evidence.append({"pair": p["id"], "arm": "*", "item": "status", "value": status})
        evidence.append({"pair": p["id"], "arm": "*", "item": "arms", "value": ",".join(names)})
    return evidence


def sweep(spec: Mapping[str, Any], device: torch.device) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                    list[dict[str, Any]]]:
    """(counts rows, ulp rows, evidence rows) of the whole grid; pairs that cannot run get status rows."""
    grid, stats_spec = spec["grid"], spec["statistics"]
    edges, fraction = stats_spec["ulp_bins"], stats_spec["near_zero"]["fraction"]
    m, n, ks, seeds = grid["m"], grid["n"], grid["k"], grid["seeds"]
    chosen = {p["id"]: choose_arms(p, device) for p in spec["pairs"]}
    counts: list[dict[str, Any]] = []
    ulps: list[dict[str, Any]] = []
    evidence = _status_evidence(spec, chosen)
    emulators = {}
    if device.type == "cuda" and torch.cuda.is_available():
        from ..kernels.registry import get

        emulators = {name: get(name, device) for name in sorted(set(EMULATION_OF.values()))}
    for seed in seeds:
        d = draw(seed, m, n, max(ks)) if any(c[1] is not None for c in chosen.values()) else None
        digest = d.digest() if d is not None else None
        for k in ks:
            operands: dict[str, Quantized] = {}
            outputs: dict[tuple[str, str], tuple[torch.Tensor, bool]] = {}
            for p in spec["pairs"]:
                names, runners, status = chosen[p["id"]]
                row: dict[str, Any] = {"pair": p["id"], "format": p["format"], "k": k, "seed": seed,
                                       "arm_a": names[0], "arm_b": names[1], "status": status, "m": m, "n": n}
                if runners is None or d is None:
                    counts.append(row)
                    continue
                fmt = p["format"]
                if fmt not in operands:
                    operands[fmt] = quantize(d, k, fmt, device)
                q = operands[fmt]
                s, fields = _measure(names, runners, q, fmt, outputs, emulators, fraction, edges)
                counts.append({**row, **fields, "operand_digest": digest})
                ulps += _ulp_rows(p["id"], k, seed, s, edges)
                if seed == seeds[0] and k == spec["models"]["exponent_interval"]["half_split_k"]:
                    evidence += [{"pair": p["id"], "arm": name, "item": f"cuda_kernels_at_k{k}",
                                  "value": kernel_names(runners[name], q)} for name in names]
                log.info("%s K=%d seed=%d: %d of %d differ (%.4g%%), max ulp %s", p["id"], k, seed, s.differing,
                         s.elements, 100 * s.prevalence, s.max_ulp)
    return counts, ulps, evidence


def half_ranges(k: np.ndarray, split: int) -> tuple[np.ndarray, np.ndarray]:
    """The two disjoint half ranges of ksweep.yaml: K <= split and K > split (no point in both)."""
    return k <= split, k > split


def _alpha_fits(model: str, k: np.ndarray, p: np.ndarray, seeds: np.ndarray, split: int,
                level: float, alpha: float) -> dict[str, Any]:
    """The exponent's seed jackknife interval, disjoint half-range refits and leave-one-K-out range."""
    loo = [fitting.fit(model, k[seeds != s], p[seeds != s]).params["alpha"] for s in np.unique(seeds)]
    se, lower, upper = fitting.jackknife(loo, alpha, level)
    by_k = [fitting.fit(model, k[k != kk], p[k != kk]).params["alpha"] for kk in np.unique(k)]
    low, high = half_ranges(k, split)
    return {"alpha_jackknife_se": se, "alpha_lower": lower, "alpha_upper": upper,
            "alpha_low_half": fitting.fit(model, k[low], p[low]).params["alpha"],
            "alpha_high_half": fitting.fit(model, k[high], p[high]).params["alpha"],
            "alpha_leave_k_min": min(by_k), "alpha_leave_k_max": max(by_k)}


class Selected(NamedTuple):
    """One pair's model under each registered rule: the primary (lowest held-out error) and the sensitivity."""

    primary: str
    parsimony: str


def model_rows(spec: Mapping[str, Any], counts: pd.DataFrame) -> tuple[list[dict[str, Any]], dict[str, Selected]]:
    """(fits rows, pair -> selected models) for every pair; pairs that did not run get status rows."""
    models = spec["models"]
    interval = models["exponent_interval"]
    rows: list[dict[str, Any]] = []
    selected: dict[str, Selected] = {}
    for p in spec["pairs"]:
        got = counts[(counts["pair"] == p["id"]) & (counts["status"] == RUN)]
        if got.empty:
            status = counts.loc[counts["pair"] == p["id"], "status"].iloc[0]
            rows.extend({"pair": p["id"], "model": c["id"], "status": status, "parameters": len(c["parameters"])}
                        for c in models["candidates"])
            continue
        k = got["k"].to_numpy(dtype=float)
        prev = got["prevalence"].to_numpy(dtype=float)
        seeds = got["seed"].to_numpy(dtype=int)
        held = {c["id"]: fitting.held_out_rmse(c["id"], k, prev) for c in models["candidates"]}
        chosen = selected[p["id"]] = Selected(
            fitting.select_lowest(held), fitting.select_parsimonious(held, models["selection"]["parsimony_sensitivity"]))
        for c in models["candidates"]:
            result = fitting.fit(c["id"], k, prev)
            row = {"pair": p["id"], "model": c["id"], "status": RUN, "parameters": len(c["parameters"]),
                   **result.params, "train_rmse": result.rmse, "heldout_rmse": held[c["id"]],
                   "selected": c["id"] == chosen.primary, "selected_parsimony": c["id"] == chosen.parsimony}
            if "alpha" in result.params:
                row.update(_alpha_fits(c["id"], k, prev, seeds, interval["half_split_k"], interval["level"],
                                       result.params["alpha"]))
            rows.append(row)
    return rows, selected


def summary_rows(spec: Mapping[str, Any], counts: pd.DataFrame,
                 selected: Mapping[str, Selected]) -> list[dict[str, Any]]:
    """Per pair: the constant-rate chi-square over K (counts summed over seeds) and the model of each rule."""
    alpha = spec["statistics"]["int8_constant_rate_test"]["alpha"]
    rows = []
    for p in spec["pairs"]:
        mine = counts[counts["pair"] == p["id"]]
        got = mine[mine["status"] == RUN]
        row: dict[str, Any] = {"pair": p["id"], "format": p["format"], "arm_a": mine["arm_a"].iloc[0],
                               "arm_b": mine["arm_b"].iloc[0], "status": mine["status"].iloc[0]}
        if got.empty:
            rows.append({**row, "rate_test": row["status"]})
            continue
        by_k = got.groupby("k", sort=True)[["differing", "elements"]].sum()
        test = fitting.constant_rate_test(by_k["differing"].tolist(), by_k["elements"].tolist())
        row.update(elements=test.elements, differing=test.differing, chi_square=test.statistic, df=test.df,
                   p_value=test.p_value, selected_model=selected[p["id"]].primary,
                   selected_model_parsimony=selected[p["id"]].parsimony,
                   saturating=selected[p["id"]].primary == "generalized-saturation")
        if test.statistic is None:
            row["rate_test"] = "not applicable: the pooled rate is 0 or 1"
        else:
            row["constant_rate_rejected"] = test.p_value < alpha
            row["rate_test"] = "rejected" if test.p_value < alpha else "not rejected"
        rows.append(row)
    return rows


# Each table the sweep writes, by name: its schema and key (the file is ``<name>.parquet``).
TABLES: dict[str, tuple[pa.Schema, list[str]]] = {
    "counts": (COUNTS_SCHEMA, COUNTS_KEY), "ulp": (ULP_SCHEMA, ULP_KEY), "fits": (FITS_SCHEMA, FITS_KEY),
    "summary": (SUMMARY_SCHEMA, SUMMARY_KEY), "evidence": (EVIDENCE_SCHEMA, EVIDENCE_KEY),
}


def sweep_tables(spec: Mapping[str, Any], device: torch.device) -> dict[str, pd.DataFrame]:
    """The five tables by name (``TABLES``): the sweep on ``device``, then the fits and summary of its counts."""
    counts_rows, ulp_rows, evidence_rows = sweep(spec, device)
    counts = frame(counts_rows, COUNTS_SCHEMA)
    fits_rows, selected = model_rows(spec, counts)
    return {"counts": counts, "ulp": frame(ulp_rows, ULP_SCHEMA), "fits": frame(fits_rows, FITS_SCHEMA),
            "summary": frame(summary_rows(spec, counts, selected), SUMMARY_SCHEMA),
            "evidence": frame(evidence_rows, EVIDENCE_SCHEMA)}

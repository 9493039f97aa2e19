"""The papers' claims (preregistration/paper.yaml) beside this run's values, with a verdict that says
what was tested.

Each claim names a ``measure``; this module computes that measure from the run's tables. The verdict
follows the claim's ``kind``: a structural claim is "reproduced" or "not reproduced", except that one
whose outcome depends on the two kernel arms (``evidence: kernels``) holds by construction when both
arms are exact emulations, and says so; a magnitude is compared only on the paper's own model
("magnitude: no verdict (other model)" elsewhere); a protocol claim is read back from the protocol
files, not measured; a result this pipeline has no analogue of is "not computed here". A measure whose
table the run did not produce says so ("not applicable: ..."), never a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..errors import ProtocolError
from .measures import DIVISION_COLUMNS, decision_row, division_summary, summary_row
from .sections import Tables

EPILOGUE = ("F1", "F2", "F3", "F4", "F5")
UNDETECTED_EPILOGUE = ("F1", "F2", "F3", "F5")
CONSTRUCTION = "holds by construction (emulated arms)"
OTHER_MODEL = "magnitude: no verdict (other model)"
NOT_COMPUTED = "not computed here"


@dataclass(frozen=True)
class Measured:
    """This run's value of a measure: shown text, a number to compare (None: not numeric), and
    whether a structural claim holds (None: not decidable here, ``why`` says why)."""

    text: str
    number: float | None = None
    holds: bool | None = None
    why: str = ""
    source: str = ""


def _na(why: str) -> Measured:
    return Measured("—", holds=None, why=f"not applicable: {why}")


class _Unavailable(Exception):
    """The table a measure reads is not in this run, or was written before a column it reads existed."""


def _table(t: Tables, rel: str, columns: tuple[str, ...] = ()) -> tuple[pd.DataFrame, str]:
    got = t.get(rel)
    if got is None:
        raise _Unavailable(f"{rel} was not produced")
    missing = [c for c in columns if c not in got[0].columns]
    if missing:
        raise _Unavailable(f"{rel} has no column {missing[0]!r} (written before it existed: rerun its stage)")
    return got[0], rel


def _pct(value: float, digits: int = 2) -> str:
    return f"{100 * value:+.{digits}f}%"


# ---- fault campaign ----

def _totals(t: Tables, definition: str, quantity: str) -> Measured:
    df, rel = _table(t, "faults/totals.parquet", ("definition", "matrix", "quantity", "value"))
    row = df[(df["definition"] == definition) & (df["matrix"] == "both") & (df["quantity"] == quantity)]
    if len(row) != 1:
        return _na(f"{rel} has no {quantity} under the {definition} definition")
    value = int(row["value"].iloc[0])
    return Measured(f"{value:,}", float(value), source=rel)


def _scorecard(t: Tables, definition: str, matrix: str, check: int, column: str) -> Measured:
    df, rel = _table(t, "faults/scorecard.parquet", ("definition", "matrix", "check"))
    row = df[(df["definition"] == definition) & (df["matrix"] == matrix) & (df["check"] == check)]
    if len(row) != 1 or column not in df:
        return _na(f"{rel} has no {matrix} check {check} {column} under the {definition} definition")
    value = row[column].iloc[0]
    if value is None or pd.isna(value):
        return _na(f"check {check}'s {column} has an empty denominator in this run")
    if column.endswith("_rate"):
        return Measured(f"{100 * float(value):.2f}%", 100 * float(value), source=rel)
    return Measured(f"{int(value):,}", float(value), source=rel)


def _corrected_without_errors(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "faults/scorecard.parquet", ("definition", "matrix", "fp", "fn"))
    part = df[(df["definition"] == definition) & (df["matrix"] == "corrected")]
    if part.empty:
        return _na(f"{rel} has no corrected rows under the {definition} definition")
    fp, fn = int(part["fp"].sum()), int(part["fn"].sum())
    return Measured(f"{fp:,} false positives, {fn:,} false negatives", float(fp + fn), holds=fp == fn == 0, source=rel)


def _detection(t: Tables, definition: str, fault: str, regime: str | None) -> Measured:
    df, rel = _table(t, "faults/detection.parquet", ("definition", "fault", "regime", "cells", "observable", "detected"))
    rows = df[(df["definition"] == definition) & (df["fault"] == fault)]
    if regime is not None:
        rows = rows[rows["regime"] == regime]
    if rows.empty:
        return _na(f"{rel} has no {fault} row under the {definition} definition")
    cells, observable, detected = (int(rows[c].sum()) for c in ("cells", "observable", "detected"))
    return Measured(f"{cells:,} / {observable:,} / {detected:,}", float(detected), source=rel)


def _epilogue_ulp(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "faults/ulp_distribution.parquet")
    ulps = df[df["fault"].isin(EPILOGUE)]["max_ulp"].dropna()
    if ulps.empty:
        return _na("no epilogue cell has a finite output pair")
    low, high = int(ulps.min()), int(ulps.max())
    return Measured(f"max ulp {low}–{high}", float(high), holds=high <= 1, source=rel)


def _ulp_range(t: Tables, fault: str) -> Measured:
    df, rel = _table(t, "faults/ulp_distribution.parquet")
    ulps = df[df["fault"] == fault]["max_ulp"].dropna()
    if ulps.empty:
        return _na(f"no {fault} cell has a finite output pair")
    return Measured(f"{int(ulps.min()):,}–{int(ulps.max()):,}", float(ulps.max()), source=rel)


def _f8_silent(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "faults/cells.parquet")
    f8 = df[df["fault"] == "F8"]
    if f8.empty:
        return _na("the campaign ran no F8 cell")
    fired = int((f8["applicable"] & f8["fired"].fillna(False).astype(bool)).sum())
    return Measured(f"{fired:,} of {len(f8):,} applicable check verdicts fired", float(fired), holds=fired == 0,
                    source=rel)


def _always_caught(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "faults/detection.parquet", ("definition", "fault", "detected", "cells"))
    rows = df[(df["definition"] == definition) & df["fault"].isin(["F6", "F7", "F9"])]
    if rows.empty:
        return _na("the campaign ran no F6, F7 or F9 cell")
    parts = [f"{r.fault} {r.detected:,}/{r.cells:,}" for r in rows.itertuples()]
    return Measured(", ".join(parts), holds=bool((rows["detected"] == rows["cells"]).all()), source=rel)


def _epilogue_undetected(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "faults/detection.parquet", ("definition", "fault", "detected", "cells"))
    rows = df[(df["definition"] == definition) & df["fault"].isin(UNDETECTED_EPILOGUE)]
    if rows.empty:
        return _na("the campaign ran no F1, F2, F3 or F5 cell")
    per = rows.groupby("fault", sort=True)[["detected", "cells"]].sum()
    parts = [f"{f} {int(r.detected):,}/{int(r.cells):,}" for f, r in per.iterrows()]
    return Measured("detected in " + ", ".join(parts), holds=bool((per["detected"] == 0).all()), source=rel)


def _fired_cells(cells: pd.DataFrame) -> pd.Series:
    """Per cell (layer, fault, severity, regime): whether any applicable check fired."""
    hit = cells["applicable"].astype(bool) & cells["fired"].fillna(False).astype(bool)
    return hit.groupby([cells["layer"], cells["fault"], cells["severity"], cells["regime"]]).any()


def _epilogue_cells_undetected(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "faults/cells.parquet", ("layer", "fault", "severity", "regime", "applicable", "fired"))
    part = df[df["fault"].isin(UNDETECTED_EPILOGUE)]
    if part.empty:
        return _na("the campaign ran no F1, F2, F3 or F5 cell")
    per = _fired_cells(part)
    silent = int((~per).sum())
    return Measured(f"{silent:,} of {len(per):,} cells", float(silent), source=rel)


def _d1_strict(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "faults/decisions.parquet")
    r = decision_row(df, "D1", definition)
    if r is None:
        return _na(f"{rel} has no D1 row under the {definition} definition")
    text = ("triggered: no check caught an epilogue fault" if r["triggered"]
            else f"not triggered: caught {r['caught_by']}")
    return Measured(text, holds=not bool(r["triggered"]), source=rel)


def real_scale_catches(cells: pd.DataFrame) -> pd.DataFrame:
    """Observable own-scale epilogue cells and whether some applicable check fired on each."""
    part = cells[cells["fault"].isin(EPILOGUE) & (cells["regime"] == "own") & cells["observable"].astype(bool)]
    return _fired_cells(part).rename("caught").reset_index()


def _d1_real_scales(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "faults/cells.parquet", ("layer", "fault", "severity", "regime", "observable", "applicable",
                                                 "fired"))
    per = real_scale_catches(df)
    if per.empty:
        return _na("no observable epilogue cell under own scales")
    caught = per[per["caught"]]
    if caught.empty:
        return Measured(f"triggered: no check caught any of {len(per):,} observable own-scale epilogue cells",
                        holds=True, source=rel)
    by = ", ".join(f"{f}: {n:,}" for f, n in caught.groupby("fault").size().items())
    return Measured(f"not triggered: caught {len(caught):,} of {len(per):,} own-scale cells ({by})", holds=False,
                    source=rel)


# ---- layer level ----

def _prediction(t: Tables, column: str) -> Measured:
    df, rel = _table(t, "prediction/predictions.parquet", ("max_abs_acc", "headroom_bits"))
    if df.empty:
        return _na(f"{rel} is empty")
    if column == "min_headroom_bits":
        value = float(df["headroom_bits"].min())
        return Measured(f"{value:.2f} bits ({len(df):,} layer captures)", value, source=rel)
    value = int(df["max_abs_acc"].max())
    return Measured(f"{value:,}", float(value), source=rel)


def _all_rows(column: str, what: str) -> Callable[[Tables, str], Measured]:
    def measure_(t: Tables, definition: str) -> Measured:
        df, rel = _table(t, "prediction/predictions.parquet", (column,))
        if df.empty:
            return _na(f"{rel} is empty")
        held = int(df[column].astype(bool).sum())
        return Measured(f"{held:,} of {len(df):,} layer captures {what}", float(held), holds=held == len(df),
                        source=rel)
    return measure_


def _compare_rows(t: Tables, setting: str) -> tuple[pd.DataFrame, str]:
    df, rel = _table(t, "compare/summary.parquet", ("setting", "phase", "layers", "layers_identical"))
    rows = df[(df["setting"] == setting) & (df["phase"] == "prefill")]
    if rows.empty:
        raise _Unavailable(f"{rel} has no {setting} prefill row")
    return rows, rel


def _compare(t: Tables, setting: str, column: str) -> Measured:
    rows, rel = _compare_rows(t, setting)
    r = rows.iloc[0]
    if column == "layers_differing":
        return Measured(f"{int(r.layers_differing):,} of {int(r.layers):,} (prefill)", float(r.layers_differing),
                        source=rel)
    if column == "layers_identical":
        return Measured(f"{int(r.layers_identical):,}/{int(r.layers):,} (prefill)", float(r.layers_identical),
                        source=rel)
    if column == "differing_per_million":
        return Measured(f"{float(r.differing_per_million):.2f} per million (prefill)", float(r.differing_per_million),
                        source=rel)
    raise ProtocolError(f"preregistration/paper.yaml: unknown compare column {column!r}")


def _real_max_ulp(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "compare/summary.parquet", ("setting", "max_ulp"))
    ulps = df[df["setting"] == "real"]["max_ulp"].dropna()
    if ulps.empty:
        return _na(f"{rel} has no real-scale pair of finite outputs")
    high = int(ulps.max())
    return Measured(f"max ulp {high} (prefill and decode)", float(high), holds=high <= 1, source=rel)


def _pow2_identical(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "compare/summary.parquet")
    rows = df[df["setting"].astype(str).str.startswith("pow2")]
    if rows.empty:
        return _na("no power-of-two setting was compared")
    same, total = int(rows["layers_identical"].sum()), int(rows["layers"].sum())
    return Measured(f"{same:,} of {total:,} layer comparisons identical", float(same), holds=same == total, source=rel)


def _pow2_requant_identical(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "compare/summary.parquet")
    rows = df[df["setting"] == "pow2-requant"]
    if rows.empty:
        return _na(f"{rel} has no pow2-requant row")
    same, total = int(rows["layers_identical"].sum()), int(rows["layers"].sum())
    return Measured(f"{same:,}/{total:,} layer comparisons", float(same), holds=same == total, source=rel)


# ---- requantization ----

def _division(t: Tables, statistic: str) -> Measured:
    """The float32-versus-bf16 division statistics over the own arm's layers (quant.division)."""
    df, rel = _table(t, "requant/gate.parquet", DIVISION_COLUMNS)
    d = division_summary(df)
    if d is None:
        return _na(f"{rel} has no own rows")
    if statistic == "f32_division_differing_share":
        share = d.share_percent
        return Measured(f"{share:.2f}% ({d.differing:,} of {d.weights:,} int8 weights)", share, source=rel)
    return Measured(f"{d.code_offset_max:.3f} (the bf16 rounding of the quotient alone: {d.quotient_shift_max:.3f})",
                    d.code_offset_max, source=rel)


def _probe_scales(t: Tables) -> Measured:
    df, rel = _table(t, "requant/gate.parquet", ("arm", "n"))
    probe = df[df["arm"] == "probe"]
    if probe.empty:
        return _na(f"{rel} has no probe rows")
    n = int(probe["n"].sum())
    return Measured(f"{n:,} (every weight scale of {len(probe):,} layers)", float(n), source=rel)


def _gate_identical(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "requant/gate.parquet", ("arm", "bytes_equal"))
    own = df[df["arm"] == "own"]
    if own.empty or own["bytes_equal"].isna().all():
        return _na("the gate had no independent reference (self-built checkpoint)")
    equal = int(own["bytes_equal"].fillna(False).astype(bool).sum())
    return Measured(f"{equal:,} of {len(own):,} layers byte-identical to the reference", float(equal),
                    holds=equal == len(own), source=rel)


# ---- end to end ----

def _arms(t: Tables, checkpoint: str) -> Measured:
    df, rel = _table(t, "determinism/agreement.parquet", ("checkpoint", "comparison", "identical"))
    rows = df[(df["checkpoint"] == checkpoint) & (df["comparison"] == "arms")]
    if rows.empty:
        return _na(f"{rel} has no {checkpoint} rows")
    same = int(rows["identical"].sum())
    return Measured(f"{same}/{len(rows)}", float(same), holds=same == len(rows), source=rel)


def _arms_identical(checkpoint: str) -> Callable[[Tables, str], Measured]:
    def measure_(t: Tables, definition: str) -> Measured:
        got = _arms(t, checkpoint)
        return got if got.why else Measured(f"{got.text} sequences identical across arms", got.number, got.holds,
                                            source=got.source)
    return measure_


def _self_consistent(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "determinism/agreement.parquet", ("checkpoint", "comparison", "identical"))
    rows = df[df["comparison"].astype(str).str.startswith("runs-of-")]
    if rows.empty:
        return _na(f"{rel} has no run-against-run rows")
    same = int(rows["identical"].sum())
    return Measured(f"{same}/{len(rows)} sequences identical run against run (every arm and checkpoint)", float(same),
                    holds=same == len(rows), source=rel)


def _prefill_decode(t: Tables, checkpoint: str) -> Measured:
    """The flip rate over both arms' generated positions (the paper's is one arm's); each arm's in the text."""
    df, rel = _table(t, "prefill_decode/prefill_decode.parquet", ("checkpoint", "arm", "flips", "positions"))
    rows = df[df["checkpoint"] == checkpoint]
    if rows.empty:
        return _na(f"{rel} has no {checkpoint} rows")
    parts = [f"{r.arm} {r.flips:,}/{r.positions:,} ({100 * r.flip_rate:.1f}%, {100 * r.level:.0f}% interval "
             f"{100 * r.flip_rate_low:.1f}–{100 * r.flip_rate_high:.1f}%)" for r in rows.itertuples()]
    rate = 100 * float(rows["flips"].sum()) / float(rows["positions"].sum())
    return Measured("; ".join(parts), rate, source=rel)


# ---- tokens ----

def _tokens(t: Tables, regime: str, quantity: str) -> Measured:
    if quantity in ("flip_rate", "positions"):
        df, rel = _table(t, "tokens/pairs.parquet", ("comparison", "regime", "flips", "positions"))
        rows = df[(df["comparison"] == "kernels") & (df["regime"] == regime)]
        if rows.empty:
            return _na(f"{rel} has no kernel-pair {regime} row")
        r = rows.iloc[0]
        if quantity == "positions":
            return Measured(f"{int(r.positions):,}", float(r.positions), source=rel)
        return Measured(f"{100 * float(r.flip_rate):.1f}% ({int(r.flips):,} of {int(r.positions):,})",
                        100 * float(r.flip_rate), source=rel)
    df, rel = _table(t, "tokens/predictor.parquet", ("comparison", "regime", "quantity", "value"))
    rows = df[(df["comparison"] == "kernels") & (df["regime"] == regime)]
    values = dict(zip(rows["quantity"], rows["value"]))
    if quantity == "auc":
        auc = values.get("auc")
        if auc is None or pd.isna(auc):
            return _na("the AUC is not evaluable in this run (no flip or no non-flip)")
        return Measured(f"{float(auc):.3f}", float(auc), source=rel)
    brier_map, base = values.get("brier_map"), values.get("brier_baseline")
    if brier_map is None or base is None or pd.isna(brier_map) or pd.isna(base):
        return _na("the held-out Brier scores are not evaluable in this run")
    return Measured(f"{float(brier_map):.4f} vs {float(base):.4f}", float(brier_map), source=rel)


# ---- perplexity ----

def _perplexity_row(t: Tables, quantity: str, arm: str) -> tuple[pd.Series, str]:
    df, rel = _table(t, "perplexity/summary.parquet", ("quantity", "arm", "value", "low", "high"))
    row = df[(df["quantity"] == quantity) & (df["arm"] == arm)]
    if len(row) != 1 or pd.isna(row["value"].iloc[0]):
        raise _Unavailable(f"{rel} has no {quantity} value for {arm}")
    return row.iloc[0], rel


def _perplexity(t: Tables, arm: str, what: str) -> Measured:
    if arm == "mismatch_share":
        r, rel = _perplexity_row(t, "mismatch_share", "probe")
        return Measured(f"{100 * float(r.value):.1f}%", 100 * float(r.value), source=rel)
    r, rel = _perplexity_row(t, "relative_change_vs_own", arm)
    low, high = float(r.low), float(r.high)
    interval = f"[{_pct(low)}, {_pct(high)}]"
    if what == "interval":
        covers = "covers zero" if low <= 0 <= high else "excludes zero"
        return Measured(f"{interval}: {covers}; upper end {_pct(high)}", 100 * high, source=rel)
    return Measured(f"{_pct(float(r.value))} {interval}", 100 * float(r.value), source=rel)


def _hypothesis(t: Tables, definition: str) -> Measured:
    """H1 with both arms' changes and the clipping that explains the direction on this model."""
    df, rel = _table(t, "perplexity/summary.parquet")
    row = summary_row(df, "hypothesis:H1")
    if row is None:
        return _na(f"{rel} has no H1 row")
    verdict = str(row["verdict"]).split(":")[0]
    arms = []
    for arm in ("pow2-ceiling", "pow2-nearest"):
        r = df[(df["quantity"] == "relative_change_vs_own") & (df["arm"] == arm)]
        if len(r) == 1:
            arms.append(f"{arm.removeprefix('pow2-')} {_pct(float(r['value'].iloc[0]))}")
    text = f"{verdict} ({' vs '.join(arms)})"
    gate = t.get("requant/gate.parquet")
    if gate is not None and "clipped" in gate[0].columns:
        clipped = gate[0].groupby("arm")["clipped"].sum()
        if {"pow2-nearest", "pow2-ceiling"} <= set(clipped.index):
            text += (f"; weights clipped: {int(clipped['pow2-nearest']):,} under nearest, "
                     f"{int(clipped['pow2-ceiling']):,} under ceiling")
    return Measured(text, float(row["value"]), source=rel)


def _gate_g1(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "perplexity/summary.parquet")
    row = summary_row(df, "gate:G1")
    if row is None:
        return _na(f"{rel} has no G1 row")
    verdict = str(row["verdict"])
    shown = "not run (gate not triggered)" if verdict == "gate not triggered" else verdict
    return Measured(f"{shown}; ceiling {_pct(float(row['value']))}", source=rel)


# ---- K sweep (GPU only) ----

def _ksweep(t: Tables, fmt: str, quantity: str) -> Measured:
    from .ksweep import RUN, per_k

    counts = t.get("ksweep/counts.parquet")
    if counts is None:
        return _na("the K sweep is GPU only and this run has no ksweep/ tables")
    frame = counts[0]
    table = per_k(frame[frame["pair"].astype(str).str.startswith(fmt)])
    if table.empty:
        return _na(f"no {fmt.upper()} pair of the K sweep ran ({', '.join(sorted(set(frame['status'])))})")
    pair = sorted(table["pair"].unique())[0]
    mine = table[table["pair"] == pair].sort_values("k")
    rel = "ksweep/counts.parquet"
    first, last = mine.iloc[0], mine.iloc[-1]
    if quantity == "differing_total":
        return Measured(f"{int(mine['differing'].sum()):,} ({pair}, {int(mine['seeds'].max())} seeds)",
                        float(mine["differing"].sum()), source=rel)
    if quantity == "per_million_range":
        return Measured(f"{mine['per_million'].min():.2f}–{mine['per_million'].max():.2f} ({pair})", source=rel)
    if quantity == "prevalence_range":
        return Measured(f"{100 * first.prevalence_mean:.1f}% → {100 * last.prevalence_mean:.1f}% ({pair})", source=rel)
    if quantity == "ge2_ulp_range":
        return Measured(f"{100 * first.ge2_ulp_share:.0f}% → {100 * last.ge2_ulp_share:.0f}% ({pair})", source=rel)
    if quantity == "max_relative_range":
        return Measured(f"{100 * first.max_relative_difference:.0f}% → {100 * last.max_relative_difference:.0f}% "
                        f"({pair}, largest over seeds)", source=rel)
    if quantity == "chi_square":
        summary = t.get("ksweep/summary.parquet")
        rows = None if summary is None else summary[0][(summary[0]["pair"] == pair) & (summary[0]["status"] == RUN)]
        if rows is None or rows.empty or pd.isna(rows["chi_square"].iloc[0]):
            return _na("the constant-rate test was not evaluated")
        r = rows.iloc[0]
        return Measured(f"{float(r.chi_square):.2f} ({int(r.df)} df, p = {float(r.p_value):.3g})",
                        float(r.chi_square), source="ksweep/summary.parquet")
    if quantity == "alpha":
        fits = t.get("ksweep/fits.parquet")
        rows = None if fits is None else fits[0][(fits[0]["pair"] == pair)
                                                 & (fits[0]["model"] == "generalized-saturation")]
        if rows is None or rows.empty or pd.isna(rows["alpha"].iloc[0]):
            return _na("the saturation model was not fitted")
        r = rows.iloc[0]
        return Measured(f"{float(r.alpha):.3f} [{float(r.alpha_lower):.3f}, {float(r.alpha_upper):.3f}] ({pair})",
                        float(r.alpha), source="ksweep/fits.parquet")
    raise ProtocolError(f"preregistration/paper.yaml: unknown K-sweep quantity {quantity!r}")


def _matrix_counts(which: str, protocol: Any) -> Measured:
    c = protocol.counts(which)
    return Measured(f"{c['fire']}/{c['silent']}/{c['n/a']}, {c['predicted_miss']} misses", source="preregistration")


SIMPLE: dict[str, Callable[[Tables, str], Measured]] = {
    "epilogue_max_ulp_at_most_one": _epilogue_ulp,
    "f8_never_fires": _f8_silent,
    "precondition_and_operand_faults_caught": _always_caught,
    "epilogue_faults_undetected": _epilogue_undetected,
    "epilogue_cells_undetected": _epilogue_cells_undetected,
    "corrected_without_errors": _corrected_without_errors,
    "pow2_layers_identical": _pow2_identical,
    "compare_pow2_requant_identical": _pow2_requant_identical,
    "compare_real_max_ulp_at_most_one": _real_max_ulp,
    "prediction_all_below_2p24": _all_rows("f32_exact", "at or below 2^24"),
    "prediction_int32_bound": _all_rows("int32_bound_holds", "within 16256 K < 2^31"),
    "hypothesis_h1": _hypothesis,
    "gate_g1": _gate_g1,
    "d1_strict": _d1_strict,
    "d1_real_scales": _d1_real_scales,
    "requant_gate_identical": _gate_identical,
    "determinism_probe_identical": _arms_identical("probe"),
    "determinism_pow2_identical": _arms_identical("pow2-nearest"),
    "determinism_self_consistent": _self_consistent,
}


def measure(claim: Mapping[str, Any], t: Tables, protocol: Any) -> Measured:
    """This run's value for one claim's ``measure``; an unknown measure is a protocol error."""
    if claim["kind"] == "not_computed":
        return Measured("—", why=f"{NOT_COMPUTED}: {claim['why']}")
    try:
        return _measure(claim, t, protocol)
    except _Unavailable as exc:
        return _na(str(exc))


def _measure(claim: Mapping[str, Any], t: Tables, protocol: Any) -> Measured:
    name, definition = claim["measure"], claim["definition"]
    parts = name.split(".")
    if name in SIMPLE:
        return SIMPLE[name](t, definition)
    if parts[0] == "totals" and len(parts) == 2:
        return _totals(t, definition, parts[1])
    if parts[0] == "scorecard" and len(parts) == 4 and parts[2].isdigit():
        return _scorecard(t, definition, parts[1], int(parts[2]), parts[3])
    if parts[0] == "detection" and len(parts) in (2, 3):
        return _detection(t, definition, parts[1], parts[2] if len(parts) == 3 else None)
    if parts[0] == "ulp_range" and len(parts) == 2:
        return _ulp_range(t, parts[1])
    if parts[0] == "prefill_decode" and len(parts) == 3 and parts[2] == "flip_rate":
        return _prefill_decode(t, parts[1])
    if parts[0] == "determinism" and len(parts) == 3 and parts[2] == "arms":
        return _arms(t, parts[1])
    if parts[0] == "prediction" and len(parts) == 2 and parts[1] in ("min_headroom_bits", "max_abs_acc"):
        return _prediction(t, parts[1])
    if parts[0] == "compare" and len(parts) == 3:
        return _compare(t, parts[1], parts[2])
    if parts[0] == "tokens" and len(parts) == 3 and parts[2] in ("flip_rate", "positions", "auc", "brier"):
        return _tokens(t, parts[1], parts[2])
    if parts[0] == "perplexity" and len(parts) in (2, 3):
        return _perplexity(t, parts[1], parts[2] if len(parts) == 3 else "value")
    if parts[0] == "ksweep" and len(parts) == 3 and parts[1] in ("int8", "fp8"):
        return _ksweep(t, parts[1], parts[2])
    if parts[0] == "requant" and len(parts) == 2 and parts[1] in ("f32_division_differing_share", "code_offset_max"):
        return _division(t, parts[1])
    if name == "requant.probe_scales":
        return _probe_scales(t)
    if parts[0] == "matrix_counts" and len(parts) == 2 and parts[1] in ("corrected", "original"):
        measured = _matrix_counts(parts[1], protocol)
        return Measured(measured.text, holds=measured.text == str(claim["value"]), source=measured.source)
    raise ProtocolError(f"preregistration/paper.yaml: claim {claim['id']}: unknown measure {name!r}")


def paper_value(claim: Mapping[str, Any]) -> str:
    value, unit = claim["value"], claim["unit"]
    if unit == "percent":
        return f"{float(value):.{_decimals(value)}f}%"
    if unit == "count":
        return f"{int(value):,}"
    if unit == "per_million":
        return f"~{value} per million"
    return str(value)


def _decimals(value: Any) -> int:
    text = str(value)
    return len(text.split(".")[1]) if "." in text else 0


def verdict(claim: Mapping[str, Any], got: Measured, run_model: str, emulated: bool = False) -> str:
    """What was tested: see the module docstring; ``emulated`` says both kernel arms are exact emulations."""
    if got.why:
        return got.why
    kind = claim["kind"]
    if kind == "protocol":
        return "protocol" if got.holds else "protocol: differs from the paper"
    if kind == "structural":
        if claim.get("evidence") == "kernels" and emulated:
            return CONSTRUCTION if got.holds else "not reproduced (emulated arms)"
        return "reproduced" if got.holds else "not reproduced"
    if run_model.lower() != str(claim["model"]).lower():
        return OTHER_MODEL
    if got.number is None or isinstance(claim["value"], str):
        return "magnitude: no verdict (not a single number)"
    same = round(got.number, _decimals(claim["value"])) == round(float(claim["value"]), _decimals(claim["value"]))
    return "reproduced" if same else "differs"


PAPER_LABELS = {"IA": "[IA]", "PT": "[PT]"}


def claims_table(protocol: Any, t: Tables, run_model: str, emulated: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """paper · where | claim | side | paper's value (model, size) | this run | verdict, and the tables used."""
    rows, sources = [], []
    for claim in protocol.paper["claims"]:
        got = measure(claim, t, protocol)
        if got.source and got.source not in sources:
            sources.append(got.source)
        rows.append({"paper": f"{PAPER_LABELS.get(claim['paper'], claim['paper'])} {claim['where']}",
                     "claim": " ".join(claim["statement"].split()), "side": claim["side"],
                     "paper_value": f"{paper_value(claim)} ({claim['model']}; {claim['size']})",
                     "this_run": got.text, "verdict": verdict(claim, got, run_model, emulated)})
    return pd.DataFrame(rows), sources

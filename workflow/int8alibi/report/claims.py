"""The papers' claims (preregistration/paper.yaml) beside this run's values.

Each claim names a ``measure``; this module computes that measure from the run's tables, with what
the verdict rule needs: a sampling interval, whether the value is an exact count, whether a yes/no
claim holds and the cells or layers that outcome rests on. The verdict itself comes from
``verdicts.decide`` (the registered rule), never from here. A measure whose table the run did not
produce says so ("not applicable: ..."), never a pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from ..errors import ProtocolError
from .. import stage_spec
from .measures import DIVISION_COLUMNS, division_summary, summary_row
from .sections import Tables
from .verdicts import NOT_COMPUTED, Measured, RunFacts, Verdict, decide

EPILOGUE = ("F1", "F2", "F3", "F4", "F5")
UNDETECTED_EPILOGUE = ("F1", "F2", "F3", "F5")
WHY = "Why:"  # where the mechanism starts, after the cells; the verdict box shows only what comes before
F5_NOTE = ("F5 adds K/tile float32 partial products (the tile width is this project's protocol parameter; the "
           "paper does not give one), so its rounding error scales with the partial sums, not with the output: "
           "an output that cancels toward zero can move by more than one bf16 spacing, and how often that happens "
           "depends on the model's operands")


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
    df, rel = _table(t, stage_spec.table("faults", "totals"), ("definition", "matrix", "quantity", "value"))
    row = df[(df["definition"] == definition) & (df["matrix"] == "both") & (df["quantity"] == quantity)]
    if len(row) != 1:
        return _na(f"{rel} has no {quantity} under the {definition} definition")
    value = int(row["value"].iloc[0])
    return Measured(f"{value:,}", float(value), source=rel, exact=True)


def _scorecard(t: Tables, definition: str, matrix: str, check: int, column: str) -> Measured:
    df, rel = _table(t, stage_spec.table("faults", "scorecard"), ("definition", "matrix", "check"))
    row = df[(df["definition"] == definition) & (df["matrix"] == matrix) & (df["check"] == check)]
    if len(row) != 1 or column not in df:
        return _na(f"{rel} has no {matrix} check {check} {column} under the {definition} definition")
    value = row[column].iloc[0]
    if value is None or pd.isna(value):
        return _na(f"check {check}'s {column} has an empty denominator in this run")
    if column.endswith("_rate"):
        return Measured(f"{100 * float(value):.2f}%", 100 * float(value), source=rel, exact=True)
    return Measured(f"{int(value):,}", float(value), source=rel, exact=True)


def _corrected_without_errors(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("faults", "scorecard"), ("definition", "matrix", "fp", "fn"))
    part = df[(df["definition"] == definition) & (df["matrix"] == "corrected")]
    if part.empty:
        return _na(f"{rel} has no corrected rows under the {definition} definition")
    fp, fn = int(part["fp"].sum()), int(part["fn"].sum())
    evidence = _misscored_cells(t) if fp or fn else ""
    return Measured(f"{fp:,} false positives, {fn:,} false negatives", float(fp + fn), holds=fp == fn == 0, source=rel,
                    evidence=evidence)


def _cells_or_none(t: Tables) -> pd.DataFrame | None:
    got = t.get(stage_spec.table("faults", "cells"))
    return None if got is None else got[0]


def _cell_groups(rows: pd.DataFrame, what: str) -> str:
    """'N cells: F5 x check 6 under own scales (severity one 3, pct 9; 7 layers; max ulp 2-4)', per group."""
    if rows.empty:
        return ""
    parts = []
    for (fault, check, regime), g in rows.groupby(["fault", "check", "regime"], sort=True):
        cells = g.drop_duplicates(["layer", "severity"])
        sev = ", ".join(f"{k} {n}" for k, n in cells["severity"].value_counts().sort_index().items())
        ulps = g["max_ulp"].dropna() if "max_ulp" in g else pd.Series(dtype=float)
        ulp = f"; max ulp {int(ulps.min())}–{int(ulps.max())}" if not ulps.empty else ""
        parts.append(f"{len(cells):,} {fault} cells fired check {int(check)} under {regime} scales (severity {sev}; "
                     f"{cells['layer'].nunique():,} layers{ulp})")
    note = f". {WHY} {F5_NOTE}" if (rows["fault"] == "F5").any() else ""
    return f"rests on {what}: " + "; ".join(parts) + note


def _misscored_cells(t: Tables) -> str:
    """The cell x check rows scored as errors against the corrected matrix (from the per-cell table)."""
    cells = _cells_or_none(t)
    if cells is None or "score_corrected" not in cells:
        return ""
    wrong = cells[cells["score_corrected"].isin(["FP", "FN"])]
    return _cell_groups(wrong, "the cells scored as errors")


def _detection(t: Tables, definition: str, fault: str, regime: str | None) -> Measured:
    df, rel = _table(t, stage_spec.table("faults", "detection"),
                     ("definition", "fault", "regime", "cells", "observable", "detected"))
    rows = df[(df["definition"] == definition) & (df["fault"] == fault)]
    if regime is not None:
        rows = rows[rows["regime"] == regime]
    if rows.empty:
        return _na(f"{rel} has no {fault} row under the {definition} definition")
    cells, observable, detected = (int(rows[c].sum()) for c in ("cells", "observable", "detected"))
    return Measured(f"{cells:,} / {observable:,} / {detected:,}", float(detected), source=rel,
                    numbers=(float(cells), float(observable), float(detected)))


def _epilogue_ulp(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("faults", "ulp"))
    ulps = df[df["fault"].isin(EPILOGUE)]["max_ulp"].dropna()
    if ulps.empty:
        return _na("no epilogue cell has a finite output pair")
    low, high = int(ulps.min()), int(ulps.max())
    evidence = ""
    cells = _cells_or_none(t)
    if high > 1 and cells is not None:
        wide = cells[cells["fault"].isin(EPILOGUE) & (cells["max_ulp"] > 1) & (cells["check"] == 6)]
        evidence = _cell_groups(wide, "the cells more than one spacing apart (check 6's rows)")
    return Measured(f"max ulp {low}–{high}", float(high), holds=high <= 1, source=rel, evidence=evidence)


def _ulp_range(t: Tables, fault: str, severity: str | None = None) -> Measured:
    if severity is None:
        df, rel = _table(t, stage_spec.table("faults", "ulp"))
        ulps = df[df["fault"] == fault]["max_ulp"].dropna()
    else:
        df, rel = _table(t, stage_spec.table("faults", "cells"), ("fault", "severity", "max_ulp"))
        ulps = df[(df["fault"] == fault) & (df["severity"] == severity)]["max_ulp"].dropna()
    if ulps.empty:
        return _na(f"no {fault} cell has a finite output pair")
    return Measured(f"{int(ulps.min()):,}–{int(ulps.max()):,}", float(ulps.max()), source=rel)


def _f8_silent(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("faults", "cells"))
    f8 = df[df["fault"] == "F8"]
    if f8.empty:
        return _na("the campaign ran no F8 cell")
    fired = int((f8["applicable"] & f8["fired"].fillna(False).astype(bool)).sum())
    return Measured(f"{fired:,} of {len(f8):,} applicable check verdicts fired", float(fired), holds=fired == 0,
                    source=rel)


def _always_caught(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("faults", "detection"), ("definition", "fault", "detected", "cells"))
    rows = df[(df["definition"] == definition) & df["fault"].isin(["F6", "F7", "F9"])]
    if rows.empty:
        return _na("the campaign ran no F6, F7 or F9 cell")
    parts = [f"{r.fault} {r.detected:,}/{r.cells:,}" for r in rows.itertuples()]
    return Measured(", ".join(parts), holds=bool((rows["detected"] == rows["cells"]).all()), source=rel)


def _epilogue_undetected(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("faults", "detection"), ("definition", "fault", "detected", "cells"))
    rows = df[(df["definition"] == definition) & df["fault"].isin(UNDETECTED_EPILOGUE)]
    if rows.empty:
        return _na("the campaign ran no F1, F2, F3 or F5 cell")
    per = rows.groupby("fault", sort=True)[["detected", "cells"]].sum()
    parts = [f"{f} {int(r.detected):,}/{int(r.cells):,}" for f, r in per.iterrows()]
    holds = bool((per["detected"] == 0).all())
    return Measured("detected in " + ", ".join(parts), holds=holds, source=rel,
                    evidence="" if holds else _caught_cells(t, UNDETECTED_EPILOGUE, None))


def _caught_cells(t: Tables, faults: tuple[str, ...], regime: str | None) -> str:
    """The applicable check rows that fired on the given faults (optionally one regime)."""
    cells = _cells_or_none(t)
    if cells is None:
        return ""
    hit = cells[cells["fault"].isin(faults) & cells["applicable"].astype(bool)
                & cells["fired"].fillna(False).astype(bool)]
    if regime is not None:
        hit = hit[hit["regime"] == regime]
    return _cell_groups(hit, "the cells a check caught")


def _fired_cells(cells: pd.DataFrame) -> pd.Series:
    """Per cell (layer, fault, severity, regime): whether any applicable check fired."""
    hit = cells["applicable"].astype(bool) & cells["fired"].fillna(False).astype(bool)
    return hit.groupby([cells["layer"], cells["fault"], cells["severity"], cells["regime"]]).any()


def _epilogue_cells_undetected(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("faults", "cells"), ("layer", "fault", "severity", "regime", "applicable", "fired"))
    part = df[df["fault"].isin(UNDETECTED_EPILOGUE)]
    if part.empty:
        return _na("the campaign ran no F1, F2, F3 or F5 cell")
    per = _fired_cells(part)
    silent = int((~per).sum())
    return Measured(f"{silent:,} of {len(per):,} cells", float(silent), source=rel)


def real_scale_catches(cells: pd.DataFrame) -> pd.DataFrame:
    """Observable own-scale epilogue cells and whether some applicable check fired on each."""
    part = cells[cells["fault"].isin(EPILOGUE) & (cells["regime"] == "own") & cells["observable"].astype(bool)]
    return _fired_cells(part).rename("caught").reset_index()


def _d1_real_scales(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("faults", "cells"), ("layer", "fault", "severity", "regime", "observable", "applicable",
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
                    source=rel, evidence=_caught_cells(t, EPILOGUE, "own"))


# ---- layer level ----

def _prediction(t: Tables, column: str) -> Measured:
    df, rel = _table(t, stage_spec.table("prediction", "predictions"), ("max_abs_acc", "headroom_bits"))
    if df.empty:
        return _na(f"{rel} is empty")
    if column == "min_headroom_bits":
        value = float(df["headroom_bits"].min())
        return Measured(f"{value:.2f} bits ({len(df):,} layer captures)", value, source=rel, exact=True)
    value = int(df["max_abs_acc"].max())
    return Measured(f"{value:,}", float(value), source=rel, exact=True)


def _all_rows(column: str, what: str) -> Callable[[Tables, str], Measured]:
    def measure_(t: Tables, definition: str) -> Measured:
        df, rel = _table(t, stage_spec.table("prediction", "predictions"), (column,))
        if df.empty:
            return _na(f"{rel} is empty")
        ok = df[column].astype(bool)
        held = int(ok.sum())
        broken = df[~ok]
        evidence = "" if broken.empty else ("rests on the layer captures outside the bound: "
                                            + ", ".join(map(str, broken["layer"].head(8)))
                                            + (f" and {len(broken) - 8:,} more" if len(broken) > 8 else ""))
        return Measured(f"{held:,} of {len(df):,} layer captures {what}", float(held), holds=held == len(df),
                        source=rel, evidence=evidence)
    return measure_


def _compare_rows(t: Tables, setting: str) -> tuple[pd.DataFrame, str]:
    df, rel = _table(t, stage_spec.table("compare", "summary"), ("setting", "phase", "layers", "layers_identical"))
    rows = df[(df["setting"] == setting) & (df["phase"] == "prefill")]
    if rows.empty:
        raise _Unavailable(f"{rel} has no {setting} prefill row")
    return rows, rel


def _compare(t: Tables, setting: str, column: str) -> Measured:
    rows, rel = _compare_rows(t, setting)
    r = rows.iloc[0]
    if column == "layers_differing":
        return Measured(f"{int(r.layers_differing):,} of {int(r.layers):,} (prefill)", float(r.layers_differing),
                        source=rel, numbers=(float(r.layers_differing), float(r.layers)))
    if column == "layers_identical":
        return Measured(f"{int(r.layers_identical):,}/{int(r.layers):,} (prefill)", float(r.layers_identical),
                        source=rel, numbers=(float(r.layers_identical), float(r.layers)))
    if column == "differing_per_million":
        return Measured(f"{float(r.differing_per_million):.2f} per million (prefill)", float(r.differing_per_million),
                        source=rel)
    raise ProtocolError(f"preregistration/paper.yaml: unknown compare column {column!r}")


def _real_max_ulp(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("compare", "summary"), ("setting", "max_ulp"))
    ulps = df[df["setting"] == "real"]["max_ulp"].dropna()
    if ulps.empty:
        return _na(f"{rel} has no real-scale pair of finite outputs")
    high = int(ulps.max())
    return Measured(f"max ulp {high} (prefill and decode)", float(high), holds=high <= 1, source=rel)


def _pow2_identical(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("compare", "summary"))
    rows = df[df["setting"].astype(str).str.startswith("pow2")]
    if rows.empty:
        return _na("no power-of-two setting was compared")
    same, total = int(rows["layers_identical"].sum()), int(rows["layers"].sum())
    return Measured(f"{same:,} of {total:,} layer comparisons identical", float(same), holds=same == total, source=rel)


def _pow2_requant_identical(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("compare", "summary"))
    rows = df[df["setting"] == "pow2-requant"]
    if rows.empty:
        return _na(f"{rel} has no pow2-requant row")
    same, total = int(rows["layers_identical"].sum()), int(rows["layers"].sum())
    return Measured(f"{same:,}/{total:,} layer comparisons", float(same), holds=same == total, source=rel)


# ---- requantization ----

def _division(t: Tables, statistic: str) -> Measured:
    """The float32-versus-bf16 division statistics over the own arm's layers (quant.division)."""
    df, rel = _table(t, stage_spec.table("requant", "gate"), DIVISION_COLUMNS)
    d = division_summary(df)
    if d is None:
        return _na(f"{rel} has no own rows")
    if statistic == "f32_division_differing_share":
        share = d.share_percent
        return Measured(f"{share:.2f}% ({d.differing:,} of {d.weights:,} int8 weights)", share, source=rel,
                        exact=True)
    return Measured(f"{d.code_offset_max:.3f} (the bf16 rounding of the quotient alone: {d.quotient_shift_max:.3f}; "
                    f"below 0.75 by construction)", d.code_offset_max, holds=d.code_offset_max < 0.75, source=rel)


def _probe_scales(t: Tables) -> Measured:
    df, rel = _table(t, stage_spec.table("requant", "gate"), ("arm", "n"))
    probe = df[df["arm"] == "probe"]
    if probe.empty:
        return _na(f"{rel} has no probe rows")
    n = int(probe["n"].sum())
    return Measured(f"{n:,} (every weight scale of {len(probe):,} layers)", float(n), source=rel, exact=True)


def _gate_identical(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("requant", "gate"), ("arm", "bytes_equal"))
    own = df[df["arm"] == "own"]
    if own.empty or own["bytes_equal"].isna().all():
        return _na("the gate had no independent reference (self-built checkpoint)")
    equal = int(own["bytes_equal"].fillna(False).astype(bool).sum())
    return Measured(f"{equal:,} of {len(own):,} layers byte-identical to the reference", float(equal),
                    holds=equal == len(own), source=rel)


# ---- end to end ----

def _arms(t: Tables, checkpoint: str) -> Measured:
    df, rel = _table(t, stage_spec.table("determinism", "agreement"), ("checkpoint", "comparison", "identical"))
    rows = df[(df["checkpoint"] == checkpoint) & (df["comparison"] == "arms")]
    if rows.empty:
        return _na(f"{rel} has no {checkpoint} rows")
    same = int(rows["identical"].sum())
    return Measured(f"{same}/{len(rows)}", float(same), holds=same == len(rows), source=rel,
                    numbers=(float(same), float(len(rows))))


def _none_identical(t: Tables, definition: str) -> Measured:
    """The direction 'the two kernels agree on no sequence' under the checkpoint's own scales."""
    got = _arms(t, "own")
    if got.why:
        return got
    same = int(got.number or 0)
    return Measured(f"{got.text} sequences identical across arms under own scales", float(same), holds=same == 0,
                    source=got.source)


def _arms_identical(checkpoint: str) -> Callable[[Tables, str], Measured]:
    def measure_(t: Tables, definition: str) -> Measured:
        got = _arms(t, checkpoint)
        return got if got.why else Measured(f"{got.text} sequences identical across arms", got.number, got.holds,
                                            source=got.source)
    return measure_


def _self_consistent(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("determinism", "agreement"), ("checkpoint", "comparison", "identical"))
    rows = df[df["comparison"].astype(str).str.startswith("runs-of-")]
    if rows.empty:
        return _na(f"{rel} has no run-against-run rows")
    same = int(rows["identical"].sum())
    return Measured(f"{same}/{len(rows)} sequences identical run against run (every arm and checkpoint)", float(same),
                    holds=same == len(rows), source=rel)


def _prefill_decode(t: Tables, checkpoint: str) -> Measured:
    """The flip rate over both arms' generated positions (the paper's is one arm's); each arm's in the text."""
    df, rel = _table(t, stage_spec.table("prefill_decode", "prefill_decode"), ("checkpoint", "arm", "flips", "positions"))
    rows = df[df["checkpoint"] == checkpoint]
    if rows.empty:
        return _na(f"{rel} has no {checkpoint} rows")
    parts = [f"{r.arm} {r.flips:,}/{r.positions:,} ({100 * r.flip_rate:.1f}%, {100 * r.level:.0f}% interval "
             f"{100 * r.flip_rate_low:.1f}–{100 * r.flip_rate_high:.1f}%)" for r in rows.itertuples()]
    rate = 100 * float(rows["flips"].sum()) / float(rows["positions"].sum())
    return Measured("; ".join(parts) + " (this project's own engine)", rate, source=rel)


def _probe_fewer_flips(t: Tables, definition: str) -> Measured:
    """Whether the probe flips fewer prefill/decode tokens than own scales (both arms pooled)."""
    own, probe = _prefill_decode(t, "own"), _prefill_decode(t, "probe")
    for got in (own, probe):
        if got.why:
            return got
    assert own.number is not None and probe.number is not None
    if own.number == 0:
        return Measured(f"own {own.number:.1f}% → probe {probe.number:.1f}% (no flip under own scales, so nothing "
                        "for the probe to reduce; this project's own engine)", probe.number, holds=None,
                        source=own.source)
    word = "fewer" if probe.number < own.number else "not fewer"
    return Measured(f"own {own.number:.1f}% → probe {probe.number:.1f}% ({word}; both arms pooled, this project's own "
                    f"engine)", probe.number - own.number, holds=probe.number < own.number, source=own.source)


# ---- tokens ----

def _tokens(t: Tables, regime: str, quantity: str) -> Measured:
    if quantity in ("flip_rate", "positions"):
        df, rel = _table(t, stage_spec.table("tokens", "pairs"), ("comparison", "regime", "flips", "positions"))
        rows = df[(df["comparison"] == "kernels") & (df["regime"] == regime)]
        if rows.empty:
            return _na(f"{rel} has no kernel-pair {regime} row")
        r = rows.iloc[0]
        if quantity == "positions":
            return Measured(f"{int(r.positions):,}", float(r.positions), source=rel, exact=True)
        low, high = _scaled(r.flip_rate_low), _scaled(r.flip_rate_high)
        shown = "" if low is None or high is None else f", {100 * float(r.level):.0f}% interval {low:.1f}–{high:.1f}%"
        return Measured(f"{100 * float(r.flip_rate):.1f}% ({int(r.flips):,} of {int(r.positions):,}{shown})",
                        100 * float(r.flip_rate), source=rel, low=low, high=high, level=float(r.level))
    df, rel = _table(t, stage_spec.table("tokens", "predictor"), ("comparison", "regime", "quantity", "value"))
    rows = df[(df["comparison"] == "kernels") & (df["regime"] == regime)]
    values = dict(zip(rows["quantity"], rows["value"]))
    if quantity in ("auc", "margin_direction"):
        auc = values.get("auc")
        if auc is None or pd.isna(auc):
            return _na("the AUC is not evaluable in this run (no flip or no non-flip)")
        r = rows[rows["quantity"] == "auc"].iloc[0]
        low, high = (None, None) if pd.isna(r["low"]) else (float(r["low"]), float(r["high"]))
        shown = "" if low is None else f" [{low:.3f}, {high:.3f}] ({100 * float(r['level']):.0f}% cluster interval)"
        if quantity == "margin_direction":
            above = (low if low is not None else float(auc)) > 0.5
            return Measured(f"AUC {float(auc):.3f}{shown}: " + ("above chance" if above else "not above chance"),
                            float(auc), holds=above, source=rel)
        return Measured(f"{float(auc):.3f}{shown}", float(auc), source=rel, low=low, high=high,
                        level=None if low is None else float(r["level"]))
    brier_map, base = values.get("brier_map"), values.get("brier_baseline")
    if brier_map is None or base is None or pd.isna(brier_map) or pd.isna(base):
        return _na("the held-out Brier scores are not evaluable in this run")
    return Measured(f"{float(brier_map):.4f} vs {float(base):.4f}", float(brier_map), source=rel)


def _scaled(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else 100 * float(value)


# ---- perplexity ----

def _perplexity_row(t: Tables, quantity: str, arm: str) -> tuple[pd.Series, str]:
    df, rel = _table(t, stage_spec.table("perplexity", "summary"), ("quantity", "arm", "value", "low", "high"))
    row = df[(df["quantity"] == quantity) & (df["arm"] == arm)]
    if len(row) != 1 or pd.isna(row["value"].iloc[0]):
        raise _Unavailable(f"{rel} has no {quantity} value for {arm}")
    return row.iloc[0], rel


def _perplexity(t: Tables, arm: str, what: str) -> Measured:
    if arm == "mismatch_share":
        r, rel = _perplexity_row(t, "mismatch_share", "probe")
        low, high = _scaled(r.low), _scaled(r.high)
        shown = "" if low is None or high is None else f" [{low:.1f}%, {high:.1f}%]"
        return Measured(f"{100 * float(r.value):.1f}%{shown}", 100 * float(r.value), source=rel, low=low, high=high,
                        level=None if pd.isna(r.level) else float(r.level))
    r, rel = _perplexity_row(t, "relative_change_vs_own", arm)
    low, high = float(r.low), float(r.high)
    interval = f"[{_pct(low)}, {_pct(high)}]"
    if what == "interval":
        covers = "covers zero" if low <= 0 <= high else "excludes zero"
        return Measured(f"{interval}: {covers}; upper end {_pct(high)}", 100 * high, source=rel)
    return Measured(f"{_pct(float(r.value))} {interval}", 100 * float(r.value), source=rel, low=100 * low,
                    high=100 * high, level=float(r.level))


def _hypothesis(t: Tables, definition: str) -> Measured:
    """H1 with both arms' changes and the clipping that explains the direction on this model."""
    df, rel = _table(t, stage_spec.table("perplexity", "summary"))
    row = summary_row(df, "hypothesis:H1")
    if row is None:
        return _na(f"{rel} has no H1 row")
    verdict = str(row["verdict"]).split(":")[0]
    supported = verdict == "supported"
    arms = []
    for arm in ("pow2-ceiling", "pow2-nearest"):
        r = df[(df["quantity"] == "relative_change_vs_own") & (df["arm"] == arm)]
        if len(r) == 1:
            arms.append(f"{arm.removeprefix('pow2-')} {_pct(float(r['value'].iloc[0]))}")
    text = f"{verdict} ({' vs '.join(arms)})"
    gate = t.get(stage_spec.table("requant", "gate"))
    if gate is not None and "clipped" in gate[0].columns:
        clipped = gate[0].groupby("arm")["clipped"].sum()
        if {"pow2-nearest", "pow2-ceiling"} <= set(clipped.index):
            text += (f"; weights clipped: {int(clipped['pow2-nearest']):,} under nearest, "
                     f"{int(clipped['pow2-ceiling']):,} under ceiling")
    return Measured(text, float(row["value"]), holds=not supported, source=rel)


def _gate_g1(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, stage_spec.table("perplexity", "summary"))
    row = summary_row(df, "gate:G1")
    if row is None:
        return _na(f"{rel} has no G1 row")
    verdict = str(row["verdict"])
    shown = "not run (gate not triggered)" if verdict == "gate not triggered" else verdict
    return Measured(f"{shown}; ceiling {_pct(float(row['value']))}", holds=verdict == "gate not triggered", source=rel)


# ---- K sweep (GPU only) ----

def _ksweep(t: Tables, fmt: str, quantity: str, protocol: Any) -> Measured:
    """A K-sweep value on the comparator pair that ksweep.yaml's rule names (never the one that sorts first)."""
    from .ksweep import paper_pair, per_k

    counts = t.get(stage_spec.table("ksweep", "counts"))
    if counts is None:
        return _na("the K sweep is GPU only and this run has no ksweep/ tables")
    frame = counts[0]
    pair, _ = paper_pair(frame, protocol.ksweep["paper"], fmt)
    if pair is None:
        return _na(f"no {fmt.upper()} pair of the K sweep ran ({', '.join(sorted(set(frame['status'])))})")
    mine = per_k(frame[frame["pair"] == pair]).sort_values("k")
    rel = stage_spec.table("ksweep", "counts")
    first, last = mine.iloc[0], mine.iloc[-1]
    tag = f"{pair}, the registered comparator"
    if quantity == "differing_total":
        return Measured(f"{int(mine['differing'].sum()):,} ({tag}, {int(mine['seeds'].max())} seeds)",
                        float(mine["differing"].sum()), source=rel)
    if quantity == "per_million_range":
        return Measured(f"{mine['per_million'].min():.2f}–{mine['per_million'].max():.2f} ({tag})", source=rel)
    if quantity == "prevalence_range":
        return Measured(f"{100 * first.prevalence_mean:.1f}% → {100 * last.prevalence_mean:.1f}% ({tag})", source=rel)
    if quantity == "ge2_ulp_range":
        return Measured(f"{_share(first.ge2_ulp_share)} → {_share(last.ge2_ulp_share)} ({tag})", source=rel)
    if quantity == "ge2_ulp_all_range":
        return Measured(f"{100 * first.ge2_ulp_share_of_all:.1f}% → {100 * last.ge2_ulp_share_of_all:.1f}% ({tag})",
                        source=rel)
    if quantity == "max_relative_range":
        return Measured(f"{_share(first.max_relative_difference)} → {_share(last.max_relative_difference)} (seed "
                        f"means, the paper's estimator; largest over seeds, a sensitivity: "
                        f"{_share(first.max_relative_difference_seed_max)} → "
                        f"{_share(last.max_relative_difference_seed_max)}; {tag})", source=rel)
    if quantity == "median_relative_range":
        med = mine["median_relative_difference"].dropna()
        if med.empty:
            return _na("no median relative difference was defined (no differing non-near-zero element)")
        return Measured(f"{med.min():.2g}–{med.max():.2g} (seed means over K; {tag})", source=rel)
    if quantity == "max_relative_max":
        top = mine["max_relative_difference_seed_max"].dropna()
        if top.empty:
            return _na("no differing non-near-zero element at any K")
        return Measured(f"≤ {top.max():.2g} at every K (largest over seeds; {tag})", float(top.max()), source=rel)
    if quantity == "max_ulp":
        top = int(mine["max_ulp"].max())
        return Measured(f"{top:,} ulp (log10 = {math.log10(top):.1f}; {tag})" if top > 0 else f"0 ({tag})",
                        float(top), source=rel)
    if quantity == "chi_square":
        summary = t.get(stage_spec.table("ksweep", "summary"))
        rows = None if summary is None else summary[0][(summary[0]["pair"] == pair) & (summary[0]["status"] == "run")]
        if rows is None or rows.empty or pd.isna(rows["chi_square"].iloc[0]):
            return _na("the constant-rate test was not evaluated")
        r = rows.iloc[0]
        return Measured(f"{float(r.chi_square):.2f} ({int(r.df)} df, p = {float(r.p_value):.3g}; {tag})",
                        float(r.chi_square), source=stage_spec.table("ksweep", "summary"))
    if quantity == "alpha":
        fits = t.get(stage_spec.table("ksweep", "fits"))
        rows = None if fits is None else fits[0][(fits[0]["pair"] == pair)
                                                 & (fits[0]["model"] == "generalized-saturation")]
        if rows is None or rows.empty or pd.isna(rows["alpha"].iloc[0]):
            return _na("the saturation model was not fitted")
        r = rows.iloc[0]
        return Measured(f"{float(r.alpha):.3f} [{float(r.alpha_lower):.3f}, {float(r.alpha_upper):.3f}] ({tag})",
                        float(r.alpha), low=float(r.alpha_lower), high=float(r.alpha_upper), level=0.95,
                        source=stage_spec.table("ksweep", "fits"))
    raise ProtocolError(f"preregistration/paper.yaml: unknown K-sweep quantity {quantity!r}")


def _share(x: Any) -> str:
    return "—" if x is None or pd.isna(x) else f"{100 * float(x):.0f}%"


def _k_direction(t: Tables, protocol: Any) -> Measured:
    """'FP8 divergence grows with K, INT8 does not' on the registered comparator pairs."""
    from .ksweep import direction

    counts, summary = t.get(stage_spec.table("ksweep", "counts")), t.get(stage_spec.table("ksweep", "summary"))
    if counts is None or summary is None:
        return _na("the K sweep is GPU only and this run has no ksweep/ tables")
    got = direction(counts[0], summary[0], protocol.ksweep["paper"])
    if got is None:
        return _na("no INT8 or no FP8 pair of the K sweep ran")
    return Measured(got.text, holds=got.holds, source=stage_spec.table("ksweep", "summary"),
                    evidence="" if got.holds else got.text)


def _divisor(protocol: Any) -> Measured:
    divisor = protocol.thresholds["weight_quantization"]["scale_divisor"]
    return Measured(f"{divisor} (thresholds.yaml)", float(divisor), holds=float(divisor) == 127.5,
                    source="preregistration")


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
    "d1_real_scales": _d1_real_scales,
    "determinism_own_none_identical": _none_identical,
    "prefill_decode_probe_direction": _probe_fewer_flips,
    "tokens_margin_direction": lambda t, d: _tokens(t, "own", "margin_direction"),
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
    if parts[0] == "ulp_range" and len(parts) in (2, 3):
        return _ulp_range(t, parts[1], parts[2] if len(parts) == 3 else None)
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
        return _ksweep(t, parts[1], parts[2], protocol)
    if name == "ksweep_direction":
        return _k_direction(t, protocol)
    if parts[0] == "requant" and len(parts) == 2 and parts[1] in ("f32_division_differing_share", "code_offset_max"):
        return _division(t, parts[1])
    if name == "requant.probe_scales":
        return _probe_scales(t)
    if name == "protocol.weight_scale_divisor":
        return _divisor(protocol)
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


def verdict(claim: Mapping[str, Any], got: Measured, run: RunFacts, protocol: Any) -> Verdict:
    """The registered rule's verdict (``verdicts.decide``) for one claim and this run's value."""
    return decide(claim, got, run, protocol.paper["verdict_rule"])


def claims_table(protocol: Any, t: Tables, run: RunFacts) -> tuple[pd.DataFrame, list[str]]:
    """id | paper · where | claim | kind | paper's value (model; size) | this run | verdict kind | verdict, and the
    tables used. ``this_run`` carries the evidence a failed yes/no claim rests on."""
    rows, sources = [], []
    for claim in protocol.paper["claims"]:
        got = measure(claim, t, protocol)
        if got.source and got.source not in sources:
            sources.append(got.source)
        v = verdict(claim, got, run, protocol)
        arxiv = protocol.paper["papers"][claim["paper"]]["arxiv"]
        rows.append({"id": claim["id"], "paper": f"{arxiv} {claim['where']}",
                     "claim": " ".join(claim["statement"].split()), "kind": claim["kind"],
                     "paper_value": f"{paper_value(claim)} ({claim['model']}; {claim['size']})",
                     "this_run": got.text, "verdict_kind": v.kind, "verdict": v.text,
                     "headline": bool(claim.get("headline", False))})
    return pd.DataFrame(rows), sources

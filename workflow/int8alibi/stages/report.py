"""Stage 10, report: the study's tables and figures as one Markdown and one self-contained HTML file,
with an appendix (appendix.md, appendix.html) holding the per-row tables the main page links to.

Every number comes from a Parquet table under ``results`` (or a pinned protocol file); every table
and figure names its source file and SHA-256. The first screen is the answer in one sentence
and the papers' headline claims with their verdicts (the rule registered in preregistration/paper.yaml),
and the run's identity. The report's bytes
depend only on those inputs, so rerunning it on the same results gives the same files and root
digest: stage wall times (Snakemake's benchmark files) go to the log, never into the report.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..config import Config
from ..errors import InputError
from ..protocol import load
from ..files.hashing import open_regular
from ..provenance.manifest import write_manifest
from ..report import batch, document, ksweep, sections, summary, tables
from ..runtime.runner import log, stage_main


def _exploratory(results: Path) -> bool:
    import json

    return any(json.loads(m.read_text()).get("exploratory", False) for m in results.glob("*/manifest.json"))


def _resolution(cfg: Config) -> str:
    """The run's arms and device as resolved once when it was planned (the run config's block), and why."""
    block = cfg.resolution
    if block is None:
        return f"arms: {cfg['arms']}; device: {cfg['device']} (as the config names them)"
    return (f"{block['device']} (config: arms {_plain(block['spec']['arms'])}, device {block['spec']['device']}; "
            f"resolved once when the run was planned, on host {block['host']}: {block['reason']['device']})")


def _plain(value: object) -> str:
    return " vs ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


# A benchmark file is a header line and one line per repeat: a few hundred bytes.
_MAX_BENCHMARK_BYTES = 1 << 16


def log_stage_times(benchmarks: Path) -> None:
    """Each job's wall time from Snakemake's benchmark files, to the log only (run-to-run values).

    The files are not inputs of the report, so one that cannot be read (garbage, empty, a FIFO, a
    device) is skipped with a log line naming it and why; it never stops or blocks the stage."""
    files = sorted(benchmarks.rglob("*.tsv"))
    for f in files:
        try:
            seconds, rss = _stage_time(f)
        except InputError as exc:
            log.warning("stage time skipped: %s", exc)
            continue
        log.info("stage time %s: %.1f s (max RSS %s MB)", f.relative_to(benchmarks).with_suffix(""), seconds, rss)
    if not files:
        log.info("no benchmark files under %s", benchmarks)


def _stage_time(path: Path) -> tuple[float, str]:
    """``(wall seconds, max RSS in MB or 'n/a')`` from the first row of one benchmark file, read only
    if it is a regular file of a benchmark's size; else InputError naming it and the reason."""
    with open_regular(path) as handle:
        try:
            data = handle.read(_MAX_BENCHMARK_BYTES + 1)
        except OSError as exc:
            raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > _MAX_BENCHMARK_BYTES:
        raise InputError(f"{path}: larger than {_MAX_BENCHMARK_BYTES} bytes, not a benchmark file")
    lines = data.decode("utf-8", errors="replace").splitlines()
    header, row = (lines[0].split("\t"), lines[1].split("\t")) if len(lines) > 1 else ([], [])
    if "s" not in header or len(row) != len(header):
        raise InputError(f"{path}: {'empty' if not data else 'not a benchmark table'} (expected a header with "
                         "an 's' column and a row of as many values)")
    values = dict(zip(header, row))
    try:
        seconds = float(values["s"])
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(seconds)
    except ValueError:
        raise InputError(f"{path}: s {values['s'][:40]!r} is not a wall time in seconds") from None
    try:
        rss = f"{float(values.get('max_rss', '')):g}"
    except ValueError:  # absent, or Snakemake's NA where it could not measure
        rss = "n/a"
    return seconds, rss


def build(cfg: Config, results: Path, protocol_root: Path = Path("preregistration")) -> document.Document:
    """The report document for the run under ``results`` (pure: reads tables and protocol files only).

    First screen: the answer and the headline verdicts, the run's identity; then the contents, the
    glossary, the setup, the findings, the papers' results, the sections; per-row tables in the appendix."""
    exploratory = _exploratory(results)
    protocol = load(protocol_root)
    emulated = summary.emulated_arms(results)
    tables = sections.Tables(results, tuple(protocol.paper["claims"]))
    run = summary.run_facts(cfg, results, tables, emulated)
    arms = " vs ".join(cfg.resolved_arms)
    doc = document.Document("int8-alibi: are two scaled INT8 GEMM kernels interchangeable?", main_rows=document.MAIN_ROWS)
    doc.add(summary.verdict_box(tables, protocol, run, arms))
    doc.add(document.Paragraph(
        f"Model: {summary.run_model(cfg)}" + (" (synthetic: seeded random weights, not a trained model)"
                                              if run.synthetic else "")
        + f"; size profile: {cfg['size_profile']}; arms: {arms} on {cfg.resolved_device}"
        + (" (exact emulations, not kernel binaries)" if emulated else "") + ". "
        + ("EXPLORATORY run: the per-layer predictions were not pinned before comparison. " if exploratory else
           "The per-layer predictions were pinned before compare read them (see the setup for the pin's status). ")
        + summary.identity(results)))
    doc.add(document.Contents())
    doc.add(*sections.glossary())
    doc.add(*summary.setup(tables, cfg, protocol, _resolution(cfg), emulated, run, results))
    doc.add(*summary.findings(tables, protocol, emulated, run))
    doc.add(*summary.paper_beside_run(tables, protocol, run, doc))
    for section in sections.SECTIONS:
        doc.add(*section(tables, doc))
    doc.add(*batch.section(tables, doc, emulated))
    doc.add(*ksweep.section(tables, protocol.ksweep["paper"], doc))
    doc.add(document.Heading("Appendix"), doc.appendix_links(
        "Per-row tables, each with its source file and SHA-256, in appendix.html (appendix.md):"))
    return doc


def run(cfg: Config, out_dir: Path, results: Path | None = None, benchmarks: Path | None = None) -> None:
    results = Path(results or cfg.results)
    benchmarks = Path(benchmarks) if benchmarks else Path("benchmarks") / ("" if results.name == "results" else results.name)
    doc = build(cfg, results)
    written = document.write(doc, out_dir) + tables.write(results, out_dir)  # pages for Snakemake's report
    log_stage_times(benchmarks)
    # the cross-model view reads reports, never the other way round
    inputs = sorted(p for p in results.glob("*/*.parquet") if p.parent.name not in ("report", "crossmodel"))
    inputs += [p for p in [results / "model" / "parent" / "config.json"] if p.is_file()]  # the vocabulary size
    write_manifest(out_dir, stage="report", outputs=written, inputs=inputs,
                   params={"results": str(results), "resolved": dict(cfg.resolution or {}) or "not resolved"},
                   exploratory=_exploratory(results))
    log.info("report written: %s", ", ".join(p.name for p in written))


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

"""Stage 10, report: the study's tables and figures as one Markdown and one self-contained HTML file.

Every number comes from a Parquet table under ``results`` (or a pinned protocol file); every table
and figure names its source file and SHA-256. The first screen is the findings summary and the
papers' values beside this run (preregistration/paper.yaml). Stage wall times come from
Snakemake's benchmark files.
"""

from __future__ import annotations

from pathlib import Path

from ..config import Config
from ..protocol import load
from ..provenance.manifest import write_manifest
from ..report import document, ksweep, sections, summary
from . import log, stage_main


def _exploratory(results: Path) -> bool:
    import json

    return any(json.loads(m.read_text()).get("exploratory", False) for m in results.glob("*/manifest.json"))


def _resolution(cfg: Config) -> str:
    """The run's arms and device as resolved once when it was planned (the run config's block), and why."""
    block = cfg.resolution
    if block is None:
        return f"arms: {cfg['arms']}; device: {cfg['device']} (as the config names them)"
    arm_a, arm_b = block["arms"]
    return (f"arms: {arm_a} vs {arm_b} on {block['device']} (config: arms {block['spec']['arms']}, device "
            f"{block['spec']['device']}; resolved once on host {block['host']}: {block['reason']['device']}; "
            f"{block['reason']['arms']})")


def run(cfg: Config, out_dir: Path, results: Path | None = None, benchmarks: Path | None = None) -> None:
    results = Path(results or cfg.results)
    benchmarks = Path(benchmarks) if benchmarks else Path("benchmarks") / ("" if results.name == "results" else results.name)
    exploratory = _exploratory(results)
    doc = document.Document("int8-alibi: are two scaled INT8 GEMM kernels interchangeable?")
    doc.add(document.Paragraph(
        f"Model: {summary.run_model(cfg)}; size profile: {cfg['size_profile']}; arms: "
        f"{' vs '.join(cfg.resolved_arms)} on {cfg.resolved_device}; "
        + ("EXPLORATORY run: predictions were not pinned before comparison." if exploratory
           else "predictions pinned before comparison.")))
    protocol = load(Path("preregistration"))
    tables = sections.Tables(results, tuple(protocol.paper["claims"]))
    doc.add(*summary.findings(tables, protocol))
    doc.add(*summary.paper_beside_run(tables, protocol, summary.run_model(cfg)))
    doc.add(document.Heading("This run"), document.Paragraph(f"Model source: {cfg['model']['source']}; {_resolution(cfg)}."))
    for section in sections.SECTIONS:
        doc.add(*section(tables))
    doc.add(*ksweep.section(tables, protocol.ksweep["paper"]))
    doc.add(*sections.stage_times(tables, benchmarks))
    written = document.write(doc, out_dir)
    # the cross-model view reads reports, never the other way round
    inputs = sorted(p for p in results.glob("*/*.parquet") if p.parent.name not in ("report", "crossmodel"))
    write_manifest(out_dir, stage="report", outputs=written, inputs=inputs,
                   params={"results": str(results), "resolved": dict(cfg.resolution or {}) or "not resolved"},
                   exploratory=exploratory)
    log.info("report written: %s", ", ".join(p.name for p in written))


if __name__ == "__main__":
    raise SystemExit(stage_main(run))

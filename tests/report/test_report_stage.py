"""The whole report built from a small results folder: the same inputs give the same bytes, no
run-to-run value (stage times) gets in, every chart has labelled axes, appendix tables are linked."""

from __future__ import annotations

import logging
import os
import re
import signal
from pathlib import Path

import pandas as pd

from int8alibi.config import Config
from int8alibi.report import document
from int8alibi.stages import report

ROOT = Path(__file__).resolve().parents[2]
CFG = Config({"model": {"source": "synthetic", "synthetic": {"preset": "tiny"}}, "size_profile": "tiny",
              "arms": ["exact-cutlass-order", "exact-triton-order"], "device": "cpu",
              "corpus": {"source": "synthetic"}, "exploratory": True}, ROOT / "config.yaml")


def _results(root: Path) -> Path:
    results = root / "results"
    tables = {
        "perplexity/summary.parquet": pd.DataFrame({
            "quantity": ["relative_change_vs_own", "relative_change_vs_own", "hypothesis:H1", "gate:G1"],
            "arm": ["pow2-nearest", "pow2-ceiling", "pow2-ceiling", "pow2-ceiling"],
            "value": [0.09, 0.003, -0.087, 0.003], "low": [0.06, 0.001, -0.1, None], "high": [0.12, 0.005, -0.06, None],
            "level": [0.9, 0.9, 0.9, None], "verdict": [None, None, "supported", "gate not triggered"],
            "detail": ["", "", "", ""]}),
        "determinism/summary.parquet": pd.DataFrame({"arm_a": ["a"], "arm_b": ["b"], "own": ["3/4"], "probe": ["4/4"]}),
        "prefill_decode/first_divergence.parquet": pd.DataFrame({"checkpoint": ["own"], "arm": ["a"], "sequence": [0],
                                                                 "diverged": [False], "module": [None], "kind": [None]}),
        "prefill_decode/prefill_decode.parquet": pd.DataFrame({
            "checkpoint": ["own"], "arm": ["a"], "sequences": [1], "positions": [4], "differing_positions": [0],
            "flips": [0], "flip_rate": [0.0], "flip_rate_low": [0.0], "flip_rate_high": [0.0], "level": [0.9]}),
    }
    for rel, frame in tables.items():
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(results / rel, index=False)
    return results


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_same_results_give_the_same_report_bytes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    results = _results(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    document.write(report.build(CFG, results), tmp_path / "a")
    # a benchmark file appearing in between changes nothing: times go to the log only
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "report.tsv").write_text("s\th:m:s\tmax_rss\n12.3456\t0:00:12\t100.5\n")
    report.log_stage_times(bench)
    document.write(report.build(CFG, results), tmp_path / "b")
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert a == b and {"report.md", "report.html", "appendix.md", "appendix.html"} <= set(a)
    assert b"12.3456" not in a["report.html"] and b"Stage times" not in a["report.md"]


def test_every_chart_has_labelled_axes_and_the_appendix_is_linked(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "out"
    out.mkdir()
    document.write(report.build(CFG, _results(tmp_path)), out)
    figures = sorted(out.glob("*.svg"))
    assert figures
    for svg in figures:
        text = svg.read_text()
        assert len(re.findall(r'class="tick"[^>]*>[^<]+<', text)) >= 3, svg.name
        assert len(re.findall(r'class="axis-label"[^>]*>[^<]+<', text)) >= 2, svg.name
    html = (out / "report.html").read_text()
    appendix = (out / "appendix.html").read_text()
    for anchor in re.findall(r'href="appendix\.html#(a\d+)"', html):
        assert f'id="{anchor}"' in appendix
    assert re.search(r"\[\s*'", html) is None and "`" not in re.sub(r"<code>.*?</code>", "", html)


def test_rerunning_the_stage_gives_the_same_manifest_digest_and_root_digest(tmp_path: Path, monkeypatch) -> None:
    from int8alibi.provenance.chain import root_digest
    from int8alibi.provenance.manifest_format import load_manifest

    monkeypatch.chdir(ROOT)
    results = _results(tmp_path)
    out = results / "report"
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    digests = []
    for seconds in ("1.0", "99.5"):  # Snakemake rewrites its benchmark file with another time on every run
        (bench / "report.tsv").write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:01\t100.5\n")
        out.mkdir(exist_ok=True)
        report.run(CFG, out, results=results, benchmarks=bench)
        digests.append((load_manifest(out / "manifest.json")["digest"], root_digest([out / "manifest.json"], results),
                        _files(out)))
    assert digests[0][0] == digests[1][0] and digests[0][1] == digests[1][1]
    # the main tables' pages for Snakemake's report are outputs like the rest, listed in the manifest
    listed = [o["path"] for o in load_manifest(out / "manifest.json")["outputs"]]
    assert "tables/perplexity_summary.html" in digests[0][2] and any(
        path.endswith("report/tables/perplexity_summary.html") for path in listed), listed
    assert {k: v for k, v in digests[0][2].items() if k != "manifest.json"} == {
        k: v for k, v in digests[1][2].items() if k != "manifest.json"}


def test_bad_benchmark_files_are_skipped_with_one_log_line_each_and_never_block(tmp_path: Path, caplog) -> None:
    bench = tmp_path / "benchmarks"
    (bench / "generate").mkdir(parents=True)
    (bench / "report.tsv").write_text("s\th:m:s\tmax_rss\n12.3456\t0:00:12\t100.5\n")
    bad = {
        "empty.tsv": "empty",
        "garbage.tsv": "not a benchmark table",
        "header_only.tsv": "not a benchmark table",
        "words.tsv": "s 'soon' is not a wall time in seconds",
        "fifo.tsv": "not a regular file (a FIFO",
        "device.tsv": "not a regular file (a device)",
        "folder.tsv": "not a regular file (a folder)",
        "generate/huge.tsv": "larger than 65536 bytes",
    }
    (bench / "empty.tsv").write_text("")
    (bench / "garbage.tsv").write_bytes(b"\x00\xff\xfe binary \x89PNG\r\n\x1a")
    (bench / "header_only.tsv").write_text("s\th:m:s\n")
    (bench / "words.tsv").write_text("s\th:m:s\nsoon\t0:00:12\n")
    os.mkfifo(bench / "fifo.tsv")  # read plainly, this waits for a writer forever
    (bench / "device.tsv").symlink_to("/dev/zero")  # read plainly, this never ends
    (bench / "folder.tsv").mkdir()
    (bench / "generate" / "huge.tsv").write_text("s\n" + "1\n" * 40_000)

    def stop(*_: object) -> None:
        raise RuntimeError("log_stage_times blocked")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(10)
    try:
        with caplog.at_level(logging.INFO, logger="int8alibi"):
            report.log_stage_times(bench)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    lines = [r.getMessage() for r in caplog.records]
    assert "stage time report: 12.3 s (max RSS 100.5 MB)" in lines, lines
    skipped = [line for line in lines if line.startswith("stage time skipped: ")]
    assert len(skipped) == len(bad) and all("\n" not in line for line in skipped), skipped
    for name, why in bad.items():
        assert any(line.startswith(f"stage time skipped: {bench / name}: {why}") for line in skipped), (name, skipped)

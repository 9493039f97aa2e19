"""The main tables' pages for Snakemake's report (int8alibi.report.tables): one HTML page per table the
run produced, every row up to MAX_ROWS and a line saying how many, the same bytes from the same
table; each page has its caption, the rules name the pages (not the Parquet files) in the report, and
naming them while Snakemake parses loads no pandas."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from int8alibi.files.hashing import sha256_file
from int8alibi.report import tables

ROOT = Path(__file__).resolve().parents[2]


def _results(root: Path, rows: int = 3) -> Path:
    """A results folder with two of the main tables: the scorecard (``rows`` rows) and the detection table."""
    results = root / "results"
    (results / "faults").mkdir(parents=True)
    pd.DataFrame({"check": range(1, rows + 1), "detection_rate": [0.5] * rows, "matrix": ["corrected"] * rows}
                 ).to_parquet(results / "faults" / "scorecard.parquet", index=False)
    pd.DataFrame({"fault": ["F1", "F2"], "detected": [3, 0]}).to_parquet(results / "faults" / "detection.parquet",
                                                                         index=False)
    return results


def _body_rows(html: str) -> int:
    return html.count("<tr>") - 1  # less the header row


def test_a_page_per_table_present_with_every_row_and_its_source(tmp_path: Path) -> None:
    results = _results(tmp_path)
    out = tmp_path / "report"
    written = tables.write(results, out)
    assert [p.relative_to(out).as_posix() for p in written] == [tables.page("faults_scorecard"),
                                                                 tables.page("faults_detection")]
    html = written[0].read_text()
    assert _body_rows(html) == 3 and "All 3 rows of results/faults/scorecard.parquet" in html
    assert sha256_file(results / "faults" / "scorecard.parquet")[:16] in html
    assert "50.00%" in html and "detection rate" in html  # the report's own labels and number formats


def test_a_long_table_shows_its_first_rows_and_says_how_many(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tables, "MAX_ROWS", 4)
    results = _results(tmp_path, rows=9)
    html = tables.write(results, tmp_path / "report")[0].read_text()
    assert _body_rows(html) == 4 and "The first 4 of 9 rows of results/faults/scorecard.parquet" in html


def test_the_same_table_gives_the_same_bytes(tmp_path: Path) -> None:
    results = _results(tmp_path)
    first = [p.read_bytes() for p in tables.write(results, tmp_path / "a")]
    second = [p.read_bytes() for p in tables.write(results, tmp_path / "b")]
    assert first == second


def test_the_pages_of_a_run_follow_its_stages() -> None:
    cpu = ["protocol", "requant", "compare", "faults", "determinism", "prefill_decode", "perplexity", "tokens", "batch"]
    assert "ksweep_summary" not in tables.shown(cpu)
    assert tables.shown([*cpu, "ksweep"]) == list(tables.MAIN_TABLES)
    assert tables.shown(["faults"]) == ["faults_scorecard", "faults_detection"]


def test_every_page_has_its_caption_and_no_rule_puts_parquet_in_the_report() -> None:
    for name, (rel, _) in tables.MAIN_TABLES.items():
        caption = ROOT / "workflow" / "report" / f"{name}.rst"
        assert caption.is_file() and f"``{rel}``" in caption.read_text(), caption
    rules = "\n".join(p.read_text() for p in sorted((ROOT / "workflow" / "rules").glob("*.smk")))
    reported = re.findall(r"report\(\s*(?:update\()?f?\"([^\"]+)\"", rules)
    assert reported and not [path for path in reported if path.endswith(".parquet")], reported
    assert "report_tables.page(name)" in (ROOT / "workflow" / "rules" / "common.smk").read_text()  # table_pages()
    assert "extra=table_pages()" in (ROOT / "workflow" / "rules" / "report.smk").read_text()


def test_naming_the_pages_loads_no_pandas() -> None:
    probe = "import sys, int8alibi.report.tables; print('pandas' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(ROOT / "workflow")})
    assert done.stdout.strip() == "False"

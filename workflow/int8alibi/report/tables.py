"""The main tables as HTML pages beside the report (``tables/<name>.html``), for Snakemake's own report
(``snakemake --report``): it shows HTML inline but cannot show a Parquet file. Each page holds one
table as the report renders its tables (labels, formatted numbers, the source file and its SHA-256),
every row up to ``MAX_ROWS``, and says how many rows it shows.

The Snakefile names the pages while it parses, where pandas must not load: this module's top holds
only the list; ``write`` imports the renderer when the report stage calls it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..files.atomic import write_bytes
from ..stage_spec import table

# The main tables, by page name (each page's caption in Snakemake's report is
# workflow/report/<name>.rst): the Parquet file under the results folder and the page's title.
MAIN_TABLES: dict[str, tuple[str, str]] = {
    "requant_gate": (table("requant", "gate"), "Requantization gate, per layer and arm"),
    "compare_summary": (table("compare", "summary"), "Arm against arm, per scale setting and phase"),
    "faults_scorecard": (table("faults", "scorecard"), "The conformance checks' scorecard"),
    "faults_detection": (table("faults", "detection"), "Detection per fault family and scale regime"),
    "determinism_summary": (table("determinism", "summary"), "Cross-kernel determinism"),
    "prefill_decode": (table("prefill_decode", "prefill_decode"), "Prefill against decode on the same arm"),
    "perplexity_summary": (table("perplexity", "summary"), "What power-of-two scales cost in perplexity"),
    "tokens_check7": (table("tokens", "check7"), "Check 7 at the token level"),
    "batch_summary": (table("batch", "summary"), "Batch invariance"),
    "ksweep_summary": (table("ksweep", "summary"), "INT8 against FP8 with the reduction depth K"),
}
# The pages' folder inside the report stage's folder.
FOLDER = "tables"
# The most rows a page shows (the first ones, in the table's order): every row of the default run's
# tables (the largest, the requantization gate, has one per layer and arm); a larger model's gate
# says on its page how many of its rows it shows.
MAX_ROWS = 1000


def shown(stages: Iterable[str]) -> list[str]:
    """The pages of a run that reports ``stages``: the main tables those stages write, in list order."""
    ran = set(stages)
    return [name for name, (rel, _) in MAIN_TABLES.items() if rel.split("/")[0] in ran]


def page(name: str) -> str:
    """A page's path inside the report stage's folder."""
    return f"{FOLDER}/{name}.html"


def _rows_line(total: int, source: str) -> str:
    if total <= MAX_ROWS:
        return f"All {total:,} rows of {source}, in the table's order."
    return (f"The first {MAX_ROWS:,} of {total:,} rows of {source}, in the table's order; the Parquet file "
            "holds every row.")


def write(results: Path, out_dir: Path) -> list[Path]:
    """One page per main table present under ``results``, written atomically into ``out_dir/tables``;
    returns the paths written. A table the run did not produce (the K sweep off a GPU) has no page."""
    from .document import Document, Paragraph, Table, to_html  # pandas: never while the Snakefile parses
    from .sections import Tables

    tables = Tables(results)
    written = []
    for name, (rel, title) in MAIN_TABLES.items():
        got = tables.get(rel)
        if got is None:
            continue
        frame, source = got
        doc = Document(title)
        doc.add(Paragraph(_rows_line(len(frame), source.path)),
                Table(rel, frame.head(MAX_ROWS), (source,)))
        written.append(write_bytes(out_dir / page(name), to_html(doc).encode()))
    return written

"""A report as a list of blocks rendered twice: Markdown (figures as sibling SVG files) and one
self-contained HTML file (figures inline), with an appendix of per-row tables beside it
(appendix.md, appendix.html) that the main page links to. Each table and figure carries its source:
the Parquet file it was read from and that file's SHA-256.

Tables keep their frames' raw column names (what a reader finds in the Parquet file) and are shown
with human labels (``LABELS``) and formatted numbers: rates as percents, counts with thousands
separators. The HTML page fits a 1280 px window and prints without cut columns: long cells wrap,
a table wider than the page scrolls inside its own box on screen and shrinks in print, figures
scale down. Text is plain; a span in backticks is shown as code."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd

from ..provenance.atomic import write_bytes


@dataclass(frozen=True)
class Source:
    path: str
    sha256: str

    def line(self) -> str:
        return f"source: {self.path} (sha256 {self.sha256[:16]}…)"


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Table:
    caption: str
    frame: pd.DataFrame
    sources: tuple[Source, ...]
    labels: tuple[tuple[str, str], ...] = ()  # per-table label overrides (column, label)
    anchor: str = ""                          # set for appendix tables: their link target

    def headers(self) -> list[str]:
        own = dict(self.labels)
        return [own.get(str(c), label(str(c))) for c in self.frame.columns]


@dataclass(frozen=True)
class Figure:
    name: str
    caption: str
    svg: str
    sources: tuple[Source, ...]


@dataclass(frozen=True)
class AppendixLinks:
    """A list of links from the main page to the appendix tables (anchor, caption)."""

    intro: str
    items: tuple[tuple[str, str], ...]


Block = Heading | Paragraph | Table | Figure | AppendixLinks

APPENDIX = "appendix"


@dataclass
class Document:
    title: str
    blocks: list[Block] = field(default_factory=list)
    appendix: list[Table] = field(default_factory=list)

    def add(self, *blocks: Block) -> None:
        self.blocks.extend(blocks)

    def add_appendix(self, caption: str, frame: pd.DataFrame, sources: tuple[Source, ...],
                     labels: tuple[tuple[str, str], ...] = ()) -> str:
        """Append a per-row table to the appendix; return its reference ("A3")."""
        ref = f"A{len(self.appendix) + 1}"
        self.appendix.append(Table(f"{ref}. {caption}", frame, sources, labels, anchor=ref.lower()))
        return ref

    def appendix_links(self, intro: str) -> AppendixLinks:
        return AppendixLinks(intro, tuple((t.anchor, t.caption) for t in self.appendix))


LABELS = {
    "matrix": "matrix", "definition": "definition", "check": "check", "tp": "TP", "fn": "FN", "fp": "FP",
    "tn": "TN", "detection_denominator": "TP + FN", "detection_rate": "detection rate",
    "false_positive_denominator": "FP + TN", "false_positive_rate": "false-positive rate",
    "excluded_unobservable": "not counted (unobservable)", "not_applicable": "not applicable",
    "predicted_misses_silent": "predicted misses (silent)", "observable": "counted cells",
    "detected": "detected", "detected_by": "detected by checks", "layers_identical": "layers identical",
    "layers_differing": "layers differing", "differing_elements": "differing elements",
    "differing_per_million": "differing per million", "max_ulp": "max ulp", "nonfinite_a": "non-finite A",
    "nonfinite_b": "non-finite B", "subnormal_a": "subnormal A", "subnormal_b": "subnormal B",
    "predicted_bitwise": "predicted bitwise", "prediction_held": "prediction held",
    "prediction_failed": "prediction failed", "bytes_equal": "byte-equal layers", "differing_int8": "differing int8",
    "all_pow2": "all scales pow2", "scale_min": "min scale", "scale_max": "max scale", "self_consistent":
    "self-consistent", "allow_unverified": "unverified allowed", "first_divergence": "first divergence",
    "earliest_divergence": "earliest divergence", "flip_rate": "flip rate", "flip_rate_low": "flip rate low",
    "flip_rate_high": "flip rate high", "confident_flips": "confident flips", "differing_positions":
    "differing positions", "changed_positions": "changed positions", "predicted_miss": "predicted miss",
    "predicted_observable": "predicted observable", "this_run": "this run", "paper_model": "paper's model",
    "max_rss_mb": "max RSS (MB)", "caught_cells": "caught cells", "counted_cells": "counted cells",
    "caught_by": "caught by", "matrix_a": "matrix A", "prediction_a": "prediction A", "matrix_b": "matrix B",
    "prediction_b": "prediction B", "rows": "cell rows", "flipped": "flipped",
}
PERCENT_SUFFIXES = ("_rate", "_rate_low", "_rate_high", "fraction")


def label(column: str) -> str:
    """A column's human label: from ``LABELS``, else its name with spaces."""
    return LABELS.get(column, column.replace("_", " "))


def _cell(value: Any, column: str = "") -> str:
    if isinstance(value, (list, tuple)) or (hasattr(value, "ndim") and value.ndim == 1):
        return ", ".join(_cell(v) for v in value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, (bool,)) or type(value).__name__ == "bool_":
        return "yes" if value else "no"
    if isinstance(value, int) or (hasattr(value, "dtype") and value.dtype.kind in "iu"):
        return f"{int(value):,}"
    if isinstance(value, float) or (hasattr(value, "dtype") and value.dtype.kind == "f"):
        number = float(value)
        if column.endswith(PERCENT_SUFFIXES):
            return f"{100 * number:.2f}%"
        if "per_million" in column:
            return f"{number:.2f}"
        if number.is_integer() and abs(number) < 1e15:
            return f"{int(number):,}"
        return f"{number:,.4g}" if abs(number) >= 1e4 else f"{number:.4g}"
    return str(value)


def _sources(sources: tuple[Source, ...]) -> str:
    return "; ".join(s.line() for s in sources)


def to_markdown(doc: Document) -> tuple[str, dict[str, str]]:
    """The Markdown text and the SVG files it links ({file name: svg})."""
    return _markdown(doc.title, doc.blocks)


def appendix_markdown(doc: Document) -> str:
    return _markdown(f"{doc.title}: appendix", doc.appendix)[0]


def _markdown(title: str, blocks: list[Block] | list[Table]) -> tuple[str, dict[str, str]]:
    out = [f"# {title}", ""]
    figures: dict[str, str] = {}
    for block in blocks:
        if isinstance(block, AppendixLinks):
            out += [block.intro, ""] + [f"- [{caption}]({APPENDIX}.md#{anchor})" for anchor, caption in block.items]
            out.append("")
        elif isinstance(block, Heading):
            out += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            out += [block.text, ""]
        elif isinstance(block, Table):
            cols = [str(c) for c in block.frame.columns]
            if block.anchor:
                out += [f'<a id="{block.anchor}"></a>', ""]
            out += [f"**{block.caption}**", "", "| " + " | ".join(block.headers()) + " |", "|" + "---|" * len(cols)]
            for row in block.frame.itertuples(index=False):
                out.append("| " + " | ".join(_cell(v, c).replace("|", "\\|") for v, c in zip(row, cols)) + " |")
            out += ["", f"*{_sources(block.sources)}*", ""]
        else:
            file = f"{block.name}.svg"
            figures[file] = block.svg
            out += [f"![{block.caption}]({file})", "", f"*{block.caption} — {_sources(block.sources)}*", ""]
    return "\n".join(out), figures


_STYLE = (
    "*{box-sizing:border-box}"
    "body{font-family:sans-serif;max-width:74em;margin:1.5em auto;padding:0 1em;color:#222;line-height:1.35}"
    ".tw{max-width:100%;overflow-x:auto;margin:.5em 0}"
    "table{border-collapse:collapse;font-size:.82em;max-width:100%}"
    "caption{text-align:left;font-weight:bold;padding:.2em 0}"
    "td,th{border:1px solid #ccc;padding:.2em .45em;text-align:right;vertical-align:top;white-space:nowrap}"
    "th{background:#f3f3f3;font-weight:600;text-align:left;white-space:normal}"
    "td.t{text-align:left;white-space:normal;overflow-wrap:break-word;min-width:5em}"
    ".src{color:#666;font-size:.78em;overflow-wrap:anywhere}figure{margin:1em 0}"
    "figure svg{max-width:100%;height:auto}p{overflow-wrap:anywhere}"
    "code{font-size:.92em;background:#f3f3f3;padding:0 .2em}"
    "@page{size:A4;margin:12mm}"
    "@media print{body{max-width:none;margin:0;padding:0;font-size:9pt}.tw{overflow:visible}"
    "table{font-size:7pt;width:100%;page-break-inside:auto}tr{page-break-inside:avoid}"
    "td,th{white-space:normal;overflow-wrap:anywhere;padding:.1em .25em}td.t{min-width:0}"
    "figure{page-break-inside:avoid}figure svg{max-height:90mm;width:auto}}"
)


_CODE = re.compile(r"`([^`]+)`")


def _text(text: str) -> str:
    """Escaped text with `spans` shown as code."""
    return _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", escape(text))


def _td(value: object, column: str) -> str:
    text = _cell(value, column)
    numeric = not isinstance(value, str) or text == "—"
    return f"<td>{escape(text)}</td>" if numeric else f'<td class="t">{escape(text)}</td>'


def to_html(doc: Document) -> str:
    """One self-contained page: no external files, scripts or fonts (the appendix is linked)."""
    return _html(doc.title, doc.blocks)


def appendix_html(doc: Document) -> str:
    return _html(f"{doc.title}: appendix", doc.appendix)


def _html(title: str, blocks: list[Block] | list[Table]) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
           f"<h1>{escape(title)}</h1>"]
    for block in blocks:
        if isinstance(block, AppendixLinks):
            items = "".join(f'<li><a href="{APPENDIX}.html#{a}">{escape(c)}</a></li>' for a, c in block.items)
            out.append(f"<p>{_text(block.intro)}</p><ul>{items}</ul>")
        elif isinstance(block, Heading):
            out.append(f"<h{block.level}>{escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{_text(block.text)}</p>")
        elif isinstance(block, Table):
            cols = [str(c) for c in block.frame.columns]
            head = "".join(f'<th title="{escape(c)}">{escape(h)}</th>' for c, h in zip(cols, block.headers()))
            rows = "".join(
                "<tr>" + "".join(_td(v, c) for v, c in zip(row, cols)) + "</tr>"
                for row in block.frame.itertuples(index=False)
            )
            anchor = f' id="{escape(block.anchor)}"' if block.anchor else ""
            out.append(f'<div class="tw"><table{anchor}><caption>{escape(block.caption)}</caption><tr>{head}</tr>{rows}'
                       "</table></div>")
            out.append(f'<p class="src">{escape(_sources(block.sources))}</p>')
        else:
            out.append(f'<figure id="{escape(block.name)}">{block.svg}'
                       f'<figcaption>{escape(block.caption)}<br><span class="src">'
                       f"{escape(_sources(block.sources))}</span></figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


def write(doc: Document, out_dir: Path) -> list[Path]:
    """Write report.md, its SVG figures, report.html and the appendix atomically; return every path written."""
    md, figures = to_markdown(doc)
    written = []
    for name, svg in sorted(figures.items()):
        write_bytes(out_dir / name, svg.encode())
        written.append(out_dir / name)
    files = {"report.md": md, "report.html": to_html(doc), f"{APPENDIX}.md": appendix_markdown(doc),
             f"{APPENDIX}.html": appendix_html(doc)}
    for name, text in files.items():
        write_bytes(out_dir / name, text.encode())
    return written + [out_dir / name for name in files]

"""A report as a list of blocks rendered twice: Markdown (figures as sibling SVG files) and one
self-contained HTML file (figures inline), with an appendix of per-row tables beside it
(appendix.md, appendix.html) that the main page links to. Each table and figure carries its source:
the Parquet file it was read from and that file's SHA-256.

Tables keep their frames' raw column names (what a reader finds in the Parquet file) and are shown
with human labels (``LABELS``) and formatted numbers: rates as percents, counts with thousands
separators. The HTML page fits a 1280 px window and prints compactly on A4 or Letter without cut
columns: long cells wrap, a table wider than the page scrolls inside its own box on screen and
shrinks in print, figures scale down. Text is plain; a span in backticks is shown as code, and
"appendix A3" links to that appendix table.

Every heading gets a GitHub-style slug as its id, so a ``Contents`` block links to the level-2
headings in both renderings. A document made with ``main_rows`` moves any longer table it is given
to the appendix and leaves a one-line link in its place, so the main page stays short."""

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


BoxLine = str | tuple[str, str]   # plain text, or (verdict word, text)


@dataclass(frozen=True)
class Box:
    """A bordered box of short lines (the first-screen verdicts); a line given as (verdict, text)
    shows its verdict word first, in bold, so the eye can run down the verdicts."""

    title: str
    lines: tuple[BoxLine, ...]


@dataclass(frozen=True)
class Contents:
    """A table of contents: a link to every level-2 heading of the page it is placed in."""

    title: str = "Contents"


@dataclass(frozen=True)
class Definitions:
    """Terms and their meanings (the glossary): a definition list, not a table of rows."""

    title: str
    items: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class AppendixLinks:
    """A list of links from the main page to the appendix tables (anchor, caption)."""

    intro: str
    items: tuple[tuple[str, str], ...]


Block = Heading | Paragraph | Table | Figure | AppendixLinks | Box | Contents | Definitions

APPENDIX = "appendix"
MAIN_ROWS = 12   # the most rows a main-page table keeps in a report made with main_rows=MAIN_ROWS


@dataclass
class Document:
    title: str
    blocks: list[Block] = field(default_factory=list)
    appendix: list[Table] = field(default_factory=list)
    main_rows: int | None = None   # None: every table stays where it is added

    def add(self, *blocks: Block) -> None:
        self.blocks.extend(self._placed(b) for b in blocks)

    def _placed(self, block: Block) -> Block:
        """A table longer than ``main_rows`` goes to the appendix; a one-line link takes its place."""
        if not isinstance(block, Table) or self.main_rows is None or len(block.frame) <= self.main_rows:
            return block
        ref = self.add_appendix(block.caption, block.frame, block.sources, block.labels)
        return Paragraph(f"{block.caption}: {len(block.frame):,} rows, appendix {ref}.")

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


def slug(text: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces made hyphens, so the
    same link works in the Markdown (GitHub makes the ids) and in the HTML (the ids are ours)."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _heading_ids(title: str, blocks: list[Block] | list[Table]) -> list[str]:
    """The id of each Heading in ``blocks`` in order, unique on the page the way GitHub makes them
    (the title's h1 counts first; a repeated slug gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    ids = []
    for text in [title] + [b.text for b in blocks if isinstance(b, Heading)]:
        base = slug(text)
        ids.append(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return ids[1:]


def _contents(blocks: list[Block] | list[Table], ids: list[str]) -> list[tuple[str, str]]:
    """(id, text) of every level-2 heading."""
    headings = [b for b in blocks if isinstance(b, Heading)]
    return [(i, h.text) for h, i in zip(headings, ids) if h.level == 2]


_APPENDIX_REF = re.compile(r"\bappendix (A\d+(?:(?:, | and )A\d+)*)")
_REF = re.compile(r"A(\d+)")


def _link_appendix(text: str, link: str) -> str:
    """Each "appendix A3" reference made a link: ``link`` formats (anchor, reference)."""
    return _APPENDIX_REF.sub(lambda m: "appendix " + _REF.sub(lambda r: link.format(f"a{r.group(1)}", r.group(0)),
                                                               m.group(1)), text)


def _md_text(text: str) -> str:
    return _link_appendix(text, f"[{{1}}]({APPENDIX}.md#{{0}})")


def to_markdown(doc: Document) -> tuple[str, dict[str, str]]:
    """The Markdown text and the SVG files it links ({file name: svg})."""
    return _markdown(doc.title, doc.blocks)


def appendix_markdown(doc: Document) -> str:
    return _markdown(f"{doc.title}: appendix", doc.appendix)[0]


def _md_table(block: Table) -> list[str]:
    cols = [str(c) for c in block.frame.columns]
    out = [f'<a id="{block.anchor}"></a>', ""] if block.anchor else []
    out += [f"**{block.caption}**", "", "| " + " | ".join(block.headers()) + " |", "|" + "---|" * len(cols)]
    for row in block.frame.itertuples(index=False):
        cells = (_cell(v, c).replace("|", "\\|").replace("\n", " ") for v, c in zip(row, cols))
        out.append("| " + " | ".join(cells) + " |")
    return out + [""] + ([f"*{_sources(block.sources)}*", ""] if block.sources else [])


def _md_box_line(line: BoxLine) -> str:
    return _md_text(line) if isinstance(line, str) else f"**{line[0]}** {_md_text(line[1])}"


def _markdown(title: str, blocks: list[Block] | list[Table]) -> tuple[str, dict[str, str]]:
    out = [f"# {title}", ""]
    figures: dict[str, str] = {}
    ids = _heading_ids(title, blocks)
    for block in blocks:
        if isinstance(block, AppendixLinks):
            out += [block.intro, ""] + [f"- [{caption}]({APPENDIX}.md#{anchor})" for anchor, caption in block.items]
            out.append("")
        elif isinstance(block, Heading):
            out += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            out += [_md_text(block.text), ""]
        elif isinstance(block, Contents):
            out += [f"**{block.title}**", ""] + [f"- [{text}](#{i})" for i, text in _contents(blocks, ids)] + [""]
        elif isinstance(block, Box):
            out += [f"> **{block.title}**", ">"] + [f"> - {_md_box_line(line)}" for line in block.lines] + [""]
        elif isinstance(block, Definitions):
            out += [f"**{block.title}**", ""] + [f"- **{term}**: {_md_text(meaning)}" for term, meaning in block.items] + [""]
        elif isinstance(block, Table):
            out += _md_table(block)
        else:
            file = f"{block.name}.svg"
            figures[file] = block.svg
            out += [f"![{block.caption}]({file})", "", f"*{block.caption} — {_sources(block.sources)}*", ""]
    return "\n".join(out), figures


_STYLE = (
    "*{box-sizing:border-box}"
    "body{font-family:sans-serif;max-width:74em;margin:1.5em auto;padding:0 1em;color:#222;line-height:1.35}"
    "h2{border-bottom:1px solid #ddd;padding-bottom:.1em;margin-top:1.4em}"
    ".tw{max-width:100%;overflow-x:auto;margin:.5em 0}"
    "table{border-collapse:collapse;font-size:.82em;max-width:100%}"
    "caption{text-align:left;font-weight:bold;padding:.2em 0}"
    "td,th{border:1px solid #ccc;padding:.2em .45em;text-align:right;vertical-align:top;white-space:nowrap}"
    "th{background:#f3f3f3;font-weight:600;text-align:left;white-space:normal}"
    "td.t{text-align:left;white-space:normal;overflow-wrap:break-word;min-width:5em}"
    ".src{color:#666;font-size:.78em;overflow-wrap:anywhere}figure{margin:1em 0}"
    "figure svg{max-width:100%;height:auto}p{overflow-wrap:anywhere}"
    "code{font-size:.92em;background:#f3f3f3;padding:0 .2em}"
    ".box{border:2px solid #333;border-radius:4px;padding:.5em .9em;margin:1em 0;background:#fafafa}"
    ".box-title{font-weight:bold;margin:0 0 .3em}.box ul{margin:0;padding-left:1.2em}.box li{margin:.15em 0}"
    ".toc{margin:.8em 0}.toc-title,.defs-title{font-weight:bold;margin:.3em 0}.toc ol{margin:0;columns:2;column-gap:2em}"
    ".defs{display:grid;grid-template-columns:max-content 1fr;gap:.25em 1em}.defs dt{font-weight:600}"
    ".defs dd{margin:0}"
    "figure.half{display:inline-block;vertical-align:top;width:49%;margin:1em 0}"
    "@page{margin:12mm}"
    "@media print{*{-webkit-print-color-adjust:exact;print-color-adjust:exact}"
    "body{max-width:none;margin:0;padding:0;font-size:8pt;line-height:1.2}h1{font-size:12pt;margin:0 0 .3em}"
    "h2{font-size:10.5pt;margin:.8em 0 .25em}p{margin:.3em 0}.box{margin:.4em 0;padding:.25em .5em}"
    "h2,h3,caption{break-after:avoid;page-break-after:avoid}.tw{overflow:visible;margin:.3em 0}"
    "table{font-size:6.5pt;line-height:1.15;width:100%;page-break-inside:auto}"
    "tr,.box,figure{page-break-inside:avoid;break-inside:avoid}"
    "td,th{white-space:normal;overflow-wrap:anywhere;padding:0 .2em}td.t{min-width:0}.src{font-size:6.5pt}"
    "figure{margin:.3em 0}figcaption{font-size:7pt}figure svg{max-height:62mm;width:auto;max-width:100%}"
    ".toc ol{columns:3}.defs{display:block;columns:2;column-gap:1.5em}"
    ".defs dt{float:left;margin:0 .4em 0 0}.defs dd{margin:0 0 .15em 0;break-inside:avoid}}"
)


_CODE = re.compile(r"`([^`]+)`")


def _text(text: str) -> str:
    """Escaped text with `spans` shown as code and appendix references linked."""
    code = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", escape(text))
    return _link_appendix(code, f'<a href="{APPENDIX}.html#{{0}}">{{1}}</a>')


def _td(value: object, column: str) -> str:
    text = _cell(value, column)
    numeric = not isinstance(value, str) or text == "—"
    return f"<td>{escape(text)}</td>" if numeric else f'<td class="t">{escape(text)}</td>'


def to_html(doc: Document) -> str:
    """One self-contained page: no external files, scripts or fonts (the appendix is linked)."""
    return _html(doc.title, doc.blocks)


def appendix_html(doc: Document) -> str:
    return _html(f"{doc.title}: appendix", doc.appendix)


def _html_table(block: Table) -> str:
    cols = [str(c) for c in block.frame.columns]
    head = "".join(f'<th title="{escape(c)}">{escape(h)}</th>' for c, h in zip(cols, block.headers()))
    rows = "".join("<tr>" + "".join(_td(v, c) for v, c in zip(row, cols)) + "</tr>"
                   for row in block.frame.itertuples(index=False))
    anchor = f' id="{escape(block.anchor)}"' if block.anchor else ""
    source = f'\n<p class="src">{escape(_sources(block.sources))}</p>' if block.sources else ""
    return (f'<div class="tw"><table{anchor}><caption>{escape(block.caption)}</caption><tr>{head}</tr>{rows}'
            f"</table></div>{source}")


def _html_box(block: Box) -> str:
    items = "".join(f"<li>{_text(line)}</li>" if isinstance(line, str) else
                    f'<li><strong class="verdict">{escape(line[0])}</strong> {_text(line[1])}</li>'
                    for line in block.lines)
    return f'<div class="box" role="note"><p class="box-title">{escape(block.title)}</p><ul>{items}</ul></div>'


_SVG_WIDTH = re.compile(r'<svg[^>]* width="([\d.]+)"')
HALF = 480   # px: a figure at most this wide sits beside its neighbour (on screen and in print)


def _figure_class(svg: str) -> str:
    found = _SVG_WIDTH.search(svg)
    return ' class="half"' if found and float(found.group(1)) <= HALF else ""


def _html(title: str, blocks: list[Block] | list[Table]) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
           f'<h1 id="{slug(title)}">{escape(title)}</h1>']
    ids = _heading_ids(title, blocks)
    headings = iter(ids)
    for block in blocks:
        if isinstance(block, AppendixLinks):
            items = "".join(f'<li><a href="{APPENDIX}.html#{a}">{escape(c)}</a></li>' for a, c in block.items)
            out.append(f"<p>{_text(block.intro)}</p><ul>{items}</ul>")
        elif isinstance(block, Heading):
            out.append(f'<h{block.level} id="{next(headings)}">{escape(block.text)}</h{block.level}>')
        elif isinstance(block, Paragraph):
            out.append(f"<p>{_text(block.text)}</p>")
        elif isinstance(block, Contents):
            items = "".join(f'<li><a href="#{i}">{escape(text)}</a></li>' for i, text in _contents(blocks, ids))
            out.append(f'<nav class="toc"><p class="toc-title">{escape(block.title)}</p><ol>{items}</ol></nav>')
        elif isinstance(block, Box):
            out.append(_html_box(block))
        elif isinstance(block, Definitions):
            items = "".join(f"<dt>{escape(term)}</dt><dd>{_text(meaning)}</dd>" for term, meaning in block.items)
            out.append(f'<p class="defs-title">{escape(block.title)}</p><dl class="defs">{items}</dl>')
        elif isinstance(block, Table):
            out.append(_html_table(block))
        else:
            out.append(f'<figure id="{escape(block.name)}"{_figure_class(block.svg)}>{block.svg}'
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

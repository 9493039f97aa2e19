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
to the appendix and leaves a one-line link in its place, so the main page stays short.

The form (the page, each block's markup, the style sheet) is in the jinja2 templates under
``templates/``, one pair per format; this module decides what they show and hands them plain values
(``_views``): formatted cells, heading ids, text cut into code spans and appendix references."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import pandas as pd
from jinja2 import (Environment, PackageLoader, StrictUndefined, pass_eval_context,
                    select_autoescape)
from jinja2.nodes import EvalContext
from markupsafe import Markup

from ..files.atomic import write_bytes


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


# ---- what the templates (templates/) are given: plain values, every number already formatted ----

@dataclass(frozen=True)
class Piece:
    """A stretch of text; with an ``anchor``, a reference to that appendix table (``A3``, anchor ``a3``)."""

    text: str
    anchor: str = ""


@dataclass(frozen=True)
class Run:
    """Pieces shown as code (a span in backticks in the text) or as plain text."""

    code: bool
    pieces: tuple[Piece, ...]


Inline = tuple[Run, ...]
_CODE = re.compile(r"`([^`]+)`")
_APPENDIX_REF = re.compile(r"\bappendix (A\d+(?:(?:, | and )A\d+)*)")
_REF = re.compile(r"A(\d+)")


def inline(text: str) -> Inline:
    """Text split into its `code` spans and plain runs, each "appendix A3" reference a piece of its own,
    so that each format's template writes the markup (backticks and links, or code and a elements)."""
    return tuple(Run(bool(i % 2), _pieces(part)) for i, part in enumerate(_CODE.split(text)) if part)


def _pieces(text: str) -> tuple[Piece, ...]:
    """``text`` cut around each table reference that follows "appendix " (``appendix A1, A2 and A3``)."""
    spans = [r.span() for m in _APPENDIX_REF.finditer(text) for r in _REF.finditer(text, m.start(1), m.end(1))]
    cuts = [0, *(i for span in spans for i in span), len(text)]
    return tuple(Piece(text[a:b], f"a{text[a + 1:b]}" if i % 2 else "")
                 for i, (a, b) in enumerate(zip(cuts, cuts[1:])) if a < b)


class Cell(NamedTuple):   # cheap to build: a report's appendix holds ~85,000 cells
    text: str
    numeric: bool   # right-aligned in HTML; a text cell is left-aligned and wraps


@dataclass(frozen=True)
class _HeadingView:
    level: int
    text: str
    id: str
    kind: ClassVar[str] = "heading"


@dataclass(frozen=True)
class _ParagraphView:
    text: Inline
    kind: ClassVar[str] = "paragraph"


@dataclass(frozen=True)
class _ContentsView:
    title: str
    items: tuple[tuple[str, str], ...]   # (heading id, heading text) of each level-2 heading
    kind: ClassVar[str] = "contents"


@dataclass(frozen=True)
class _BoxView:
    title: str
    lines: tuple[tuple[str | None, Inline], ...]   # (verdict word or None, text)
    kind: ClassVar[str] = "box"


@dataclass(frozen=True)
class _DefinitionsView:
    title: str
    items: tuple[tuple[str, Inline], ...]
    kind: ClassVar[str] = "definitions"


@dataclass(frozen=True)
class _LinksView:
    intro: Inline
    items: tuple[tuple[str, str], ...]   # (anchor, caption)
    kind: ClassVar[str] = "links"


@dataclass(frozen=True)
class _TableView:
    caption: str
    anchor: str
    head: tuple[tuple[str, str], ...]   # (raw column name, label)
    rows: list[tuple[Cell, ...]]
    sources: str
    kind: ClassVar[str] = "table"


@dataclass(frozen=True)
class _FigureView:
    name: str
    file: str
    caption: str
    svg: str
    half: bool   # narrow enough to sit beside its neighbour
    sources: str
    kind: ClassVar[str] = "figure"


_View = (_HeadingView | _ParagraphView | _ContentsView | _BoxView | _DefinitionsView | _LinksView | _TableView
         | _FigureView)


def _table_cell(value: object, column: str) -> Cell:
    text = _cell(value, column)
    return Cell(text, not isinstance(value, str) or text == "—")


def _table_view(block: Table) -> _TableView:
    cols = [str(c) for c in block.frame.columns]
    rows = [tuple(_table_cell(v, c) for v, c in zip(row, cols)) for row in block.frame.itertuples(index=False)]
    return _TableView(block.caption, block.anchor, tuple(zip(cols, block.headers())), rows, _sources(block.sources))


_SVG_WIDTH = re.compile(r'<svg[^>]* width="([\d.]+)"')
HALF = 480   # px: a figure at most this wide sits beside its neighbour (on screen and in print)


def _half(svg: str) -> bool:
    found = _SVG_WIDTH.search(svg)
    return found is not None and float(found.group(1)) <= HALF


def _views(title: str, blocks: list[Block] | list[Table]) -> list[_View]:
    """Each block as the values its template shows (one list for both formats)."""
    ids = _heading_ids(title, blocks)
    headings = iter(ids)
    contents = tuple((i, b.text) for b, i in zip([b for b in blocks if isinstance(b, Heading)], ids) if b.level == 2)
    views: list[_View] = []
    for block in blocks:
        if isinstance(block, AppendixLinks):
            views.append(_LinksView(inline(block.intro), block.items))
        elif isinstance(block, Heading):
            views.append(_HeadingView(block.level, block.text, next(headings)))
        elif isinstance(block, Paragraph):
            views.append(_ParagraphView(inline(block.text)))
        elif isinstance(block, Contents):
            views.append(_ContentsView(block.title, contents))
        elif isinstance(block, Box):
            views.append(_BoxView(block.title, tuple((None, inline(line)) if isinstance(line, str) else
                                                     (line[0], inline(line[1])) for line in block.lines)))
        elif isinstance(block, Definitions):
            views.append(_DefinitionsView(block.title, tuple((term, inline(meaning)) for term, meaning in block.items)))
        elif isinstance(block, Table):
            views.append(_table_view(block))
        else:
            views.append(_FigureView(block.name, f"{block.name}.svg", block.caption, block.svg, _half(block.svg),
                                     _sources(block.sources)))
    return views


def _md_cell(text: str) -> str:
    """A table cell's text for Markdown: a pipe escaped, a line break made a space (the row stays one line)."""
    return text.replace("|", "\\|").replace("\n", " ")


@pass_eval_context
def _escaped(context: EvalContext, value: Any) -> Any:
    """Every value an HTML template prints, escaped as ``html.escape`` does (``&#x27;``, ``&quot;``);
    markup (a macro's output, a figure's SVG) as it is. Markdown values pass unchanged."""
    if not context.autoescape or hasattr(value, "__html__"):
        return value
    return Markup(escape(str(value)))


_TEMPLATES = Environment(loader=PackageLoader(__name__.rpartition(".")[0], "templates"),
                         autoescape=select_autoescape(enabled_extensions=("html",), default=False),
                         finalize=_escaped, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                         keep_trailing_newline=False)  # a template file's last newline is not output
_TEMPLATES.filters["md_cell"] = _md_cell
_TEMPLATES.globals["appendix"] = APPENDIX


def _render(form: str, title: str, views: list[_View]) -> str:
    """One page in ``form`` ("md" or "html") through templates/page.<form>."""
    return _TEMPLATES.get_template(f"page.{form}").render(title=title, title_id=slug(title), blocks=views)


def to_markdown(doc: Document) -> tuple[str, dict[str, str]]:
    """The Markdown text and the SVG files it links ({file name: svg})."""
    views = _views(doc.title, doc.blocks)
    return _render("md", doc.title, views), {v.file: v.svg for v in views if isinstance(v, _FigureView)}


def appendix_markdown(doc: Document) -> str:
    title = f"{doc.title}: appendix"
    return _render("md", title, _views(title, doc.appendix))


def to_html(doc: Document) -> str:
    """One self-contained page: no external files, scripts or fonts (the appendix is linked)."""
    return _render("html", doc.title, _views(doc.title, doc.blocks))


def appendix_html(doc: Document) -> str:
    title = f"{doc.title}: appendix"
    return _render("html", title, _views(title, doc.appendix))


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

"""A report as a list of blocks rendered twice: Markdown (figures as sibling SVG files) and one
self-contained HTML file (figures inline). Each table and figure carries its source: the Parquet
file it was read from and that file's SHA-256."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

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


@dataclass(frozen=True)
class Figure:
    name: str
    caption: str
    svg: str
    sources: tuple[Source, ...]


Block = Heading | Paragraph | Table | Figure


@dataclass
class Document:
    title: str
    blocks: list[Block] = field(default_factory=list)

    def add(self, *blocks: Block) -> None:
        self.blocks.extend(blocks)


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _sources(sources: tuple[Source, ...]) -> str:
    return "; ".join(s.line() for s in sources)


def to_markdown(doc: Document) -> tuple[str, dict[str, str]]:
    """The Markdown text and the SVG files it links ({file name: svg})."""
    out = [f"# {doc.title}", ""]
    figures: dict[str, str] = {}
    for block in doc.blocks:
        if isinstance(block, Heading):
            out += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            out += [block.text, ""]
        elif isinstance(block, Table):
            cols = list(block.frame.columns)
            out += [f"**{block.caption}**", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            for row in block.frame.itertuples(index=False):
                out.append("| " + " | ".join(_cell(v).replace("|", "\\|") for v in row) + " |")
            out += ["", f"*{_sources(block.sources)}*", ""]
        else:
            file = f"{block.name}.svg"
            figures[file] = block.svg
            out += [f"![{block.caption}]({file})", "", f"*{block.caption} — {_sources(block.sources)}*", ""]
    return "\n".join(out), figures


_STYLE = (
    "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0;font-size:.85em}"
    "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}th{background:#f3f3f3}"
    ".src{color:#666;font-size:.8em}figure{margin:1em 0}"
)


def to_html(doc: Document) -> str:
    """One self-contained page: no external files, scripts or fonts."""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{escape(doc.title)}</title><style>{_STYLE}</style></head><body>",
           f"<h1>{escape(doc.title)}</h1>"]
    for block in doc.blocks:
        if isinstance(block, Heading):
            out.append(f"<h{block.level}>{escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{escape(block.text)}</p>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{escape(str(c))}</th>" for c in block.frame.columns)
            rows = "".join(
                "<tr>" + "".join(f"<td>{escape(_cell(v))}</td>" for v in row) + "</tr>"
                for row in block.frame.itertuples(index=False)
            )
            out.append(f"<table><caption>{escape(block.caption)}</caption><tr>{head}</tr>{rows}</table>")
            out.append(f'<p class="src">{escape(_sources(block.sources))}</p>')
        else:
            out.append(f'<figure id="{escape(block.name)}">{block.svg}'
                       f'<figcaption>{escape(block.caption)}<br><span class="src">'
                       f"{escape(_sources(block.sources))}</span></figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


def write(doc: Document, out_dir: Path) -> list[Path]:
    """Write report.md, its SVG figures and report.html atomically; return every path written."""
    md, figures = to_markdown(doc)
    written = []
    for name, svg in sorted(figures.items()):
        write_bytes(out_dir / name, svg.encode())
        written.append(out_dir / name)
    write_bytes(out_dir / "report.md", md.encode())
    write_bytes(out_dir / "report.html", to_html(doc).encode())
    return written + [out_dir / "report.md", out_dir / "report.html"]

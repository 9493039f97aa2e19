"""Every relative link in the documents committed under docs/ (and the README) points at a file
that is committed beside it: a reviewer who opens a copied report must not meet a dead link."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
HTML_LINK = re.compile(r"""(?:href|src)="([^"]+)\"""")


def _targets(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    found = MD_LINK.findall(text) if path.suffix == ".md" else HTML_LINK.findall(text)
    return [t for t in found if not re.match(r"^(https?:|mailto:|#|data:)", t)]


def dead_links(files: list[Path]) -> list[str]:
    """'file: target' for each relative link whose target (without its #fragment) does not exist."""
    out = []
    for f in files:
        for target in _targets(f):
            rel = target.split("#", 1)[0]
            if rel and not (f.parent / rel).exists():
                out.append(f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}: {target}")
    return out


def test_no_dead_links_under_docs() -> None:
    files = sorted(p for p in (ROOT / "docs").rglob("*") if p.suffix in (".md", ".html")) + [ROOT / "README.md"]
    assert dead_links(files) == []


def test_a_planted_dead_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "here.svg").write_text("<svg/>")
    page = tmp_path / "r.md"
    page.write_text("![a](here.svg) ![b](gone.svg) [c](https://example.org) [d](#top)")
    html = tmp_path / "r.html"
    html.write_text('<a href="appendix.html#a1">x</a><img src="here.svg">')
    assert dead_links([page, html]) == [f"{page}: gone.svg", f"{html}: appendix.html#a1"]

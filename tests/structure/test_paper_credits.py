"""Every paper credit names the right paper, by arXiv id.

The project reproduces two papers, arXiv:2608.13756 (localizing cross-kernel divergence: the
per-layer alibi, the K sweep, the probe, prefill versus decode) and arXiv:2609.00363 (power-of-two
scales and tolerance-based conformance: the fault campaign, the requant rule and its division
statistics, perplexity, H1 and G1). Texts that called them "the first paper" and "the second
paper" swapped them more than once, so:

* no project text says "first paper" or "second paper" (nor "first/second of the two papers"),
  however the phrase is broken over lines, comment markers or string literals;
* a result characteristic of one paper (``CREDITS``), quoted on a line or in a sentence that also
  names a paper (arXiv id, or the report's tags [IA] / [PT]), must name that result's paper there;
* paper.yaml's claims carry their results under the right paper, its ids are the ones below, and
  ksweep.yaml (Section VII of arXiv:2608.13756 only) names its paper by id.

Exempt: amendments/ (append-only and hash-chained: a wrong sentence there is corrected by a new
amendment, never edited, so the checker cannot demand an edit there), docs/measured/ (committed
copies of earlier runs' outputs, kept byte for byte as those runs wrote them), and this file (it
quotes the phrases it forbids). The last tests plant wrong credits in temporary files and require
the scanner to name them, so a checker that stopped finding anything fails here.
"""

from __future__ import annotations

import bisect
import re
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import pytest

from int8alibi import strict_yaml

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve()

PAPERS = {"IA": "2608.13756", "PT": "2609.00363"}
# How a text names a paper: its arXiv id, or the report's tag.
ALIASES = {"IA": ("2608.13756", "[IA]"), "PT": ("2609.00363", "[PT]")}

# Results only one of the two papers reports (number formats as the texts write them).
CREDITS: dict[str, tuple[str, ...]] = {
    "PT": ("6.42", "0.749", "127.5", "157%", "8,232", "8232", "1,278", "75.0%", "55.76", "11.39", "99.8%",
           "+0.32%", "+0.54%", "+0.48%", "A-10.4", "1,042"),
    "IA": ("0.518", "2,374,517", "2374517", "0.942", "8.6%", "2.9%", "4.7%", "573,440", "573440", "8.2%",
           "52.7%", "188 of 196", "0.0352", "2.8 bits"),
}

SCANNED = ("README.md", "CITATION.cff", "CHANGELOG.md", "docs", "workflow", "config", "preregistration", "dev",
           "tests", "profiles", ".github")
EXEMPT = ("amendments", "docs/measured")
SUFFIXES = {"", ".py", ".smk", ".rst", ".md", ".yaml", ".yml", ".txt", ".cff", ".toml", ".sh", ".json", ".cfg"}
MAX_BYTES = 1 << 20

ORDINAL = re.compile(r"\b(first|second|1st|2nd)\s+(?:of\s+the\s+(?:two\s+)?)?papers?\b", re.IGNORECASE)
_NUM = r"(?<![\w.,]){}(?![\d])"
VALUE = re.compile("|".join(f"(?P<{p}{i}>{_NUM.format(re.escape(v))})"
                            for p, values in CREDITS.items() for i, v in enumerate(values)))
NAMED = {p: re.compile("|".join(re.escape(a) for a in aliases)) for p, aliases in ALIASES.items()}
ANY_NAMED = re.compile("|".join(re.escape(a) for aliases in ALIASES.values() for a in aliases))

# Normalizing a line: comment markers and string quotes go, so a phrase broken over comment lines
# or concatenated literals reads as one.
_LEAD = re.compile(r"^\s*(?:#+|//+|\*+|>+)?\s*")
_QUOTES = re.compile(r"[\"'`]")
# A line that starts a new unit, never the continuation of a sentence: a blank line, a markdown
# table row, list item or fence, a YAML key, a Python statement.
_BREAK = re.compile(r"^\s*(?:$|\||[-*]\s|```|-?\s*[A-Za-z_][\w-]*:(?:\s|$)|(?:def|class|assert|return|if|elif|else|"
                    r"for|while|with|try|except|raise|import|from|@)\b|[A-Za-z_][\w.\[\]]*\s*[+\-*/]?=[^=])")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\[*])")


class Finding(NamedTuple):
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def project_texts(root: Path = ROOT) -> list[Path]:
    """Every text file under SCANNED, less the exempt folders and this file."""
    out: list[Path] = []
    for name in SCANNED:
        top = root / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else []
        for p in files:
            rel = p.relative_to(root).as_posix()
            if (p.resolve() == THIS or "__pycache__" in p.parts or any(rel.startswith(e + "/") for e in EXEMPT)
                    or p.suffix not in SUFFIXES or p.stat().st_size > MAX_BYTES):
                continue
            out.append(p)
    return out


def _joined(lines: list[tuple[int, str]]) -> tuple[str, list[int], list[int]]:
    """Lines joined by spaces, with each line's start offset and number (for offset -> line)."""
    text, starts, numbers = "", [], []
    for number, part in lines:
        starts.append(len(text))
        numbers.append(number)
        text += part + " "
    return text, starts, numbers


def _line_at(starts: list[int], numbers: list[int], offset: int) -> int:
    return numbers[bisect.bisect_right(starts, offset) - 1]


def _sentences(lines: list[str]) -> Iterable[tuple[str, Callable[[int], int]]]:
    """Each sentence, with its offset -> line number map: continuation lines joined (a comment
    block, a paragraph, a string broken over literals), split at sentence ends."""
    blocks: list[list[tuple[int, str]]] = [[]]
    comment = False
    for number, raw in enumerate(lines, 1):
        was, comment = comment, raw.lstrip().startswith("#")
        if (_BREAK.match(raw) or was != comment) and blocks[-1]:
            blocks.append([])
        norm = _normal(raw)
        if norm:
            blocks[-1].append((number, norm))
    for block in blocks:
        if not block:
            continue
        text, starts, numbers = _joined(block)
        pos = 0
        for piece in _SENTENCE_END.split(text):
            at = text.index(piece, pos)
            pos = at + len(piece)
            yield piece, lambda offset, at=at, starts=starts, numbers=numbers: _line_at(starts, numbers, at + offset)


def _normal(raw: str) -> str:
    return _QUOTES.sub(" ", _LEAD.sub("", raw, count=1)).strip()


def _credit_errors(text: str) -> list[tuple[int, str]]:
    """(offset, why) of each result in ``text`` credited (by a paper named in it) to the wrong paper."""
    if not ANY_NAMED.search(text):
        return []
    errors = []
    for m in VALUE.finditer(text):
        paper = (m.lastgroup or "").rstrip("0123456789")
        if not NAMED[paper].search(text):
            errors.append((m.start(), f"{m.group()!r} is arXiv:{PAPERS[paper]}'s, but only the other paper is named"))
    return errors


def scan_text(rel: str, text: str) -> list[Finding]:
    """The ordinal paper names and the wrong credits of one file's text."""
    lines = text.splitlines()
    found: list[Finding] = []
    for number, line in enumerate(lines, 1):
        found += [Finding(rel, number, f"{why} on this line") for _, why in _credit_errors(line)]
    for sentence, line_of in _sentences(lines):
        found += [Finding(rel, line_of(at), f"{why} in its sentence") for at, why in _credit_errors(sentence)]
    # The ordinal phrase over the whole file, whatever breaks it (lines, comment markers, literals).
    whole, starts, numbers = _joined([(n, s) for n, s in ((n, _normal(raw)) for n, raw in enumerate(lines, 1)) if s])
    found += [Finding(rel, _line_at(starts, numbers, m.start()), f"says {' '.join(m.group().split())!r}: "
                      "name the paper by its arXiv id") for m in ORDINAL.finditer(whole)]
    return sorted(set(found))


def scan(paths: Iterable[Path], root: Path = ROOT) -> list[Finding]:
    found: list[Finding] = []
    for p in paths:
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += scan_text(p.relative_to(root).as_posix() if p.is_relative_to(root) else str(p), text)
    return found


def test_no_text_calls_a_paper_first_or_second_or_credits_a_result_to_the_wrong_paper() -> None:
    paths = project_texts()
    assert len(paths) > 300 and ROOT / "README.md" in paths
    found = scan(paths)
    assert not found, "wrong or ordinal paper credits:\n" + "\n".join(map(str, found))


def misregistered(claims: Iterable[dict]) -> list[str]:
    """paper.yaml claims whose value is a result of the other paper than the one they cite."""
    wrong = []
    for claim in claims:
        value = f"{claim['value']}{'%' if claim.get('unit') == 'percent' else ''}"
        for m in VALUE.finditer(value):
            if (m.lastgroup or "").rstrip("0123456789") != claim["paper"]:
                wrong.append(f"{claim['id']}: {m.group()!r} registered under {claim['paper']}")
    return wrong


def test_paper_yaml_registers_each_result_under_its_paper() -> None:
    paper = strict_yaml.read(ROOT / "preregistration" / "paper.yaml")
    assert {k: v["arxiv"] for k, v in paper["papers"].items()} == PAPERS
    wrong = misregistered(paper["claims"])
    assert not wrong, "\n".join(wrong)


def test_ksweep_yaml_names_its_paper_by_id() -> None:
    """ksweep.yaml's `paper` block is Section VII of arXiv:2608.13756 and nothing of arXiv:2609.00363."""
    text = (ROOT / "preregistration" / "ksweep.yaml").read_text(encoding="utf-8")
    assert PAPERS["IA"] in text and PAPERS["PT"] not in text


# The scanner must find what it is for: wrong credits planted in temporary files.

PLANTED = {
    "wrong.md": ("Beside arXiv:2608.13756's 6.42% and 0.749 it gives the division statistics.\n"
                 "\n"
                 "| row | arXiv:2609.00363, Table III: 8.6% flips |\n"),
    "broken.py": ('"""The statistics the first\n'
                  'paper reports."""\n'
                  'TEXT = ("beside the second "\n'
                  '        "paper\'s values")\n'
                  "# Per arXiv:2609.00363 the FP8 exponent\n"
                  "# is 0.518 over the sweep.\n"),
    "claims.yaml": ("note: the first of the two papers\n"
                    "statement: the probe costs +157% in [IA]\n"),
}


def test_planted_wrong_credits_are_found(tmp_path: Path) -> None:
    for name, text in PLANTED.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    found = scan(sorted(tmp_path.iterdir()), tmp_path)
    where = {(f.path, f.line) for f in found}
    assert {("wrong.md", 1), ("wrong.md", 3)} <= where                       # 6.42 and 0.749; 8.6%
    assert sum("6.42" in f.what or "0.749" in f.what for f in found if f.path == "wrong.md") >= 2
    assert ("broken.py", 1) in where                                         # "first" / "paper" across lines
    assert any(f.path == "broken.py" and "second" in f.what for f in found)  # across string literals
    assert ("broken.py", 6) in where                                         # 0.518 across comment lines
    assert ("claims.yaml", 1) in where and ("claims.yaml", 2) in where
    planted = [{"id": "division-f32-differing", "paper": "IA", "value": 6.42, "unit": "percent"},
               {"id": "prefill-decode-flips-real", "paper": "PT", "value": 8.6, "unit": "percent"},
               {"id": "ppl-probe", "paper": "PT", "value": "+157%", "unit": "text"}]
    assert [w.split(":")[0] for w in misregistered(planted)] == ["division-f32-differing", "prefill-decode-flips-real"]


@pytest.mark.parametrize("text", [
    "Beside arXiv:2609.00363's 6.42% and 0.749 it gives the division statistics.\n",
    "arXiv:2608.13756 reports 8.6% of tokens flipping under real scales and 2.9% under the probe.\n",
    "Two values: 8.6% (arXiv:2608.13756) and 6.42% (arXiv:2609.00363).\n",
    "The 0.749 matches by construction on any model.\n",
    "x = 127.5  # the divisor\n",
    "The first layer and the second arm; the papers' values.\n",
])
def test_right_credits_and_unnamed_values_pass(text: str) -> None:
    assert scan_text("ok.md", text) == []

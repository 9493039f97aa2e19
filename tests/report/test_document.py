"""Report rendering: human labels, formatted numbers, tables that scroll inside their own box, the
verdict box, the contents, the glossary's definition list, no stray Markdown bold, print CSS."""

from __future__ import annotations

import re

import pandas as pd

from int8alibi.report import svg
from int8alibi.report.document import (MAIN_ROWS, Box, Contents, Definitions, Document, Heading, Paragraph, Source,
                                       Table, label, slug, to_html, to_markdown)

SRC = (Source("res/x.parquet", "ab" * 32),)


def _doc() -> Document:
    frame = pd.DataFrame({"false_positive_rate": [0.557562], "fn": [392], "differing_per_million": [4.923],
                          "detected_by": ["1,4"], "all_pow2": [True], "detection_rate": [None]})
    doc = Document("t")
    doc.add(Table("c", frame, SRC, labels=(("fn", "false negatives"),)))
    return doc


def test_labels_and_numbers_are_for_people() -> None:
    md, _ = to_markdown(_doc())
    assert "| false-positive rate | false negatives | differing per million | detected by checks | all scales pow2 |" in md
    assert "| 55.76% | 392 | 4.92 | 1,4 | yes | — |" in md
    assert label("some_new_column") == "some new column"


def test_html_tables_scroll_inside_their_box_and_keep_their_source() -> None:
    html = to_html(_doc())
    assert '<div class="tw"><table>' in html and ".tw{max-width:100%;overflow-x:auto" in html
    assert 'title="false_positive_rate"' in html  # the raw column name stays one hover away
    assert "source: res/x.parquet (sha256 abababababababab…)" in html


def test_the_box_is_bordered_in_html_and_a_blockquote_in_markdown() -> None:
    doc = Document("t")
    doc.add(Box("Verdicts", (("reproduced", "every pow2 layer is bitwise identical"), "plain line, see `x`")))
    md, _ = to_markdown(doc)
    assert "> **Verdicts**\n>\n> - **reproduced** every pow2 layer is bitwise identical\n> - plain line, see `x`" in md
    html = to_html(doc)
    assert ('<div class="box" role="note"><p class="box-title">Verdicts</p><ul><li><strong class="verdict">'
            "reproduced</strong> every pow2 layer is bitwise identical</li><li>plain line, see <code>x</code></li>"
            "</ul></div>") in html
    assert re.search(r"\.box\{border:2px solid", html)


def test_contents_links_every_level_2_heading_by_its_github_slug_in_both_formats() -> None:
    doc = Document("Title")
    doc.add(Contents(), Heading("Fault campaign (checks 1–6, layer level)"), Heading("Detail", 3),
            Heading("Token-level check 7 (this project's rule)"), Heading("Fault campaign (checks 1–6, layer level)"))
    md, _ = to_markdown(doc)
    assert ("**Contents**\n\n- [Fault campaign (checks 1–6, layer level)](#fault-campaign-checks-16-layer-level)\n"
            "- [Token-level check 7 (this project's rule)](#token-level-check-7-this-projects-rule)\n"
            "- [Fault campaign (checks 1–6, layer level)](#fault-campaign-checks-16-layer-level-1)\n") in md
    html = to_html(doc)
    links = re.findall(r'<nav class="toc">.*?</nav>', html)[0]
    targets = re.findall(r'href="#([^"]+)"', links)
    ids = re.findall(r'<h2 id="([^"]+)"', html)
    assert targets == ids == ["fault-campaign-checks-16-layer-level", "token-level-check-7-this-projects-rule",
                              "fault-campaign-checks-16-layer-level-1"]
    assert '<h3 id="detail">' in html and slug("A b_c-d!") == "a-b_c-d"


def test_definitions_render_as_a_list_in_both_formats() -> None:
    doc = Document("t")
    doc.add(Definitions("Terms", (("ulp", "unit in the last place"), ("excluded-unobservable", "in no denominator"))))
    md, _ = to_markdown(doc)
    assert "**Terms**\n\n- **ulp**: unit in the last place\n- **excluded-unobservable**: in no denominator" in md
    assert ('<dl class="defs"><dt>ulp</dt><dd>unit in the last place</dd><dt>excluded-unobservable</dt>'
            "<dd>in no denominator</dd></dl>") in to_html(doc)


def test_no_stray_bold_markers_a_table_without_sources_has_no_source_line() -> None:
    """The committed H200 report ended its glossary with a lone `**`: the italic source line of a
    table without sources. Every `**` left in the Markdown now opens and closes a caption or a term."""
    doc = Document("t")
    doc.add(Table("Terms", pd.DataFrame({"term": ["a"], "meaning": ["b"]}), ()))
    md, _ = to_markdown(doc)
    assert "\n**\n" not in md and "**" not in md.replace("**Terms**", "")
    html = to_html(doc)
    assert '<p class="src"></p>' not in html and "**" not in html


def test_a_document_with_main_rows_moves_longer_tables_to_the_appendix_with_a_link() -> None:
    doc = Document("t", main_rows=MAIN_ROWS)
    doc.add(Table("Short", pd.DataFrame({"a": range(MAIN_ROWS)}), SRC),
            Table("Long", pd.DataFrame({"a": range(MAIN_ROWS + 1)}), SRC))
    assert [type(b) for b in doc.blocks] == [Table, Paragraph]
    assert doc.blocks[1].text == f"Long: {MAIN_ROWS + 1} rows, appendix A1."
    assert doc.appendix[0].caption == "A1. Long" and len(doc.appendix[0].frame) == MAIN_ROWS + 1
    assert '<a href="appendix.html#a1">A1</a>' in to_html(doc)
    assert "appendix [A1](appendix.md#a1)." in to_markdown(doc)[0]
    keep = Document("t")  # without main_rows (e.g. the cross-model page) every table stays where it is put
    keep.add(Table("Long", pd.DataFrame({"a": range(40)}), SRC))
    assert isinstance(keep.blocks[0], Table) and not keep.appendix


def test_the_page_prints_compactly_and_half_width_figures_pair_up() -> None:
    from int8alibi.report.document import Figure

    doc = Document("t")
    doc.add(Figure("a", "narrow", svg.column_chart("t", ["0", "1"], [1.0, 2.0], x_label="x", y_label="y",
                                                   width=svg.HALF_WIDTH), SRC),
            Figure("b", "wide", svg.column_chart("t", ["0"], [1.0], x_label="x", y_label="y"), SRC))
    html = to_html(doc)
    assert '<figure id="a" class="half">' in html and '<figure id="b">' in html
    css = re.search(r"@media print\{(.*)\}\}", html).group(1)
    assert "@page{margin:12mm}" in html  # no fixed paper size: A4 and Letter both fit
    assert "table{font-size:6.5pt" in css and "td,th{white-space:normal;overflow-wrap:anywhere" in css
    assert ".tw{overflow:visible" in css  # no table is clipped to a scroll box on paper


def test_axes_cover_every_bar_and_name_their_ticks() -> None:
    assert svg.nice_ticks(0, 6.7) == [0.0, 2.0, 4.0, 6.0, 8.0]      # the last tick is at or above the largest value
    assert svg.nice_ticks(-11.8, -6.4) == [-12.0, -10.0, -8.0, -6.0]
    chart = svg.column_chart("t", ["a", "b"], [6.7, 1.0], x_label="block", y_label="headroom (bits)")
    heights = [float(h) for h in re.findall(r'class="column"[^>]* height="([\d.]+)"', chart)]
    assert max(heights) <= 150 and re.findall(r'class="tick"[^>]*>([^<]+)<', chart)[:4] == ["0", "5", "10", "a"]
    stacked = svg.stacked_bars("t", ["F1"], {"0": [1000], "1": [260]}, x_label="cells (count)", y_label="fault")
    assert ">1500<" in stacked and ">cells (count)<" in stacked and ">1,260<" in stacked
    heat = svg.heat_map("t", ["F1"], ["5"], [[None]], x_label="check", y_label="fault", scale_label="share fired")
    assert ">share fired<" in heat and ">n/a<" in heat and 'class="colour-scale"' in heat


def test_html_escapes_every_value_as_html_escape_does_and_markdown_escapes_only_cell_pipes() -> None:
    """Autoescape is on for the HTML templates, with html.escape's entity forms (the bytes of the
    committed reports); the Markdown shows text as written, a pipe in a cell escaped."""
    doc = Document("T <&> 'q'")
    doc.add(Heading("H \"1\""), Paragraph("a <b> & 'c' `<code>`"),
            Table("C 'x'", pd.DataFrame({"a<b": ["x|y<z>\nw"]}), (Source("r/'s'.parquet", "ab" * 32),)))
    html = to_html(doc)
    assert "<title>T &lt;&amp;&gt; &#x27;q&#x27;</title>" in html and '<h2 id="h-1">H &quot;1&quot;</h2>' in html
    assert "<p>a &lt;b&gt; &amp; &#x27;c&#x27; <code>&lt;code&gt;</code></p>" in html
    assert ('<th title="a&lt;b">a&lt;b</th></tr><tr><td class="t">x|y&lt;z&gt;\nw</td></tr>' in html
            and "source: r/&#x27;s&#x27;.parquet" in html)
    md, _ = to_markdown(doc)
    assert md.startswith("# T <&> 'q'\n\n## H \"1\"\n\na <b> & 'c' `<code>`\n\n**C 'x'**\n\n| a<b |\n|---|\n")
    assert "| x\\|y<z> w |" in md and "*source: r/'s'.parquet" in md


def test_text_is_cut_into_code_spans_and_appendix_references_for_the_templates() -> None:
    from int8alibi.report.document import Piece, Run, inline

    assert inline("") == () and inline("a `b") == (Run(False, (Piece("a `b"),)),)
    assert inline("see appendix A1, A2 and A13x; A4 `appendix A5`") == (
        Run(False, (Piece("see appendix "), Piece("A1", "a1"), Piece(", "), Piece("A2", "a2"), Piece(" and "),
                    Piece("A13", "a13"), Piece("x; A4 "))),
        Run(True, (Piece("appendix "), Piece("A5", "a5"))))
    doc = Document("t")
    doc.add(Paragraph("see `appendix A5` and appendix A1"))
    assert ("<p>see <code>appendix <a href=\"appendix.html#a5\">A5</a></code> and appendix "
            '<a href="appendix.html#a1">A1</a></p>') in to_html(doc)
    assert "see `appendix [A5](appendix.md#a5)` and appendix [A1](appendix.md#a1)\n" in to_markdown(doc)[0]


def test_every_template_is_package_data() -> None:
    """The templates are installed with the package (pyproject's package data) and read from it."""
    import fnmatch
    import tomllib

    from int8alibi.files.hashing import PACKAGE_ROOT

    patterns = tomllib.loads((PACKAGE_ROOT.parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["int8alibi"]
    templates = [p.relative_to(PACKAGE_ROOT).as_posix() for p in (PACKAGE_ROOT / "report" / "templates").rglob("*")
                 if p.is_file()]
    assert templates and all(any(fnmatch.fnmatch(t, pattern) for pattern in patterns) for t in templates)

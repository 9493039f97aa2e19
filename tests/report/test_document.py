"""Report rendering: human labels, formatted numbers, tables that scroll inside their own box."""

from __future__ import annotations

import pandas as pd

from int8alibi.report import svg
from int8alibi.report.document import Document, Source, Table, label, to_html, to_markdown


def _doc() -> Document:
    frame = pd.DataFrame({"false_positive_rate": [0.557562], "fn": [392], "differing_per_million": [4.923],
                          "detected_by": ["1,4"], "all_pow2": [True], "detection_rate": [None]})
    doc = Document("t")
    doc.add(Table("c", frame, (Source("res/x.parquet", "ab" * 32),), labels=(("fn", "false negatives"),)))
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


def test_ulp_buckets_show_the_real_range() -> None:
    assert [svg.ulp_bucket(v) for v in (0, 1, 2, 15, 16, 300, 4096, None, float("nan"))] == [
        "0", "1", "2–15", "2–15", "16–255", "256–4095", "≥4096", "non-finite", "non-finite"]


def test_axes_cover_every_bar_and_name_their_ticks() -> None:
    import re

    assert svg.nice_ticks(0, 6.7) == [0.0, 2.0, 4.0, 6.0, 8.0]      # the last tick is at or above the largest value
    assert svg.nice_ticks(-11.8, -6.4) == [-12.0, -10.0, -8.0, -6.0]
    chart = svg.bar_chart("t", ["a", "b"], [6.7, 1.0], x_label="headroom (bits)", y_label="block")
    axis = re.search(r'<g class="axis x"><line x1="([\d.]+)" y1="[\d.]+" x2="([\d.]+)"', chart)
    assert axis is not None
    widths = [float(w) for w in re.findall(r'<rect x="150" y="[\d.]+" width="([\d.]+)"', chart)]
    assert max(widths) <= float(axis.group(2)) - float(axis.group(1))
    assert re.findall(r'class="tick"[^>]*>([^<]+)<', chart)[-5:] == ["0", "2", "4", "6", "8"]
    stacked = svg.stacked_bars("t", ["F1"], {"0": [1000], "1": [260]}, x_label="cells (count)", y_label="fault")
    assert ">1500<" in stacked and ">cells (count)<" in stacked
    heat = svg.heat_map("t", ["F1"], ["5"], [[None]], x_label="check", y_label="fault", scale_label="share fired")
    assert ">share fired<" in heat and ">n/a<" in heat and 'class="colour-scale"' in heat

"""Small, dependency-free SVG charts for the report: deterministic text, embeddable inline.

The report must be one self-contained HTML file whose bytes depend only on the tables, so the
figures are written as plain SVG rather than through a plotting library with its own metadata.

A legend names only series that are drawn, and is laid out in rows that wrap inside the viewBox:
text widths are estimated generously (``text_width``) since no font metrics are at hand.
"""

from __future__ import annotations

import math
from html import escape
from typing import Mapping, NamedTuple, Sequence

WIDTH = 640
ROW = 22
HALF_WIDTH = 460.0   # a chart drawn to sit beside another (the page shows such figures two to a row)
PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
           "#ccb974", "#64b5cd"]


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def text_width(text: str, size: float) -> float:
    """A generous estimate of a sans-serif text's width in px (0.62 em a character)."""
    return 0.62 * size * len(text)


def _frame(height: float, title: str, body: list[str], width: float = WIDTH) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(width)}" height="{_num(height)}" '
        f'viewBox="0 0 {_num(width)} {_num(height)}" role="img" aria-label="{escape(title)}">'
        f'<title>{escape(title)}</title>'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<text x="8" y="16" font-size="13" font-weight="bold">{escape(title)}</text>'
        + "".join(body)
        + "</svg>"
    )


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values from at or below ``lo`` to at or above ``hi``: steps of 1, 2 or 5 times a
    power of ten, so an axis drawn from the first tick to the last holds every value."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else [0.0]
    raw = (hi - lo) / max(count - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [0.0 if i == 0 else round(i * step, 12) for i in range(first, last + 1)]


def _tick_text(v: float, unit: str) -> str:
    return f"{v:g}{unit}"


def _x_axis(left: float, right: float, y: float, lo: float, hi: float, label: str, unit: str = "",
            ticks: Sequence[float] | None = None) -> list[str]:
    """A horizontal axis line at ``y`` with tick marks, tick labels and an axis label."""
    span = (hi - lo) or 1.0
    out = [f'<g class="axis x"><line x1="{_num(left)}" y1="{_num(y)}" x2="{_num(right)}" y2="{_num(y)}" stroke="#333"/>']
    for t in (nice_ticks(lo, hi) if ticks is None else ticks):
        x = left + (right - left) * (t - lo) / span
        out.append(f'<line x1="{_num(x)}" y1="{_num(y)}" x2="{_num(x)}" y2="{_num(y + 4)}" stroke="#333"/>')
        out.append(f'<text class="tick" x="{_num(x)}" y="{_num(y + 15)}" font-size="10" text-anchor="middle">'
                   f'{escape(_tick_text(t, unit))}</text>')
    if label:
        out.append(f'<text class="axis-label" x="{_num((left + right) / 2)}" y="{_num(y + 30)}" font-size="11" '
                   f'text-anchor="middle">{escape(label)}</text>')
    return out + ["</g>"]


def _y_label(x: float, top: float, bottom: float, label: str) -> str:
    mid = (top + bottom) / 2
    return (f'<text class="axis-label" x="{_num(x)}" y="{_num(mid)}" font-size="11" text-anchor="middle" '
            f'transform="rotate(-90 {_num(x)} {_num(mid)})">{escape(label)}</text>')


def label_margin(labels: Sequence[str], size: float = 11) -> float:
    """The left margin that fits the longest row label right-aligned, plus a rotated axis label."""
    return 34.0 + max([text_width(label, size) for label in labels] + [20.0])


def column_chart(title: str, labels: Sequence[str], values: Sequence[float], *, x_label: str, y_label: str,
                 height: float = 150.0, width: float = WIDTH) -> str:
    """Vertical bars, one per label, on a value axis from zero: compact for many labels (e.g. ~30
    transformer blocks), each bar's value in its tooltip; values must be finite and non-negative."""
    ticks = nice_ticks(0.0, max([v for v in values if math.isfinite(v)] + [1e-12]), count=4)
    top_value = ticks[-1] if ticks[-1] > 0 else 1.0
    left, right, top = 60.0, width - 12.0, 30.0
    bottom = top + height
    step = (right - left) / max(len(labels), 1)
    every = next(n for n in (1, 2, 4, 5, 10, 20, 50, 100) if n * step >= 24)
    body = [f'<line x1="{_num(left)}" y1="{_num(bottom)}" x2="{_num(right)}" y2="{_num(bottom)}" stroke="#333"/>']
    for t in ticks:
        y = bottom - height * t / top_value
        body.append(f'<line x1="{_num(left - 3)}" y1="{_num(y)}" x2="{_num(right)}" y2="{_num(y)}" stroke="#eee"/>')
        body.append(f'<text class="tick" x="{_num(left - 5)}" y="{_num(y + 3)}" font-size="10" '
                    f'text-anchor="end">{t:g}</text>')
    for i, (label, value) in enumerate(zip(labels, values)):
        h = height * value / top_value if math.isfinite(value) else 0.0
        x = left + i * step
        body.append(f'<rect class="column" x="{_num(x + 0.15 * step)}" y="{_num(bottom - h)}" width="{_num(0.7 * step)}" '
                    f'height="{_num(h)}" fill="{PALETTE[0]}"><title>{escape(f"{label}: {value:.4g}")}</title></rect>')
        if i % every == 0:
            body.append(f'<text class="tick" x="{_num(x + step / 2)}" y="{_num(bottom + 14)}" font-size="10" '
                        f'text-anchor="middle">{escape(label)}</text>')
    body.append(f'<text class="axis-label" x="{_num((left + right) / 2)}" y="{_num(bottom + 30)}" font-size="11" '
                f'text-anchor="middle">{escape(x_label)}</text>')
    body.append(_y_label(14, top, bottom, y_label))
    return _frame(bottom + 38, title, body, width)


MIN_SEGMENT = 2.0   # px: the narrowest a non-zero stacked segment is drawn


def stacked_bars(title: str, labels: Sequence[str], series: Mapping[str, Sequence[float]], *, x_label: str,
                 y_label: str, colours: Mapping[str, str] | None = None, ends: Sequence[str] | None = None,
                 width: float = WIDTH) -> str:
    """Horizontal stacked bars (e.g. counts of ulp 0 / 1 / >1 per fault) on a count axis, with a legend.

    A series with no count in any bar is neither drawn nor named in the legend; a non-zero segment
    is at least ``MIN_SEGMENT`` px wide so that no series in the legend vanishes into its
    neighbour (every segment's count is its tooltip). Each bar ends with its total, or ``ends[i]``.
    """
    names = [n for n in series if any(v > 0 for v in series[n])]
    colour = {n: (colours or {}).get(n, PALETTE[j % len(PALETTE)]) for j, n in enumerate(names)}
    totals = [sum(series[n][i] for n in names) for i in range(len(labels))]
    ticks = nice_ticks(0.0, max(totals + [1e-12]))
    top = ticks[-1] if ticks[-1] > 0 else 1.0
    texts = list(ends) if ends is not None else [f"{total:,g}" for total in totals]
    margin = label_margin(labels)
    plot = width - margin - 12 - max([text_width(t, 10) for t in texts] + [30.0]) - MIN_SEGMENT * len(names)
    body = [_y_label(14, 28, 28 + len(labels) * ROW, y_label)]
    for i, label in enumerate(labels):
        y = 28 + i * ROW
        x = float(margin)
        body.append(f'<text class="tick" x="{_num(margin - 6)}" y="{y + 14}" font-size="11" '
                    f'text-anchor="end">{escape(label)}</text>')
        for name in names:
            value = series[name][i]
            w = max(plot * value / top, MIN_SEGMENT) if value > 0 else 0.0
            body.append(
                f'<rect class="segment" x="{_num(x)}" y="{y + 3}" width="{_num(w)}" height="{ROW - 6}" '
                f'fill="{colour[name]}"><title>{escape(f"{label} {name}: {value:g}")}</title></rect>'
            )
            x += w
        body.append(f'<text x="{_num(x + 4)}" y="{y + 14}" font-size="10">{escape(texts[i])}</text>')
    axis_y = 30 + len(labels) * ROW
    body += _x_axis(margin, margin + plot, axis_y, 0.0, top, x_label, "", ticks)
    legend, height = _legend([(n, colour[n], "rect") for n in names], margin, axis_y + 40, width - 8)
    return _frame(axis_y + 44 + height, title, body + legend, width)


LegendItem = tuple[str, str, str]   # (label, colour, swatch: rect | circle | ring | line | dash)


def _swatch(shape: str, x: float, y: float, colour: str) -> str:
    """A 10 px legend swatch with its top-left corner at (x, y)."""
    if shape in ("circle", "ring"):
        fill = "white" if shape == "ring" else colour
        return f'<circle cx="{_num(x + 5)}" cy="{_num(y + 5)}" r="4" fill="{fill}" stroke="{colour}"/>'
    if shape in ("line", "dash"):
        dash = ' stroke-dasharray="3,2"' if shape == "dash" else ""
        return (f'<line x1="{_num(x)}" y1="{_num(y + 5)}" x2="{_num(x + 10)}" y2="{_num(y + 5)}" stroke="{colour}" '
                f'stroke-width="2"{dash}/>')
    return f'<rect x="{_num(x)}" y="{_num(y)}" width="10" height="10" fill="{colour}"/>'


def _legend(items: Sequence[LegendItem], left: float, top: float, right: float,
            size: float = 10) -> tuple[list[str], float]:
    """Swatches and labels in rows from (left, top), wrapping before ``right``; the marks and the height used."""
    out = ['<g class="legend">']
    x, y = left, top
    for label, colour, shape in items:
        width = 16 + text_width(label, size) + 14
        if x > left and x + width - 14 > right:
            x, y = left, y + 16
        out.append(_swatch(shape, x, y, colour))
        out.append(f'<text x="{_num(x + 16)}" y="{_num(y + 9)}" font-size="{_num(size)}">{escape(label)}</text>')
        x += width
    out.append("</g>")
    return out, (y - top + 16 if items else 0.0)


def _shade(value: float) -> str:
    level = int(round(255 * (1 - value)))
    return f"rgb({level},{level},255)"


NOT_APPLICABLE = "#dddddd"


def heat_map(title: str, rows: Sequence[str], cols: Sequence[str], cells: Sequence[Sequence[float | None]], *,
             x_label: str, y_label: str, scale_label: str, width: float = WIDTH) -> str:
    """A rows × cols grid of rates in [0, 1] with a colour scale; None is drawn grey and labelled n/a.

    The colour scale and the n/a swatch (only when some cell is n/a) sit on rows of their own
    below the grid, inside the frame."""
    margin = max(label_margin(rows), text_width(scale_label, 11) + 12)
    cw = (width - margin - 10) / max(len(cols), 1)
    body = [f'<text class="axis-label" x="{_num(margin + (width - margin - 10) / 2)}" y="30" font-size="11" '
            f'text-anchor="middle">{escape(x_label)}</text>', _y_label(14, 46, 46 + len(rows) * ROW, y_label)]
    for j, col in enumerate(cols):
        body.append(f'<text class="tick" x="{_num(margin + (j + 0.5) * cw)}" y="42" font-size="11" '
                    f'text-anchor="middle">{escape(col)}</text>')
    for i, row in enumerate(rows):
        y = 46 + i * ROW
        body.append(f'<text class="tick" x="{_num(margin - 6)}" y="{y + 14}" font-size="11" '
                    f'text-anchor="end">{escape(row)}</text>')
        for j, value in enumerate(cells[i]):
            x = margin + j * cw
            fill, text = (NOT_APPLICABLE, "n/a") if value is None else (_shade(value), _num(value))
            body.append(f'<rect x="{_num(x)}" y="{y}" width="{_num(cw - 2)}" height="{ROW - 2}" fill="{fill}"/>')
            color = "white" if value is not None and value > 0.6 else "black"
            body.append(f'<text x="{_num(x + cw / 2)}" y="{y + 14}" font-size="10" text-anchor="middle" '
                        f'fill="{color}">{text}</text>')
    scale_y = 54 + len(rows) * ROW
    steps = 10
    swatch = (width - margin - 130) / steps
    body.append(f'<g class="colour-scale"><text x="{_num(margin - 6)}" y="{_num(scale_y + 11)}" font-size="11" '
                f'text-anchor="end">{escape(scale_label)}</text>')
    for k in range(steps):
        body.append(f'<rect x="{_num(margin + k * swatch)}" y="{_num(scale_y)}" width="{_num(swatch)}" height="12" '
                    f'fill="{_shade((k + 0.5) / steps)}"/>')
    body += _x_axis(margin, margin + steps * swatch, scale_y + 12, 0.0, 1.0, "", "", [0.0, 0.5, 1.0])
    body.append("</g>")
    na = any(v is None for row in cells for v in row)
    legend, height = _legend([("n/a: no observable, applicable cell", NOT_APPLICABLE, "rect")] if na else [],
                             margin, scale_y + 36, width - 8)
    return _frame(scale_y + 36 + max(height, 4), title, body + legend, width)


def interval_plot(title: str, labels: Sequence[str], points: Sequence[float], lows: Sequence[float],
                  highs: Sequence[float], unit: str = "", *, x_label: str, y_label: str,
                  width: float = WIDTH) -> str:
    """Point estimates with intervals on a shared horizontal axis that includes zero."""
    finite = [v for v in list(points) + list(lows) + list(highs) if math.isfinite(v)]
    ticks = nice_ticks(min(finite + [0.0]), max(finite + [0.0]))
    lo, hi = ticks[0], ticks[-1]
    span = (hi - lo) or 1.0
    margin = label_margin(labels)
    plot = width - margin - 90

    def sx(v: float) -> float:
        return margin + plot * (v - lo) / span

    axis_y = 30 + len(labels) * ROW
    body = [f'<line x1="{_num(sx(0))}" y1="26" x2="{_num(sx(0))}" y2="{axis_y}" stroke="#999" stroke-dasharray="3,3"/>',
            _y_label(14, 28, axis_y, y_label)]
    for i, label in enumerate(labels):
        y = 28 + i * ROW + ROW / 2
        body.append(f'<text class="tick" x="{_num(margin - 6)}" y="{_num(y + 4)}" font-size="11" '
                    f'text-anchor="end">{escape(label)}</text>')
        if math.isfinite(lows[i]) and math.isfinite(highs[i]):
            body.append(f'<line x1="{_num(sx(lows[i]))}" y1="{_num(y)}" x2="{_num(sx(highs[i]))}" y2="{_num(y)}" '
                        f'stroke="{PALETTE[0]}" stroke-width="2"/>')
        if math.isfinite(points[i]):
            body.append(f'<circle cx="{_num(sx(points[i]))}" cy="{_num(y)}" r="4" fill="{PALETTE[3]}"/>')
            body.append(f'<text x="{_num(width - 80)}" y="{_num(y + 4)}" font-size="11">{escape(_num(points[i]) + unit)}</text>')
    body += _x_axis(margin, margin + plot, axis_y, lo, hi, x_label, unit, ticks)
    ly = axis_y + 42
    body.append(f'<circle cx="{margin + 5}" cy="{ly}" r="4" fill="{PALETTE[3]}"/>'
                f'<text x="{margin + 14}" y="{ly + 4}" font-size="10">point estimate</text>'
                f'<line x1="{margin + 110}" y1="{ly}" x2="{margin + 135}" y2="{ly}" '
                f'stroke="{PALETTE[0]}" stroke-width="2"/>'
                f'<text x="{margin + 140}" y="{ly + 4}" font-size="10">interval</text>')
    return _frame(ly + 14, title, body, width)


# Max-ulp buckets that show the real range: bitwise equal, one spacing, then powers of 16.
ULP_BUCKETS = ["0", "1", "2–15", "16–255", "256–4095", "≥4096", "non-finite"]
# One distinct colour per bucket, light (equal) to dark (no finite pair), so none repeats another.
ULP_COLOURS = dict(zip(ULP_BUCKETS, ["#c8c8c8", "#4c72b0", "#55a868", "#dd8452", "#c44e52", "#8172b3", "#222222"]))


def line_chart(title: str, series: Mapping[str, Sequence[tuple[float, float, float, float]]], *, x_label: str,
               y_label: str, log_y: bool = False, note: str = "", hollow: Sequence[str] = ()) -> str:
    """Lines over a log2 x axis; each point is (x, y, low, high) with a vertical bar from low to high.

    On a log y axis, points whose y is not positive cannot be drawn: they are left out and counted
    in the legend, never moved. Series named in ``hollow`` are drawn as open markers, unjoined.
    The legend sits below the plot, wrapping, so long series names stay inside the frame.
    """
    left, right, top, bottom = 70.0, WIDTH - 20.0, 30.0, 280.0
    drawn = {name: [p for p in pts if math.isfinite(p[1]) and (p[1] > 0 or not log_y)] for name, pts in series.items()}
    xs = [p[0] for pts in drawn.values() for p in pts] or [1.0, 2.0]
    ys = [v for pts in drawn.values() for p in pts for v in p[1:] if math.isfinite(v) and (v > 0 or not log_y)]
    ys = ys or [1.0]
    fy = (lambda v: math.log10(v)) if log_y else (lambda v: v)
    x0, x1 = math.log2(min(xs)), math.log2(max(xs))
    y0, y1 = fy(min(ys)), fy(max(ys))
    if log_y:
        y0, y1 = math.floor(y0), math.ceil(y1)
    else:
        y0, y1 = min(0.0, y0), y1 * 1.05 if y1 > 0 else 1.0
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def sx(v: float) -> float:
        return left + (right - left) * (math.log2(v) - x0) / (x1 - x0)

    def sy(v: float) -> float:
        return bottom - (bottom - top) * (fy(max(v, min(ys))) - y0) / (y1 - y0)

    notes = [note] if note else []
    body = [f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333"/>']
    for x in sorted(set(xs)):
        body.append(f'<text class="tick" x="{_num(sx(x))}" y="{bottom + 14}" font-size="10" '
                    f'text-anchor="middle">{_num(x)}</text>')
    ticks = [10.0 ** e for e in range(int(y0), int(y1) + 1)] if log_y else [y0 + (y1 - y0) * i / 4 for i in range(5)]
    for t in ticks:
        label = f"{t:.0e}" if log_y else _num(t)
        body.append(f'<line x1="{left - 3}" y1="{_num(sy(t))}" x2="{right}" y2="{_num(sy(t))}" stroke="#eee"/>')
        body.append(f'<text class="tick" x="{left - 5}" y="{_num(sy(t) + 3)}" font-size="10" text-anchor="end">{label}</text>')
    body.append(f'<text class="axis-label" x="{_num((left + right) / 2)}" y="{bottom + 30}" font-size="11" text-anchor="middle">'
                f'{escape(x_label)}</text>')
    body.append(f'<text class="axis-label" x="14" y="{_num((top + bottom) / 2)}" font-size="11" text-anchor="middle" '
                f'transform="rotate(-90 14 {_num((top + bottom) / 2)})">{escape(y_label)}</text>')
    items: list[LegendItem] = []
    for j, (name, pts) in enumerate(drawn.items()):
        color = PALETTE[j % len(PALETTE)]
        fill = "white" if name in hollow else color
        if pts and name not in hollow:
            path = " ".join(f"{_num(sx(p[0]))},{_num(sy(p[1]))}" for p in pts)
            body.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        for x, y, lo, hi in pts:
            if math.isfinite(lo) and math.isfinite(hi) and (lo > 0 or not log_y):
                body.append(f'<line x1="{_num(sx(x))}" y1="{_num(sy(lo))}" x2="{_num(sx(x))}" y2="{_num(sy(hi))}" '
                            f'stroke="{color}"/>')
            body.append(f'<circle cx="{_num(sx(x))}" cy="{_num(sy(y))}" r="3.5" fill="{fill}" stroke="{color}">'
                        f'<title>{escape(f"{name}: K={_num(x)}, {y:.4g}")}</title></circle>')
        left_out = len(series[name]) - len(pts)
        if pts:
            items.append((name + (f" ({left_out} not drawn: zero)" if left_out else ""), color,
                          "ring" if name in hollow else "circle"))
        else:
            notes.append(f"{name}: not drawn (no {'positive' if log_y else 'finite'} value among {left_out} points)")
    legend, height = _legend(items, left, bottom + 40, WIDTH - 8)
    body += legend
    y = bottom + 40 + height
    for text in notes:
        body.append(f'<text x="{left}" y="{_num(y + 10)}" font-size="10" fill="#555">{escape(text)}</text>')
        y += 14
    return _frame(y + 6, title, body)


def _square_axes(left: float, top: float, size: float, ticks: Sequence[float], x_label: str,
                 y_label: str) -> list[str]:
    """Both axes of a square plot from ticks[0] to ticks[-1], with gridlines, tick labels and axis labels."""
    lo, hi = ticks[0], ticks[-1]
    out = [f'<rect x="{_num(left)}" y="{_num(top)}" width="{_num(size)}" height="{_num(size)}" fill="none" '
           'stroke="#333"/>']
    for t in ticks:
        d = size * (t - lo) / ((hi - lo) or 1.0)
        out.append(f'<line x1="{_num(left + d)}" y1="{_num(top)}" x2="{_num(left + d)}" y2="{_num(top + size)}" '
                   'stroke="#eee"/>')
        out.append(f'<line x1="{_num(left)}" y1="{_num(top + size - d)}" x2="{_num(left + size)}" '
                   f'y2="{_num(top + size - d)}" stroke="#eee"/>')
        out.append(f'<text class="tick" x="{_num(left + d)}" y="{_num(top + size + 14)}" font-size="10" '
                   f'text-anchor="middle">{t:g}</text>')
        out.append(f'<text class="tick" x="{_num(left - 5)}" y="{_num(top + size - d + 3)}" font-size="10" '
                   f'text-anchor="end">{t:g}</text>')
    out.append(f'<text class="axis-label" x="{_num(left + size / 2)}" y="{_num(top + size + 30)}" font-size="11" '
               f'text-anchor="middle">{escape(x_label)}</text>')
    out.append(_y_label(left - 40, top, top + size, y_label))
    return out


def wrap(text: str, width: float, size: float = 10) -> list[str]:
    """``text`` broken at spaces into lines that fit ``width`` px (by ``text_width``)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and text_width(f"{lines[-1]} {word}", size) <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines


def _notes(notes: Sequence[str], left: float, top: float, right: float) -> tuple[list[str], float]:
    """Grey notes from ``top``, each wrapped to fit before ``right``; the marks and the height used."""
    lines = [line for note in notes for line in wrap(note, right - left)]
    marks = [f'<text class="note" x="{_num(left)}" y="{_num(top + 10 + 14 * i)}" font-size="10" fill="#555">'
             f'{escape(line)}</text>' for i, line in enumerate(lines)]
    return marks, 14.0 * len(lines)


PLOT_SIZE = 280.0
SQUARE_WIDTH = 400.0   # a square chart's frame: two fit side by side on a page or a 1280 px screen
SQUARE_LEFT, SQUARE_TOP = 70.0, 30.0


def _square_frame(title: str, body: list[str], items: Sequence[LegendItem], notes: Sequence[str]) -> str:
    """A square chart's frame with its legend and its notes below the plot, wrapped inside the frame."""
    right = SQUARE_WIDTH - 8
    legend, lh = _legend(items, SQUARE_LEFT - 40, SQUARE_TOP + PLOT_SIZE + 40, right)
    marks, nh = _notes(notes, SQUARE_LEFT - 40, SQUARE_TOP + PLOT_SIZE + 42 + lh, right)
    return _frame(SQUARE_TOP + PLOT_SIZE + 48 + lh + nh, title, body + legend + marks, SQUARE_WIDTH)


def roc_curve(title: str, curves: Mapping[str, Sequence[tuple[float, float]]], *, x_label: str, y_label: str,
              notes: Sequence[str] = ()) -> str:
    """ROC curves, one line per series through its (false-positive rate, true-positive rate) points,
    over the chance diagonal; the legend names each drawn series, ``notes`` say which series could
    not be drawn and why."""
    left, top = SQUARE_LEFT, SQUARE_TOP
    body = _square_axes(left, top, PLOT_SIZE, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], x_label, y_label)
    body.append(f'<line x1="{_num(left)}" y1="{_num(top + PLOT_SIZE)}" x2="{_num(left + PLOT_SIZE)}" y2="{_num(top)}" '
                'stroke="#999" stroke-dasharray="4,3"/>')
    items: list[LegendItem] = [("chance (AUC 0.5)", "#999", "dash")]
    for j, (name, points) in enumerate(curves.items()):
        colour = PALETTE[j % len(PALETTE)]
        path = " ".join(f"{_num(left + PLOT_SIZE * x)},{_num(top + PLOT_SIZE * (1 - y))}" for x, y in points)
        body.append(f'<polyline class="series" points="{path}" fill="none" stroke="{colour}" stroke-width="2">'
                    f'<title>{escape(name)}</title></polyline>')
        items.append((name, colour, "line"))
    return _square_frame(title, body, items, notes)


def calibration_plot(title: str, series: Mapping[str, Sequence[tuple[float, float, int]]], *, x_label: str,
                     y_label: str, notes: Sequence[str] = ()) -> str:
    """Predicted against observed probability, one marker per bin (predicted, observed, positions),
    on equal axes with the diagonal of perfect calibration; each marker's tooltip gives its count."""
    left, top = SQUARE_LEFT, SQUARE_TOP
    values = [v for points in series.values() for p in points for v in p[:2]]
    ticks = nice_ticks(0.0, max(values + [1e-9]))
    hi = ticks[-1] or 1.0
    body = _square_axes(left, top, PLOT_SIZE, ticks, x_label, y_label)
    body.append(f'<line x1="{_num(left)}" y1="{_num(top + PLOT_SIZE)}" x2="{_num(left + PLOT_SIZE)}" y2="{_num(top)}" '
                'stroke="#999" stroke-dasharray="4,3"/>')
    items: list[LegendItem] = [("perfect calibration", "#999", "dash")]
    for j, (name, points) in enumerate(series.items()):
        colour = PALETTE[j % len(PALETTE)]
        for x, y, n in points:
            body.append(f'<circle class="bin" cx="{_num(left + PLOT_SIZE * x / hi)}" '
                        f'cy="{_num(top + PLOT_SIZE * (1 - y / hi))}" r="4" fill="{colour}" fill-opacity="0.8" '
                        f'stroke="{colour}"><title>{escape(f"{name}: predicted {x:.4g}, observed {y:.4g} ({n:,} positions)")}'
                        "</title></circle>")
        items.append((name, colour, "circle"))
    return _square_frame(title, body, items, notes)


class LayerMark(NamedTuple):
    """One layer comparison: its place in execution order, its name, differing elements and max ulp."""

    position: int
    name: str
    differing: int
    max_ulp: int | None


LAYER_CLASSES = {"identical": "#c8c8c8", "max 1 ulp": "#4c72b0", "max 2–15 ulp": "#dd8452",
                 "max ≥ 16 ulp": "#c44e52", "no finite pair": "#222222"}
LAYER_WIDTH = 1000.0
STRIP = 46.0        # px of bar height per strip
STRIP_GAP = 22.0    # px above each strip for its label


def layer_class(differing: int, max_ulp: int | None) -> str:
    """The colour class of a layer comparison: identical, or its largest ulp difference."""
    if differing == 0:
        return "identical"
    if max_ulp is None:
        return "no finite pair"
    return "max 1 ulp" if max_ulp <= 1 else "max 2–15 ulp" if max_ulp < 16 else "max ≥ 16 ulp"


def _decade_ticks(top_decade: int) -> list[int]:
    """Powers of ten labelled on a strip's log axis: at most four of them."""
    step = max(1, math.ceil(top_decade / 3))
    return list(range(0, top_decade + 1, step))


def layer_strips(title: str, strips: Sequence[tuple[str, str, Sequence[LayerMark]]], layers: int,
                 blocks: Sequence[tuple[int, str]], *, x_label: str, y_label: str) -> str:
    """Differing elements per layer, one strip per (setting, phase), layers in execution order.

    Each strip is (label, note, marks): one bar per layer comparison on a shared log axis (a layer
    with no differing element is a short grey tick at the base; a strip of such layers only is drawn
    flat, without a value axis), coloured by its max ulp. ``blocks``
    gives (first position, label) of each transformer block for the x axis. Built for ~200 layers
    at 1280 px: the bars are ``(LAYER_WIDTH - 80) / layers`` px apart.
    """
    left, right, top = 60.0, LAYER_WIDTH - 20.0, 30.0
    step = (right - left) / max(layers, 1)
    peak = max([m.differing for _, _, marks in strips for m in marks] + [1])
    decades = max(1, math.ceil(math.log10(peak) - 1e-12))
    floor = math.log10(0.5)

    def height(d: int) -> float:
        return STRIP * (math.log10(d) - floor) / (decades - floor) if d > 0 else 1.5

    body: list[str] = []
    seen: set[str] = set()
    y = top
    for label, note, marks in strips:
        flat = all(m.differing == 0 for m in marks)   # nothing differs: the strip needs no value axis
        base = y + STRIP_GAP + (6.0 if flat else STRIP)
        body.append(f'<text x="{_num(left)}" y="{_num(y + 15)}" font-size="11" font-weight="bold">{escape(label)}</text>')
        body.append(f'<text x="{_num(right)}" y="{_num(y + 15)}" font-size="10" text-anchor="end">{escape(note)}</text>')
        body.append(f'<line x1="{_num(left)}" y1="{_num(base)}" x2="{_num(right)}" y2="{_num(base)}" stroke="#333"/>')
        for e in [] if flat else _decade_ticks(decades):
            ty = base - height(10 ** e)
            body.append(f'<line x1="{_num(left - 3)}" y1="{_num(ty)}" x2="{_num(right)}" y2="{_num(ty)}" stroke="#eee"/>')
            body.append(f'<text class="tick" x="{_num(left - 5)}" y="{_num(ty + 3)}" font-size="9" '
                        f'text-anchor="end">{10 ** e:,}</text>')
        for m in marks:
            kind = layer_class(m.differing, m.max_ulp)
            seen.add(kind)
            h = height(m.differing)
            ulp = "no finite pair" if m.max_ulp is None else f"max {m.max_ulp} ulp"
            body.append(f'<rect class="layer" x="{_num(left + m.position * step + 0.15 * step)}" y="{_num(base - h)}" '
                        f'width="{_num(max(0.7 * step, 1.0))}" height="{_num(h)}" fill="{LAYER_CLASSES[kind]}">'
                        f'<title>{escape(f"{label}: {m.name}: {m.differing:,} differing, {ulp}")}</title></rect>')
        y = base + 8
    axis = y + 4
    body.append(f'<line x1="{_num(left)}" y1="{_num(axis)}" x2="{_num(right)}" y2="{_num(axis)}" stroke="#333"/>')
    every = next(n for n in (1, 2, 4, 5, 10, 20, 50, 100, 1000) if n * (right - left) / max(len(blocks), 1) >= 26)
    for i, (position, text) in enumerate(blocks):
        x = left + position * step
        body.append(f'<line x1="{_num(x)}" y1="{_num(axis)}" x2="{_num(x)}" y2="{_num(axis + (5 if i % every == 0 else 3))}" '
                    'stroke="#333"/>')
        if i % every == 0:
            body.append(f'<text class="tick" x="{_num(x)}" y="{_num(axis + 16)}" font-size="10">{escape(text)}</text>')
    body.append(f'<text class="axis-label" x="{_num((left + right) / 2)}" y="{_num(axis + 32)}" font-size="11" '
                f'text-anchor="middle">{escape(x_label)}</text>')
    body.append(_y_label(14, top, axis, y_label))
    legend, lh = _legend([(k, c, "rect") for k, c in LAYER_CLASSES.items() if k in seen], left, axis + 42,
                         LAYER_WIDTH - 8)
    return _frame(axis + 46 + lh, title, body + legend, LAYER_WIDTH)

"""Small, dependency-free SVG charts for the report: deterministic text, embeddable inline.

The report must be one self-contained HTML file whose bytes depend only on the tables, so the
figures are written as plain SVG rather than through a plotting library with its own metadata.
"""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

WIDTH = 640
ROW = 22
MARGIN_LEFT = 150
PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _frame(height: float, title: str, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{_num(height)}" '
        f'viewBox="0 0 {WIDTH} {_num(height)}" role="img" aria-label="{escape(title)}">'
        f'<title>{escape(title)}</title>'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<text x="8" y="16" font-size="13" font-weight="bold">{escape(title)}</text>'
        + "".join(body)
        + "</svg>"
    )


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], unit: str = "") -> str:
    """Horizontal bars, one per label; values must be finite and non-negative."""
    top = max([v for v in values if math.isfinite(v)] + [1e-12])
    plot = WIDTH - MARGIN_LEFT - 70
    body = []
    for i, (label, value) in enumerate(zip(labels, values)):
        y = 28 + i * ROW
        w = plot * (value / top) if math.isfinite(value) else 0
        body.append(f'<text x="{MARGIN_LEFT - 6}" y="{y + 14}" font-size="11" text-anchor="end">{escape(label)}</text>')
        body.append(f'<rect x="{MARGIN_LEFT}" y="{y + 3}" width="{_num(w)}" height="{ROW - 6}" fill="{PALETTE[0]}"/>')
        body.append(f'<text x="{_num(MARGIN_LEFT + w + 4)}" y="{y + 14}" font-size="11">{escape(_num(value) + unit)}</text>')
    return _frame(36 + len(labels) * ROW, title, body)


def stacked_bars(title: str, labels: Sequence[str], series: dict[str, Sequence[float]]) -> str:
    """Horizontal stacked bars (e.g. counts of ulp 0 / 1 / >1 per fault) with a legend."""
    names = list(series)
    totals = [sum(series[n][i] for n in names) for i in range(len(labels))]
    top = max(totals + [1e-12])
    plot = WIDTH - MARGIN_LEFT - 20
    body = []
    for i, label in enumerate(labels):
        y = 28 + i * ROW
        x = float(MARGIN_LEFT)
        body.append(f'<text x="{MARGIN_LEFT - 6}" y="{y + 14}" font-size="11" text-anchor="end">{escape(label)}</text>')
        for j, name in enumerate(names):
            w = plot * series[name][i] / top
            body.append(
                f'<rect x="{_num(x)}" y="{y + 3}" width="{_num(w)}" height="{ROW - 6}" '
                f'fill="{PALETTE[j % len(PALETTE)]}"><title>{escape(f"{label} {name}: {series[name][i]}")}</title></rect>'
            )
            x += w
    legend_y = 36 + len(labels) * ROW
    for j, name in enumerate(names):
        x = MARGIN_LEFT + j * 74
        body.append(f'<rect x="{x}" y="{legend_y}" width="10" height="10" fill="{PALETTE[j % len(PALETTE)]}"/>')
        body.append(f'<text x="{x + 14}" y="{legend_y + 9}" font-size="11">{escape(name)}</text>')
    return _frame(legend_y + 20, title, body)


def heat_map(title: str, rows: Sequence[str], cols: Sequence[str], cells: Sequence[Sequence[float | None]]) -> str:
    """A rows × cols grid of rates in [0, 1]; None is drawn grey and labelled n/a."""
    cw = (WIDTH - MARGIN_LEFT - 10) / max(len(cols), 1)
    body = []
    for j, col in enumerate(cols):
        body.append(f'<text x="{_num(MARGIN_LEFT + (j + 0.5) * cw)}" y="40" font-size="11" text-anchor="middle">{escape(col)}</text>')
    for i, row in enumerate(rows):
        y = 46 + i * ROW
        body.append(f'<text x="{MARGIN_LEFT - 6}" y="{y + 14}" font-size="11" text-anchor="end">{escape(row)}</text>')
        for j, value in enumerate(cells[i]):
            x = MARGIN_LEFT + j * cw
            if value is None:
                fill, text = "#dddddd", "n/a"
            else:
                shade = int(round(255 * (1 - value)))
                fill, text = f"rgb({shade},{shade},255)", _num(value)
            body.append(f'<rect x="{_num(x)}" y="{y}" width="{_num(cw - 2)}" height="{ROW - 2}" fill="{fill}"/>')
            color = "white" if value is not None and value > 0.6 else "black"
            body.append(f'<text x="{_num(x + cw / 2)}" y="{y + 14}" font-size="10" text-anchor="middle" fill="{color}">{text}</text>')
    return _frame(54 + len(rows) * ROW, title, body)


def interval_plot(title: str, labels: Sequence[str], points: Sequence[float], lows: Sequence[float], highs: Sequence[float], unit: str = "") -> str:
    """Point estimates with intervals on a shared horizontal axis that includes zero."""
    finite = [v for v in list(points) + list(lows) + list(highs) if math.isfinite(v)]
    lo, hi = min(finite + [0.0]), max(finite + [0.0])
    span = (hi - lo) or 1.0
    plot = WIDTH - MARGIN_LEFT - 90

    def sx(v: float) -> float:
        return MARGIN_LEFT + plot * (v - lo) / span

    body = [f'<line x1="{_num(sx(0))}" y1="26" x2="{_num(sx(0))}" y2="{30 + len(labels) * ROW}" stroke="#999" stroke-dasharray="3,3"/>']
    for i, label in enumerate(labels):
        y = 28 + i * ROW + ROW / 2
        body.append(f'<text x="{MARGIN_LEFT - 6}" y="{_num(y + 4)}" font-size="11" text-anchor="end">{escape(label)}</text>')
        if math.isfinite(lows[i]) and math.isfinite(highs[i]):
            body.append(f'<line x1="{_num(sx(lows[i]))}" y1="{_num(y)}" x2="{_num(sx(highs[i]))}" y2="{_num(y)}" stroke="{PALETTE[0]}" stroke-width="2"/>')
        if math.isfinite(points[i]):
            body.append(f'<circle cx="{_num(sx(points[i]))}" cy="{_num(y)}" r="4" fill="{PALETTE[3]}"/>')
            body.append(f'<text x="{_num(WIDTH - 80)}" y="{_num(y + 4)}" font-size="11">{escape(_num(points[i]) + unit)}</text>')
    return _frame(40 + len(labels) * ROW, title, body)


# Max-ulp buckets that show the real range: bitwise equal, one spacing, then powers of 16.
ULP_BUCKETS = ["0", "1", "2–15", "16–255", "256–4095", "≥4096", "non-finite"]


def ulp_bucket(value: object) -> str:
    """The bucket of one cell's max ulp (None or NaN: no finite pair)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "non-finite"
    v = int(value)  # type: ignore[call-overload]
    if v <= 1:
        return str(max(v, 0))
    return "2–15" if v < 16 else "16–255" if v < 256 else "256–4095" if v < 4096 else "≥4096"


def line_chart(title: str, series: dict[str, Sequence[tuple[float, float, float, float]]], *, x_label: str,
               y_label: str, log_y: bool = False, note: str = "", hollow: Sequence[str] = ()) -> str:
    """Lines over a log2 x axis; each point is (x, y, low, high) with a vertical bar from low to high.

    On a log y axis, points whose y is not positive cannot be drawn: they are left out and counted
    in the legend, never moved. Series named in ``hollow`` are drawn as open markers, unjoined.
    """
    height, left, right, top, bottom = 330.0, 70.0, WIDTH - 150.0, 30.0, 280.0
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

    body = [f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333"/>']
    for x in sorted(set(xs)):
        body.append(f'<text x="{_num(sx(x))}" y="{bottom + 14}" font-size="10" text-anchor="middle">{_num(x)}</text>')
    ticks = [10.0 ** e for e in range(int(y0), int(y1) + 1)] if log_y else [y0 + (y1 - y0) * i / 4 for i in range(5)]
    for t in ticks:
        label = f"{t:.0e}" if log_y else _num(t)
        body.append(f'<line x1="{left - 3}" y1="{_num(sy(t))}" x2="{right}" y2="{_num(sy(t))}" stroke="#eee"/>')
        body.append(f'<text x="{left - 5}" y="{_num(sy(t) + 3)}" font-size="10" text-anchor="end">{label}</text>')
    body.append(f'<text x="{_num((left + right) / 2)}" y="{bottom + 30}" font-size="11" text-anchor="middle">'
                f'{escape(x_label)}</text>')
    body.append(f'<text x="14" y="{_num((top + bottom) / 2)}" font-size="11" text-anchor="middle" '
                f'transform="rotate(-90 14 {_num((top + bottom) / 2)})">{escape(y_label)}</text>')
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
        text = name + (f" ({left_out} not drawn: zero)" if left_out else "")
        ly = top + 4 + j * 16
        body.append(f'<circle cx="{right + 12}" cy="{ly}" r="4" fill="{fill}" stroke="{color}"/>')
        body.append(f'<text x="{right + 20}" y="{ly + 4}" font-size="10">{escape(text)}</text>')
    if note:
        body.append(f'<text x="{left}" y="{height - 6}" font-size="10" fill="#555">{escape(note)}</text>')
    return _frame(height, title, body)

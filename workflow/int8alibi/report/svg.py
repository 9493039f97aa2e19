"""Small, dependency-free SVG charts for the report: deterministic text, embeddable inline.

The report must be one self-contained HTML file whose bytes depend only on the tables, so the
figures are written as plain SVG rather than through a plotting library with its own metadata.
"""

from __future__ import annotations

import math
from html import escape
from typing import Mapping, Sequence

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
    out.append(f'<text class="axis-label" x="{_num((left + right) / 2)}" y="{_num(y + 30)}" font-size="11" '
               f'text-anchor="middle">{escape(label)}</text></g>')
    return out


def _y_label(x: float, top: float, bottom: float, label: str) -> str:
    mid = (top + bottom) / 2
    return (f'<text class="axis-label" x="{_num(x)}" y="{_num(mid)}" font-size="11" text-anchor="middle" '
            f'transform="rotate(-90 {_num(x)} {_num(mid)})">{escape(label)}</text>')


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], unit: str = "", *,
              x_label: str, y_label: str) -> str:
    """Horizontal bars, one per label, on a value axis from zero; values must be finite and non-negative."""
    ticks = nice_ticks(0.0, max([v for v in values if math.isfinite(v)] + [1e-12]))
    top = ticks[-1] if ticks[-1] > 0 else 1.0
    left, plot = MARGIN_LEFT, WIDTH - MARGIN_LEFT - 70
    body = [_y_label(14, 28, 28 + len(labels) * ROW, y_label)]
    for i, (label, value) in enumerate(zip(labels, values)):
        y = 28 + i * ROW
        w = plot * (value / top) if math.isfinite(value) else 0
        body.append(f'<text class="tick" x="{left - 6}" y="{y + 14}" font-size="11" text-anchor="end">{escape(label)}</text>')
        body.append(f'<rect x="{left}" y="{y + 3}" width="{_num(w)}" height="{ROW - 6}" fill="{PALETTE[0]}"/>')
        body.append(f'<text x="{_num(left + w + 4)}" y="{y + 14}" font-size="11">{escape(_num(value) + unit)}</text>')
    axis_y = 30 + len(labels) * ROW
    body += _x_axis(left, left + plot, axis_y, 0.0, top, x_label, unit, ticks)
    return _frame(axis_y + 40, title, body)


def stacked_bars(title: str, labels: Sequence[str], series: Mapping[str, Sequence[float]], *, x_label: str,
                 y_label: str) -> str:
    """Horizontal stacked bars (e.g. counts of ulp 0 / 1 / >1 per fault) on a count axis, with a legend."""
    names = list(series)
    totals = [sum(series[n][i] for n in names) for i in range(len(labels))]
    ticks = nice_ticks(0.0, max(totals + [1e-12]))
    top = ticks[-1] if ticks[-1] > 0 else 1.0
    plot = WIDTH - MARGIN_LEFT - 20
    body = [_y_label(14, 28, 28 + len(labels) * ROW, y_label)]
    for i, label in enumerate(labels):
        y = 28 + i * ROW
        x = float(MARGIN_LEFT)
        body.append(f'<text class="tick" x="{MARGIN_LEFT - 6}" y="{y + 14}" font-size="11" '
                    f'text-anchor="end">{escape(label)}</text>')
        for j, name in enumerate(names):
            w = plot * series[name][i] / top
            body.append(
                f'<rect x="{_num(x)}" y="{y + 3}" width="{_num(w)}" height="{ROW - 6}" '
                f'fill="{PALETTE[j % len(PALETTE)]}"><title>{escape(f"{label} {name}: {series[name][i]}")}</title></rect>'
            )
            x += w
    axis_y = 30 + len(labels) * ROW
    body += _x_axis(MARGIN_LEFT, MARGIN_LEFT + plot, axis_y, 0.0, top, x_label, "", ticks)
    legend_y = axis_y + 42
    body.append(f'<text x="{MARGIN_LEFT - 6}" y="{legend_y + 9}" font-size="11" text-anchor="end">legend</text>')
    for j, name in enumerate(names):
        x = MARGIN_LEFT + j * 74
        body.append(f'<rect x="{x}" y="{legend_y}" width="10" height="10" fill="{PALETTE[j % len(PALETTE)]}"/>')
        body.append(f'<text x="{x + 14}" y="{legend_y + 9}" font-size="11">{escape(name)}</text>')
    return _frame(legend_y + 20, title, body)


def _shade(value: float) -> str:
    level = int(round(255 * (1 - value)))
    return f"rgb({level},{level},255)"


def heat_map(title: str, rows: Sequence[str], cols: Sequence[str], cells: Sequence[Sequence[float | None]], *,
             x_label: str, y_label: str, scale_label: str) -> str:
    """A rows × cols grid of rates in [0, 1] with a colour scale; None is drawn grey and labelled n/a."""
    cw = (WIDTH - MARGIN_LEFT - 10) / max(len(cols), 1)
    body = [f'<text class="axis-label" x="{_num(MARGIN_LEFT + (WIDTH - MARGIN_LEFT - 10) / 2)}" y="30" font-size="11" '
            f'text-anchor="middle">{escape(x_label)}</text>', _y_label(14, 46, 46 + len(rows) * ROW, y_label)]
    for j, col in enumerate(cols):
        body.append(f'<text class="tick" x="{_num(MARGIN_LEFT + (j + 0.5) * cw)}" y="42" font-size="11" '
                    f'text-anchor="middle">{escape(col)}</text>')
    for i, row in enumerate(rows):
        y = 46 + i * ROW
        body.append(f'<text class="tick" x="{MARGIN_LEFT - 6}" y="{y + 14}" font-size="11" '
                    f'text-anchor="end">{escape(row)}</text>')
        for j, value in enumerate(cells[i]):
            x = MARGIN_LEFT + j * cw
            fill, text = ("#dddddd", "n/a") if value is None else (_shade(value), _num(value))
            body.append(f'<rect x="{_num(x)}" y="{y}" width="{_num(cw - 2)}" height="{ROW - 2}" fill="{fill}"/>')
            color = "white" if value is not None and value > 0.6 else "black"
            body.append(f'<text x="{_num(x + cw / 2)}" y="{y + 14}" font-size="10" text-anchor="middle" '
                        f'fill="{color}">{text}</text>')
    scale_y = 54 + len(rows) * ROW
    steps = 10
    width = (WIDTH - MARGIN_LEFT - 130) / steps
    body.append(f'<g class="colour-scale"><text x="{MARGIN_LEFT - 6}" y="{_num(scale_y + 11)}" font-size="11" '
                f'text-anchor="end">{escape(scale_label)}</text>')
    for k in range(steps):
        body.append(f'<rect x="{_num(MARGIN_LEFT + k * width)}" y="{_num(scale_y)}" width="{_num(width)}" height="12" '
                    f'fill="{_shade((k + 0.5) / steps)}"/>')
    body += _x_axis(MARGIN_LEFT, MARGIN_LEFT + steps * width, scale_y + 12, 0.0, 1.0, "", "", [0.0, 0.5, 1.0])
    gx = MARGIN_LEFT + steps * width + 14
    body.append(f'<rect x="{_num(gx)}" y="{_num(scale_y)}" width="12" height="12" fill="#dddddd"/>'
                f'<text x="{_num(gx + 16)}" y="{_num(scale_y + 10)}" font-size="10">'
                'n/a: no observable, applicable cell</text></g>')
    return _frame(scale_y + 40, title, body)


def interval_plot(title: str, labels: Sequence[str], points: Sequence[float], lows: Sequence[float],
                  highs: Sequence[float], unit: str = "", *, x_label: str, y_label: str) -> str:
    """Point estimates with intervals on a shared horizontal axis that includes zero."""
    finite = [v for v in list(points) + list(lows) + list(highs) if math.isfinite(v)]
    ticks = nice_ticks(min(finite + [0.0]), max(finite + [0.0]))
    lo, hi = ticks[0], ticks[-1]
    span = (hi - lo) or 1.0
    plot = WIDTH - MARGIN_LEFT - 90

    def sx(v: float) -> float:
        return MARGIN_LEFT + plot * (v - lo) / span

    axis_y = 30 + len(labels) * ROW
    body = [f'<line x1="{_num(sx(0))}" y1="26" x2="{_num(sx(0))}" y2="{axis_y}" stroke="#999" stroke-dasharray="3,3"/>',
            _y_label(14, 28, axis_y, y_label)]
    for i, label in enumerate(labels):
        y = 28 + i * ROW + ROW / 2
        body.append(f'<text class="tick" x="{MARGIN_LEFT - 6}" y="{_num(y + 4)}" font-size="11" '
                    f'text-anchor="end">{escape(label)}</text>')
        if math.isfinite(lows[i]) and math.isfinite(highs[i]):
            body.append(f'<line x1="{_num(sx(lows[i]))}" y1="{_num(y)}" x2="{_num(sx(highs[i]))}" y2="{_num(y)}" '
                        f'stroke="{PALETTE[0]}" stroke-width="2"/>')
        if math.isfinite(points[i]):
            body.append(f'<circle cx="{_num(sx(points[i]))}" cy="{_num(y)}" r="4" fill="{PALETTE[3]}"/>')
            body.append(f'<text x="{_num(WIDTH - 80)}" y="{_num(y + 4)}" font-size="11">{escape(_num(points[i]) + unit)}</text>')
    body += _x_axis(MARGIN_LEFT, MARGIN_LEFT + plot, axis_y, lo, hi, x_label, unit, ticks)
    ly = axis_y + 42
    body.append(f'<circle cx="{MARGIN_LEFT + 5}" cy="{ly}" r="4" fill="{PALETTE[3]}"/>'
                f'<text x="{MARGIN_LEFT + 14}" y="{ly + 4}" font-size="10">point estimate</text>'
                f'<line x1="{MARGIN_LEFT + 110}" y1="{ly}" x2="{MARGIN_LEFT + 135}" y2="{ly}" '
                f'stroke="{PALETTE[0]}" stroke-width="2"/>'
                f'<text x="{MARGIN_LEFT + 140}" y="{ly + 4}" font-size="10">interval</text>')
    return _frame(ly + 14, title, body)


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


def line_chart(title: str, series: Mapping[str, Sequence[tuple[float, float, float, float]]], *, x_label: str,
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

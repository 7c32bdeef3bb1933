"""Line plots as inline SVG for the static HTML report: axes, round ticks, labels and a legend.

    evals = Series("eval/success_rate", [(0, 0.30), (10, 0.34)])
    svg = line_plot([evals], "Success rate", "step", "success", y_range=(0, 1), percent=True)

Drawn by hand, so the report needs no plotting library and stays one self-contained file.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1c7ed6", "#e8590c", "#2f9e44", "#ae3ec9", "#f08c00", "#0ca678", "#e03131", "#5c940d", "#495057", "#d6336c")
MAX_MARKED_POINTS = 30  # sparser series (evaluations) get a dot per point
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 16, 52, 44  # margins around the plot area, px
_CHAR_WIDTH = 6.5  # px per character of 11 px sans-serif text, to lay out the legend
_LEGEND_ROW = 16  # px between legend rows


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]  # (x, y) in x order
    band: list[tuple[float, float, float]] = field(default_factory=list)  # (x, low, high): a spread, shaded


def _legend_layout(labels: list[str], left: float, right: float) -> list[tuple[float, int]]:
    """(x, row) of each legend entry: a line sample and its label, left to right, a new row when one is full."""
    layout, x, row = [], left, 0
    for label in labels:
        width = 23 + len(label) * _CHAR_WIDTH
        if x > left and x + width > right:
            x, row = left, row + 1
        layout.append((x, row))
        x += width + 16
    return layout


def nice_ticks(low: float, high: float, count: int = 5, integer: bool = False) -> list[float]:
    """Ticks covering [low, high] (the first <= low, the last >= high), spaced 1, 2 or 5 times a power of
    ten so that about `count` intervals span the data; the spacing is at least 1 when `integer`."""
    if high <= low:
        low, high = low - 0.5, high + 0.5
    magnitude = 10 ** math.floor(math.log10((high - low) / count))
    step = min((m * magnitude for m in (1, 2, 5, 10)), key=lambda s: abs((high - low) / s - count))
    if integer:
        step = max(1, round(step))
    return [round(i * step, 12) for i in range(math.floor(low / step), math.ceil(high / step) + 1)]


def _tick_label(value: float, step: float, percent: bool) -> str:
    if percent:
        value, step = value * 100, step * 100
    decimals = max(0, -math.floor(math.log10(step)))
    return f"{value:.{decimals}f}" + ("%" if percent else "")


def _text(x: float, y: float, label: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{escape(label)}</text>'


def line_plot(
    series: list[Series],
    title: str,
    x_label: str,
    y_label: str,
    y_range: tuple[float, float] | None = None,
    percent: bool = False,
    width: int = 520,
    height: int = 300,
) -> str:
    """An <svg> element: one line per series (integer x, e.g. steps), over its band shaded where it has one, y ticks
    as percentages when `percent`; the y axis covers the data and `y_range` when given. Series without points are
    left out; without any point the plot says so."""
    series = [s for s in series if s.points]
    legend = _legend_layout([s.label for s in series], _LEFT, width - _RIGHT)
    height += _LEGEND_ROW * max((row for _, row in legend), default=0)  # more legend rows: the plot moves down
    top = _TOP + _LEGEND_ROW * max((row for _, row in legend), default=0)
    left, right, bottom = _LEFT, width - _RIGHT, height - _BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="11" fill="#222">',
        f'<rect width="{width}" height="{height}" fill="#fff"/>',  # opaque on a dark page too (a standalone file)
        _text(left, 18, title, extra=' font-size="14" font-weight="bold"'),
    ]
    points = [p for s in series for p in s.points]
    if not points:
        parts.append(_text((left + right) / 2, (top + bottom) / 2, "no data", "middle"))
        return "\n".join([*parts, "</svg>"])
    spreads = [y for s in series for _, low, high in s.band for y in (low, high)]
    xs, ys = [x for x, _ in points], [y for _, y in points] + spreads
    x_ticks = nice_ticks(min(xs), max(xs), integer=True)
    y_bounds = [*ys, *(y_range or ())]
    y_ticks = nice_ticks(min(y_bounds), max(y_bounds))
    x_low, x_high, y_low, y_high = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

    def px(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * (right - left)

    def py(y: float) -> float:
        return bottom - (y - y_low) / (y_high - y_low) * (bottom - top)

    y_step = y_ticks[1] - y_ticks[0]
    for y in y_ticks:
        parts.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{right}" y2="{py(y):.1f}" stroke="#e5e5e5"/>')
        parts.append(_text(left - 6, py(y) + 4, _tick_label(y, y_step, percent), "end"))
    for x in x_ticks:
        parts.append(f'<line x1="{px(x):.1f}" y1="{bottom}" x2="{px(x):.1f}" y2="{bottom + 4}" stroke="#444"/>')
        parts.append(_text(px(x), bottom + 16, f"{x:g}", "middle"))
    parts.append(f'<polyline points="{left},{top} {left},{bottom} {right},{bottom}" fill="none" stroke="#444"/>')
    parts.append(_text((left + right) / 2, height - 6, x_label, "middle"))
    y_middle = (top + bottom) / 2
    parts.append(_text(14, y_middle, y_label, "middle", f' transform="rotate(-90 14 {y_middle:.1f})"'))
    for s, colour, (legend_x, row) in zip(series, itertools.cycle(PALETTE), legend):
        if s.band:  # the high edge left to right, then the low edge back
            edge = [(x, high) for x, _, high in s.band] + [(x, low) for x, low, _ in reversed(s.band)]
            outline = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in edge)
            parts.append(f'<polygon points="{outline}" fill="{colour}" fill-opacity="0.15" stroke="none"/>')
        coordinates = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        parts.append(f'<polyline points="{coordinates}" fill="none" stroke="{colour}" stroke-width="2"/>')
        if len(s.points) <= MAX_MARKED_POINTS:
            parts += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>' for x, y in s.points]
        y = 36 + row * _LEGEND_ROW
        parts.append(
            f'<line x1="{legend_x}" y1="{y}" x2="{legend_x + 18}" y2="{y}" stroke="{colour}" stroke-width="3"/>'
        )
        parts.append(_text(legend_x + 23, y + 4, s.label))
    return "\n".join([*parts, "</svg>"])

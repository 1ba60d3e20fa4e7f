"""SVG line charts for the status pages (the coordinator's and a peer's): no JavaScript, no library.

The axes are chosen so that a chart reads true at a glance:

- ticks fall on "nice" numbers (steps of 1, 2 or 5 times a power of ten) and every label differs
  (the decimals follow the step, so 0.119, 0.119, 0.119 cannot happen);
- y ranges over the data rounded out to whole steps, from 0 for quantities that start at 0 (bytes,
  seconds, counts: `include_zero`), and over at least `min_span` otherwise, so that noise in the
  last digits is not blown up to the chart's full height;
- counts get integer ticks only (`integer`), and x, the round, runs from the first round plotted to
  the last (never before it).

Every tick label carries its value (`data-value`) and every axis its range (`data-lo`, `data-hi`),
so that a test can check what a person sees.
"""
from __future__ import annotations

import html
import math

COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c"]

Series = dict[str, list[tuple[float, float]]]


def nice_step(span: float, max_ticks: int = 5, integer: bool = False) -> float:
    """The smallest step of 1, 2 or 5 x 10^k that covers `span` in at most `max_ticks` - 1 steps."""
    if not span > 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(max_ticks - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
    return max(1.0, round(step)) if integer else step


def _decimals(step: float) -> int:
    """The fewest decimals that write `step` exactly, so that ticks `step` apart read apart:
    0.05 -> 2, 0.2 -> 1, 2.5 -> 1, 5 -> 0."""
    return next((d for d in range(12) if abs(round(step, d) - step) <= 1e-9 * abs(step)), 12)


def tick_labels(values: list[float], step: float) -> list[str]:
    """Labels for ticks `step` apart: decimals from the step, and k / M / G past 10,000."""
    top = max((abs(v) for v in values), default=0.0)
    scale, suffix = next(((s, x) for s, x in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if top >= 10 * s), (1.0, ""))
    digits = _decimals(step / scale)
    return [f"{v / scale:.{digits}f}{suffix if v else ''}" for v in values]


def y_axis(values: list[float], *, include_zero: bool = False, min_span: float = 0.0, integer: bool = False,
           max_ticks: int = 5) -> tuple[float, float, list[float]]:
    """(lo, hi, ticks) of a y axis over `values`: lo and hi are the first and last tick."""
    lo, hi = min(values), max(values)
    if include_zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    span = (hi - lo) or abs(hi) * 0.1 or 1.0  # one value: 10% of it (or 1 around 0)
    span = max(span, min_span, 1.0 if integer else 0.0, 1e-9)  # 1e-9: finer than anything plotted here
    if hi - lo < span:  # widen around the middle, never below 0 for data that is not
        middle = (lo + hi) / 2
        lo, hi = middle - span / 2, middle + span / 2
        if min(values) >= 0 > lo:
            lo, hi = 0.0, hi - lo
    step = nice_step(hi - lo, max_ticks, integer)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)  # 0.3 / 0.1 = 2.9999999999999996
    first -= first * step > lo  # ... but never an axis that misses the data
    last += last * step < hi or last == first
    ticks = [_clean(k * step, step) for k in range(first, last + 1)]
    return ticks[0], ticks[-1], ticks


def x_axis(values: list[float], max_ticks: int = 6) -> tuple[float, float, list[float]]:
    """(lo, hi, ticks) of the round axis: from the first round to the last (one round wide at least),
    integer ticks inside that range."""
    lo, hi = min(values), max(values)
    if hi == lo:
        hi = lo + 1
    step = nice_step(hi - lo, max_ticks, integer=True)
    ticks = [_clean(k * step, step) for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]
    return lo, hi, ticks


def _clean(value: float, step: float) -> float:
    """k x step without the float noise (0.30000000000000004 -> 0.3)."""
    return round(value, _decimals(step) + 3)


def line_chart(title: str, series: Series, *, kind: str = "value", y_label: str = "", include_zero: bool = False,
               min_span: float = 0.0, integer: bool = False, width: int = 460, height: int = 220) -> str:
    """An SVG line chart of one or more (round, y) series sharing the axes. `kind` names what y is
    (loss, bytes, seconds, count, ...) for whoever reads the SVG's data attributes."""
    points = [p for values in series.values() for p in values if math.isfinite(p[1])]
    left, right, top, bottom = 52, 12, 28, 30
    parts = [f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}" class="chart" data-kind="{html.escape(kind)}">',
             f'<text x="{left}" y="16" class="title">{html.escape(title)}</text>']
    if not points:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="muted">no data yet</text></svg>')
        return "".join(parts)
    x0, x1, x_ticks = x_axis([p[0] for p in points])
    y0, y1, y_ticks = y_axis([p[1] for p in points], include_zero=include_zero, min_span=min_span, integer=integer)
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * plot_h

    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>')
    y_step = y_ticks[1] - y_ticks[0]
    parts.append(f'<g class="ticks" data-axis="y" data-lo="{y0!r}" data-hi="{y1!r}">')
    for value, label in zip(y_ticks, tick_labels(y_ticks, y_step)):
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(value):.1f}" y2="{sy(value):.1f}" class="grid"/>'
                     f'<text x="{left - 4}" y="{sy(value) + 4:.1f}" text-anchor="end" class="axis" '
                     f'data-value="{value!r}">{label}</text>')
    parts.append(f'</g><g class="ticks" data-axis="x" data-lo="{x0!r}" data-hi="{x1!r}">')
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    for value, label in zip(x_ticks, tick_labels(x_ticks, x_step)):
        parts.append(f'<text x="{sx(value):.1f}" y="{height - 12}" text-anchor="middle" class="axis" '
                     f'data-value="{value!r}">{label}</text>')
    parts.append(f'</g><text x="{left + plot_w / 2}" y="{height - 1}" text-anchor="middle" class="axis">round</text>')
    if y_label:
        parts.append(f'<text x="10" y="{top + plot_h / 2}" transform="rotate(-90 10 {top + plot_h / 2})" '
                     f'text-anchor="middle" class="axis">{html.escape(y_label)}</text>')
    for i, (name, values) in enumerate(series.items()):
        values = [p for p in values if math.isfinite(p[1])]
        if not values:
            continue
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in values)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2" '
                     f'data-series="{html.escape(name)}"/>')
        if len(values) <= 60:
            parts.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in values)
        parts.append(f'<text x="{left + plot_w - 4}" y="{top + 14 + 14 * i}" text-anchor="end" fill="{color}" '
                     f'class="legend">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


BYTE_UNITS = [(1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1.0, "B")]


def byte_unit(values: list[float]) -> tuple[float, str]:
    """(scale, unit) for a bytes chart: the largest unit that the largest value reaches."""
    top = max((abs(v) for v in values), default=0.0)
    return next(((s, u) for s, u in BYTE_UNITS if top >= s), (1.0, "B"))


def bytes_chart(title: str, series: Series, **options) -> str:
    """A chart of byte counts, in the unit that fits (B, KB, MB, GB), from 0."""
    scale, unit = byte_unit([y for values in series.values() for _, y in values])
    scaled = {f"{name} ({unit})": [(x, y / scale) for x, y in values] for name, values in series.items()}
    return line_chart(title, scaled, kind="bytes", y_label=unit, include_zero=True, **options)


def seconds_chart(title: str, series: Series, **options) -> str:
    return line_chart(title, series, kind="seconds", y_label="s", include_zero=True, **options)


def count_chart(title: str, series: Series, **options) -> str:
    return line_chart(title, series, kind="count", include_zero=True, integer=True, **options)


def loss_chart(title: str, series: Series, **options) -> str:
    """Losses: over at least 5% of the largest (a flat loss stays flat), never below 0."""
    top = max((abs(y) for values in series.values() for _, y in values if math.isfinite(y)), default=0.0)
    return line_chart(title, series, kind="loss", y_label="loss", min_span=max(0.05 * top, 1e-6), **options)

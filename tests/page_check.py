"""What a person sees on a status page and what Prometheus reads from /metrics, parsed for real and
checked: the charts' ticks (coop.charts) and the exposition text (prometheus_client's own parser,
a dependency of the project already)."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Axis:
    lo: float
    hi: float
    values: list[float]
    labels: list[str]


@dataclass
class Chart:
    title: str
    kind: str
    x: Axis | None
    y: Axis | None
    frame: tuple[float, float, float, float] | None  # x, y, width, height of the plot area (pixels)
    lines: list[list[tuple[float, float]]]  # each series' points, in pixels


def _axis(svg: ET.Element, name: str) -> Axis | None:
    group = svg.find(f"g[@data-axis='{name}']")
    if group is None:
        return None
    texts = group.findall("text")
    return Axis(float(group.get("data-lo")), float(group.get("data-hi")),
                [float(t.get("data-value")) for t in texts], [t.text or "" for t in texts])


def parse_charts(page: str) -> list[Chart]:
    """Every <svg class="chart"> of the page, parsed as XML."""
    charts = []
    for match in re.finditer(r"<svg[^>]*class=\"chart\".*?</svg>", page, re.S):
        svg = ET.fromstring(match.group(0))
        rect = svg.find("rect")
        frame = tuple(float(rect.get(k)) for k in ("x", "y", "width", "height")) if rect is not None else None
        lines = [[tuple(map(float, p.split(","))) for p in line.get("points").split()] for line in svg.findall("polyline")]
        title = svg.find("text[@class='title']")
        charts.append(Chart(title.text if title is not None else "", svg.get("data-kind"), _axis(svg, "x"),
                            _axis(svg, "y"), frame, lines))
    return charts


FROM_ZERO = {"bytes", "seconds", "count", "distance"}  # quantities that are never negative


def check_chart(chart: Chart) -> None:
    """The ticks a person reads: distinct labels, increasing values inside the axis, integers for
    counts; y from 0 for quantities that start there; x from the first round plotted; every point
    inside the plot."""
    if not chart.lines:  # "no data yet"
        assert chart.y is None and chart.x is None, chart
        return
    for axis in (chart.x, chart.y):
        assert len(axis.values) >= 2 or axis is chart.x, (chart.title, axis)
        assert len(set(axis.labels)) == len(axis.labels), (chart.title, axis.labels)
        assert all(a < b for a, b in zip(axis.values, axis.values[1:])), (chart.title, axis.values)
        assert all(axis.lo - 1e-9 <= v <= axis.hi + 1e-9 for v in axis.values), (chart.title, axis)
    assert chart.y.values[0] == chart.y.lo and chart.y.values[-1] == chart.y.hi, chart.y
    assert all(float(v).is_integer() for v in chart.x.values), (chart.title, chart.x.values)  # rounds
    assert chart.x.lo >= 0, (chart.title, chart.x)
    if chart.kind == "count":
        assert all(float(v).is_integer() for v in chart.y.values), (chart.title, chart.y.values)
    if chart.kind in FROM_ZERO:
        assert chart.y.lo == 0, (chart.title, chart.y)
    left, top, width, height = chart.frame
    points = [p for line in chart.lines for p in line]
    assert all(left - 0.1 <= x <= left + width + 0.1 and top - 0.1 <= y <= top + height + 0.1 for x, y in points), \
        (chart.title, points)
    assert abs(min(x for x, _ in points) - left) < 0.1, (chart.title, "x does not start at the first round")


# Prometheus' naming rules (https://prometheus.io/docs/practices/naming/): base units, counters in _total
UNIT_WORDS = {"milliseconds", "kilobytes", "megabytes", "minutes", "hours", "percent"}


def parse_metrics(text: str) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}} from the exposition text, checking the names."""
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        words = set(family.name.split("_"))
        assert not words & UNIT_WORDS, f"{family.name}: use base units (seconds, bytes)"
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family
        else:
            assert not family.name.endswith("_total"), f"{family.name} is a {family.type}, not a counter"
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


PROCESS_METRICS = ["process_resident_memory_bytes", "process_cpu_seconds_total", "process_start_time_seconds",
                   "process_open_fds"]


def check_server_metrics(samples: dict[str, dict[tuple, float]]) -> None:
    """What every coop server exports: its process (from /proc, on Linux) and its build."""
    for name in PROCESS_METRICS:
        assert value(samples, name) > 0, name
    ((labels, one),) = samples["coop_build_info"].items()
    assert one == 1 and {k for k, _ in labels} == {"version", "cuda", "python"}, labels

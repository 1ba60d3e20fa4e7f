"""The status pages' charts (coop.charts): the cases a person was misled by, then any data."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from page_check import check_chart, parse_charts

from coop.charts import bytes_chart, count_chart, line_chart, loss_chart, nice_step, seconds_chart, tick_labels, y_axis


def only_chart(svg: str):
    (chart,) = parse_charts(svg)
    check_chart(chart)
    return chart


def vertical_extent(chart) -> float:
    """The share of the plot's height the data's points span."""
    ys = [y for line in chart.lines for _, y in line]
    return (max(ys) - min(ys)) / chart.frame[3]


def test_bytes_noise_is_not_blown_up_and_labels_differ():
    # ~119 KB a round with 30 bytes of noise: labelled "0.119" five times, drawn full height, before
    noise = [119_000 + (30 if r % 2 else -30) for r in range(10)]
    chart = only_chart(bytes_chart("bytes received per round", {"updates": list(enumerate(noise))}))
    assert chart.y.lo == 0 and chart.y.hi >= 119_030 / 1000 and chart.y.labels[0] == "0"
    assert vertical_extent(chart) < 0.01, chart.y
    assert "updates (KB)" in bytes_chart("b", {"updates": list(enumerate(noise))})  # the unit that fits


@pytest.mark.parametrize("rounds", [[0], [5], [3, 4], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]])
def test_x_runs_from_the_first_round(rounds):
    chart = only_chart(loss_chart("loss", {"val": [(r, 4.0 - 0.1 * r) for r in rounds]}))
    assert chart.x.lo == rounds[0] and chart.x.values[0] >= rounds[0]  # never -1, never before the first round
    assert all(v.is_integer() for v in chart.x.values)


def test_durations_start_at_zero_and_never_go_negative():
    chart = only_chart(seconds_chart("round duration", {"s": [(0, 0.21), (1, 0.2), (2, 0.23), (3, 0.2)]}))
    assert chart.y.lo == 0 and min(chart.y.values) == 0 and all(v >= 0 for v in chart.y.values)


@pytest.mark.parametrize("counts", [[2, 2, 2], [1, 2], [0, 0], [3, 7, 12, 40]])
def test_counts_get_integer_ticks(counts):
    chart = only_chart(count_chart("updates", {"n": list(enumerate(counts))}))
    assert all(v.is_integer() for v in chart.y.values) and chart.y.lo == 0
    assert all(label.isdigit() or label.endswith("k") for label in chart.y.labels), chart.y.labels


def test_a_flat_loss_stays_flat():
    chart = only_chart(loss_chart("loss", {"val": [(r, 2.337 + (0.0004 if r % 2 else 0)) for r in range(8)]}))
    assert chart.y.hi - chart.y.lo >= 0.05 * 2.337 and vertical_extent(chart) < 0.02


def test_no_data_yet():
    svg = line_chart("loss", {"val": []})
    assert "no data yet" in svg and only_chart(svg).y is None
    assert "no data yet" in line_chart("loss", {"val": [(0, math.nan)]})  # a NaN is not a point


def test_nice_steps_and_labels():
    assert [nice_step(s) for s in (1.0, 4.0, 9.0, 0.04, 1234.0)] == [0.5, 1.0, 5.0, 0.01, 500.0]
    assert nice_step(0.3, integer=True) == 1.0
    assert tick_labels([0.0, 0.05, 0.1], 0.05) == ["0.00", "0.05", "0.10"]
    assert tick_labels([0.0, 20_000.0, 40_000.0], 20_000.0) == ["0", "20k", "40k"]
    assert tick_labels([115_000.0, 117_500.0, 120_000.0], 2_500.0) == ["115.0k", "117.5k", "120.0k"]


VALUES = st.lists(st.floats(0, 1e12, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(values=VALUES, kind=st.sampled_from(["bytes", "seconds", "count", "loss"]), first=st.integers(0, 10_000))
def test_any_data_gets_readable_ticks(values, kind, first):
    if kind == "count":
        values = [float(round(v)) % 100_000 for v in values]
    if kind == "loss":
        values = [v % 20 for v in values]
    series = {"a": [(first + i, v) for i, v in enumerate(values)]}
    make = {"bytes": bytes_chart, "seconds": seconds_chart, "count": count_chart, "loss": loss_chart}[kind]
    only_chart(make("chart", series))


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=20))
def test_any_y_axis_covers_its_data_with_distinct_labels(values):
    lo, hi, ticks = y_axis(values)
    assert lo <= min(values) and hi >= max(values) and len(ticks) >= 2
    labels = tick_labels(ticks, ticks[1] - ticks[0])
    assert len(set(labels)) == len(labels), (values, ticks, labels)

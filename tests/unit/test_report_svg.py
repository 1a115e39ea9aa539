"""The report's chart helpers: readable numbers, round ticks, legends, bands."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from rollout_mock.debug.svg import Band, fmt, line_chart, nice_ticks


@pytest.mark.parametrize(("value", "text"), [
    (float(np.float32(0.1)), "0.1"), (0.30000001192092896, "0.3"), (1234.5678, "1235"), (0.0, "0"),
    (-3.14159, "-3.142"), (2.5e-5, "2.5e-5"), (1.0e-7, "1e-7"), (12345678.0, "1.235e7"), (None, "-"),
    (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (250000.0, "250000"),
])
def test_fmt_has_at_most_4_significant_digits(value: float | None, text: str) -> None:
    assert fmt(value) == text


@pytest.mark.parametrize(("lo", "hi"), [(0.1, 0.9), (0.0, 258.0), (-2.77, -0.96), (12.3, 57.9), (1e-6, 3e-6),
                                        (5.0, 5.0), (0.0, 0.0), (-1e9, 1e9), (0.19375, 0.29)])
def test_nice_ticks_are_round_and_cover_the_data(lo: float, hi: float) -> None:
    ticks = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 3 <= len(ticks) <= 12
    steps = {round(b - a, 12) for a, b in zip(ticks, ticks[1:])}
    step = ticks[1] - ticks[0]
    assert all(math.isclose(s, step, rel_tol=1e-6) for s in steps)
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 2.5, 5)), (ticks, mantissa)
    digits = [fmt(t).split("e")[0].replace("-", "").replace(".", "").strip("0") for t in ticks]
    assert all(len(d) <= 3 for d in digits), (ticks, digits)


def test_integer_ticks_for_steps() -> None:
    assert nice_ticks(0, 3, 6, integer=True) == [0, 1, 2, 3]
    assert nice_ticks(0, 257, 6, integer=True)[:3] == [0, 50, 100]


def test_chart_legend_sits_above_the_plot_and_bands_keep_equal_lines_visible() -> None:
    steps = [0, 1, 2]
    flat = [0.1, 0.1, 0.1]
    svg = line_chart("reward", steps, {"mean": flat}, bands=[Band("min–max", flat, flat)])
    assert "0.10000000149" not in svg
    legend_y = [float(y) for y in re.findall(r'<text x="[\d.]+" y="([\d.]+)" class="legend">', svg)]
    frame_y = float(re.search(r'<rect x="\d+" y="([\d.]+)" width="\d+" height="\d+" class="frame"', svg).group(1))
    assert legend_y and max(legend_y) < frame_y  # every legend entry above the plot area
    assert svg.count('class="legend"') == 2 and "<polyline" in svg and "<polygon" in svg
    assert "mean: 0.1" in svg  # hover text, readable


def test_chart_without_data_and_with_gaps() -> None:
    assert "no data" in line_chart("x", [0, 1], {"a": [None, math.nan]})
    svg = line_chart("x", [0, 1, 2, 3], {"a": [1.0, None, 2.0, 3.0]})
    assert svg.count("<polyline") == 1  # one run of two points; the lone point is a dot

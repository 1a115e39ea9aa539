"""The one number formatter (rollout_mock.text) and the report's chart specs (rollout_mock.debug.charts):
readable numbers, never an exception, values no library can draw left out and counted, silent
charts named instead of drawn, log axes that keep every line off their edges."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rollout_mock.debug.charts import MAX_DRAWN, Band, Chart, charts_html, log_range
from rollout_mock.text import MAX_INT_DIGITS, dumps_json, fmt_number, int_digits, jsonable, to_float

NUMBERS = [
    (float(np.float32(0.1)), "0.1"), (0.30000001192092896, "0.3"), (1234.5678, "1235"), (0.0, "0"),
    (-3.14159, "-3.142"), (2.5e-5, "2.5e-5"), (1.0e-7, "1e-7"), (12345678.0, "1.235e7"), (None, "-"),
    (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (250000.0, "250000"),
    (7, "7"), (-123456789012345, "-123456789012345"), (10**17, "1e17"), (10**400, "<int of 401 digits>"),
    (-(10**20000), "<negative int of 20001 digits>"), (np.float32(0.1), "0.1"), (np.int64(-5), "-5"),
    (torch.tensor(3.25), "3.25"), (Decimal("1e999999"), "1e999999"), (Decimal("-Infinity"), "-inf"),
    (Decimal("sNaN"), "nan"), (Fraction(1, 3), "0.3333"), (Fraction(10**400), "<int of 401 digits>"),
    (1e308, "1e308"), (-1e308, "-1e308"), (True, "True"),
]


@pytest.mark.parametrize(("value", "text"), NUMBERS, ids=[f"{type(v).__name__}-{t}" for v, t in NUMBERS])
def test_fmt_number(value: object, text: str) -> None:
    assert fmt_number(value) == text


def test_fmt_number_never_raises_on_hostile_objects() -> None:
    class Hostile:
        def __float__(self) -> float:
            raise RuntimeError("no")

        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert fmt_number(Hostile()).startswith("<")
    assert fmt_number(np.longdouble("1e4000")) == "1e4000"  # beyond float64, its own exponent kept
    assert len(fmt_number("x" * 10_000)) < 80
    assert fmt_number(torch.ones(3)).startswith("tensor(")


@given(st.one_of(st.integers(min_value=-(10**5000), max_value=10**5000), st.floats(allow_nan=True),
                 st.decimals(allow_nan=True)))
def test_fmt_number_is_bounded_for_any_number(value: object) -> None:
    assert len(fmt_number(value)) <= 40


@given(st.integers(min_value=-(10**4000), max_value=10**4000))
def test_int_digits_counts_without_str(value: int) -> None:
    assert int_digits(value) == len(str(abs(value)))


def test_to_float_and_jsonable_of_huge_ints() -> None:
    assert to_float(10**400) == math.inf and to_float(-(10**400)) == -math.inf
    assert to_float("1.5") is None and to_float(None) is None and to_float(Decimal("sNaN")) != to_float(1)
    assert jsonable({"a": 10**20000, "b": [10**MAX_INT_DIGITS - 1]}) == {
        "a": "<int of 20001 digits>", "b": [10**MAX_INT_DIGITS - 1]}
    assert dumps_json([10**5000]) == '["<int of 5001 digits>"]'  # json.dumps itself raises past 4,300 digits


# ------------------------------------------------------------------------------------- charts
def test_spec_leaves_out_what_cannot_be_drawn_and_counts_it() -> None:
    steps = [0, 1, 2, 3, 10**400]
    chart = Chart("x", steps, {"a": [1.0, math.nan, 1e308, -1e308, 2.0], "b": [10**400, 2, "text", None, 1]})
    spec = chart.spec()
    assert spec["x"] == [0.0, 1.0, 2.0, 3.0]  # the step 10**400 is no float: left out
    assert spec["series"][0]["values"] == [1.0, None, None, None]
    assert spec["series"][1]["values"] == [None, 2.0, None, None]
    assert "5 values not drawn" in spec["note"] and "1 step beyond ±1e300 not drawn" in spec["note"]
    assert all(abs(v) <= MAX_DRAWN for s in spec["series"] for v in s["values"] if v is not None)


def test_spec_sorts_steps_and_keeps_bands_aligned() -> None:
    spec = Chart("x", [2, 0, 1], {"m": [3, 1, 2]}, bands=[Band("b", [2, 0, 1], [4, 2, 3])]).spec()
    assert spec["x"] == [0, 1, 2] and spec["series"][0]["values"] == [1, 2, 3]
    assert spec["bands"][0]["lo"] == [0, 1, 2] and spec["bands"][0]["hi"] == [2, 3, 4]


@pytest.mark.parametrize(("values", "reason"), [
    ([0.0, 0.0, 0.0], "0 at every step"), ([1, 1, 1], "1 at every step"), ([None, None, None], "no data"),
    ([math.inf, 1e308, math.nan], "3 values not drawn (NaN, inf or beyond ±1e300)"),
])
def test_a_chart_that_says_nothing_is_named_not_drawn(values: list[object], reason: str) -> None:
    chart = Chart("rejected samples", [0, 1, 2], {"rejected": values})
    assert chart.silent() == reason
    specs: list[dict[str, object]] = []
    html = charts_html([chart, Chart("reward", [0, 1, 2], {"mean": [0.1, 0.2, 0.3]})], specs)
    assert [s["title"] for s in specs] == ["reward"] and html.count('class="chart"') == 1
    assert f"Not drawn (nothing to see): rejected samples: {reason}." in html


def test_charts_that_say_something_are_drawn() -> None:
    assert Chart("x", [0], {"a": [0.0]}).silent() is None  # one step: its one point
    assert Chart("x", [0, 1], {"a": [0.0, None]}).silent() is None  # one value, one gap: its point
    assert Chart("x", [0, 1, 2], {"a": [0.0, None, 0.0]}).silent() == "0 at every step with data"
    assert Chart("x", [0, 1], {"a": [0.0, 1.0]}).silent() is None


@pytest.mark.parametrize("values", [[1e-8], [1e-8, 1e-8], [1e-6, 1e-3], [3e-9, 2e-7], [1.0, 10.0], [1e-300, 1e300]])
def test_log_range_keeps_lines_off_the_edges(values: list[float]) -> None:
    lo, hi = log_range(values)
    assert math.log10(min(values)) - math.log10(lo) >= 0.5 or lo == 1e-300
    assert math.log10(hi) - math.log10(max(values)) >= 0.5 or hi == 1e300
    assert math.log10(lo) == round(math.log10(lo)) and math.log10(hi) == round(math.log10(hi))  # decades


def test_log_chart_spec() -> None:
    diffs = [0.0, 0.0, 1e-8, 1e-8, -1.0, math.inf]
    spec = Chart("|A − B|", range(6), {"d": diffs}, log=True, marks=[(2, "first divergence"), (10**400, "x")]).spec()
    assert spec["series"][0]["values"] == [None, None, 1e-8, 1e-8, None, None]
    assert spec["yrange"] == [1e-9, 1e-7]  # the 1e-8 line in the middle, not on the bottom edge
    assert spec["marks"] == [{"x": 2.0, "label": "first divergence"}]
    assert spec["note"].startswith("2 values not drawn")  # -1 and inf; the zeros are "identical", no note


def test_chart_html_escapes_titles() -> None:
    specs: list[dict[str, object]] = []
    html = charts_html([Chart("<b>x</b>", [0, 1], {"a": [1, 2]})], specs)
    assert "<b>" not in html and re.search(r'aria-label="&lt;b&gt;x&lt;/b&gt;"', html)

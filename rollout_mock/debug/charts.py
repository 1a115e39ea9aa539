"""The report's charts: what each one shows, as data that the page draws with uPlot.

The page draws every chart in the browser with the vendored uPlot (``assets/``, MIT; see
``assets/README.md``): a tooltip with every value of the step under the pointer, zoom by
dragging over a chart, smoothing, and one step range shared by all charts. What goes into a
chart is decided here, where the numbers are:

* :class:`Chart` — series over steps (``None`` = a gap), shaded bands (min–max and p25–p75 around
  a mean), dashed series, a log axis, marked steps (the first divergence);
* a value a plotting library cannot place is left out and counted in the chart's note, never
  raised on: NaN and ±inf, magnitudes beyond :data:`MAX_DRAWN` (axis arithmetic overflows near
  1.8e308 in every library), values <= 0 on a log axis, a step that is no finite float
  (``10**400``), ints too large for a float, objects that are no numbers;
* :meth:`Chart.silent` — why a chart says nothing (no data, or one value at every step, e.g. an
  all-zero "rejected samples" chart): such a chart is not drawn, :func:`charts_html` lists it
  in one line under the others;
* :func:`log_range` — a log axis that reaches at least half a decade beyond the data, so that no
  line lies on its edge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from rollout_mock.text import fmt_number, to_float

__all__ = ["COLORS", "MAX_DRAWN", "Band", "Chart", "charts_html", "log_range"]

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
#: Largest magnitude drawn (the rest is counted in the chart's note): far from float64's 1.8e308,
#: so that a range, a padding or a tick step computed from the data never overflows.
MAX_DRAWN = 1e300
#: Smallest value drawn on a log axis (subnormal floats would make log10 of the axis' end -inf).
MIN_LOG = 1e-300


@dataclass(frozen=True)
class Band:
    """A shaded area between ``low`` and ``high`` (one value per step; ``None`` = a gap)."""

    name: str
    low: Sequence[Any]
    high: Sequence[Any]
    color: str = COLORS[0]
    opacity: float = 0.18


@dataclass
class Chart:
    """Lines (``series``: name -> one value per step) and ``bands`` over ``steps``.

    ``dashed``: series drawn dashed; ``colors``: per-series colours (else the palette);
    ``zero``: the y axis includes 0 (counts, percentages); ``log``: a log10 y axis (its range from
    :func:`log_range`; values <= 0 are gaps); ``marks``: ``(step, label)`` drawn as vertical
    lines; ``empty``: the one-line reason shown when no value can be drawn.
    """

    title: str
    steps: Sequence[Any]
    series: Mapping[str, Sequence[Any]]
    bands: Sequence[Band] = ()
    dashed: Sequence[str] = ()
    colors: Mapping[str, str] = field(default_factory=dict)
    zero: bool = False
    log: bool = False
    marks: Sequence[tuple[Any, str]] = ()
    width: int = 390
    height: int = 250
    empty: str = "no data"

    def _value(self, v: Any) -> float | None:
        x = v if isinstance(v, float) else to_float(v)
        if x is None or not math.isfinite(x) or abs(x) > MAX_DRAWN:
            return None
        if self.log and x < MIN_LOG:
            return None
        return x

    def _columns(self) -> tuple[list[int], list[float], int]:
        """The indexes of the drawable steps (sorted by step), their x values, and how many steps
        were left out."""
        keep = [(x, i) for i, s in enumerate(self.steps)
                if (x := to_float(s)) is not None and math.isfinite(x) and abs(x) <= MAX_DRAWN]
        keep.sort()
        return [i for _, i in keep], [x for x, _ in keep], len(self.steps) - len(keep)

    def _clean(self, values: Sequence[Any], index: list[int]) -> tuple[list[float | None], int]:
        out = [self._value(values[i]) if i < len(values) else None for i in index]
        given = sum(1 for i in index if i < len(values) and values[i] is not None
                    and not (self.log and values[i] == 0))  # a log axis' 0: no point, as its title says
        return out, given - sum(1 for v in out if v is not None)

    def spec(self) -> dict[str, Any]:
        """The chart as the page's script reads it (``x``, ``series``, ``bands``, ``note``...)."""
        index, xs, lost_steps = self._columns()
        lost = 0
        series: list[dict[str, Any]] = []
        for i, (name, values) in enumerate(self.series.items()):
            clean, n = self._clean(values, index)
            lost += n
            series.append({"name": name, "color": self.colors.get(name, COLORS[i % len(COLORS)]),
                           "dash": name in self.dashed, "values": clean})
        bands: list[dict[str, Any]] = []
        for band in self.bands:
            low, n_low = self._clean(band.low, index)
            high, n_high = self._clean(band.high, index)
            lost += n_low + n_high
            bands.append({"name": band.name, "color": band.color, "opacity": band.opacity, "lo": low, "hi": high})
        notes = []
        if lost:
            what = "<= 0, " if self.log else ""
            notes.append(f"{lost} value{'s' if lost != 1 else ''} not drawn ({what}NaN, inf or beyond ±1e300)")
        if lost_steps:
            notes.append(f"{lost_steps} step{'s' if lost_steps != 1 else ''} beyond ±1e300 not drawn")
        drawn = [v for s in series for v in s["values"] if v is not None]
        drawn += [v for b in bands for side in ("lo", "hi") for v in b[side] if v is not None]
        marks = [{"x": x, "label": label} for step, label in self.marks
                 if (x := to_float(step)) is not None and math.isfinite(x) and abs(x) <= MAX_DRAWN]
        return {"title": self.title, "x": xs, "series": series, "bands": bands, "log": self.log,
                "zero": self.zero, "yrange": log_range(drawn) if self.log and drawn else None,
                "marks": marks, "w": self.width, "h": self.height, "note": "; ".join(notes)}

    def silent(self) -> str | None:
        """Why the chart says nothing, in a few words (``None``: it says something): no value
        (:attr:`empty`), none that can be drawn (how many were left out), or, on a linear axis, the
        same value at every one of two or more steps (``"0 at every step"``; gaps aside:
        ``"... with data"``); a log axis' one value (a constant ``|A − B|``) is drawn."""
        spec = self.spec()
        values = [v for s in spec["series"] for v in s["values"]]
        values += [v for b in spec["bands"] for side in ("lo", "hi") for v in b[side]]
        drawn = {v for v in values if v is not None}
        if not drawn:
            return spec["note"] or self.empty  # values that cannot be drawn are not "no data"
        if len(drawn) == 1 and sum(v is not None for v in values) >= 2 and not self.log:  # |A − B| = 1e-9: news
            return f"{fmt_number(drawn.pop())} at every step" + (" with data" if None in values else "")
        return None


def log_range(values: Sequence[float]) -> list[float]:
    """``[lo, hi]`` of a log10 axis around positive ``values``: whole decades, at least half a
    decade beyond the smallest and the largest value (one value: a decade on each side), within
    ``MIN_LOG .. MAX_DRAWN``."""
    positive = [v for v in values if MIN_LOG <= v <= MAX_DRAWN]
    if not positive:
        return [1e-1, 1e1]
    lo = math.floor(math.log10(min(positive)) - 0.5)
    hi = math.ceil(math.log10(max(positive)) + 0.5)
    return [10.0 ** max(lo, -300), 10.0 ** min(hi, 300)]


def charts_html(charts: Sequence[Chart], specs: list[dict[str, Any]]) -> str:
    """The charts that say something, as placeholders the page's script draws into (their specs
    appended to ``specs``, the page's ``charts`` list), and one line naming those that do not."""
    parts, quiet = [], []
    for chart in charts:
        reason = chart.silent()
        if reason is not None:
            quiet.append(f"{chart.title}: {reason}")
            continue
        specs.append(chart.spec())
        parts.append(f'<div class="chart" data-chart="{len(specs) - 1}" role="img" '
                     f'aria-label="{escape(chart.title)}"></div>')
    out = f"<div class=\"charts\">{''.join(parts)}</div>" if parts else ""
    if quiet:
        out += f"<p class=\"muted quiet\">Not drawn (nothing to see): {escape('; '.join(quiet))}.</p>"
    return out

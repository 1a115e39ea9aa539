"""Small inline SVG charts for the HTML report: no JavaScript, no external resources.

* :func:`fmt` — a number as people read it: 4 significant digits, never float32 noise
  (``0.10000000149011612`` -> ``0.1``).
* :func:`nice_ticks` — axis ticks at round numbers (1, 2 or 5 x 10^k steps) covering the data.
* :func:`line_chart` — lines over steps, optional shaded bands (e.g. min-max around a mean line,
  so identical mean/min/max never hide each other), a legend above the plot (never on the
  curves) and hover tooltips with every value of a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["Band", "fmt", "line_chart", "nice_ticks"]

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
_CHAR_W = 6.2  # approximate width of one 11px legend character
_MAX_HOVER_COLUMNS = 130  # hover columns per chart (one per step up to this many steps)


def fmt(x: float | None) -> str:
    """``x`` with at most 4 significant digits (``-`` for None, ``nan``/``inf`` spelled out)."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if x == 0:
        return "0"
    if 1e-4 <= abs(x) < 1e6:
        text = f"{x:.4g}"
        return text if "e" not in text else f"{x:.0f}"
    mantissa, exponent = f"{x:.3e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _nice_step(span: float, target: int) -> float:
    raw = span / max(1, target)
    power = 10.0 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * power * (1 + 1e-9):
            return mult * power
    return 10 * power


def nice_ticks(lo: float, hi: float, target: int = 5, *, integer: bool = False) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 x 10^k apart) from <= ``lo`` to >= ``hi``.

    ``integer``: steps of at least 1 (an axis of step numbers). A flat range gets a small span
    around its value; the first and last ticks are the axis' ends.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"nice_ticks needs finite bounds, got {lo}, {hi}")
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = 1.0 if integer or lo == 0 else abs(lo) * 0.1
        lo, hi = lo - pad, hi + pad
    step = _nice_step(hi - lo, target)
    if integer:
        step = max(1.0, round(step))
    first = math.floor(lo / step + 1e-9) * step
    ticks: list[float] = []
    k = 0
    while True:
        value = first + k * step
        ticks.append(round(value / step) * step if abs(value) > step * 1e-9 else 0.0)
        if value >= hi - step * 1e-9:
            break
        k += 1
    return ticks


@dataclass(frozen=True)
class Band:
    """A shaded area between ``low`` and ``high`` (one value per step; None = gap)."""

    name: str
    low: Sequence[float | None]
    high: Sequence[float | None]
    color: str = "#1f77b4"
    opacity: float = 0.18


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _runs(steps: Sequence[int], values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    runs: list[list[tuple[int, float]]] = [[]]
    for s, v in zip(steps, values, strict=True):
        if v is None or not math.isfinite(v):
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((s, v))
    return [r for r in runs if r]


def _band_runs(steps: Sequence[int], low: Sequence[float | None],
               high: Sequence[float | None]) -> list[list[tuple[int, float, float]]]:
    runs: list[list[tuple[int, float, float]]] = [[]]
    for s, lo, hi in zip(steps, low, high, strict=True):
        if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((s, lo, hi))
    return [r for r in runs if r]


def line_chart(title: str, steps: Sequence[int], series: Mapping[str, Sequence[float | None]], *,
               bands: Sequence[Band] = (), width: int = 460, height: int = 230,
               dashed: Sequence[str] = (), colors: Mapping[str, str] | None = None, xlabel: str = "step",
               zero: bool = False, yfmt: Callable[[float | None], str] = fmt, yinteger: bool = False) -> str:
    """An SVG chart of ``series`` (name -> one value per step; ``None``/NaN = gap) over ``steps``.

    ``bands`` are drawn under the lines; ``dashed`` names series drawn dashed; ``colors`` overrides
    the palette per series; ``zero``: the y axis starts at (or crosses) 0 (counts, percentages);
    ``yfmt``: how y values read on the axis and in tooltips (e.g. ``10**v`` for a log10 chart);
    ``yinteger``: y ticks at whole numbers only (decades of a log10 chart).
    Every name is listed in the legend above the plot.
    """
    steps = list(steps)
    legend: list[tuple[str, str, str]] = [(b.name, b.color, "band") for b in bands]
    kind_opacity = {b.name: b.opacity for b in bands}
    palette = dict(colors or {})
    for i, name in enumerate(series):
        palette.setdefault(name, COLORS[i % len(COLORS)])
        legend.append((name, palette[name], "dash" if name in dashed else "line"))
    # legend rows: wrap entries to the chart's width
    rows: list[list[tuple[float, str, str, str]]] = [[]]
    x = 0.0
    for name, color, kind in legend:
        w = 26 + _CHAR_W * len(name) + 12
        if x + w > width - 12 and rows[-1]:
            rows.append([])
            x = 0.0
        rows[-1].append((x, name, color, kind))
        x += w
    left, right, bottom = 58, 14, 34
    top = 24 + 16 * len(rows) + 4
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
             f'<text x="8" y="15" class="ct">{escape(title)}</text>']
    for r, row in enumerate(rows):
        y = 24 + 16 * r + 8
        for x0, name, color, kind in row:
            lx = 12 + x0
            if kind == "band":
                parts.append(f'<rect x="{lx:.0f}" y="{y - 5}" width="20" height="10" fill="{color}" '
                             f'fill-opacity="{min(1.0, kind_opacity[name] * 1.5):.2f}"/>')
            else:
                dash = ' stroke-dasharray="4 3"' if kind == "dash" else ""
                parts.append(f'<line x1="{lx:.0f}" y1="{y}" x2="{lx + 20:.0f}" y2="{y}" stroke="{color}" '
                             f'stroke-width="2"{dash}/>')
            parts.append(f'<text x="{lx + 25:.0f}" y="{y + 4}" class="legend">{escape(name)}</text>')
    values = [v for vs in [*series.values(), *(b.low for b in bands), *(b.high for b in bands)]
              for v in vs if v is not None and math.isfinite(v)]
    plot_w, plot_h = width - left - right, height - top - bottom
    if not values or not steps:
        parts.append(f'<text x="{left}" y="{top + plot_h // 2}" class="muted">no data</text></svg>')
        return "".join(parts)
    lo, hi = min(values), max(values)
    if zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        hi = hi if hi > lo else 1.0
    yt = nice_ticks(lo, hi, integer=yinteger)
    xt = nice_ticks(min(steps), max(steps), 6, integer=True)
    xt = [t for t in xt if min(steps) <= t <= max(steps)] or [float(steps[0])]
    x0, x1 = (min(steps), max(steps)) if max(steps) > min(steps) else (steps[0] - 1, steps[0] + 1)
    y0, y1 = yt[0], yt[-1]

    def px(s: float) -> float:
        return left + (s - x0) / (x1 - x0) * plot_w

    def py(v: float) -> float:
        return top + (1 - (v - y0) / (y1 - y0)) * plot_h

    for t in yt:
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{py(t):.1f}" y2="{py(t):.1f}" class="grid"/>'
                     f'<text x="{left - 5}" y="{py(t) + 3.5:.1f}" class="tick" text-anchor="end">{yfmt(t)}</text>')
    for t in xt:
        parts.append(f'<text x="{px(t):.1f}" y="{top + plot_h + 14}" class="tick" text-anchor="middle">'
                     f'{int(t)}</text>')
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>'
                 f'<text x="{left + plot_w / 2:.0f}" y="{height - 4}" class="tick" text-anchor="middle">'
                 f'{escape(xlabel)}</text>')
    for band in bands:
        for brun in _band_runs(steps, band.low, band.high):
            if len(brun) == 1:  # a lone step: a short vertical bar
                s, lo, hi = brun[0]
                parts.append(f'<line x1="{px(s):.1f}" x2="{px(s):.1f}" y1="{py(lo):.1f}" y2="{py(hi):.1f}" '
                             f'stroke="{band.color}" stroke-opacity="0.5" stroke-width="4"/>')
                continue
            outline = [f"{px(s):.1f},{py(hi):.1f}" for s, _, hi in brun]
            outline += [f"{px(s):.1f},{py(lo):.1f}" for s, lo, _ in reversed(brun)]
            parts.append(f'<polygon points="{" ".join(outline)}" fill="{band.color}" '
                         f'fill-opacity="{band.opacity}" stroke="none"/>')
    few = len(steps) <= 60
    for name, vals in series.items():
        color = palette[name]
        dash = ' stroke-dasharray="4 3"' if name in dashed else ""
        for run in _runs(steps, vals):
            if len(run) > 1:
                points = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in run)
                parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{points}"/>')
            if few or len(run) == 1:
                parts.extend(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="2.2" fill="{color}"/>' for s, v in run)
    # hover: transparent columns whose titles list every value (at most _MAX_HOVER_COLUMNS of
    # them: with more steps, each column names the step at its centre)
    every = max(1, math.ceil(len(steps) / _MAX_HOVER_COLUMNS))
    half = (plot_w / max(1, len(steps)) / 2 if len(steps) > 1 else plot_w / 2) * every
    for i in range(0, len(steps), every):
        s = steps[i]
        lines = [f"step {s}"]
        lines += [f"{b.name}: {yfmt(b.low[i])} .. {yfmt(b.high[i])}" for b in bands]
        lines += [f"{name}: {yfmt(vals[i])}" for name, vals in series.items()]
        x = max(left, px(s) - half)
        parts.append(f'<rect class="hover" x="{x:.1f}" y="{top}" width="{min(2 * half, left + plot_w - x):.1f}" '
                     f'height="{plot_h}"><title>{escape(chr(10).join(lines))}</title></rect>')
    parts.append("</svg>")
    return "".join(parts)

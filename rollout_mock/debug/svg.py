"""Small inline SVG line charts (no JavaScript, no external resources) for the HTML report."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

__all__ = ["line_chart"]

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _fmt(x: float) -> str:
    if x == 0 or 1e-3 <= abs(x) < 1e5:
        return f"{x:.4g}"
    return f"{x:.2e}"


def line_chart(title: str, steps: Sequence[int], series: Mapping[str, Sequence[float | None]], *,
               width: int = 420, height: int = 200) -> str:
    """An SVG chart of ``series`` (name -> one value per step; ``None``/NaN = gap) over ``steps``."""
    left, right, top, bottom = 56, 10, 24, 30
    points = [(s, v) for values in series.values() for s, v in zip(steps, values, strict=True)
              if v is not None and math.isfinite(v)]
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
             f'<text x="{left}" y="15" class="ct">{escape(title)}</text>']
    if not points:
        parts.append(f'<text x="{left}" y="{height // 2}" class="muted">no data</text></svg>')
        return "".join(parts)
    xs = [s for s, _ in points]
    ys = [v for _, v in points]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(ys), max(ys)
    if y0 == y1:
        y0, y1 = y0 - (abs(y0) or 1) * 0.05, y1 + (abs(y1) or 1) * 0.05
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * plot_h

    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>')
    for y in (y0, (y0 + y1) / 2, y1):
        parts.append(f'<text x="{left - 4}" y="{py(y) + 4:.1f}" class="tick" text-anchor="end">{_fmt(y)}</text>')
    for x in sorted({x0, x1, *xs[:: max(1, len(set(xs)) // 6)]}):
        if x in steps:
            parts.append(f'<text x="{px(x):.1f}" y="{height - 14}" class="tick" text-anchor="middle">{x}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 2}" class="tick" text-anchor="middle">step</text>')
    for i, (name, values) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        run: list[str] = []
        segments: list[list[str]] = [run]
        for s, v in zip(steps, values, strict=True):
            if v is None or not math.isfinite(v):
                run = []
                segments.append(run)
                continue
            run.append(f"{px(s):.1f},{py(v):.1f}")
            parts.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="2.5" fill="{color}">'
                         f'<title>{escape(name)} at step {s}: {_fmt(v)}</title></circle>')
        for seg in segments:
            if len(seg) > 1:
                parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(seg)}"/>')
        parts.append(f'<text x="{left + 6 + i * 90}" y="{top + 12}" class="legend" '
                     f'fill="{color}">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)

"""Plot a verification: baseline and candidate curves per metric, first divergence marked.

matplotlib is an optional extra (``pip install rollout_mock[plot]``) imported only when a plot is
made. The figure is rendered with the Agg canvas directly, so the caller's global pyplot backend
and state are left alone. The PNG is written to a temporary file in the target directory and
renamed into place, so a crash never leaves a truncated image.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rollout_mock.compare.metrics import MetricsTable
from rollout_mock.compare.verify import MetricComparison, VerifyReport
from rollout_mock.errors import MissingExtraError
from rollout_mock.storage.directory import atomic_write

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["plot_report"]

_COLS = 2


def _order(report: VerifyReport, max_metrics: int) -> tuple[list[MetricComparison], int]:
    """Failing metrics first (in report order), then passing ones; at most ``max_metrics``."""
    ordered = [c for c in report.comparisons if not c.ok] + [c for c in report.comparisons if c.ok]
    return ordered[:max_metrics], max(0, len(ordered) - max_metrics)


def plot_report(
    baseline: MetricsTable,
    candidate: MetricsTable,
    report: VerifyReport,
    path: str | Path,
    *,
    max_metrics: int = 16,
    dpi: int = 100,
) -> Path:
    """Write a PNG with one subplot per compared metric and return its path.

    Each subplot shows both series against the step; a red dashed vertical line marks the first
    divergent step, or the first one-sided step when values never diverge. Failing metrics are
    drawn first; beyond ``max_metrics`` the rest are left out and counted in the title. NaN
    values leave gaps in the curves. Raises :class:`~rollout_mock.errors.MissingExtraError`
    without matplotlib.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtraError(
            f"plotting to {path} needs matplotlib: pip install rollout_mock[plot]", path=path
        ) from exc

    path = Path(path)
    shown, hidden = _order(report, max_metrics)
    n = max(1, len(shown))
    cols = min(_COLS, n)
    rows = (n + cols - 1) // cols
    fig = Figure(figsize=(6.0 * cols, 3.2 * rows), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    verdict = "OK" if report.ok else f"FAIL: {len(report.failed)} metric(s) diverge"
    title = f"rollout-mock verify: {verdict}"
    if hidden:
        title += f" ({hidden} more metric(s) not shown)"
    fig.suptitle(title)
    if not shown:
        axes[0].text(0.5, 0.5, "no metric logged by both runs", ha="center", va="center")
        axes[0].set_axis_off()
    for ax, comp in zip(axes, shown):
        _draw(ax, comp, baseline[comp.name], candidate[comp.name])
    for ax in axes[len(shown):]:
        ax.set_axis_off()

    image = io.BytesIO()
    fig.savefig(image, format="png")
    return atomic_write(path, image.getvalue())


def _draw(
    ax: Axes, comp: MetricComparison, base: Mapping[int, float], cand: Mapping[int, float]
) -> None:
    b_steps, c_steps = list(base), list(cand)
    ax.plot(b_steps, [base[s] for s in b_steps], label="baseline", color="tab:blue", linewidth=2.0)
    ax.plot(
        c_steps, [cand[s] for s in c_steps], label="candidate", color="tab:orange",
        linewidth=1.0, linestyle="--",
    )
    marker = comp.first_divergent_step
    label = "first divergence"
    if marker is None and not comp.ok:
        marker = min(comp.missing_in_candidate + comp.missing_in_baseline)
        label = "first one-sided step"
    if marker is not None:
        ax.axvline(marker, color="red", linestyle=":", linewidth=1.5, label=f"{label} (step {marker})")
    ax.set_title(f"{comp.name} [{'ok' if comp.ok else 'FAIL'}]")
    ax.set_xlabel("step")
    ax.legend(fontsize="small")

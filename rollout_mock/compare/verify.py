"""Compare the metrics of two runs: bitwise by default, or within ``rtol``/``atol``.

Rules (per metric, per step present on both sides; ``a`` = candidate, ``b`` = baseline):

* **Bitwise** (``rtol == atol == 0``, the default): the two float64 bit patterns are equal. So
  ``-0.0`` and ``0.0`` *differ* (a sign flip is a real numerical change), and two NaNs are
  identical whatever their payload (payloads are not stored in the metrics formats).
* **Tolerance**: ``|a - b| <= atol + rtol * |b|`` (numpy's ``isclose``, relative to the
  baseline). Infinities pass only against the same infinity; NaN passes only against NaN.
* A step logged on one side only, or a metric logged on one side only, is a failure.

Reported statistics: ``max_abs_diff`` is ``max |a - b|`` over steps where neither value is NaN
(``inf`` when an infinity meets a finite value or the opposite infinity; 0 for identical
infinities); ``max_rel_diff`` is ``|a - b| / |b|`` over the same steps (``inf`` when ``b == 0`` and
``a != 0``; 0 when both are zero).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_mock.compare.metrics import MetricsTable, identical, read_metrics, within_tolerance
from rollout_mock.errors import VerifyInputError
from rollout_mock.text import json_float

__all__ = [
    "MetricComparison",
    "VerifyInputError",
    "VerifyReport",
    "format_report",
    "verify",
]

#: How many one-sided steps a report lists per metric before eliding.
_MAX_LISTED_STEPS = 10



def _abs_diff(a: float, b: float) -> float | None:
    """``|a - b|``; None when a NaN is involved; 0 for equal infinities."""
    if math.isnan(a) or math.isnan(b):
        return None
    if a == b:
        return 0.0
    return abs(a - b)


def _rel_diff(a: float, b: float) -> float | None:
    diff = _abs_diff(a, b)
    if diff is None:
        return None
    if diff == 0.0:
        return 0.0
    if b == 0.0 or math.isinf(b):
        return math.inf
    return diff / abs(b)


@dataclass(frozen=True)
class MetricComparison:
    """The comparison of one metric logged on both sides.

    ``first_divergent_step`` is the smallest common step whose values do not match (``None`` when
    all match), with ``baseline_value``/``candidate_value`` at that step. Steps logged on one side
    only are in ``missing_in_candidate``/``missing_in_baseline`` (ascending).
    """

    name: str
    rtol: float
    atol: float
    steps_compared: int
    identical_steps: int
    matching_steps: int
    max_abs_diff: float
    max_rel_diff: float
    first_divergent_step: int | None
    baseline_value: float | None
    candidate_value: float | None
    missing_in_candidate: tuple[int, ...] = ()
    missing_in_baseline: tuple[int, ...] = ()

    @property
    def bitwise(self) -> bool:
        return self.rtol == 0.0 and self.atol == 0.0

    @property
    def divergent_steps(self) -> int:
        return self.steps_compared - self.matching_steps

    @property
    def ok(self) -> bool:
        return (
            self.first_divergent_step is None
            and not self.missing_in_candidate
            and not self.missing_in_baseline
        )


@dataclass(frozen=True)
class VerifyReport:
    """Result of :func:`verify`. ``ok`` is True only when every check passed."""

    baseline: str
    candidate: str
    comparisons: tuple[MetricComparison, ...]
    only_in_baseline: tuple[str, ...] = ()
    only_in_candidate: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return (
            all(c.ok for c in self.comparisons)
            and not self.only_in_baseline
            and not self.only_in_candidate
        )

    @property
    def failed(self) -> tuple[MetricComparison, ...]:
        return tuple(c for c in self.comparisons if not c.ok)

    @property
    def first_divergence(self) -> MetricComparison | None:
        """The comparison whose first divergent step is the earliest (ties: the metric logged first,
        as the on-line verdict of a replay names it).

        ``None`` when no common step diverges (the run may still fail on one-sided steps or
        metrics).
        """
        diverged = [(c.first_divergent_step, i) for i, c in enumerate(self.comparisons)
                    if c.first_divergent_step is not None]
        return self.comparisons[min(diverged)[1]] if diverged else None

    def comparison(self, name: str) -> MetricComparison:
        """The comparison of metric ``name``; ``KeyError`` if it was not compared."""
        for c in self.comparisons:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict: non-finite floats become ``"NaN"``/``"Infinity"``/``"-Infinity"``."""
        first = self.first_divergence
        return {
            "ok": self.ok,
            "first_divergence": None if first is None else {
                "step": first.first_divergent_step,
                "metric": first.name,
                "baseline_value": json_float(first.baseline_value),
                "candidate_value": json_float(first.candidate_value),
            },
            "baseline": self.baseline,
            "candidate": self.candidate,
            "only_in_baseline": list(self.only_in_baseline),
            "only_in_candidate": list(self.only_in_candidate),
            "metrics": {
                c.name: {
                    "ok": c.ok,
                    "mode": "bitwise" if c.bitwise else "tolerance",
                    "rtol": json_float(c.rtol),
                    "atol": json_float(c.atol),
                    "steps_compared": c.steps_compared,
                    "identical_steps": c.identical_steps,
                    "matching_steps": c.matching_steps,
                    "divergent_steps": c.divergent_steps,
                    "max_abs_diff": json_float(c.max_abs_diff),
                    "max_rel_diff": json_float(c.max_rel_diff),
                    "first_divergent_step": c.first_divergent_step,
                    "baseline_value": json_float(c.baseline_value),
                    "candidate_value": json_float(c.candidate_value),
                    "missing_in_candidate": list(c.missing_in_candidate),
                    "missing_in_baseline": list(c.missing_in_baseline),
                }
                for c in self.comparisons
            },
        }



def _check_tol(tol: float, what: str) -> float:
    tol = float(tol)
    if not (tol >= 0.0) or math.isinf(tol):
        raise VerifyInputError(f"{what} must be a finite number >= 0, got {tol!r}")
    return tol


def _tolerance(value: float | Mapping[str, float], kind: str, names: set[str]) -> dict[str, float]:
    """Per-metric tolerance; a Mapping lists overrides (unlisted metrics get 0)."""
    if not isinstance(value, Mapping):
        tol = _check_tol(value, kind)
        return dict.fromkeys(names, tol)
    unknown = sorted(set(value) - names)
    if unknown:
        raise VerifyInputError(
            f"{kind} given for unknown metric(s) {', '.join(map(repr, unknown))}; "
            f"compared metrics: {', '.join(sorted(names)) or '(none)'}"
        )
    return {name: _check_tol(value.get(name, 0.0), f"{kind} for {name!r}") for name in sorted(names)}


def _as_table(source: MetricsTable | str | Path) -> MetricsTable:
    return source if isinstance(source, MetricsTable) else read_metrics(source)


def compare_metric(
    name: str,
    baseline: Mapping[int, float],
    candidate: Mapping[int, float],
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
) -> MetricComparison:
    """Compare one metric's ``{step: value}`` series (see the module docstring for the rules)."""
    common = sorted(set(baseline) & set(candidate))
    n_identical = n_match = 0
    max_abs = max_rel = 0.0
    first: int | None = None
    b_first = c_first = None
    for step in common:
        b, a = baseline[step], candidate[step]
        n_identical += identical(a, b)
        if within_tolerance(a, b, rtol, atol):
            n_match += 1
        elif first is None:
            first, b_first, c_first = step, b, a
        d_abs, d_rel = _abs_diff(a, b), _rel_diff(a, b)
        if d_abs is not None and d_rel is not None:
            max_abs, max_rel = max(max_abs, d_abs), max(max_rel, d_rel)
    return MetricComparison(
        name=name,
        rtol=rtol,
        atol=atol,
        steps_compared=len(common),
        identical_steps=n_identical,
        matching_steps=n_match,
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        first_divergent_step=first,
        baseline_value=b_first,
        candidate_value=c_first,
        missing_in_candidate=tuple(sorted(set(baseline) - set(candidate))),
        missing_in_baseline=tuple(sorted(set(candidate) - set(baseline))),
    )


def verify(
    baseline: MetricsTable | str | Path,
    candidate: MetricsTable | str | Path,
    *,
    metrics: Sequence[str] | None = None,
    rtol: float | Mapping[str, float] = 0.0,
    atol: float | Mapping[str, float] = 0.0,
) -> VerifyReport:
    """Compare the candidate run's metrics against the baseline's.

    ``baseline``/``candidate`` are tables or anything :func:`~rollout_mock.compare.metrics.read_metrics`
    accepts. ``metrics`` restricts the comparison (other metrics are ignored, even one-sided ones);
    a requested metric absent from *both* runs is a :class:`VerifyInputError` (likely a typo), one
    absent from one run is a failure. ``rtol``/``atol`` are a float for every metric or a mapping
    ``metric -> tolerance`` (unlisted metrics: 0, i.e. bitwise; unknown names are an error).
    Reading errors propagate as :class:`~rollout_mock.errors.MetricsError`.
    """
    base, cand = _as_table(baseline), _as_table(candidate)
    if metrics is not None:
        wanted = list(dict.fromkeys(metrics))
        absent = [m for m in wanted if m not in base and m not in cand]
        if absent:
            raise VerifyInputError(
                f"metric(s) {', '.join(map(repr, absent))} not logged by either run; "
                f"available: {', '.join(sorted(set(base) | set(cand))) or '(none)'}"
            )
    else:
        wanted = list(dict.fromkeys([*base, *cand]))  # the recorded order: the baseline's metrics as logged
    both = [m for m in wanted if m in base and m in cand]
    rtols = _tolerance(rtol, "rtol", set(wanted))
    atols = _tolerance(atol, "atol", set(wanted))
    comparisons = tuple(
        compare_metric(m, base[m], cand[m], rtol=rtols[m], atol=atols[m]) for m in both
    )
    return VerifyReport(
        baseline=base.source or "<baseline>",
        candidate=cand.source or "<candidate>",
        comparisons=comparisons,
        only_in_baseline=tuple(m for m in wanted if m in base and m not in cand),
        only_in_candidate=tuple(m for m in wanted if m in cand and m not in base),
    )


# --------------------------------------------------------------------------------------------
# Text report
# --------------------------------------------------------------------------------------------


def _num(x: float) -> str:
    if x == 0.0:
        return "0"
    return f"{x:.3g}"


def _steps(steps: tuple[int, ...]) -> str:
    shown = ", ".join(map(str, steps[:_MAX_LISTED_STEPS]))
    more = len(steps) - _MAX_LISTED_STEPS
    return f"{shown}, ... ({more} more)" if more > 0 else shown


def format_report(report: VerifyReport) -> str:
    """Render the report as an aligned plain-text table plus the one-sided metrics and steps.

    Divergent values are printed with ``repr`` so that values differing only in the last bit (or
    in the sign of zero) are visibly different.
    """
    failed = len(report.failed) + len(report.only_in_baseline) + len(report.only_in_candidate)
    total = len(report.comparisons) + len(report.only_in_baseline) + len(report.only_in_candidate)
    verdict = "OK" if report.ok else f"FAIL ({failed} of {total} metrics differ)"
    lines = [
        f"rollout-mock verify: {verdict}",
        f"  baseline : {report.baseline}",
        f"  candidate: {report.candidate}",
        "",
    ]
    header = ("metric", "mode", "steps", "identical", "max abs diff", "max rel diff", "status", "first divergence")
    rows = [header]
    for c in report.comparisons:
        mode = "bitwise" if c.bitwise else f"rtol={c.rtol:g} atol={c.atol:g}"
        if c.first_divergent_step is not None:
            where = (
                f"step {c.first_divergent_step}: baseline={c.baseline_value!r} "
                f"candidate={c.candidate_value!r}"
            )
        elif not c.ok:
            where = "steps differ (below)"
        else:
            where = "-"
        rows.append((
            c.name,
            mode,
            str(c.steps_compared),
            str(c.identical_steps),
            _num(c.max_abs_diff),
            _num(c.max_rel_diff),
            "ok" if c.ok else "FAIL",
            where,
        ))
    if report.comparisons:
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for r in rows:
            lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    else:
        lines.append("  (no metric logged by both runs)")
    if report.only_in_baseline:
        lines.append(f"  metrics only in baseline : {', '.join(report.only_in_baseline)}")
    if report.only_in_candidate:
        lines.append(f"  metrics only in candidate: {', '.join(report.only_in_candidate)}")
    for c in report.comparisons:
        if c.missing_in_candidate:
            lines.append(f"  {c.name}: steps missing in candidate: {_steps(c.missing_in_candidate)}")
        if c.missing_in_baseline:
            lines.append(f"  {c.name}: steps missing in baseline: {_steps(c.missing_in_baseline)}")
    first = report.first_divergence
    if first is not None:
        lines.append(
            f"  first divergence: step {first.first_divergent_step}, metric {first.name} "
            f"(baseline={first.baseline_value!r} candidate={first.candidate_value!r})"
        )
    return "\n".join(lines)

"""Compare the metrics of two runs: bitwise by default, or within ``rtol``/``atol``.

Rules (per metric, per step present on both sides; ``a`` = candidate, ``b`` = baseline):

* **Bitwise** (``rtol == atol == 0``, the default): the two float64 bit patterns are equal. So
  ``-0.0`` and ``0.0`` *differ* (a sign flip is a real numerical change), and two NaNs are
  identical whatever their payload (payloads are not stored in the metrics formats).
* **Tolerance**: ``|a - b| <= atol + rtol * |b|`` (numpy's ``isclose``, relative to the
  baseline). Infinities pass only against the same infinity; NaN passes only against NaN.
* A step logged on one side only is a failure.

Three verdicts (:attr:`VerifyReport.verdict`): ``"pass"``, ``"fail"`` (a common step diverges, or a
step is logged on one side only) and ``"inconclusive"``: a run is empty, a metric is logged on one
side only, or fewer than ``min_steps`` steps were compared, and nothing diverged. A verdict says
what was *shown*: an empty candidate matches nothing, it does not pass. The CLI exits 0, 1, 3.

Reported statistics: ``max_abs_diff`` is ``max |a - b|`` over steps where neither value is NaN
(``inf`` when an infinity meets a finite value or the opposite infinity; 0 for identical
infinities); ``max_rel_diff`` is ``|a - b| / |b|`` over the same steps (``inf`` when ``b == 0`` and
``a != 0``; 0 when both are zero).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rollout_mock.compare.metrics import MetricsTable, identical, read_metrics, within_tolerance
from rollout_mock.errors import VerifyInputError
from rollout_mock.text import json_float

__all__ = [
    "INCONCLUSIVE",
    "MetricComparison",
    "VerifyInputError",
    "VerifyReport",
    "format_report",
    "verify",
    "verify_resume",
]

#: The three verdicts of a comparison, and the exit code the CLI gives each.
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}

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
    """Result of :func:`verify`. ``ok`` is True only when the verdict is ``"pass"``.

    ``baseline_id``/``candidate_id``: each run's content id (:meth:`MetricsTable.content_id`).
    ``notes``: further reasons the comparison shows nothing (``verify_resume``: no step after the
    resume), each making the verdict inconclusive unless something diverged.
    """

    baseline: str
    candidate: str
    comparisons: tuple[MetricComparison, ...]
    only_in_baseline: tuple[str, ...] = ()
    only_in_candidate: tuple[str, ...] = ()
    min_steps: int = 1
    baseline_steps: int = 0
    candidate_steps: int = 0
    baseline_id: str | None = None
    candidate_id: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def steps_compared(self) -> int:
        """Steps that at least one metric compared on both sides."""
        return max((c.steps_compared for c in self.comparisons), default=0)

    @property
    def inconclusive_reasons(self) -> tuple[str, ...]:
        """Why the comparison shows too little to pass (empty when it shows enough)."""
        reasons: list[str] = []
        for side, n in (("baseline", self.baseline_steps), ("candidate", self.candidate_steps)):
            if n == 0:
                reasons.append(f"the {side} run is empty (no metric logged at any step)")
        if self.only_in_baseline:
            reasons.append(f"metric(s) absent from the candidate: {', '.join(self.only_in_baseline)}")
        if self.only_in_candidate:
            reasons.append(f"metric(s) absent from the baseline: {', '.join(self.only_in_candidate)}")
        if not reasons and self.steps_compared < self.min_steps:
            reasons.append(f"{self.steps_compared} step(s) compared, fewer than the {self.min_steps} "
                           f"required (--min-steps)")
        return (*reasons, *self.notes)

    @property
    def verdict(self) -> str:
        """``"fail"`` when a compared value diverges or a step is one-sided (a definite answer even
        when other metrics are missing), else ``"inconclusive"`` when :attr:`inconclusive_reasons`
        says anything, else ``"pass"``. An empty run is inconclusive whatever the other holds."""
        if self.baseline_steps == 0 or self.candidate_steps == 0:
            return INCONCLUSIVE
        if any(not c.ok for c in self.comparisons):
            return FAIL
        return INCONCLUSIVE if self.inconclusive_reasons else PASS

    @property
    def exit_code(self) -> int:
        """0 pass, 1 fail, 3 inconclusive (the CLI's exit codes, as ``bisect``'s)."""
        return EXIT_CODES[self.verdict]

    @property
    def ok(self) -> bool:
        return self.verdict == PASS

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
            "verdict": self.verdict,
            "inconclusive_reasons": list(self.inconclusive_reasons) if self.verdict == INCONCLUSIVE else [],
            "steps_compared": self.steps_compared,
            "min_steps": self.min_steps,
            "baseline_id": self.baseline_id,
            "candidate_id": self.candidate_id,
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
    min_steps: int = 1,
    expected_id: str | None = None,
) -> VerifyReport:
    """Compare the candidate run's metrics against the baseline's.

    ``min_steps``: fewer common steps make the verdict inconclusive. ``expected_id``: the
    baseline's pinned content id (``sha256:...``, printed by ``rollout-mock verify --print-id``);
    a baseline whose content differs raises :class:`VerifyInputError` before anything is compared.

    ``baseline``/``candidate`` are tables or anything :func:`~rollout_mock.compare.metrics.read_metrics`
    accepts. ``metrics`` restricts the comparison (other metrics are ignored, even one-sided ones);
    a requested metric absent from *both* runs is a :class:`VerifyInputError` (likely a typo), one
    absent from one run is a failure. ``rtol``/``atol`` are a float for every metric or a mapping
    ``metric -> tolerance`` (unlisted metrics: 0, i.e. bitwise; unknown names are an error).
    Reading errors propagate as :class:`~rollout_mock.errors.MetricsError`.
    """
    base, cand = _as_table(baseline), _as_table(candidate)
    if min_steps < 1:
        raise VerifyInputError(f"min_steps must be >= 1, got {min_steps}")
    check_expected_id(base, expected_id)
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
        min_steps=min_steps,
        baseline_steps=len(base.steps),
        candidate_steps=len(cand.steps),
        baseline_id=base.content_id(),
        candidate_id=cand.content_id(),
    )


def check_expected_id(table: MetricsTable, expected_id: str | None) -> None:
    """Refuse a baseline whose content id is not ``expected_id`` (nothing to check when None)."""
    if expected_id is None:
        return
    if not expected_id.startswith("sha256:") or len(expected_id) != 71:
        raise VerifyInputError(f"--expected-id {expected_id!r}: expected sha256: and 64 hex digits, as "
                               f"printed by: rollout-mock verify --print-id BASELINE")
    actual = table.content_id()
    if actual != expected_id.lower():
        raise VerifyInputError(
            f"baseline {table.source or '<memory>'} changed: its content id is {actual}, not the pinned "
            f"{expected_id}; a verdict against it would not be the one you pinned. Restore the baseline, "
            f"or pin the new one after review: rollout-mock verify --print-id {table.source or 'BASELINE'}"
        )


def verify_resume(
    uninterrupted: MetricsTable | str | Path,
    resumed: MetricsTable | str | Path,
    *,
    resume_step: int,
    metrics: Sequence[str] | None = None,
) -> VerifyReport:
    """The restart-replay gate: a run stopped and resumed at ``resume_step`` (the first step the
    resumed process ran) must equal the uninterrupted run bit for bit.

    ``resumed`` holds the resumed process's metrics (steps from ``resume_step`` on) and, when it
    was appended to the first leg's file, the steps before too: every step it holds is compared,
    and every step of ``uninterrupted`` from ``resume_step`` on must be in it (one missing fails).
    Steps of ``uninterrupted`` before ``resume_step`` that ``resumed`` lacks are not required. The
    verdict is inconclusive when no step at or after ``resume_step`` is in both runs.
    """
    base, cand = _as_table(uninterrupted), _as_table(resumed)
    kept = set(cand.steps)
    trimmed = MetricsTable(
        {m: {s: v for s, v in series.items() if s >= resume_step or s in kept} for m, series in base.items()},
        source=base.source, format=base.format,
    )
    report = verify(trimmed, cand, metrics=metrics)
    after = [s for s in cand.steps if s >= resume_step and s in set(trimmed.steps)]
    notes = () if after else (f"no step at or after the resume step {resume_step} is in both runs",)
    return replace(report, notes=notes, baseline_id=base.content_id())


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
    if report.verdict == INCONCLUSIVE:
        verdict = "INCONCLUSIVE (" + "; ".join(report.inconclusive_reasons) + ")"
    else:
        verdict = "OK" if report.ok else f"FAIL ({failed} of {total} metrics differ)"
    ids = {"baseline": report.baseline_id, "candidate": report.candidate_id}
    lines = [
        f"rollout-mock verify: {verdict}",
        f"  baseline : {report.baseline}" + (f"  [{ids['baseline']}]" if ids["baseline"] else ""),
        f"  candidate: {report.candidate}" + (f"  [{ids['candidate']}]" if ids["candidate"] else ""),
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

"""``rollout-mock verify BASELINE CANDIDATE``: compare the metrics of two runs.

Exit codes: 0 when every compared metric matches (bitwise by default), 1 on any divergence or
one-sided metric/step, 2 on bad input (missing or malformed files, bad options; reported by
:func:`rollout_mock.cli.main` as one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rollout_mock.compare.metrics import MetricsTable, read_metrics
from rollout_mock.compare.verify import VerifyReport, format_report, verify
from rollout_mock.errors import VerifyInputError

__all__ = [
    "Failure", "add_parser", "first_failure", "parse_metric_names", "parse_tolerances", "run", "verify_with_options",
]

_TOL_HELP = (
    "a float applied to every metric, or METRIC=FLOAT for one metric (repeatable; overrides the "
    "plain value). Default 0: bitwise comparison"
)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``verify`` subcommand on an ``argparse`` subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "verify",
        help="compare the metrics of a candidate run against a baseline run",
        description=(
            "Compare training metrics of two runs (metrics.jsonl, .csv, TensorBoard events or a "
            "run directory holding one). Exit 0 if identical (or within tolerance), 1 if they "
            "diverge, 2 on bad input."
        ),
    )
    parser.add_argument("baseline", help="baseline metrics file or run directory")
    parser.add_argument("candidate", help="candidate metrics file or run directory")
    parser.add_argument("--rtol", action="append", default=[], metavar="[METRIC=]FLOAT", help=_TOL_HELP)
    parser.add_argument("--atol", action="append", default=[], metavar="[METRIC=]FLOAT", help=_TOL_HELP)
    parser.add_argument(
        "--metrics",
        metavar="A,B,...",
        help="compare only these metrics (comma-separated); default: every metric of either run",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument("--plot", metavar="OUT.png", help="also write a PNG plot of both runs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: on a TTY only)")
    return parser


def parse_tolerances(values: Sequence[str], option: str) -> tuple[float, dict[str, float]]:
    """Split ``--rtol``/``--atol`` values into ``(default, {metric: tol})``.

    ``"1e-6"`` sets the default (given at most once); ``"pg_loss=1e-3"`` sets one metric (the last
    ``=`` splits, so metric names may contain ``=``). Raises :class:`VerifyInputError` on
    anything that is not a finite non-negative float.
    """
    default: float | None = None
    per_metric: dict[str, float] = {}
    for raw in values:
        name, sep, number = raw.rpartition("=")
        try:
            tol = float(number)
        except ValueError:
            raise VerifyInputError(
                f"{option} {raw!r}: expected FLOAT or METRIC=FLOAT, e.g. {option} 1e-6 or "
                f"{option} pg_loss=1e-6"
            ) from None
        if not (tol >= 0.0) or math.isinf(tol):
            raise VerifyInputError(f"{option} {raw!r}: tolerance must be a finite number >= 0")
        if not sep:
            if default is not None:
                raise VerifyInputError(f"{option} given twice without a metric name: {default:g} and {raw}")
            default = tol
        elif not name:
            raise VerifyInputError(f"{option} {raw!r}: empty metric name before '='")
        else:
            per_metric[name] = tol
    return (0.0 if default is None else default), per_metric


def parse_metric_names(value: str | None) -> list[str] | None:
    """``--metrics A,B``: the names (``None`` when the option is not given: every metric)."""
    if value is None:
        return None
    selected = [m.strip() for m in value.split(",") if m.strip()]
    if not selected:
        raise VerifyInputError(f"--metrics {value!r}: no metric names given")
    return selected


Tolerance = tuple[float, dict[str, float]]


def verify_with_options(baseline: MetricsTable, candidate: MetricsTable, *, rtol: Tolerance, atol: Tolerance,
                        metrics: Sequence[str] | None) -> VerifyReport:
    """:func:`~rollout_mock.compare.verify.verify` with the parsed ``--rtol``/``--atol`` values of
    :func:`parse_tolerances` (the plain value for every compared metric, ``METRIC=FLOAT`` overrides)
    and ``--metrics`` (``None``: every metric of either run). Shared by ``verify`` and ``bisect``."""
    names = list(metrics) if metrics is not None else sorted(set(baseline) | set(candidate))
    return verify(
        baseline,
        candidate,
        metrics=metrics,
        rtol={**dict.fromkeys(names, rtol[0]), **rtol[1]},
        atol={**dict.fromkeys(names, atol[0]), **atol[1]},
    )


@dataclass(frozen=True)
class Failure:
    """Where a comparison first fails: a step and metric, both values when the step is on both sides."""

    step: int | None
    metric: str
    baseline_value: float | None
    candidate_value: float | None
    reason: str


def first_failure(report: VerifyReport, sides: tuple[str, str] = ("baseline", "candidate")) -> Failure | None:
    """The earliest divergent value of a failed report (``report.first_divergence``) or, when only
    steps or metrics are one-sided, the first of those; ``None`` when the report is ok. ``sides``:
    what the reason calls the baseline and the candidate."""
    base, cand = sides
    first = report.first_divergence
    if first is not None:
        return Failure(first.first_divergent_step, first.name, first.baseline_value, first.candidate_value,
                       f"step {first.first_divergent_step}, {first.name}: {base} {first.baseline_value!r}, "
                       f"{cand} {first.candidate_value!r}")
    if report.only_in_baseline:
        return Failure(None, report.only_in_baseline[0], None, None,
                       f"metric {report.only_in_baseline[0]} is only in the {base}")
    if report.only_in_candidate:
        return Failure(None, report.only_in_candidate[0], None, None,
                       f"metric {report.only_in_candidate[0]} is only in the {cand} (--metrics compares only some)")
    for c in report.failed:
        side, steps = (cand, c.missing_in_candidate) if c.missing_in_candidate else (base, c.missing_in_baseline)
        return Failure(steps[0], c.name, None, None, f"step {steps[0]} of {c.name} is missing in the {side}")
    return None


def _read(path: str) -> MetricsTable:
    """Read a table, turning reader warnings (torn last line) into one stderr line each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = read_metrics(path)
    for w in caught:
        print(f"rollout-mock verify: warning: {w.message}", file=sys.stderr)
    return table


def _size(path: str) -> int:
    """Bytes :func:`read_metrics` will read for ``path`` (0 when it cannot tell: the reader says why)."""
    from rollout_mock.compare.metrics import resolve_metrics_path
    from rollout_mock.errors import MetricsError

    try:
        resolved, _ = resolve_metrics_path(path)
        files = [resolved] if resolved.is_file() else [f for f in resolved.iterdir() if f.is_file()]
        return sum(f.stat().st_size for f in files)
    except (OSError, MetricsError):
        return 0


def _read_both(baseline: str, candidate: str, *, progress: bool | None) -> tuple[MetricsTable, MetricsTable]:
    """Both tables, with a bar over the bytes read (large TensorBoard logs take a while; on a
    terminal outside CI only, unless ``progress`` says otherwise)."""
    from rollout_mock.text import progress_bar

    sizes = [_size(baseline), _size(candidate)]
    with progress_bar(sum(sizes), enabled=progress, desc="verify") as bar:
        tables = []
        for path, size in zip((baseline, candidate), sizes, strict=True):
            tables.append(_read(path))
            bar.update(size)
    return tables[0], tables[1]


def run(args: argparse.Namespace) -> int:
    """Run the comparison; return the exit code (errors propagate to :func:`rollout_mock.cli.main`)."""
    rtol = parse_tolerances(args.rtol, "--rtol")
    atol = parse_tolerances(args.atol, "--atol")
    selected = parse_metric_names(args.metrics)
    plot_missing = False
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            plot_missing = True  # the report still prints; the plot is skipped with a hint

    baseline, candidate = _read_both(args.baseline, args.candidate, progress=False if args.no_progress else None)
    report = verify_with_options(baseline, candidate, rtol=rtol, atol=atol, metrics=selected)
    plot_path: Path | None = None
    if plot_missing:
        print(f"rollout-mock verify: --plot {args.plot} skipped: matplotlib is not installed; "
              f"install the extra with: pip install 'rollout_mock[plot]'  (or: pip install matplotlib)",
              file=sys.stderr)
    elif args.plot:
        from rollout_mock.compare.plot import plot_report

        plot_path = plot_report(baseline, candidate, report, args.plot)
    if args.json:
        out = report.to_json()
        out["plot"] = None if plot_path is None else str(plot_path)
        print(json.dumps(out, indent=2, allow_nan=False))
    else:
        print(format_report(report))
        if plot_path is not None:
            print(f"  plot: {plot_path}")
    return 0 if report.ok else 1

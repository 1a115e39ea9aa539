"""``rollout-mock verify BASELINE CANDIDATE``: compare the metrics of two runs; ``rollout-mock
verify-resume UNINTERRUPTED RESUMED --resume-step K``: the restart-replay gate.

Exit codes: 0 when every compared metric matches (bitwise by default), 1 on any divergence or
one-sided step, 2 on bad input (missing or malformed files, bad options, a baseline whose content
id is not ``--expected-id``; reported by :func:`rollout_mock.cli.main` as one line on stderr), 3
inconclusive (an empty run, a metric logged on one side only, fewer than ``--min-steps`` steps).
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
from rollout_mock.compare.verify import VerifyReport, format_report, verify, verify_resume
from rollout_mock.errors import EmptyMetricsError, VerifyInputError

__all__ = [
    "COMMANDS", "Failure", "add_parser", "add_resume_parser", "first_failure", "parse_metric_names",
    "parse_tolerances", "run", "run_resume", "verify_with_options",
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
            "diverge, 2 on bad input or a baseline that is not --expected-id, 3 inconclusive (an "
            "empty run, a metric on one side only, fewer than --min-steps steps)."
        ),
    )
    parser.add_argument("baseline", help="baseline metrics file or run directory")
    parser.add_argument("candidate", nargs="?", help="candidate metrics file or run directory "
                        "(not with --print-id)")
    parser.add_argument("--expected-id", metavar="sha256:HEX",
                        help="refuse (exit 2) a baseline whose content id differs: pin the id that "
                             "--print-id printed when the baseline was reviewed")
    parser.add_argument("--print-id", action="store_true",
                        help="print the baseline's content id (sha256 of its values, whatever the "
                             "file format) and exit")
    parser.add_argument("--min-steps", type=int, default=1, metavar="N",
                        help="fewer steps compared than N is inconclusive, exit 3 (default 1)")
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
                        metrics: Sequence[str] | None, min_steps: int = 1,
                        expected_id: str | None = None) -> VerifyReport:
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
        min_steps=min_steps,
        expected_id=expected_id,
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
    """Read a table, turning reader warnings (torn last line) into one stderr line each. A run that
    logged nothing is an empty table (its verdict is inconclusive), not bad input."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            table = read_metrics(path)
        except EmptyMetricsError as exc:
            table = MetricsTable({}, source=str(exc.path or path), format=None)
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
    if args.print_id:
        print(f"{_read(args.baseline).content_id()}  {args.baseline}")
        return 0
    if args.candidate is None:
        raise VerifyInputError("verify: CANDIDATE is missing: rollout-mock verify BASELINE CANDIDATE "
                               "(or: rollout-mock verify --print-id BASELINE)")
    if args.min_steps < 1:
        raise VerifyInputError(f"--min-steps {args.min_steps}: must be >= 1")
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
    report = verify_with_options(baseline, candidate, rtol=rtol, atol=atol, metrics=selected,
                                 min_steps=args.min_steps, expected_id=args.expected_id)
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
    return report.exit_code


def add_resume_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``verify-resume`` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "verify-resume",
        help="the restart-replay gate: a run stopped and resumed equals the uninterrupted run, bit for bit",
        description=(
            "Compare the metrics of a run that was stopped and resumed from a checkpoint with those of "
            "the same run done in one go, bitwise. RESUMED holds the resumed process's steps (and the "
            "first leg's, when appended to the same file); every step of UNINTERRUPTED from --resume-step "
            "on must be in it and identical. Exit 0 identical, 1 a step differs or is missing (the "
            "message names the first step and how far after the resume it is), 2 bad input, 3 "
            "inconclusive (no step after the resume on both sides, an empty run, a metric on one side)."
        ),
    )
    parser.add_argument("uninterrupted", help="metrics of the run done in one go (file or run directory)")
    parser.add_argument("resumed", help="metrics of the run stopped and resumed (file or run directory)")
    parser.add_argument("--resume-step", type=int, required=True, metavar="K",
                        help="the first step the resumed process ran (the checkpoint's step + 1)")
    parser.add_argument("--metrics", metavar="A,B,...", help="compare only these metrics")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (default: on a TTY only)")
    return parser


def run_resume(args: argparse.Namespace) -> int:
    """The restart-replay gate; return the exit code."""
    if args.resume_step < 0:
        raise VerifyInputError(f"--resume-step {args.resume_step}: must be >= 0")
    reference, resumed = _read_both(args.uninterrupted, args.resumed,
                                    progress=False if args.no_progress else None)
    report = verify_resume(reference, resumed, resume_step=args.resume_step,
                           metrics=parse_metric_names(args.metrics))
    first = first_failure(report, ("uninterrupted run", "resumed run"))
    if args.json:
        out = report.to_json()
        out["resume_step"] = args.resume_step
        out["first_failure"] = None if first is None else {"step": first.step, "metric": first.metric,
                                                            "reason": first.reason}
        print(json.dumps(out, indent=2, allow_nan=False))
        return report.exit_code
    print(format_report(report).replace("rollout-mock verify:", "rollout-mock verify-resume:", 1))
    if report.verdict == "fail" and first is not None:
        after = "" if first.step is None else f" ({first.step - args.resume_step} step(s) after the resume at " \
                                              f"{args.resume_step})"
        print(f"  the resumed run differs: {first.reason}{after}; what the checkpoint does not restore "
              f"(RNG state, optimizer or scheduler state, data-loader position) shows first there")
    return report.exit_code


COMMANDS = {
    "verify": (add_parser, run),
    "verify-resume": (add_resume_parser, run_resume),
}

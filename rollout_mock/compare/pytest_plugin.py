"""pytest plugin: assert that a run's metrics match a recorded baseline.

Loaded automatically (``pytest11`` entry point) in every pytest run where rollout_mock is
installed, so importing this module must stay cheap and side-effect free: it imports only the
standard library and pytest; the metrics/verify modules are imported when a check runs.

Use it in three ways::

    from rollout_mock.compare.pytest_plugin import assert_metrics_match

    def test_refactor_keeps_numerics(tmp_path):
        train(mode="mock", dump_dir="dumps/", metrics=tmp_path / "metrics.jsonl")
        assert_metrics_match("baseline/metrics.jsonl", tmp_path / "metrics.jsonl")

    def test_against_cli_baseline(precision_baseline, tmp_path):   # needs --rollout-mock-baseline
        ...

    def test_with_fixture(assert_matches_baseline, tmp_path):      # tolerances from the CLI too
        train(...); assert_matches_baseline(tmp_path / "metrics.jsonl")

    def test_resume_is_exact(tmp_path):                             # the restart-replay gate
        train(steps=10, metrics=tmp_path / "full.jsonl")
        train(steps=4, metrics=tmp_path / "resumed.jsonl", save_checkpoint=True)
        train(steps=10, metrics=tmp_path / "resumed.jsonl", resume_from_checkpoint=True)
        assert_resume_matches(tmp_path / "full.jsonl", tmp_path / "resumed.jsonl", resume_step=5)

An inconclusive comparison (an empty run, a metric logged on one side only) fails the test too,
with the reason: a test that compared nothing must not pass.

Options: ``--rollout-mock-baseline=PATH`` (metrics file or run directory; tests using the
fixtures are *skipped* when it is not given), ``--rollout-mock-rtol`` and ``--rollout-mock-atol``
(default 0: bitwise).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from rollout_mock.compare.metrics import MetricsTable
    from rollout_mock.compare.verify import VerifyReport

__all__ = ["assert_metrics_match", "assert_resume_matches"]

_BASELINE_OPT = "--rollout-mock-baseline"


def assert_metrics_match(
    baseline: MetricsTable | str | Path,
    candidate: MetricsTable | str | Path,
    *,
    metrics: Sequence[str] | None = None,
    rtol: float | Mapping[str, float] = 0.0,
    atol: float | Mapping[str, float] = 0.0,
) -> VerifyReport:
    """Raise ``AssertionError`` carrying the formatted report unless the runs match.

    Arguments as for :func:`rollout_mock.compare.verify.verify`; returns the (passing) report. Unreadable
    inputs raise :class:`~rollout_mock.errors.MetricsError`, not ``AssertionError``, so that a
    broken baseline is not mistaken for a numerical regression.
    """
    __tracebackhide__ = True
    from rollout_mock.compare.verify import format_report, verify

    report = verify(baseline, candidate, metrics=metrics, rtol=rtol, atol=atol)
    if not report.ok:
        what = "diverge from" if report.verdict == "fail" else "cannot be compared with"
        raise AssertionError(f"metrics {what} the baseline\n" + format_report(report))
    return report


def assert_resume_matches(
    uninterrupted: MetricsTable | str | Path,
    resumed: MetricsTable | str | Path,
    *,
    resume_step: int,
    metrics: Sequence[str] | None = None,
) -> VerifyReport:
    """The restart-replay gate as an assertion: ``resumed`` (a run stopped, then resumed at
    ``resume_step``, its first step) equals ``uninterrupted`` bit for bit; see
    :func:`rollout_mock.compare.verify.verify_resume`. Returns the passing report."""
    __tracebackhide__ = True
    from rollout_mock.compare.verify import format_report, verify_resume

    report = verify_resume(uninterrupted, resumed, resume_step=resume_step, metrics=metrics)
    if not report.ok:
        what = "differs from" if report.verdict == "fail" else "cannot be compared with"
        raise AssertionError(f"the run resumed at step {resume_step} {what} the uninterrupted run\n"
                             + format_report(report))
    return report


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rollout_mock", "rollout_mock precision checks")
    group.addoption(
        _BASELINE_OPT,
        metavar="PATH",
        default=None,
        help="baseline metrics file or run directory for the precision_baseline fixture",
    )
    group.addoption(
        "--rollout-mock-rtol", type=float, default=0.0, metavar="FLOAT",
        help="default rtol for assert_matches_baseline (default 0: bitwise)",
    )
    group.addoption(
        "--rollout-mock-atol", type=float, default=0.0, metavar="FLOAT",
        help="default atol for assert_matches_baseline (default 0: bitwise)",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    baseline = config.getoption(_BASELINE_OPT)
    return None if baseline is None else f"rollout_mock baseline: {baseline}"


@pytest.fixture
def precision_baseline(request: pytest.FixtureRequest) -> Path:
    """The ``--rollout-mock-baseline`` path; skips the test when the option is not given.

    A given path that does not exist fails the test (a typo must not look like a skip).
    """
    value = request.config.getoption(_BASELINE_OPT)
    if value is None:
        pytest.skip(f"no baseline: pass {_BASELINE_OPT}=PATH to run precision checks")
    path = Path(value)
    if not path.exists():
        pytest.fail(f"{_BASELINE_OPT}={value}: no such file or directory", pytrace=False)
    return path


@pytest.fixture
def assert_matches_baseline(
    request: pytest.FixtureRequest, precision_baseline: Path
) -> Callable[..., VerifyReport]:
    """A callable ``check(candidate, *, metrics=None, rtol=..., atol=...)`` against the baseline.

    Tolerances default to ``--rollout-mock-rtol``/``--rollout-mock-atol``.
    """
    default_rtol = float(request.config.getoption("--rollout-mock-rtol"))
    default_atol = float(request.config.getoption("--rollout-mock-atol"))

    def check(
        candidate: MetricsTable | str | Path,
        *,
        metrics: Sequence[str] | None = None,
        rtol: float | Mapping[str, float] | None = None,
        atol: float | Mapping[str, float] | None = None,
    ) -> VerifyReport:
        __tracebackhide__ = True
        return assert_metrics_match(
            precision_baseline,
            candidate,
            metrics=metrics,
            rtol=default_rtol if rtol is None else rtol,
            atol=default_atol if atol is None else atol,
        )

    return check


"""Comparing runs and reading dumps: metrics, ``verify``, ``diff``, readable traces, plots,
and the pytest plugin that turns them into a precision-regression job.

* :mod:`~rollout_mock.compare.metrics` — metric values, :class:`MetricsTable`, :func:`read_metrics`,
  :func:`identical` / :func:`within_tolerance`;
* :mod:`~rollout_mock.compare.expected` — :class:`MetricsWriter` and the dump's expected values;
* :mod:`~rollout_mock.compare.verify` — :func:`verify` two runs' metrics;
* :mod:`~rollout_mock.compare.diff` — :func:`diff_dumps`, over the structural comparison engine
  (:func:`compare_batches`, :mod:`rollout_mock.codec.structure`: below wrap/, check mode uses it too);
* :mod:`~rollout_mock.compare.traces` — :func:`batch_traces`.

Names are imported lazily (PEP 562): the pytest plugin loads this package in every pytest run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "DEFAULT_METRICS_FILE": "metrics", "MetricsTable": "metrics", "decode_value": "metrics",
    "encode_value": "metrics", "identical": "metrics", "read_metrics": "metrics",
    "resolve_metrics_path": "metrics", "within_tolerance": "metrics",
    "ExpectedMetrics": "expected", "MetricsWriter": "expected", "attach_expected": "expected",
    "read_expected": "expected",
    "MetricComparison": "verify", "VerifyReport": "verify", "format_report": "verify", "verify": "verify",
    "KeyDiff": "diff", "compare_batches": "diff",
    "DiffReport": "diff", "StepDiff": "diff", "StreamDiff": "diff", "diff_dumps": "diff", "format_diff": "diff",
    "parse_steps": "diff",
    "Trace": "traces", "batch_traces": "traces", "count_traces": "traces", "format_traces": "traces",
    "traces_to_jsonl": "traces",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from rollout_mock.codec.structure import KeyDiff, compare_batches
    from rollout_mock.compare.diff import DiffReport, StepDiff, StreamDiff, diff_dumps, format_diff, parse_steps
    from rollout_mock.compare.expected import ExpectedMetrics, MetricsWriter, attach_expected, read_expected
    from rollout_mock.compare.metrics import (
        DEFAULT_METRICS_FILE,
        MetricsTable,
        decode_value,
        encode_value,
        identical,
        read_metrics,
        resolve_metrics_path,
        within_tolerance,
    )
    from rollout_mock.compare.traces import Trace, batch_traces, count_traces, format_traces, traces_to_jsonl
    from rollout_mock.compare.verify import MetricComparison, VerifyReport, format_report, verify


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout_mock.compare' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rollout_mock.compare.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

"""Debugging tools for recorded rollouts.

* :func:`logprob_consistency` — recompute the recorded responses' log-probs with a training-side
  model and compare them with the log-probs the rollout engine recorded (``rollout-mock logprobs``).
* :func:`cut_dump` — a minimal, self-contained repro dump of chosen steps and rows
  (``rollout-mock cut``).
* :func:`write_report` — one self-contained HTML file with per-step plots and a sample browser
  (``rollout-mock report``).
* :class:`StallWatchdog` — stacks of every thread and pending asyncio task when a call stalls
  (config ``watchdog:``).
* :class:`ExpectedMetrics` — dump mode records the training metrics next to the batches, mock
  mode compares them as they are logged (config ``verdict:``; ``MetricsWriter(path, expected=...)``).

Names are imported lazily: importing this package (as the configuration does) costs nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "logprob_consistency": "rollout_mock.debug.logprobs",
    "LogprobReport": "rollout_mock.debug.logprobs",
    "LogprobKeys": "rollout_mock.debug.sequences",
    "cut_dump": "rollout_mock.debug.cut",
    "CutResult": "rollout_mock.debug.cut",
    "select_rows": "rollout_mock.debug.cut",
    "redact_batch": "rollout_mock.debug.redact",
    "write_report": "rollout_mock.debug.report",
    "StallWatchdog": "rollout_mock.wrap.watchdog",
    "format_stacks": "rollout_mock.wrap.watchdog",
    "ExpectedMetrics": "rollout_mock.compare.expected",
    "VerdictConfig": "rollout_mock.config.model",
    "WatchdogConfig": "rollout_mock.config.model",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from rollout_mock.compare.expected import ExpectedMetrics
    from rollout_mock.config.model import VerdictConfig, WatchdogConfig
    from rollout_mock.debug.cut import CutResult, cut_dump, select_rows
    from rollout_mock.debug.logprobs import LogprobReport, logprob_consistency
    from rollout_mock.debug.redact import redact_batch
    from rollout_mock.debug.report import write_report
    from rollout_mock.debug.sequences import LogprobKeys
    from rollout_mock.wrap.watchdog import StallWatchdog, format_stacks


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout_mock.debug' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

"""Human-readable traces of a recorded rollout batch: who said what, with which reward."""

from rollout_mock.compare.traces.build import batch_columns, batch_traces, count_traces
from rollout_mock.compare.traces.model import DEFAULT_MAX_TRACES, Trace
from rollout_mock.compare.traces.render import format_traces, traces_to_jsonl

__all__ = [
    "DEFAULT_MAX_TRACES", "Trace", "batch_columns", "batch_traces", "count_traces", "format_traces",
    "traces_to_jsonl",
]

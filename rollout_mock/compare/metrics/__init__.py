"""Training metrics: values, a table, a crash-safe JSONL writer, and readers (JSONL, CSV,
TensorBoard)."""

from rollout_mock.compare.metrics.readers import read_metrics, resolve_metrics_path
from rollout_mock.compare.metrics.table import MetricsTable
from rollout_mock.compare.metrics.values import (
    DEFAULT_METRICS_FILE,
    MAX_EXACT_INT,
    decode_value,
    encode_value,
)
from rollout_mock.compare.metrics.writer import MetricsWriter

__all__ = [
    "DEFAULT_METRICS_FILE", "MAX_EXACT_INT", "MetricsTable", "MetricsWriter", "decode_value",
    "encode_value", "read_metrics", "resolve_metrics_path",
]

"""Moved to :mod:`rollout_mock.compare.metrics.expected` (expected values are metrics); this
name stays importable."""

from rollout_mock.compare.metrics.expected import (
    EXPECTED_DIR,
    ExpectedMetrics,
    attach_expected,
    describe_expected,
    expected_path,
    expected_relpath,
    read_expected,
)

__all__ = [
    "EXPECTED_DIR", "ExpectedMetrics", "attach_expected", "describe_expected", "expected_path", "expected_relpath",
    "read_expected",
]

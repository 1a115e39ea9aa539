"""``rollout-mock diff``: comparing two dumps step by step and key by key."""

from rollout_mock.compare.diff.batches import compare_batches
from rollout_mock.compare.diff.report import (
    DiffReport,
    KeyDiff,
    StepDiff,
    StreamDiff,
    format_diff,
)
from rollout_mock.compare.diff.walk import diff_dumps, parse_steps

__all__ = [
    "DiffReport", "KeyDiff", "StepDiff", "StreamDiff", "compare_batches", "diff_dumps",
    "format_diff", "parse_steps",
]

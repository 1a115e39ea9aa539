"""Keeping a deterministic fraction of a batch's rows (``subsample:``, slime's
``--load-debug-rollout-data-subsample``).

Of ``n`` rows, ``k = max(1, int(n * fraction))`` are kept: the first ``k // 2`` and the last
``k - k // 2`` (slime's rule), in order. What a row is, for each batch type, is
:mod:`rollout_mock.batch`'s answer (samples of a DataProto, of a TensorDict or of a dict of
columns, items of a list, samples of a recorded slime rollout...).
"""

from __future__ import annotations

from typing import Any

from rollout_mock.batch import batch_type_of

__all__ = ["keep_rows", "subsample_batch"]


def keep_rows(n: int, fraction: float) -> list[int]:
    """Indices kept out of ``n`` rows (see the module docstring)."""
    if n <= 0:
        return []
    k = min(n, max(1, int(n * fraction)))
    head = k // 2
    return list(range(head)) + list(range(n - (k - head), n))


def subsample_batch(batch: Any, fraction: float) -> Any:
    """``batch`` with only the kept rows; a type without rows (or with none) is returned unchanged."""
    batch_type = batch_type_of(batch)
    if batch_type is None:
        return batch
    n = batch_type.rows(batch)
    if not n:
        return batch
    return batch_type.take(batch, keep_rows(n, fraction))

"""Keeping a deterministic fraction of a batch's rows (``subsample:``, slime's
``--load-debug-rollout-data-subsample``).

Of ``n`` rows, ``k = max(1, int(n * fraction))`` are kept: the first ``k // 2`` and the last
``k - k // 2`` (slime's rule), in order. Rows are samples of a DataProto (ROLL's, read through its
private storage so its BatchProxy is never iterated; verl's), of a TensorDict, of a dict of
tensors/arrays sharing a first dimension, items of a list (AReaL trajectories, slime samples),
or groups of a recorded slime rollout.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["keep_rows", "subsample_batch"]


def keep_rows(n: int, fraction: float) -> list[int]:
    """Indices kept out of ``n`` rows (see the module docstring)."""
    if n <= 0:
        return []
    k = min(n, max(1, int(n * fraction)))
    head = k // 2
    return list(range(head)) + list(range(n - (k - head), n))


def _index(value: Any, rows: list[int]) -> Any:
    if isinstance(value, torch.Tensor):
        return value[torch.as_tensor(rows, dtype=torch.long)]
    if isinstance(value, np.ndarray):
        return value[np.asarray(rows, dtype=np.int64)]
    if hasattr(value, "batch_size") and hasattr(value, "keys"):  # TensorDict
        return value[torch.as_tensor(rows, dtype=torch.long)]
    if isinstance(value, list):
        return [value[i] for i in rows]
    return value


def _rows_of(batch: Any) -> int | None:
    from rollout_mock.batch import count_samples

    return count_samples(batch)


def subsample_batch(batch: Any, fraction: float) -> Any:
    """``batch`` with only the kept rows; unknown types are returned unchanged."""
    if batch is None:
        return None
    if isinstance(batch, Mapping) and batch.get("format") == "rollout_mock.slime":
        out = dict(batch)
        if isinstance(out.get("samples"), list):
            out["samples"] = _index(out["samples"], keep_rows(len(out["samples"]), fraction))
        return out
    if isinstance(batch, list):
        return _index(batch, keep_rows(len(batch), fraction))
    n = _rows_of(batch)
    if not n:
        return batch
    rows = keep_rows(n, fraction)
    if hasattr(batch, "_non_tensor_batch") and hasattr(batch, "meta_info"):  # ROLL's DataProto
        out = copy.copy(batch)
        out.__dict__.update(batch.__dict__)
        if getattr(batch, "_batch", None) is not None:
            out._batch = _index(batch._batch, rows)
        out._non_tensor_batch = {k: _index(v, rows) for k, v in batch._non_tensor_batch.items()}
        out.meta_info = dict(batch.meta_info)
        return out
    if all(hasattr(batch, a) for a in ("batch", "non_tensor_batch", "meta_info")):  # verl-like
        out = copy.copy(batch)
        if batch.batch is not None:
            out.batch = _index(batch.batch, rows)
        out.non_tensor_batch = {k: _index(v, rows) for k, v in dict(batch.non_tensor_batch).items()}
        out.meta_info = dict(batch.meta_info)
        return out
    if isinstance(batch, Mapping):
        return {k: _index(v, rows) if _first_dim(v) == n else v for k, v in batch.items()}
    if hasattr(batch, "batch_size") and hasattr(batch, "keys"):
        return _index(batch, rows)
    return batch


def _first_dim(value: Any) -> int | None:
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim:
        return int(value.shape[0])
    return None

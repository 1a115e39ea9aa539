"""Selecting rows (samples) and keys of a recorded batch, keeping its type.

Works on verl's and ROLL's ``DataProto`` (their own ``select_idxs``), other DataProto-like
objects (``batch`` / ``non_tensor_batch`` / ``meta_info`` attributes, e.g. the demo's batch),
``TensorDict``, dicts of tensors/arrays/lists, AReaL's list of trajectories (list items are the
rows; ``None`` items count), and slime's ``{"samples": [...]}`` dumps.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rollout_mock.batch import count_samples, is_dataproto, is_tensordict, type_name
from rollout_mock.errors import DebugInputError

__all__ = ["row_count", "select_keys", "select_rows"]


def row_count(batch: Any) -> int:
    """Rows of a batch (list items for lists, samples for slime dumps)."""
    if isinstance(batch, Mapping) and isinstance(batch.get("samples"), list):
        return len(batch["samples"])
    n = count_samples(batch)
    if n is None:
        raise DebugInputError(f"cannot tell how many rows a {type_name(batch)} has")
    return n


def _take(value: Any, index: list[int], n: int) -> Any:
    """Rows ``index`` of one column whose first dimension is ``n``; other values unchanged."""
    if isinstance(value, torch.Tensor | np.ndarray) and value.ndim >= 1 and value.shape[0] == n:
        return value[torch.tensor(index, dtype=torch.long) if isinstance(value, torch.Tensor) else np.asarray(index, dtype=np.int64)]
    if isinstance(value, list) and len(value) == n:
        return [value[i] for i in index]
    return value


def _is_td(value: Any) -> bool:
    """A TensorDict (recent tensordict versions register it as a ``Mapping``: test by shape)."""
    return is_tensordict(value) or (isinstance(value, Mapping) and type(value) is not dict
                                    and hasattr(value, "batch_size") and callable(getattr(value, "select", None)))


def _take_mapping(mapping: Mapping[str, Any], index: list[int], n: int) -> dict[str, Any]:
    return {k: _take(v, index, n) for k, v in mapping.items()}


def select_rows(batch: Any, index: Sequence[int]) -> Any:
    """A new batch of the same type holding rows ``index`` (in that order); the input is not changed."""
    n = row_count(batch)
    index = [int(i) for i in index]
    bad = [i for i in index if not 0 <= i < n]
    if bad:
        raise DebugInputError(f"rows {bad} out of range: the batch has {n} rows (0-{n - 1})")
    if isinstance(batch, list):
        return [copy.copy(batch[i]) for i in index]
    if isinstance(batch, Mapping) and isinstance(batch.get("samples"), list):
        return {**batch, "samples": [batch["samples"][i] for i in index]}
    if is_dataproto(batch):
        select = getattr(batch, "select_idxs", None)
        if callable(select):  # verl and ROLL: their own implementation keeps every invariant
            return select(np.asarray(index, dtype=np.int64))
        new = copy.copy(batch)
        inner = batch.batch
        if _is_td(inner):  # stays a TensorDict (a stand-in of a verl DataProto, in `cut`)
            new.batch = inner[torch.tensor(index, dtype=torch.long)]
        elif inner is not None:
            new.batch = _take_mapping(inner, index, n)
        new.non_tensor_batch = _take_mapping(batch.non_tensor_batch or {}, index, n)
        new.meta_info = copy.copy(batch.meta_info)
        return new
    if is_tensordict(batch) and not isinstance(batch, Mapping):
        return batch[torch.tensor(index, dtype=torch.long)]
    if isinstance(batch, Mapping):
        return type(batch)(_take_mapping(batch, index, n)) if type(batch) is not dict else _take_mapping(batch, index, n)
    raise DebugInputError(f"cannot select rows of a {type_name(batch)}")


def _keep(mapping: Mapping[str, Any], keys: set[str]) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k in keys}


def select_keys(batch: Any, keys: Sequence[str]) -> Any:
    """Only ``keys`` of the batch's columns (``meta_info`` is kept whole). Unknown keys are an error."""
    wanted = set(keys)
    present: set[str] = set()
    if isinstance(batch, list):
        for item in batch:
            if isinstance(item, Mapping):
                present |= set(item)
        out: Any = [None if item is None else _keep(item, wanted) for item in batch]
    elif isinstance(batch, Mapping) and isinstance(batch.get("samples"), list):
        for sample in batch["samples"]:
            present |= set(sample) if isinstance(sample, Mapping) else set()
        out = {**batch, "samples": [_keep(s, wanted) if isinstance(s, Mapping) else s for s in batch["samples"]]}
    elif is_dataproto(batch):
        state = getattr(batch, "__dict__", {})
        tensors = state.get("_batch", batch.batch) if "_batch" in state else batch.batch
        others = state.get("_non_tensor_batch", {}) if "_non_tensor_batch" in state else batch.non_tensor_batch or {}
        present = set(map(str, tensors.keys())) if tensors is not None else set()
        present |= set(others)
        if callable(getattr(batch, "select", None)) and hasattr(batch, "select_idxs"):  # verl/ROLL DataProto
            out = batch.select(batch_keys=[k for k in wanted if tensors is not None and k in tensors.keys()],
                               non_tensor_batch_keys=[k for k in wanted if k in others], deepcopy=False)
        else:
            out = copy.copy(batch)
            if _is_td(tensors):
                out.batch = tensors.select(*[k for k in tensors.keys() if k in wanted])
            elif tensors is not None:
                out.batch = _keep(tensors, wanted)
            out.non_tensor_batch = _keep(others, wanted)
    elif isinstance(batch, Mapping) or is_tensordict(batch):
        present = set(map(str, batch.keys()))
        if is_tensordict(batch) and not isinstance(batch, Mapping):
            out = batch.select(*[k for k in batch.keys() if k in wanted])
        else:
            out = _keep(batch, wanted)
    else:
        raise DebugInputError(f"cannot select keys of a {type_name(batch)}")
    unknown = sorted(wanted - present)
    if unknown:
        raise DebugInputError(f"--keys: {', '.join(unknown)} not in the batch (keys: {', '.join(sorted(present))})")
    return out

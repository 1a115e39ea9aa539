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

from rollout_mock.batch import count_samples, dataproto_parts, is_dataproto, is_tensordict, take_rows, type_name
from rollout_mock.errors import DebugInputError, RolloutMockError

__all__ = ["KEY_PREFIXES", "column_name", "row_count", "select_keys", "select_rows"]

#: The prefixes :func:`rollout_mock.batch.describe_keys` (the manifest, ``rollout-mock ls --keys``)
#: puts before a DataProto's columns and a list's items' keys.
KEY_PREFIXES = ("batch.", "non_tensor_batch.", "[*].")


def column_name(key: str) -> str:
    """The column a key names, in either syntax: ``batch.rewards`` (as ``ls --keys`` prints it)
    and ``rewards`` are the same key, and so are ``[*].rewards`` and ``rewards`` for a list."""
    for prefix in KEY_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            return key[len(prefix):]
    return key


def row_count(batch: Any) -> int:
    """Rows of a batch (list items for lists, samples for slime dumps): :mod:`rollout_mock.batch`."""
    if isinstance(batch, dict) and isinstance(batch.get("samples"), list):
        return len(batch["samples"])
    n = count_samples(batch)
    if n is None:
        raise DebugInputError(f"cannot tell how many rows a {type_name(batch)} has")
    return n


def select_rows(batch: Any, index: Sequence[int]) -> Any:
    """A new batch of the same type holding rows ``index`` (in that order); the input is not changed."""
    n = row_count(batch)
    index = [int(i) for i in index]
    bad = [i for i in index if not 0 <= i < n]
    if bad:
        raise DebugInputError(f"rows {bad} out of range: the batch has {n} rows (0-{n - 1})")
    if isinstance(batch, list):
        return [copy.copy(batch[i]) for i in index]
    if isinstance(batch, dict) and isinstance(batch.get("samples"), list):
        return {**batch, "samples": [batch["samples"][i] for i in index]}
    try:
        return take_rows(batch, index)
    except RolloutMockError as exc:
        raise DebugInputError(str(exc)) from exc


def _keep(mapping: Mapping[str, Any], keys: set[str]) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k in keys}


def select_keys(batch: Any, keys: Sequence[str]) -> Any:
    """Only ``keys`` of the batch's columns (``meta_info`` is kept whole); a key may be given as
    ``ls --keys`` prints it (``batch.rewards``) or bare (``rewards``). Unknown keys are an error."""
    wanted = set(keys) | {column_name(k) for k in keys}
    present: set[str] = set()
    if isinstance(batch, list):
        for item in batch:
            if isinstance(item, Mapping):
                present |= set(item)
        out: Any = [None if item is None else _keep(item, wanted) for item in batch]
    elif isinstance(batch, dict) and isinstance(batch.get("samples"), list):
        for sample in batch["samples"]:
            present |= set(sample) if isinstance(sample, Mapping) else set()
        out = {**batch, "samples": [_keep(s, wanted) if isinstance(s, Mapping) else s for s in batch["samples"]]}
    elif is_dataproto(batch):
        tensors, others, _ = dataproto_parts(batch)
        present = set(map(str, tensors.keys())) if tensors is not None else set()
        present |= set(others)
        if callable(getattr(batch, "select", None)) and hasattr(batch, "select_idxs"):  # verl/ROLL DataProto
            out = batch.select(batch_keys=[k for k in wanted if tensors is not None and k in tensors.keys()],
                               non_tensor_batch_keys=[k for k in wanted if k in others], deepcopy=False)
        else:
            out = copy.copy(batch)
            if is_tensordict(tensors):
                out.batch = tensors.select(*[k for k in tensors.keys() if k in wanted])
            elif tensors is not None:
                out.batch = _keep(tensors, wanted)
            out.non_tensor_batch = _keep(others, wanted)
    elif isinstance(batch, Mapping) or is_tensordict(batch):
        present = set(map(str, batch.keys()))
        if is_tensordict(batch):
            out = batch.select(*[k for k in batch.keys() if k in wanted])
        else:
            out = _keep(batch, wanted)
    else:
        raise DebugInputError(f"cannot select keys of a {type_name(batch)}")
    unknown = sorted(k for k in set(keys) if k not in present and column_name(k) not in present)
    if unknown:
        raise DebugInputError(f"--keys: {', '.join(unknown)} not in the batch (keys: {', '.join(sorted(present))})")
    return out

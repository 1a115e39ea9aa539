"""What a batch looks like: the one home of batch-shape predicates, and manifest summaries.

Predicates (:func:`is_dataproto`, :func:`is_tensordict`, :func:`dataproto_parts`) are shared by
the codec, ``diff``, traces and the manifest summaries; summaries (type, sample count, keys with
shapes and dtypes) are

Computed from the live batch in dump mode, so that listing a dump never unpickles anything.
Understands dicts of tensors, TensorDict, DataProto-like objects (``batch``,
``non_tensor_batch``, ``meta_info``) and AReaL's list of per-trajectory dicts (``None`` =
rejected); anything else is described by its type alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = [
    "count_samples", "dataproto_parts", "describe_keys", "is_dataproto", "is_tensordict",
    "rejected_count", "type_name",
]

_MAX_KEYS = 256


def type_name(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _leaf(value: Any) -> dict[str, Any] | None:
    if isinstance(value, torch.Tensor):
        # a jagged nested tensor's ragged dimension is a SymInt: recorded as null (unknown)
        shape = [d if type(d) is int else None for d in value.shape]
        return {"shape": shape, "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, np.ndarray):
        return {"shape": list(value.shape), "dtype": value.dtype.name}
    return None


def is_tensordict(obj: Any) -> bool:
    """A TensorDict-like object: ``batch_size``, ``keys`` and ``items``, but not a plain mapping."""
    return (
        not isinstance(obj, Mapping | torch.Tensor | np.ndarray | type)
        and hasattr(obj, "batch_size")
        and hasattr(obj, "items")
        and hasattr(obj, "keys")
    )


def is_dataproto(obj: Any) -> bool:
    """A DataProto-like instance (verl's, ROLL's, the demo's): ``batch``, ``non_tensor_batch``,
    ``meta_info`` attributes. Classes themselves are not batches."""
    return not isinstance(obj, type) and all(
        hasattr(obj, attr) for attr in ("batch", "non_tensor_batch", "meta_info")
    )


def dataproto_parts(obj: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(batch, non_tensor_batch as a plain dict, meta_info)`` of a DataProto-like object.

    ``non_tensor_batch`` may be a proxy (ROLL's ``BatchProxy``: ``len``/iteration/``==`` do not
    behave like a dict); it is read through ``keys()`` and ``__getitem__`` only.
    """
    state = getattr(obj, "__dict__", {})
    if "_non_tensor_batch" in state:  # ROLL >= 0.3: batch/non_tensor_batch are BatchProxy properties
        tensors, non_tensor = state.get("_batch"), state["_non_tensor_batch"]
    else:
        tensors, non_tensor = obj.batch, obj.non_tensor_batch
    if non_tensor is None:
        plain: dict[str, Any] = {}
    elif isinstance(non_tensor, dict):
        plain = dict(non_tensor)
    else:
        plain = {key: non_tensor[key] for key in sorted(non_tensor.keys(), key=str)}
    return tensors, plain, dict(obj.meta_info or {})



_PLAIN = frozenset({int, float, str, bool, bytes, list, tuple, type(None)})


def _walk(prefix: str, obj: Any, out: dict[str, dict[str, Any]]) -> None:
    if len(out) >= _MAX_KEYS or type(obj) in _PLAIN:  # scalars and lists hold no described keys
        return
    leaf = _leaf(obj)
    if leaf is not None:
        out[prefix or "<value>"] = leaf
        return
    if is_tensordict(obj):
        items = obj.items()
    elif isinstance(obj, Mapping):
        items = obj.items()
    elif callable(getattr(type(obj), "keys", None)) and callable(getattr(type(obj), "__getitem__", None)):
        items = [(key, obj[key]) for key in sorted(obj.keys(), key=str)]  # mapping-like (BatchProxy)
    else:
        return
    for key, value in items:
        _walk(f"{prefix}.{key}" if prefix else str(key), value, out)


def describe_keys(batch: Any) -> dict[str, dict[str, Any]]:
    """Flat ``{dotted.key: {"shape": [...], "dtype": "..."}}`` of the batch's arrays."""
    out: dict[str, dict[str, Any]] = {}
    if is_dataproto(batch):
        tensors, non_tensor, _ = dataproto_parts(batch)
        if tensors is not None:
            _walk("batch", tensors, out)
        _walk("non_tensor_batch", non_tensor, out)
    elif isinstance(batch, list):
        items = [item for item in batch if item is not None]
        merged: dict[str, dict[str, Any]] = {}
        for item in items:
            keys: dict[str, dict[str, Any]] = {}
            _walk("[*]", item, keys)
            for key, leaf in keys.items():
                known = merged.setdefault(key, dict(leaf))
                if known.get("shape") != leaf["shape"]:
                    known["shape"] = None  # varies between items
        out = merged
    else:
        _walk("", batch, out)
    return out


def count_samples(batch: Any) -> int | None:
    """Samples in the batch: the batch dimension, or trajectories in a list (incl. rejected)."""
    if is_dataproto(batch):
        try:
            return len(batch)
        except TypeError:
            pass
        for value in dataproto_parts(batch)[1].values():
            return len(value)
        return None
    if isinstance(batch, list):
        return len(batch)
    if is_tensordict(batch) and not isinstance(batch, Mapping):
        size = tuple(batch.batch_size)
        return int(size[0]) if size else None
    if isinstance(batch, torch.Tensor | np.ndarray):
        return int(batch.shape[0]) if batch.ndim else None
    if isinstance(batch, Mapping):
        for value in batch.values():
            if isinstance(value, torch.Tensor | np.ndarray) and value.ndim:
                return int(value.shape[0])
    return None


def rejected_count(batch: Any) -> int:
    return sum(item is None for item in batch) if isinstance(batch, list) else 0

"""Summaries of batches for the manifest: type, sample count, keys with shapes and dtypes.

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

_MAX_KEYS = 256


def type_name(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _leaf(value: Any) -> dict[str, Any] | None:
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, np.ndarray):
        return {"shape": list(value.shape), "dtype": value.dtype.name}
    return None


def _is_tensordict(obj: Any) -> bool:
    return hasattr(obj, "batch_size") and hasattr(obj, "items") and hasattr(obj, "keys")


def _is_dataproto(obj: Any) -> bool:
    return all(hasattr(obj, attr) for attr in ("batch", "non_tensor_batch", "meta_info"))


def _parts(batch: Any) -> tuple[Any, Any]:
    """A DataProto's tensor and non-tensor storage. ROLL's ``batch``/``non_tensor_batch`` are
    properties returning a new BatchProxy (no ``len``/``iter``/``values``): read ``_batch`` and
    ``_non_tensor_batch`` when the object has them."""
    state = getattr(batch, "__dict__", {})
    if "_non_tensor_batch" in state:
        return state.get("_batch"), state["_non_tensor_batch"]
    return batch.batch, batch.non_tensor_batch


def _walk(prefix: str, obj: Any, out: dict[str, dict[str, Any]]) -> None:
    if len(out) >= _MAX_KEYS:
        return
    leaf = _leaf(obj)
    if leaf is not None:
        out[prefix or "<value>"] = leaf
        return
    if _is_tensordict(obj) and not isinstance(obj, Mapping):
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
    if _is_dataproto(batch):
        tensors, non_tensors = _parts(batch)
        if tensors is not None:
            _walk("batch", tensors, out)
        if non_tensors is not None:
            _walk("non_tensor_batch", non_tensors, out)
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
    if _is_dataproto(batch):
        try:
            return len(batch)
        except TypeError:
            pass
        non_tensor = _parts(batch)[1] or {}
        if isinstance(non_tensor, Mapping):
            for value in non_tensor.values():
                return len(value)
        return None
    if isinstance(batch, list):
        return len(batch)
    if _is_tensordict(batch) and not isinstance(batch, Mapping):
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

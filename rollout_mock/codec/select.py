"""Keys and rows of an already decoded batch (format-1 files, which cannot be read partially).

Same semantics as partial format-2 loads: ``keys`` filters the tensor and non-tensor keys of a
DataProto-like batch (``meta_info`` is always kept), the keys of a dict or TensorDict, or the
keys of each dict in a list of trajectories; ``rows`` slices the first dimension of every tensor,
array and TensorDict in those places, and the items of a list.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rollout_mock.codec.batches import build_batch, class_path, split_batch

__all__ = ["keys_of", "select"]


def _is_td(obj: Any) -> bool:
    return type(obj).__module__ == "tensordict._td" and type(obj).__qualname__ == "TensorDict"


def _rows(value: Any, rows: slice | None) -> Any:
    if rows is None:
        return value
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim:
        return value[rows]
    if _is_td(value) and len(value.batch_size):
        return value[rows]
    if isinstance(value, list):
        return value[rows]
    if isinstance(value, dict):
        return {k: _rows(v, rows) for k, v in value.items()}
    return value


def _mapping(value: Any, keys: frozenset[str] | None, rows: slice | None) -> Any:
    if value is None:
        return None
    if _is_td(value):
        if keys is not None:
            value = value.select(*[k for k in value.keys() if k in keys])
        return _rows(value, rows)
    return {k: _rows(v, rows) for k, v in value.items() if keys is None or k in keys}


def keys_of(obj: Any) -> list[str]:
    parts = split_batch(obj)
    if parts is not None and parts[0] == "dataproto":
        keys: list[str] = []
        for name in ("batch", "non_tensor_batch"):
            field = parts[2][name]
            if field is not None:
                keys += [k for k in field.keys() if k not in keys]
        return keys
    if isinstance(obj, dict) or _is_td(obj):
        return [str(k) for k in obj.keys()]
    if isinstance(obj, list):
        keys = []
        for item in obj:
            if isinstance(item, dict):
                keys += [k for k in item if k not in keys]
        return keys
    return []


def select(obj: Any, keys: frozenset[str] | None, rows: slice | None) -> Any:
    if keys is None and rows is None:
        return obj
    parts = split_batch(obj)
    if parts is not None and parts[0] == "dataproto":
        _, layout, fields, extra = parts
        fields = {
            "batch": _mapping(fields["batch"], keys, rows),
            "non_tensor_batch": _mapping(fields["non_tensor_batch"], keys, rows),
            "meta_info": fields["meta_info"],
        }
        return build_batch("dataproto", class_path(type(obj)), layout, fields, extra, batch_class=type(obj))
    if _is_td(obj) or isinstance(obj, dict):
        return _mapping(obj, keys, rows)
    if isinstance(obj, list):
        items = obj if rows is None else obj[rows]
        return [select(x, keys, None) if isinstance(x, dict) else x for x in items]
    return _rows(obj, rows)

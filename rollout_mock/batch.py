"""The batch model: what a batch is, for every type rollout_mock records — the one home of it.

A batch has rows (samples along its first dimension), keys (its named columns) and a type that
must survive a round trip. This module answers, for every supported type: is it a DataProto,
how many rows has it (:func:`count_samples`), which keys (:func:`describe_keys`), which rows
were rejected (``None`` items, :func:`rejected_count`), a new batch of some rows
(:func:`take_rows`) and one batch of several (:func:`concat`). Every other module asks here.

Supported, in the order they are recognised (:func:`batch_type_of`):

* DataProto-like objects — verl's, ROLL's (``_batch``/``_non_tensor_batch`` behind
  ``BatchProxy`` properties), the demo's: recognised from the instance ``__dict__`` alone
  (:func:`dataproto_fields`), so that detection never runs a property or ``__getattr__`` of a
  possibly hostile object; their own ``select_idxs``/``concat`` are used when they have them;
* a recorded slime rollout (``{"format": "rollout_mock.slime", "samples": [...]}``): rows are
  samples;
* lists (AReaL's trajectories, slime's samples; ``None`` = a rejected item, still a row) and
  tuples (each element that has the same rows is cut alike);
* TensorDict-like objects (``batch_size``, ``keys``, ``items``);
* tensors (strided and jagged nested tensors included: their first dimension is the row count)
  and numpy arrays;
* mappings of columns sharing a first dimension (other values are per-batch metadata, kept).

Framework adapters add their own types with :func:`register_batch_type` (checked before the
built-in ones); a :class:`BatchType` says how to recognise, count, cut and join its batches.

Manifest summaries (type, sample count, keys with shapes and dtypes) are computed from the live
batch in dump mode, so that listing a dump never unpickles anything.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from rollout_mock.errors import RolloutMockError

__all__ = [
    "BatchType", "batch_type_of", "concat", "count_samples", "dataproto_fields", "dataproto_parts",
    "describe_keys", "is_dataproto", "is_tensordict", "leading_dim", "register_batch_type",
    "rejected_count", "take_rows", "type_name",
]

_MAX_KEYS = 256
_DATAPROTO_LAYOUTS = (
    ("public", ("batch", "non_tensor_batch", "meta_info")),
    ("private", ("_batch", "_non_tensor_batch", "meta_info")),  # ROLL >= 0.3
)
SLIME_FORMAT = "rollout_mock.slime"


def type_name(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def leading_dim(value: Any) -> int | None:
    """The first dimension of a tensor or array (``None`` for scalars and other values).

    Nested tensors have no ``shape`` in the strided layout ("NestedTensorImpl doesn't support
    sizes"); their first dimension (the number of components) is ``size(0)`` in both layouts.
    """
    if isinstance(value, torch.Tensor):
        return int(value.size(0)) if value.dim() else None
    if isinstance(value, np.ndarray):
        return int(value.shape[0]) if value.ndim else None
    return None


def _shape(value: torch.Tensor) -> list[int | None]:
    """A tensor's shape; ragged dimensions of a nested tensor (strided or jagged) are ``None``."""
    if not value.is_nested:
        return [int(d) for d in value.shape]
    out: list[int | None] = []
    for dim in range(value.dim()):
        try:
            size = value.size(dim)
        except RuntimeError:  # a ragged dimension of a strided nested tensor
            size = None
        out.append(size if type(size) is int else None)  # jagged: a SymInt
    return out


def _leaf(value: Any) -> dict[str, Any] | None:
    if isinstance(value, torch.Tensor):
        return {"shape": _shape(value), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, np.ndarray):
        return {"shape": list(value.shape), "dtype": value.dtype.name}
    return None


def is_tensordict(obj: Any) -> bool:
    """A TensorDict-like object: tensordict's own classes (recent tensordict registers them as
    ``Mapping``s), or ``batch_size``, ``keys`` and ``items`` on something that is not a mapping."""
    if isinstance(obj, dict | torch.Tensor | np.ndarray | type):
        return False
    if any(c.__name__ == "TensorDictBase" and c.__module__.startswith("tensordict") for c in type(obj).__mro__):
        return True
    return (
        not isinstance(obj, Mapping)
        and hasattr(obj, "batch_size")
        and hasattr(obj, "items")
        and hasattr(obj, "keys")
    )


def dataproto_fields(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """``(layout, instance state)`` of a DataProto-like object, read from its ``__dict__`` only
    (no property, ``__getattr__`` or method of ``obj`` runs): ``layout`` is ``"public"``
    (``batch``, ``non_tensor_batch``, ``meta_info``) or ``"private"`` (ROLL >= 0.3:
    ``_batch``, ``_non_tensor_batch``, ``meta_info``). ``meta_info`` must be a dict and
    ``non_tensor_batch`` ``None`` or mapping-like. ``None`` for anything else."""
    if isinstance(obj, type) or type(obj).__module__ == "builtins":
        return None
    try:
        state = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    if not isinstance(state, dict):
        return None
    for layout, names in _DATAPROTO_LAYOUTS:
        if all(name in state for name in names) and isinstance(state[names[2]], dict):
            non_tensor = state[names[1]]
            if non_tensor is None or (hasattr(non_tensor, "keys") and hasattr(non_tensor, "__getitem__")):
                return layout, state
    return None


def is_dataproto(obj: Any) -> bool:
    """A DataProto-like instance (verl's, ROLL's, the demo's; see :func:`dataproto_fields`).
    Classes themselves are not batches."""
    return dataproto_fields(obj) is not None


def dataproto_parts(obj: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(batch, non_tensor_batch as a plain dict, meta_info)`` of a DataProto-like object.

    ``non_tensor_batch`` may be a proxy (ROLL's ``BatchProxy``: ``len``/iteration/``==`` do not
    behave like a dict); it is read through ``keys()`` and ``__getitem__`` only.
    """
    found = dataproto_fields(obj)
    if found is None:
        raise RolloutMockError(f"not a DataProto-like batch: {type_name(obj)}")
    layout, state = found
    prefix = "_" if layout == "private" else ""
    tensors, non_tensor = state[f"{prefix}batch"], state[f"{prefix}non_tensor_batch"]
    if non_tensor is None:
        plain: dict[str, Any] = {}
    elif isinstance(non_tensor, dict):
        plain = dict(non_tensor)
    else:
        plain = {key: non_tensor[key] for key in sorted(non_tensor.keys(), key=str)}
    return tensors, plain, dict(state["meta_info"] or {})


# --------------------------------------------------------------------------- batch types
@dataclass(frozen=True)
class BatchType:
    """How one kind of batch is recognised, counted, cut and joined.

    ``rows(batch)``: samples (``None``: no batch dimension); ``take(batch, index)``: a new
    batch of the same type with rows ``index`` in that order (the input is not changed);
    ``concat(batches)``: one batch of several of this type, rows in order (``None``: not
    supported, :func:`concat` then says so).
    """

    name: str
    matches: Callable[[Any], bool]
    rows: Callable[[Any], int | None]
    take: Callable[[Any, list[int]], Any]
    concat: Callable[[list[Any]], Any] | None = None


_REGISTERED: list[BatchType] = []


def register_batch_type(batch_type: BatchType) -> BatchType:
    """Teach the batch model a type (checked before the built-in ones, latest first). Adapters
    call it at import; registering a type of the same ``name`` again replaces it."""
    _REGISTERED[:] = [t for t in _REGISTERED if t.name != batch_type.name]
    _REGISTERED.insert(0, batch_type)
    return batch_type


def _index_column(value: Any, index: list[int], n: int) -> Any:
    """Rows ``index`` of one column whose first dimension is ``n``; other values unchanged."""
    if isinstance(value, torch.Tensor) and leading_dim(value) == n:
        if value.is_nested:  # neither layout supports fancy indexing: rebuild from components
            parts = [value[i] for i in index]
            return torch.nested.nested_tensor(parts, layout=value.layout) if parts else value[:0]
        return value[torch.as_tensor(index, dtype=torch.long)]
    if isinstance(value, np.ndarray) and leading_dim(value) == n:
        return value[np.asarray(index, dtype=np.int64)]
    if is_tensordict(value) and _td_rows(value) == n:
        return value[torch.as_tensor(index, dtype=torch.long)]
    if isinstance(value, list) and len(value) == n:
        return [value[i] for i in index]
    return value


def _concat_columns(values: list[Any], key: str) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor):
        if first.is_nested:
            return torch.nested.nested_tensor([c for v in values for c in v.unbind()], layout=first.layout)
        return torch.cat(values)
    if isinstance(first, np.ndarray):
        return np.concatenate(values)
    if isinstance(first, list):
        return [item for value in values for item in value]
    if is_tensordict(first):
        return torch.cat(values)
    if all(_same(v, first) for v in values):
        return first  # per-batch metadata, identical in every part
    raise RolloutMockError(f"cannot concatenate key {key!r}: a {type_name(first)} that differs between "
                           f"the parts and has no batch dimension")


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an ambiguous comparison means "not known to be the same"
        return False


def _td_rows(obj: Any) -> int | None:
    size = tuple(obj.batch_size)
    return int(size[0]) if size else None


def _mapping_rows(obj: Mapping[str, Any]) -> int | None:
    for value in obj.values():
        n = leading_dim(value)
        if n is not None:
            return n
    return None


def _dataproto_rows(obj: Any) -> int | None:
    tensors, non_tensor, _ = dataproto_parts(obj)
    if is_tensordict(tensors):
        n = _td_rows(tensors)
        if n is not None:
            return n
    elif isinstance(tensors, Mapping):
        n = _mapping_rows(tensors)
        if n is not None:
            return n
    for value in non_tensor.values():
        return len(value)
    return None


def _dataproto_take(obj: Any, index: list[int]) -> Any:
    select = getattr(type(obj), "select_idxs", None)
    if callable(select):  # verl and ROLL: their own implementation keeps every invariant
        return select(obj, np.asarray(index, dtype=np.int64))
    layout = (dataproto_fields(obj) or ("public", {}))[0]
    prefix = "_" if layout == "private" else ""
    n = _dataproto_rows(obj) or 0
    tensors, non_tensor, meta = dataproto_parts(obj)
    out = copy.copy(obj)
    if is_tensordict(tensors):
        tensors = tensors[torch.as_tensor(index, dtype=torch.long)]
    elif isinstance(tensors, Mapping):
        tensors = {k: _index_column(v, index, n) for k, v in tensors.items()}
    out.__dict__[f"{prefix}batch"] = tensors
    out.__dict__[f"{prefix}non_tensor_batch"] = {k: _index_column(v, index, n) for k, v in non_tensor.items()}
    out.__dict__["meta_info"] = dict(meta)
    return out


def _dataproto_concat(parts: list[Any]) -> Any:
    join = getattr(type(parts[0]), "concat", None)
    if callable(join):
        return join(parts)
    raise RolloutMockError(f"a {type_name(parts[0])} has no concat()")


def _is_slime(obj: Any) -> bool:
    # a plain dict: a TensorDict is a Mapping whose .get() of a missing key may raise
    return isinstance(obj, dict) and obj.get("format") == SLIME_FORMAT and isinstance(obj.get("samples"), list)


def _tuple_rows(obj: tuple[Any, ...]) -> int | None:
    for item in obj:
        n = count_samples(item)
        if n is not None:
            return n
    return None


def _tuple_take(obj: tuple[Any, ...], index: list[int]) -> Any:
    n = _tuple_rows(obj)
    return type(obj)(*(take_rows(x, index) if count_samples(x) == n else x for x in obj)) \
        if hasattr(obj, "_fields") else tuple(take_rows(x, index) if count_samples(x) == n else x for x in obj)


def _mapping_take(obj: Mapping[str, Any], index: list[int]) -> Any:
    n = _mapping_rows(obj)
    out = {k: _index_column(v, index, n) if n is not None else v for k, v in obj.items()}
    return out if type(obj) is dict else cast(Any, type(obj))(out)


def _mapping_concat(parts: list[Any]) -> Any:
    return {key: _concat_columns([p[key] for p in parts], str(key)) for key in parts[0]}


_BUILTIN: tuple[BatchType, ...] = (
    BatchType("dataproto", is_dataproto, _dataproto_rows, _dataproto_take, _dataproto_concat),
    BatchType("slime", _is_slime, lambda b: len(b["samples"]),
              lambda b, i: {**b, "samples": [b["samples"][j] for j in i]},
              lambda ps: {**ps[0], "samples": [s for p in ps for s in p["samples"]]}),
    BatchType("list", lambda b: isinstance(b, list), len, lambda b, i: [b[j] for j in i],
              lambda ps: [item for p in ps for item in p]),
    BatchType("tuple", lambda b: isinstance(b, tuple), _tuple_rows, _tuple_take, None),
    BatchType("tensordict", is_tensordict, _td_rows,
              lambda b, i: b[torch.as_tensor(i, dtype=torch.long)], lambda ps: torch.cat(ps)),
    BatchType("tensor", lambda b: isinstance(b, torch.Tensor | np.ndarray), leading_dim,
              lambda b, i: _index_column(b, i, leading_dim(b) or 0),
              lambda ps: _concat_columns(ps, "<value>")),
    BatchType("mapping", lambda b: isinstance(b, Mapping), _mapping_rows, _mapping_take, _mapping_concat),
)


def batch_type_of(batch: Any) -> BatchType | None:
    """The :class:`BatchType` describing ``batch`` (registered types first), else ``None``."""
    if batch is None:
        return None
    for batch_type in (*_REGISTERED, *_BUILTIN):
        if batch_type.matches(batch):
            return batch_type
    return None


def take_rows(batch: Any, index: Sequence[int]) -> Any:
    """A new batch of the same type holding rows ``index`` (in that order); the input is not
    changed. Raises :class:`~rollout_mock.errors.RolloutMockError` for a type without rows."""
    batch_type = batch_type_of(batch)
    if batch_type is None or batch_type.rows(batch) is None:
        raise RolloutMockError(f"cannot select rows of a {type_name(batch)}: it has no batch dimension")
    return batch_type.take(batch, [int(i) for i in index])


def concat(batches: Sequence[Any]) -> Any:
    """One batch of ``batches`` (all of one type), rows in order. Raises
    :class:`~rollout_mock.errors.RolloutMockError` naming the type when it cannot be joined."""
    parts = list(batches)
    if not parts:
        raise RolloutMockError("cannot concatenate no batches")
    batch_type = batch_type_of(parts[0])
    if batch_type is None or batch_type.concat is None:
        raise RolloutMockError(f"a {type_name(parts[0])} cannot be concatenated")
    return batch_type.concat(parts)


_PLAIN = frozenset({int, float, str, bool, bytes, list, tuple, type(None)})


def _walk(prefix: str, obj: Any, out: dict[str, dict[str, Any]]) -> None:
    if len(out) >= _MAX_KEYS or type(obj) in _PLAIN:  # scalars and lists hold no described keys
        return
    leaf = _leaf(obj)
    if leaf is not None:
        out[prefix or "<value>"] = leaf
        return
    if is_tensordict(obj) or isinstance(obj, Mapping):
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
    """Samples in the batch: the batch dimension, or items of a list (rejected ones included)."""
    if is_dataproto(batch):
        try:
            return len(batch)
        except TypeError:
            pass
    batch_type = batch_type_of(batch)
    return None if batch_type is None else batch_type.rows(batch)


def rejected_count(batch: Any) -> int:
    """Rejected samples: ``None`` items of a list (AReaL's trajectories)."""
    return sum(item is None for item in batch) if isinstance(batch, list) else 0

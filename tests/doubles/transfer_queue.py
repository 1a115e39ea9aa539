"""Test double of TransferQueue's KV interface (Ascend/TransferQueue b75d570, 0.1.10.dev0). Own code.

verl 0.9's V1 trainer imports ``transfer_queue as tq`` and ``from transfer_queue import
KVBatchMeta``; TransferQueue is not installable here, so :func:`install` puts this module in
``sys.modules`` under that name. What it reproduces (facts from ``transfer_queue/interface.py``,
``metadata.py`` and ``storage/managers``):

- ``kv_batch_put(keys, partition_id, fields=None, tags=None)``: at least one of fields/tags;
  ``fields.batch_size[0] == len(keys)``; each key's tag is *updated* with its new tag
  (``custom_meta[i].update(tag)``); the fields are split per sample (a dense tensor row, one
  component of a nested tensor, one item of a ``NonTensorStack``) and merged into the key's
  columns. Returns ``KVBatchMeta(keys, tags=<the keys' full tags>, partition_id, fields=<all
  the keys' field names>)``.
- ``kv_batch_get(keys, partition_id, select_fields=None)``: every field by default; a missing
  key: ``ValueError("keys or partition were not found!")``; a selected field that none of the keys
  has is left out (``BatchMeta.select_fields`` keeps the known ones); one that some keys lack:
  ``ValueError("Some fields are not ready in all the requested keys!")``. Per field, the values
  are packed as the storage managers do: 0-dim tensors stacked densely, other tensors as a jagged
  nested tensor (even when all have one shape), anything else a ``NonTensorStack``.
- ``kv_list(partition_id=None)``: ``{partition: {key: tag}}`` (copies); ``kv_clear(keys,
  partition_id)``: unknown keys are ignored.
- ``async_kv_put`` / ``async_kv_batch_put`` / ``kv_put``: the same on one key or asynchronously.
- ``init``, ``close``, ``save_checkpoint``, ``load_checkpoint``: no-ops / in-memory.

Thread-safe (one lock): verl's agent-loop workers write from other threads while the trainer
reads.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import threading
import types
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

__all__ = ["KVBatchMeta", "install", "kv_batch_get", "kv_batch_put", "kv_clear", "kv_list", "reset"]


@dataclasses.dataclass
class KVBatchMeta:
    keys: list[str] = dataclasses.field(default_factory=list)
    tags: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    partition_id: str | None = None
    fields: list[str] | None = None
    extra_info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.tags):
            raise ValueError(f"keys and tags must have same length, but got {len(self.keys)} and {len(self.tags)}")
        if len(self.keys) != len(set(self.keys)):
            raise ValueError("Got duplicated keys.")
        self.tags = copy.deepcopy(self.tags)
        self.extra_info = copy.deepcopy(self.extra_info) if self.extra_info is not None else {}

    @property
    def size(self) -> int:
        return len(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def reorder(self, indexes: list[int]) -> None:
        if len(indexes) != self.size or len(set(indexes)) != len(indexes):
            raise ValueError(f"bad reorder indexes {indexes} for a batch of {self.size}")
        self.keys = [self.keys[i] for i in indexes]
        self.tags = [self.tags[i] for i in indexes]

    def select_keys(self, keys_to_select: list[str]) -> KVBatchMeta:
        where = {key: i for i, key in enumerate(self.keys)}
        return KVBatchMeta(keys=list(keys_to_select), tags=[self.tags[where[k]] for k in keys_to_select],
                           partition_id=self.partition_id, fields=self.fields, extra_info=self.extra_info)


class _Store:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tags: dict[str, dict[str, dict[str, Any]]] = {}
        self.values: dict[str, dict[str, dict[str, Any]]] = {}


_store = _Store()


def reset() -> None:
    """Forget every partition (a fresh TransferQueue)."""
    global _store
    _store = _Store()


def _rows(fields: TensorDict, count: int) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for name in fields.keys():
        value = fields.get(name)
        if isinstance(value, NonTensorStack):
            out[name] = list(value.tolist())
        elif isinstance(value, NonTensorData):
            out[name] = [value.data] * count
        elif isinstance(value, torch.Tensor) and value.is_nested:
            out[name] = [row.clone() for row in value.unbind(0)]
        elif isinstance(value, torch.Tensor):
            out[name] = [value[i].clone() for i in range(count)]
        else:
            raise TypeError(f"transfer_queue double: unsupported field {name!r} of type {type(value).__name__}")
    return out


def _pack(values: list[Any]) -> Any:
    if all(isinstance(v, torch.Tensor) for v in values):
        if all(v.dim() == 0 for v in values):
            return torch.stack(values)
        return torch.nested.as_nested_tensor(values, layout=torch.jagged)
    return NonTensorStack(*values)


def kv_batch_put(keys: list[str], partition_id: str, fields: TensorDict | None = None,
                 tags: list[dict[str, Any]] | None = None, data_parser: Any = None) -> KVBatchMeta:
    keys = list(keys)
    if fields is None and tags is None:
        raise ValueError("Please provide at least one parameter of fields or tag.")
    if fields is not None and fields.batch_size[0] != len(keys):
        raise ValueError(f"Length of `keys` ({len(keys)}) does not match `fields` batch size ({fields.batch_size[0]}).")
    if tags is not None and len(tags) != len(keys):
        raise ValueError(f"Length of `keys` ({len(keys)}) does not match length of `tags` ({len(tags)}).")
    rows = _rows(fields, len(keys)) if fields is not None else {}
    with _store.lock:
        part_tags = _store.tags.setdefault(partition_id, {})
        part_values = _store.values.setdefault(partition_id, {})
        for i, key in enumerate(keys):
            part_tags.setdefault(key, {})
            part_values.setdefault(key, {})
            if tags is not None:
                part_tags[key].update(copy.deepcopy(tags[i]))
            for name, column in rows.items():
                part_values[key][name] = column[i]
        out_tags = [copy.deepcopy(part_tags[k]) for k in keys]
        names = sorted({name for k in keys for name in part_values[k]})
    return KVBatchMeta(keys=keys, tags=out_tags, partition_id=partition_id, fields=names)


def kv_put(key: str, partition_id: str, fields: Any = None, tag: dict[str, Any] | None = None) -> KVBatchMeta:
    if isinstance(fields, dict):
        fields = TensorDict({k: v.unsqueeze(0) if isinstance(v, torch.Tensor) else NonTensorStack(v)
                             for k, v in fields.items()}, batch_size=[1])
    return kv_batch_put([key], partition_id, fields=fields, tags=[tag] if tag is not None else None)


async def async_kv_put(key: str, partition_id: str, fields: Any = None, tag: dict[str, Any] | None = None) -> KVBatchMeta:
    return kv_put(key, partition_id, fields=fields, tag=tag)


async def async_kv_batch_put(keys: list[str], partition_id: str, fields: TensorDict | None = None,
                             tags: list[dict[str, Any]] | None = None) -> KVBatchMeta:
    return kv_batch_put(keys, partition_id, fields=fields, tags=tags)


def kv_batch_get(keys: list[str] | str, partition_id: str, select_fields: list[str] | str | None = None) -> TensorDict:
    keys = [keys] if isinstance(keys, str) else list(keys)
    with _store.lock:
        part = _store.values.get(partition_id, {})
        if not keys or any(k not in part for k in keys):
            raise ValueError("keys or partition were not found!")
        if select_fields is None:
            names = sorted({name for k in keys for name in part[k]})
        else:
            wanted = [select_fields] if isinstance(select_fields, str) else list(select_fields)
            names = [name for name in wanted if any(name in part[k] for k in keys)]  # unknown: left out
        if any(name not in part[k] for k in keys for name in names):
            raise ValueError("Some fields are not ready in all the requested keys!")
        columns = {name: [part[k][name] for k in keys] for name in names}
    return TensorDict({name: _pack(values) for name, values in columns.items()}, batch_size=[len(keys)])


def kv_list(partition_id: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    with _store.lock:
        parts = [partition_id] if partition_id is not None else list(_store.tags)
        return {p: copy.deepcopy(_store.tags.get(p, {})) for p in parts if p in _store.tags}


def kv_clear(keys: list[str] | str, partition_id: str) -> None:
    keys = [keys] if isinstance(keys, str) else list(keys)
    with _store.lock:
        for key in keys:
            _store.tags.get(partition_id, {}).pop(key, None)
            _store.values.get(partition_id, {}).pop(key, None)


def init(config: Any = None) -> None:
    return None


def close() -> None:
    return None


def get_metrics_endpoint() -> None:
    return None


def install() -> types.ModuleType:
    """This module as ``transfer_queue`` in ``sys.modules`` (returned)."""
    module = sys.modules[__name__]
    sys.modules["transfer_queue"] = module
    return module

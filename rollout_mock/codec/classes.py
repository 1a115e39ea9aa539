"""Framework classes as data: how the codec writes a class and rebuilds it, never by running
a name or code chosen by the file.

DataProto-like batch classes
============================

Recognised by structure on write, rebuilt by our own factory. On write, an object is a
*DataProto-like batch* when its instance ``__dict__`` holds

* ``batch``, ``non_tensor_batch`` and ``meta_info`` (verl's ``DataProto``, ROLL v0.2.x, the
  demo's ``RolloutBatch``), layout ``"public"``; or
* ``_batch``, ``_non_tensor_batch`` and ``meta_info`` (ROLL v0.3+, whose ``batch`` and
  ``non_tensor_batch`` are properties returning a new ``BatchProxy`` on each access), layout
  ``"private"``.

The fields are read from ``__dict__`` (never through properties, ``__getstate__`` or
``__reduce__``); a ``non_tensor_batch`` that is not a plain dict (a proxy) is read with
``keys()`` and ``__getitem__`` only. Classes registered with :func:`register_batch_class` that do
not have this shape are stored by their attribute dict (kind ``"object"``).

On load, :func:`build_batch` returns the writer's class when that runs no file-chosen code: the
recorded ``module:qualname`` is resolved only from :data:`sys.modules` (a module named in a file
is never imported; lookups go through ``__dict__``, so module ``__getattr__`` hooks never run),
the class must be registered or structurally DataProto-like, must use ``object.__new__`` and
have an instance ``__dict__``; the instance is made with ``object.__new__`` and its fields are
written into ``__dict__`` directly (no ``__init__``, ``__setstate__``, ``__setattr__`` or
property setters run). Otherwise the result is a :class:`Batch`, or the caller's
``batch_class``.

Structural classes
==================

numpy string scalars and jagged nested tensors. Each is stored as data (no pickle) and rebuilt
as the same class by rollout_mock's own code; the class is chosen by the node's tag, never by a
name in the file. The tags and keys below need header version
:data:`~rollout_mock.codec.format.CLASS_VERSION` (4): an older reader refuses such a file with
"written by a newer rollout_mock" instead of silently losing the state.

* ``{"$": "npstr", "v": str}`` / ``{"$": "npbytes", "hex": str}``: ``np.str_`` / ``np.bytes_``
  scalars (which are ``str``/``bytes`` subclasses, so the value alone would lose the type);
* ``{"$": "njt", "values": NODE, "offsets": NODE, "lengths": NODE|None, "ragged": int,
  "sym": int, "min": int|None, "max": int|None}``: a jagged nested tensor by its own buffers.
  ``ragged`` is ``_ragged_idx``; ``sym`` the position of the symbolic (ragged) size in
  ``.shape``, which differs from ``ragged`` for tensors whose ``_ragged_idx`` was set after
  construction, as verl's ``nested_tensor_from_tensor_list(..., ragged_idx=2)`` does: both are
  restored, so shape, ragged dimension, offsets, lengths (holes) and values come back equal;
* a class made of parts (a batch class with keyed entries, a wrapper of one value, a stack of
  items) is described by the adapter that registers its batch type
  (:class:`rollout_mock.batch.KeyedCodec`): the codec writes and rebuilds it from that
  description, and its ``class_keys`` need the same header version. ``adapters/frameworks.py``
  describes tensordict's classes this way (tags ``tensordict``, ``nontensor`` and ``tdstack``).

Strides are not kept (a transposed nested tensor comes back contiguous, like dense tensors).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import sys
from typing import Any

import numpy as np
import torch

from rollout_mock.batch import batch_class_names, dataproto_fields, is_batch_class, keyed_codec, register_batch_class
from rollout_mock.codec.format import TORCH_DTYPES
from rollout_mock.errors import ConfigError, UnsafePickleError
from rollout_mock.text import logger

__all__ = [
    "Batch", "batch_class_names", "build_batch", "class_path", "decode_class", "encode_class", "encode_scalar",
    "is_batch_class", "keeps_structure", "register_batch_class", "split_batch",
]

# --------------------------------------------------------------------------- batch classes
_FIELDS = ("batch", "non_tensor_batch", "meta_info")
_PRIVATE = ("_batch", "_non_tensor_batch", "meta_info")
#: Extra instance attributes ROLL keeps next to its private fields (always None in dumps).
_PRIVATE_EXTRA = ("_remote_batch",)


def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class Batch:
    """rollout_mock's own DataProto-like batch, returned when the writer's class is unavailable.

    ``batch`` (a TensorDict, dict of tensors or None), ``non_tensor_batch`` (dict of numpy
    arrays), ``meta_info`` (dict); ``len()`` is the batch size; ``batch_obj[key]`` looks a key up
    in ``batch`` then ``non_tensor_batch``. ``source_class`` names the writer's class.
    """

    def __init__(self, batch: Any = None, non_tensor_batch: dict[str, Any] | None = None,
                 meta_info: dict[str, Any] | None = None, source_class: str | None = None) -> None:
        self.batch = batch
        self.non_tensor_batch = {} if non_tensor_batch is None else non_tensor_batch
        self.meta_info = {} if meta_info is None else meta_info
        self.source_class = source_class

    def __len__(self) -> int:
        if self.batch is not None:
            size = getattr(self.batch, "batch_size", None)
            if size is not None and len(size):
                return int(size[0])
            for value in self.batch.values():
                return int(len(value))
        for value in self.non_tensor_batch.values():
            return int(len(value))
        return 0

    def __getitem__(self, key: str) -> Any:
        if self.batch is not None and key in self.batch.keys():
            return self.batch[key]
        if key in self.non_tensor_batch:
            return self.non_tensor_batch[key]
        raise KeyError(key)

    def keys(self) -> list[str]:
        keys = [] if self.batch is None else list(self.batch.keys())
        return keys + [k for k in self.non_tensor_batch if k not in keys]

    def __repr__(self) -> str:
        return (f"Batch(len={len(self)}, keys={self.keys()}, meta_info={sorted(map(str, self.meta_info))}, "
                f"source_class={self.source_class!r})")


Batch.__module__ = "rollout_mock.codec"  # its public home: what files record when it is written
register_batch_class(Batch)  # the batch model's registry is the one registry (rollout_mock.batch)


# batch classes: write side
def _plain_items(mapping: Any) -> dict[str, Any]:
    """A dict of a mapping or mapping-like proxy, using only ``keys()`` and ``__getitem__``."""
    if type(mapping) is dict:
        return dict(mapping)
    keys = mapping.keys()
    return {key: mapping[key] for key in sorted(keys, key=str)} if isinstance(keys, (set, frozenset)) \
        else {key: mapping[key] for key in keys}


def split_batch(obj: Any) -> tuple[str, str, dict[str, Any], dict[str, Any]] | None:
    """``(kind, layout, fields, extra)`` for a DataProto-like or registered object, else None.
    What is DataProto-like is the batch model's rule (:func:`rollout_mock.batch.dataproto_fields`)."""
    found = dataproto_fields(obj)
    if found is not None:
        layout, state = found
        names = _FIELDS if layout == "public" else _PRIVATE
        nt = state[names[1]]
        fields = {
            "batch": state[names[0]],
            "non_tensor_batch": None if nt is None else _plain_items(nt),
            "meta_info": state[names[2]],
        }
        extra = {k: v for k, v in state.items() if k not in names}
        return "dataproto", layout, fields, extra
    cls = type(obj)
    if cls.__module__ == "builtins" or not is_batch_class(cls):
        return None
    try:
        state = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    return ("object", "dict", {}, dict(state)) if isinstance(state, dict) else None


# batch classes: load side
def resolve_loaded_class(path: str) -> type | None:
    """The class at ``module:qualname`` if its module is already imported, else None."""
    module_name, _, qualname = path.partition(":")
    module = sys.modules.get(module_name)
    if module is None or not qualname:
        return None
    value: Any = module
    for part in qualname.split("."):
        namespace = getattr(value, "__dict__", None) if value is module else vars(value)
        if not isinstance(namespace, (dict, type(type.__dict__))) or part not in namespace:
            return None
        value = namespace[part]
    return value if isinstance(value, type) else None


def _static(cls: type, name: str) -> Any:
    try:
        return inspect.getattr_static(cls, name)
    except AttributeError:
        return None


def _constructible(cls: type) -> bool:
    """object.__new__ + __dict__ works for ``cls`` without running code the class chose."""
    if type(cls) is not type and not issubclass(type(cls), type):
        return False
    if _static(cls, "__new__") is not object.__new__:
        return False
    if getattr(cls, "__dictoffset__", 0) == 0:  # __slots__-only layout: no instance __dict__
        return False
    if getattr(cls, "__abstractmethods__", None):
        return False
    if _static(cls, "__del__") is not None:  # a finalizer would run on file-chosen attributes
        return False
    return type(cls) is type or type(cls).__module__ == "abc"


def _looks_like_dataproto(cls: type) -> bool:
    fields = getattr(cls, "__dataclass_fields__", None) if dataclasses.is_dataclass(cls) else None
    if isinstance(fields, dict) and all(name in fields for name in _FIELDS):
        return True
    return all(_static(cls, name) is not None for name in ("batch", "non_tensor_batch"))


def _uses_private_layout(cls: type) -> bool:
    descriptor = _static(cls, "non_tensor_batch")
    return isinstance(descriptor, property) or hasattr(type(descriptor), "__set__")


def build_batch(kind: str, path: str, layout: str, fields: dict[str, Any], extra: dict[str, Any],
                *, batch_class: type | None = None) -> Any:
    """Rebuild a batch node (see module docstring)."""
    cls = batch_class
    if cls is not None:
        if not isinstance(cls, type) or not _constructible(cls):
            raise ConfigError(
                f"batch_class {cls!r} cannot be rebuilt field by field: it needs object.__new__ "
                f"and an instance __dict__ (no custom __new__, no __slots__-only layout)"
            )
    else:
        found = resolve_loaded_class(path)
        if found is not None and _constructible(found) and (
            is_batch_class(found) or (kind == "dataproto" and _looks_like_dataproto(found))
        ):
            cls = found
    if kind == "object":
        if cls is None:
            raise UnsafePickleError(
                f"refusing to rebuild {path} from an attribute dict: it is not a registered batch "
                f"class of this process (rollout_mock.register_batch_class; its module must be "
                f"imported before loading). A trusted load does not help here: register the class.",
            )
        made: Any = object.__new__(cls)
        object.__getattribute__(made, "__dict__").update(extra)
        return made
    if cls is None:
        return Batch(fields["batch"], fields["non_tensor_batch"], fields["meta_info"], source_class=path)
    obj: Any = object.__new__(cls)
    state = object.__getattribute__(obj, "__dict__")
    names = _PRIVATE if _uses_private_layout(cls) else _FIELDS
    nt = fields["non_tensor_batch"]
    if nt is None and names is _PRIVATE:
        nt = {}
    state[names[0]] = fields["batch"]
    state[names[1]] = nt
    state[names[2]] = fields["meta_info"]
    if names is _PRIVATE:
        for name in _PRIVATE_EXTRA:
            state.setdefault(name, None)
    for name, value in extra.items():
        if name.isidentifier() and not name.startswith("__") and name not in state:
            state[name] = value
    return obj


# --------------------------------------------------------------------------- structural classes
# structural classes: write side
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning("[RolloutMock] %s", message)


def encode_scalar(obj: Any) -> dict[str, Any] | None:
    """The node of a numpy ``str_``/``bytes_`` scalar, else None."""
    cls = type(obj)
    if cls is np.str_:
        return {"$": "npstr", "v": str(obj)}
    if cls is np.bytes_:
        return {"$": "npbytes", "hex": bytes(obj).hex()}
    return None


def keeps_structure(obj: Any) -> bool:
    """Whether ``obj`` must reach :func:`encode_class` / the node of a keyed batch class
    (:func:`rollout_mock.batch.keyed_codec`) itself: a generic path (a pickle taken in memory, a
    msgpack body) would lose its class or state — pickling a nested tensor renormalises its
    ragged dimension and strides, pickling verl's DataProto consolidates its TensorDict."""
    if keyed_codec(type(obj)) is not None:
        return True
    return isinstance(obj, torch.Tensor) and bool(obj.is_nested)


def encode_class(enc: Any, obj: Any, cls: type, path: str) -> dict[str, Any] | None:
    """The node of a jagged nested tensor (``enc.node`` encodes its buffers), else None."""
    if isinstance(obj, torch.Tensor) and obj.is_nested and obj.layout is torch.jagged:
        return _encode_njt(enc, obj, path)
    return None


def _encode_njt(enc: Any, nt: Any, path: str) -> dict[str, Any] | None:
    symbolic = [i for i, size in enumerate(nt.shape) if not isinstance(size, int)]
    cache = getattr(nt, "_metadata_cache", None) or {}
    lengths = nt.lengths()
    values, order = nt.values(), None
    if str(values.dtype).removeprefix("torch.") not in TORCH_DTYPES:
        return None  # not plain data: the generic nested path keeps it for trusted loads
    if not values.is_contiguous():  # a transposed tensor: keep its memory order, not only values
        dims = sorted(range(values.dim()), key=lambda d: -int(values.stride(d)))
        if values.permute(dims).is_contiguous():
            values, order = values.permute(dims), dims
        else:
            _warn_once("njt-strides", f"{path}: a nested tensor over a non-contiguous view (not a "
                       f"transpose) is recorded by value: it loads contiguous")
    node: dict[str, Any] = {
        "$": "njt", "values": enc.node(values, f"{path}.values"), "order": order,
        "offsets": enc.node(nt.offsets(), f"{path}.offsets"),
        "lengths": None if lengths is None else enc.node(lengths, f"{path}.lengths"),
        "ragged": int(nt._ragged_idx), "sym": symbolic[0] if symbolic else int(nt._ragged_idx),
        "min": int(nt._min_seqlen) if "min_seqlen" in cache else None,
        "max": int(nt._max_seqlen) if "max_seqlen" in cache else None,
    }
    return node


# structural classes: load side
def _rows_of(rows: slice | None, n: int) -> list[int] | None:
    return None if rows is None else list(range(n)[rows])


def decode_class(dec: Any, node: dict[str, Any], tag: str, rows: slice | None = None) -> Any:
    """Rebuild a node of this module (``dec.value`` decodes the parts)."""
    if tag == "npstr":
        return np.str_(node["v"])
    if tag == "npbytes":
        return np.bytes_(bytes.fromhex(node["hex"]))
    if tag == "njt":
        return _decode_njt(dec, node, rows)
    raise ValueError(f"unknown node tag {tag!r:.40}")


def _decode_njt(dec: Any, node: dict[str, Any], rows: slice | None) -> Any:
    values, offsets = dec.value(node["values"]), dec.value(node["offsets"])
    lengths = None if node.get("lengths") is None else dec.value(node["lengths"])
    ragged, sym, order = node["ragged"], node["sym"], node.get("order")
    if order is not None:  # stored in memory order: the writer's strides come back
        if len(order) != values.dim():
            raise ValueError("njt order does not match its values")
        values = values.permute([order.index(d) for d in range(len(order))])
    if values.dim() < 1 or offsets.dim() != 1 or offsets.dtype not in (torch.int64, torch.int32) \
            or not 1 <= ragged <= values.dim() or not 1 <= sym <= values.dim():
        raise ValueError("njt node with inconsistent values/offsets")
    dec.reader.flush()  # the rebuilt tensor may copy its buffers: their data first
    axis = ragged - 1
    bounds = offsets.tolist()
    sizes = lengths.tolist() if lengths is not None else [b - a for a, b in itertools.pairwise(bounds)]
    if len(sizes) != len(bounds) - 1 \
            or any(a < 0 or s < 0 or a + s > values.shape[axis] for a, s in zip(bounds, sizes)):
        raise ValueError("njt offsets do not fit its values")
    minimum, maximum = node.get("min"), node.get("max")
    picked = _rows_of(rows, len(sizes))
    if picked is not None:
        segments = [values.narrow(axis, bounds[i], sizes[i]) for i in picked]
        sizes = [sizes[i] for i in picked]
        values = torch.cat(segments, dim=axis) if segments else values.narrow(axis, 0, 0)
        offsets = torch.tensor([0, *np.cumsum(sizes, dtype=np.int64).tolist()], dtype=offsets.dtype)
        lengths, minimum, maximum = None, None, None
    out: Any = torch.nested.nested_tensor_from_jagged(values, offsets, lengths, jagged_dim=sym,
                                                 min_seqlen=minimum, max_seqlen=maximum)
    if out._ragged_idx != ragged:  # set after construction by the writer (verl does this)
        out._ragged_idx = ragged
    return out

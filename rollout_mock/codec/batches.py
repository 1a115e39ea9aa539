"""DataProto-like batch classes: recognised by structure on write, rebuilt by our own factory.

On write, an object is a *DataProto-like batch* when its instance ``__dict__`` holds

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
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Iterator
from typing import Any

from rollout_mock.batch import batch_class_names, dataproto_fields, is_batch_class, register_batch_class
from rollout_mock.errors import ConfigError, UnsafePickleError

__all__ = [
    "Batch", "batch_class_names", "build_batch", "class_path", "is_batch_class",
    "register_batch_class", "split_batch",
]

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


register_batch_class(Batch)  # the batch model's registry is the one registry (rollout_mock.batch)


# --------------------------------------------------------------------------- write side
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


# --------------------------------------------------------------------------- load side
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


def iter_batch_keys(fields: dict[str, Any]) -> Iterator[str]:
    batch = fields.get("batch")
    if batch is not None:
        yield from batch.keys()
    yield from (fields.get("non_tensor_batch") or {})

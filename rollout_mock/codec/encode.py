"""Writing format-2 step files: a batch becomes a JSON node tree plus raw data chunks.

Normalisations (each exact or documented; see the package docstring):

* tensors are stored by value, C-contiguous: strides, storage offsets and storage sharing between
  tensors are not kept (two tensors that share memory load as two independent tensors);
  conjugate/negative bits are resolved; ``requires_grad`` and ``nn.Parameter`` are kept;
  ``.grad`` is dropped (warned once per process); CUDA tensors load on the CPU;
* nested (``torch.nested``) tensors are stored as their components and rebuilt with the same
  layout; sparse/quantized/other exotic tensors, tensor subclasses, cycles, open files and any
  other object that is not plain data go into an opaque pickle blob (warned once per type): only
  a trusted load unpickles it;
* numpy arrays keep dtype (byte order included), shape and the read-only flag;
* an object that appears twice is stored twice (the format has no shared references).
"""

from __future__ import annotations

import collections
import datetime
import math
import struct
from typing import Any

import cloudpickle
import numpy as np
import torch

from rollout_mock.codec.batches import Batch, class_path, split_batch
from rollout_mock.codec.bodyenc import BodyWriter
from rollout_mock.codec.buffers import BufferPool
from rollout_mock.codec.classes import encode_class, encode_scalar, keeps_structure, tensordict_state
from rollout_mock.codec.layout import (
    CHUNK_BYTES,
    TORCH_DTYPES,
)
from rollout_mock.codec.strcol import string_column
from rollout_mock.text import logger

__all__ = ["tensor_bytes"]

_INLINE_BYTES = 4096
_warned: set[str] = set()
_DEFAULT_FACTORIES = {list: "list", dict: "dict", set: "set", int: "int", float: "float", str: "str",
                      tuple: "tuple", None: None}


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning("[RolloutMock] %s", message)


def tensor_bytes(tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
    source, fresh = tensor.detach(), False
    if source.device.type != "cpu":
        source, fresh = source.cpu(), True
    if source.is_conj():
        source, fresh = source.resolve_conj(), True
    if source.is_neg():
        source, fresh = source.resolve_neg(), True
    if not source.is_contiguous():
        source, fresh = source.contiguous(), True
    flat = source.reshape(-1)
    if flat.numel() and flat.stride(0) != 1:
        flat, fresh = flat.clone(memory_format=torch.contiguous_format), True
    return flat, fresh


class _Encoder:
    """Turns one object into a node tree; raw data goes to ``self.chunks``.

    With ``snapshot=True`` every chunk is an owned copy (the caller may mutate the batch next).
    """

    def __init__(self, *, snapshot: bool, pool: BufferPool | None = None, body: bool = True,
                 pickled: bool = False) -> None:
        self.snapshot = snapshot
        #: header version 4: plain values go to a msgpack body (None: version-2 nodes only);
        #: ``pickled``: a capture's in-memory pickles instead (see :mod:`.snapshot`)
        self.body: BodyWriter | None = BodyWriter(self, pickled=pickled) if body else None
        self._slab: torch.Tensor | None = None  # pooled memory of small structural tensors
        self._slab_used = 0
        #: > 0 while encoding version-2 nodes (inside a body's node extension, or a fallback)
        self._plain = 0
        #: the next str-keyed dict is structural (its values are nodes, not one body value) for
        #: this many levels: the root and batch fields, and dicts directly inside them
        self._structural = 2
        self.pool = pool
        #: buffers taken from ``pool`` (given back by Snapshot.release)
        self.pooled: list[torch.Tensor] = []
        #: (raw uint8 memoryview, itemsize for shuffling)
        self.chunks: list[tuple[memoryview, int]] = []
        self._owners: list[Any] = []
        #: first chunk index -> the whole raw view of one tensor/array (for materialize)
        self.spans: dict[int, memoryview] = {}
        self._active: set[int] = set()

    # ------------------------------------------------------------------ raw data
    def tensor_raw(self, tensor: torch.Tensor) -> tuple[np.ndarray, bool]:
        """A tensor's bytes as a flat uint8 array, and whether they are a fresh copy."""
        if tensor.grad is not None:
            _warn_once("grad", "tensor .grad is not recorded (only values and requires_grad are)")
        flat, fresh = tensor_bytes(tensor)
        raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
        return raw.numpy(), fresh

    def copy_raw(self, raw: np.ndarray) -> np.ndarray:
        return self._copy(torch.from_numpy(raw)).numpy() if self.pool is not None else raw.copy()

    def pack_buffer(self, nbytes: int) -> np.ndarray:
        """Memory for a shared chunk of small tensors (a pooled buffer in dump mode)."""
        if self.pool is None:
            return np.empty(nbytes, np.uint8)
        base = self.pool.take(nbytes)
        self.pooled.append(base)
        return base[:nbytes].numpy()

    def reserve_chunk(self) -> int:
        self.chunks.append((memoryview(b""), 1))
        return len(self.chunks) - 1

    def fill_chunk(self, index: int, raw: np.ndarray) -> None:
        self._owners.append(raw)
        view = raw.data.cast("B")
        self.chunks[index] = (view, 1)
        self.spans[index] = view

    def add_raw(self, raw: np.ndarray, itemsize: int, row_bytes: int) -> list[int]:
        return self._add_raw(raw, itemsize, row_bytes)

    def plain_node(self, obj: Any) -> Any:
        """``obj`` as version-2 nodes only (what a body's node extension holds)."""
        self._plain += 1
        try:
            return self.node(obj)
        finally:
            self._plain -= 1

    def finish(self) -> tuple[list[int] | None, bool]:
        """The body reference (None: no body) and whether it needs surrogate-pass decoding."""
        if self.body is None:
            return None, False
        return self.body.finish(), self.body.surrogates

    def _add_raw(self, raw: np.ndarray, itemsize: int, row_bytes: int) -> list[int]:
        """Split a flat uint8 array into chunks; returns ``[first_chunk, count]``."""
        self._owners.append(raw)
        view = raw.data.cast("B")
        step = CHUNK_BYTES
        if 0 < row_bytes <= CHUNK_BYTES:
            step = (CHUNK_BYTES // row_bytes) * row_bytes
        first = len(self.chunks)
        self.spans[first] = view
        for start in range(0, view.nbytes, step):
            self.chunks.append((view[start: start + step], itemsize))
        return [first, len(self.chunks) - first]

    def _copy(self, raw: torch.Tensor) -> torch.Tensor:
        """An owned copy of a flat uint8 tensor: into a pooled buffer when there is a pool (small
        ones side by side, 64-byte aligned, in pooled 4 MiB slabs: no allocation per tensor)."""
        n = raw.numel()
        if self.pool is None:
            return raw.clone()
        if n < (1 << 16):
            start = -(-self._slab_used // 64) * 64
            if self._slab is None or start + n > self._slab.numel():
                self._slab = self.pool.take(CHUNK_BYTES)
                self.pooled.append(self._slab)
                start = 0
            self._slab_used = start + n
            copy = self._slab[start: start + n]
            copy.copy_(raw)
            return copy
        base = self.pool.take(raw.numel())
        self.pooled.append(base)
        copy = base[: raw.numel()]
        copy.copy_(raw)
        return copy

    def _tensor(self, tensor: torch.Tensor, path: str) -> Any:
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in TORCH_DTYPES:
            return self._blob(tensor, path, f"tensor dtype {name}")
        if tensor.grad is not None:
            _warn_once("grad", f"{path}: tensor .grad is not recorded (only values and requires_grad are)")
        flat, fresh = tensor_bytes(tensor)
        raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
        if self.snapshot and not fresh:
            raw = self._copy(raw)
        shape = list(tensor.shape)
        row = raw.numel() // shape[0] if shape and shape[0] else 0
        node: dict[str, Any] = {"$": "tensor", "dtype": name, "shape": shape,
                                "c": self._add_raw(raw.numpy(), tensor.element_size(), row)}
        if tensor.requires_grad:
            node["grad"] = True
        if type(tensor) is torch.nn.Parameter:
            node["param"] = True
        return node

    def _ndarray(self, array: np.ndarray, path: str) -> Any:
        if array.dtype.kind == "O":
            items = [self.node(x, f"{path}[{i}]") for i, x in enumerate(array.reshape(-1))]
            return {"$": "objarray", "shape": list(array.shape), "items": items}
        if array.dtype.hasobject or array.dtype.fields is not None or array.dtype.kind == "V" \
                or array.dtype.itemsize == 0:
            return self._blob(array, path, f"numpy dtype {array.dtype}")
        fresh = False
        if not array.flags.c_contiguous:
            array, fresh = np.ascontiguousarray(array), True
        raw = array.reshape(-1).view(np.uint8) if array.size else np.empty(0, np.uint8)
        if self.snapshot and not fresh:
            raw = self._copy(torch.from_numpy(raw)).numpy() if self.pool is not None else raw.copy()
        row = raw.size // array.shape[0] if array.ndim and array.shape[0] else 0
        node: dict[str, Any] = {"$": "ndarray", "dtype": array.dtype.str, "shape": list(array.shape),
                "c": self._add_raw(raw, array.dtype.itemsize, row)}
        if not array.flags.writeable:
            node["ro"] = True
        return node

    def _bytes(self, data: bytes | bytearray, tag: str) -> Any:
        if len(data) <= _INLINE_BYTES:
            return {"$": tag, "hex": bytes(data).hex()}
        raw = np.frombuffer(bytes(data) if self.snapshot and tag == "bytearray" else data, np.uint8)
        return {"$": tag, "c": self._add_raw(raw, 1, 0)}

    def _blob(self, obj: Any, path: str, what: str) -> Any:
        _warn_once(f"blob:{what}", f"{path}: {what} is not plain data; it is stored as an opaque "
                   f"pickle that only a trusted load (trusted=True / trust_pickle: true) will read")
        try:
            data = cloudpickle.dumps(obj, protocol=5)
        except Exception as exc:
            raise TypeError(f"{path}: cannot record {what}: {exc!r}") from exc
        raw = np.frombuffer(data, np.uint8)
        return {"$": "pickle", "what": what, "path": path, "c": self._add_raw(raw, 1, 0)}

    @staticmethod
    def _float(value: float) -> Any:
        if math.isfinite(value):
            return value
        return {"$": "float", "hex": struct.pack("<d", value).hex()}

    def _items(self, pairs: Any, path: str) -> list[list[Any]]:
        return [[self.node(k, path), self.node(v, f"{path}[{k!r}]")] for k, v in pairs]

    # ------------------------------------------------------------------ dispatch
    def node(self, obj: Any, path: str = "") -> Any:
        cls = type(obj)
        if obj is None or cls is bool or cls is str:
            return obj
        if self.body is not None and not self._plain:
            routed = self._route(obj, cls, path)
            if routed is not None:
                return routed
        if cls is int:
            return obj if -(1 << 63) <= obj < (1 << 63) else {"$": "int", "v": str(obj)}
        if cls is float:
            return self._float(obj)
        if isinstance(obj, torch.Tensor) and getattr(obj, "is_nested", False):
            jagged = encode_class(self, obj, cls, path)  # classes.py: jagged tensors by their buffers
            if jagged is not None:
                return jagged
            try:
                parts = obj.unbind()
            except Exception:  # an exotic nested layout: keep the step, trusted loads only
                return self._blob(obj, path, "a nested tensor that cannot be unbound")
            layout = "jagged" if obj.layout is torch.jagged else "strided"
            return {"$": "nested", "layout": layout,
                    "items": [self.node(t, f"{path}[{i}]") for i, t in enumerate(parts)]}
        if cls is torch.Tensor or cls is torch.nn.Parameter:
            if obj.layout is torch.strided and not obj.is_quantized and obj.device.type != "meta":
                return self._tensor(obj, path)
            return self._blob(obj, path, f"{obj.layout} tensor")
        if cls is np.ndarray:
            return self._ndarray(obj, path)
        if isinstance(obj, np.generic) and cls.__module__ == "numpy":
            text = encode_scalar(obj)  # classes.py: np.str_ / np.bytes_
            if text is not None:
                return text
            if obj.dtype.kind in "biufcmM" and obj.dtype.fields is None:
                return {"$": "npscalar", "dtype": obj.dtype.str, "hex": obj.tobytes().hex()}
            return self._blob(obj, path, f"numpy scalar {obj.dtype}")
        if cls in (bytes, bytearray):
            return self._bytes(obj, cls.__name__)
        key = id(obj)
        if key in self._active:
            return self._blob(obj, path, "a reference cycle")
        self._active.add(key)
        try:
            return self._container(obj, cls, path)
        finally:
            self._active.discard(key)

    def _route(self, obj: Any, cls: type, path: str) -> Any:
        """Header version 4: where a value goes (None: the version-2 node path below)."""
        levels, self._structural = self._structural, 0
        if cls is int:
            return obj if -(1 << 63) <= obj < (1 << 63) else {"$": "int", "v": str(obj)}
        if cls is float:
            return self._float(obj)
        if cls is dict and levels and all(type(k) is str for k in obj) and "$" not in obj:
            out = {}
            for k, v in obj.items():
                self._structural = levels - 1
                out[k] = self.node(v, f"{path}.{k}" if path else k)
            self._structural = 0
            return out
        if cls is np.ndarray and obj.dtype.kind == "O":
            if self.body is not None and self.body.pickled is not None:  # a capture: strings are immutable
                if obj.size and set(map(type, obj.reshape(-1).tolist())) == {str}:
                    return self.body.keep(obj.copy())
            column = string_column(obj, self._add_raw)
            if column is not None:
                return column
        elif cls in (torch.Tensor, torch.nn.Parameter, np.ndarray, bytes, bytearray) \
                or (cls.__module__ == "tensordict._td" and cls.__qualname__ == "TensorDict") \
                or split_batch(obj) is not None or keeps_structure(obj):
            return None
        assert self.body is not None
        node = self.body.node(obj)
        if node is None:  # cycles, nesting msgpack refuses: version-2 nodes (cycles become blobs)
            return self.plain_node(obj)
        return node

    def _container(self, obj: Any, cls: type, path: str) -> Any:
        if cls is list:
            return [self.node(x, f"{path}[{i}]") for i, x in enumerate(obj)]
        if cls is tuple:
            return {"$": "tuple", "v": [self.node(x, f"{path}[{i}]") for i, x in enumerate(obj)]}
        if cls is dict:
            if all(type(k) is str for k in obj) and "$" not in obj:
                return {k: self.node(v, f"{path}.{k}" if path else k) for k, v in obj.items()}
            return {"$": "map", "items": self._items(obj.items(), path)}
        if cls in (set, frozenset):
            return {"$": cls.__name__, "v": [self.node(x, path) for x in obj]}
        if cls is complex:
            return {"$": "complex", "re": self._float(obj.real), "im": self._float(obj.imag)}
        if cls is collections.OrderedDict:
            return {"$": "odict", "items": self._items(obj.items(), path)}
        if cls is collections.Counter:
            return {"$": "counter", "items": self._items(obj.items(), path)}
        if cls is collections.defaultdict and obj.default_factory in _DEFAULT_FACTORIES:
            return {"$": "defaultdict", "factory": _DEFAULT_FACTORIES[obj.default_factory],
                    "items": self._items(obj.items(), path)}
        if cls is collections.deque:
            return {"$": "deque", "v": [self.node(x, path) for x in obj], "maxlen": obj.maxlen}
        if cls is torch.Size:
            return {"$": "size", "v": list(obj)}
        if cls is torch.device:
            return {"$": "device", "v": str(obj)}
        if cls is torch.dtype and str(obj).removeprefix("torch.") in TORCH_DTYPES:
            return {"$": "dtype", "v": str(obj).removeprefix("torch.")}
        if cls is slice:
            return {"$": "slice", "v": [self.node(obj.start), self.node(obj.stop), self.node(obj.step)]}
        if cls is range:
            return {"$": "range", "v": [obj.start, obj.stop, obj.step]}
        if cls in (datetime.datetime, datetime.time) and (
                obj.tzinfo is None or type(obj.tzinfo) is datetime.timezone) or cls is datetime.date:
            return {"$": cls.__name__, "iso": obj.isoformat()}
        if cls is datetime.timedelta:
            return {"$": "timedelta", "v": [obj.days, obj.seconds, obj.microseconds]}
        if cls.__module__ == "tensordict._td" and cls.__qualname__ == "TensorDict":
            return self._tensordict(obj, path)
        structural = encode_class(self, obj, cls, path)  # classes.py: tensordict's classes
        if structural is not None:
            return structural
        parts = split_batch(obj)
        if parts is not None:
            kind, layout, fields, extra = parts
            written = class_path(cls)
            if cls is Batch and isinstance(extra.get("source_class"), str):  # a stand-in keeps its class
                written = extra.pop("source_class")  # (e.g. `rollout-mock cut` without verl imported)
            node: dict[str, Any] = {"$": "batch", "kind": kind, "class": written, "layout": layout}
            for name, value in fields.items():
                self._structural = 2
                node[name] = self.node(value, f"{path}.{name}" if path else name)
            node["extra"] = [[k, self.node(v, f"{path}.{k}")] for k, v in extra.items()]
            return node
        reduced = self._reduced_to_data(obj)
        if reduced is not None:
            return self.node(reduced[0], path)
        return self._blob(obj, path, f"{cls.__module__}.{cls.__qualname__}")

    @staticmethod
    def _reduced_to_data(obj: Any) -> tuple[Any] | None:
        """An object whose ``__reduce__`` says "I am this str/int/float/... value" becomes it."""
        reduce = getattr(type(obj), "__reduce__", None)
        if reduce is None or reduce is object.__reduce__:
            return None
        try:
            rv = obj.__reduce__()
        except Exception:
            return None
        if type(rv) is tuple and len(rv) == 2 and rv[0] in (str, int, float, bool, bytes, complex) \
                and type(rv[1]) is tuple and all(type(a) in (str, int, float, bool, bytes) for a in rv[1]):
            try:
                return (rv[0](*rv[1]),)
            except Exception:
                return None
        return None

    def _tensordict(self, td: Any, path: str) -> Any:
        names = list(td.names) if td._has_names() else None
        device = td.device
        return {"$": "tensordict", "batch_size": list(td.batch_size), "names": names,
                "device": "cpu" if device is not None and device.type == "cpu" else None,
                "items": [[k, self.node(v, f"{path}.{k}")] for k, v in td.items()], **tensordict_state(td, path)}

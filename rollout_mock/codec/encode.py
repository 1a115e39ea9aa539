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
import io
import math
import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import cloudpickle
import numpy as np
import torch

from rollout_mock._text import logger
from rollout_mock.codec.batches import Batch, class_path, split_batch
from rollout_mock.codec.buffers import BufferPool
from rollout_mock.codec.container import encode_snapshot
from rollout_mock.codec.layout import (
    CHUNK_BYTES,
    TORCH_DTYPES,
)

__all__ = ["Snapshot", "capture", "encode", "encode_snapshot"]

_INLINE_BYTES = 4096
_warned: set[str] = set()
_DEFAULT_FACTORIES = {list: "list", dict: "dict", set: "set", int: "int", float: "float", str: "str",
                      tuple: "tuple", None: None}


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning("[RolloutMock] %s", message)


def _tensor_bytes(tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
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

    def __init__(self, *, snapshot: bool, pool: BufferPool | None = None) -> None:
        self.snapshot = snapshot
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
    def _add_raw(self, raw: np.ndarray, itemsize: int, row_bytes: int) -> list[int]:
        """Split a flat uint8 array into chunks; returns ``[first_chunk, count]``."""
        self._owners.append(raw)
        view = memoryview(raw).cast("B")
        step = CHUNK_BYTES
        if 0 < row_bytes <= CHUNK_BYTES:
            step = (CHUNK_BYTES // row_bytes) * row_bytes
        first = len(self.chunks)
        self.spans[first] = view
        for start in range(0, view.nbytes, step):
            self.chunks.append((view[start: start + step], itemsize))
        return [first, len(self.chunks) - first]

    def _copy(self, raw: torch.Tensor) -> torch.Tensor:
        """An owned copy of a flat uint8 tensor: into a pooled buffer when there is a pool."""
        if self.pool is None or raw.numel() < (1 << 16):
            return raw.clone()
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
        flat, fresh = _tensor_bytes(tensor)
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
        node = {"$": "ndarray", "dtype": array.dtype.str, "shape": list(array.shape),
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
        if cls is int:
            return obj if -(1 << 63) <= obj < (1 << 63) else {"$": "int", "v": str(obj)}
        if cls is float:
            return self._float(obj)
        if isinstance(obj, torch.Tensor) and getattr(obj, "is_nested", False):
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
        parts = split_batch(obj)
        if parts is not None:
            kind, layout, fields, extra = parts
            written = class_path(cls)
            if cls is Batch and isinstance(extra.get("source_class"), str):  # a stand-in keeps its class
                written = extra.pop("source_class")  # (e.g. `rollout-mock cut` without verl imported)
            node: dict[str, Any] = {"$": "batch", "kind": kind, "class": written, "layout": layout}
            for name, value in fields.items():
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
                "items": [[k, self.node(v, f"{path}.{k}")] for k, v in td.items()]}


# --------------------------------------------------------------------------- snapshot & write
@dataclass
class Snapshot:
    """A batch captured in memory: its node tree and owned copies of its raw data.

    Independent of the original batch (mutating the batch after :func:`capture` returns does not
    change the snapshot). :meth:`materialize` rebuilds an equal batch that shares the copies;
    :func:`encode_snapshot` writes it without another copy.
    """

    root: Any
    chunks: list[tuple[memoryview, int]] = field(default_factory=list)
    owners: list[Any] = field(default_factory=list, repr=False)
    spans: dict[int, memoryview] = field(default_factory=dict, repr=False)
    pool: BufferPool | None = field(default=None, repr=False)
    pooled: list[Any] = field(default_factory=list, repr=False)

    @property
    def nbytes(self) -> int:
        return sum(view.nbytes for view, _ in self.chunks)

    def release(self) -> None:
        """Give pooled buffers back (after the snapshot was written): the snapshot, and any batch
        :meth:`materialize` built from it, must not be used afterwards; it is emptied."""
        self.chunks, self.owners, self.spans = [], [], {}
        if self.pool is not None:
            self.pool.give(self.pooled)
        self.pooled = []

    def materialize(self, *, batch_class: type | None = None) -> Any:
        from rollout_mock.codec.decode import materialize_snapshot

        return materialize_snapshot(self, batch_class=batch_class)


def capture(obj: Any, *, pool: BufferPool | None = None) -> Snapshot:
    """Snapshot ``obj`` with one copy of its tensor/array data (into ``pool``'s buffers, if given:
    call :meth:`Snapshot.release` once the snapshot is written)."""
    encoder = _Encoder(snapshot=True, pool=pool)
    root = encoder.node(obj)
    return Snapshot(root, encoder.chunks, encoder._owners, encoder.spans, pool, encoder.pooled)


def encode(obj: Any, file: BinaryIO, *, compression: str = "none") -> None:
    """Write ``obj`` to ``file`` (anything with ``.write``) as a format-2 step file."""
    encoder = _Encoder(snapshot=False)
    root = encoder.node(obj)
    encode_snapshot(Snapshot(root, encoder.chunks, encoder._owners), file, compression=compression)


def encode_bytes(obj: Any, *, compression: str = "none") -> bytes:
    buffer = io.BytesIO()
    encode(obj, buffer, compression=compression)
    return buffer.getvalue()

"""Reading header version 4: the msgpack body, string columns and shared small-tensor chunks
(the layout is described in :mod:`~rollout_mock.codec.bodyenc`).

Bounds, all checked before the work they bound: the body is stored uncompressed and the header
check counts it 64 times against the file's allocation bound (the most memory a byte of msgpack
can become is ~72 bytes: an empty dict); msgpack's own limits refuse any length beyond the
buffer and nesting beyond its C stack; msgpack's timestamp extension (-1), which rollout_mock
never writes, decodes to a plain int (nanoseconds); maps decode with string keys only (hashed with Python's
per-process key), and any other key sends the value through a slow path that checks hash
collisions first (:mod:`~rollout_mock.codec.hashguard`), as do sets; extension payloads are
fixed-layout structs checked field by field; tensor data must lie inside its chunk (views of a
shared chunk cost no memory), runs of chunks are counted against the table once; version-2 nodes
inside the body pass the same :func:`~rollout_mock.codec.header.check_tree` as the header's.
"""

from __future__ import annotations

import io
import math
import pickle
import struct
from typing import Any

import msgpack
import numpy as np
import torch

from rollout_mock.codec.bodyenc import (
    EXT_FROZENSET,
    EXT_INT,
    EXT_NDARRAY,
    EXT_NODE,
    EXT_OBJARRAY,
    EXT_SET,
    EXT_TENSOR,
    EXT_TUPLE,
    TENSOR_HEAD,
)
from rollout_mock.codec.hashguard import check_keys
from rollout_mock.codec.header import check_tree
from rollout_mock.codec.layout import MAX_NDIM, TORCH_DTYPE_NAMES, TORCH_DTYPES, numpy_dtype

__all__ = ["BodyReader"]

_MAX_DIM = 1 << 48
_MAX_INT_BYTES = 1 << 16


class _Marker:
    """What a marker extension decodes to until its array is rebuilt (never returned)."""

    __slots__ = ("code",)

    def __init__(self, code: int) -> None:
        self.code = code

    def __repr__(self) -> str:
        return f"<rollout_mock marker {self.code}>"


_MARKERS = {code: _Marker(code) for code in (EXT_TUPLE, EXT_SET, EXT_FROZENSET, EXT_OBJARRAY)}


def _dims(data: bytes, ndim: int, at: int) -> list[int]:
    if ndim > MAX_NDIM or len(data) < at + 8 * ndim:
        raise ValueError("bad tensor extension (dimensions)")
    dims = list(struct.unpack_from(f"<{ndim}Q", data, at))
    if any(d > _MAX_DIM for d in dims):
        raise ValueError("bad tensor extension (dimension too large)")
    return dims


class BodyReader:
    """Decodes ``mp`` nodes: msgpack from the body, tensors from (shared) chunks.

    ``decoder``: the :class:`~rollout_mock.codec.decode.NodeDecoder` (its chunk reader, and its
    :meth:`value` for version-2 nodes); ``raws``: each chunk's raw size; ``table``: the chunk
    table for checks (None for in-memory snapshots); ``used``: chunk references so far.
    """

    def __init__(self, decoder: Any, body: list[int] | None, raws: list[int], *, surrogates: bool,
                 table: list[list[int]] | None, used: list[int]) -> None:
        self.decoder = decoder
        self.reader = decoder.reader
        self.body_ref = body
        self.raws = raws
        self.table = table
        self.used = used
        self.errors = "surrogatepass" if surrogates else "strict"
        self._body: memoryview | None = None
        self._shared: dict[int, torch.Tensor] = {}

    def snapshot_value(self, pickled: list[Any], node: dict[str, Any]) -> Any:
        """A capture's in-memory pickle (written by this process, see
        :mod:`~rollout_mock.codec.snapshot`; step files never hold one)."""
        reader = self

        class Unpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str) -> Any:
                if module == "rollout_mock.codec.bodyenc" and name == "snapshot_ext":
                    return reader.ext
                return super().find_class(module, name)

        entry = pickled[node["i"]]
        if not isinstance(entry, bytes):  # kept as is (an object array of str)
            return entry
        return Unpickler(io.BytesIO(entry)).load()

    def value(self, node: dict[str, Any]) -> Any:
        if self._body is None:
            if self.body_ref is None:
                raise ValueError("body value in a step without a body")
            self._body = memoryview(self.reader.whole(self.body_ref, None).numpy()).cast("B")
        offset, length = node["o"], node["n"]
        if offset + length > self._body.nbytes:
            raise ValueError("body value outside the body")
        data = self._body[offset: offset + length]
        used = self.used[0]
        try:
            try:
                return msgpack.unpackb(data, ext_hook=self.ext, list_hook=self.lists, strict_map_key=True,
                                       unicode_errors=self.errors, raw=False, timestamp=2)
            except ValueError as exc:
                if "is not allowed for map key" not in str(exc):
                    raise
            self.used[0] = used  # the references of the first pass are counted again below
            # non-string keys: every map goes through the hash-collision check
            return msgpack.unpackb(data, ext_hook=self.ext, list_hook=self.lists, strict_map_key=False,
                                   object_pairs_hook=self.pairs, unicode_errors=self.errors, raw=False, timestamp=2)
        except msgpack.StackError:
            raise ValueError("body value nested deeper than msgpack's limit") from None
        except msgpack.FormatError:
            raise ValueError("body value is not valid msgpack") from None

    @staticmethod
    def pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        check_keys([k for k, _ in pairs])
        return dict(pairs)

    @staticmethod
    def lists(items: list[Any]) -> Any:
        if not items or type(items[0]) is not _Marker:
            return items
        code = items[0].code
        if code == EXT_TUPLE:
            return tuple(items[1:])
        if code == EXT_SET or code == EXT_FROZENSET:
            members = items[1:]
            check_keys(members)
            return set(members) if code == EXT_SET else frozenset(members)
        shape = items[1] if len(items) > 1 else None
        if type(shape) is not list or len(shape) > MAX_NDIM or any(type(d) is not int or d < 0 for d in shape) \
                or math.prod(shape) != len(items) - 2:
            raise ValueError("object array shape does not match its items")
        array = np.empty(len(items) - 2, dtype=object)
        for i, x in enumerate(items[2:]):
            array[i] = x
        return array.reshape(shape)

    def ext(self, code: int, data: bytes) -> Any:
        if code in _MARKERS:
            if data:
                raise ValueError("marker extension with a payload")
            return _MARKERS[code]
        if code == EXT_INT:
            if not data or len(data) > _MAX_INT_BYTES:
                raise ValueError("bad integer extension")
            return int.from_bytes(data, "little", signed=True)
        if code == EXT_TENSOR or code == EXT_NDARRAY:
            return self._tensor(data, code == EXT_NDARRAY)
        if code == EXT_NODE:
            try:
                node = msgpack.unpackb(data, strict_map_key=True, unicode_errors="surrogatepass", raw=False,
                                       timestamp=2)
            except (msgpack.StackError, msgpack.FormatError):
                raise ValueError("node extension is not valid msgpack") from None
            if self.table is not None:
                check_tree(node, self.table, used=self.used)
            return self.decoder.value(node)
        raise ValueError(f"unknown body extension {code}")

    def _raw(self, first: int, count: int, offset: int, nbytes: int) -> torch.Tensor:
        if count == 1:
            if first >= len(self.raws) or offset + nbytes > self.raws[first]:
                raise ValueError("tensor data outside its chunk")
            chunk = self._shared.get(first)
            if chunk is None:
                chunk = self._shared[first] = self.reader.whole([first, 1], None, defer=True)
            return chunk[offset: offset + nbytes]
        if offset or first + count > len(self.raws) or sum(self.raws[first: first + count]) != nbytes:
            raise ValueError("tensor data does not match its chunks")
        self.used[0] += count
        if self.table is not None and self.used[0] > len(self.table):
            raise ValueError("chunks are referenced more than once")
        return self.reader.whole([first, count], nbytes, defer=True)

    def _tensor(self, data: bytes, numpy: bool) -> Any:
        if len(data) < TENSOR_HEAD.size:
            raise ValueError("bad tensor extension")
        code, flags, ndim, _, first, count, offset = TENSOR_HEAD.unpack_from(data)
        dims = _dims(data, ndim, TENSOR_HEAD.size)
        if numpy:
            dtype = numpy_dtype(data[TENSOR_HEAD.size + 8 * ndim:].decode("ascii"))
            nbytes = math.prod(dims) * dtype.itemsize
            raw = self._raw(first, count, offset, nbytes) if nbytes else torch.empty(0, dtype=torch.uint8)
            array = raw.numpy().view(dtype).reshape(dims)
            if flags & 4:
                array.flags.writeable = False
            return array
        if code >= len(TORCH_DTYPE_NAMES) or TORCH_DTYPE_NAMES[code] not in TORCH_DTYPES \
                or len(data) != TENSOR_HEAD.size + 8 * ndim:
            raise ValueError("bad tensor extension (dtype)")
        torch_dtype = TORCH_DTYPES[TORCH_DTYPE_NAMES[code]]
        nbytes = math.prod(dims) * torch_dtype.itemsize
        if nbytes == 0:
            out = torch.zeros(dims, dtype=torch_dtype)
        else:
            raw = self._raw(first, count, offset, nbytes)
            if torch_dtype is torch.bool:
                self.reader.after(lambda: _check_bool(raw))
            out = raw.view(torch_dtype).view(dims)
        if flags & 2:
            return torch.nn.Parameter(out, requires_grad=bool(flags & 1))
        if flags & 1:
            out.requires_grad_(True)
        return out


def _check_bool(raw: torch.Tensor) -> None:
    if bool((raw > 1).any()):
        raise ValueError("bool tensor holds bytes other than 0 and 1")

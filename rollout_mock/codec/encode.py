"""Writing step files: a batch becomes a JSON node tree, a msgpack body and raw data chunks.

There is one write path. :func:`capture` (what the dump-mode call blocks on) runs the whole
encoder over the batch, copying tensor and array data once into reusable buffers
(:class:`BufferPool`); the result, a :class:`Capture`, is the step already encoded: the writer
thread hands it to :func:`encode`, which writes the container (header, CRC-32s, chunks) and
nothing else. A batch given to :func:`encode` directly runs the same encoder without the copies;
both produce the same bytes. The only work a capture leaves to the writer is packing the strings
of string columns (strings are immutable: the capture keeps a copy of the array's pointers and
the columns' exact byte offsets, so the layout is fixed at capture time), and, with a pool, the
wait for the bytes of CUDA tensors: their copies into pinned buffers are queued on a side stream
and the capture returns without waiting for them (:mod:`~rollout_mock.codec.device`).

Normalisations (each exact or documented in docs/file-format.md):

* a step holds data, not autograd state: tensors load as leaves with ``requires_grad=False``;
  ``.grad`` and the graph are not recorded (a tensor that requires grad is warned about once per
  process); ``nn.Parameter`` keeps its class; CUDA tensors load on the CPU, and the index of
  the CUDA device of each is recorded (``device: auto`` of the replay puts them back there);
* tensors are stored by value, C-contiguous: strides, storage offsets and storage sharing between
  tensors are not kept (two tensors that share memory load as two independent tensors);
  conjugate/negative bits are resolved;
* nested (``torch.nested``) tensors are stored as their components and rebuilt with the same
  layout; sparse/quantized/other exotic tensors, tensor subclasses, cycles, open files and any
  other object that is not plain data go into an opaque pickle blob (warned once per type): only
  a trusted load unpickles it;
* numpy arrays keep dtype (byte order included), shape and the read-only flag;
* an object that appears twice is stored twice (the format has no shared references).

The body (header version 4) holds every value below the header's structural nodes (a root
dict's values, a batch's fields, the items of a keyed batch class such as a TensorDict) that is
not a tensor, a numeric array or a string column, packed by msgpack's C encoder; what msgpack
lacks becomes one of the ``EXT_*`` extension types of :mod:`~rollout_mock.codec.format`.
``bytearray`` and ``memoryview`` values inside the body load as ``bytes``; at a structural
position they keep their type. Tensors under
:data:`~rollout_mock.codec.format.SMALL_BYTES` inside the body are copied side by side (64-byte
aligned, zero padding) into shared 4 MiB chunks.

Plain values (only ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, lists and
str-keyed dicts of them) are packed by ormsgpack, which checks each value's exact type as it packs
it; the rest by msgpack's packer: the same bytes (docs/performance.md). A capture with a pool (the
dump-mode call) packs a list a slice at a time and copies the bytes into the pool's 4 MiB buffers,
the body's chunks: the same bytes and chunks, in memory reused from step to step (ormsgpack's
output for a whole batch is fresh memory at every call: a page fault per 4 KiB).

Where the bytes go: the container (header, chunk table, CRC-32s) is written by
:func:`~rollout_mock.codec.format.write_container`, the mirror of the reader, to a
:class:`~rollout_mock.codec.format.Sink` or :class:`~rollout_mock.codec.format.FileSink`. The
capture buffers (:class:`~rollout_mock.codec.device.BufferPool`) live with the pinned memory
they lend, in :mod:`~rollout_mock.codec.device`.
"""

from __future__ import annotations

import collections
import datetime
import functools
import io
import math
import operator
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import msgpack
import msgspec
import numpy as np
import ormsgpack
import torch

from rollout_mock.batch import KeyedCodec, keyed_codec
from rollout_mock.codec.classes import (
    Batch,
    class_path,
    encode_class,
    encode_scalar,
    keeps_structure,
    split_batch,
)
from rollout_mock.codec.device import BufferPool, StagedCopies, cuda_index, flat_values
from rollout_mock.codec.format import (
    BODY_VERSION,
    CHUNK_BYTES,
    EXT_FROZENSET,
    EXT_INT,
    EXT_NDARRAY,
    EXT_NODE,
    EXT_OBJARRAY,
    EXT_SET,
    EXT_TENSOR,
    EXT_TUPLE,
    PACK_ALIGN,
    SMALL_BYTES,
    TENSOR_HEAD,
    TORCH_DTYPE_NAMES,
    TORCH_DTYPES,
    DeferredChunk,
    FileSink,
    Sink,
    array_head,
    write_container,
)
from rollout_mock.errors import UnrecordableBatchError
from rollout_mock.text import int_digits, logger

__all__ = ["BufferPool", "Capture", "CaptureList", "FileSink", "Sink", "capture", "encode", "encode_bytes"]


# --------------------------------------------------------------------------- raw data
_INLINE_BYTES = 4096
_warned: set[str] = set()
_DEFAULT_FACTORIES = {list: "list", dict: "dict", set: "set", int: "int", float: "float", str: "str",
                      tuple: "tuple", None: None}
_CODES = {name: i for i, name in enumerate(TORCH_DTYPE_NAMES)}
_MARKS: dict[type, msgpack.ExtType] = {tuple: msgpack.ExtType(EXT_TUPLE, b""), set: msgpack.ExtType(EXT_SET, b""),
                                       frozenset: msgpack.ExtType(EXT_FROZENSET, b"")}
_OBJARRAY = msgpack.ExtType(EXT_OBJARRAY, b"")
#: What a non-finite number looks like in a msgpack body: a float64 (``0xcb``) or float32
#: (``0xca``) whose exponent bits are all set (big-endian), or a node extension's ``float`` /
#: ``npscalar`` tag (``{"$": "float", "hex": ...}``): :meth:`Capture.floats_finite`.
_NONFINITE = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]|\xca[\x7f\xff][\x80-\xff]|\xa1\$\xa5float|\xa1\$\xa8npscalar",
                        re.DOTALL)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning("[RolloutMock] %s", message)


def _autograd(tensor: torch.Tensor, path: str) -> None:
    """Say once that autograd state is not recorded (``requires_grad`` only: reading ``.grad``
    of a non-leaf tensor makes torch warn)."""
    if tensor.requires_grad:
        _warn_once("grad", f"{path or 'a tensor'} requires grad: a step records data, not autograd state, "
                   f"so replay returns it as a leaf tensor with requires_grad=False (no graph, no .grad); "
                   f"call .requires_grad_() on the replayed tensor if training needs it")


def tensor_bytes(tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A flat, C-contiguous CPU copy or view of ``tensor``'s values, and whether it is a fresh copy."""
    source = tensor.detach()
    moved = source.device.type != "cpu"
    flat, made = flat_values(source.cpu() if moved else source)
    return flat, moved or made


def _plain_tensor(obj: torch.Tensor) -> bool:
    """A dense tensor whose bytes a step can hold."""
    return obj.layout is torch.strided and not obj.is_quantized and obj.device.type != "meta" \
        and not getattr(obj, "is_nested", False) and str(obj.dtype)[6:] in TORCH_DTYPES


def _packed_surrogates(flat: list[str], total: int) -> bytes:
    """``msgpack.packb(flat)`` of a string column with lone surrogates (UTF-8 surrogate-pass,
    which msgspec cannot write), into a buffer sized once: ``total`` bytes are known from the
    offsets (msgpack grows its own by doubling: 3-4x slower for MBs of text)."""
    try:
        packer = msgpack.Packer(use_bin_type=True, unicode_errors="surrogatepass", buf_size=total + 64)
    except TypeError:  # a msgpack without buf_size (the pure-Python fallback)
        return msgpack.packb(flat, use_bin_type=True, unicode_errors="surrogatepass")
    return packer.pack(flat)


#: msgspec's packer of string columns (:class:`_Column`): the same msgpack bytes as msgpack's,
#: about twice as fast.
_FAST = msgspec.msgpack.Encoder()


class _Column:
    """A string column (no lone surrogates; ``offsets`` as :meth:`_Encoder._strings` computes
    them) packed a chunk at a time as the step is written (:class:`DeferredChunk`): the column's
    array head, then its items packed by msgspec about :data:`_SLICE_BYTES` at a time (a list's
    packing without its own array head is its items'); each slice is small, reused memory, and
    is copied into the chunk. The chunks are made in order: the item across a chunk's edge is
    packed alone, once, and kept for the next chunk (an item longer than a chunk: for each
    chunk it spans)."""

    def __init__(self, flat: list[str], offsets: np.ndarray) -> None:
        self.flat, self.offsets = flat, offsets
        self._last: tuple[int, int, bytes] = (-1, -1, b"")

    def chunks(self) -> list[DeferredChunk]:
        total = int(self.offsets[-1])
        return [DeferredChunk(min(CHUNK_BYTES, total - start), functools.partial(self._put, start))
                for start in range(0, total, CHUNK_BYTES)]

    def _packed(self, item: int, end: int) -> bytes:
        """Items ``item .. end`` packed as a list (its array head, then their bytes)."""
        if self._last[:2] != (item, end):
            data = _FAST.encode(self.flat[item:end])
            lead, expected = len(array_head(end - item)), int(self.offsets[end] - self.offsets[item])
            if len(data) - lead != expected:  # msgpack's str8/16/32 heads are what offsets assume
                raise RuntimeError(f"string column items {item}..{end} packed to {len(data) - lead} bytes, "
                                   f"its offsets say {expected}")
            self._last = (item, end, data)
        return self._last[2]

    def _put(self, start: int, out: memoryview) -> None:
        """Put the column bytes ``start .. start + len(out)`` into ``out``."""
        offsets = self.offsets
        stop = start + out.nbytes
        position = start  # the next column byte to put
        first = int(offsets[0])
        if position < first:  # the first chunk begins with the column's own array head
            out[: first - start] = array_head(len(self.flat))[start:]
            position = first
        item = int(np.searchsorted(offsets, position, "right")) - 1
        while position < stop:
            at = int(offsets[item])
            end = max(item + 1, int(np.searchsorted(offsets, min(at + _SLICE_BYTES, stop), "left")))
            if end > item + 1 and int(offsets[end]) > stop:
                end -= 1  # the item across the chunk's edge: a slice of its own, kept for the next chunk
            data = self._packed(item, end)
            lead = len(data) - (int(offsets[end]) - at)
            upto = min(int(offsets[end]), stop)
            out[position - start: upto - start] = memoryview(data)[lead + position - at: lead + upto - at]
            position, item = upto, end


#: ormsgpack's options that make it pack plain data only: ``None``, ``bool``, ``int`` (64-bit),
#: ``float``, ``str``, ``bytes``, lists and str-keyed dicts of exactly these types. Everything
#: else (tuples, sets, subclasses of int/str/list/dict, enums, dataclasses, datetimes, UUIDs,
#: numpy scalars, ints past 64 bits, non-str keys, lone surrogates, nesting past its limit)
#: makes it raise, and msgpack's packer takes the value instead (:meth:`_Body.node`): one pass in
#: C over the value, checked as it is packed, the same msgpack bytes (docs/performance.md).
_PLAIN = functools.reduce(operator.or_, (getattr(ormsgpack, f"OPT_PASSTHROUGH_{kind}") for kind in (
    "BIG_INT", "DATACLASS", "DATETIME", "ENUM", "SUBCLASS", "TUPLE", "UUID")))
_NESTED = frozenset({list, dict})
#: About how many bytes a capture packs at a time into its pooled body (:meth:`_Body._pack_list`):
#: small enough to be reused memory, large enough that the calls cost nothing.
_SLICE_BYTES = 1 << 16


def _msgpack(default: Any, surrogates: bool) -> msgpack.Packer:
    return msgpack.Packer(use_bin_type=True, strict_types=True, default=default, datetime=False,
                          unicode_errors="surrogatepass" if surrogates else None)


# --------------------------------------------------------------------------- the encoder
def _big_int(value: int, path: str) -> dict[str, Any]:
    """The node of an int past int64: its decimal text, up to the 4,300 digits a reader accepts
    (Python's int-string limit); a longer one cannot be recorded, and says where it is."""
    digits = int_digits(value)
    if digits > 4300:
        raise UnrecordableBatchError(
            f"{path or 'the batch'}: an int of {digits} digits cannot be recorded (the dump format holds ints "
            f"of up to 4300 digits); store it as a string or a float")
    return {"$": "int", "v": str(value)}


class _Encoder:
    """Turns one object into a node tree; raw data goes to ``self.chunks``.

    ``snapshot``: every chunk is an owned copy (a capture: the caller may mutate the batch next),
    in ``pool``'s buffers when given. The header holds the batch's structure as nodes; every
    other value goes to the msgpack body (:class:`_Body`), and back to nodes only for what
    msgpack cannot hold (cycles, nesting beyond its limit). ``body`` is None once finished.
    """

    def __init__(self, *, snapshot: bool, pool: BufferPool | None = None, pooled_body: bool = False) -> None:
        self.snapshot = snapshot
        self.pool = pool
        self.body: _Body | None = _Body(self, pooled=pooled_body and pool is not None)
        #: pooled memory of small structural tensors, pageable (False) and pinned (True): (slab, used)
        self._slabs: dict[bool, tuple[torch.Tensor, int]] = {}
        #: > 0 while encoding nodes only (inside a body's node extension, or what msgpack refused)
        self._plain = 0
        #: the next str-keyed dict is structural (its values are nodes, not one body value) for
        #: this many levels: the root and batch fields, and dicts directly inside them
        self._structural = 2
        #: buffers taken from ``pool`` (given back by Capture.release), pageable and pinned
        self.pooled: list[torch.Tensor] = []
        self.pinned: list[torch.Tensor] = []
        #: the capture's device-to-host copies of CUDA tensors (codec/device.py), once there is one
        self.staged: StagedCopies | None = None
        #: (raw uint8 memoryview, itemsize for shuffling)
        self.chunks: list[tuple[memoryview | DeferredChunk, int]] = []
        self.owners: list[Any] = []
        #: every tensor and numeric array, as (path, its bytes where the step holds them, dtype,
        #: shape): what :meth:`Capture.tensors` shows
        self.arrays: list[tuple[str, np.ndarray, Any, tuple[int, ...]]] = []
        #: string columns with lone surrogates, packed (whole) when the capture is written
        self.pending: list[Callable[[], None]] = []
        self._active: set[int] = set()

    # ------------------------------------------------------------------ raw data
    def tensor_raw(self, tensor: torch.Tensor) -> tuple[np.ndarray, bool]:
        """A tensor's bytes as a flat uint8 array, and whether they are a fresh copy."""
        flat, fresh = tensor_bytes(tensor)
        raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
        return raw.numpy(), fresh

    def stage(self, tensor: torch.Tensor) -> np.ndarray | None:
        """A capture's CUDA tensor: the copy of its bytes into pinned pooled memory is queued and
        that memory returned, to be read only once :meth:`Capture.finish` waited for the copies
        (:mod:`~rollout_mock.codec.device`). None: the tensor is not staged (copied as before)."""
        if self.pool is None or not self.pool.backend.stages(tensor):
            return None
        if self.staged is None:
            self.staged = StagedCopies(self.pool.backend)
        source = self.staged.device_bytes(tensor)
        if not source.numel():
            return np.empty(0, np.uint8)
        target = self._region(source.numel(), True)
        self.staged.copy(source, target)
        return target.numpy()

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
        self.owners.append(raw)
        self.chunks[index] = (raw.data.cast("B"), 1)

    def add_raw(self, raw: np.ndarray, itemsize: int, row_bytes: int) -> list[int]:
        """Split a flat uint8 array into chunks (whole rows each); returns ``[first, count]``."""
        self.owners.append(raw)
        view = raw.data.cast("B")
        first, step = len(self.chunks), _chunk_step(row_bytes)
        for start in range(0, view.nbytes, step):
            self.chunks.append((view[start: start + step], itemsize))
        return [first, len(self.chunks) - first]

    def plain_node(self, obj: Any) -> Any:
        """``obj`` as nodes only (what a body's node extension holds)."""
        self._plain += 1
        try:
            return self.node(obj)
        finally:
            self._plain -= 1

    def finish(self) -> tuple[list[int] | None, bool]:
        """The body reference (None: no body) and whether it needs surrogate-pass decoding."""
        if self.body is None:
            return None, False
        body, self.body = self.body, None  # no more values; and no encoder <-> body cycle left
        return body.finish(), body.surrogates

    def _copy(self, raw: torch.Tensor) -> torch.Tensor:
        """An owned copy of a flat uint8 tensor: into a pooled buffer when there is a pool.
        torch's copy: multi-threaded, and plain 4 KiB pages (numpy's asks for transparent huge
        pages, which stalls for direct compaction when the page cache is full, as in a dump run)."""
        if self.pool is None:
            return raw.clone()
        copy = self._region(raw.numel(), False)
        copy.copy_(raw)
        return copy

    def _region(self, n: int, pinned: bool) -> torch.Tensor:
        """``n`` bytes of pooled memory (``pinned``: page-locked); small ones side by side,
        64-byte aligned, in pooled 4 MiB slabs: no allocation per tensor."""
        assert self.pool is not None
        held = self.pinned if pinned else self.pooled
        if n < (1 << 16):
            slab, used = self._slabs.get(pinned, (None, 0))
            start = -(-used // 64) * 64
            if slab is None or start + n > slab.numel():
                slab, start = self.pool.take(CHUNK_BYTES, pinned=pinned), 0
                held.append(slab)
            self._slabs[pinned] = (slab, start + n)
            return slab[start: start + n]
        base = self.pool.take(n, pinned=pinned)
        held.append(base)
        return base[:n]

    # ------------------------------------------------------------------ data nodes
    def _tensor(self, tensor: torch.Tensor, path: str) -> Any:
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in TORCH_DTYPES:
            return self._blob(tensor, path, f"tensor dtype {name}")
        _autograd(tensor, path)
        data = self.stage(tensor)
        if data is None:
            flat, fresh = tensor_bytes(tensor)
            raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
            if self.snapshot and not fresh:
                raw = self._copy(raw)
            data = raw.numpy()
        shape = list(tensor.shape)
        self.arrays.append((path, data, tensor.dtype, tuple(shape)))
        row = data.size // shape[0] if shape and shape[0] else 0
        node: dict[str, Any] = {"$": "tensor", "dtype": name, "shape": shape,
                                "c": self.add_raw(data, tensor.element_size(), row)}
        if type(tensor) is torch.nn.Parameter:
            node["param"] = True
        index = cuda_index(tensor)
        if index is not None:  # where it was recorded (device: auto replays it there)
            node["cuda"] = index
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
            raw = self.copy_raw(raw)
        self.arrays.append((path, raw, array.dtype, array.shape))
        row = raw.size // array.shape[0] if array.ndim and array.shape[0] else 0
        node: dict[str, Any] = {"$": "ndarray", "dtype": array.dtype.str, "shape": list(array.shape),
                                "c": self.add_raw(raw, array.dtype.itemsize, row)}
        if not array.flags.writeable:
            node["ro"] = True
        return node

    def _bytes(self, data: bytes | bytearray, tag: str) -> Any:
        if len(data) <= _INLINE_BYTES:
            return {"$": tag, "hex": bytes(data).hex()}
        raw = np.frombuffer(bytes(data) if self.snapshot and tag == "bytearray" else data, np.uint8)
        return {"$": tag, "c": self.add_raw(raw, 1, 0)}

    def _blob(self, obj: Any, path: str, what: str) -> Any:
        _warn_once(f"blob:{what}", f"{path}: {what} is not plain data; it is stored as an opaque "
                   f"pickle that only a trusted load (trusted=True / trust_pickle: true) will read")
        try:
            data = cloudpickle.dumps(obj, protocol=5)
        except Exception as exc:
            raise TypeError(f"{path}: cannot record {what}: {exc!r}") from exc
        raw = np.frombuffer(data, np.uint8)
        return {"$": "pickle", "what": what, "path": path, "c": self.add_raw(raw, 1, 0)}

    def _strings(self, array: np.ndarray) -> dict[str, Any] | None:
        """The string column of an object array of ``str`` (None: not all items are ``str``):
        ``{"$": "strs", "shape", "c": a msgpack array of the strings, "o": n + 1 int64 byte
        offsets of its items, "sp": true with lone surrogates}``. A capture computes the offsets
        (and so the chunk layout) at once and packs the strings when it is written."""
        flat = array.reshape(-1).tolist()
        if not flat or set(map(type, flat)) != {str}:
            return None
        n, surrogates = len(flat), False
        if all(map(str.isascii, flat)):
            lengths = np.fromiter(map(len, flat), dtype=np.int64, count=n)
        else:
            try:
                lengths = np.fromiter((len(s.encode("utf-8")) for s in flat), dtype=np.int64, count=n)
            except UnicodeEncodeError:  # lone surrogates: UTF-8 with surrogatepass
                surrogates = True
                lengths = np.fromiter((len(s.encode("utf-8", "surrogatepass")) for s in flat), dtype=np.int64,
                                      count=n)
        heads = np.where(lengths < 32, 1, np.where(lengths < 256, 2, np.where(lengths < 1 << 16, 3, 5)))
        offsets = np.empty(n + 1, dtype="<i8")
        offsets[0] = len(array_head(n))
        np.cumsum(heads + lengths, out=offsets[1:])
        offsets[1:] += offsets[0]
        total = int(offsets[-1])

        def pack() -> np.ndarray:
            data = _packed_surrogates(flat, total)
            if len(data) != total:  # msgpack's str8/16/32 and array headers are what offsets assume
                raise RuntimeError(f"string column packed to {len(data)} bytes, its offsets say {total}")
            return np.frombuffer(data, np.uint8)

        node: dict[str, Any] = {"$": "strs", "shape": list(array.shape)}
        if not surrogates:  # packed a chunk at a time as the step is written (the capture keeps ``flat``)
            first = len(self.chunks)
            self.chunks.extend((chunk, 1) for chunk in _Column(flat, offsets).chunks())
            node["c"] = [first, len(self.chunks) - first]
        elif self.snapshot:  # the capture keeps the strings; packed by Capture.finish on the writer
            chunks, owners, first = self.chunks, self.owners, len(self.chunks)
            chunks.extend((memoryview(b""), 1) for _ in range(0, total, CHUNK_BYTES))
            node["c"] = [first, len(chunks) - first]

            def fill() -> None:  # (refers to the capture's lists, not to the encoder)
                data = pack()
                owners.append(data)
                view = data.data.cast("B")
                for i, start in enumerate(range(0, total, CHUNK_BYTES)):
                    chunks[first + i] = (view[start: start + CHUNK_BYTES], 1)

            self.pending.append(fill)
        else:
            node["c"] = self.add_raw(pack(), 1, 0)
        node["o"] = self.add_raw(offsets.view(np.uint8), 8, 8)
        if surrogates:
            node["sp"] = True
        return node

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
        if not self._plain:
            routed = self._route(obj, cls, path)
            if routed is not None:
                return routed
        if cls is int:
            return obj if -(1 << 63) <= obj < (1 << 63) else _big_int(obj, path)
        if cls is float:
            return self._float(obj)
        if isinstance(obj, torch.Tensor) and getattr(obj, "is_nested", False):
            return self._nested(obj, cls, path)
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

    def _nested(self, obj: torch.Tensor, cls: type, path: str) -> Any:
        """A nested tensor: jagged ones by their buffers (classes.py), strided ones (the default
        layout, which has no ``shape``) by their components."""
        jagged = encode_class(self, obj, cls, path)
        if jagged is not None:
            return jagged
        try:
            parts = obj.unbind()
        except RuntimeError:  # an exotic nested layout: keep the step, trusted loads only
            return self._blob(obj, path, "a nested tensor that cannot be unbound")
        layout = "jagged" if obj.layout is torch.jagged else "strided"
        return {"$": "nested", "layout": layout, "items": [self.node(t, f"{path}[{i}]") for i, t in enumerate(parts)]}

    def _route(self, obj: Any, cls: type, path: str) -> Any:
        """Where a value goes: the body (an ``mp`` node), or a node of its own (None: the node
        path below, for tensors, arrays, bytes and the classes that keep their structure)."""
        levels, self._structural = self._structural, 0
        if cls is int:
            return obj if -(1 << 63) <= obj < (1 << 63) else _big_int(obj, path)
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
            column = self._strings(obj)
            if column is not None:
                return column
        elif cls in (torch.Tensor, torch.nn.Parameter, np.ndarray, bytes, bytearray) \
                or split_batch(obj) is not None or keeps_structure(obj):
            return None
        assert self.body is not None
        node = self.body.node(obj, path)
        if node is None:  # cycles, nesting msgpack refuses: nodes (cycles become blobs)
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
        keyed = keyed_codec(cls)  # a registered class made of parts (a TensorDict, its non-tensor data)
        if keyed is not None:
            return self._keyed(obj, keyed, path)
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
        """An object whose ``__reduce__`` says "I am this str/int/float/... value" becomes it
        (None: anything else, including a ``__reduce__`` that raises: the object is then
        stored as an opaque blob, or its recording fails with the pickler's error)."""
        reduce = getattr(type(obj), "__reduce__", None)
        if reduce is None or reduce is object.__reduce__:
            return None
        try:
            rv = obj.__reduce__()
        except Exception:  # noqa: BLE001 - not data: the blob path decides (and raises if it must)
            return None
        if type(rv) is tuple and len(rv) == 2 and rv[0] in (str, int, float, bool, bytes, complex) \
                and type(rv[1]) is tuple and all(type(a) in (str, int, float, bool, bytes) for a in rv[1]):
            try:
                return (rv[0](*rv[1]),)
            except Exception:  # noqa: BLE001 - as above
                return None
        return None

    def _keyed(self, obj: Any, keyed: KeyedCodec, path: str) -> Any:
        """The node of a registered class made of parts (:class:`~rollout_mock.batch.KeyedCodec`)."""
        return keyed.write(obj, path, self.node)


def _put_into(target: np.ndarray, start: int, raw: np.ndarray) -> None:
    target[start: start + raw.size] = raw


def _chunk_step(row_bytes: int) -> int:
    """Chunk size for data of ``row_bytes``-byte rows: whole rows, about CHUNK_BYTES."""
    return (CHUNK_BYTES // row_bytes) * row_bytes if 0 < row_bytes <= CHUNK_BYTES else CHUNK_BYTES


class _Body:
    """The msgpack body and the shared small-tensor chunks of one step being encoded; ``enc``
    (the node encoder) provides the chunk list, the copies and what msgpack cannot take."""

    def __init__(self, encoder: _Encoder, *, pooled: bool = False) -> None:
        self.enc = encoder
        self.parts: list[bytes] = []
        self.size = 0
        #: a capture with a pool: the body is copied, as it is packed, into pooled CHUNK_BYTES
        #: buffers (its chunks), not kept as the packers' own bytes (see :meth:`_pack_list`)
        self._pooled: list[np.ndarray] | None = [] if pooled else None
        self._views: list[memoryview] = []  # (of the pooled buffers: a copy into one is a memcpy)
        self.surrogates = False
        self._packer: msgpack.Packer | None = _msgpack(self.default, False)
        self._pack: np.ndarray | None = None
        self._pack_index = -1
        self._pack_used = 0
        self._path = ""
        self._held = np.empty(0, np.uint8)

    def node(self, obj: Any, path: str = "") -> dict[str, Any] | None:
        """``{"$": "mp", "o": offset, "n": length}`` for ``obj``; None when msgpack cannot take
        it (reference cycles, nesting beyond msgpack's limit): the caller encodes it as nodes.
        Errors of our own (a value that cannot be recorded at all) propagate."""
        self._path = path
        assert self._packer is not None, "the body is finished"
        data = None
        if self._pooled is not None and type(obj) is list and len(obj) > 1:
            start = self.size
            if self._pack_list(obj):
                return {"$": "mp", "o": start, "n": self.size - start}
        if type(obj) in _NESTED:
            try:
                data = ormsgpack.packb(obj, option=_PLAIN)
            except TypeError:  # not plain data (see _PLAIN): msgpack's packer decides below
                data = None
        try:
            if data is None:
                data = self._packer.pack(obj)
        except UnicodeEncodeError:  # lone surrogates: the whole body is written surrogate-pass
            self.surrogates = True
            self._packer = _msgpack(self.default, True)
            return self.node(obj, path)
        except (ValueError, OverflowError, TypeError, RecursionError):
            # msgpack's own refusals; the packer's buffer may hold a partial value: a new one
            self._packer = _msgpack(self.default, self.surrogates)
            return None
        node = {"$": "mp", "o": self.size, "n": len(data)}
        self._write(data)
        return node

    def _pack_list(self, items: list[Any]) -> bool:
        """Pack a plain list into the pooled body a slice at a time (about :data:`_SLICE_BYTES`
        each): msgpack's array head, then each slice's items (ormsgpack's packing of the slice
        without its own head: an array is its head and its items, so the bytes are those of
        packing the list whole). ormsgpack's output for a whole 14 MB batch is fresh memory at
        every call (3,400 page faults, a third of its time); the slices' are small and reused,
        and the pooled buffers are the last step's. False, with nothing written, when ormsgpack
        refuses a slice (not plain data): the caller packs the list as before."""
        start, n = self.size, len(items)
        self._write(msgpack.Packer().pack_array_header(n))
        i, step = 0, 1
        while i < n:
            part = items[i: i + step]
            try:
                data = ormsgpack.packb(part, option=_PLAIN)
            except TypeError:
                self.size = start  # (what was copied is overwritten or left out of the chunks)
                return False
            head = 1 if len(part) < 16 else 3 if len(part) < 1 << 16 else 5
            self._write(memoryview(data)[head:])
            i += len(part)
            step = max(1, min(n - i, _SLICE_BYTES * len(part) // max(len(data), 1)))
        return True

    def _write(self, data: bytes | memoryview) -> None:
        """Append packed bytes to the body: to its parts, or copied into its pooled buffers."""
        if self._pooled is None:
            self.parts.append(bytes(data) if isinstance(data, memoryview) else data)
            self.size += len(data)
            return
        source = data if isinstance(data, memoryview) else memoryview(data)
        done, total = 0, len(source)
        while done < total:
            index, offset = divmod(self.size, CHUNK_BYTES)
            if index == len(self._pooled):
                self._pooled.append(self.enc.pack_buffer(CHUNK_BYTES))
                self._views.append(self._pooled[-1].data.cast("B"))
            n = min(CHUNK_BYTES - offset, total - done)
            self._views[index][offset: offset + n] = source[done: done + n]
            done += n
            self.size += n

    def default(self, obj: Any) -> Any:
        cls = type(obj)
        mark = _MARKS.get(cls)
        if mark is not None:
            return [mark, *obj]
        if cls is int:
            return msgpack.ExtType(EXT_INT, obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True))
        if cls is torch.Tensor or cls is torch.nn.Parameter:
            if _plain_tensor(obj):
                return msgpack.ExtType(EXT_TENSOR, self._tensor(obj))
        elif cls is np.ndarray:
            if obj.dtype.kind == "O":
                return [_OBJARRAY, list(obj.shape), *obj.reshape(-1).tolist()]
            if obj.dtype.fields is None and obj.dtype.kind in "biufcmMSU" and obj.dtype.itemsize:
                return self._array(obj)
        node = self.enc.plain_node(obj)
        return msgpack.ExtType(EXT_NODE, msgpack.packb(node, use_bin_type=True, unicode_errors="surrogatepass"))

    # ------------------------------------------------------------------ tensors and arrays
    def _tensor(self, tensor: torch.Tensor) -> bytes:
        shape = tensor.shape
        _autograd(tensor, self._path)
        staged = self.enc.stage(tensor)
        flat = tensor.detach().reshape(-1) if staged is None and tensor.device.type == "cpu" \
            and tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg() else None
        if staged is not None:  # its bytes arrive once the capture's copies are waited for
            raw, fresh = staged, True
        elif flat is not None and flat.numel() and flat.stride(0) == 1:
            # the common case (a plain CPU tensor), without the general path's checks and copies
            raw, fresh = flat.view(torch.uint8).numpy(), False
        else:
            raw, fresh = self.enc.tensor_raw(tensor)
        flags = 2 if type(tensor) is torch.nn.Parameter else 0
        index = cuda_index(tensor)
        if index is not None:  # flag 8: recorded on cuda:<the head's fourth byte>
            flags, index = flags | 8, min(index, 255)
        where = self._place(raw, fresh, tensor.element_size(), shape, later=staged is not None)
        self.enc.arrays.append((f"{self._path}[*]", self._held, tensor.dtype, tuple(shape)))
        return TENSOR_HEAD.pack(_CODES[str(tensor.dtype)[6:]], flags, len(shape), index or 0, *where) \
            + struct.pack(f"<{len(shape)}Q", *shape)

    def _array(self, array: np.ndarray) -> msgpack.ExtType:
        fresh = False
        if not array.flags.c_contiguous:
            array, fresh = np.ascontiguousarray(array), True
        raw = array.reshape(-1).view(np.uint8) if array.size else np.empty(0, np.uint8)
        where = self._place(raw, fresh, array.dtype.itemsize, list(array.shape))
        self.enc.arrays.append((f"{self._path}[*]", self._held, array.dtype, array.shape))
        flags = 0 if array.flags.writeable else 4
        head = TENSOR_HEAD.pack(0, flags, array.ndim, 0, *where)
        return msgpack.ExtType(EXT_NDARRAY, head + struct.pack(f"<{array.ndim}Q", *array.shape)
                               + array.dtype.str.encode("ascii"))

    def _place(self, raw: np.ndarray, fresh: bool, itemsize: int, shape: Any, *,
               later: bool = False) -> tuple[int, int, int]:
        """(first chunk, count, offset) of the bytes: in a shared chunk, or chunks of their own.
        ``later``: the bytes are not there yet (a staged CUDA tensor): a shared chunk gets them
        when the capture is finished on the writer thread."""
        n = raw.nbytes
        self._held = raw  # where the step holds the bytes (Capture.tensors)
        if n == 0:
            return 0, 0, 0
        if n >= SMALL_BYTES:
            if self.enc.snapshot and not fresh:
                raw = self._held = self.enc.copy_raw(raw)
            row = n // shape[0] if shape and shape[0] else 0
            first, count = self.enc.add_raw(raw, itemsize, row)
            return first, count, 0
        start = -(-self._pack_used // PACK_ALIGN) * PACK_ALIGN
        if self._pack is None or start + n > CHUNK_BYTES:
            self._close_pack()
            self._pack = self.enc.pack_buffer(CHUNK_BYTES)
            self._pack_index = self.enc.reserve_chunk()
            start = 0
        assert self._pack is not None
        self._pack[self._pack_used: start] = 0  # the padding: never stale memory in a file
        if later:
            self.enc.pending.append(functools.partial(_put_into, self._pack, start, raw))
        else:
            self._pack[start: start + n] = raw
        self._held = self._pack[start: start + n]
        self._pack_used = start + n
        return self._pack_index, 1, start

    def _close_pack(self) -> None:
        if self._pack is not None:
            self.enc.fill_chunk(self._pack_index, self._pack[: self._pack_used])
            self._pack = None

    def finish(self) -> list[int] | None:
        """Close the last shared chunk and add the body's chunks; returns the body reference."""
        self._close_pack()
        self._packer = None  # (it refers back to this object: no cycle left to collect)
        if self._pooled is not None:  # the chunks add_raw would cut of the joined body
            if not self.size:
                return None
            first = len(self.enc.chunks)
            for index, buffer in enumerate(self._pooled[: -(-self.size // CHUNK_BYTES)]):
                self.enc.add_raw(buffer[: min(CHUNK_BYTES, self.size - index * CHUNK_BYTES)], 0, 0)
            self._pooled, self._views = None, []
            return [first, len(self.enc.chunks) - first]
        if not self.parts:
            return None
        body = np.frombuffer(self.parts[0] if len(self.parts) == 1 else b"".join(self.parts), np.uint8)
        self.parts = []
        return self.enc.add_raw(body, 0, 0)


# --------------------------------------------------------------------------- captures
@dataclass
class Capture:
    """A batch encoded in memory, with owned copies of its data: what the dump-mode call takes
    and the writer thread writes (:func:`encode`). Independent of the original batch: mutating
    the batch after :func:`capture` returns does not change it."""

    root: Any
    chunks: list[tuple[memoryview | DeferredChunk, int]] = field(default_factory=list)
    #: header version 4: the chunks of the msgpack body, and whether it holds lone surrogates
    body: list[int] | None = None
    surrogates: bool = False
    owners: list[Any] = field(default_factory=list, repr=False)
    pool: BufferPool | None = field(default=None, repr=False)
    pooled: list[Any] = field(default_factory=list, repr=False)
    #: work left for the writer (string columns to pack, staged small tensors to put in their
    #: shared chunk); run once by :meth:`finish`
    pending: list[Callable[[], None]] = field(default_factory=list, repr=False)
    #: pinned buffers of the pool (CUDA tensors' bytes) and the copies filling them
    pinned: list[Any] = field(default_factory=list, repr=False)
    staged: StagedCopies | None = field(default=None, repr=False)
    #: (path, bytes, dtype, shape) of every tensor and numeric array (:meth:`tensors`)
    arrays: list[tuple[str, Any, Any, tuple[int, ...]]] = field(default_factory=list, repr=False)

    @property
    def nbytes(self) -> int:
        """Bytes the capture holds: its chunks (a string column its packed size, which it keeps as
        the strings themselves until written; one with lone surrogates counts once packed)."""
        return sum(view.nbytes for view, _ in self.chunks)

    def finish(self) -> None:
        """The writer thread's part: wait until the bytes of CUDA tensors have landed (the copy
        events), then do the pending work (pack string columns, place staged small tensors)."""
        if self.staged is not None:
            self.staged.wait()
        pending = list(self.pending)
        self.pending.clear()
        for fill in pending:
            fill()

    def tensors(self) -> Iterator[tuple[str, torch.Tensor | np.ndarray]]:
        """Each tensor and numeric numpy array of the capture, as ``(path, value)``: a tensor or
        array of its dtype and shape over the capture's own memory (no copy, no encode, no decode),
        valid until :meth:`release`; read-only by contract. ``path`` is the key path (``a.b``,
        ``[3]``); one inside a body value (a list or dict of tensors) is the value's path and
        ``[*]``. Waits for the capture's pending work first (:meth:`finish`). What a scan of the
        step's data (the flight recorder's NaN/inf check) reads in place; the step's Python
        numbers are in its msgpack body and not shown here."""
        self.finish()
        for path, raw, dtype, shape in list(self.arrays):
            if isinstance(dtype, torch.dtype):
                flat = torch.from_numpy(raw) if raw.size else torch.empty(0, dtype=torch.uint8)
                yield path, flat.view(dtype).view(shape)
            else:
                yield path, raw.view(dtype).reshape(shape)

    def floats_finite(self) -> bool:
        """Whether every Python float the capture holds is finite, told without a decode: its
        header's nodes are looked at for the tags a non-finite number takes there (``float``,
        ``npscalar``), and its msgpack body, in place, for the bytes of a non-finite float32/64
        or of those tags inside a node extension (:data:`_NONFINITE`). ``False`` may be a false
        alarm (other bytes of the body that look the same): the caller then looks closer. What
        :meth:`tensors` leaves out of a scan of the step's data."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            if type(node) is dict:
                if node.get("$") in ("float", "npscalar"):
                    return False
                stack.extend(node.values())
            elif type(node) is list:
                stack.extend(node)
        if self.body is None:
            return True
        first, count = self.body
        views = [view for view, _ in self.chunks[first: first + count] if isinstance(view, memoryview)]
        body = views[0] if len(views) == 1 else b"".join(views)
        return _NONFINITE.search(body) is None

    def write(self, file: Sink | Any, *, compression: str = "none", checksums: bool = True) -> int:
        """Write the capture as a step file (:func:`~rollout_mock.codec.format.write_container`);
        :meth:`finish` must have run."""
        return write_container(self.root, list(self.chunks), file, version=BODY_VERSION, body=self.body,
                               surrogates=self.surrogates, compression=compression, checksums=checksums)

    def release(self) -> None:
        """Give pooled buffers back (after the capture was written); it is emptied (its memory
        freed at once) and must not be written again. Waits for copies still in flight (a capture
        released unwritten), so none lands in a buffer the next step uses."""
        if self.staged is not None:
            self.staged.wait()
        for held in (self.chunks, self.owners, self.pending, self.arrays):
            held.clear()
        if self.pool is not None:
            self.pool.give(self.pooled)
            self.pool.give(self.pinned, pinned=True)
        self.pooled, self.pinned = [], []


def _captured(encoder: _Encoder, obj: Any) -> Capture:
    try:
        root = encoder.node(obj)
        body, surrogates = encoder.finish()
    except BaseException:
        if encoder.staged is not None:  # nothing may go on copying into memory nobody waits for
            encoder.staged.close()
            encoder.staged.wait()
        raise
    if encoder.staged is not None:
        encoder.staged.close()  # the call returns with the copies queued
    return Capture(root, encoder.chunks, body, surrogates, encoder.owners, encoder.pool, encoder.pooled,
                   encoder.pending, encoder.pinned, encoder.staged, encoder.arrays)


class CaptureList:
    """A list captured one item at a time: each :meth:`add` encodes one batch as an item of the
    list (its data copied once, its tensors' bytes side by side in the shared chunks, the item
    packed onto the msgpack body), and :meth:`close` hands back the :class:`Capture` of the whole
    list with nothing encoded again: the same bytes as ``capture([first, second, ...])``. What
    the calls of a step beyond its first are captured into, on the calling threads, so that the
    writer thread writes them as one member of a pack (one header; a replay decodes them
    together). Not thread-safe: the caller serialises :meth:`add` and :meth:`close`."""

    def __init__(self, *, pool: BufferPool | None = None) -> None:
        self._encoder = _Encoder(snapshot=True, pool=pool)
        self._items: list[Any] = []
        self._nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        """Bytes of the items added so far: their tensors' and arrays' data and their msgpack bytes."""
        return self._nbytes

    def add(self, obj: Any) -> int:
        """Capture ``obj`` as the next item; its position. On an error (an unrecordable batch)
        nothing of it is listed (bytes it left in a shared chunk stay unreferenced)."""
        encoder, body = self._encoder, self._encoder.body
        if body is None:
            raise RuntimeError("CaptureList.add after close")
        shown, packed, path = len(encoder.arrays), body.size, f"[{len(self._items)}]"
        try:
            # msgpack refuses cycles and deep nesting: that item as nodes, as a whole list would be
            item = body.node(obj, path)
            if item is None:
                item = encoder.plain_node(obj)
        except BaseException:
            del encoder.arrays[shown:]
            raise
        finally:
            if encoder.staged is not None:
                encoder.staged.close()  # the call returns with its copies queued
        self._items.append(item)
        self._nbytes += body.size - packed + sum(raw.nbytes for _, raw, _, _ in encoder.arrays[shown:])
        return len(self._items) - 1

    def close(self) -> Capture:
        """The capture of the list (written by the writer thread like any capture). When every
        item is on the body (the usual case), the body becomes one msgpack array: the list's
        array head goes before the items packed one after the other."""
        encoder, items = self._encoder, self._items
        body = encoder.body
        root: Any = list(items)
        if body is not None and items and all(type(i) is dict and i.get("$") == "mp" for i in items):
            head = msgpack.Packer().pack_array_header(len(items))
            body.parts.insert(0, head)
            body.size += len(head)
            root = {"$": "mp", "o": 0, "n": body.size}
        found, surrogates = encoder.finish()
        return Capture(root, encoder.chunks, found, surrogates, encoder.owners, encoder.pool, encoder.pooled,
                       encoder.pending, encoder.pinned, encoder.staged, encoder.arrays)


def capture(obj: Any, *, pool: BufferPool | None = None) -> Capture:
    """Encode ``obj`` in memory with one copy of its tensor/array data (into ``pool``'s buffers,
    if given: call :meth:`Capture.release` once it is written). ``encode(capture, file)`` then
    writes the same bytes as ``encode(obj, file)`` would have.

    With a pool, CUDA tensors are staged: their copies into pinned buffers are queued on a side
    stream and this returns without waiting for them; the producer's stream waits for them
    instead, and :meth:`Capture.finish` (the writer) before reading the bytes (see
    :mod:`~rollout_mock.codec.device`)."""
    return _captured(_Encoder(snapshot=True, pool=pool, pooled_body=True), obj)


def encode(obj: Any, file: Sink | Any, *, compression: str = "none") -> int:
    """Write ``obj`` to ``file`` (anything with ``.write``; see :class:`Sink`) as a step file;
    returns the bytes written. ``obj`` is a batch, or a :class:`Capture` of one, written as it
    was captured (nothing is encoded again)."""
    if isinstance(obj, Capture):
        obj.finish()
        return obj.write(file, compression=compression)
    return _captured(_Encoder(snapshot=False), obj).write(file, compression=compression)


def encode_bytes(obj: Any, *, compression: str = "none") -> bytes:
    """:func:`encode` into memory."""
    buffer = io.BytesIO()
    encode(obj, buffer, compression=compression)
    return buffer.getvalue()

"""Writing header version 4: plain Python values as one msgpack *body*, string columns, and
small tensors packed together into shared chunks.

The body holds every value below the header's structural nodes (a root dict's values, a batch's
fields, a TensorDict's items) that is not a tensor, a numeric array or a string column, packed
by msgpack's C encoder: ``None``/bools/ints (-2**63..2**64-1)/floats (binary64: NaN payloads and
-0.0 kept)/str/bytes/lists/str-or-not keyed dicts (order kept) are msgpack's own types. Anything
msgpack lacks reaches :meth:`BodyWriter.default` and becomes one of:

* a *marked array* ``[ExtType(k, b""), ...]``: ``k`` = 1 tuple, 3 set, 4 frozenset, 6 numpy
  object array (``[marker, shape, *flat items]``): no nested msgpack, so decoding never recurses;
* ``ExtType(2, signed little-endian bytes)``: an int outside msgpack's 64-bit range;
* ``ExtType(5, TENSOR_HEAD + dims)``: a torch tensor, ``ExtType(7, TENSOR_HEAD + dims + numpy
  dtype string)``: a numeric numpy array. ``TENSOR_HEAD`` is dtype code (index in
  :data:`~rollout_mock.codec.layout.TORCH_DTYPE_NAMES`), flags (1 requires_grad, 2 Parameter,
  4 read-only array), ndim, 0, first chunk, chunk count, byte offset. Tensors under
  :data:`SMALL_BYTES` are copied side by side (64-byte aligned) into shared 4 MiB chunks: one
  CRC, one write and one read serve hundreds of them; larger ones get their own chunks;
* ``ExtType(8, msgpack of a version-2 node)``: everything else (TensorDicts inside lists,
  OrderedDicts, datetimes, opaque pickle blobs ...), through the version-2 node encoder.

``bytearray`` and ``memoryview`` values inside the body are stored as msgpack binaries and load
as ``bytes`` (msgpack packs them without asking); at a structural position they keep their type.
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any

import msgpack
import numpy as np
import torch

from rollout_mock.codec.batches import split_batch
from rollout_mock.codec.classes import keeps_structure
from rollout_mock.codec.layout import CHUNK_BYTES, TORCH_DTYPE_NAMES, TORCH_DTYPES

__all__ = [
    "EXT_FROZENSET", "EXT_INT", "EXT_NDARRAY", "EXT_NODE", "EXT_OBJARRAY", "EXT_SET", "EXT_TENSOR",
    "EXT_TUPLE", "PACK_ALIGN", "SMALL_BYTES", "TENSOR_HEAD", "BodyWriter", "snapshot_ext",
]

EXT_TUPLE, EXT_INT, EXT_SET, EXT_FROZENSET, EXT_TENSOR, EXT_OBJARRAY, EXT_NDARRAY, EXT_NODE = 1, 2, 3, 4, 5, 6, 7, 8
TENSOR_HEAD = struct.Struct("<BBBBIIQ")
#: Tensors and arrays smaller than this share chunks with their neighbours.
SMALL_BYTES = 1 << 20
PACK_ALIGN = 64
_CODES = {name: i for i, name in enumerate(TORCH_DTYPE_NAMES)}
_MARKS: dict[type, msgpack.ExtType] = {tuple: msgpack.ExtType(EXT_TUPLE, b""), set: msgpack.ExtType(EXT_SET, b""),
          frozenset: msgpack.ExtType(EXT_FROZENSET, b"")}
_OBJARRAY = msgpack.ExtType(EXT_OBJARRAY, b"")


def _packer(default: Any, surrogates: bool) -> msgpack.Packer:
    return msgpack.Packer(use_bin_type=True, strict_types=True, default=default, datetime=False,
                          unicode_errors="surrogatepass" if surrogates else None)


class BodyWriter:
    """Collects the msgpack body and the shared chunks of one step being encoded.

    ``encoder`` is the version-2 node encoder (:class:`~rollout_mock.codec.encode._Encoder`): its
    chunk list, snapshot flag and buffer pool are used, and it encodes what msgpack cannot.
    """

    def __init__(self, encoder: Any, *, pickled: bool = False) -> None:
        self.enc = encoder
        #: dump-mode captures: values are in-memory pickles (``{"$": "snap"}``), not msgpack
        self.pickled: list[Any] | None = [] if pickled else None
        self.parts: list[bytes] = []
        self.size = 0
        self.surrogates = False
        self._packer = _packer(self.default, False)
        self._pack: np.ndarray | None = None
        self._pack_index = -1
        self._pack_used = 0

    # ------------------------------------------------------------------ body values
    def node(self, obj: Any) -> dict[str, Any] | None:
        """``{"$": "mp", "o": offset, "n": length}`` for ``obj``; None when msgpack cannot take
        it (reference cycles, nesting beyond msgpack's limit): the caller encodes it as nodes."""
        if self.pickled is not None:
            snap = self._snapshot(obj)
            if snap is not None:
                return snap
        try:
            data = self._packer.pack(obj)
        except UnicodeEncodeError:  # lone surrogates: the whole body is written surrogate-pass
            self.surrogates = True
            self._packer = _packer(self.default, True)
            return self.node(obj)
        except (ValueError, OverflowError, TypeError, RecursionError):
            self._packer = _packer(self.default, self.surrogates)
            return None
        node = {"$": "mp", "o": self.size, "n": len(data)}
        self.parts.append(data)
        self.size += len(data)
        return node

    def default(self, obj: Any) -> Any:
        cls = type(obj)
        mark = _MARKS.get(cls)
        if mark is not None:
            return [mark, *obj]
        if cls is int:
            return msgpack.ExtType(EXT_INT, obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True))
        if cls is torch.Tensor or cls is torch.nn.Parameter:
            if obj.layout is torch.strided and not obj.is_quantized and obj.device.type != "meta" \
                    and not getattr(obj, "is_nested", False) and str(obj.dtype)[6:] in TORCH_DTYPES:
                return self._tensor(obj)
        elif cls is np.ndarray:
            if obj.dtype.kind == "O":
                return [_OBJARRAY, list(obj.shape), *obj.reshape(-1).tolist()]
            if obj.dtype.fields is None and obj.dtype.kind in "biufcmMSU" and obj.dtype.itemsize:
                return self._array(obj)
        node = self.enc.plain_node(obj)
        return msgpack.ExtType(EXT_NODE, msgpack.packb(node, use_bin_type=True, unicode_errors="surrogatepass"))

    def keep(self, value: Any) -> dict[str, Any]:
        """A capture's ``{"$": "snap", "i": index}`` for a value kept as is (a private copy of an
        object array of ``str``: strings are immutable, so copying the pointers is enough)."""
        assert self.pickled is not None
        self.pickled.append(value)
        return {"$": "snap", "i": len(self.pickled) - 1}

    def _snapshot(self, obj: Any) -> dict[str, Any] | None:
        """``{"$": "snap", "i": index}``: ``obj`` pickled in memory by the C pickler (plain values
        cost no Python call; tensors and numeric arrays are copied into the snapshot buffers by
        ``reducer_override``); None when it cannot be pickled."""
        assert self.pickled is not None
        buffer = io.BytesIO()
        try:
            _SnapshotPickler(buffer, self).dump(obj)
        except Exception:  # noqa: BLE001 - unpicklable values take the msgpack path (and its errors)
            return None
        self.pickled.append(buffer.getvalue())
        return {"$": "snap", "i": len(self.pickled) - 1}

    # ------------------------------------------------------------------ tensors and arrays
    def _tensor(self, tensor: torch.Tensor) -> msgpack.ExtType:
        return msgpack.ExtType(EXT_TENSOR, self._tensor_payload(tensor))

    def _tensor_payload(self, tensor: torch.Tensor) -> bytes:
        shape = tensor.shape
        flat = tensor.detach().reshape(-1) if tensor.device.type == "cpu" and tensor.is_contiguous() \
            and tensor.grad is None and not tensor.is_conj() and not tensor.is_neg() else None
        if flat is not None and flat.numel() and flat.stride(0) == 1:
            # the common case (a plain CPU tensor), without the general path's checks and copies
            raw, fresh = flat.view(torch.uint8).numpy(), False
        else:
            raw, fresh = self.enc.tensor_raw(tensor)
        flags = (1 if tensor.requires_grad else 0) | (2 if type(tensor) is torch.nn.Parameter else 0)
        where = self._place(raw, fresh, tensor.element_size(), shape)
        return TENSOR_HEAD.pack(_CODES[str(tensor.dtype)[6:]], flags, len(shape), 0, *where) \
            + struct.pack(f"<{len(shape)}Q", *shape)

    def _array(self, array: np.ndarray) -> msgpack.ExtType:
        fresh = False
        if not array.flags.c_contiguous:
            array, fresh = np.ascontiguousarray(array), True
        raw = array.reshape(-1).view(np.uint8) if array.size else np.empty(0, np.uint8)
        where = self._place(raw, fresh, array.dtype.itemsize, list(array.shape))
        flags = 0 if array.flags.writeable else 4
        head = TENSOR_HEAD.pack(0, flags, array.ndim, 0, *where)
        return msgpack.ExtType(EXT_NDARRAY, head + struct.pack(f"<{array.ndim}Q", *array.shape)
                               + array.dtype.str.encode("ascii"))

    def _place(self, raw: np.ndarray, fresh: bool, itemsize: int, shape: Any) -> tuple[int, int, int]:
        """(first chunk, count, offset) of the bytes: in a shared chunk, or chunks of their own."""
        n = raw.nbytes
        if n == 0:
            return 0, 0, 0
        if n >= SMALL_BYTES:
            if self.enc.snapshot and not fresh:
                raw = self.enc.copy_raw(raw)
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
        self._pack[start: start + n] = raw
        self._pack_used = start + n
        return self._pack_index, 1, start

    def _close_pack(self) -> None:
        if self._pack is not None:
            self.enc.fill_chunk(self._pack_index, self._pack[: self._pack_used])
            self._pack = None

    def finish(self) -> list[int] | None:
        """Close the last shared chunk and add the body's chunks; returns the body reference."""
        self._close_pack()
        if not self.parts:
            return None
        body = np.frombuffer(self.parts[0] if len(self.parts) == 1 else b"".join(self.parts), np.uint8)
        self.parts = []
        return self.enc.add_raw(body, 0, 0)


def snapshot_ext(code: int, payload: bytes) -> Any:
    """What a capture's pickle calls for its tensors and arrays: resolved by the snapshot's own
    unpickler (:meth:`~rollout_mock.codec.bodydec.BodyReader.snapshot_value`), never callable."""
    raise RuntimeError("rollout_mock snapshot pickles are read by Snapshot.materialize only")


class _SnapshotPickler(pickle.Pickler):
    """Protocol-5 pickler whose tensors and numeric arrays become body extensions in the
    snapshot's buffers (so the dump-mode call copies them once, into reusable memory)."""

    def __init__(self, file: Any, body: BodyWriter) -> None:
        super().__init__(file, protocol=5)
        self.body = body

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        if keeps_structure(obj) or split_batch(obj) is not None:
            # pickling would change them (classes.keeps_structure): the msgpack path keeps them
            raise TypeError("encoded by the node encoder, not pickled")
        if cls is torch.Tensor or cls is torch.nn.Parameter:
            if obj.layout is torch.strided and not obj.is_quantized and obj.device.type != "meta" \
                    and not getattr(obj, "is_nested", False) and str(obj.dtype)[6:] in TORCH_DTYPES:
                return snapshot_ext, (EXT_TENSOR, self.body._tensor_payload(obj))
        elif cls is np.ndarray and obj.dtype.kind in "biufcmMSU" and obj.dtype.fields is None and obj.dtype.itemsize:
            ext = self.body._array(obj)
            return snapshot_ext, (ext.code, ext.data)
        return NotImplemented

"""Encoding batches to step files and back.

The public API:

* **Writing.** :func:`encode` (a batch or a :class:`Capture` to a :class:`Sink`),
  :func:`encode_bytes`; :func:`capture` encodes a batch in memory with one copy of its data (what
  the dump-mode call blocks on), so that the writer thread writes it with no further encoding;
  :class:`BufferPool` lends captures reusable memory.
* **Reading.** :func:`open_step` (lazy: header first, then keys and rows on demand) and
  :func:`decode` over a :class:`ByteSource` (:class:`BytesSource`, :class:`FileSource`,
  :class:`MappedSource`, :class:`ReadAheadSource`), a path or bytes; :func:`sniff_version`. Safe
  by default: nothing a file holds can run code, and every failure of a hostile file is a
  :class:`~rollout_mock.errors.CorruptStepError`. ``trusted=True`` unpickles opaque blobs and
  format-1 files (:mod:`~rollout_mock.codec.trusted`, never imported by the safe loader).
* **Classes.** :class:`Batch` (the stand-in for a DataProto-like class that is not imported),
  :func:`register_batch_class`.

The modules, one idea each: :mod:`~rollout_mock.codec.format` (the byte layout, constants and
the header's grammar, and the container writer: the format is specified in its docstring),
:mod:`~rollout_mock.codec.encode` (the encoder: the one write path),
:mod:`~rollout_mock.codec.decode` (nodes, body, chunks back into objects),
:mod:`~rollout_mock.codec.safe` (sources and the bounded read API),
:mod:`~rollout_mock.codec.device` (capture buffers, pinned memory, CUDA staging and placement),
:mod:`~rollout_mock.codec.classes` (framework classes written and rebuilt as data),
:mod:`~rollout_mock.codec.legacy` (format-1 files read as data),
:mod:`~rollout_mock.codec.structure` (the structural comparison of two values: ``diff``, check
mode) and
:mod:`~rollout_mock.codec.trusted` (everything that runs pickle).

Step files name ``rollout_mock.codec._load_v2`` (format 2, for ``pickle.load``) and
``rollout_mock.codec._rebuild_*`` (format 1): those names stay here; the ``_rebuild_*`` functions
are resolved on first use, so importing the codec imports no unpickling code.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

import numpy as np

from rollout_mock.codec import safe as _safe
from rollout_mock.codec.classes import Batch, batch_class_names, is_batch_class, register_batch_class
from rollout_mock.codec.decode import Unpickle
from rollout_mock.codec.device import BufferPool
from rollout_mock.codec.encode import Capture, CaptureList, FileSink, Sink, capture, encode, encode_bytes
from rollout_mock.codec.format import FORMAT_VERSION, PROTOCOL, require_compression
from rollout_mock.codec.safe import (
    ByteSource,
    BytesSource,
    FileSource,
    MappedSource,
    ReadAheadSource,
    SourceLike,
    StepView,
    _load_v2,
    as_source,
    sniff_version,
)

__all__ = [
    "FORMAT_VERSION", "PROTOCOL", "Batch", "BufferPool", "ByteSource", "BytesSource", "Capture", "CaptureList",
    "FileSink", "FileSource", "MappedSource", "ReadAheadSource", "Sink", "SourceLike", "StepView", "as_source",
    "batch_class_names", "capture", "decode", "encode", "encode_bytes", "is_batch_class", "open_step",
    "register_batch_class", "require_compression", "sniff_version", "view_capture",
]

_load_v2.__module__ = "rollout_mock.codec"  # the name format-2 files give pickle.load


def _unpickler(trusted: bool) -> Unpickle | None:
    if not trusted:
        return None
    from rollout_mock.codec.trusted import loads

    return loads


def open_step(source: SourceLike, *, trusted: bool = False, batch_class: type | None = None,
              max_expansion: float | None = None, mapped: bool = False, verify: bool = True) -> StepView:
    """Open a step lazily (reads only the header of a format-2 file); ``mapped``/``verify``: see
    :class:`StepView`; ``trusted``: unpickle opaque blobs and format-1 files."""
    return _safe.open_step(source, unpickle=_unpickler(trusted), batch_class=batch_class,
                           max_expansion=max_expansion, mapped=mapped, verify=verify)


class _Gathered:
    """A step file written to memory as the list of its pieces (no copy of the chunks): a
    ByteSource whose :meth:`map_range` hands out a chunk's own memory."""

    name = "<capture>"

    def __init__(self) -> None:
        self.pieces: list[memoryview] = []
        self.starts: list[int] = []
        self.total = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.readonly:  # the head, the body, padding: copied (tensors over them must be writable)
            view = memoryview(bytearray(view))
        self.pieces.append(view)
        self.starts.append(self.total)
        self.total += view.nbytes
        return view.nbytes

    def size(self) -> int:
        return self.total

    def map_range(self, offset: int, length: int) -> memoryview:
        if offset < 0 or length < 0 or offset + length > self.total:
            raise ValueError(f"bytes {offset}..{offset + length} are past the capture's {self.total}")
        index = max(bisect.bisect_right(self.starts, offset) - 1, 0)
        if length == 0:
            return memoryview(b"")
        start = self.starts[index]
        if offset + length <= start + self.pieces[index].nbytes:
            return self.pieces[index][offset - start: offset - start + length]
        joined = self._joined(index, offset, length)
        if joined is not None:
            return joined
        out = bytearray(length)  # across pieces of different buffers (the head, padding): a copy
        pos = offset
        while pos < offset + length:
            piece, start = self.pieces[index], self.starts[index]
            take = min(offset + length, start + piece.nbytes) - pos
            out[pos - offset: pos - offset + take] = piece[pos - start: pos - start + take]
            pos += take
            index += 1
        return memoryview(out)

    def _joined(self, index: int, offset: int, length: int) -> memoryview | None:
        """The range as one view when its pieces lie end to end in one buffer (the chunks of a
        tensor copied into one pooled buffer): no copy."""
        owner = self.pieces[index].obj
        base = _address(memoryview(owner).cast("B")) if isinstance(owner, np.ndarray) else None
        if base is None:
            return None
        origin = _address(self.pieces[index]) - base - self.starts[index]  # file offset -> buffer offset
        end, j = self.starts[index], index
        while end < offset + length:
            if j >= len(self.pieces) or self.pieces[j].obj is not owner \
                    or _address(self.pieces[j]) - base != origin + end:
                return None
            end += self.pieces[j].nbytes
            j += 1
        return memoryview(owner).cast("B")[origin + offset: origin + offset + length]

    def read_range(self, offset: int, length: int) -> memoryview:
        return self.map_range(offset, length)

    def readinto_range(self, offset: int, buffer: Any) -> None:
        target = memoryview(buffer).cast("B")
        target[:] = self.map_range(offset, target.nbytes)


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if view.nbytes else 0


def view_capture(captured: Capture) -> Any:
    """The batch ``captured`` holds, rebuilt over its own memory: tensors and arrays are views of
    the capture's buffers (no copy of the data, no CRC check: the bytes never left the process),
    valid until :meth:`Capture.release`. The container is written to memory once more and opened
    by the safe decoder: what the flight recorder does to name the places of a step found to hold
    NaN/inf (a suspect step only). A scan reads the capture in place instead
    (:meth:`Capture.tensors`, :meth:`Capture.floats_finite`); the calls of a pack are captured
    into one list as they come (:class:`CaptureList`), never rebuilt. Waits
    for the capture's pending work first (:meth:`Capture.finish`)."""
    gathered = _Gathered()
    captured.finish()
    captured.write(gathered, checksums=False)  # opened unverified: no CRC-32 to compute
    return _safe.open_step(gathered, verify=False).load()


def decode(source: SourceLike, *, trusted: bool = False, keys: Iterable[str] | None = None,
           rows: slice | range | None = None, batch_class: type | None = None,
           max_expansion: float | None = None) -> Any:
    """Decode a step file of format 1 or 2 from a ByteSource, a path or bytes.

    Safe by default: format 2 is decoded without pickle; format 1 by a data-only interpreter of
    the pickle subset rollout_mock wrote. ``trusted=True`` unpickles opaque blobs (format 2) or
    runs plain pickle (format 1). ``keys``/``rows``: only those (a partial load reads only their
    chunks). ``max_expansion``: the allocation bound (default 64x the file size + 1 MiB).
    """
    return _safe.decode(source, unpickle=_unpickler(trusted), keys=keys, rows=rows, batch_class=batch_class,
                        max_expansion=max_expansion)


def __getattr__(name: str) -> Any:
    """``_rebuild_*`` (what ``pickle.load`` of a format-1 file calls) and the format-1 writer
    ``dump_v1``/``dumps_v1`` (tests of old files) come from the trusted module, on first use."""
    if name.startswith("_rebuild_") or name in ("dump_v1", "dumps_v1"):
        from rollout_mock.codec import trusted

        value = trusted.REBUILD_FUNCTIONS.get(name) or getattr(trusted, name, None)
        if value is not None:
            return value
    raise AttributeError(f"module 'rollout_mock.codec' has no attribute {name!r}")

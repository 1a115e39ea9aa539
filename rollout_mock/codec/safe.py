"""Safe loading: the public read API (:func:`open_step`, :func:`decode`, :func:`sniff_version`)
over byte sources, for files that may be hostile.

Every failure of a hostile file becomes a :class:`~rollout_mock.errors.CorruptStepError` naming
the file (never a bare ``ValueError``, ``RecursionError`` or ``MemoryError``); the header is
validated (:func:`~rollout_mock.codec.format.check_tree`) and the data it declares bounded by
the file's size (:func:`~rollout_mock.codec.format.max_expansion`) before anything is allocated.
Nothing here unpickles: a trusted load passes an ``unpickle`` function in (the package's
``open_step``/``decode`` with ``trusted=True`` take it from :mod:`~rollout_mock.codec.trusted`).

Byte sources
============

Random-access byte sources that step files are decoded from.

A :class:`ByteSource` is anything with a ``name``, a ``size()`` and a ``read_range(offset,
length)`` that returns exactly ``length`` bytes (or raises). The decoder reads only the ranges it
needs (the header, then the chunks covering the requested keys and rows), so a lazily opened step
costs one small read. ``readinto_range(offset, buffer)`` is optional: when present, tensor data is
read straight into the tensor's memory (one copy instead of two).

Implementations here: :class:`BytesSource` (bytes in memory), :class:`FileSource` (a local
file, ``os.pread``/``os.preadv``) and :class:`MappedSource` (a local file mapped into memory:
``map_range`` hands out its bytes without reading or copying them, for lazy opens). Storage back
ends may add their own by duck typing.
"""

from __future__ import annotations

import io
import mmap
import os
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rollout_mock.batch import batch_keys, keyed_codec_of_tag, subset
from rollout_mock.codec.decode import ChunkReader, NodeDecoder, Unpickle, normalize_rows
from rollout_mock.codec.format import (
    BODY_VERSION,
    PREFIX,
    PREFIX_HEAD,
    SUFFIX,
    Layout,
    check_tree,
    read_layout,
    ref_raw,
)
from rollout_mock.codec.format import max_expansion as expansion_bound
from rollout_mock.codec.legacy import load_v1
from rollout_mock.errors import CorruptStepError, RolloutMockError, UnsafePathError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = [
    "BODY_FACTOR", "HEAD_BYTES", "ByteSource", "BytesSource", "FileSource", "MappedSource", "ReadAheadSource",
    "SourceLike", "StepView", "as_source", "decode", "open_step", "sniff_version",
]

#: A :class:`FileSource` reads this much of the file's start when it opens (one system call).
HEAD_BYTES = 256 << 10


@runtime_checkable
class ByteSource(Protocol):
    """What the step decoder reads from (see module docstring)."""

    name: str

    def size(self) -> int: ...

    def read_range(self, offset: int, length: int) -> bytes | memoryview: ...


#: What the read API takes as a step: a :class:`ByteSource`, a local path, or the step's bytes.
SourceLike = ByteSource | str | os.PathLike[str] | bytes | bytearray | memoryview

def _short(name: str, offset: int, length: int, got: int, size: int) -> CorruptStepError:
    return CorruptStepError(
        f"{name}: truncated read: wanted {length} bytes at offset {offset}, got {got} "
        f"(the source has {size} bytes); the step file is truncated or corrupt: re-dump it",
        path=name,
    )


class BytesSource:
    """A step held in memory (``bytes``, ``bytearray`` or any buffer)."""

    def __init__(self, data: bytes | bytearray | memoryview, name: str = "<bytes>") -> None:
        self._view = memoryview(data).cast("B")
        self.name = name

    def size(self) -> int:
        return self._view.nbytes

    def read_range(self, offset: int, length: int) -> memoryview:
        if offset < 0 or length < 0 or offset + length > self._view.nbytes:
            raise _short(self.name, offset, length, max(0, self._view.nbytes - offset), self._view.nbytes)
        return self._view[offset: offset + length]

    def readinto_range(self, offset: int, buffer: WriteableBuffer) -> None:
        target = memoryview(buffer).cast("B")
        target[:] = self.read_range(offset, target.nbytes)


class FileSource:
    """A local file read with positional reads (no shared file position: thread-safe)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.name = str(path)
        # O_NONBLOCK: a FIFO planted as a step file must not block the open; only regular files
        # are read (the flag is harmless on them)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(self._fd).st_mode):
                raise UnsafePathError(f"[RolloutMock] {self.path} is not a regular file (a FIFO, device or "
                                      f"directory planted in the dump?); refusing to read it", path=self.path)
            self._size = os.fstat(self._fd).st_size
            # the prefix, container head and header of a step are read in many small pieces:
            # one read serves them (and the whole of a small step)
            self._head = memoryview(os.pread(self._fd, min(self._size, HEAD_BYTES), 0))
            #: whether :meth:`view_range` maps the file (False once a map of it has failed)
            self._mappable = True
        except BaseException:
            os.close(self._fd)
            raise

    def size(self) -> int:
        return self._size

    def read_range(self, offset: int, length: int) -> bytes | memoryview:
        if offset < 0 or length < 0 or offset + length > self._size:
            raise _short(self.name, offset, length, max(0, self._size - offset), self._size)
        if offset + length <= self._head.nbytes:
            return self._head[offset: offset + length]
        buffer = bytearray(length)
        self.readinto_range(offset, buffer)
        return memoryview(buffer)

    def readinto_range(self, offset: int, buffer: WriteableBuffer) -> None:
        target = memoryview(buffer).cast("B")
        total = target.nbytes
        if offset < 0 or offset + total > self._size:
            raise _short(self.name, offset, total, max(0, self._size - offset), self._size)
        if offset + total <= self._head.nbytes:
            target[:] = self._head[offset: offset + total]
            return
        done = 0
        while done < total:
            got = os.preadv(self._fd, [target[done:]], offset + done)
            if got <= 0:
                raise _short(self.name, offset, total, done, self._size)
            done += got

    def view_range(self, offset: int, length: int) -> memoryview:
        """Bytes ``[offset, offset + length)`` as a read-only memory map of the file (no copy),
        for bytes a decoder copies out of and drops (string columns, the body): reading them
        into new memory first writes, then reads again, every byte through the cache (38 MB of
        strings: ~30 ms that way, ~17 ms mapped, on the benchmark machine). The map is released
        when the last view of it is dropped. As with :class:`MappedSource`, a step file must not
        be truncated in place while its bytes are being decoded (SIGBUS); rollout_mock replaces
        step files by rename, never in place.

        Where the file cannot be mapped (``mmap`` raises ``OSError`` or ``ValueError``: a file
        system without mmap support), the bytes are read into new memory instead, for this
        and every later call on this source."""
        if offset < 0 or length <= 0 or offset + length > self._size:
            raise _short(self.name, offset, length, max(0, self._size - offset), self._size)
        if self._mappable:
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            try:
                mapped = mmap.mmap(self._fd, offset + length - start, access=mmap.ACCESS_READ, offset=start)
            except (OSError, ValueError):
                self._mappable = False
            else:
                return memoryview(mapped)[offset - start:]
        buffer = bytearray(length)
        self.readinto_range(offset, buffer)
        return memoryview(buffer).toreadonly()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class MappedSource(FileSource):
    """A local file mapped copy-on-write (``MAP_PRIVATE``): :meth:`map_range` returns a writable
    view of the file's bytes that reads nothing until touched; writing to it changes this
    process's copy only, never the file.

    Tensors built on these views keep the mapping alive after :meth:`close`. A step file must
    not be truncated in place while mapped (touching a page past the new end raises SIGBUS, as
    with any memory map, e.g. safetensors'); rollout_mock never does that to a committed step:
    it writes a new file and renames it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._map: mmap.mmap | None = None
        if self._size:
            try:
                self._map = mmap.mmap(self._fd, self._size, access=mmap.ACCESS_COPY)
            except BaseException:
                os.close(self._fd)
                raise
        self._mapped = memoryview(self._map) if self._map is not None else memoryview(b"")

    def map_range(self, offset: int, length: int) -> memoryview:
        """Bytes ``[offset, offset + length)`` of the file, mapped (no read, no copy)."""
        if offset < 0 or length < 0 or offset + length > self._size:
            raise _short(self.name, offset, length, max(0, self._size - offset), self._size)
        return self._mapped[offset: offset + length]

    def read_range(self, offset: int, length: int) -> bytes | memoryview:
        return self.map_range(offset, length)

    def readinto_range(self, offset: int, buffer: WriteableBuffer) -> None:
        target = memoryview(buffer).cast("B")
        target[:] = self.map_range(offset, target.nbytes)


class ReadAheadSource:
    """Any ByteSource read in blocks of ``block`` bytes: a sequence of chunk reads (a step's
    chunks, in order) costs one request per block instead of one per chunk, for one block of
    extra memory. Small reads (the head, the header, the tail) are served from a few small
    windows of their own, so they never evict the block; reads of a block or more go straight
    through. (Fetching the next block ahead on a thread was measured against a local S3 server
    and gained nothing there: it is not done.)"""

    SMALL = 1 << 20  # reads below this are "small": a window of WINDOW bytes around them
    WINDOW = 256 << 10

    def __init__(self, inner: Any, block: int = 16 << 20) -> None:
        self.inner, self.block, self.name = inner, block, inner.name
        self._block: tuple[int, bytes] = (0, b"")
        self._windows: list[tuple[int, bytes]] = []
        self._lock = threading.Lock()

    def size(self) -> int:
        return int(self.inner.size())

    def _cached(self, offset: int, length: int) -> memoryview | None:
        for start, data in (self._block, *self._windows):
            if start <= offset and offset + length <= start + len(data):
                return memoryview(data)[offset - start: offset - start + length]
        return None

    def read_range(self, offset: int, length: int) -> bytes | memoryview:
        if length >= self.block:
            return self.inner.read_range(offset, length)
        with self._lock:
            hit = self._cached(offset, length)
            if hit is not None:
                return hit
            small = length < self.SMALL
            end = min(self.size(), offset + max(length, self.WINDOW if small else self.block))
            data = bytes(self.inner.read_range(offset, end - offset))
            if small:
                self._windows = [(offset, data), *self._windows[:3]]
            else:
                self._block = (offset, data)
            return memoryview(data)[:length]

    def readinto_range(self, offset: int, buffer: WriteableBuffer) -> None:
        target = memoryview(buffer).cast("B")
        if target.nbytes >= self.block:
            self.inner.readinto_range(offset, target)
        else:
            target[:] = self.read_range(offset, target.nbytes)


def as_source(source: SourceLike) -> ByteSource:
    """Accept a ByteSource, a path, or bytes-like data."""
    if isinstance(source, (str, os.PathLike)):
        return FileSource(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return BytesSource(source)
    if hasattr(source, "read_range") and hasattr(source, "size"):
        return source
    raise TypeError(f"not a byte source: {type(source).__name__} (give a path, bytes or a ByteSource)")


# --------------------------------------------------------------------------- the read API
#: Memory one byte of a version-4 body may become, counted against the allocation bound.
BODY_FACTOR = 63


def sniff_version(prefix: bytes | memoryview) -> int:
    """1 or 2 from the first bytes of a step file (at least 32); CorruptStepError otherwise."""
    head = bytes(prefix[: len(PREFIX_HEAD)])
    if head == PREFIX_HEAD:
        return 2
    if head[:1] == b"\x80" and len(head) >= 2 and 2 <= head[1] <= 5:
        return 1
    raise CorruptStepError(f"not a rollout_mock step file (starts with {head[:8]!r})")


def _corrupt(name: str, exc: BaseException) -> CorruptStepError:
    error = CorruptStepError(
        f"{name}: the step file cannot be decoded: {exc}. It is corrupt or was not written by "
        f"rollout_mock: re-dump the step or restore the dump from a copy.",
        path=name,
    )
    error.__cause__ = exc
    return error


def _guard(where: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``call``; anything but a rollout_mock error becomes a CorruptStepError naming ``where``."""
    try:
        return call(*args, **kwargs)
    except RolloutMockError as exc:
        if exc.path is None:
            exc.path = where
        raise
    except (Exception, RecursionError, MemoryError) as exc:  # hostile input: never leak a bare error
        raise _corrupt(where, exc) from exc


class StepView:
    """A step file opened lazily: the header is read, the data is read by :meth:`load`.

    ``mapped=True`` (local files) maps the file instead of reading it: :meth:`load` returns
    tensors and arrays that *are* the mapped file's pages (no copy, nothing read until touched,
    copy-on-write), so a few keys or rows of a multi-GB step cost milliseconds. ``verify``
    (default) still CRC-checks every chunk :meth:`load` hands out, which reads those chunks;
    ``verify=False`` reads nothing at all, and the view says so: :attr:`verified` is False.
    ``unpickle``: how a trusted load reads opaque pickle blobs and format-1 files (None: the
    safe loader, which refuses blobs and interprets format 1 as data).
    """

    def __init__(self, source: SourceLike, *, unpickle: Unpickle | None = None, batch_class: type | None = None,
                 max_expansion: float | None = None, mapped: bool = False, verify: bool = True) -> None:
        if mapped and isinstance(source, FileSource) and not isinstance(source, MappedSource):
            source = source.path
        if mapped and isinstance(source, (str, os.PathLike)):
            source = _guard(str(source), MappedSource, source)
        self.source = as_source(source)
        self.name = str(getattr(self.source, "name", "<source>"))
        self.unpickle = unpickle
        self.batch_class = batch_class
        #: Whether :meth:`load` checks the CRC-32 of every chunk it returns (False: unchecked).
        self.verified = verify
        size = _guard(self.name, self.source.size)
        prefix = _guard(self.name, self.source.read_range, 0, min(size, len(PREFIX_HEAD)))
        self.format_version = _guard(self.name, sniff_version, prefix)
        self._layout: Layout | None = None
        self._v1: Any = None
        self._v1_loaded = False
        if self.format_version == 2:
            bound = expansion_bound(max_expansion)  # a bad setting is the caller's error, not the file's
            self._layout = _guard(self.name, read_layout, self.source)
            layout = self._layout
            self._used = [0]
            body = -1
            if layout.version >= BODY_VERSION:
                body = 0 if layout.body is None else ref_raw(layout.table, layout.body)
            declared = _guard(self.name, check_tree, layout.root, layout.table, used=self._used, body=body)
            if layout.version >= BODY_VERSION:
                # every chunk (shared small tensors, the body's own), and the objects a body of
                # this size can become (at most ~72 bytes per msgpack byte)
                declared += sum(row[2] for row in layout.table) + BODY_FACTOR * max(body, 0)
            self._layout.declared_raw = declared
            if declared > bound * size + (1 << 20):
                raise CorruptStepError(
                    f"{self.name}: the step declares {declared} bytes of data in a {size}-byte file "
                    f"(more than {bound:g}x + 1 MiB); refusing to allocate it. If the data is "
                    f"legitimately this compressible, raise the limit with max_expansion= or "
                    f"ROLLOUT_MOCK_MAX_EXPANSION.",
                    path=self.name,
                )

    @property
    def trusted(self) -> bool:
        """Whether opaque pickle blobs (and format-1 files) are unpickled."""
        return self.unpickle is not None

    @property
    def nbytes(self) -> int:
        """Raw bytes of the data chunks (tensors, arrays, object-array items) of a format-2 step,
        or the file size (format 1)."""
        if self._layout is not None:
            return self._layout.declared_raw
        return int(self.source.size())

    def file_crc32(self) -> int:
        """The CRC-32 of the whole file as the writer computed it, from the chunk table's CRCs
        and the bytes between chunks (header, padding, suffix): nothing of the data is read.

        Every chunk :meth:`load` uses is checked against its table CRC, so when this value
        matches the manifest's checksum and the load succeeds, the file is exactly the one that
        was written. Format-1 files (no chunk table) are hashed whole.
        """
        import rollout_mock.crc as _crc

        if self._layout is None:
            size = self.source.size()
            value, pos = 0, 0
            while pos < size:
                piece = self.source.read_range(pos, min(16 << 20, size - pos))
                value = _crc.crc32(piece, value)
                pos += len(piece)
            return value & 0xFFFFFFFF
        layout = self._layout
        rows = sorted(self._layout.table, key=lambda row: row[0])
        value, pos = 0, 0
        for offset, stored, _raw, crc, _codec, _shuf in rows:
            start = layout.data_base + offset
            if start < pos:
                raise CorruptStepError(f"{self.name}: chunks overlap; the file is corrupt", path=self.name)
            if start > pos:
                value = _crc.crc32(self.source.read_range(pos, start - pos), value)
            value = _crc.crc32_combine(value & 0xFFFFFFFF, crc, stored)
            pos = start + stored
        size = self.source.size()
        if pos < size:
            value = _crc.crc32(self.source.read_range(pos, size - pos), value)
        return value & 0xFFFFFFFF

    def keys(self) -> list[str]:
        """Top-level keys: batch + non-tensor keys of a batch, a dict's or a keyed batch class's
        (a TensorDict's) keys."""
        if self._layout is not None:
            root = self._layout.root
            if type(root) is dict and root.get("$") == "mp":  # keys live in the body
                return batch_keys(self.load())
            return _root_keys(root)
        return batch_keys(self._load_v1())

    def _load_v1(self) -> Any:
        if not self._v1_loaded:
            data = _guard(self.name, self.source.read_range, 0, self.source.size())
            if self.unpickle is not None:
                self._v1 = _guard(self.name, self.unpickle, bytes(data))
            else:
                self._v1 = _guard(self.name, load_v1, data, name=self.name, batch_class=self.batch_class)
            self._v1_loaded = True
        return self._v1

    def load(self, keys: Iterable[str] | None = None, rows: slice | range | None = None) -> Any:
        """Decode the step, optionally only ``keys`` and the batch rows ``rows``."""
        wanted = None if keys is None else frozenset(keys)
        sel = normalize_rows(rows)
        if self._layout is None:
            return _guard(self.name, subset, self._load_v1(), wanted, sel)
        reader = ChunkReader(self.source, self._layout, verify=self.verified,
                             parallel=isinstance(self.source, FileSource))
        decoder = NodeDecoder(reader, unpickle=self.unpickle, batch_class=self.batch_class, name=self.name)
        layout = self._layout
        decoder.use_body(layout.body, [row[2] for row in layout.table], surrogates=layout.surrogates,
                         table=layout.table, used=list(self._used))
        reader.pending = []
        try:
            result = _guard(self.name, _decode_root, decoder, self._layout.root, wanted, sel)
            _guard(self.name, reader.finish)
        finally:
            reader.close()
        return result


def _root_keys(root: Any) -> list[str]:
    if type(root) is dict:
        tag = root.get("$")
        if tag is None:
            return list(root)
        if (keyed := keyed_codec_of_tag(tag)) is not None:
            return keyed.keys(root)
        if tag == "batch" and root.get("kind") == "dataproto":
            keys: list[str] = []
            for name in ("batch", "non_tensor_batch"):
                field = root.get(name)
                if type(field) is dict and field.get("$") is None:
                    keys += [k for k in field if k not in keys]
                elif type(field) is dict and (keyed := keyed_codec_of_tag(field.get("$"))) is not None:
                    keys += [k for k in keyed.keys(field) if k not in keys]
            return keys
    if type(root) is list:
        keys = []
        for item in root:
            if type(item) is dict and item.get("$") is None:
                keys += [k for k in item if k not in keys]
        return keys
    return []


def _decode_root(decoder: NodeDecoder, root: Any, keys: frozenset[str] | None, rows: slice | None) -> Any:
    if keys is None and rows is None:
        return decoder.value(root)
    if type(root) is dict:
        tag = root.get("$")
        if tag == "mp":  # one body value (a list of samples, ...): decoded, then selected
            return subset(decoder.value(root), keys, rows)
        if tag is None:
            return {k: decoder.value(v, rows) for k, v in root.items() if keys is None or k in keys}
        if keyed_codec_of_tag(tag) is not None:
            return decoder.keyed(root, rows, keys)
        if tag == "batch":
            return decoder.batch(root, rows, keys)
    if type(root) is list:
        items = root if rows is None else [root[i] for i in range(len(root))[rows]]
        return [_decode_root(decoder, x, keys, None) if type(x) is dict and x.get("$") is None
                else decoder.value(x) for x in items]
    return decoder.value(root, rows)


def open_step(source: SourceLike, *, unpickle: Unpickle | None = None, batch_class: type | None = None,
              max_expansion: float | None = None, mapped: bool = False, verify: bool = True) -> StepView:
    """Open a step lazily (reads only the header of a format-2 file); see :class:`StepView`."""
    return StepView(source, unpickle=unpickle, batch_class=batch_class, max_expansion=max_expansion,
                    mapped=mapped, verify=verify)


def decode(source: SourceLike, *, unpickle: Unpickle | None = None, keys: Iterable[str] | None = None,
           rows: slice | range | None = None, batch_class: type | None = None,
           max_expansion: float | None = None) -> Any:
    """Decode a step file of format 1 or 2 from a ByteSource, a path or bytes, safely: format 2
    without pickle, format 1 by a data-only interpreter of the pickle subset rollout_mock wrote
    (``unpickle``: see :class:`StepView`)."""
    view = StepView(source, unpickle=unpickle, batch_class=batch_class, max_expansion=max_expansion)
    return view.load(keys=keys, rows=rows)


def _load_v2(data: bytes) -> Any:
    """What unpickling a format-2 file calls (``rollout_mock.codec._load_v2``): the safe
    decoder over the container."""
    whole = io.BytesIO()
    whole.write(PREFIX(len(data)))
    whole.write(data)
    whole.write(SUFFIX)
    return decode(BytesSource(whole.getbuffer(), "<pickle stream>"))

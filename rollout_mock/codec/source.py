"""Random-access byte sources that step files are decoded from.

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

import mmap
import os
import stat
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rollout_mock.errors import CorruptStepError, UnsafePathError

__all__ = ["HEAD_BYTES", "ByteSource", "BytesSource", "FileSource", "MappedSource", "ReadAheadSource", "as_source"]

#: A :class:`FileSource` reads this much of the file's start when it opens (one system call).
HEAD_BYTES = 256 << 10


@runtime_checkable
class ByteSource(Protocol):
    """What the step decoder reads from (see module docstring)."""

    name: str

    def size(self) -> int: ...

    def read_range(self, offset: int, length: int) -> bytes | memoryview: ...


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

    def readinto_range(self, offset: int, buffer: Any) -> None:
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

    def readinto_range(self, offset: int, buffer: Any) -> None:
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

    def readinto_range(self, offset: int, buffer: Any) -> None:
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

    def read_range(self, offset: int, length: int) -> Any:
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

    def readinto_range(self, offset: int, buffer: Any) -> None:
        target = memoryview(buffer).cast("B")
        if target.nbytes >= self.block:
            self.inner.readinto_range(offset, target)
        else:
            target[:] = self.read_range(offset, target.nbytes)


def as_source(source: Any) -> Any:
    """Accept a ByteSource, a path, or bytes-like data."""
    if isinstance(source, (str, os.PathLike)):
        return FileSource(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return BytesSource(source)
    if hasattr(source, "read_range") and hasattr(source, "size"):
        return source
    raise TypeError(f"not a byte source: {type(source).__name__} (give a path, bytes or a ByteSource)")

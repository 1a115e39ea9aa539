"""Random-access byte sources that step files are decoded from.

A :class:`ByteSource` is anything with a ``name``, a ``size()`` and a ``read_range(offset,
length)`` that returns exactly ``length`` bytes (or raises). The decoder reads only the ranges it
needs (the header, then the chunks covering the requested keys and rows), so a lazily opened step
costs one small read. ``readinto_range(offset, buffer)`` is optional: when present, tensor data is
read straight into the tensor's memory (one copy instead of two).

Implementations here: :class:`BytesSource` (bytes in memory) and :class:`FileSource` (a local
file, ``os.pread``/``os.preadv``). Storage back ends may add their own by duck typing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rollout_mock.errors import CorruptStepError

__all__ = ["ByteSource", "BytesSource", "FileSource", "as_source"]


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
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._size = os.fstat(self._fd).st_size

    def size(self) -> int:
        return self._size

    def read_range(self, offset: int, length: int) -> bytes | memoryview:
        if offset < 0 or length < 0 or offset + length > self._size:
            raise _short(self.name, offset, length, max(0, self._size - offset), self._size)
        buffer = bytearray(length)
        self.readinto_range(offset, buffer)
        return memoryview(buffer)

    def readinto_range(self, offset: int, buffer: Any) -> None:
        target = memoryview(buffer).cast("B")
        total = target.nbytes
        if offset < 0 or offset + total > self._size:
            raise _short(self.name, offset, total, max(0, self._size - offset), self._size)
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


def as_source(source: Any) -> Any:
    """Accept a ByteSource, a path, or bytes-like data."""
    if isinstance(source, (str, os.PathLike)):
        return FileSource(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return BytesSource(source)
    if hasattr(source, "read_range") and hasattr(source, "size"):
        return source
    raise TypeError(f"not a byte source: {type(source).__name__} (give a path, bytes or a ByteSource)")

"""Reading a whole (format-1) step file through the unpickler while hashing every byte of it."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from rollout_mock.storage.digest import _CHUNK, _PIECE, Digest

__all__ = ["HashingReader", "ReadResult", "T", "read_hashed"]

T = TypeVar("T")


class HashingReader:
    """A minimal binary file object for the C unpickler that hashes everything it reads."""

    def __init__(self, file: BinaryIO | io.RawIOBase, digest: Digest) -> None:
        self._file = file
        self.digest = digest
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self.digest.update(data)
        self.consumed += len(data)
        return data

    def readline(self, size: int = -1) -> bytes:
        data = self._file.readline(size)
        self.digest.update(data)
        self.consumed += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        step = _CHUNK if self.digest.threaded else _PIECE
        total = 0
        while total < view.nbytes:
            chunk = view[total : total + step]
            count = self._file.readinto(chunk)  # type: ignore[union-attr]  # opened buffering=0: raw
            if not count:
                break
            self.digest.update(chunk[:count])
            total += count
        self.consumed += total
        return total


@dataclass(frozen=True)
class ReadResult:
    """What :func:`read_hashed` saw: the bytes ``body`` parsed, the file's total, its digests."""

    parsed: int
    total: int
    checksum: str
    hmac: str | None

    @property
    def trailing(self) -> int:
        return self.total - self.parsed


def read_hashed(
    path: Path, body: Callable[[HashingReader], T], *, hmac_key: bytes | None = None, mac_context: bytes = b""
) -> tuple[T, ReadResult]:
    """Run ``body`` over ``path`` while hashing every byte of the file.

    Bytes left unread by ``body`` are read and hashed too, so trailing data is caught by the
    checksum and reported in :attr:`ReadResult.trailing`.
    """
    with open(path, "rb", buffering=0) as raw:
        reader = HashingReader(raw, Digest(hmac_key, mac_context))
        try:
            result = body(reader)
        except BaseException:
            reader.digest.finish()
            raise
        parsed = reader.consumed
        while reader.read(_CHUNK if reader.digest.threaded else _PIECE):
            pass
        checksum, mac = reader.digest.finish()
    return result, ReadResult(parsed, reader.consumed, checksum, mac)

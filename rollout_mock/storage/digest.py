"""Checksums and signatures, computed once, by the store, whatever the backend: the CRC-32 of a
step's bytes and the HMAC-SHA256 that binds a signed step to its stream and step
(:func:`mac_context`), while the bytes stream out (:class:`HashingWriter`, the sink the codec
writes into) or in (:func:`read_hashed`, :func:`source_digest`).

With ISA-L's CRC-32 (:mod:`rollout_mock.crc`, ~12 GB/s on one core) and no HMAC, the checksum
runs inline, on 1 MiB pieces just before they are written (or just after they are read), while
they are in the CPU cache: measured, that costs less than handing buffers to a thread. With zlib's
CRC-32 (the fallback, 2-7 GB/s) or an HMAC, large buffers are hashed on a helper thread so the
hashing overlaps with the I/O (``zlib.crc32``, ISA-L and ``hmac`` release the GIL).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import io
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import rollout_mock.crc as _crc

if TYPE_CHECKING:  # pragma: no cover
    from _typeshed import ReadableBuffer, WriteableBuffer

    from rollout_mock.codec.safe import ByteSource

__all__ = ["MAC_ALGORITHM", "Digest", "HashingReader", "HashingWriter", "ReadResult", "file_digest", "mac_context",
           "read_hashed", "source_digest"]

T = TypeVar("T")

MAC_ALGORITHM = "hmac-sha256"


def mac_context(stream_key: str, step: int) -> bytes:
    """What a step's MAC covers besides its bytes: swapping signed files between steps or
    streams (or entries between manifests) breaks the signature."""
    return b"rollout_mock/step\x00" + stream_key.encode("utf-8") + b"\x00" + str(int(step)).encode() + b"\x00"

_INLINE_LIMIT = 1 << 20  # threaded digests hash buffers below this on the calling thread
_CHUNK = 16 << 20  # threaded digests: large reads are split so hashing chunk k overlaps reading k+1
_PIECE = 1 << 20  # inline digests: bytes hashed and written (or read and hashed) at a time


class Digest:
    """CRC-32 of everything fed to it, and HMAC-SHA256 over ``context`` + the bytes when ``key``
    is given (reported as ``"hmac-sha256:<hex>"``).

    ``threaded`` (default: only when the CRC is zlib's or an HMAC is computed): large buffers
    are hashed on a helper thread, in order; :meth:`finish` waits for them. A buffer handed to
    :meth:`update` must not change until :meth:`finish` returns. Otherwise :meth:`update`
    hashes on the calling thread before it returns.
    """

    def __init__(self, key: bytes | None = None, context: bytes = b"", *, threaded: bool | None = None) -> None:
        self._crc = 0
        self._length = 0  # bytes fed so far (for prepend_known)
        self._mac = hmac.new(key, context, digestmod=hashlib.sha256) if key else None
        #: whether large buffers go to a helper thread (see the class docstring).
        self.threaded = (not _crc.FAST or key is not None) if threaded is None else threaded
        self._queue: queue.Queue[memoryview | None] | None = None
        self._thread: threading.Thread | None = None
        self._pending = 0
        self._idle = threading.Condition()
        self._error: BaseException | None = None

    def _feed(self, data: Any) -> None:
        self._crc = _crc.crc32(data, self._crc)
        if self._mac is not None:
            self._mac.update(data)

    def _work(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if self._error is None:
                    self._feed(item)
            except BaseException as exc:  # surfaced by finish()
                self._error = exc
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _drain(self) -> None:
        if self._thread is None:
            return
        with self._idle:
            while self._pending:
                self._idle.wait()

    def update(self, data: ReadableBuffer) -> None:
        view = memoryview(data)
        self._length += view.nbytes
        if not self.threaded or (view.nbytes < _INLINE_LIMIT and not self._pending):
            # Inline only when the helper is idle (order is kept without waiting for it);
            # otherwise small pieces queue behind the large ones.
            self._feed(view)
            return
        if self._thread is None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._work, name="rollout-mock-digest", daemon=True)
            self._thread.start()
        with self._idle:
            self._pending += 1
        assert self._queue is not None
        self._queue.put(view)

    @property
    def needs_bytes(self) -> bool:
        """Whether every byte must be fed (an HMAC); otherwise :meth:`update_known` may be used."""
        return self._mac is not None

    def update_known(self, crc: int, length: int) -> None:
        """Append ``length`` bytes whose CRC-32 the caller already computed (no HMAC only)."""
        if self._mac is not None:
            raise ValueError("an HMAC needs the bytes themselves: use update()")
        self._drain()
        self._crc = _crc.crc32_combine(self._crc & 0xFFFFFFFF, crc, length)
        self._length += length

    def prepend_known(self, crc: int, length: int) -> None:
        """Put ``length`` bytes whose CRC-32 is ``crc`` *before* everything fed so far (a file
        whose head is written last; no HMAC only)."""
        if self._mac is not None:
            raise ValueError("an HMAC needs the bytes in order: use update()")
        self._drain()
        self._crc = _crc.crc32_combine(crc, self._crc & 0xFFFFFFFF, self._length)
        self._length += length

    def finish(self) -> tuple[str, str | None]:
        """Wait for pending hashing and return ``("crc32:xxxxxxxx", hmac_hex_or_None)``."""
        self._drain()
        if self._thread is not None and self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        mac = f"{MAC_ALGORITHM}:{self._mac.hexdigest()}" if self._mac is not None else None
        return f"crc32:{self._crc & 0xFFFFFFFF:08x}", mac


class HashingWriter:
    """The sink a step is encoded into (a :class:`~rollout_mock.codec.encode.FileSink`): it hashes
    and counts what goes through to a backend's upload (``write``; ``writev`` and
    ``reserve``/``write_at`` when the upload has them).

    ``ENOSPC`` from the upload is recorded in :attr:`disk_full` and later writes are only counted,
    so that :attr:`size` ends up as the number of bytes the whole object needs; :meth:`finish`
    raises it.
    """

    def __init__(self, upload: Any, digest: Digest) -> None:
        self.upload = upload
        self.digest = digest
        self.size = 0
        self.disk_full: OSError | None = None
        self._writev = getattr(upload, "writev", None)
        self._can_reserve = hasattr(upload, "reserve") and hasattr(upload, "write_at")
        self._head_length: int | None = None  # see reserve_head

    def _guarded(self, run: Callable[[], None]) -> None:
        """Run a write unless the disk filled up earlier; ENOSPC is recorded, not raised."""
        if self.disk_full is not None:
            return
        try:
            run()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            self.disk_full = exc

    def write(self, data: ReadableBuffer) -> int:
        view = memoryview(data).cast("B")
        total = view.nbytes
        # inline digests: hash a piece, then write it while it is still in the CPU cache
        step = total if self.digest.threaded or total <= _PIECE else _PIECE

        def run() -> None:
            for start in range(0, total, step) if total else ():
                piece = view[start : start + step]
                self.digest.update(piece)
                self.upload.write(piece)

        self._guarded(run)
        self.size += total
        return total

    def reserve_head(self, length: int) -> bool:
        """Leave the first ``length`` bytes of an empty object to :meth:`write_head` (called
        last), so the body can be written before the head's contents are known. False (nothing
        done) when the digest needs every byte in order (an HMAC), something was written already,
        or the upload cannot write at an offset."""
        if self.digest.needs_bytes or self.size or self._head_length is not None or not self._can_reserve:
            return False
        if not self.upload.reserve(length):
            return False
        self._head_length = length
        self.size += length
        return True

    def write_unhashed(self, data: ReadableBuffer) -> int:
        """Write bytes the caller will account for with ``digest.update_known`` (in file order)."""
        view = memoryview(data).cast("B")
        self._guarded(lambda: self.upload.write(view))
        self.size += view.nbytes
        return view.nbytes

    def write_head(self, data: ReadableBuffer) -> None:
        """Write the head reserved by :meth:`reserve_head` (exactly its length) and put its
        CRC-32 in front of the digest."""
        view = memoryview(data).cast("B")
        if view.nbytes != self._head_length:
            raise ValueError(f"head of {view.nbytes} bytes, {self._head_length} reserved")
        self._guarded(lambda: self.upload.write_at(view, 0))
        self.digest.prepend_known(_crc.crc32(view) & 0xFFFFFFFF, view.nbytes)
        self._head_length = None

    def write_vector(self, pieces: list[tuple[ReadableBuffer, int | None]]) -> int:
        """Write ``(data, crc or None)`` pieces in order with as few calls as possible; a given
        CRC is taken as the piece's (no second pass unless an HMAC needs the bytes), the other
        pieces are hashed."""
        views = [memoryview(data).cast("B") for data, _ in pieces]
        for view, (_, crc) in zip(views, pieces, strict=True):
            if crc is None or self.digest.needs_bytes:
                self.digest.update(view)
            else:
                self.digest.update_known(crc, view.nbytes)

        def run() -> None:
            if self._writev is not None:
                self._writev(views)
                return
            for view in views:
                self.upload.write(view)

        self._guarded(run)
        total = sum(view.nbytes for view in views)
        self.size += total
        return total

    def write_known(self, data: ReadableBuffer, crc: int) -> int:
        """Write ``data`` whose CRC-32 is ``crc`` (computed by the caller): no second pass over
        the bytes unless an HMAC needs them."""
        if self.digest.needs_bytes:
            return self.write(data)
        total = self.write_unhashed(data)
        self.digest.update_known(crc, total)
        return total

    def finish(self) -> tuple[str, str | None]:
        """The checksum and MAC of everything written (raises a recorded ENOSPC first)."""
        result = self.digest.finish()  # (also stops a helper thread)
        if self.disk_full is not None:
            raise self.disk_full
        return result


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

    def readinto(self, buffer: WriteableBuffer) -> int:
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


def source_digest(source: ByteSource, hmac_key: bytes | None = None, context: bytes = b"") -> tuple[str, str | None]:
    """Checksum (and HMAC over ``context`` + bytes) of an opened byte source, read in pieces."""
    digest = Digest(hmac_key, context)
    size, pos = source.size(), 0
    while pos < size:
        piece = source.read_range(pos, min(16 << 20, size - pos))
        digest.update(piece)
        pos += len(piece)
    return digest.finish()


def file_digest(path: Path, hmac_key: bytes | None = None, context: bytes = b"") -> tuple[str, str | None]:
    """Checksum (and HMAC over ``context`` + bytes) of a whole file, streamed."""
    digest = Digest(hmac_key, context)
    with open(path, "rb", buffering=0) as file:
        while chunk := file.read(16 << 20):
            digest.update(chunk)
    return digest.finish()

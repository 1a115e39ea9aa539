"""CRC-32 of a step file's bytes, and the HMAC-SHA256 that binds a signed step to its stream and
step (:func:`mac_context`)."""

from __future__ import annotations

import hashlib
import hmac
import queue
import threading
from typing import Any

import rollout_mock.crc as _crc

__all__ = ["MAC_ALGORITHM", "Digest", "mac_context"]

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

    def update(self, data: Any) -> None:
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

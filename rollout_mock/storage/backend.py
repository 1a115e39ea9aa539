"""The byte interface a storage backend implements, the defaults of its optional members, and
the in-memory backend (its smallest complete implementation).

A backend stores **objects addressed by a relative path** (``train/step_000003.pkl``,
``manifest.json``) and nothing more: it never sees a step, a manifest, a checksum or a key.
Everything a dump *means* (file names, the index, the codec, CRC-32 and HMAC, overwrite
protection, retention, verified loads) is the one :class:`~rollout_mock.storage.store.Store`
above it. ``docs/contributing.md`` ("Adding a storage backend") walks through writing one;
:mod:`rollout_mock.storage.testing` is the conformance suite that checks it.

**Required** (:class:`ByteBackend`, five methods):

* ``read(rel, start=0, end=None)``: the bytes ``[start:end)`` of an object (slice semantics:
  fewer bytes past its end), or None if it does not exist;
* ``create(rel, data)``: write an object whole, atomically, **only if it does not exist**, and
  say whether it did (a step becomes visible through this conditional write, so two writers of
  one step cannot both succeed; the default locks rest on it too);
* ``replace(rel, data)``: write an object whole, atomically, whether or not it exists;
* ``listdir(rel_dir)``: the names directly under ``rel_dir`` (empty if none);
* ``remove(rels)``: delete many objects (absent ones are fine).

Every ``rel`` is a plain relative path (``a/b.json``): refuse anything else with
:func:`~rollout_mock.storage.paths.check_relpath`.

**Optional** (:class:`BackendDefaults` has a default for each; a backend that subclasses it
inherits them, and the store fills them in for one that does not): ``where`` (a location for
messages), ``size``, ``signature`` (changes when an object is replaced), ``open_upload``
(a streamed write: the default buffers the object and ``replace`` s it), ``open_source`` (ranged
reads for the decoder: the default uses ``read``), ``local_path``, ``lock`` / ``unlock`` /
``lock_lost`` (the default is a lease object taken with ``create``, renewed by a heartbeat),
``create_unsynced`` and ``sync`` (a create that may be made durable later), ``recover`` (remove
what interrupted writes left), ``prune_dirs`` and ``reopen``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rollout_mock.errors import CorruptStepError, LockedError, ManifestError
from rollout_mock.jsonio import loads_bounded
from rollout_mock.storage.paths import check_relpath
from rollout_mock.text import logger, short_repr

if TYPE_CHECKING:  # pragma: no cover
    from _typeshed import WriteableBuffer

    from rollout_mock.codec.safe import ByteSource

__all__ = ["OPTIONAL_MEMBERS", "BackendDefaults", "BackendSource", "ByteBackend", "Lease", "MemoryBackend",
           "Upload", "with_defaults"]


@runtime_checkable
class ByteBackend(Protocol):
    """The five members every backend has (see the module docstring for the rules)."""

    def read(self, rel: str, start: int = 0, end: int | None = None) -> bytes | None:
        """Bytes ``[start:end)`` of ``rel`` (``end=None``: to its end), or None if absent."""
        ...

    def create(self, rel: str, data: bytes) -> bool:
        """Write ``rel`` whole and atomically only if it is absent; False (nothing written) if not."""
        ...

    def replace(self, rel: str, data: bytes) -> None:
        """Write ``rel`` whole and atomically, created or overwritten."""
        ...

    def listdir(self, rel_dir: str) -> list[str]:
        """Names directly under ``rel_dir`` (``""``: the root); empty if there are none."""
        ...

    def remove(self, rels: list[str]) -> None:
        """Delete these objects, in as few requests as the backend allows; absent ones are fine."""
        ...


class Upload(Protocol):
    """A streamed write of one object (:meth:`BackendDefaults.open_upload`): nothing is visible
    until :meth:`commit`, and :meth:`abort` leaves nothing. An upload may also offer
    ``writev(views)`` (several buffers in one call), and ``reserve(length) -> bool`` with
    ``write_at(data, offset)`` (leave the head for last); the store uses them when present."""

    def write(self, data: memoryview) -> None:
        """Append all of ``data``."""
        ...

    def commit(self) -> None:
        """Make the object appear, whole."""
        ...

    def abort(self) -> None:
        """Discard what was written."""
        ...


class _BufferedUpload:
    """The default upload: the object collected in memory, then one ``replace``."""

    def __init__(self, backend: ByteBackend, rel: str) -> None:
        self.backend, self.rel = backend, rel
        self.parts: list[bytes] = []

    def write(self, data: memoryview) -> None:
        self.parts.append(bytes(data))

    def commit(self) -> None:
        data, self.parts = b"".join(self.parts), []
        self.backend.replace(self.rel, data)

    def abort(self) -> None:
        self.parts = []


class BackendSource:
    """An object read with ranged ``read`` calls (the default ``open_source``): what the step
    decoder reads from (a :class:`~rollout_mock.codec.safe.ByteSource`)."""

    def __init__(self, backend: ByteBackend, rel: str, name: str, size: int) -> None:
        self.backend, self.rel, self.name, self._size = backend, rel, name, size
        self.requests = 0
        self.bytes_read = 0

    def size(self) -> int:
        return self._size

    def read_range(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self._size:
            raise CorruptStepError(f"{self.name}: read of {length} bytes at {offset} is past the end "
                                   f"({self._size} bytes): the object is truncated or corrupt", path=self.name)
        data = self.backend.read(self.rel, offset, offset + length) if length else b""
        self.requests += 1
        got = 0 if data is None else len(data)
        self.bytes_read += got
        if data is None or got != length:
            raise CorruptStepError(f"{self.name}: short read ({got} of {length} bytes at {offset}): the object "
                                   f"was truncated or removed while being read", path=self.name)
        return data

    def readinto_range(self, offset: int, buffer: WriteableBuffer) -> None:
        target = memoryview(buffer).cast("B")
        target[:] = self.read_range(offset, target.nbytes)


#: A lease object larger than this is garbage (counts as expired).
_LEASE_BYTES = 1 << 16


class Lease:
    """A lock held as a small object: an owner id and an expiry, taken with a conditional
    ``create`` and renewed by a heartbeat thread (the default ``lock`` of a backend).

    * **take**: create the object only if absent. If it exists and has not expired, it has a
      live holder: :class:`LockedError` naming it. If it expired (its holder died), it is removed
      and the create retried once.
    * **heartbeat**: every ``ttl / 3`` seconds the owner re-reads it; if it still names this owner
      it is rewritten with a new expiry, otherwise the lease is *lost* (:attr:`lost` says why).
    * **release**: removed, if it still names this owner.

    Limits (best-effort): expiry compares the holder's and the taker's wall clocks, so clocks must
    agree to well within ``ttl``; a holder stalled for longer than ``ttl`` can lose its lease and
    notice only at its next heartbeat; taking over an expired lease is remove-then-create.
    """

    def __init__(self, backend: ByteBackend, rel: str, *, holder: str, where: str, ttl: float) -> None:
        self.backend, self.rel, self.holder, self.where, self.ttl = backend, rel, holder, where, ttl
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        now = time.time()
        return json.dumps({"owner": self.owner, "holder": self.holder, "pid": os.getpid(),
                           "host": socket.gethostname(), "renewed_at": now, "expires_at": now + self.ttl}).encode()

    @staticmethod
    def _expiry(record: dict[str, Any]) -> float:
        """``expires_at`` as a float; anything else (a string, a bool, NaN, an int too large for a
        float: a forged or damaged lease) counts as expired (0.0)."""
        value = record.get("expires_at")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return 0.0
        try:
            number = float(value)
        except OverflowError:
            return 0.0
        return number if math.isfinite(number) else 0.0

    def _current(self) -> dict[str, Any] | None:
        data = self.backend.read(self.rel, 0, _LEASE_BYTES + 1)
        if data is None:
            return None
        try:
            value = loads_bounded(data, where=self.where, max_bytes=_LEASE_BYTES)
            return value if isinstance(value, dict) else {}
        except ManifestError:
            return {}  # garbage: treated as expired

    def _describe(self, record: dict[str, Any]) -> str:
        who = record.get("holder") or record.get("owner") or "unknown"
        left = max(self._expiry(record) - time.time(), 0)
        return f"{self.where} is held by {short_repr(who, 120)} (the lease expires in {left:.0f} s unless renewed)"

    def try_take(self) -> dict[str, Any] | None:
        """Take the lease; None on success, else the live holder's record."""
        for _ in range(2):
            if self.backend.create(self.rel, self._body()):
                return None
            current = self._current()
            if current is None:
                continue  # released between our create and read: try again
            if self._expiry(current) > time.time():
                return current
            logger.warning("[RolloutMock] taking over the expired lease %s (held by %s)", self.where,
                           short_repr(current.get("owner", "unknown"), 80))
            self.backend.remove([self.rel])
        current = self._current()
        return current if current is not None else {"owner": "unknown"}

    def take(self, *, wait: float = 0.0) -> Lease:
        """Take the lease, waiting up to ``wait`` seconds for a live holder to release it."""
        deadline = time.monotonic() + wait
        delay = 0.02
        while (holder := self.try_take()) is not None:
            if time.monotonic() >= deadline:
                raise LockedError(self._describe(holder), path=self.where)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        self._thread = threading.Thread(target=self._beat, name="rollout-mock-lease", daemon=True)
        self._thread.start()
        return self

    def renew(self) -> bool:
        """Extend the lease if it is still ours; otherwise mark it lost and return False."""
        current = self._current()
        if current is None or current.get("owner") != self.owner:
            self.lost = (f"{self.where} now names {None if current is None else short_repr(current.get('owner'), 80)}, "
                         f"not this writer ({self.owner}): it expired and was taken over")
            return False
        self.backend.replace(self.rel, self._body())
        return True

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                if not self.renew():
                    return
            except Exception as exc:  # a transient store error: try again next beat
                logger.warning("[RolloutMock] renewing %s failed: %s", self.where, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.lost is None:
            current = self._current()
            if current is not None and current.get("owner") == self.owner:
                self.backend.remove([self.rel])


class BackendDefaults:
    """The optional members of a backend, each written with the five required ones (see the
    module docstring). Subclass it and override what your storage does better."""

    #: seconds a default lock (a :class:`Lease`) lives without a heartbeat
    lease_ttl: float = 60.0

    # the required members, implemented by subclasses (declared for the defaults below)
    def read(self, rel: str, start: int = 0, end: int | None = None) -> bytes | None:
        raise NotImplementedError

    def create(self, rel: str, data: bytes) -> bool:
        raise NotImplementedError

    def replace(self, rel: str, data: bytes) -> None:
        raise NotImplementedError

    def listdir(self, rel_dir: str) -> list[str]:
        raise NotImplementedError

    def remove(self, rels: list[str]) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ optional
    def where(self, rel: str) -> str:
        """A human-readable location (path or URL) of ``rel`` (the root for ``""``)."""
        return f"{type(self).__name__}:{rel}"

    def size(self, rel: str) -> int | None:
        """The size of ``rel`` in bytes, or None if absent."""
        data = self.read(rel)
        return None if data is None else len(data)

    def signature(self, rel: str) -> Hashable | None:
        """Something that changes whenever ``rel`` is replaced (None if absent). The default reads
        the object; a backend with cheap metadata (mtime, ETag, a version) overrides it."""
        data = self.read(rel)
        return None if data is None else (len(data), hash(data))

    def open_upload(self, rel: str) -> Upload:
        """A streamed write of ``rel`` that appears whole at ``commit`` (default: buffered in
        memory, then one ``replace``)."""
        return _BufferedUpload(self, rel)

    def open_source(self, rel: str, *, mapped: bool = False) -> ByteSource:
        """A :class:`~rollout_mock.codec.safe.ByteSource` over ``rel`` (ranged reads);
        ``mapped``: a memory-mapped local file where the backend has one. FileNotFoundError if
        absent."""
        size = self.size(rel)
        if size is None:
            raise FileNotFoundError(self.where(rel))
        return BackendSource(self, rel, self.where(rel), size)

    def local_path(self, rel: str) -> Path | None:
        """The local file of ``rel`` (checked to stay inside the root), or None."""
        return None

    def lock(self, rel: str, holder: str, *, wait: float = 0.0) -> Any:
        """Take the lock object ``rel`` for ``holder`` (a description of this writer), waiting up
        to ``wait`` seconds; :class:`LockedError` describing the current holder if it stays
        held. Returns the handle :meth:`unlock` and :meth:`lock_lost` take. Default: a
        :class:`Lease`."""
        return Lease(self, rel, holder=holder, where=self.where(rel), ttl=self.lease_ttl).take(wait=wait)

    def unlock(self, handle: Any) -> None:
        handle.release()

    def lock_lost(self, handle: Any) -> str | None:
        """Why a lock held since :meth:`lock` was lost (an expired lease), or None."""
        return getattr(handle, "lost", None)

    def create_unsynced(self, rel: str, data: bytes) -> bool:
        """Like ``create``, but the object may be lost (never torn) by a power cut until
        :meth:`sync`: a backend with a costly flush defers it."""
        return self.create(rel, data)

    def sync(self) -> None:
        """Make every ``create_unsynced`` so far durable."""
        return None

    def recover(self, rel_dir: str, names: Callable[[str], bool]) -> None:
        """Remove what interrupted writes of the objects named ``names(name)`` in ``rel_dir``
        left (temporary files); the store calls it holding the locks of those objects."""
        return None

    def prune_dirs(self, rel_dirs: list[str]) -> None:
        """Remove these directories if empty (backends without directories: nothing)."""
        return None

    def reopen(self) -> BackendDefaults:
        """A second handle on the same objects, as another process would have."""
        return self


#: The members :class:`BackendDefaults` supplies (a backend of its own may define any of them).
OPTIONAL_MEMBERS = ("where", "size", "signature", "open_upload", "open_source", "local_path", "lock", "unlock",
                    "lock_lost", "create_unsynced", "sync", "recover", "prune_dirs", "reopen", "lease_ttl")


class _Completed(BackendDefaults):
    """A backend that does not subclass :class:`BackendDefaults`, with the defaults filled in
    for the members it lacks (its own are used where it has them)."""

    def __init__(self, inner: ByteBackend) -> None:
        self.inner = inner
        for name in ("read", "create", "replace", "listdir", "remove", *OPTIONAL_MEMBERS):
            if hasattr(inner, name):
                setattr(self, name, getattr(inner, name))

    def __repr__(self) -> str:
        return repr(self.inner)

    def __getattr__(self, name: str) -> Any:  # anything else the backend offers
        return getattr(self.inner, name)

    def reopen(self) -> BackendDefaults:
        reopen = getattr(self.inner, "reopen", None)
        return self if reopen is None else with_defaults(reopen())


def with_defaults(backend: ByteBackend | BackendDefaults) -> BackendDefaults:
    """``backend`` itself if it subclasses :class:`BackendDefaults`, else a view of it with the
    defaults of the optional members it lacks (:class:`TypeError` if a required one is missing)."""
    if isinstance(backend, BackendDefaults):
        return backend
    missing = [name for name in ("read", "create", "replace", "listdir", "remove")
               if not callable(getattr(backend, name, None))]
    if missing:
        raise TypeError(f"{type(backend).__name__} is not a storage backend: it lacks {', '.join(missing)} "
                        f"(see rollout_mock.storage.backend.ByteBackend)")
    return _Completed(backend)


# ---------------------------------------------------------------------------------------------
# The in-memory backend
# ---------------------------------------------------------------------------------------------

class _Contents:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.versions: dict[str, int] = {}
        self.locks: dict[str, tuple[str, str, object]] = {}
        self.lock = threading.RLock()
        self.counter = 0


class MemoryBackend(BackendDefaults):
    """Objects as bytes in a dict (for tests): ``reopen`` is a second handle on the same
    contents, as a second process would have, with locks of its own."""

    def __init__(self, contents: _Contents | None = None) -> None:
        self._c = contents or _Contents()

    def __repr__(self) -> str:
        return f"MemoryBackend({len(self._c.files)} objects)"

    def reopen(self) -> MemoryBackend:
        return MemoryBackend(self._c)

    def where(self, rel: str) -> str:
        return f"memory:{rel}"

    def read(self, rel: str, start: int = 0, end: int | None = None) -> bytes | None:
        data = self._c.files.get(check_relpath(rel))
        return data if data is None or (start == 0 and end is None) else data[start:end]

    def _put(self, rel: str, data: bytes) -> None:
        self._c.files[check_relpath(rel)] = bytes(data)
        self._c.counter += 1
        self._c.versions[rel] = self._c.counter

    def create(self, rel: str, data: bytes) -> bool:
        with self._c.lock:
            if check_relpath(rel) in self._c.files:
                return False
            self._put(rel, data)
            return True

    def replace(self, rel: str, data: bytes) -> None:
        with self._c.lock:
            self._put(rel, data)

    def listdir(self, rel_dir: str) -> list[str]:
        prefix = check_relpath(rel_dir) + "/" if rel_dir else ""
        with self._c.lock:
            names = {k[len(prefix):].split("/", 1)[0] for k in self._c.files if k.startswith(prefix)}
        return sorted(names)

    def remove(self, rels: Iterable[str]) -> None:
        with self._c.lock:
            for rel in rels:
                self._c.files.pop(rel, None)
                self._c.versions.pop(rel, None)

    def size(self, rel: str) -> int | None:
        data = self._c.files.get(check_relpath(rel))
        return None if data is None else len(data)

    def signature(self, rel: str) -> Hashable | None:
        return self._c.versions.get(rel)

    def lock(self, rel: str, holder: str, *, wait: float = 0.0) -> Any:
        deadline = time.monotonic() + wait
        token = (rel, holder, object())
        while True:
            with self._c.lock:
                if rel not in self._c.locks:
                    self._c.locks[rel] = token
                    return token
                current = self._c.locks[rel]
            if time.monotonic() >= deadline:
                raise LockedError(f"{self.where(rel)} is held by {current[1]}")
            time.sleep(0.005)

    def unlock(self, handle: Any) -> None:
        with self._c.lock:
            rel = handle[0]
            if self._c.locks.get(rel) is handle:
                del self._c.locks[rel]

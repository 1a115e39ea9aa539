"""The byte-level interface a storage backend implements: objects addressed by a relative path
(``train/step_000003.pkl``, ``train/.index/step_000003.json``, ``manifest.json``), nothing more.

Everything above the bytes (the index, the codec, checksums, HMAC, overwrite protection,
retention, compaction) is the one :class:`~rollout_mock.storage.store.Store`, which owns a
backend. A backend is a plain class with these methods (no base class needed: this is a
``typing.Protocol``); :mod:`rollout_mock.storage.testing` is the conformance suite that checks one.
The three shipped backends are :class:`~rollout_mock.storage.directory.LocalBackend` (a local
directory: rename, fsync, flock), :class:`~rollout_mock.storage.objectstore.FsspecBackend`
(``s3://`` and every other fsspec URL: conditional puts, leases) and
:class:`~rollout_mock.storage.memory.MemoryBackend` (a dict, for tests).

Rules every backend keeps (the store's crash safety rests on them):

* ``create`` is *conditional*: it writes only if ``rel`` is absent, atomically, and says whether
  it did. It is how a step becomes visible (its entry file), so two writers of one step cannot
  both succeed. ``replace`` is an atomic create-or-overwrite.
* ``write_step`` makes the object appear whole or not at all (temporary file + rename, a single
  put, or a multipart upload completed last) and returns its size, CRC-32 and keyed MAC.
* ``read`` returns the bytes of an object or None; it never blocks on a FIFO or a device and
  never follows a path outside the backend's root.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rollout_mock.storage.manifest import StreamId

__all__ = ["ByteBackend", "ProduceBytes"]

#: What the store hands ``write_step``: a function writing the step's bytes into the sink the
#: backend provides: a :class:`~rollout_mock.codec.sink.Sink` (``write``), or a
#: :class:`~rollout_mock.codec.sink.FileSink` (checksummed ranged writes) where the backend can.
ProduceBytes = Callable[[Any], object]


@runtime_checkable
class ByteBackend(Protocol):
    """Objects under one root (see the module docstring for the rules)."""

    @property
    def root_location(self) -> Path | str:
        """The root: a local ``Path``, or the URL of an object-store prefix."""
        ...

    def where(self, rel: str) -> str:
        """A human-readable location (path or URL) of ``rel`` (the root for ``""``)."""
        ...

    def read(self, rel: str) -> bytes | None:
        """The bytes of a small object, or None if absent."""
        ...

    def create(self, rel: str, data: bytes, *, durable: bool = True) -> bool:
        """Write ``rel`` atomically *only if absent*; False if it exists. ``durable=False``: the
        object may be lost (never torn) by a power cut until :meth:`sync`."""
        ...

    def replace(self, rel: str, data: bytes) -> None:
        """Atomically create or overwrite ``rel``."""
        ...

    def listdir(self, rel_dir: str) -> list[str]:
        """Names directly under ``rel_dir`` (empty if it does not exist)."""
        ...

    def remove(self, rels: list[str]) -> None:
        """Remove objects (in as few requests as the backend allows); absent ones are fine."""
        ...

    def exists(self, rel: str) -> bool:
        ...

    def signature(self, rel: str) -> Any:
        """Something that changes whenever ``rel`` is replaced (None if absent)."""
        ...

    def write_step(self, rel: str, produce: ProduceBytes, *, hmac_key: bytes | None,
                   context: bytes) -> tuple[int, str, str | None]:
        """Write the bytes ``produce`` emits as ``rel``, whole or not at all: (size, crc, mac)."""
        ...

    def open_source(self, rel: str, *, mapped: bool = False) -> Any:
        """A :class:`~rollout_mock.codec.source.ByteSource` over ``rel`` (ranged reads);
        ``mapped``: a memory-mapped local file where the backend has one (others ignore it).
        :class:`FileNotFoundError` if absent."""
        ...

    def local_path(self, rel: str) -> Path | None:
        """The local file of ``rel`` (checked to stay inside the root), or None for a backend
        without local files."""
        ...

    def lock_stream(self, stream: StreamId) -> Any:
        """Claim ``stream`` for writing; :class:`~rollout_mock.errors.LockedError` if another
        writer holds it. Returns the handle :meth:`unlock_stream` takes."""
        ...

    def unlock_stream(self, stream: StreamId, handle: Any) -> None:
        ...

    def lock_lost(self, handle: Any) -> str | None:
        """Why a stream lock was lost (an expired lease), or None."""
        ...

    def manifest_lock(self) -> AbstractContextManager[None]:
        """Exclusive access to ``manifest.json`` for a read-modify-write."""
        ...

    def recover(self, stream: StreamId) -> None:
        """Remove what a crashed writer of ``stream`` left behind (temporary files)."""
        ...

    def prune_dirs(self, rel_dirs: list[str]) -> None:
        """Remove directories left empty (backends without directories: nothing)."""
        ...

    def sync(self) -> None:
        """Make every ``create(durable=False)`` so far durable."""
        ...

    def reopen(self) -> ByteBackend:
        """A second handle on the same objects, as another process would have (its locks are
        its own)."""
        ...

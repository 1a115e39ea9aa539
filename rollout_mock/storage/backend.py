"""The primitives a file- or object-based backend implements for
:class:`~rollout_mock.storage.indexed.IndexedStore`: small-file reads, exclusive creates,
replaces, listings, removals, step writes and loads, and locks.

Each docstring says what happens at the edge; :class:`~rollout_mock.storage.directory.DirectoryStore`
and :class:`~rollout_mock.storage.objectstore.FsspecStore` are the two implementations.
"""

from __future__ import annotations

import abc
from contextlib import AbstractContextManager
from typing import Any

from rollout_mock.storage.base import StepStore
from rollout_mock.storage.manifest import StepEntry, StreamId

__all__ = ["StoreBackend"]


class StoreBackend(StepStore):
    """Abstract primitives of a backend (see the module docstring)."""

    @abc.abstractmethod
    def where(self, rel: str) -> str:
        """A human-readable location (path or URL) of ``rel``."""

    @abc.abstractmethod
    def _read(self, rel: str) -> bytes | None:
        """The bytes of a small file, or None if absent."""

    @abc.abstractmethod
    def _create(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` atomically *only if absent*; False if it exists."""

    def _create_entry(self, rel: str, data: bytes) -> bool:
        """:meth:`_create` for a step's entry file (the commit point). A backend may defer the
        entry's durability to :meth:`sync` when a crash can only lose it, never tear it."""
        return self._create(rel, data)

    def sync(self) -> None:
        """Make every step committed so far durable (a no-op where commits already are)."""

    @abc.abstractmethod
    def _replace(self, rel: str, data: bytes) -> None:
        """Atomically create or replace ``rel``."""

    @abc.abstractmethod
    def _list(self, rel_dir: str) -> list[str]:
        """Names directly in ``rel_dir`` (empty if it does not exist)."""

    @abc.abstractmethod
    def _remove(self, rels: list[str]) -> None:
        """Remove files; absent ones are fine."""

    @abc.abstractmethod
    def _exists(self, rel: str) -> bool: ...

    @abc.abstractmethod
    def _signature(self, rel: str) -> Any:
        """Something that changes whenever ``rel`` is replaced (None if absent)."""

    @abc.abstractmethod
    def _write_step(self, rel: str, batch: Any, context: bytes) -> tuple[int, str, str | None]:
        """Write a step's data so that it appears complete or not at all; (size, crc, mac)."""

    @abc.abstractmethod
    def _load_step(self, rel: str, entry: StepEntry, stream: StreamId, step: int, trusted: bool) -> Any:
        """Load and verify a step against ``entry`` (and the bound HMAC when keyed)."""

    @abc.abstractmethod
    def _lock_stream(self, stream: StreamId) -> Any:
        """Claim ``stream`` for writing; :class:`LockedError` if another writer holds it."""

    @abc.abstractmethod
    def _unlock_stream(self, stream: StreamId, handle: Any) -> None: ...

    @abc.abstractmethod
    def _manifest_lock(self) -> AbstractContextManager[None]:
        """Exclusive access to ``manifest.json`` for a read-modify-write."""

    def open_source(self, rel: str, *, mapped: bool = False) -> Any:
        """A :class:`~rollout_mock.codec.source.ByteSource` over ``rel`` (ranged reads); ``mapped``:
        a memory-mapped local file where the backend has one (others ignore it)."""
        raise NotImplementedError(f"{type(self).__name__} has no ranged reads")

    def _lock_lost(self, handle: Any) -> str | None:
        """Why the stream lock was lost (object-store leases), or None."""
        return None

    def _recover(self, stream: StreamId) -> None:
        """Remove what a crashed writer of ``stream`` left behind (temporary files)."""

    def _prune_dirs(self, rel_dirs: list[str]) -> None:
        """Remove directories left empty by compaction (local filesystems only)."""

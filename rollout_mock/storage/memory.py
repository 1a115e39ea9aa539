"""An in-memory store with exactly the directory store's semantics (for tests).

It is the same :class:`~rollout_mock.storage.indexed.IndexedStore` (entry files, compaction,
writer claims, bound HMAC) over a dict of "files", so a test of a wrapper against it exercises
the real index logic. ``MemoryStore.another()`` is a second handle on the same contents, as a
second process would have: its writers are refused while this one holds a stream.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import rollout_mock.codec as codec
from rollout_mock.errors import LockedError
from rollout_mock.storage.digest import Digest
from rollout_mock.storage.indexed import IndexedStore
from rollout_mock.storage.manifest import StepEntry, StreamId
from rollout_mock.storage.paths import check_relpath
from rollout_mock.storage.verified import _corrupt, load_bytes_verified

__all__ = ["MemoryStore"]


class _Contents:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.versions: dict[str, int] = {}
        self.writers: dict[str, int] = {}
        self.lock = threading.RLock()
        self.counter = 0


class MemoryStore(IndexedStore):
    """Steps as bytes in a dict: same semantics as :class:`DirectoryStore`, for tests."""

    def __init__(self, *, hmac_key: bytes | None = None, verify: bool = True,
                 _contents: _Contents | None = None) -> None:
        super().__init__(hmac_key=hmac_key, verify=verify)
        self._c = _contents or _Contents()
        self.dump_dir = "memory-store"

    def __repr__(self) -> str:
        return f"MemoryStore({sum(1 for k in self._c.files if k.endswith('.pkl'))} steps)"

    def another(self) -> MemoryStore:
        """A second handle on the same contents (as another process would see them)."""
        return MemoryStore(hmac_key=self.hmac_key, verify=self.verify, _contents=self._c)

    def where(self, rel: str) -> str:
        return f"memory:{rel}"

    def _put(self, rel: str, data: bytes) -> None:
        self._c.files[check_relpath(rel)] = bytes(data)
        self._c.counter += 1
        self._c.versions[rel] = self._c.counter

    def _read(self, rel: str) -> bytes | None:
        return self._c.files.get(check_relpath(rel))

    def _create(self, rel: str, data: bytes) -> bool:
        with self._c.lock:
            if rel in self._c.files:
                return False
            self._put(rel, data)
            return True

    def _replace(self, rel: str, data: bytes) -> None:
        with self._c.lock:
            self._put(rel, data)

    def _list(self, rel_dir: str) -> list[str]:
        prefix = check_relpath(rel_dir) + "/"
        with self._c.lock:
            return [k[len(prefix):] for k in self._c.files if k.startswith(prefix) and "/" not in k[len(prefix):]]

    def _remove(self, rels: list[str]) -> None:
        with self._c.lock:
            for rel in rels:
                self._c.files.pop(rel, None)
                self._c.versions.pop(rel, None)

    def _exists(self, rel: str) -> bool:
        return rel in self._c.files

    def _signature(self, rel: str) -> Any:
        return self._c.versions.get(rel)

    def _write_step(self, rel: str, batch: Any, context: bytes) -> tuple[int, str, str | None]:
        data = codec.encode_bytes(batch)
        digest = Digest(self.hmac_key, context)
        digest.update(data)
        checksum, mac = digest.finish()
        self._replace(rel, data)
        return len(data), checksum, mac

    def _load_step(self, rel: str, entry: StepEntry, stream: StreamId, step: int, trusted: bool) -> Any:
        data = self._read(rel)
        if data is None:
            raise _corrupt(self.where(rel), stream, step, "the data listed in the index is missing")
        return load_bytes_verified(data, entry, where=self.where(rel), stream=stream, step=step,
                                   trusted=trusted, verify=self.verify, hmac_key=self.hmac_key)

    def open_source(self, rel: str, *, mapped: bool = False) -> Any:
        from rollout_mock.codec.source import BytesSource

        data = self._read(rel)
        if data is None:
            raise FileNotFoundError(self.where(rel))
        return BytesSource(data, self.where(rel))

    def _lock_stream(self, stream: StreamId) -> Any:
        with self._c.lock:
            holder = self._c.writers.get(stream.key)
            if holder is not None and holder != id(self):
                raise LockedError(f"[RolloutMock] another writer is already dumping {stream} into this "
                                  f"MemoryStore", mode="dump", split=stream.split)
            self._c.writers[stream.key] = id(self)
        return stream.key

    def _unlock_stream(self, stream: StreamId, handle: Any) -> None:
        with self._c.lock:
            if self._c.writers.get(handle) == id(self):
                del self._c.writers[handle]

    @contextmanager
    def _manifest_lock(self) -> Iterator[None]:
        with self._c.lock:
            yield

    def corrupt(self, stream: StreamId, step: int, data: bytes) -> None:
        """Replace a step's bytes behind the index's back (for tests)."""
        self._replace(stream.relpath(step), data)


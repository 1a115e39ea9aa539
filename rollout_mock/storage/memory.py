"""An in-memory backend with exactly the directory backend's semantics (for tests).

``MemoryStore()`` is the one :class:`~rollout_mock.storage.store.Store` (entry files, compaction,
writer claims, bound HMAC) over a dict of objects, so a test of a wrapper against it exercises
the real index logic. ``store.another()`` is a second handle on the same contents, as a second
process would have: its writers are refused while this one holds a stream.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rollout_mock.errors import LockedError
from rollout_mock.storage.backend import ProduceBytes
from rollout_mock.storage.digest import Digest
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.paths import check_relpath
from rollout_mock.storage.store import Store

__all__ = ["MemoryBackend", "MemoryStore"]


class _Contents:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.versions: dict[str, int] = {}
        self.writers: dict[str, int] = {}
        self.lock = threading.RLock()
        self.counter = 0


class MemoryStore(Store):
    """``Store`` over a fresh :class:`MemoryBackend` (for tests; this class only builds it)."""

    backend: MemoryBackend

    def __init__(self, *, hmac_key: bytes | None = None, verify: bool = True) -> None:
        super().__init__(MemoryBackend(), hmac_key=hmac_key, verify=verify)

    def __repr__(self) -> str:
        return f"MemoryStore({self.backend!r})"

    def corrupt(self, stream: StreamId, step: int, data: bytes) -> None:
        """Replace a step's bytes behind the index's back (for tests)."""
        self.backend.replace(stream.relpath(step), data)


class MemoryBackend:
    """Objects as bytes in a dict: the directory backend's semantics, for tests."""

    def __init__(self, contents: _Contents | None = None) -> None:
        self._c = contents or _Contents()
        self.root_location: str = "memory-store"

    def __repr__(self) -> str:
        return f"MemoryBackend({sum(1 for k in self._c.files if k.endswith('.pkl'))} steps)"

    def reopen(self) -> MemoryBackend:
        """A second handle on the same contents (as another process would see them)."""
        return MemoryBackend(self._c)

    def local_path(self, rel: str) -> None:
        return None

    def sync(self) -> None:
        return None

    def prune_dirs(self, rel_dirs: list[str]) -> None:
        return None

    def recover(self, stream: StreamId) -> None:
        return None

    def lock_lost(self, handle: Any) -> str | None:
        return None

    def where(self, rel: str) -> str:
        return f"memory:{rel}"

    def _put(self, rel: str, data: bytes) -> None:
        self._c.files[check_relpath(rel)] = bytes(data)
        self._c.counter += 1
        self._c.versions[rel] = self._c.counter

    def read(self, rel: str) -> bytes | None:
        return self._c.files.get(check_relpath(rel))

    def create(self, rel: str, data: bytes, *, durable: bool = True) -> bool:
        with self._c.lock:
            if rel in self._c.files:
                return False
            self._put(rel, data)
            return True

    def replace(self, rel: str, data: bytes) -> None:
        with self._c.lock:
            self._put(rel, data)

    def listdir(self, rel_dir: str) -> list[str]:
        prefix = check_relpath(rel_dir) + "/"
        with self._c.lock:
            return [k[len(prefix):] for k in self._c.files if k.startswith(prefix) and "/" not in k[len(prefix):]]

    def remove(self, rels: list[str]) -> None:
        with self._c.lock:
            for rel in rels:
                self._c.files.pop(rel, None)
                self._c.versions.pop(rel, None)

    def exists(self, rel: str) -> bool:
        return rel in self._c.files

    def signature(self, rel: str) -> Any:
        return self._c.versions.get(rel)

    def write_step(self, rel: str, produce: ProduceBytes, *, hmac_key: bytes | None,
                   context: bytes) -> tuple[int, str, str | None]:
        sink = io.BytesIO()
        produce(sink)
        data = sink.getvalue()
        digest = Digest(hmac_key, context)
        digest.update(data)
        checksum, mac = digest.finish()
        self.replace(rel, data)
        return len(data), checksum, mac

    def open_source(self, rel: str, *, mapped: bool = False) -> Any:
        from rollout_mock.codec import BytesSource

        data = self.read(rel)
        if data is None:
            raise FileNotFoundError(self.where(rel))
        return BytesSource(data, self.where(rel))

    def lock_stream(self, stream: StreamId) -> Any:
        with self._c.lock:
            holder = self._c.writers.get(stream.key)
            if holder is not None and holder != id(self):
                raise LockedError(f"[RolloutMock] another writer is already dumping {stream} into this "
                                  f"MemoryStore", mode="dump", split=stream.split)
            self._c.writers[stream.key] = id(self)
        return stream.key

    def unlock_stream(self, stream: StreamId, handle: Any) -> None:
        with self._c.lock:
            if self._c.writers.get(handle) == id(self):
                del self._c.writers[handle]

    @contextmanager
    def manifest_lock(self) -> Iterator[None]:
        with self._c.lock:
            yield

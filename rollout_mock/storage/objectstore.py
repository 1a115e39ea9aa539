"""A dump on any fsspec filesystem: ``s3://``, ``gs://``, ``oss://``, ``hdfs://``, ``memory://``...

Object stores have no rename, fsync or flock, so this store relies on what they do have:

* **atomic objects**: a put (or a completed multipart upload) is visible whole or not at all; a
  writer killed mid-upload leaves no object (an unfinished multipart upload is invisible; a
  bucket lifecycle rule reclaims it). Each step is written as data first, entry file last
  (:mod:`rollout_mock.storage.index`), so a step is visible only once complete;
* **conditional writes** for the entry file (the overwrite guard), the fingerprint and leases:
  ``If-None-Match: *`` on S3 (s3fs ``pipe_file(mode="create")``; AWS, MinIO, moto and other
  S3-compatible servers that implement it), a process lock around the exists-check on
  ``memory://``; on other filesystems an exists-check then put (best-effort: two writers racing
  for the very same step within one round trip are not detected there);
* **leases** instead of flock (:mod:`rollout_mock.storage.lease`).

Credentials and endpoints come from ``storage_options`` (passed to fsspec unchanged) and the
standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ... are read by s3fs/botocore).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import rollout_mock.codec as codec
from rollout_mock.errors import MissingExtraError
from rollout_mock.storage.digest import Digest
from rollout_mock.storage.indexed import IndexedStore
from rollout_mock.storage.lease import Lease
from rollout_mock.storage.manifest import StepEntry, StreamId
from rollout_mock.storage.paths import check_relpath
from rollout_mock.storage.verified import _corrupt, load_bytes_verified

__all__ = ["FsspecStore"]

_MEMORY_CREATE = threading.Lock()
_NATIVE_CREATE = {"s3", "s3a"}


class _BufferWriter:
    """The file object codec.dump writes into: bytes collected in memory, hashed on the way."""

    def __init__(self, digest: Digest) -> None:
        self.buffer = io.BytesIO()
        self.digest = digest

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(bytes(view) if view.nbytes < (1 << 20) else view)
        return self.buffer.write(view)


class FsspecStore(IndexedStore):
    """Steps as objects under an fsspec URL (see the module docstring)."""

    def __init__(self, url: str, *, storage_options: dict[str, Any] | None = None,
                 hmac_key: bytes | None = None, verify: bool = True, lease_ttl: float = 60.0) -> None:
        super().__init__(hmac_key=hmac_key, verify=verify)
        try:
            import fsspec
        except ImportError:  # pragma: no cover - fsspec comes with torch
            raise MissingExtraError(
                "[RolloutMock] object-store dumps need fsspec: pip install 'rollout_mock[s3]'") from None
        self.url = url.rstrip("/")
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        except ImportError as exc:
            raise MissingExtraError(
                f"[RolloutMock] dump_dir {url}: {exc}; for s3:// install 'rollout_mock[s3]'"
            ) from None
        self.root = root.rstrip("/")
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        self._native_create = bool(protocols & _NATIVE_CREATE)
        self._memory = "memory" in protocols
        self.lease_ttl = lease_ttl
        self.dump_dir = self.url

    def __repr__(self) -> str:
        return f"FsspecStore({self.url!r})"

    def _p(self, rel: str) -> str:
        return f"{self.root}/{check_relpath(rel)}" if rel else self.root

    def where(self, rel: str) -> str:
        return f"{self.url}/{rel}" if rel else self.url

    # ------------------------------------------------------------------ primitives
    def _read(self, rel: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(self._p(rel)))
        except FileNotFoundError:
            return None

    def _create(self, rel: str, data: bytes) -> bool:
        path = self._p(rel)
        if self._native_create:
            try:
                self.fs.pipe_file(path, data, mode="create")
            except FileExistsError:
                return False
            return True
        with _MEMORY_CREATE:  # memory://: one process, so this is exact; elsewhere best-effort
            self.fs.invalidate_cache(path)
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
            return True

    def _replace(self, rel: str, data: bytes) -> None:
        self.fs.pipe_file(self._p(rel), data)

    def _list(self, rel_dir: str) -> list[str]:
        path = self._p(rel_dir)
        self.fs.invalidate_cache(path)
        try:
            names = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        return [str(n).rstrip("/").rsplit("/", 1)[-1] for n in names if str(n).rstrip("/") != path]

    def _remove(self, rels: list[str]) -> None:
        for rel in rels:
            try:
                self.fs.rm_file(self._p(rel))
            except FileNotFoundError:
                pass
        for rel in {r.rsplit("/", 1)[0] for r in rels if "/" in r}:
            self.fs.invalidate_cache(self._p(rel))

    def _exists(self, rel: str) -> bool:
        path = self._p(rel)
        self.fs.invalidate_cache(path)
        return bool(self.fs.exists(path))

    def _signature(self, rel: str) -> Any:
        path = self._p(rel)
        self.fs.invalidate_cache(path)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        if info.get("type") == "directory":
            return None
        return (info.get("size"), info.get("ETag") or info.get("etag"), str(info.get("LastModified")
                or info.get("mtime") or info.get("created")))

    def _write_step(self, rel: str, batch: Any, context: bytes) -> tuple[int, str, str | None]:
        writer = _BufferWriter(Digest(self.hmac_key, context))
        codec.encode(batch, writer)  # type: ignore[arg-type]
        checksum, mac = writer.digest.finish()
        data = writer.buffer.getvalue()
        self.fs.pipe_file(self._p(rel), data)  # one put, or a multipart upload completed last
        return len(data), checksum, mac

    def _load_step(self, rel: str, entry: StepEntry, stream: StreamId, step: int, trusted: bool) -> Any:
        data = self._read(rel)
        if data is None:
            raise _corrupt(self.where(rel), stream, step, "the object listed in the index is missing")
        return load_bytes_verified(data, entry, where=self.where(rel), stream=stream, step=step,
                                   trusted=trusted, verify=self.verify, hmac_key=self.hmac_key)

    def open_source(self, rel: str, *, mapped: bool = False) -> Any:
        """The object as a ByteSource read with ranged GETs (``cat_file(path, start, end)``)."""
        from rollout_mock.storage.partial import FsspecByteSource

        return FsspecByteSource(self.fs, self._p(rel), self.where(rel))

    # ------------------------------------------------------------------ locks
    def _lease(self, rel: str, what: str, ttl: float) -> Lease:
        return Lease(rel, what=what, where=self.where(rel), ttl=ttl, create=self._create, read=self._read,
                     replace=self._replace, remove=self._remove)

    def _lock_stream(self, stream: StreamId) -> Any:
        suffix = "" if stream.rank is None else f"-rank{stream.rank}"
        return self._lease(f"{stream.directory}/.writer{suffix}.lease", f"the writer lease of {stream}",
                           self.lease_ttl).take()

    def _unlock_stream(self, stream: StreamId, handle: Any) -> None:
        handle.release()

    def _lock_lost(self, handle: Any) -> str | None:
        return handle.lost

    @contextmanager
    def _manifest_lock(self) -> Iterator[None]:
        with self._lease(".manifest.lease", "the manifest lock", 30.0).take(wait=120.0):
            yield

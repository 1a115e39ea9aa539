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

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rollout_mock.errors import MissingExtraError
from rollout_mock.storage.backend import ProduceBytes
from rollout_mock.storage.digest import Digest
from rollout_mock.storage.lease import Lease
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.paths import check_relpath
from rollout_mock.storage.store import Store

__all__ = ["FsspecBackend", "FsspecStore"]

_MEMORY_CREATE = threading.Lock()
_NATIVE_CREATE = {"s3", "s3a"}


#: Steps up to this size go up in one put; larger ones as a multipart upload of parts this size,
#: so the memory a step's upload holds is one part, not the step (S3 parts are >= 5 MiB).
PART_SIZE = 16 << 20


class _UploadWriter:
    """The sink a step's bytes are written into: hashed on the way, buffered up to one part, sent
    as a single put when the step fits in a part, as a multipart upload otherwise (parts go out
    as they fill; the object appears only when the upload completes)."""

    def __init__(self, fs: Any, path: str, digest: Digest, part_size: int) -> None:
        self.fs, self.path, self.digest, self.part_size = fs, path, digest, part_size
        self.buffer = bytearray()
        self.file: Any = None
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(bytes(view) if view.nbytes < (1 << 20) else view)
        self.size += view.nbytes
        if self.file is None and len(self.buffer) + view.nbytes <= self.part_size:
            self.buffer += view
            return view.nbytes
        if self.file is None:
            self.file = self.fs.open(self.path, "wb", block_size=self.part_size)
            self.file.write(self.buffer)
            self.buffer = bytearray()
        self.file.write(view)
        return view.nbytes

    def finish(self) -> None:
        if self.file is None:
            self.fs.pipe_file(self.path, bytes(self.buffer))
        else:
            self.file.close()  # completes the multipart upload: the object appears now

    def abort(self) -> None:
        if self.file is not None:
            discard = getattr(self.file, "discard", None)  # s3fs: abort the multipart upload
            if discard is not None:
                discard()


class FsspecStore(Store):
    """The store of a dump under an fsspec URL: ``Store`` over an :class:`FsspecBackend` (this
    class only builds it; every rule is the store's)."""

    backend: FsspecBackend

    def __init__(self, url: str, *, storage_options: dict[str, Any] | None = None,
                 hmac_key: bytes | None = None, verify: bool = True, lease_ttl: float = 60.0) -> None:
        super().__init__(FsspecBackend(url, storage_options=storage_options, lease_ttl=lease_ttl),
                         hmac_key=hmac_key, verify=verify)

    @property
    def fs(self) -> Any:
        """The fsspec filesystem."""
        return self.backend.fs

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def root(self) -> str:
        return self.backend.root

    @property
    def _native_create(self) -> bool:  # deprecated: ``store.backend.native_create``
        return self.backend.native_create


class FsspecBackend:
    """Objects under an fsspec URL (see the module docstring)."""

    def __init__(self, url: str, *, storage_options: dict[str, Any] | None = None, lease_ttl: float = 60.0,
                 part_size: int = PART_SIZE) -> None:
        try:
            import fsspec
        except ImportError:  # pragma: no cover - fsspec comes with torch
            raise MissingExtraError(
                "[RolloutMock] object-store dumps need fsspec: pip install 'rollout_mock[s3]'") from None
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        except ImportError as exc:
            raise MissingExtraError(
                f"[RolloutMock] dump_dir {url}: {exc}; for s3:// install 'rollout_mock[s3]'"
            ) from None
        self.root = root.rstrip("/")
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        self.native_create = bool(protocols & _NATIVE_CREATE)
        self._memory = "memory" in protocols
        self.lease_ttl = lease_ttl
        self.part_size = part_size
        self.root_location: str = self.url

    def __repr__(self) -> str:
        return f"FsspecBackend({self.url!r})"

    def reopen(self) -> FsspecBackend:
        return FsspecBackend(self.url, storage_options=self.storage_options, lease_ttl=self.lease_ttl,
                             part_size=self.part_size)

    def local_path(self, rel: str) -> None:
        return None

    def sync(self) -> None:
        return None  # every put is durable once acknowledged

    def prune_dirs(self, rel_dirs: list[str]) -> None:
        return None  # object stores have no directories

    def recover(self, stream: StreamId) -> None:
        return None  # an interrupted upload leaves no object

    def _p(self, rel: str) -> str:
        return f"{self.root}/{check_relpath(rel)}" if rel else self.root

    def where(self, rel: str) -> str:
        return f"{self.url}/{rel}" if rel else self.url

    # ------------------------------------------------------------------ primitives
    def read(self, rel: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(self._p(rel)))
        except FileNotFoundError:
            return None

    def create(self, rel: str, data: bytes, *, durable: bool = True) -> bool:
        path = self._p(rel)
        if self.native_create:
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

    def replace(self, rel: str, data: bytes) -> None:
        self.fs.pipe_file(self._p(rel), data)

    def listdir(self, rel_dir: str) -> list[str]:
        path = self._p(rel_dir)
        self.fs.invalidate_cache(path)
        try:
            names = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        return [str(n).rstrip("/").rsplit("/", 1)[-1] for n in names if str(n).rstrip("/") != path]

    def remove(self, rels: list[str]) -> None:
        """One batched delete (S3: DeleteObjects, up to 1,000 keys per request)."""
        paths = [self._p(rel) for rel in rels]
        if len(paths) > 1:
            try:
                self.fs.rm(paths)
            except FileNotFoundError:  # some filesystems refuse a batch with an absent path
                self._remove_each(paths)
        else:
            self._remove_each(paths)
        for rel in {r.rsplit("/", 1)[0] for r in rels if "/" in r}:
            self.fs.invalidate_cache(self._p(rel))

    def _remove_each(self, paths: list[str]) -> None:
        for path in paths:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

    def exists(self, rel: str) -> bool:
        path = self._p(rel)
        self.fs.invalidate_cache(path)
        return bool(self.fs.exists(path))

    def signature(self, rel: str) -> Any:
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

    def write_step(self, rel: str, produce: ProduceBytes, *, hmac_key: bytes | None,
                   context: bytes) -> tuple[int, str, str | None]:
        writer = _UploadWriter(self.fs, self._p(rel), Digest(hmac_key, context), self.part_size)
        try:
            produce(writer)
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        checksum, mac = writer.digest.finish()
        return writer.size, checksum, mac

    def open_source(self, rel: str, *, mapped: bool = False) -> Any:
        """The object as a ByteSource read with ranged GETs (``cat_file(path, start, end)``);
        one HEAD now for its size (:class:`FileNotFoundError` if absent)."""
        from rollout_mock.storage.partial import FsspecByteSource

        path = self._p(rel)
        info = self.fs.info(path)
        if info.get("type") == "directory":
            raise FileNotFoundError(self.where(rel))
        return FsspecByteSource(self.fs, path, self.where(rel), size=int(info["size"]))

    # ------------------------------------------------------------------ locks
    def _lease(self, rel: str, what: str, ttl: float) -> Lease:
        return Lease(rel, what=what, where=self.where(rel), ttl=ttl, create=self.create, read=self.read,
                     replace=self.replace, remove=self.remove)

    def lock_stream(self, stream: StreamId) -> Any:
        suffix = "" if stream.rank is None else f"-rank{stream.rank}"
        return self._lease(f"{stream.directory}/.writer{suffix}.lease", f"the writer lease of {stream}",
                           self.lease_ttl).take()

    def unlock_stream(self, stream: StreamId, handle: Any) -> None:
        handle.release()

    def lock_lost(self, handle: Any) -> str | None:
        return handle.lost

    @contextmanager
    def manifest_lock(self) -> Iterator[None]:
        with self._lease(".manifest.lease", "the manifest lock", 30.0).take(wait=120.0):
            yield

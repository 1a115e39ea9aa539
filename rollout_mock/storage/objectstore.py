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
* **leases** instead of flock (the default lock of
  :class:`~rollout_mock.storage.backend.BackendDefaults`: a lease object taken with a conditional
  put and renewed by a heartbeat).

Credentials and endpoints come from ``storage_options`` (passed to fsspec unchanged) and the
standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ... are read by s3fs/botocore).
"""

from __future__ import annotations

import errno
import functools
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

from rollout_mock.errors import MissingExtraError
from rollout_mock.storage.backend import BackendDefaults
from rollout_mock.storage.paths import check_relpath

__all__ = ["FsspecBackend"]

_MEMORY_CREATE = threading.Lock()
_NATIVE_CREATE = {"s3", "s3a"}


#: Objects up to this size go up in one put; larger ones as a multipart upload of parts this size,
#: so the memory an upload holds is one part, not the object (S3 parts are >= 5 MiB).
PART_SIZE = 16 << 20


class _Upload:
    """A streamed write: buffered up to one part, sent as a single put when the object fits in a
    part, as a multipart upload otherwise (parts go out as they fill; the object appears only
    when the upload completes)."""

    def __init__(self, fs: Any, path: str, part_size: int) -> None:
        self.fs, self.path, self.part_size = fs, path, part_size
        self.buffer = bytearray()
        self.file: Any = None

    def write(self, data: memoryview) -> None:
        if self.file is None and len(self.buffer) + data.nbytes <= self.part_size:
            self.buffer += data
            return
        if self.file is None:
            self.file = self.fs.open(self.path, "wb", block_size=self.part_size)
            self.file.write(self.buffer)
            self.buffer = bytearray()
        self.file.write(data)

    def commit(self) -> None:
        if self.file is None:
            self.fs.pipe_file(self.path, bytes(self.buffer))
        else:
            self.file.close()  # completes the multipart upload: the object appears now

    def abort(self) -> None:
        self.buffer = bytearray()
        if self.file is not None:
            discard = getattr(self.file, "discard", None)  # s3fs: abort the multipart upload
            if discard is not None:
                discard()


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _denied(operation: str) -> Callable[[_Method], _Method]:
    """A read of the store refused by it (S3: 403, wrong or missing credentials, a bucket policy)
    says which bucket, what was tried and the fix in one line, not s3fs's bare "Forbidden"."""

    def wrap(method: _Method) -> _Method:
        @functools.wraps(method)
        def call(self: FsspecBackend, rel: str, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, rel, *args, **kwargs)
            except PermissionError as exc:
                error = PermissionError(self.denied(operation, rel, exc))
                error.errno = exc.errno  # (not strerror/filename: they would replace the message in str())
                raise error from None

        return cast(_Method, call)

    return wrap


class FsspecBackend(BackendDefaults):
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

    def __repr__(self) -> str:
        return f"FsspecBackend({self.url!r})"

    def reopen(self) -> FsspecBackend:
        return FsspecBackend(self.url, storage_options=self.storage_options, lease_ttl=self.lease_ttl,
                             part_size=self.part_size)

    def _p(self, rel: str) -> str:
        return f"{self.root}/{check_relpath(rel)}" if rel else self.root

    def where(self, rel: str) -> str:
        return f"{self.url}/{rel}" if rel else self.url

    def denied(self, operation: str, rel: str, exc: BaseException) -> str:
        """The one line for a request the store refused (see :func:`_denied`)."""
        scheme, _, rest = self.url.partition("://")
        bucket = rest.split("/", 1)[0] if rest else self.url
        reason = str(exc.args[-1] if exc.args else exc) or type(exc).__name__
        return (f"access denied by {scheme}://{bucket} ({reason}) to {operation} {self.where(rel)}: check the "
                f"credentials (storage_options, the AWS_* variables or ~/.aws) and that the bucket policy lets them "
                f"{operation} there")

    # ------------------------------------------------------------------ primitives
    @_denied("read")
    def read(self, rel: str, start: int = 0, end: int | None = None) -> bytes | None:
        path = self._p(rel)
        try:
            if start == 0 and end is None:
                return bytes(self.fs.cat_file(path))
            if end is None or end > start:
                return bytes(self.fs.cat_file(path, start=start, end=end))
        except FileNotFoundError:
            return None
        except OSError as exc:  # S3: a range that starts at or past the end is "not satisfiable"
            if exc.errno != errno.EINVAL:
                raise
        return None if self.size(rel) is None else b""

    def create(self, rel: str, data: bytes) -> bool:
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

    @_denied("list")
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

    @_denied("read")
    def size(self, rel: str) -> int | None:
        path = self._p(rel)
        self.fs.invalidate_cache(path)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        return None if info.get("type") == "directory" else int(info["size"])

    @_denied("read")
    def signature(self, rel: str) -> Hashable | None:
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

    def open_upload(self, rel: str) -> _Upload:
        return _Upload(self.fs, self._p(rel), self.part_size)

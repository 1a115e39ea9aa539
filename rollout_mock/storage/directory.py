"""The local-directory backend: atomic renames, fsync, flock, no symlink surprises.

Every write goes to a temporary file (``O_CREAT | O_EXCL | O_NOFOLLOW``) beside its destination,
is fsync-ed, and is then renamed over it (or hard-linked to it when it must not exist yet: a
conditional ``create``); the directory is fsync-ed after. A crash at any moment leaves the old
object, the new complete one, or a temporary file that :func:`is_temp_name` recognises, that
listings hide and that :meth:`LocalBackend.recover` removes. Locks are ``flock`` on files opened
with ``O_NOFOLLOW``: they die with their process, so a crashed writer never blocks the next one.
Every path goes through :func:`~rollout_mock.storage.paths.resolve_inside`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_mock.errors import DiskFullError, LockedError
from rollout_mock.storage.backend import BackendDefaults
from rollout_mock.storage.paths import (
    check_relpath,
    open_at,
    open_dir_inside,
    open_nofollow,
    open_regular,
    read_fd_range,
    resolve_inside,
)
from rollout_mock.text import logger

if TYPE_CHECKING:  # pragma: no cover
    from rollout_mock.codec.safe import ByteSource

__all__ = ["TEMP_MARKER", "AppendFile", "LocalBackend", "TempFile", "atomic_write", "disk_full_error", "free_bytes",
           "fsync_dir", "fsync_path", "is_temp_name", "temp_name", "write_inside", "write_temp"]

TEMP_MARKER = ".tmp-"
_IOV_MAX = min(getattr(os, "sysconf", lambda name: 1024)("SC_IOV_MAX"), 1024)
#: Objects created unsynced are synced at the latest after this many creates.
_SYNC_EVERY = 1024


def temp_name(final_name: str) -> str:
    return f".{final_name}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and TEMP_MARKER in name


def fsync_path(path: Path) -> None:
    """fsync a file that was written without it (absent files are fine: deleted since)."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def free_bytes(path: Path) -> int:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def disk_full_error(path: Path | str, needed: int) -> DiskFullError:
    """:class:`DiskFullError` for ``path``, with ``needed``/``free`` bytes as attributes too."""
    free = free_bytes(Path(path).parent)
    return DiskFullError(
        f"no space left on device while writing {path}: it needs {needed} bytes "
        f"({needed / 1e6:.2f} MB), {free} bytes ({free / 1e6:.2f} MB) are free; free some space "
        f"or point dump_dir at a larger disk (nothing partial was left behind)",
        path=path, needed=needed, free=free,
    )


class TempFile:
    """The one atomic writer of rollout_mock (every file a dump, a bundle, a report or a chart
    is written through it): a temporary file beside ``final_path`` (``O_CREAT | O_EXCL |
    O_NOFOLLOW``, a regular file only), moved into place by :meth:`commit` (rename) or
    :meth:`commit_new` (a hard link: only if ``final_path`` does not exist); a
    :class:`~rollout_mock.storage.backend.Upload`. ``durable=False`` skips the fsyncs. With
    ``dir_fd`` (a descriptor of ``final_path``'s directory, reached by the caller without
    following links: :func:`write_inside`) every operation is relative to it, so no link swapped
    into the path meanwhile can redirect the write."""

    def __init__(self, final_path: Path, *, durable: bool = True, dir_fd: int | None = None) -> None:
        if dir_fd is None:
            final_path.parent.mkdir(parents=True, exist_ok=True)
        self.final_path, self.durable, self.dir_fd = final_path, durable, dir_fd
        self.temp_path = final_path.parent / temp_name(final_path.name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        self.fd = open_nofollow(self.temp_path, flags) if dir_fd is None else \
            open_at(dir_fd, self.temp_path.name, flags, 0o644, final_path)
        self.position = 0

    def _names(self) -> tuple[Any, Any, dict[str, int]]:
        """(temporary, final, keywords) for the ``os`` calls: names relative to ``dir_fd``, or paths."""
        if self.dir_fd is None:
            return self.temp_path, self.final_path, {}
        return self.temp_path.name, self.final_path.name, {"src_dir_fd": self.dir_fd, "dst_dir_fd": self.dir_fd}

    def _sync_dir(self) -> None:
        if self.dir_fd is None:
            fsync_dir(self.final_path.parent)
        else:
            os.fsync(self.dir_fd)

    def write(self, data: memoryview) -> None:
        done = 0
        while done < data.nbytes:
            done += os.write(self.fd, data[done:])
        self.position += data.nbytes

    def writev(self, views: list[memoryview]) -> None:
        pending = [view for view in views if view.nbytes]
        self.position += sum(view.nbytes for view in pending)
        while pending:
            done = os.writev(self.fd, pending[:_IOV_MAX])
            while pending and done >= pending[0].nbytes:
                done -= pending[0].nbytes
                pending.pop(0)
            if done:
                pending[0] = pending[0][done:]

    def reserve(self, length: int) -> bool:
        """Skip ``length`` bytes at the start of an empty file (written last by :meth:`write_at`)."""
        if self.position:
            return False
        os.lseek(self.fd, length, os.SEEK_SET)
        self.position = length
        return True

    def write_at(self, data: memoryview, offset: int) -> None:
        done = 0
        while done < data.nbytes:
            done += os.pwrite(self.fd, data[done:], offset + done)

    def _close(self) -> None:
        if self.fd >= 0:
            try:
                if self.durable:
                    os.fsync(self.fd)
            finally:
                os.close(self.fd)
                self.fd = -1

    def commit(self) -> None:
        """Rename into place (atomic) and fsync the directory so the rename is durable."""
        temp, final, at = self._names()
        try:
            self._close()
            os.replace(temp, final, **at)
        except BaseException:
            self.abort()
            raise
        if self.durable:
            self._sync_dir()

    def commit_new(self) -> bool:
        """Move into place only if ``final_path`` does not exist (a hard link: atomic and
        exclusive); False, and the temporary file removed, if it does."""
        temp, final, at = self._names()
        try:
            self._close()
            os.link(temp, final, **at, follow_symlinks=False)
        except FileExistsError:
            return False
        finally:
            self.abort()
        if self.durable:
            self._sync_dir()
        return True

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            if self.dir_fd is None:
                os.unlink(self.temp_path)
            else:
                os.unlink(self.temp_path.name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass


def write_temp(final_path: Path, data: bytes, *, durable: bool = True, dir_fd: int | None = None) -> TempFile:
    """``data`` written to a :class:`TempFile` of ``final_path``, ready to commit; on an error the
    temporary file is removed and ``ENOSPC`` becomes :class:`DiskFullError`."""
    upload = TempFile(final_path, durable=durable, dir_fd=dir_fd)
    try:
        upload.write(memoryview(data))
    except BaseException as exc:
        upload.abort()
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise disk_full_error(final_path, len(data)) from None
        raise
    return upload


def atomic_write(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace the file ``path`` (a user's choice: links on the way are followed, a link at
    ``path`` itself is replaced) with ``data``, whole and durably (:class:`TempFile`). Its folder
    is created if needed."""
    target = Path(path)
    write_temp(target, data).commit()
    return target


def write_inside(root: str | os.PathLike[str], relpath: str, data: bytes) -> Path:
    """Atomically replace ``root/relpath`` with ``data`` (:class:`TempFile`), its folders reached
    (and created) below ``root`` with :func:`~rollout_mock.storage.paths.open_inside`'s rules:
    every component opened relative to its parent with ``O_NOFOLLOW``, so nothing is written
    through a link; a link at the destination is replaced, never followed."""
    parts = check_relpath(relpath).split("/")
    where = Path(root) / relpath
    os.makedirs(root, exist_ok=True)  # the root is the caller's choice (links followed there)
    dir_fd = open_dir_inside(root, parts[:-1], where, make_dirs=True)
    try:
        write_temp(where, data, dir_fd=dir_fd).commit()
    finally:
        os.close(dir_fd)
    return where


class AppendFile:
    """A file that lines are appended to (the metrics files, the dump run's expected metrics):
    one ``O_APPEND`` descriptor, each :meth:`append` written whole (a short write is finished, so
    a line is never left cut in the middle of the file), fsync-ed before it returns when
    ``durable``. Opened by :meth:`open` (a user's path) or by the store
    (:meth:`~rollout_mock.storage.store.Store.open_expected`, below the dump without following a
    link). ``ENOSPC`` propagates as the ``OSError`` it is (the caller names the step)."""

    FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT

    def __init__(self, fd: int, where: Path | str, *, durable: bool = False) -> None:
        self._fd: int | None = fd
        self.where, self.durable = where, durable

    @classmethod
    def open(cls, path: Path, *, durable: bool = False) -> AppendFile:
        """``path`` (a user's choice: links followed) opened for appending, its folder created."""
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls(os.open(path, cls.FLAGS, 0o644), path, durable=durable)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.where}: the file is closed")
        return self._fd

    def drop_torn_tail(self) -> int:
        """Cut an incomplete last line (left by a crash mid-write) before anything is appended;
        the bytes dropped (0: the file is empty or ends with a line break). Assumes no other
        process is appending at that moment."""
        fd = self.fileno()
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return 0
        keep = os.pread(fd, size, 0).rfind(b"\n") + 1
        os.ftruncate(fd, keep)
        return size - keep

    def append(self, data: bytes) -> None:
        fd, view = self.fileno(), memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if self.durable:
            os.fsync(fd)

    def close(self) -> None:
        """Fsync (when ``durable``) and close; calling it again does nothing."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)


class LocalBackend(BackendDefaults):
    """Objects as files under a local directory (see the module docstring)."""

    def __init__(self, dump_dir: str | os.PathLike[str]) -> None:
        self.dump_dir = Path(dump_dir)
        self._real_root: str | None = None
        self._inside: set[str] = set()
        self.unsynced: list[Path] = []  # files created by create_unsynced, not yet fsync-ed

    def __repr__(self) -> str:
        return f"LocalBackend({str(self.dump_dir)!r})"

    def reopen(self) -> LocalBackend:
        return LocalBackend(self.dump_dir)

    def local_path(self, rel: str) -> Path:
        return self.path(rel)

    def path(self, rel: str) -> Path:
        """The local path of ``rel``, checked to stay inside ``dump_dir`` (symlinks resolved).

        A directory found to resolve inside is remembered for this backend object; the last
        component is checked on every call (one ``lstat``, a full resolve only for symlinks).
        """
        if not rel:
            return self.dump_dir
        parent, _, name = rel.rpartition("/")
        if parent and parent not in self._inside:
            if self._real_root is None:
                self._real_root = os.path.realpath(self.dump_dir)
            resolve_inside(self.dump_dir, parent, real_root=self._real_root)
            if os.path.isdir(self.dump_dir / parent):
                self._inside.add(parent)
        candidate = self.dump_dir / check_relpath(rel)
        if os.path.islink(candidate) or not parent:
            if self._real_root is None:
                self._real_root = os.path.realpath(self.dump_dir)
            resolve_inside(self.dump_dir, rel, real_root=self._real_root)
        return candidate

    def where(self, rel: str) -> str:
        return str(self.dump_dir / rel) if rel else str(self.dump_dir)

    # ------------------------------------------------------------------ required
    def read(self, rel: str, start: int = 0, end: int | None = None) -> bytes | None:
        try:
            # a regular file only: a FIFO or device planted as an index file never blocks
            fd = open_regular(self.path(rel))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return read_fd_range(fd, start, end)

    def _write_temp(self, rel: str, data: bytes, *, durable: bool = True) -> TempFile:
        # Another writer compacting at the same moment may remove an index directory that just
        # became empty (``prune_dirs``) between our mkdir and our temporary file: try again.
        for attempt in range(3):
            try:
                return write_temp(self.path(rel), data, durable=durable)
            except FileNotFoundError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def create(self, rel: str, data: bytes) -> bool:
        """Hard-link a complete temporary file to ``rel`` (fails if it exists)."""
        return self._write_temp(rel, data).commit_new()

    def create_unsynced(self, rel: str, data: bytes) -> bool:
        """``create`` without the fsyncs: a crash can lose the file, never tear it (a step's
        entry file: the store ignores a lost or torn entry, and the step file it names was
        fsync-ed before). :meth:`sync` makes such files durable, at the latest every
        ``_SYNC_EVERY`` creates."""
        if not self._write_temp(rel, data, durable=False).commit_new():
            return False
        self.unsynced.append(self.path(rel))
        if len(self.unsynced) >= _SYNC_EVERY:
            self.sync()
        return True

    def sync(self) -> None:
        """fsync the files created unsynced since the last sync, then their directories."""
        pending, self.unsynced = self.unsynced, []
        for path in pending:
            fsync_path(path)
        for directory in {path.parent for path in pending}:
            try:
                fsync_dir(directory)
            except FileNotFoundError:  # pruned by a compaction: its entries are in the manifest
                pass

    def replace(self, rel: str, data: bytes) -> None:
        self._write_temp(rel, data).commit()

    def listdir(self, rel_dir: str) -> list[str]:
        try:
            return [n for n in os.listdir(self.path(rel_dir)) if not is_temp_name(n)]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def remove(self, rels: list[str]) -> None:
        parents = set()
        for rel in rels:
            path = self.path(rel)
            try:
                path.unlink()
                parents.add(path.parent)
            except FileNotFoundError:
                pass
        for parent in parents:
            try:
                fsync_dir(parent)
            except FileNotFoundError:  # pruned by another writer's compaction: nothing to sync
                pass

    # ------------------------------------------------------------------ optional
    def prune_dirs(self, rel_dirs: list[str]) -> None:
        for rel in rel_dirs:
            try:
                os.rmdir(self.path(rel))
            except OSError:  # not empty (another rank's entries), or gone
                pass

    def size(self, rel: str) -> int | None:
        try:
            return self.path(rel).stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def signature(self, rel: str) -> Hashable | None:
        try:
            st = self.path(rel).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def open_upload(self, rel: str) -> TempFile:
        return TempFile(self.path(rel))

    def open_source(self, rel: str, *, mapped: bool = False) -> ByteSource:
        from rollout_mock.codec import FileSource, MappedSource

        return (MappedSource if mapped else FileSource)(self.path(rel))

    def lock(self, rel: str, holder: str, *, wait: float = 0.0) -> Any:
        """``flock`` on the file ``rel`` (created if needed, never through a link), which then
        names ``holder``; ``wait > 0`` waits for the holder (a flock cannot outlive its process)."""
        parent = rel.rpartition("/")[0]
        self.path(parent).mkdir(parents=True, exist_ok=True)
        self._inside.discard(parent)  # re-check containment now that it exists
        path = self.path(rel)
        fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait > 0 else fcntl.LOCK_NB))
        except BlockingIOError:
            owner = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise LockedError(f"{path} is held by {owner}", path=path) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode("utf-8", "replace")[:200], 0)
        return fd

    def unlock(self, handle: Any) -> None:
        os.close(handle)

    def lock_lost(self, handle: Any) -> str | None:
        return None  # a flock dies with its process, never while it lives

    def recover(self, rel_dir: str, names: Callable[[str], bool]) -> None:
        try:
            found = os.listdir(self.path(rel_dir))
        except (FileNotFoundError, NotADirectoryError):
            return
        for name in found:
            if is_temp_name(name) and names(name[1:].split(TEMP_MARKER, 1)[0]):
                rel = f"{rel_dir}/{name}" if rel_dir else name
                logger.warning("[RolloutMock] removing leftover temporary file %s", self.where(rel))
                self.path(rel).unlink(missing_ok=True)

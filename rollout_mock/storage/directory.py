"""A dump directory on a local filesystem: atomic renames, fsync, flock, no symlink surprises.

Every file write goes to a temporary file (``O_CREAT | O_EXCL | O_NOFOLLOW``) beside its
destination, is fsync-ed, and is then renamed over it (or hard-linked to it when it must not
exist yet: the exclusive create of an entry file); the directory is fsync-ed after. Writer locks
are ``flock`` on ``.writer[-rankR].lock`` files opened with ``O_NOFOLLOW``: they die with their
process, so a crashed writer never blocks the next one. Every path goes through
:func:`~rollout_mock.storage.paths.resolve_inside`.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollout_mock.errors import LockedError
from rollout_mock.storage.backend import ProduceBytes
from rollout_mock.storage.fileio import fsync_dir, fsync_path, is_temp_name, write_temp
from rollout_mock.storage.index import FINGERPRINT_NAME, INDEX_DIR, STREAMS_DIR, stream_record_name
from rollout_mock.storage.manifest import LOCK_NAME, MANIFEST_NAME, StreamId, utc_now
from rollout_mock.storage.paths import check_relpath, open_nofollow, open_regular, read_fd, resolve_inside
from rollout_mock.storage.store import Store
from rollout_mock.text import logger

__all__ = ["DirectoryStore", "LocalBackend"]


@contextmanager
def locked(dump_dir: Path) -> Iterator[None]:
    """Hold the dump directory's manifest lock (exclusive, released when the process dies)."""
    Path(dump_dir).mkdir(parents=True, exist_ok=True)
    fd = open_nofollow(Path(dump_dir) / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove_stale_temps(dump_dir: Path) -> list[Path]:
    """Delete temporary manifests left by writers that died mid-update; return what went.

    Temporary manifests are only written under the manifest lock, so any that exists while we
    hold the lock belongs to a dead writer.
    """
    removed: list[Path] = []
    with locked(dump_dir):
        for child in Path(dump_dir).iterdir():
            if is_temp_name(child.name) and child.name.startswith(f".{MANIFEST_NAME}"):
                child.unlink(missing_ok=True)
                removed.append(child)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: Entry files committed without fsync are synced at the latest after this many steps.
_SYNC_EVERY = 1024


class DirectoryStore(Store):
    """The store of a dump in a local directory: ``Store`` over a :class:`LocalBackend` (this
    class only builds it; every rule is the store's)."""

    backend: LocalBackend
    dump_dir: Path

    def __init__(self, dump_dir: str | os.PathLike[str], *, hmac_key: bytes | None = None,
                 verify: bool = True) -> None:
        super().__init__(LocalBackend(dump_dir), hmac_key=hmac_key, verify=verify)

    def path(self, rel: str) -> Path:
        """The local path of ``rel``, checked to stay inside the dump."""
        return self.backend.path(rel)

    @property
    def _unsynced(self) -> list[Path]:  # deprecated: ``store.backend.unsynced``
        return self.backend.unsynced


class LocalBackend:
    """Objects as files under a local directory (see the module docstring)."""

    def __init__(self, dump_dir: str | os.PathLike[str]) -> None:
        self.dump_dir = Path(dump_dir)
        self.root_location: Path = self.dump_dir
        self._real_root: str | None = None
        self._inside: set[str] = set()
        self.unsynced: list[Path] = []  # entry files created without fsync (see create)

    def __repr__(self) -> str:
        return f"LocalBackend({str(self.dump_dir)!r})"

    def reopen(self) -> LocalBackend:
        return LocalBackend(self.dump_dir)

    def local_path(self, rel: str) -> Path:
        return self.path(rel)

    # ------------------------------------------------------------------ paths
    def path(self, rel: str) -> Path:
        """The local path of ``rel``, checked to stay inside ``dump_dir`` (symlinks resolved).

        A directory found to resolve inside is remembered for this store object; the last
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

    # ------------------------------------------------------------------ primitives
    def read(self, rel: str) -> bytes | None:
        try:
            # a regular file only: a FIFO or device planted as an entry/stream record never blocks
            return read_fd(open_regular(self.path(rel)))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _write_temp(self, rel: str, data: bytes, *, durable: bool = True) -> Any:
        # Another writer compacting at the same moment may remove an index directory that just
        # became empty (``prune_dirs``) between our mkdir and our temporary file: try again.
        for attempt in range(3):
            try:
                return write_temp(self.path(rel), lambda w: w.write(data) and None, durable=durable)
            except FileNotFoundError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def create(self, rel: str, data: bytes, *, durable: bool = True) -> bool:
        """Hard-link a complete temporary file to ``rel`` (fails if it exists). ``durable=False``
        (a step's entry file) skips the fsyncs: a crash can lose the file, never tear it; the
        store ignores a lost or torn entry (its step is invisible), and the step file it points at
        was fsync-ed before. :meth:`sync` makes such files durable, at the latest every
        ``_SYNC_EVERY`` creates."""
        if durable:
            return bool(self._write_temp(rel, data).commit_new())
        if not self._write_temp(rel, data, durable=False).commit_new(durable=False):
            return False
        self.unsynced.append(self.path(rel))
        if len(self.unsynced) >= _SYNC_EVERY:
            self.sync()
        return True

    def sync(self) -> None:
        """fsync the entry files committed since the last sync, then their directories."""
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

    def prune_dirs(self, rel_dirs: list[str]) -> None:
        for rel in rel_dirs:
            try:
                os.rmdir(self.path(rel))
            except OSError:  # not empty (another rank's entries), or gone
                pass

    def exists(self, rel: str) -> bool:
        return self.path(rel).exists()

    def signature(self, rel: str) -> Any:
        try:
            st = self.path(rel).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def write_step(self, rel: str, produce: ProduceBytes, *, hmac_key: bytes | None,
                   context: bytes) -> tuple[int, str, str | None]:
        # the sink is fileio's HashingWriter: write, plus the codec's ranged writes (reserve_head, ...)
        written = write_temp(self.path(rel), produce, hmac_key=hmac_key, mac_context=context)
        written.commit()
        return written.size, written.checksum, written.hmac

    def open_source(self, rel: str, *, mapped: bool = False) -> Any:
        from rollout_mock.codec import FileSource, MappedSource

        return (MappedSource if mapped else FileSource)(self.path(rel))

    # ------------------------------------------------------------------ locks
    def lock_stream(self, stream: StreamId) -> Any:
        directory = self.path(stream.directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.path(stream.directory)  # re-check containment now that it exists
        suffix = "" if stream.rank is None else f"-rank{stream.rank}"
        lock_path = self.path(f"{stream.directory}/.writer{suffix}.lock")
        fd = open_nofollow(lock_path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise LockedError(
                f"[RolloutMock] another writer is already dumping {stream} into {self.dump_dir} "
                f"({owner}). Two schedulers on one dump_dir and split must each have a distinct "
                f"`name` (files go to {stream.split}/<name>/); two runs need two dump_dirs.",
                mode="dump",
                split=stream.split,
                path=lock_path,
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename} since {utc_now()}".encode(), 0)
        return fd

    def unlock_stream(self, stream: StreamId, handle: Any) -> None:
        os.close(handle)

    def lock_lost(self, handle: Any) -> str | None:
        return None  # a flock dies with its process, never while it lives

    @contextmanager
    def manifest_lock(self) -> Iterator[None]:
        self.path("").mkdir(parents=True, exist_ok=True)
        with locked(self.dump_dir):
            yield

    def recover(self, stream: StreamId) -> None:
        for stale in remove_stale_temps(self.dump_dir):
            logger.warning("[RolloutMock] removing leftover temporary manifest %s", stale)
        suffix = "" if stream.rank is None else f"_rank{stream.rank}"
        pattern = re.compile(rf"^\.step_-?\d+{re.escape(suffix)}\.(pkl|json)\.tmp-"
                             rf"|^\.segment_\d+{re.escape(suffix)}\.json\.tmp-"
                             rf"|^\.{re.escape(stream_record_name(stream))}\.tmp-")
        for name in os.listdir(self.path("")):
            # another process's exclusive create of the fingerprint: stale once that pid is gone
            match = re.match(rf"^\.{re.escape(FINGERPRINT_NAME)}\.tmp-(\d+)-", name)
            if match and not _pid_alive(int(match.group(1))):
                self.path(name).unlink(missing_ok=True)
        for rel_dir in (stream.directory, f"{stream.directory}/{INDEX_DIR}", STREAMS_DIR):
            try:
                names = os.listdir(self.path(rel_dir))
            except FileNotFoundError:
                continue
            for name in names:
                if is_temp_name(name) and pattern.match(name):
                    logger.warning("[RolloutMock] removing leftover temporary file %s", self.where(f"{rel_dir}/{name}"))
                    self.path(f"{rel_dir}/{name}").unlink(missing_ok=True)

"""Crash-safe file writes and checksummed reads.

Writes go to a temporary file in the destination's own directory (so the final ``os.replace`` is
atomic), are fsync-ed, and only then renamed; the directory is fsync-ed after the rename. A crash
at any moment leaves either the old file, the new complete file, or a temporary file that
:func:`is_temp_name` recognises and that writers delete when they open the directory.

Checksums (CRC-32, plus HMAC-SHA256 when a key is given, keyed over a context that binds the
bytes to their stream and step: see :func:`mac_context`) are computed while the bytes stream
through. With ISA-L's CRC-32 (:mod:`rollout_mock.crc`, ~12 GB/s on one core) and no HMAC, the
checksum runs inline, on 1 MiB pieces just before they are written (or just after they are read),
while they are in the CPU cache: measured, that costs less than handing buffers to a thread. With
zlib's CRC-32 (the fallback, 2-7 GB/s) or an HMAC, large buffers are hashed on a helper thread so
the hashing overlaps with the disk I/O (``zlib.crc32``, ISA-L and ``hmac`` release the GIL).
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rollout_mock.crc as _crc
from rollout_mock.errors import DiskFullError
from rollout_mock.storage.digest import _PIECE, Digest
from rollout_mock.storage.paths import open_nofollow

__all__ = [
    "HashingWriter",
    "TEMP_MARKER",
    "WrittenFile",
    "disk_full_error",
    "free_bytes",
    "fsync_dir",
    "fsync_path",
    "is_temp_name",
    "temp_name",
    "write_bytes_atomic",
    "write_temp",
]

TEMP_MARKER = ".tmp-"
_IOV_MAX = min(getattr(os, "sysconf", lambda name: 1024)("SC_IOV_MAX"), 1024)


def temp_name(final_name: str) -> str:
    return f".{final_name}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and TEMP_MARKER in name


class HashingWriter:
    """A minimal binary file object that hashes and counts what goes through ``write``.

    Handles partial writes of the underlying raw file; large buffers are written without copies.
    """

    def __init__(self, fd: int, digest: Digest) -> None:
        self._fd = fd
        self.digest = digest
        self.size = 0
        #: the ENOSPC error that stopped writing; later writes are only counted, so that
        #: :attr:`size` ends up as the number of bytes the whole file needs.
        self.disk_full: OSError | None = None
        self._head_length: int | None = None  # see reserve_head

    def _guarded(self, run: Callable[[], None]) -> None:
        """Run a write unless the disk filled up earlier; ENOSPC is recorded, not raised."""
        if self.disk_full is not None:
            return
        try:
            run()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            self.disk_full = exc

    def _write_all(self, view: memoryview, offset: int | None = None) -> None:
        done = 0
        while done < view.nbytes:
            rest = view[done:]
            done += os.write(self._fd, rest) if offset is None else os.pwrite(self._fd, rest, offset + done)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = view.nbytes
        # inline digests: hash a piece, then write it while it is still in the CPU cache
        step = total if self.digest.threaded or total <= _PIECE else _PIECE

        def run() -> None:
            for start in range(0, total, step) if total else ():
                piece = view[start : start + step]
                self.digest.update(piece)
                self._write_all(piece)

        self._guarded(run)
        self.size += total
        return total

    def reserve_head(self, length: int) -> bool:
        """Leave the first ``length`` bytes of an empty file to :meth:`write_head` (called last),
        so the body can be written before the head's contents are known. False (nothing done)
        when the digest needs every byte in order (an HMAC) or something was written already."""
        if self.digest.needs_bytes or self.size or self._head_length is not None:
            return False
        os.lseek(self._fd, length, os.SEEK_SET)
        self._head_length = length
        self.size += length
        return True

    def write_unhashed(self, data: Any) -> int:
        """Write bytes the caller will account for with ``digest.update_known`` (in file order)."""
        view = memoryview(data).cast("B")
        self._guarded(lambda: self._write_all(view))
        self.size += view.nbytes
        return view.nbytes

    def write_head(self, data: Any) -> None:
        """Write the head reserved by :meth:`reserve_head` (exactly its length) and put its
        CRC-32 in front of the digest."""
        view = memoryview(data).cast("B")
        if view.nbytes != self._head_length:
            raise ValueError(f"head of {view.nbytes} bytes, {self._head_length} reserved")
        self._guarded(lambda: self._write_all(view, offset=0))
        self.digest.prepend_known(_crc.crc32(view) & 0xFFFFFFFF, view.nbytes)
        self._head_length = None

    def write_vector(self, pieces: list[tuple[Any, int | None]]) -> int:
        """Write ``(data, crc or None)`` pieces in order with as few system calls as possible
        (``writev``); a given CRC is taken as the piece's (no second pass unless an HMAC needs
        the bytes), the other pieces are hashed."""
        views = [memoryview(data).cast("B") for data, _ in pieces]
        for view, (_, crc) in zip(views, pieces, strict=True):
            if crc is None or self.digest.needs_bytes:
                self.digest.update(view)
            else:
                self.digest.update_known(crc, view.nbytes)

        def run() -> None:
            pending = [view for view in views if view.nbytes]
            while pending:
                done = os.writev(self._fd, pending[:_IOV_MAX])
                while pending and done >= pending[0].nbytes:
                    done -= pending[0].nbytes
                    pending.pop(0)
                if done:
                    pending[0] = pending[0][done:]

        self._guarded(run)
        total = sum(view.nbytes for view in views)
        self.size += total
        return total

    def write_known(self, data: Any, crc: int) -> int:
        """Write ``data`` whose CRC-32 is ``crc`` (computed by the caller): no second pass over
        the bytes unless an HMAC needs them."""
        if self.digest.needs_bytes:
            return self.write(data)
        total = self.write_unhashed(data)
        self.digest.update_known(crc, total)
        return total


@dataclass(frozen=True)
class WrittenFile:
    """A fully written, fsync-ed temporary file, not yet renamed into place."""

    temp_path: Path
    final_path: Path
    size: int
    checksum: str
    hmac: str | None

    def commit(self) -> None:
        """Rename into place (atomic) and fsync the directory so the rename is durable."""
        os.replace(self.temp_path, self.final_path)
        fsync_dir(self.final_path.parent)

    def commit_new(self, *, durable: bool = True) -> bool:
        """Move into place only if ``final_path`` does not exist (a hard link: atomic and
        exclusive); False, and the temporary file removed, if it does. ``durable=False`` skips
        the directory fsync (the caller makes the name durable later)."""
        try:
            os.link(self.temp_path, self.final_path)
        except FileExistsError:
            return False
        finally:
            self.discard()
        if durable:
            fsync_dir(self.final_path.parent)
        return True

    def discard(self) -> None:
        try:
            os.unlink(self.temp_path)
        except FileNotFoundError:
            pass


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


def write_temp(
    final_path: Path,
    body: Callable[[HashingWriter], object],
    *,
    hmac_key: bytes | None = None,
    mac_context: bytes = b"",
    expected_size: int | None = None,
    durable: bool = True,
) -> WrittenFile:
    """Write ``final_path``'s future content to a temporary file beside it and fsync it
    (``durable=False``: no fsync; the caller syncs it later, see :func:`fsync_path`).

    On any error the temporary file is removed and the error re-raised; ``ENOSPC`` becomes
    :class:`DiskFullError` naming the bytes needed, the bytes free and the path.
    """
    final_path.parent.mkdir(parents=True, exist_ok=True)
    temp_path = final_path.parent / temp_name(final_path.name)
    fd = open_nofollow(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    writer = HashingWriter(fd, Digest(hmac_key, mac_context))
    try:
        try:
            body(writer)
            if writer.disk_full is not None:
                raise writer.disk_full
            checksum, mac = writer.digest.finish()
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as exc:
        try:
            writer.digest.finish()
        except BaseException:
            pass
        try:
            os.unlink(temp_path)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            needed = expected_size if expected_size is not None else writer.size
            raise disk_full_error(final_path, needed) from exc
        raise
    return WrittenFile(temp_path, final_path, writer.size, checksum, mac)


def disk_full_error(path: Path, needed: int) -> DiskFullError:
    """:class:`DiskFullError` for ``path``, with ``needed``/``free`` bytes as attributes too."""
    free = free_bytes(path.parent)
    error = DiskFullError(
        f"no space left on device while writing {path}: it needs {needed} bytes "
        f"({needed / 1e6:.2f} MB), {free} bytes ({free / 1e6:.2f} MB) are free; free some space "
        f"or point dump_dir at a larger disk (nothing partial was left behind)",
        path=path,
        needed=needed,
        free=free,
    )
    return error


def write_bytes_atomic(final_path: Path, data: bytes) -> None:
    """Atomically replace ``final_path`` with ``data`` (temp file, fsync, rename, dir fsync)."""
    written = write_temp(final_path, lambda w: w.write(data) and None)
    written.commit()

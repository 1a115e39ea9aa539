"""Names and paths inside a dump: what a split, scheduler name or file may be, and the one
function every local path goes through.

Nothing read from a config, a manifest, an entry file or a caller's ``split=``/``name=`` may make
rollout_mock touch a path outside ``dump_dir``:

* names (splits, scheduler names) match :data:`NAME_PATTERN`: letters, digits, ``_ . -``, not
  starting with ``.`` (so never ``.``, ``..`` or a hidden index directory), at most 128
  characters; no separators, no absolute paths;
* relative paths are rebuilt from validated names (:func:`check_relpath` refuses anything else);
* :func:`resolve_inside` joins a relative path to ``dump_dir`` and checks, on the real
  (symlink-resolved) path, that the result is still inside the real ``dump_dir``.

Symlinks: a split or name directory that is a symlink is **followed only if it resolves inside
dump_dir** (e.g. ``val -> train-copy`` within the dump); one that points outside is refused with
:class:`~rollout_mock.errors.UnsafePathError`. The same holds for step files. Lock files and
temporary files are opened with ``O_NOFOLLOW`` (temporaries also ``O_CREAT | O_EXCL``), so a
planted symlink there is an error, never a write through it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
from pathlib import Path

from rollout_mock.errors import ManifestError, UnsafePathError

__all__ = [
    "NAME_PATTERN", "STEP_KEY", "check_name", "check_relpath", "is_url", "open_inside", "open_nofollow",
    "open_regular", "parse_step_key",
    "list_inside", "open_at", "open_dir_inside", "read_fd", "read_inside", "resolve_inside",
]

NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def check_name(value: object, what: str) -> str:
    """``value`` if it is a safe split or scheduler name, else :class:`UnsafePathError`."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise UnsafePathError(
            f"[RolloutMock] invalid {what} {value!r}: it must match {NAME_PATTERN.pattern} (letters, "
            f"digits, '_', '.', '-'; not starting with '.'; no '/', '\\', '..' or absolute paths), "
            f"because it becomes a directory name inside dump_dir",
            path=str(value),
        )
    return value


def check_relpath(relpath: str) -> str:
    """``relpath`` if it is a plain relative path of safe components, else UnsafePathError."""
    parts = relpath.split("/")
    if not relpath or relpath.startswith("/") or "\\" in relpath or any(
        p in ("", ".", "..") or "\x00" in p for p in parts
    ):
        raise UnsafePathError(f"[RolloutMock] refusing path {relpath!r}: not a plain relative path "
                              f"inside dump_dir", path=relpath)
    return relpath


#: A step key as written: ASCII digits only (``str.isdigit`` accepts ``'²'``, ``int`` accepts
#: Arabic-Indic digits and ``'_'``), at most 18 of them (no 5,000-digit int conversions).
STEP_KEY = re.compile(r"-?[0-9]{1,18}", re.ASCII)


def parse_step_key(key: object, where: object = "manifest.json") -> int:
    """The step of a manifest step key (``"12"``, ``"-1"``); :class:`ManifestError` for anything
    else (``'²'``, ``'--5'``, ``' 5'``, a 5,000-digit number, a non-string) naming ``where``."""
    if not isinstance(key, str) or not STEP_KEY.fullmatch(key) or key in ("-0",) or (
        len(key.lstrip("-")) > 1 and key.lstrip("-").startswith("0")
    ):
        shown = repr(key)[:60] if isinstance(key, str) else type(key).__name__
        raise ManifestError(f"{where}: step key {shown} is not an integer step number; "
                            f"the manifest was edited or damaged — restore it from a copy, or re-dump",
                            path=str(where))
    return int(key)


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is an fsspec URL (``s3://...``, ``memory://...``) rather than a path."""
    return isinstance(location, str) and bool(_URL.match(location))


def resolve_inside(root: Path, relpath: str, *, real_root: str | None = None) -> Path:
    """``root / relpath``, refusing results whose real path leaves the real ``root``.

    ``real_root`` is ``os.path.realpath(root)`` when the caller has it cached.
    """
    check_relpath(relpath)
    candidate = root / relpath
    real_root = real_root if real_root is not None else os.path.realpath(root)
    real = os.path.realpath(candidate)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise UnsafePathError(
            f"[RolloutMock] {candidate} resolves to {real}, outside dump_dir {real_root}: a symlinked "
            f"split, name directory or step file must point inside dump_dir; refusing to follow it",
            path=candidate,
        )
    return candidate


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a symlink at ``path`` (and any non-regular file)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as exc:
        if exc.errno == __import__("errno").ELOOP:
            raise UnsafePathError(
                f"[RolloutMock] {path} is a symbolic link; refusing to open it (lock and temporary "
                f"files are never followed through links). Remove the link.",
                path=path,
            ) from None
        raise
    import stat

    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"[RolloutMock] {path} is not a regular file; refusing to use it", path=path)
    return fd


# ---------------------------------------------------------------------------------------------
# One opening helper for every file under a dump (containment, no symlinks, no FIFOs/devices)
# ---------------------------------------------------------------------------------------------

_FLAGS = os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


def _refuse(path: object, why: str) -> UnsafePathError:
    return UnsafePathError(f"[RolloutMock] refusing to open {path}: {why}", path=str(path))


def _regular(fd: int, path: object) -> int:
    """``fd`` if it is a regular file (blocking mode restored), else closed and UnsafePathError."""
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "a directory" if stat.S_ISDIR(mode)
                    else "not a regular file")
            raise _refuse(path, f"it is {kind}, not a regular file (planted in the dump?); remove it")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o644, *,
                 follow: bool = True) -> int:
    """``os.open`` of a **regular file** only: opened with ``O_NONBLOCK`` (a FIFO never blocks the
    open) and checked with ``fstat`` before anything is read or written; a FIFO, device, socket or
    directory is :class:`UnsafePathError` (the fd is returned in blocking mode). ``follow=False``
    adds ``O_NOFOLLOW``. For a path whose containment the caller checked already (step files
    through ``DirectoryStore.path``); files named relative to a dump use :func:`open_inside`."""
    try:
        fd = os.open(path, flags | _FLAGS | (0 if follow else os.O_NOFOLLOW), mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise _refuse(path, "it is a symbolic link, a FIFO without a reader, or a directory") from None
        raise
    return _regular(fd, path)


def open_dir_inside(root: str | os.PathLike[str], parts: list[str], where: object, make_dirs: bool) -> int:
    """A descriptor of ``root/parts...``, each component opened below its parent with
    ``O_NOFOLLOW | O_DIRECTORY`` (created first with ``make_dirs``)."""
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in parts:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _FLAGS
            try:
                try:
                    next_fd = os.open(part, flags, dir_fd=dir_fd)
                except FileNotFoundError:
                    if not make_dirs:
                        raise
                    try:
                        os.mkdir(part, 0o755, dir_fd=dir_fd)
                    except FileExistsError:
                        pass
                    next_fd = os.open(part, flags, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse(where, f"{part!r} is a symbolic link or not a directory; nothing under "
                                         f"dump_dir is followed through links") from None
                raise
            os.close(dir_fd)
            dir_fd = next_fd
    except BaseException:
        os.close(dir_fd)
        raise
    return dir_fd


def open_at(dir_fd: int, name: str, flags: int, mode: int, where: object) -> int:
    """``os.open`` of the regular file ``name`` in the directory ``dir_fd``, never through a link
    (``where``: the path shown in errors)."""
    try:
        fd = os.open(name, flags | _FLAGS | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR):
            raise _refuse(where, "it is a symbolic link, a FIFO or a directory; nothing under dump_dir "
                                 "is followed through links") from None
        raise
    return _regular(fd, where)


def open_inside(root: str | os.PathLike[str], relpath: str, flags: int = os.O_RDONLY, mode: int = 0o644, *,
                make_dirs: bool = False) -> int:
    """Open ``root/relpath`` (a regular file) without ever leaving ``root``.

    ``relpath`` must be a plain relative path (:func:`check_relpath`). Every component below
    ``root`` is opened relative to its parent's descriptor with ``O_NOFOLLOW`` (a symlink
    anywhere below ``root`` is refused, whatever it points at: nothing is resolved by name
    twice, so a link swapped in meanwhile cannot redirect the open); directories are created
    with ``make_dirs``; the file itself is opened with ``O_NONBLOCK`` and must be a regular file
    (:func:`open_regular`). ``root`` itself is the user's choice and may be a symlink.
    Errors: :class:`UnsafePathError` for a link, FIFO, device, or a path component that is not a
    directory; ``FileNotFoundError`` when the file (or, without ``make_dirs``, a directory) is
    missing; other ``OSError`` as raised.
    """
    parts = check_relpath(relpath).split("/")
    where = Path(root) / relpath
    dir_fd = open_dir_inside(root, parts[:-1], where, make_dirs)
    try:
        return open_at(dir_fd, parts[-1], flags, mode, where)
    finally:
        os.close(dir_fd)


def read_fd(fd: int, *, limit: int | None = None) -> bytes:
    """The bytes of the open file ``fd`` (closed afterwards). With ``limit``, at most
    ``limit + 1`` bytes are ever read: a result longer than ``limit`` means the file is too large
    (the caller says so in its own error)."""
    try:
        chunks: list[bytes] = []
        total = 0
        cap = None if limit is None else limit + 1
        while cap is None or total < cap:
            chunk = os.read(fd, 1 << 20 if cap is None else min(1 << 20, cap - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_fd_range(fd: int, start: int = 0, end: int | None = None) -> bytes:
    """Bytes ``[start:end)`` of the open file ``fd`` (closed afterwards; ``end`` past the end
    stops there)."""
    if start == 0 and end is None:
        return read_fd(fd)
    try:
        size = os.fstat(fd).st_size
        stop = size if end is None else min(end, size)
        return os.pread(fd, max(stop - start, 0), start) if stop > start else b""
    finally:
        os.close(fd)


def read_inside(root: str | os.PathLike[str], relpath: str, *, limit: int | None = None) -> bytes | None:
    """The bytes of ``root/relpath`` opened with :func:`open_inside` (see :func:`read_fd` for
    ``limit``); ``None`` when it (or a directory on the way) does not exist."""
    try:
        fd = open_inside(root, relpath)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return read_fd(fd, limit=limit)


def list_inside(root: str | os.PathLike[str], relpath: str) -> list[str]:
    """The names in the folder ``root/relpath``, reached with :func:`open_inside`'s rules (a
    symlink anywhere below ``root``, or a component that is not a directory, is
    :class:`UnsafePathError`); ``[]`` when it does not exist."""
    try:
        dir_fd = open_dir_inside(root, check_relpath(relpath).split("/"), Path(root) / relpath, False)
    except FileNotFoundError:
        return []
    try:
        return os.listdir(dir_fd)
    finally:
        os.close(dir_fd)

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

import os
import re
from pathlib import Path

from rollout_mock.errors import UnsafePathError

__all__ = ["NAME_PATTERN", "check_name", "check_relpath", "is_url", "open_nofollow", "resolve_inside"]

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
        if exc.errno == getattr(__import__("errno"), "ELOOP"):
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

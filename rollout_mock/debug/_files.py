"""Atomic writes of the small text files the debug tools produce (reports, stall files, provenance)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from rollout_mock.storage.paths import write_inside

__all__ = ["write_text_atomic", "write_text_inside"]


def write_text_inside(root: str | os.PathLike[str], relpath: str, text: str) -> Path:
    """Write ``text`` to ``root/relpath`` atomically, never leaving ``root``: the containment
    rules of :func:`~rollout_mock.storage.paths.write_inside` (no symlinks below ``root``, the
    temporary file created exclusively, the rename relative to the directory's descriptor). For
    every file written under a dump (stall reports, expected metrics, provenance)."""
    return write_inside(root, relpath, text.encode("utf-8"))


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        # lone surrogates (from a hostile dump) are written as visible \udXXX escapes, never a crash
        with open(temp, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - directories that cannot be opened (some network filesystems)
        return path
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path

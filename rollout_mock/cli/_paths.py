"""Finding the dump a read-only command was pointed at, and saying so when it is elsewhere."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from rollout_mock.errors import DumpNotFoundError, dump_path_is_a_file
from rollout_mock.storage.manifest import MANIFEST_NAME

__all__ = ["find_dumps", "resolve_dump"]


def find_dumps(root: Path, depth: int = 2) -> list[Path]:
    """Folders holding ``manifest.json`` one to ``depth`` levels below ``root``."""
    found: list[Path] = []
    level = [root]
    for _ in range(depth):
        below: list[Path] = []
        for folder in level:
            try:
                children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
            except OSError:
                continue
            for child in children:
                (found if (child / MANIFEST_NAME).is_file() else below).append(child)
        level = below
    return found


def resolve_dump(location: str | Path, command: str, rest: str = "") -> Any:
    """``location`` when it holds a dump (an fsspec URL or a bundle is passed through as is: its
    store says); otherwise a DumpNotFoundError that says where dumps are (one or two levels down),
    or what kind of folder it is, with the command to run instead."""
    from rollout_mock.storage.bundle import is_bundle
    from rollout_mock.storage.paths import is_url
    from rollout_mock.storage.store import open_store

    if is_url(str(location)) or is_bundle(location):
        return str(location)
    path = Path(location)
    if (path / MANIFEST_NAME).is_file() or (path.is_dir() and open_store(path).has_dump()):
        return path
    if not path.exists():
        raise DumpNotFoundError(f"dump directory not found: no such folder: {path}", path=path)
    if not path.is_dir():
        raise dump_path_is_a_file(path)
    suffix = f" {rest}" if rest else ""
    below = find_dumps(path)
    if below:
        listing = "; ".join(f"rollout-mock {command} {shlex.quote(str(p))}{suffix}" for p in below[:5])
        more = f" (and {len(below) - 5} more)" if len(below) > 5 else ""
        raise DumpNotFoundError(
            f"{path} is not a dump itself (no {MANIFEST_NAME}), but {len(below)} dump(s) are inside it{more}: "
            f"{listing}", path=path,
        )
    from rollout_mock.adapters.foreign import detect_format

    fmt = detect_format(path)
    if fmt is not None:
        raise DumpNotFoundError(
            f"{path} is a {fmt} dump, not a rollout_mock one (no {MANIFEST_NAME}); convert it once: "
            f"rollout-mock import {shlex.quote(str(path))} {shlex.quote(f'{path}_imported')} --trust  "
            f"(then: rollout-mock {command} {shlex.quote(f'{path}_imported')}{suffix})",
            path=path,
        )
    raise DumpNotFoundError(
        f"{path} holds no dump (no {MANIFEST_NAME} here or two levels below); pass the dump_dir "
        f"a dump-mode run wrote", path=path,
    )

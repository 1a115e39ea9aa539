"""Reading dumps outside a training run: one step file, or a whole dump (a directory or an
fsspec URL such as ``s3://bucket/prefix``).

For notebooks, scripts and the CLI. Nothing here unpickles unless a batch is asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_mock.errors import ManifestError
from rollout_mock.storage.directory import DirectoryStore
from rollout_mock.storage.index import STREAMS_DIR, parse_step_relpath
from rollout_mock.storage.manifest import MANIFEST_NAME, Manifest, StepEntry, StreamId
from rollout_mock.storage.store import Store
from rollout_mock.storage.stores import open_store
from rollout_mock.storage.verified import load_verified
from rollout_mock.text import logger

__all__ = ["Dump", "RecordedStep", "load_step", "open_dump"]


__all__ = ["Dump", "RecordedStep", "load_step", "open_dump"]


def _find_entry(path: Path) -> tuple[StreamId, int, StepEntry | None] | None:
    """The dump holding ``path`` (one to three directories up) and the step it is, with its
    index entry (None if the dump does not list it); None when no dump is found."""
    resolved = path.resolve()
    for dump_dir in list(resolved.parents)[:3]:
        if not ((dump_dir / MANIFEST_NAME).is_file() or (dump_dir / STREAMS_DIR).is_dir()):
            continue
        parsed = parse_step_relpath(resolved.relative_to(dump_dir).as_posix())
        if parsed is None:
            return None
        stream, step = parsed
        return stream, step, DirectoryStore(dump_dir).entry(stream, step)
    return None


def load_step(
    path: str | os.PathLike[str],
    *,
    trusted: bool = False,
    verify: bool = True,
    hmac_key: bytes | None = None,
) -> Any:
    """Load one ``step_*.pkl`` on its own.

    When the dump's index is beside it (one to three directories up), the file's size and
    checksum are verified first-hand against its entry. With ``hmac_key`` the file must be
    signed for exactly the stream and step its path names — with or without ``verify``, and a
    file with no entry (no manifest, renamed, copied elsewhere) is refused. ``trusted=True``
    allows arbitrary pickled objects (only for files you trust: unpickling can run code).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"[RolloutMock] step file not found: {path}")
    found = _find_entry(path) if (verify or hmac_key is not None) else None
    if found is None or found[2] is None:
        if found is not None and hmac_key is None:
            logger.warning("[RolloutMock] %s is not listed in its dump's index; loading it without "
                           "checksum verification", path)
        stream, step = (found[0], found[1]) if found is not None else (None, None)
        return load_verified(path, None, stream=stream, step=step, trusted=trusted, verify=False,
                             hmac_key=hmac_key)
    stream, step, entry = found
    return load_verified(path, entry, stream=stream, step=step, trusted=trusted, verify=True, hmac_key=hmac_key)


@dataclass(frozen=True)
class RecordedStep:
    stream: StreamId
    step: int
    entry: StepEntry
    path: Path | str
    """A local path, or the URL of the object for object-store dumps."""


class Dump:
    """A read-only view of a dump. Listing reads only the index (manifest.json, plus the entry
    files of writers that have not compacted yet); nothing is unpickled."""

    def __init__(self, dump_dir: str | os.PathLike[str], *, hmac_key: bytes | None = None,
                 storage_options: dict[str, Any] | None = None, verify: bool = True) -> None:
        self._store: Store = open_store(dump_dir, storage_options=storage_options, hmac_key=hmac_key,
                                               verify=verify)
        self.dump_dir: Path | str = self._store.dump_dir
        self.manifest: Manifest = self._store.require_manifest(mode="read")

    def __repr__(self) -> str:
        return f"Dump({str(self.dump_dir)!r})"

    @property
    def store(self) -> Store:
        return self._store

    def streams(self) -> list[StreamId]:
        return self.manifest.stream_ids()

    def stream(self, split: str = "train", name: str | None = None, rank: int | None = None) -> StreamId:
        stream = StreamId(split, name, rank)
        if self.manifest.stream(stream) is None:
            known = ", ".join(s.key for s in self.streams()) or "none"
            raise ManifestError(f"{self.dump_dir}: no stream {stream.key!r} (recorded: {known})",
                                path=str(self.dump_dir))
        return stream

    def steps(self, stream: StreamId) -> list[int]:
        return self.manifest.steps(stream)

    def entry(self, stream: StreamId, step: int) -> StepEntry | None:
        return self.manifest.entry(stream, step)

    def records(self) -> Iterator[RecordedStep]:
        for stream in self.streams():
            for step in self.steps(stream):
                entry = self.entry(stream, step)
                assert entry is not None
                where = self._store.where(entry.file)
                yield RecordedStep(stream, step, entry, Path(where) if isinstance(self.dump_dir, Path) else where)

    def _resolve(self, stream: StreamId | str) -> StreamId:
        """A StreamId, or a key such as ``"train"``, ``"train/math"``, ``"train@rank1"``."""
        if isinstance(stream, StreamId):
            return stream
        parsed = StreamId.from_key(stream)
        return self.stream(parsed.split, parsed.name, parsed.rank)

    def load(self, step: int, stream: StreamId | str = "train", *, keys: Iterable[str] | None = None,
             rows: range | slice | None = None, trusted: bool = False, mapped: bool = False) -> Any:
        """Load and verify one step (``stream`` may be a key: ``"train"``, ``"train/math@rank1"``).

        ``keys`` (top-level keys) and ``rows`` (batch rows, e.g. ``rank_rows(n, dp_rank,
        dp_size)``) read only what is needed from a format-2 step (ranged reads on object stores).
        ``mapped`` (local dumps): tensors are the step file's mapped pages, not a copy (see
        :meth:`open`); every chunk returned is still CRC-checked.
        """
        from rollout_mock.storage.partial import load_partial

        return load_partial(self._store, self._resolve(stream), step, keys=keys, rows=rows, trusted=trusted,
                            mapped=mapped)

    def open(self, step: int, stream: StreamId | str = "train", *, trusted: bool = False, mapped: bool = True,
             verify: bool = True) -> Any:
        """Open one step lazily: a :class:`~rollout_mock.codec.step.StepView` whose ``keys()``,
        ``nbytes`` and ``load(keys=, rows=)`` read only the header, then only what is asked for.

        Local dumps are mapped (``mapped=True``): a few keys or rows of a multi-GB step take
        milliseconds and no copy. ``verify`` checks the file's size and CRC-32 against the index
        (from the chunk table, without reading the data) and the CRC of every chunk handed out;
        ``verify=False`` reads nothing but the header, and the view's ``verified`` is False.
        """
        from rollout_mock.storage.partial import open_view

        return open_view(self._store, self._resolve(stream), step, trusted=trusted, mapped=mapped, verify=verify)


def open_dump(dump_dir: str | os.PathLike[str], *, hmac_key: bytes | None = None,
              storage_options: dict[str, Any] | None = None) -> Dump:
    """Open a dump (a directory or an fsspec URL) for reading; ``DumpNotFoundError`` if empty."""
    return Dump(dump_dir, hmac_key=hmac_key, storage_options=storage_options)

"""Reading dumps outside a training run: one step file, or a whole dump directory.

For notebooks, scripts and the CLI. Nothing here unpickles unless a batch is asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_mock._text import logger
from rollout_mock.errors import ManifestError
from rollout_mock.storage.directory import DirectoryStore
from rollout_mock.storage.manifest import (
    MANIFEST_NAME,
    Manifest,
    StepEntry,
    StreamId,
    read_manifest,
)
from rollout_mock.storage.verified import load_verified

__all__ = ["Dump", "RecordedStep", "load_step", "open_dump"]



def _find_entry(path: Path) -> tuple[Path, StreamId, int, StepEntry] | None:
    """The manifest entry listing ``path``, searching up to three directories up."""
    resolved = path.resolve()
    for dump_dir in list(resolved.parents)[:3]:
        if not (dump_dir / MANIFEST_NAME).is_file():
            continue
        manifest = read_manifest(dump_dir)
        assert manifest is not None
        relpath = resolved.relative_to(dump_dir).as_posix()
        for stream in manifest.stream_ids():
            data = manifest.stream(stream)
            assert data is not None
            for step_key, raw in data["steps"].items():
                if raw.get("file") == relpath:
                    entry = manifest.entry(stream, int(step_key))
                    assert entry is not None
                    return dump_dir, stream, int(step_key), entry
        logger.warning(
            "[RolloutMock] %s is not listed in %s; loading it without checksum verification",
            path,
            dump_dir / MANIFEST_NAME,
        )
        return None
    return None


def load_step(
    path: str | os.PathLike[str],
    *,
    trusted: bool = False,
    verify: bool = True,
    hmac_key: bytes | None = None,
) -> Any:
    """Load one ``step_*.pkl`` on its own.

    When the dump's ``manifest.json`` is beside it (one to three directories up), the file's size
    and checksum are verified first-hand against its entry. ``trusted=True`` allows arbitrary
    pickled objects (only for files you trust: unpickling can run code).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"[RolloutMock] step file not found: {path}")
    found = _find_entry(path) if verify else None
    if found is None:
        return load_verified(path, None, stream=None, step=None, trusted=trusted, verify=False)
    _, stream, step, entry = found
    return load_verified(
        path, entry, stream=stream, step=step, trusted=trusted, verify=True, hmac_key=hmac_key
    )


@dataclass(frozen=True)
class RecordedStep:
    stream: StreamId
    step: int
    entry: StepEntry
    path: Path


class Dump:
    """A read-only view of a dump directory. Listing reads only ``manifest.json``."""

    def __init__(self, dump_dir: str | os.PathLike[str], *, hmac_key: bytes | None = None) -> None:
        self.dump_dir = Path(dump_dir)
        self._store = DirectoryStore(self.dump_dir, hmac_key=hmac_key)
        self.manifest: Manifest = self._store.require_manifest(mode="read")

    def __repr__(self) -> str:
        return f"Dump({str(self.dump_dir)!r})"

    def streams(self) -> list[StreamId]:
        return self.manifest.stream_ids()

    def stream(self, split: str = "train", name: str | None = None, rank: int | None = None) -> StreamId:
        stream = StreamId(split, name, rank)
        if self.manifest.stream(stream) is None:
            known = ", ".join(s.key for s in self.streams()) or "none"
            raise ManifestError(f"{self.dump_dir}: no stream {stream.key!r} (recorded: {known})", path=self.dump_dir)
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
                yield RecordedStep(stream, step, entry, self.dump_dir / entry.file)

    def load(self, step: int, stream: StreamId | str = "train", *, trusted: bool = False) -> Any:
        """Load and verify one step (``stream`` may be a split name)."""
        if isinstance(stream, str):
            stream = self.stream(stream)
        return self._store.load(stream, step, trusted=trusted)


def open_dump(dump_dir: str | os.PathLike[str], *, hmac_key: bytes | None = None) -> Dump:
    """Open a dump directory for reading (``DumpNotFoundError`` if it has no manifest)."""
    return Dump(dump_dir, hmac_key=hmac_key)

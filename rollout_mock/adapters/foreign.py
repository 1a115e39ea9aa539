"""Other tools' rollout dumps: detect, list, load (trusted) and import into a rollout_mock dump.

Formats (one reader module each):

* ``roll``  — ROLL's own rollout mock: ``{dump_dir}/{train,val}/step_NNNNNN.pkl`` (pickled DataProto);
* ``verl``  — verl's ``skip.rollout``: ``.../{step}/gen_batch.dp`` + ``meta.json``
  (``DataProto.save_to_disk``, a plain pickle);
* ``areal`` — AReaL's ``trajectory_debug`` (PR #1407): ``step_NNNNNN.pt`` or
  ``step_NNNNNN_dp_R.pt`` (``torch.save`` of the list of trajectory dicts);
* ``slime`` — slime's ``--save-debug-rollout-data``: ``{rollout_id}.pt`` / ``eval_{rollout_id}.pt``
  (``torch.save({"rollout_id", "samples": [Sample.to_dict()...]})``).

All four are pickles (``torch.load(weights_only=False)`` for the ``.pt`` ones): loading one can run
code, so every load needs ``trust=True``. The imported dump holds only what the batch is made
of (tensors, arrays, plain containers, registered batch classes) and replays in safe mode.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_mock.errors import DumpNotFoundError, ForeignDumpError, RolloutMockError, UnsafePickleError
from rollout_mock.progress import progress_bar
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.store import BatchInfo, open_store

__all__ = ["FORMATS", "ForeignDump", "ForeignStep", "detect_format", "import_foreign", "open_foreign"]


#: format name -> reader module under rollout_mock.adapters
FORMATS: dict[str, str] = {
    "roll": "import_roll", "verl": "import_verl", "areal": "import_areal", "slime": "import_slime",
}


@dataclass(frozen=True)
class ForeignStep:
    """One recorded step of a foreign dump (not loaded)."""

    stream: StreamId
    step: int
    path: Path
    method: str
    loader: Callable[[Path], Any]

    def load(self) -> Any:
        return self.loader(self.path)


class ForeignDump:
    """A foreign dump directory: its format and steps; :meth:`load` needs ``trust=True``."""

    def __init__(self, root: Path, format: str, steps: list[ForeignStep], *, trust: bool) -> None:
        self.root = root
        self.format = format
        self.records = sorted(steps, key=lambda s: (s.stream.key, s.step))
        self.trust = trust

    def __repr__(self) -> str:
        return f"ForeignDump({str(self.root)!r}, format={self.format!r}, steps={len(self.records)})"

    def streams(self) -> list[StreamId]:
        seen: dict[str, StreamId] = {}
        for record in self.records:
            seen.setdefault(record.stream.key, record.stream)
        return list(seen.values())

    def steps(self, stream: StreamId | str = "train") -> list[int]:
        key = stream if isinstance(stream, str) else stream.key
        return [r.step for r in self.records if r.stream.key == key]

    def find(self, step: int, stream: StreamId | str = "train") -> ForeignStep:
        key = stream if isinstance(stream, str) else stream.key
        for record in self.records:
            if record.stream.key == key and record.step == step:
                return record
        raise ForeignDumpError(
            f"{self.root} ({self.format} dump): no step {step} in stream {key!r}; recorded: "
            + ", ".join(f"{s.key} {self.steps(s)}" for s in self.streams()),
            step=step, path=self.root,
        )

    def load(self, step: int, stream: StreamId | str = "train") -> Any:
        record = self.find(step, stream)
        if not self.trust:
            raise UnsafePickleError(
                f"{record.path} is a {self.format} dump file (a pickle: loading it can run code); "
                f"open it with open_foreign({str(self.root)!r}, trust=True) if you trust it, or convert "
                f"it once: rollout-mock import {self.root} NEW_DIR --trust",
                step=step, path=record.path,
            )
        try:
            return record.load()
        except RolloutMockError:
            raise
        except (Exception, RecursionError) as exc:  # whatever the framework's pickle raises: one clear error
            raise ForeignDumpError(
                f"{record.path}: cannot read it as a {self.format} dump file ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())}); it is damaged, or another format (e.g. a torch.save file): "
                f"check how it was written",
                step=step, path=record.path,
            ) from exc


def _reader(format: str) -> Any:
    return importlib.import_module(f"rollout_mock.adapters.{FORMATS[format]}")


def detect_format(path: str | os.PathLike[str]) -> str | None:
    """The foreign format of ``path`` (a directory, or a single slime/AReaL file), or ``None``."""
    root = Path(path)
    for name in FORMATS:
        if _reader(name).detect(root):
            return name
    return None


def open_foreign(path: str | os.PathLike[str], *, trust: bool = False, format: str | None = None) -> ForeignDump:
    """Open a foreign dump for listing (and loading with ``trust=True``); see the module docstring."""
    root = Path(path).expanduser()
    if not root.exists():
        raise DumpNotFoundError(f"no such file or folder: {root}", path=root)
    if format is None:
        format = detect_format(root)
        if format is None:
            raise ForeignDumpError(
                f"{root}: not a dump this tool can read. Expected one of: ROLL "
                f"({{train,val}}/step_NNNNNN.pkl), verl skip.rollout ({{step}}/gen_batch.dp + meta.json), "
                f"AReaL trajectory_debug (step_NNNNNN[_dp_R].pt), slime debug rollout data "
                f"({{rollout_id}}.pt). If it is one of them, name it: --format roll|verl|areal|slime",
                path=root,
            )
    elif format not in FORMATS:
        raise ForeignDumpError(f"unknown format {format!r}; choose one of: {', '.join(FORMATS)}", path=root)
    steps = _reader(format).scan(root)
    if not steps:
        raise ForeignDumpError(f"{root}: no {format} step files found", path=root)
    return ForeignDump(root, format, steps, trust=trust)


def import_foreign(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    trust: bool,
    format: str | None = None,
    overwrite: bool = False,
    report: Callable[[str], None] | None = None,
    progress: bool | None = False,
) -> ForeignDump:
    """Convert a foreign dump into a rollout_mock dump at ``dst`` (manifest, checksums, safe format).
    ``progress``: a bar over the step files on stderr (``None``: on a terminal outside CI only)."""
    foreign = open_foreign(src, trust=trust, format=format)
    store = open_store(dst)
    bar = progress_bar(len(foreign.records), enabled=progress, unit="step", unit_scale=False, desc="import")
    try:
        for record in foreign.records:
            store.open_writer(record.stream)
            batch = foreign.load(record.step, record.stream)
            entry = store.save(record.stream, record.step, batch, BatchInfo.of(batch), method=record.method,
                               overwrite=overwrite)
            if report is not None:
                report(f"imported {record.path} -> {Path(dst) / entry.file} "
                       f"(samples={entry.samples}, {entry.size / 1e6:.2f} MB)")
            bar.update(1)
    finally:
        bar.close()
        store.close()
    return foreign

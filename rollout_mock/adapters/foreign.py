"""Other tools' rollout dumps: detect, list, load (trusted) and import into a rollout_mock dump.

Formats (one reader each, below):

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

import os
import pickle
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_mock.errors import DumpNotFoundError, ForeignDumpError, RolloutMockError, UnsafePickleError
from rollout_mock.jsonio import parse_bounded
from rollout_mock.storage.manifest import MANIFEST_NAME, StreamId
from rollout_mock.storage.paths import open_regular, read_fd
from rollout_mock.storage.store import BatchInfo, open_store
from rollout_mock.text import progress_bar, short_repr

__all__ = ["FORMATS", "ForeignDump", "ForeignStep", "detect_format", "import_foreign", "open_foreign"]


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
                f"it once: rollout-mock import {shlex.quote(str(self.root))} NEW_DIR --trust",
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


# --------------------------------------------------------------------------- roll
# Reader of ROLL's own rollout-mock dumps: ``{dump_dir}/{train,val}/step_NNNNNN.pkl``.
#
# Each file is ``pickle.dump(DataProto, protocol=HIGHEST)``; loading needs ``roll`` importable
# (``roll.distributed.scheduler.protocol.DataProto``) and trust. A directory that already holds a
# rollout_mock ``manifest.json`` is not a ROLL dump.

_ROLL_STEP = re.compile(r"^step_([0-9]{6,18})\.pkl$", re.ASCII)


def _roll_files(root: Path) -> list[tuple[str, int, Path]]:
    if not root.is_dir() or (root / MANIFEST_NAME).is_file():
        return []
    found = []
    for split in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for path in sorted(split.iterdir()):
            match = _ROLL_STEP.match(path.name)
            if match and path.is_file():
                found.append((split.name, int(match.group(1)), path))
    return found


def _roll_detect(root: Path) -> bool:
    return bool(_roll_files(root))


def _roll_load(path: Path) -> Any:
    with os.fdopen(open_regular(path), "rb") as file:  # never a FIFO or device
        return pickle.load(file)


def _roll_scan(root: Path) -> list[ForeignStep]:
    return [ForeignStep(StreamId(split), step, path, "get_batch", _roll_load)
            for split, step, path in _roll_files(root)]


# --------------------------------------------------------------------------- verl
# Reader of verl's ``skip.rollout`` dumps (``verl.utils.skip.RolloutSkip``).
#
# Layout: ``{dump_dir}/{experiment}_{project}/GBS{gbs}_N{n}_in{P}_out{R}/{step}/gen_batch.dp`` plus
# ``meta.json`` (``{"global_steps": step}``); a step directory counts only with both files, as in
# verl. ``gen_batch.dp`` is ``DataProto.save_to_disk`` (a plain pickle of the output of
# ``generate_sequences``; loading needs ``verl`` importable, and trust). The path given may be
# any of the three levels; with several run directories below it, the error lists them.

_VERL_STEP_DIR = re.compile(r"[0-9]{1,18}", re.ASCII)
_VERL_META_LIMIT = 1 << 20
_VERL_BATCH = "gen_batch.dp"
_VERL_META = "meta.json"


def _verl_step_dirs(run: Path) -> list[tuple[int, Path]]:
    out = []
    for child in run.iterdir() if run.is_dir() else ():
        # ASCII digits only: str.isdigit accepts '²', which int() refuses
        if _VERL_STEP_DIR.fullmatch(child.name) and (child / _VERL_BATCH).is_file() and (child / _VERL_META).is_file():
            out.append((int(child.name), child))
    return sorted(out)


def _verl_run_dirs(root: Path) -> list[Path]:
    """Directories (``root`` or up to two levels below) holding ``{step}/gen_batch.dp`` steps."""
    if not root.is_dir():
        return []
    if _verl_step_dirs(root):
        return [root]
    found = []
    for child in sorted(p for p in root.iterdir() if p.is_dir()):
        if _verl_step_dirs(child):
            found.append(child)
            continue
        found.extend(g for g in sorted(p for p in child.iterdir() if p.is_dir()) if _verl_step_dirs(g))
    return found


def _verl_detect(root: Path) -> bool:
    return bool(_verl_run_dirs(root))


def _verl_load(path: Path) -> Any:
    with os.fdopen(open_regular(path), "rb") as file:  # never a FIFO or device
        return pickle.load(file)


def _verl_meta_step(path: Path, step: int) -> int:
    """``global_steps`` of a step's ``meta.json`` (the folder's step when absent);
    :class:`ForeignDumpError` for a file that is not small JSON text or a value not an integer."""
    data = read_fd(open_regular(path), limit=_VERL_META_LIMIT)
    try:
        if len(data) > _VERL_META_LIMIT:
            raise ValueError(f"larger than {_VERL_META_LIMIT} bytes")
        meta = parse_bounded(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ForeignDumpError(f"{path}: not a verl meta.json ({short_repr(str(exc), 120)})", path=path) from None
    recorded = meta.get("global_steps", step) if isinstance(meta, dict) else step
    if isinstance(recorded, bool) or not isinstance(recorded, int):
        raise ForeignDumpError(f"{path}: global_steps={short_repr(recorded, 60)} is not an integer step", path=path)
    return recorded


def _verl_scan(root: Path) -> list[ForeignStep]:
    runs = _verl_run_dirs(root)
    if len(runs) > 1:
        raise ForeignDumpError(
            f"{root} holds {len(runs)} verl runs; import one at a time: "
            + "; ".join(f"rollout-mock import {shlex.quote(str(run))} NEW_DIR --trust" for run in runs[:5]),
            path=root,
        )
    steps = []
    for step, directory in _verl_step_dirs(runs[0]) if runs else []:
        recorded = _verl_meta_step(directory / _VERL_META, step)
        if recorded != step:
            raise ForeignDumpError(
                f"{directory / _VERL_META}: global_steps={recorded} but the folder is step {step}", path=directory,
            )
        steps.append(ForeignStep(StreamId("train"), step, directory / _VERL_BATCH, "generate_sequences", _verl_load))
    return steps


# --------------------------------------------------------------------------- areal
# Reader of AReaL's ``trajectory_debug`` dumps (areal-project/AReaL PR #1407).
#
# Files: ``step_{N:06d}.pt`` (single controller) or ``step_{N:06d}_dp_{rank}.pt`` (one per
# data-parallel head), each ``torch.save`` of the ``list[dict[str, Tensor]]`` that
# ``prepare_batch`` returned (``None`` for rejected trajectories). Loaded like AReaL does:
# ``torch.load(map_location="cpu", weights_only=False)`` (trust needed). Per-rank files become the
# streams ``train@rankR``.

_AREAL_FILE = re.compile(r"^step_([0-9]{6,18})(?:_dp_([0-9]{1,9}))?\.pt$", re.ASCII)


def _areal_files(root: Path) -> list[tuple[int, int | None, Path]]:
    paths = [root] if root.is_file() else (sorted(root.iterdir()) if root.is_dir() else [])
    out = []
    for path in paths:
        match = _AREAL_FILE.match(path.name)
        if match and path.is_file():
            out.append((int(match.group(1)), None if match.group(2) is None else int(match.group(2)), path))
    return out


def _areal_detect(root: Path) -> bool:
    return bool(_areal_files(root))


def _areal_load(path: Path) -> Any:
    import torch

    with os.fdopen(open_regular(path), "rb") as file:  # never a FIFO or device
        return torch.load(file, map_location="cpu", weights_only=False)


def _areal_scan(root: Path) -> list[ForeignStep]:
    return [ForeignStep(StreamId("train", None, rank), step, path, "prepare_batch", _areal_load)
            for step, rank, path in _areal_files(root)]


# --------------------------------------------------------------------------- slime
# Reader of slime's ``--save-debug-rollout-data`` files.
#
# ``{rollout_id}.pt`` (training) and ``eval_{rollout_id}.pt`` (evaluation), each
# ``torch.save({"rollout_id": id, "samples": [Sample.to_dict(), ...]})`` with the samples flattened.
# Loaded with ``torch.load(weights_only=False)`` as slime does (trust needed) and converted to the
# record :mod:`rollout_mock.adapters.slime` replays: training samples regrouped by consecutive
# ``group_index``; evaluation samples under one dataset named ``debug`` (slime does not save names).
# The path may be the folder of the template or a single file.

_SLIME_FILE = re.compile(r"^(eval_)?([0-9]{1,18})\.pt$", re.ASCII)


def _slime_files(root: Path) -> list[tuple[bool, int, Path]]:
    paths = [root] if root.is_file() else (sorted(root.iterdir()) if root.is_dir() else [])
    out = []
    for path in paths:
        match = _SLIME_FILE.match(path.name)
        if match and path.is_file():
            out.append((match.group(1) is not None, int(match.group(2)), path))
    return out


def _slime_detect(root: Path) -> bool:
    return bool(_slime_files(root))


def _slime_loader(evaluation: bool) -> Any:
    def load(path: Path) -> Any:
        import torch

        from rollout_mock.adapters.slime import record_from_flat

        with os.fdopen(open_regular(path), "rb") as file:  # never a FIFO or device
            data = torch.load(file, map_location="cpu", weights_only=False)
        if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
            raise ForeignDumpError(f"{path}: not a slime debug rollout file (no 'samples' list)", path=path)
        return record_from_flat(data["samples"], evaluation=evaluation)

    return load


def _slime_scan(root: Path) -> list[ForeignStep]:
    return [ForeignStep(StreamId("val" if evaluation else "train"), step, path, "generate_rollout",
                        _slime_loader(evaluation)) for evaluation, step, path in _slime_files(root)]


@dataclass(frozen=True)
class _Reader:
    detect: Callable[[Path], bool]
    scan: Callable[[Path], list[ForeignStep]]


#: format name -> its reader
FORMATS: dict[str, _Reader] = {
    "roll": _Reader(_roll_detect, _roll_scan), "verl": _Reader(_verl_detect, _verl_scan),
    "areal": _Reader(_areal_detect, _areal_scan), "slime": _Reader(_slime_detect, _slime_scan),
}


def detect_format(path: str | os.PathLike[str]) -> str | None:
    """The foreign format of ``path`` (a directory, or a single slime/AReaL file), or ``None``."""
    root = Path(path)
    for name in FORMATS:
        if FORMATS[name].detect(root):
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
    steps = FORMATS[format].scan(root)
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

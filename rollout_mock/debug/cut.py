"""Minimal repro dumps: a few steps and rows of a dump, as a new dump that replays on its own.

Each batch keeps its class: a verl ``DataProto`` stays a ``DataProto`` and a registered class
stays itself, even when the class's module is not imported here (a DataProto-like batch loads as
a :class:`~rollout_mock.codec.Batch` stand-in that is written back under the recorded class
name). Classes stored by attribute dict (``register_batch_class`` on a non-DataProto-like
class) need their module imported: ``imports=["my_module"]`` (CLI ``--import my_module``).

The new dump is written through the store's public API, so it has its own manifest and
checksums; the source's environment fingerprint and calling conventions are copied, and
``provenance.json`` records where it came from and what was kept. The source's expected metrics
(``expected/``) are copied for the kept steps only when every row of each step is kept (metrics
of a cut batch would not match them).
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import shlex
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_mock import batch as batch_model
from rollout_mock.compare.metrics import jsonl_records
from rollout_mock.debug.redact import redact as redact_batch
from rollout_mock.debug.redact import redact_call
from rollout_mock.errors import DebugInputError, RolloutMockError, UnsafePickleError
from rollout_mock.storage.directory import write_inside
from rollout_mock.version import __version__

if TYPE_CHECKING:
    from rollout_mock.storage.store import Store

__all__ = ["PROVENANCE_FILE", "CutResult", "cut_dump", "parse_ranges", "row_count", "select_keys", "select_rows"]

PROVENANCE_FILE = "provenance.json"


def parse_ranges(text: str, what: str = "--steps") -> list[int]:
    """``"3,5-6"`` -> ``[3, 5, 6]`` (ascending, unique)."""
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise DebugInputError(f"{what} {text!r}: expected ranges like 3,5-6") from None
        if last < first:
            raise DebugInputError(f"{what} {text!r}: range {part.strip()} is empty")
        out.update(range(first, last + 1))
    return sorted(out)


def row_count(batch: Any) -> int:
    """Rows of a batch (:func:`rollout_mock.batch.count_samples`: list items, samples of a slime
    record...); :class:`DebugInputError` for a batch without rows."""
    n = batch_model.count_samples(batch)
    if n is None:
        raise DebugInputError(f"cannot tell how many rows a {batch_model.type_name(batch)} has")
    return n


def select_rows(batch: Any, index: Sequence[int]) -> Any:
    """A new batch of the same type holding rows ``index`` (in that order); the input is not
    changed (a list's items are copied). :class:`DebugInputError` for a row out of range."""
    n = row_count(batch)
    index = [int(i) for i in index]
    bad = [i for i in index if not 0 <= i < n]
    if bad:
        raise DebugInputError(f"rows {bad} out of range: the batch has {n} rows (0-{n - 1})")
    if isinstance(batch, list):
        return [copy.copy(batch[i]) for i in index]
    try:
        return batch_model.take_rows(batch, index)
    except RolloutMockError as exc:
        raise DebugInputError(str(exc)) from exc


def select_keys(batch: Any, keys: Sequence[str]) -> Any:
    """Only ``keys`` of the batch's columns (``meta_info`` is kept whole); a key may be given as
    ``ls --keys`` prints it (``batch.rewards``) or bare (``rewards``). Unknown keys are an error."""
    kind = batch_model.batch_type_of(batch)
    if kind is None or kind.select is None:
        raise DebugInputError(f"cannot select keys of a {batch_model.type_name(batch)}")
    present = set(batch_model.batch_keys(batch))
    unknown = sorted(k for k in set(keys) if k not in present and batch_model.column_name(k, batch) not in present)
    if unknown:
        raise DebugInputError(f"--keys: {', '.join(unknown)} not in the batch (keys: {', '.join(sorted(present))})")
    return batch_model.select_keys(batch, {batch_model.column_name(k, batch) for k in keys} | set(keys))


@dataclass
class CutResult:
    dst: Path
    steps: dict[str, list[int]] = field(default_factory=dict)
    rows: dict[str, dict[int, int]] = field(default_factory=dict)
    redacted: list[str] = field(default_factory=list)
    expected_copied: bool = False

    def summary(self) -> str:
        lines = [f"wrote {self.dst}"]
        for stream, steps in self.steps.items():
            counts = ", ".join(f"step {s}: {self.rows[stream][s]} rows" for s in steps)
            lines.append(f"  {stream}: {counts}")
        if self.redacted:
            lines.append(f"  redacted fields: {', '.join(self.redacted)}")
        lines.append(f"  expected metrics copied: {'yes' if self.expected_copied else 'no'}")
        return "\n".join(lines)


def _rows(n: int, samples: Sequence[int] | None, groups: Sequence[int] | None,
          group_size: int | None) -> list[int] | None:
    if samples is not None and groups is not None:
        raise DebugInputError("give samples or groups, not both")
    if groups is not None:
        if not group_size or group_size < 1:
            raise DebugInputError("--groups needs --group-size N (rows per group, e.g. GRPO's n)")
        if n % group_size:
            raise DebugInputError(f"the batch has {n} rows, not a multiple of --group-size {group_size}")
        return [g * group_size + j for g in groups for j in range(group_size)]
    return None if samples is None else list(samples)


def _copy_expected(src: Store, dst: Store, steps: set[int]) -> bool:
    """Copy the kept steps' lines of the source dump run's metrics; read with the dump containment
    rules (no link followed, no FIFO opened: :meth:`Store.read_expected`)."""
    names = src.expected_names()
    for rel in names:
        data = src.read_expected(rel=rel)
        if data is None:
            continue
        # the metrics reader's own parse: a line it refuses (nested, a number past every limit)
        # ends the cut with its error, as report and verify do; a torn last line is skipped
        kept = "".join(record.line if record.line.endswith("\n") else record.line + "\n"
                       for record in jsonl_records(Path(src.where(rel)), data=data) if record.step in steps)
        dst.write_expected(rel, kept.encode("utf-8"))
    return bool(names)


def _call_meta(meta: list[Any], pack: Any, record: Any, redact: bool) -> dict[str, Any]:
    """The recorded summary of an extra call (scrubbed with ``redact``, as a step's own call is)."""
    position = pack.calls.index(record)
    item = meta[position] if position < len(meta) and isinstance(meta[position], dict) else {}
    return dict(redact_call(item) or {}) if redact else dict(item)


def cut_dump(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    steps: Sequence[int] | str,
    samples: Sequence[int] | str | None = None,
    groups: Sequence[int] | str | None = None,
    group_size: int | None = None,
    keys: Sequence[str] | str | None = None,
    redact: bool = False,
    splits: Sequence[str] | None = None,
    trusted: bool = False,
    imports: Sequence[str] | None = None,
    progress: bool | None = False,
) -> CutResult:
    """Write the chosen ``steps`` (and rows, and keys) of dump ``src`` as a new dump ``dst``.

    ``steps``/``samples``/``groups`` accept lists or range strings (``"3,5-6"``). ``groups`` with
    ``group_size`` selects whole GRPO groups (rows ``g*size .. g*size+size-1``); for AReaL lists
    the rows are the list items (trajectories). ``keys`` keeps only those columns; ``redact``
    replaces prompt/response text (see :mod:`rollout_mock.debug.redact`). Every stream (split,
    name, rank) holding a chosen step is cut, or only those of ``splits``. ``dst`` must not exist
    or be empty. ``imports`` are modules imported first (they register batch classes).
    ``progress``: a bar over the steps on stderr (``None``: on a terminal outside CI only). Raises
    :class:`DebugInputError` for a step recorded in no stream or a module that cannot be imported.
    """
    from rollout_mock.storage.manifest import format_ranges
    from rollout_mock.storage.reader import open_dump
    from rollout_mock.storage.store import BatchInfo, open_store
    from rollout_mock.text import progress_bar

    for module in imports or ():
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise DebugInputError(f"--import {module}: {exc}") from exc
    src_path, dst_path = Path(src), Path(dst)
    step_list = parse_ranges(steps, "--steps") if isinstance(steps, str) else sorted(set(steps))
    sample_list = parse_ranges(samples, "--samples") if isinstance(samples, str) else samples
    group_list = parse_ranges(groups, "--groups") if isinstance(groups, str) else groups
    key_list = [k.strip() for k in keys.split(",") if k.strip()] if isinstance(keys, str) else keys
    if dst_path.exists() and (not dst_path.is_dir() or any(dst_path.iterdir())):
        raise DebugInputError(f"{dst_path} exists and is not empty: cut writes a new dump; pick a new directory")
    if dst_path.resolve() == src_path.resolve():
        raise DebugInputError("the destination must differ from the source")
    dump = open_dump(src_path)
    streams = [s for s in dump.streams() if splits is None or s.split in splits]
    if not streams:
        present = sorted({s.split for s in dump.streams()})
        raise DebugInputError(
            f"{src_path}: no split {', '.join(splits or ())} recorded (splits present: "
            f"{', '.join(present) or 'none'}); pick one with --split {shlex.quote(present[0]) if present else 'SPLIT'}")
    missing = [s for s in step_list if not any(s in dump.steps(stream) for stream in streams)]
    if missing:  # (steps are ranges: never expanded one by one)
        raise DebugInputError(
            f"{src_path}: steps {format_ranges(missing)} are recorded in no stream"
            + ("" if splits is None else f" of splits {list(splits)}")
            + f" (recorded: {'; '.join(f'{s}: {format_ranges(dump.steps(s))}' for s in streams)})"
        )
    store = open_store(dst_path)
    result = CutResult(dst=dst_path)
    todo = sum(1 for stream in streams for s in step_list if s in dump.steps(stream))
    bar = progress_bar(todo, enabled=progress, unit="step", unit_scale=False, desc="cut")
    redacted: set[str] = set()
    whole = True
    try:
        fingerprint = dump.manifest.fingerprint
        if fingerprint:
            store.set_fingerprint(fingerprint)
        for stream in streams:
            chosen = [s for s in step_list if s in dump.steps(stream)]
            if not chosen:
                continue
            store.set_methods(stream, dump.manifest.methods(stream))
            result.steps[stream.key], result.rows[stream.key] = chosen, {}
            for step in chosen:
                entry = dump.entry(stream, step)
                assert entry is not None
                try:
                    batch = dump.load(step, stream, trusted=trusted)
                except UnsafePickleError as exc:
                    raise DebugInputError(
                        f"{src_path}: step {step} of {stream} holds a batch class that is not registered "
                        f"in this process; pass --import <module that defines and registers it> "
                        f"(imports=[...]) so the cut dump keeps the class ({exc})") from exc
                def cut(batch: Any) -> Any:
                    nonlocal whole
                    index = _rows(row_count(batch), sample_list, group_list, group_size)
                    if index is not None:
                        whole = whole and index == list(range(row_count(batch)))
                        batch = select_rows(batch, index)
                    if key_list:
                        batch = select_keys(batch, key_list)
                        whole = False
                    if redact:
                        batch, hit = redact_batch(batch)
                        redacted.update(hit)
                    return batch

                batch = cut(batch)
                # the recorded call (manifest.json, index) may hold a prompt too: scrubbed alike
                call = dict(redact_call(entry.call) or {}) if redact and entry.call is not None else entry.call
                store.save(stream, step, batch, BatchInfo.of(batch), method=entry.method,
                           rollout_seconds=entry.rollout_seconds, call=call)
                result.rows[stream.key][step] = row_count(batch)
                # the step's further calls (a validation in several batches, an agent's turns): cut alike
                extra = [(cut(dump.store.load_call(stream, pack, record, trusted=trusted)), record,
                          _call_meta(dump.store.pack_meta(stream, pack), pack, record, redact))
                         for pack, record in dump.store.extra_calls(stream).get(step, [])]
                if extra:
                    store.save_pack(stream, store.next_pack_seq(stream), [(b, [r]) for b, r, _ in extra],
                                    [m for _, _, m in extra])
                bar.update(1)
    except BaseException:
        bar.close()
        store.close()
        shutil.rmtree(dst_path, ignore_errors=True)  # no half-written repro dump left behind
        raise
    bar.close()
    store.close()
    result.redacted = sorted(redacted)
    if whole:
        try:
            result.expected_copied = _copy_expected(dump.store, store, set(step_list))
        except BaseException:  # e.g. a link or FIFO planted in expected/: no half-made dump left
            shutil.rmtree(dst_path, ignore_errors=True)
            raise
    provenance = {
        "source": str(src_path.resolve()),
        "source_created_at": dump.manifest.created_at,
        "source_writer": dump.manifest.writer,
        "steps": result.steps,
        "samples": None if sample_list is None else list(sample_list),
        "groups": None if group_list is None else list(group_list),
        "group_size": group_size,
        "keys": None if not key_list else list(key_list),
        "redacted": result.redacted if redact else None,
        "expected_copied": result.expected_copied,
        "cut_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rollout_mock": __version__,
    }
    write_inside(dst_path, PROVENANCE_FILE, (json.dumps(provenance, indent=2, default=str) + "\n").encode("utf-8"))
    return result



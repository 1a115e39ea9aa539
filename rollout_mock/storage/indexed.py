"""The store logic shared by every backend that keeps a dump as files or objects: the index of
:mod:`rollout_mock.storage.index` (entry files + compacted manifest), writer claims, overwrite
protection, retention deletes and verified loads.

Backends (:class:`~rollout_mock.storage.directory.DirectoryStore`,
:class:`~rollout_mock.storage.objectstore.FsspecStore`) implement the few primitives at the
bottom: read/create/replace/list/remove small files, write and load a step, and locks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_mock.errors import CorruptStepError, DumpNotFoundError, LockedError
from rollout_mock.storage.backend import StoreBackend
from rollout_mock.storage.base import BatchInfo, _exists_error
from rollout_mock.storage.digest import mac_context
from rollout_mock.storage.index import (
    FINGERPRINT_NAME,
    INVALID,
    STREAMS_DIR,
    decode_entry,
    decode_stream_record,
    encode_entry,
    encode_stream_record,
    entry_relpath,
    index_dir,
    merge_stream,
    step_of_entry_name,
    stream_record_name,
)
from rollout_mock.storage.manifest import (
    MANIFEST_NAME,
    Manifest,
    StepEntry,
    StreamId,
    dumps_manifest,
    parse_manifest,
    utc_now,
)
from rollout_mock.text import logger

__all__ = ["IndexedStore"]


@dataclass
class _Owned:
    """A stream this store object writes: its lock, and its index held in memory."""

    handle: Any
    steps: dict[int, dict[str, Any]]
    compacted: set[int]
    methods: dict[str, dict[str, Any]] = field(default_factory=dict)


class IndexedStore(StoreBackend):
    """A dump kept as entry files plus a compacted manifest (see the module docstring)."""

    #: where the dump lives: a local path, or the URL of an object-store prefix (set by each backend)
    dump_dir: Path | str

    def __init__(self, *, hmac_key: bytes | None = None, verify: bool = True) -> None:
        self.hmac_key = hmac_key
        self.verify = verify
        self._owned: dict[str, _Owned] = {}
        self._manifest_sig: Any = None
        self._manifest_file_cache: Manifest | None = None
        self._view_cache: Manifest | None = None

    # ------------------------------------------------------------------ reading the index
    def manifest_file(self) -> Manifest | None:
        """``manifest.json`` alone (cached while its signature is unchanged)."""
        signature = self._signature(MANIFEST_NAME)
        if signature is None:
            self._manifest_sig, self._manifest_file_cache = None, None
            return None
        if signature != self._manifest_sig or self._manifest_file_cache is None:
            data = self._read(MANIFEST_NAME)
            if data is None:
                return None
            self._manifest_file_cache = parse_manifest(data, self.where(MANIFEST_NAME))
            self._manifest_sig = signature
        return self._manifest_file_cache

    def _read_entries(self, stream: StreamId, names: list[str] | None = None) -> dict[int, Any]:
        directory = index_dir(stream)
        names = self._list(directory) if names is None else names
        entries: dict[int, Any] = {}
        for name in names:
            step = step_of_entry_name(stream, name)
            if step is None:
                continue
            data = self._read(f"{directory}/{name}")
            if data is not None:
                entries[step] = decode_entry(data, stream, step, self.where(f"{directory}/{name}"))
        return entries

    def _stream_records(self) -> dict[StreamId, dict[str, dict[str, Any]]]:
        records: dict[StreamId, dict[str, dict[str, Any]]] = {}
        for name in self._list(STREAMS_DIR):
            data = self._read(f"{STREAMS_DIR}/{name}")
            decoded = None if data is None else decode_stream_record(data, self.where(f"{STREAMS_DIR}/{name}"))
            if decoded is not None and stream_record_name(decoded[0]) == name:
                records[decoded[0]] = decoded[1]
        return records

    def manifest(self, *, refresh: bool = False) -> Manifest:
        """The merged index: manifest.json + stream records + entry files (see the module doc).
        Empty when there is nothing yet."""
        if self._view_cache is not None and not refresh:
            return self._view_cache
        base = self.manifest_file()
        view = Manifest() if base is None else Manifest(
            created_at=base.created_at, writer=base.writer, fingerprint=base.fingerprint, source=base.source,
            streams={k: {**v, "steps": dict(v["steps"]), "methods": dict(v.get("methods", {}))}
                     for k, v in base.streams.items()},
        )
        records = self._stream_records()
        streams = set(view.stream_ids()) | set(records)
        listings: dict[str, list[str]] = {}
        for stream in sorted(streams, key=lambda s: s.key):
            owned = self._owned.get(stream.key)
            if owned is not None:
                data = view.stream(stream, create=True)
                assert data is not None
                data["steps"] = {str(s): raw for s, raw in sorted(owned.steps.items())}
                data["methods"].update(owned.methods)
                continue
            directory = index_dir(stream)
            if directory not in listings:
                listings[directory] = self._list(directory)
            entries = self._read_entries(stream, listings[directory])
            if entries or stream in records:
                merge_stream(view, stream, records.get(stream), entries)
        if view.fingerprint is None:
            view.fingerprint = self._read_fingerprint_file()
        self._view_cache = view
        return view

    def _read_fingerprint_file(self) -> dict[str, Any] | None:
        data = self._read(FINGERPRINT_NAME)
        if data is None:
            return None
        try:
            value = json.loads(data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            logger.warning("[RolloutMock] ignoring %s: not JSON", self.where(FINGERPRINT_NAME))
            return None
        return value if isinstance(value, dict) else None

    def has_dump(self) -> bool:
        return self._signature(MANIFEST_NAME) is not None or bool(self._list(STREAMS_DIR))

    def require_manifest(self, *, mode: str, split: str | None = None) -> Manifest:
        """The merged index, or :class:`DumpNotFoundError` naming what is missing and the fix."""
        if not self.has_dump():
            raise DumpNotFoundError(
                f"[RolloutMock] no manifest.json in {self.where('')} (mode={mode}). Run the same "
                f"steps in dump mode first, or fix dump_dir.",
                mode=mode, split=split, path=self.where(MANIFEST_NAME),
            )
        return self.manifest(refresh=True)

    def stream_ids(self) -> list[StreamId]:
        return self.manifest().stream_ids()

    def entry(self, stream: StreamId, step: int) -> StepEntry | None:
        owned = self._owned.get(stream.key)
        if owned is not None:
            raw = owned.steps.get(step)
            return None if raw is None else StepEntry.from_json(raw, where=f"{stream.key} step {step}")
        found = self.manifest().entry(stream, step)
        if found is not None:
            return found
        # not in the cached view: the step's own entry file (one read), then a newer manifest
        rel = entry_relpath(stream, step)
        data = self._read(rel)
        if data is not None:
            raw = decode_entry(data, stream, step, self.where(rel))
            if raw is None or raw is INVALID:
                return None
            return StepEntry.from_json(raw, where=self.where(rel), path=self.where(rel))
        if self._signature(MANIFEST_NAME) != self._manifest_sig:
            return self.manifest(refresh=True).entry(stream, step)
        return None

    def steps(self, stream: StreamId) -> list[int]:
        owned = self._owned.get(stream.key)
        if owned is not None:
            return sorted(owned.steps)
        return self.manifest(refresh=True).steps(stream)

    def methods(self, stream: StreamId) -> dict[str, dict[str, Any]]:
        owned = self._owned.get(stream.key)
        if owned is not None and owned.methods:
            return dict(owned.methods)
        return self.manifest().methods(stream)

    def fingerprint(self) -> dict[str, Any] | None:
        return self.manifest().fingerprint

    # ------------------------------------------------------------------ writing
    def open_writer(self, stream: StreamId) -> None:
        """Claim ``stream`` (a second writer gets :class:`LockedError`), repair what a crashed
        writer left, compact leftover entry files, and announce the stream to readers."""
        if stream.key in self._owned:
            return
        handle = self._lock_stream(stream)
        try:
            self._recover(stream)
            leftovers = self._list(index_dir(stream))
            if any(step_of_entry_name(stream, n) is not None for n in leftovers):
                logger.info("[RolloutMock] %s: compacting entry files left by an earlier writer", stream)
                self._compact(stream, None)
            base = self.manifest_file()
            steps = {} if base is None else dict(base.streams.get(stream.key, {}).get("steps", {}))
            methods = {} if base is None else base.methods(stream)
            owned = _Owned(handle, {int(s): raw for s, raw in steps.items()}, {int(s) for s in steps}, methods)
            self._replace(f"{STREAMS_DIR}/{stream_record_name(stream)}", encode_stream_record(stream, methods))
        except BaseException:
            self._unlock_stream(stream, handle)
            raise
        self._owned[stream.key] = owned
        self._view_cache = None

    def _owner(self, stream: StreamId) -> _Owned:
        if stream.key not in self._owned:
            self.open_writer(stream)
        owned = self._owned[stream.key]
        lost = self._lock_lost(owned.handle)
        if lost is not None:
            raise LockedError(f"[RolloutMock] lost the writer lock of {stream} in {self.where('')}: {lost}",
                              mode="dump", split=stream.split)
        return owned

    def set_methods(self, stream: StreamId, methods: dict[str, dict[str, Any]]) -> None:
        owned = self._owner(stream)
        owned.methods.update(methods)
        self._replace(f"{STREAMS_DIR}/{stream_record_name(stream)}", encode_stream_record(stream, owned.methods))
        self._view_cache = None

    def set_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        if self.fingerprint() is None:
            self._create(FINGERPRINT_NAME, json.dumps(fingerprint, allow_nan=False, default=str).encode("utf-8"))
            self._view_cache = None

    def check_writable(self, stream: StreamId, step: int, *, overwrite: bool) -> None:
        """Raise :class:`StepExistsError` if saving ``step`` would replace a recording."""
        if overwrite:
            return
        owned = self._owned.get(stream.key)
        exists = step in owned.steps if owned is not None else self.entry(stream, step) is not None
        if exists:
            raise _exists_error(stream, step, self.where(stream.relpath(step)))

    def save(self, stream: StreamId, step: int, batch: Any, info: BatchInfo, *, method: str | None = None,
             rollout_seconds: float | None = None, overwrite: bool = False,
             call: dict[str, Any] | None = None) -> StepEntry:
        owned = self._owner(stream)
        self.check_writable(stream, step, overwrite=overwrite)
        if overwrite and step in owned.steps:
            self.delete(stream, step)
        rel = stream.relpath(step)
        size, checksum, mac = self._write_step(rel, batch, mac_context(stream.key, step) if self.hmac_key else b"")
        entry = StepEntry(file=rel, size=size, checksum=checksum, hmac=mac, samples=info.samples, type=info.type,
                          keys=info.keys, written_at=utc_now(), method=method, rollout_seconds=rollout_seconds,
                          call=call)
        try:
            self._commit_entry(stream, step, entry)
        except BaseException:
            self._remove([rel])  # unreferenced data: invisible anyway, but do not leave it
            raise
        owned.steps[step] = entry.to_json()
        self._view_cache = None
        return entry

    def _commit_entry(self, stream: StreamId, step: int, entry: StepEntry) -> None:
        """Make the step visible: create its entry file, exclusively (the conditional write
        that refuses a concurrent writer of the same step)."""
        rel, data = entry_relpath(stream, step), encode_entry(stream, step, entry)
        if self._create_entry(rel, data):
            return
        existing = self._read(rel)
        if existing is None or decode_entry(existing, stream, step, self.where(rel)) in (None, INVALID):
            self._replace(rel, data)  # a tombstone or garbage of our own stream: ours to replace
            return
        raise _exists_error(stream, step, self.where(rel))

    def delete(self, stream: StreamId, step: int) -> None:
        """Hide the step first (remove its entry, or a tombstone over a compacted entry), then
        remove its data: a crash in between leaves unreferenced data, never a broken step."""
        owned = self._owner(stream)
        rel = entry_relpath(stream, step)
        if step in owned.compacted:
            self._replace(rel, encode_entry(stream, step, None))
            owned.compacted.discard(step)
        else:
            self._remove([rel])
        owned.steps.pop(step, None)
        self._remove([stream.relpath(step)])
        self._view_cache = None

    def _compact(self, stream: StreamId, owned: _Owned | None) -> None:
        """Fold the stream's entry files and record into manifest.json, then remove them."""
        directory = index_dir(stream)
        names = [n for n in self._list(directory) if step_of_entry_name(stream, n) is not None]
        record_rel = f"{STREAMS_DIR}/{stream_record_name(stream)}"
        with self._manifest_lock():
            self._manifest_sig = None
            manifest = self.manifest_file() or Manifest()
            if owned is not None:  # the lock holder's memory is the stream's index: no re-reads
                data = manifest.stream(stream, create=True)
                assert data is not None
                data["steps"] = {}
                entries: dict[int, Any] = dict(sorted(owned.steps.items()))
            else:
                entries = self._read_entries(stream, names)
            record = self._read(record_rel)
            decoded = None if record is None else decode_stream_record(record, self.where(record_rel))
            methods = dict(decoded[1]) if decoded else {}
            if owned is not None:
                methods.update(owned.methods)
            merge_stream(manifest, stream, methods, entries)
            if manifest.fingerprint is None:
                manifest.fingerprint = self._read_fingerprint_file()
            self._replace(MANIFEST_NAME, dumps_manifest(manifest).encode("utf-8"))
            self._manifest_sig = None
        self._remove([f"{directory}/{n}" for n in names] + [record_rel])
        self._prune_dirs([directory, STREAMS_DIR])
        self._view_cache = None

    def close(self) -> None:
        """Compact every stream this object writes into manifest.json and release the locks."""
        errors: list[BaseException] = []
        try:
            self.sync()
        except BaseException as exc:
            errors.append(exc)
        for key, owned in list(self._owned.items()):
            stream = StreamId.from_key(key)
            try:
                if self._lock_lost(owned.handle) is None:
                    self._compact(stream, owned)
                else:
                    logger.warning("[RolloutMock] not compacting %s: its writer lock was lost", stream)
            except BaseException as exc:  # release every lock, then report
                errors.append(exc)
            finally:
                self._unlock_stream(stream, owned.handle)
                del self._owned[key]
        if errors:
            raise errors[0]

    # ------------------------------------------------------------------ loading
    def load(self, stream: StreamId, step: int, *, trusted: bool = False) -> Any:
        entry = self.entry(stream, step)
        rel = stream.relpath(step)
        if entry is None:
            if self._exists(rel):
                raise CorruptStepError(
                    f"[RolloutMock] {self.where(rel)} exists but step {step} of {stream} is not in "
                    f"the index ({self.where(MANIFEST_NAME)} and its entry files): the dump is incomplete "
                    f"(a writer died before committing the step) or was copied together by hand; re-dump the step",
                    mode="mock", split=stream.split, step=step, path=self.where(rel),
                )
            raise self.missing_step_error(stream, step, mode="mock")
        return self._load_step(rel, entry, stream, step, trusted)

    def describe_location(self, stream: StreamId, step: int) -> str:
        return self.where(stream.relpath(step))

    def iter_owned(self) -> Iterator[StreamId]:
        return (StreamId.from_key(k) for k in self._owned)

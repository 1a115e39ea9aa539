"""The one store: a dump kept as objects of a :class:`~rollout_mock.storage.backend.ByteBackend`.

The store owns everything above the bytes, whatever the backend: the index of
:mod:`rollout_mock.storage.index` (entry files + a compacted manifest), writer claims, overwrite
protection, retention deletes, the codec, checksums and the bound HMAC, and verified loads. A
backend only stores and returns bytes (``storage/directory.py``, ``objectstore.py``,
``memory.py``); :func:`~rollout_mock.storage.stores.open_store` picks one for a ``dump_dir``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import rollout_mock.codec as codec
from rollout_mock.codec import BytesSource, ReadAheadSource
from rollout_mock.errors import CorruptStepError, DumpNotFoundError, StepNotFoundError, dump_path_is_a_file
from rollout_mock.storage.backend import ByteBackend
from rollout_mock.storage.base import BatchInfo, exists_error, missing_step_error
from rollout_mock.storage.digest import mac_context
from rollout_mock.storage.index import (
    FINGERPRINT_NAME,
    INVALID,
    STREAMS_DIR,
    decode_entry,
    encode_entry,
    entry_relpath,
    index_dir,
    merge_stream,
    read_entries,
    read_fingerprint,
    read_segment,
    read_stream_records,
)
from rollout_mock.storage.manifest import (
    MANIFEST_NAME,
    Manifest,
    StepEntry,
    StreamId,
    parse_manifest,
    utc_now,
)
from rollout_mock.storage.streamindex import StreamIndex
from rollout_mock.storage.verified import corrupt_error, load_source_verified, load_verified
from rollout_mock.text import logger

__all__ = ["IndexedStore", "Store"]


#: Objects up to this size are loaded with one GET; larger ones with ranged GETs into the tensors.
WHOLE_READ_BYTES = 16 << 20


class Store:
    """A dump over ``backend`` (see the module docstring).

    ``hmac_key`` signs steps on save and is required to match on every load; ``verify=False``
    skips checksum verification on load (sizes, and a configured HMAC, are still checked).
    """

    def __init__(self, backend: ByteBackend, *, hmac_key: bytes | None = None, verify: bool = True) -> None:
        self.backend = backend
        self.hmac_key = hmac_key
        self.verify = verify
        #: where the dump lives: a local path, or the URL of an object-store prefix
        self.dump_dir: Path | str = backend.root_location
        self._owned: dict[str, StreamIndex] = {}  # the streams this object writes
        self._manifest_sig: Any = None
        self._manifest_file_cache: Manifest | None = None
        self._view_cache: Manifest | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.backend!r})"

    def where(self, rel: str) -> str:
        """A human-readable location (path or URL) of ``rel`` under the dump."""
        return self.backend.where(rel)

    def path_of(self, stream: StreamId, step: int) -> Path:
        """The local file of a step (local dumps only)."""
        path = self.backend.local_path(stream.relpath(step))
        if path is None:
            raise TypeError(f"{self.backend!r} has no local files")
        return path

    def open_source(self, rel: str, *, mapped: bool = False) -> Any:
        """A ranged-read :class:`~rollout_mock.codec.source.ByteSource` over ``rel``."""
        return self.backend.open_source(rel, mapped=mapped)

    def another(self) -> Store:
        """A second store on the same dump, as another process would open it (same class)."""
        twin = object.__new__(type(self))
        Store.__init__(twin, self.backend.reopen(), hmac_key=self.hmac_key, verify=self.verify)
        return twin

    def contains(self, stream: StreamId, step: int) -> bool:
        return self.entry(stream, step) is not None

    def missing_step_error(self, stream: StreamId, step: int, *, mode: str) -> StepNotFoundError:
        return missing_step_error(self, stream, step, mode=mode)

    # Deprecated: the backend primitives as 0.1's store classes named them, for code written
    # against those (tests that patch files behind the index). Use ``store.backend`` instead.
    def _read(self, rel: str) -> bytes | None:
        return self.backend.read(rel)

    def _replace(self, rel: str, data: bytes) -> None:
        self.backend.replace(rel, data)

    def _create(self, rel: str, data: bytes) -> bool:
        return self.backend.create(rel, data)

    def _list(self, rel_dir: str) -> list[str]:
        return self.backend.listdir(rel_dir)

    def _remove(self, rels: list[str]) -> None:
        self.backend.remove(rels)

    def _exists(self, rel: str) -> bool:
        return self.backend.exists(rel)

    def sync(self) -> None:
        """Make every step committed so far durable."""
        self.backend.sync()

    # ------------------------------------------------------------------ reading the index
    def manifest_file(self, *, fresh: bool = False) -> Manifest | None:
        """``manifest.json`` alone (cached while its signature is unchanged; ``fresh``: a new
        object read now, for a read-modify-write, never cached)."""
        signature = self.backend.signature(MANIFEST_NAME)
        if signature is None:
            self._manifest_sig, self._manifest_file_cache = None, None
            return None
        if fresh or signature != self._manifest_sig or self._manifest_file_cache is None:
            data = self.backend.read(MANIFEST_NAME)
            if data is None:
                return None
            parsed = parse_manifest(data, self.backend.where(MANIFEST_NAME))
            parsed.segment_reader = self._read_segment
            if fresh:
                self._manifest_sig = None  # the caller is about to replace it
                return parsed
            self._manifest_file_cache, self._manifest_sig = parsed, signature
        return self._manifest_file_cache

    def _read_segment(self, stream: StreamId, seq: int) -> dict[str, Any]:
        return read_segment(self.backend, stream, seq)

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
        view.segment_reader = self._read_segment
        records = read_stream_records(self.backend)
        streams = set(view.stream_ids()) | set(records)
        listings: dict[str, list[str]] = {}
        for stream in sorted(streams, key=lambda s: s.key):
            owned = self._owned.get(stream.key)
            if owned is not None:
                merge_stream(view, stream, owned.methods, dict(owned.pending))
                continue
            directory = index_dir(stream)
            if directory not in listings:
                listings[directory] = self.backend.listdir(directory)
            entries = read_entries(self.backend, stream, listings[directory])
            if entries or stream in records:
                merge_stream(view, stream, records.get(stream), entries)
        if view.fingerprint is None:
            view.fingerprint = read_fingerprint(self.backend)
        self._view_cache = view
        return view

    def has_dump(self) -> bool:
        return self.backend.signature(MANIFEST_NAME) is not None or bool(self.backend.listdir(STREAMS_DIR))

    def require_manifest(self, *, mode: str, split: str | None = None) -> Manifest:
        """The merged index, or :class:`DumpNotFoundError` naming what is missing and the fix."""
        local = self.backend.local_path("")
        if local is not None and local.is_file():
            raise dump_path_is_a_file(local, mode=mode)
        if local is not None and not local.is_dir():
            raise DumpNotFoundError(
                f"[RolloutMock] dump directory not found: {local} (mode={mode}). Run the same steps in dump "
                f"mode first, or fix dump_dir.", mode=mode, split=split, path=local)
        if not self.has_dump():
            pickles = self._foreign_step_files()
            hint = (f" It holds {pickles} step file(s) but no manifest: it was probably written by ROLL or an "
                    f"older tool; convert it with `rollout-mock import {self.where('')} NEW_DIR --trust` and "
                    f"point dump_dir at NEW_DIR." if pickles else
                    " Run the same steps in dump mode first, or fix dump_dir.")
            raise DumpNotFoundError(f"[RolloutMock] no {MANIFEST_NAME} in {self.where('')} (mode={mode}).{hint}",
                                    mode=mode, split=split, path=self.where(MANIFEST_NAME))
        return self.manifest(refresh=True)

    def _foreign_step_files(self) -> int:
        """How many ``SPLIT/step_N.pkl`` files lie in a folder without an index (bounded listing)."""
        found = 0
        for name in self.backend.listdir("")[:64]:
            if not name.startswith("."):
                found += sum(1 for n in self.backend.listdir(name) if n.startswith("step_") and n.endswith(".pkl"))
        return found

    def stream_ids(self) -> list[StreamId]:
        return self.manifest().stream_ids()

    def entry(self, stream: StreamId, step: int) -> StepEntry | None:
        owned = self._owned.get(stream.key)
        if owned is not None:
            pending, raw = owned.pending_entry(step)
            if pending:
                return None if raw is None else StepEntry.from_json(raw, where=f"{stream.key} step {step}")
            base = self.manifest_file() if step in owned.live else None
            return None if base is None else base.entry(stream, step)
        found = self.manifest().entry(stream, step)
        if found is not None:
            return found
        # not in the cached view: the step's own entry file (one read), then a newer manifest
        rel = entry_relpath(stream, step)
        data = self.backend.read(rel)
        if data is not None:
            raw = decode_entry(data, stream, step, self.backend.where(rel))
            if raw is None or raw is INVALID:
                return None
            return StepEntry.from_json(raw, where=self.backend.where(rel), path=self.backend.where(rel))
        if self.backend.signature(MANIFEST_NAME) != self._manifest_sig:
            return self.manifest(refresh=True).entry(stream, step)
        return None

    def steps(self, stream: StreamId) -> list[int]:
        owned = self._owned.get(stream.key)
        if owned is not None:
            return sorted(owned.live)
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
        """Claim ``stream`` for writing by this object (a second writer gets :class:`LockedError`):
        see :meth:`StreamIndex.open <rollout_mock.storage.streamindex.StreamIndex.open>`."""
        if stream.key in self._owned:
            return
        self._owned[stream.key] = StreamIndex.open(self.backend, stream, lambda: self.manifest_file(fresh=True))
        self._view_cache = None

    def _owner(self, stream: StreamId) -> StreamIndex:
        if stream.key not in self._owned:
            self.open_writer(stream)
        owned = self._owned[stream.key]
        owned.check_held()
        return owned

    def set_methods(self, stream: StreamId, methods: dict[str, dict[str, Any]]) -> None:
        self._owner(stream).set_methods(methods)
        self._view_cache = None

    def set_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        if self.fingerprint() is None:
            self.backend.create(FINGERPRINT_NAME, json.dumps(fingerprint, allow_nan=False, default=str).encode("utf-8"))
            self._view_cache = None

    def check_writable(self, stream: StreamId, step: int, *, overwrite: bool) -> None:
        """Raise :class:`StepExistsError` if saving ``step`` would replace a recording."""
        if overwrite:
            return
        owned = self._owned.get(stream.key)
        exists = step in owned.live if owned is not None else self.entry(stream, step) is not None
        if exists:
            raise exists_error(stream, step, self.backend.where(stream.relpath(step)))

    def save(self, stream: StreamId, step: int, batch: Any, info: BatchInfo, *, method: str | None = None,
             rollout_seconds: float | None = None, overwrite: bool = False,
             call: dict[str, Any] | None = None) -> StepEntry:
        owned = self._owner(stream)
        self.check_writable(stream, step, overwrite=overwrite)
        if overwrite and step in owned.live:
            self.delete(stream, step)
        rel = stream.relpath(step)
        context = mac_context(stream.key, step) if self.hmac_key else b""
        size, checksum, mac = self.backend.write_step(rel, lambda sink: codec.encode(batch, sink),
                                                      hmac_key=self.hmac_key, context=context)
        entry = StepEntry(file=rel, size=size, checksum=checksum, hmac=mac, samples=info.samples, type=info.type,
                          keys=info.keys, written_at=utc_now(), method=method, rollout_seconds=rollout_seconds,
                          call=call)
        try:
            self._commit_entry(stream, step, entry)
        except BaseException:
            self.backend.remove([rel])  # unreferenced data: invisible anyway, but do not leave it
            raise
        self._view_cache = None
        owned.committed(step, entry.to_json())
        return entry

    def _commit_entry(self, stream: StreamId, step: int, entry: StepEntry) -> None:
        """Make the step visible: create its entry file, exclusively (the conditional write
        that refuses a concurrent writer of the same step)."""
        rel, data = entry_relpath(stream, step), encode_entry(stream, step, entry)
        if self.backend.create(rel, data, durable=False):
            return
        existing = self.backend.read(rel)
        if existing is None or decode_entry(existing, stream, step, self.backend.where(rel)) in (None, INVALID):
            self.backend.replace(rel, data)  # a tombstone or garbage of our own stream: ours to replace
            return
        raise exists_error(stream, step, self.backend.where(rel))

    def delete(self, stream: StreamId, step: int) -> None:
        """Hide the step first (remove its entry, or a tombstone over a folded entry), then
        remove its data: a crash in between leaves unreferenced data, never a broken step."""
        self._owner(stream).deleted(step)
        self.backend.remove([stream.relpath(step)])
        self._view_cache = None

    def close(self) -> None:
        """Fold every stream this object writes into manifest.json and release the locks."""
        errors: list[BaseException] = []
        try:
            self.backend.sync()
        except BaseException as exc:
            errors.append(exc)
        for key, owned in list(self._owned.items()):
            try:
                if owned.lost() is None:
                    owned.fold(final=True)
                else:
                    logger.warning("[RolloutMock] not folding the index of %s: its writer lock was lost", owned.stream)
            except BaseException as exc:  # release every lock, then report
                errors.append(exc)
            finally:
                owned.release()
                del self._owned[key]
        self._view_cache = None
        if errors:
            raise errors[0]

    # ------------------------------------------------------------------ loading
    def load(self, stream: StreamId, step: int, *, trusted: bool = False) -> Any:
        entry = self.entry(stream, step)
        rel = stream.relpath(step)
        if entry is None:
            if self.backend.exists(rel):
                raise CorruptStepError(
                    f"[RolloutMock] {self.backend.where(rel)} exists but step {step} of {stream} is not in "
                    f"the index ({self.backend.where(MANIFEST_NAME)} and its entry files): the dump is incomplete "
                    f"(a writer died before committing the step) or was copied together by hand; re-dump the step",
                    mode="mock", split=stream.split, step=step, path=self.backend.where(rel),
                )
            raise self.missing_step_error(stream, step, mode="mock")
        return self._load_step(rel, entry, stream, step, trusted)

    def _load_step(self, rel: str, entry: StepEntry, stream: StreamId, step: int, trusted: bool) -> Any:
        """Every backend's full load: a local file through :func:`load_verified`; an object read
        in one request when small, else with ranged reads straight into the tensors."""
        path = self.backend.local_path(rel)
        if path is not None:
            return load_verified(path, entry, stream=stream, step=step, trusted=trusted, verify=self.verify,
                                 hmac_key=self.hmac_key)
        try:
            if entry.size <= WHOLE_READ_BYTES:
                data = self.backend.read(rel)
                if data is None:
                    raise FileNotFoundError(rel)
                source: Any = BytesSource(data, self.where(rel))
            else:  # chunk by chunk in blocks of 16-64 MiB (an eighth of the step): one block of extra memory
                block = min(64 << 20, max(WHOLE_READ_BYTES, entry.size // 8))
                source = ReadAheadSource(self.backend.open_source(rel), block)
        except FileNotFoundError:
            raise corrupt_error(self.where(rel), stream, step, "the object listed in the index is missing") from None
        return load_source_verified(source, entry, stream=stream, step=step, trusted=trusted, verify=self.verify,
                                    hmac_key=self.hmac_key)

    def describe_location(self, stream: StreamId, step: int) -> str:
        return self.backend.where(stream.relpath(step))



#: The name this class had before storage was composition (kept for code that imports it).
IndexedStore = Store

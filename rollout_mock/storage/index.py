"""The scalable index: one small entry file per recorded step, folded into immutable segment
files every :data:`SEGMENT_STEPS` steps while the writer runs, and into ``manifest.json``.

Layout inside ``dump_dir`` (all names built from validated split/name/rank, see
:mod:`rollout_mock.storage.paths`)::

    manifest.json                          compacted index (format_version 2; 1 still loads)
    .fingerprint.json                      environment of the first writer (create-if-absent)
    .streams/train~math~rank3.json         a stream opened for writing and not compacted yet
    train/step_000005.pkl                  the step's data
    train/.index/step_000005.json          its entry: the commit point of the step
    train/.index/segment_000003.json       1,024 folded entries (immutable; named by the manifest)
    train/.health/segment_000000.jsonl     the health lines of steps 0-99 (the store's side file)

Writing step N: write the data object, **then** create its entry file (exclusively: a local
``link``, or an S3 ``If-None-Match: *`` put). A step is visible only once its entry exists, so a
writer that dies before (or during) the entry write leaves at most an unreferenced data object,
never something a reader takes for a step. Each step costs the same two small writes whatever N
is, and ranks/streams never share a file while recording.

Reading: the manifest, plus the ``.streams/`` records and the ``.index/`` listing of each stream;
an entry file wins over the manifest's entry for the same step (a stale manifest), a tombstone
entry (``"entry": null``) hides a step deleted after compaction, and an entry file that cannot
be parsed or that names another stream or step is ignored with a warning (a torn or planted
file is never a step).

Folding (every :data:`SEGMENT_STEPS` entries, and at close): the writer creates a segment file
holding its pending entries, then, under the manifest lock, adds a reference to it in
``manifest.json`` (the segment's sequence number and its live steps as ranges), strips those steps
from older references, and only then deletes the entry files. A crash at any point leaves entries
that agree, or an unreferenced segment (ignored by readers, removed by the next writer). So a
crash leaves at most ``SEGMENT_STEPS`` entry files to read, and a dump of any length opens by
reading the manifest's ranges; an entry in a segment is parsed only when its step is loaded.
At close, a stream of at most :data:`INLINE_STEPS` steps is folded back inline into
``manifest.json`` (``streams[key]["steps"]``, as every earlier version wrote it) and its segments
are removed; a longer stream keeps its segments (manifest ``format_version`` 3).

Every index document is parsed with :func:`~rollout_mock.jsonio.loads_bounded` after a read
bounded in bytes; step sets stay ranges (:class:`~rollout_mock.storage.manifest.StepSet`).

:class:`StreamIndex` is the index of one stream as its writer keeps it: which steps exist (as
ranges), which entry files are not folded yet, and the folding itself. The
:class:`~rollout_mock.storage.store.Store` holds one per stream it writes.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from rollout_mock.errors import LockedError, ManifestError, UnsafePathError
from rollout_mock.jsonio import loads_bounded
from rollout_mock.storage.backend import BackendDefaults
from rollout_mock.storage.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    Manifest,
    PackRecord,
    StepEntry,
    StepSet,
    StreamId,
    dumps_manifest,
    parse_manifest,
    utc_now,
)
from rollout_mock.text import logger

__all__ = [
    "CALLS_DIR", "calls_dir", "pack_relpath", "read_packs", "seq_of_pack_name",
    "ENTRY_BYTES", "FINGERPRINT_NAME", "HEALTH_DIR", "HEALTH_SEGMENT", "INDEX_DIR", "INLINE_STEPS", "INVALID",
    "MANIFEST_BYTES", "MANIFEST_LOCK",
    "SEGMENT_STEPS", "STREAMS_DIR", "StreamIndex", "decode_entry", "decode_segment", "decode_stream_record",
    "encode_entry", "encode_segment", "encode_stream_record", "entry_relpath", "health_relpath", "index_dir",
    "lock_holder", "manifest_lock", "merge_stream", "parse_step_relpath", "read_doc", "read_entries",
    "read_fingerprint", "read_manifest_file", "read_segment", "read_stream_records", "record_fingerprint",
    "segment_relpath", "seq_of_segment_name", "step_of_entry_name",
    "stream_record_name", "strip_steps", "to_ranges", "writer_lock_relpath",
]

#: Pending entries a writer folds into one segment file (and the most a crash leaves unfolded).
SEGMENT_STEPS = 1024
#: At close, streams up to this many steps are folded inline into manifest.json, longer ones
#: keep their segments (opening such a dump then reads only ranges, not every entry).
INLINE_STEPS = 10_000
SEGMENT_FORMAT = "rollout_mock.segment"
INDEX_DIR = ".index"
CALLS_DIR = ".calls"
#: The folder of a stream's health side files, and the steps of one side file.
HEALTH_DIR = ".health"
HEALTH_SEGMENT = 100
STREAMS_DIR = ".streams"
FINGERPRINT_NAME = ".fingerprint.json"
MANIFEST_LOCK = ".manifest.lock"
ENTRY_FORMAT = "rollout_mock.entry"
STREAM_FORMAT = "rollout_mock.stream"
#: The most bytes read of an entry file, a stream record or the fingerprint ...
ENTRY_BYTES = 16 << 20
#: ... and of manifest.json or a segment file (a 10,000-step manifest is a few MB).
MANIFEST_BYTES = 256 << 20
#: ``decode_entry`` result for a file that is not a valid entry of the expected stream/step.
INVALID = object()
_FIX = "restore the dump from a copy, or re-dump"


# ---------------------------------------------------------------------- names
def index_dir(stream: StreamId) -> str:
    return f"{stream.directory}/{INDEX_DIR}"


def entry_relpath(stream: StreamId, step: int) -> str:
    return f"{index_dir(stream)}/{stream.file_name(step).removesuffix('.pkl')}.json"


def step_of_entry_name(stream: StreamId, name: str) -> int | None:
    """The step an entry file name in ``index_dir(stream)`` belongs to, or None (other rank...)."""
    match = re.fullmatch(rf"step_(-?[0-9]{{1,18}}){re.escape(stream.suffix)}\.json", name, re.ASCII)
    return None if match is None else int(match.group(1))


def stream_record_name(stream: StreamId) -> str:
    parts = [stream.split] + ([] if stream.name is None else [stream.name])
    parts += [] if stream.rank is None else [f"rank{stream.rank}"]
    return "~".join(parts) + ".json"


def calls_dir(stream: StreamId) -> str:
    """Where a stream's packs of extra calls live (``train/.calls``: a name no split or scheduler
    name can take)."""
    return f"{stream.directory}/{CALLS_DIR}"


def pack_relpath(stream: StreamId, seq: int, suffix: str = ".pkl") -> str:
    """A pack's data file (``.pkl``) or its record (``.json``, the pack's commit point)."""
    return f"{calls_dir(stream)}/pack_{seq:06d}{stream.suffix}{suffix}"


def seq_of_pack_name(stream: StreamId, name: str) -> int | None:
    """The sequence number of a pack record's file name in ``calls_dir(stream)``, or None."""
    match = re.fullmatch(rf"pack_([0-9]{{6,9}}){re.escape(stream.suffix)}\.json", name, re.ASCII)
    return None if match is None else int(match.group(1))


def read_packs(backend: BackendDefaults, stream: StreamId) -> list[PackRecord]:
    """The stream's pack records, by sequence number; one that cannot be parsed, or that names
    another stream or file, is ignored with a warning (a torn or planted file is never a call)."""
    directory = calls_dir(stream)
    packs = []
    for name in sorted(backend.listdir(directory)):
        seq = seq_of_pack_name(stream, name)
        if seq is None:
            continue
        rel = f"{directory}/{name}"
        data = backend.read(rel, 0, MANIFEST_BYTES + 1)
        if data is None:
            continue
        where = backend.where(rel)
        try:
            raw = loads_bounded(data, where=where, what="pack record", max_bytes=MANIFEST_BYTES, fix=_FIX)
            packs.append(PackRecord.from_json(raw, stream_key=stream.key, seq=seq,
                                              file=pack_relpath(stream, seq), where=where))
        except ManifestError as exc:
            logger.warning("[RolloutMock] ignoring %s: %s", where, str(exc)[:300])
    return sorted(packs, key=lambda p: p.seq)


def health_relpath(stream: StreamId, segment: int) -> str:
    """The health side file of ``segment`` (steps ``segment * HEALTH_SEGMENT ...``) of ``stream``."""
    return f"{stream.directory}/{HEALTH_DIR}/segment_{segment:06d}{stream.suffix}.jsonl"


def segment_relpath(stream: StreamId, seq: int) -> str:
    return f"{index_dir(stream)}/segment_{seq:06d}{stream.suffix}.json"


def seq_of_segment_name(stream: StreamId, name: str) -> int | None:
    """The sequence number of a segment file name in ``index_dir(stream)``, or None."""
    match = re.fullmatch(rf"segment_([0-9]{{6,9}}){re.escape(stream.suffix)}\.json", name, re.ASCII)
    return None if match is None else int(match.group(1))


def writer_lock_relpath(stream: StreamId) -> str:
    """The lock object a stream's writer holds (``train/.writer-rank3.lock``)."""
    return f"{stream.directory}/.writer{'' if stream.rank is None else f'-rank{stream.rank}'}.lock"


_STEP_FILE = re.compile(r"step_(-?[0-9]{1,18})(?:_rank([0-9]{1,9}))?\.pkl", re.ASCII)


def parse_step_relpath(relpath: str) -> tuple[StreamId, int] | None:
    """``train/math/step_000005_rank1.pkl`` -> (train/math@rank1, 5); None if not a step path."""
    parts = relpath.split("/")
    match = _STEP_FILE.fullmatch(parts[-1])
    if match is None or len(parts) not in (2, 3):
        return None
    try:
        stream = StreamId(parts[0], parts[1] if len(parts) == 3 else None,
                          None if match.group(2) is None else int(match.group(2)))
    except UnsafePathError:
        return None
    step = int(match.group(1))
    return (stream, step) if stream.relpath(step) == relpath else None


def lock_holder() -> str:
    """How this process describes itself in the locks it takes."""
    return f"pid {os.getpid()} on {socket.gethostname()} since {utc_now()}"


@contextmanager
def manifest_lock(backend: BackendDefaults) -> Iterator[None]:
    """Exclusive access to ``manifest.json`` for a read-modify-write (waits up to 2 minutes)."""
    try:
        handle = backend.lock(MANIFEST_LOCK, lock_holder(), wait=120.0)
    except LockedError as exc:
        raise LockedError(f"[RolloutMock] another writer holds the manifest lock of {backend.where('')} "
                          f"for more than 2 minutes: {exc}", mode="dump", path=exc.path) from None
    try:
        yield
    finally:
        backend.unlock(handle)


# ---------------------------------------------------------------------- documents
def read_doc(backend: BackendDefaults, rel: str, what: str, limit: int = ENTRY_BYTES) -> Any:
    """An index document of ``backend``, read (at most ``limit + 1`` bytes) and parsed with the
    bounded reader; None if absent, :class:`ManifestError` naming it if it is not JSON."""
    data = backend.read(rel, 0, limit + 1)
    if data is None:
        return None
    return loads_bounded(data, where=backend.where(rel), what=what, max_bytes=limit, fix=_FIX)


def encode_entry(stream: StreamId, step: int, entry: StepEntry | None) -> bytes:
    """An entry file's bytes; ``entry=None`` is a tombstone (the step was deleted)."""
    record = {"format": ENTRY_FORMAT, "stream": stream.key, "step": step,
              "entry": None if entry is None else entry.to_json()}
    return json.dumps(record, allow_nan=False, separators=(",", ":")).encode("utf-8")


def decode_entry(data: bytes, stream: StreamId, step: int, where: str) -> Any:
    """The raw entry dict, ``None`` for a tombstone, or :data:`INVALID` (logged) for anything
    that is not a complete entry of exactly this stream and step."""
    try:
        record = loads_bounded(data, where=where, what="entry file", max_bytes=ENTRY_BYTES, fix=_FIX)
        if not isinstance(record, dict) or record.get("format") != ENTRY_FORMAT:
            raise ValueError("not an entry record")
        if record.get("stream") != stream.key or record.get("step") != step:
            raise ValueError("it names another stream or step")
        raw = record.get("entry")
        if raw is not None:
            parsed = StepEntry.from_json(raw, where=where, path=where)
            if parsed.file != stream.relpath(step):
                raise ValueError("it names another file")
        return raw
    except (ValueError, ManifestError) as exc:
        logger.warning("[RolloutMock] ignoring %s: not a valid entry of step %d of %s (%s)", where, step, stream,
                       str(exc)[:300])
        return INVALID


def encode_stream_record(stream: StreamId, methods: dict[str, dict[str, Any]]) -> bytes:
    record = {"format": STREAM_FORMAT, "split": stream.split, "name": stream.name, "rank": stream.rank,
              "methods": methods}
    return json.dumps(record, allow_nan=False, indent=1).encode("utf-8")


def decode_stream_record(data: bytes, where: str) -> tuple[StreamId, dict[str, dict[str, Any]]] | None:
    """The stream and methods of a ``.streams/`` record, or None (logged) if it is not one."""
    try:
        record = loads_bounded(data, where=where, what="stream record", max_bytes=ENTRY_BYTES, fix=_FIX)
        if not isinstance(record, dict) or record.get("format") != STREAM_FORMAT:
            raise ValueError("not a stream record")
        stream = StreamId(record["split"], record.get("name"), record.get("rank"))
        methods = record.get("methods") or {}
        if not isinstance(methods, dict) or not all(isinstance(m, dict) for m in methods.values()):
            raise ValueError("methods is not an object of objects")
        return stream, methods
    except (ValueError, KeyError, TypeError, UnsafePathError, ManifestError) as exc:
        logger.warning("[RolloutMock] ignoring %s: not a valid stream record (%s)", where, str(exc)[:300])
        return None


def encode_segment(stream: StreamId, seq: int, entries: dict[int, Any]) -> bytes:
    record = {"format": SEGMENT_FORMAT, "stream": stream.key, "seq": seq,
              "entries": {str(step): raw for step, raw in sorted(entries.items())}}
    return json.dumps(record, allow_nan=False, separators=(",", ":")).encode("utf-8")


def decode_segment(data: bytes, stream: StreamId, seq: int, where: str) -> dict[str, Any]:
    """A segment's raw entries by step key; :class:`ManifestError` naming the file if it is not
    exactly the segment the manifest references (entries are validated when used)."""
    record = loads_bounded(data, where=where, what="index segment", max_bytes=MANIFEST_BYTES, fix=_FIX)
    if (not isinstance(record, dict) or record.get("format") != SEGMENT_FORMAT or record.get("stream") != stream.key
            or record.get("seq") != seq or not isinstance(record.get("entries"), dict)):
        raise ManifestError(f"{where}: not index segment {seq} of {stream.key} (the manifest references it); "
                            f"{_FIX}", path=where)
    return dict(record["entries"])


def read_entries(backend: BackendDefaults, stream: StreamId, names: list[str] | None = None) -> dict[int, Any]:
    """The stream's entry files (``names``: a listing already made), decoded; invalid ones as
    :data:`INVALID`, tombstones as None."""
    directory = index_dir(stream)
    names = backend.listdir(directory) if names is None else names
    entries: dict[int, Any] = {}
    for name in names:
        step = step_of_entry_name(stream, name)
        if step is None:
            continue
        data = backend.read(f"{directory}/{name}", 0, ENTRY_BYTES + 1)
        if data is not None:
            entries[step] = decode_entry(data, stream, step, backend.where(f"{directory}/{name}"))
    return entries


def read_stream_records(backend: BackendDefaults) -> dict[StreamId, dict[str, dict[str, Any]]]:
    """Every stream record (a stream announced by its writer), by stream: its methods."""
    records: dict[StreamId, dict[str, dict[str, Any]]] = {}
    for name in backend.listdir(STREAMS_DIR):
        data = backend.read(f"{STREAMS_DIR}/{name}", 0, ENTRY_BYTES + 1)
        decoded = None if data is None else decode_stream_record(data, backend.where(f"{STREAMS_DIR}/{name}"))
        if decoded is not None and stream_record_name(decoded[0]) == name:
            records[decoded[0]] = decoded[1]
    return records


def read_fingerprint(backend: BackendDefaults) -> dict[str, Any] | None:
    """The fingerprint file of a dump not yet compacted (None if absent or not a JSON object)."""
    try:
        value = read_doc(backend, FINGERPRINT_NAME, "fingerprint")
    except ManifestError as exc:
        logger.warning("[RolloutMock] ignoring %s", str(exc)[:300])
        return None
    return value if isinstance(value, dict) else None


def read_segment(backend: BackendDefaults, stream: StreamId, seq: int) -> dict[str, Any]:
    """The raw entries of segment ``seq`` of ``stream`` (see :func:`decode_segment`)."""
    rel = segment_relpath(stream, seq)
    data = backend.read(rel, 0, MANIFEST_BYTES + 1)
    if data is None:
        raise ManifestError(f"{backend.where(rel)}: index segment {seq} of {stream.key} is missing (the manifest "
                            f"references it); restore the dump from a copy", path=backend.where(rel))
    return decode_segment(data, stream, seq, backend.where(rel))


def read_manifest_file(backend: BackendDefaults) -> Manifest | None:
    """``manifest.json``, read now (at most :data:`MANIFEST_BYTES`) and parsed; None when there is
    none. Its segments are read from ``backend`` when an entry in one is asked for."""
    data = backend.read(MANIFEST_NAME, 0, MANIFEST_BYTES + 1)
    if data is None:
        return None
    manifest = parse_manifest(data, backend.where(MANIFEST_NAME))
    manifest.segment_reader = lambda stream, seq: read_segment(backend, stream, seq)
    return manifest


def record_fingerprint(backend: BackendDefaults, fingerprint: dict[str, Any], base: Manifest | None) -> None:
    """Record the environment of the dump's first writer (the fingerprint file, created if absent),
    unless ``base`` (manifest.json, read under the manifest lock, which the caller holds) or the
    file already holds one."""
    if (base is None or base.fingerprint is None) and read_fingerprint(backend) is None:
        backend.create(FINGERPRINT_NAME, json.dumps(fingerprint, allow_nan=False, default=str).encode("utf-8"))


# ---------------------------------------------------------------------- ranges
def to_ranges(steps: StepSet | list[int]) -> list[list[int]]:
    """Sorted steps as ``[[first, last], ...]`` runs."""
    if isinstance(steps, StepSet):
        return [[first, last] for first, last in steps.runs()]
    return [[first, last] for first, last in StepSet.of(steps).runs()]


def strip_steps(data: dict[str, Any], steps: set[int] | dict[int, Any]) -> list[int]:
    """Remove ``steps`` from the segment references of a stream's manifest data (a newer entry
    or a deletion supersedes them), run by run, never step by step; drop references left empty
    and return their sequence numbers."""
    if not steps or not data.get("segments"):
        return []
    ordered = sorted(steps)
    emptied: list[int] = []
    kept: list[dict[str, Any]] = []
    for ref in data["segments"]:
        runs: list[list[int]] = []
        hit = False
        for first, last in ref["steps"]:
            i = bisect.bisect_left(ordered, first)
            cursor = first
            while i < len(ordered) and ordered[i] <= last:
                hit = True
                if ordered[i] > cursor:
                    runs.append([cursor, ordered[i] - 1])
                cursor = ordered[i] + 1
                i += 1
            if cursor <= last:
                runs.append([cursor, last])
        if not hit:
            kept.append(ref)
        elif runs:
            kept.append({**ref, "steps": runs})
        else:
            emptied.append(int(ref["seq"]))
    data["segments"] = kept
    return emptied


def merge_stream(manifest: Manifest, stream: StreamId, methods: dict[str, dict[str, Any]] | None,
                 entries: dict[int, Any]) -> None:
    """Fold a stream's record and entry files into ``manifest`` (entries win over inline entries
    and segment references; None deletes)."""
    data = manifest.stream(stream, create=True)
    assert data is not None
    if methods:
        data["methods"].update(methods)
    steps = data["steps"]
    valid = {step: raw for step, raw in entries.items() if raw is not INVALID}
    if data.get("segments"):
        strip_steps(data, set(valid))
    for step, raw in valid.items():
        if raw is None:
            steps.pop(str(step), None)
        else:
            steps[str(step)] = raw
    manifest.changed(stream)


# ---------------------------------------------------------------------- the writer's index
def _recover_names(stream: StreamId) -> Callable[[str], bool]:
    """Which names in the stream's directories a crashed writer of ``stream`` may have left half
    written: its step files, entries, segments and packs."""
    pattern = re.compile(rf"(step_-?[0-9]{{1,18}}|segment_[0-9]{{6,9}}|pack_[0-9]{{6,9}}){re.escape(stream.suffix)}"
                         rf"\.(pkl|json)",
                         re.ASCII)
    return lambda name: pattern.fullmatch(name) is not None


class StreamIndex:
    """A stream claimed for writing (see the module docstring). Build it with :meth:`open`.

    It never holds the stream's entries in memory: only its steps (as ranges), and the entries
    written since the last fold (at most :attr:`segment_steps`).
    """

    #: entries per segment, and the longest stream folded inline at close (class attributes so
    #: that a test can make them small)
    segment_steps: ClassVar[int] = SEGMENT_STEPS
    inline_steps: ClassVar[int] = INLINE_STEPS

    def __init__(self, backend: BackendDefaults, stream: StreamId, handle: Any) -> None:
        self.backend, self.stream, self.handle = backend, stream, handle
        self.live = StepSet()  # every step of the stream
        self.folded = StepSet()  # steps held by manifest.json (inline or in a segment)
        self.pending: dict[int, Any] = {}  # entry files not folded yet: the raw entry, or None (tombstone)
        self.methods: dict[str, dict[str, Any]] = {}
        self.next_seq = 0
        #: the stream has packs of further calls (the manifest then requires "call-packs")
        self.has_packs = False

    @classmethod
    def open(cls, backend: BackendDefaults, stream: StreamId, *, fingerprint: dict[str, Any] | None = None,
             methods: dict[str, dict[str, Any]] | None = None) -> StreamIndex:
        """Claim ``stream`` (:class:`LockedError` if another writer holds it), remove what a
        crashed writer left (temporary files, an unreferenced segment), record ``fingerprint``
        (this writer's environment) when the dump has none yet, fold the stream's leftover entry
        files (at most one segment's worth, whatever the dump's length), announce the stream with
        its recorded methods and ``methods`` (how this writer's methods are called)."""
        try:
            handle = backend.lock(writer_lock_relpath(stream), lock_holder())
        except LockedError as exc:
            raise LockedError(
                f"[RolloutMock] another writer is already dumping {stream} into {backend.where('')}: {exc}. Two "
                f"schedulers on one dump_dir and split must each have a distinct `name` (files go to "
                f"{stream.split}/<name>/); two runs need two dump_dirs. A writer that died releases it (a lease: "
                f"when it expires).", mode="dump", split=stream.split, path=exc.path) from None
        try:
            index = cls(backend, stream, handle)
            index._resume(fingerprint, methods or {})
        except BaseException:
            backend.unlock(handle)
            raise
        return index

    def _recover(self, fingerprint: dict[str, Any] | None) -> Manifest | None:
        """Remove the temporary files a crashed writer of the stream left (the manifest's and the
        fingerprint's under the manifest lock, which also records ``fingerprint``); manifest.json."""
        backend, stream = self.backend, self.stream
        with manifest_lock(backend):
            backend.recover("", lambda name: name in (MANIFEST_NAME, FINGERPRINT_NAME))
            base = read_manifest_file(backend)
            if fingerprint is not None:
                record_fingerprint(backend, fingerprint, base)
        names = _recover_names(stream)
        backend.recover(stream.directory, names)
        backend.recover(index_dir(stream), names)
        backend.recover(calls_dir(stream), names)
        backend.recover(STREAMS_DIR, lambda name: name == stream_record_name(stream))
        health = re.compile(rf"segment_[0-9]{{6,9}}{re.escape(stream.suffix)}\.jsonl", re.ASCII)
        backend.recover(f"{stream.directory}/{HEALTH_DIR}", lambda name: health.fullmatch(name) is not None)
        return base

    def _resume(self, fingerprint: dict[str, Any] | None, methods: dict[str, dict[str, Any]]) -> None:
        backend, stream = self.backend, self.stream
        base = self._recover(fingerprint)
        data = None if base is None else base.streams.get(stream.key)
        self.folded = base.steps(stream).copy() if base is not None else StepSet()
        self.methods = {**(base.methods(stream) if base is not None else {}), **methods}
        names = backend.listdir(index_dir(stream))
        referenced = {int(ref["seq"]) for ref in (data or {}).get("segments") or ()}
        on_disk = {seq for name in names if (seq := seq_of_segment_name(stream, name)) is not None}
        self.next_seq = max(referenced | on_disk, default=-1) + 1
        orphans = sorted(on_disk - referenced)  # a writer died between a segment and its reference
        if orphans:
            backend.remove([segment_relpath(stream, seq) for seq in orphans])
        leftovers = read_entries(backend, stream, names)
        invalid = [step for step, raw in leftovers.items() if raw is INVALID]
        self.pending = {step: raw for step, raw in leftovers.items() if raw is not INVALID}
        self.live = self.folded.copy()
        for step, raw in self.pending.items():
            (self.live.discard if raw is None else self.live.add)(step)
        backend.replace(f"{STREAMS_DIR}/{stream_record_name(stream)}", encode_stream_record(stream, self.methods))
        if invalid:
            backend.remove([entry_relpath(stream, step) for step in invalid])
        if self.pending:
            logger.info("[RolloutMock] %s: folding %d entry file(s) left by an earlier writer", stream,
                        len(self.pending))
            self.fold(final=False)

    # ------------------------------------------------------------------ state
    def lost(self) -> str | None:
        return self.backend.lock_lost(self.handle)

    def check_held(self) -> None:
        lost = self.lost()
        if lost is not None:
            raise LockedError(f"[RolloutMock] lost the writer lock of {self.stream} in {self.backend.where('')}: "
                              f"{lost}", mode="dump", split=self.stream.split)

    def pending_entry(self, step: int) -> tuple[bool, Any]:
        """``(True, raw or None)`` when the step's entry is not folded yet, else ``(False, None)``."""
        if step in self.pending:
            return True, self.pending[step]
        return False, None

    def set_methods(self, methods: dict[str, dict[str, Any]]) -> None:
        self.methods.update(methods)
        self.backend.replace(f"{STREAMS_DIR}/{stream_record_name(self.stream)}",
                             encode_stream_record(self.stream, self.methods))

    # ------------------------------------------------------------------ changes
    def committed(self, step: int, raw: dict[str, Any]) -> None:
        """A step's entry file was created: remember it; fold every ``segment_steps`` entries."""
        self.pending[step] = raw
        self.live.add(step)
        if len(self.pending) >= self.segment_steps:
            self.fold(final=False)

    def amended(self, step: int, entry: StepEntry) -> None:
        """Replace a live step's entry (e.g. its ``pin`` reasons): a new entry file, which wins
        over a folded entry as a tombstone does."""
        self.backend.replace(entry_relpath(self.stream, step), encode_entry(self.stream, step, entry))
        self.pending[step] = entry.to_json()

    def deleted(self, steps: list[int]) -> None:
        """Hide steps: remove their entry files (one batched removal), or write a tombstone over
        each folded entry."""
        unfolded = []
        for step in steps:
            if step in self.folded:
                self.backend.replace(entry_relpath(self.stream, step), encode_entry(self.stream, step, None))
                self.pending[step] = None
            else:
                unfolded.append(entry_relpath(self.stream, step))
                self.pending.pop(step, None)
        if unfolded:
            self.backend.remove(unfolded)
        for step in steps:
            self.live.discard(step)

    def fold(self, *, final: bool) -> None:
        """Fold the pending entries (see the module docstring): a new segment file, then its
        reference in manifest.json (under the manifest lock), then the entry files go.
        ``final`` (close): a stream of at most ``inline_steps`` steps is folded inline instead,
        its segments removed, and the stream record goes too."""
        backend, stream = self.backend, self.stream
        entries = {step: raw for step, raw in self.pending.items() if raw is not None}
        inline = final and len(self.live) <= self.inline_steps
        new_seq = None
        if entries and not inline:
            new_seq, self.next_seq = self.next_seq, self.next_seq + 1
            rel, body = segment_relpath(stream, new_seq), encode_segment(stream, new_seq, entries)
            if not backend.create(rel, body):
                backend.replace(rel, body)  # left by a dead writer of this stream (we hold its lock)
        with manifest_lock(backend):
            manifest = read_manifest_file(backend) or Manifest()
            data = manifest.stream(stream, create=True)
            assert data is not None
            data["methods"].update(self.methods)
            if self.has_packs:  # older readers must refuse it rather than serve one call per step
                data["calls"] = True
            emptied = strip_steps(data, set(self.pending))
            for step in self.pending:
                data["steps"].pop(str(step), None)
            if inline:
                emptied += self._inline_segments(data)
                data["steps"].update({str(step): raw for step, raw in entries.items()})
                data["steps"] = dict(sorted(data["steps"].items(), key=lambda kv: int(kv[0])))
            elif new_seq is not None:
                data.setdefault("segments", []).append({"seq": new_seq, "steps": to_ranges(sorted(entries))})
            if not data.get("segments"):
                data.pop("segments", None)
            if manifest.fingerprint is None:
                manifest.fingerprint = read_fingerprint(backend)
            manifest.format_version = FORMAT_VERSION  # the steps just folded are of this format
            backend.replace(MANIFEST_NAME, dumps_manifest(manifest).encode("utf-8"))
        gone = [entry_relpath(stream, step) for step in self.pending]
        gone += [segment_relpath(stream, seq) for seq in emptied]
        if final:
            gone.append(f"{STREAMS_DIR}/{stream_record_name(stream)}")
        backend.remove(gone)
        if final:
            backend.prune_dirs([index_dir(stream), STREAMS_DIR])
        self.folded = self.live.copy()
        self.pending = {}

    def _inline_segments(self, data: dict[str, Any]) -> list[int]:
        """Copy the entries of the stream's segments inline into its manifest data; their seqs."""
        seqs = []
        for ref in data.get("segments") or ():
            segment = read_segment(self.backend, self.stream, int(ref["seq"]))
            for first, last in ref["steps"]:
                for step in range(first, last + 1):
                    raw = segment.get(str(step))
                    if raw is not None:
                        data["steps"][str(step)] = raw
            seqs.append(int(ref["seq"]))
        data.pop("segments", None)
        return seqs

    def release(self) -> None:
        self.backend.unlock(self.handle)

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
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rollout_mock.errors import ManifestError, UnsafePathError
from rollout_mock.storage.manifest import Manifest, StepEntry, StreamId
from rollout_mock.text import logger

if TYPE_CHECKING:
    from rollout_mock.storage.backend import ByteBackend

__all__ = [
    "read_entries",
    "read_fingerprint",
    "read_stream_records",
    "FINGERPRINT_NAME", "INDEX_DIR", "STREAMS_DIR", "decode_entry", "decode_stream_record",
    "encode_entry", "encode_stream_record", "entry_relpath", "index_dir", "merge_stream",
    "parse_step_relpath", "step_of_entry_name", "stream_record_name", "SEGMENT_STEPS", "INLINE_STEPS",
    "segment_relpath", "seq_of_segment_name", "encode_segment", "decode_segment", "to_ranges",
    "iter_ranges", "strip_steps", "read_segment",
]

#: Pending entries a writer folds into one segment file (and the most a crash leaves unfolded).
SEGMENT_STEPS = 1024
#: At close, streams up to this many steps are folded inline into manifest.json, longer ones
#: keep their segments (opening such a dump then reads only ranges, not every entry).
INLINE_STEPS = 10_000
SEGMENT_FORMAT = "rollout_mock.segment"
INDEX_DIR = ".index"
STREAMS_DIR = ".streams"
FINGERPRINT_NAME = ".fingerprint.json"
ENTRY_FORMAT = "rollout_mock.entry"
STREAM_FORMAT = "rollout_mock.stream"
#: ``decode_entry`` result for a file that is not a valid entry of the expected stream/step.
INVALID = object()


def index_dir(stream: StreamId) -> str:
    return f"{stream.directory}/{INDEX_DIR}"


def entry_relpath(stream: StreamId, step: int) -> str:
    return f"{index_dir(stream)}/{stream.file_name(step).removesuffix('.pkl')}.json"


def step_of_entry_name(stream: StreamId, name: str) -> int | None:
    """The step an entry file name in ``index_dir(stream)`` belongs to, or None (other rank...)."""
    suffix = "" if stream.rank is None else f"_rank{stream.rank}"
    match = re.fullmatch(rf"step_(-?[0-9]{{1,18}}){re.escape(suffix)}\.json", name, re.ASCII)
    return None if match is None else int(match.group(1))


def stream_record_name(stream: StreamId) -> str:
    parts = [stream.split] + ([] if stream.name is None else [stream.name])
    parts += [] if stream.rank is None else [f"rank{stream.rank}"]
    return "~".join(parts) + ".json"


def encode_entry(stream: StreamId, step: int, entry: StepEntry | None) -> bytes:
    """An entry file's bytes; ``entry=None`` is a tombstone (the step was deleted)."""
    record = {"format": ENTRY_FORMAT, "stream": stream.key, "step": step,
              "entry": None if entry is None else entry.to_json()}
    return json.dumps(record, allow_nan=False, separators=(",", ":")).encode("utf-8")


def decode_entry(data: bytes, stream: StreamId, step: int, where: str) -> Any:
    """The raw entry dict, ``None`` for a tombstone, or :data:`INVALID` (logged) for anything
    that is not a complete entry of exactly this stream and step."""
    try:
        record = json.loads(data.decode("utf-8"))
        if not isinstance(record, dict) or record.get("format") != ENTRY_FORMAT:
            raise ValueError("not an entry record")
        if record.get("stream") != stream.key or record.get("step") != step:
            raise ValueError(f"it names {record.get('stream')!r} step {record.get('step')!r}")
        raw = record.get("entry")
        if raw is not None:
            parsed = StepEntry.from_json(raw, where=where, path=where)
            if parsed.file != stream.relpath(step):
                raise ValueError(f"it names file {parsed.file!r}")
        return raw
    except (ValueError, UnicodeDecodeError, ManifestError) as exc:
        logger.warning("[RolloutMock] ignoring %s: not a valid entry of step %d of %s (%s)", where, step, stream, exc)
        return INVALID


def encode_stream_record(stream: StreamId, methods: dict[str, dict[str, Any]]) -> bytes:
    record = {"format": STREAM_FORMAT, "split": stream.split, "name": stream.name, "rank": stream.rank,
              "methods": methods}
    return json.dumps(record, allow_nan=False, indent=1).encode("utf-8")


def decode_stream_record(data: bytes, where: str) -> tuple[StreamId, dict[str, dict[str, Any]]] | None:
    """The stream and methods of a ``.streams/`` record, or None (logged) if it is not one."""
    try:
        record = json.loads(data.decode("utf-8"))
        if not isinstance(record, dict) or record.get("format") != STREAM_FORMAT:
            raise ValueError("not a stream record")
        stream = StreamId(record["split"], record.get("name"), record.get("rank"))
        methods = record.get("methods") or {}
        if not isinstance(methods, dict):
            raise ValueError("methods is not an object")
        return stream, methods
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, UnsafePathError) as exc:
        logger.warning("[RolloutMock] ignoring %s: not a valid stream record (%s)", where, exc)
        return None


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


# ---------------------------------------------------------------------- segments
def segment_relpath(stream: StreamId, seq: int) -> str:
    suffix = "" if stream.rank is None else f"_rank{stream.rank}"
    return f"{index_dir(stream)}/segment_{seq:06d}{suffix}.json"


def seq_of_segment_name(stream: StreamId, name: str) -> int | None:
    """The sequence number of a segment file name in ``index_dir(stream)``, or None."""
    suffix = "" if stream.rank is None else f"_rank{stream.rank}"
    match = re.fullmatch(rf"segment_([0-9]{{6,9}}){re.escape(suffix)}\.json", name, re.ASCII)
    return None if match is None else int(match.group(1))


def encode_segment(stream: StreamId, seq: int, entries: dict[int, Any]) -> bytes:
    record = {"format": SEGMENT_FORMAT, "stream": stream.key, "seq": seq,
              "entries": {str(step): raw for step, raw in sorted(entries.items())}}
    return json.dumps(record, allow_nan=False, separators=(",", ":")).encode("utf-8")


def decode_segment(data: bytes, stream: StreamId, seq: int, where: str) -> dict[str, Any]:
    """A segment's raw entries by step key; :class:`ManifestError` naming the file if it is not
    exactly the segment the manifest references (entries are validated when used)."""
    try:
        record = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{where}: unreadable index segment ({exc}); restore the dump from a copy",
                            path=where) from None
    if (not isinstance(record, dict) or record.get("format") != SEGMENT_FORMAT or record.get("stream") != stream.key
            or record.get("seq") != seq or not isinstance(record.get("entries"), dict)):
        raise ManifestError(f"{where}: not index segment {seq} of {stream.key} (the manifest references it); "
                            f"restore the dump from a copy", path=where)
    return record["entries"]


def to_ranges(steps: list[int]) -> list[list[int]]:
    """Sorted steps as ``[[first, last], ...]`` runs."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return runs


def iter_ranges(runs: list[list[int]]) -> Iterator[int]:
    """Every step of ``[[first, last], ...]`` runs, in order."""
    for first, last in runs:
        yield from range(first, last + 1)


def strip_steps(data: dict[str, Any], steps: set[int]) -> list[int]:
    """Remove ``steps`` from the segment references of a stream's manifest data (a newer entry
    or a deletion supersedes them); drop references left empty and return their sequence numbers."""
    if not steps or not data.get("segments"):
        return []
    ordered = sorted(steps)
    emptied: list[int] = []
    kept: list[dict[str, Any]] = []
    for ref in data["segments"]:
        runs = ref["steps"]
        hit = False
        for first, last in runs:
            i = bisect.bisect_left(ordered, first)
            if i < len(ordered) and ordered[i] <= last:
                hit = True
                break
        if not hit:
            kept.append(ref)
            continue
        live = [s for s in iter_ranges(runs) if s not in steps]
        if live:
            kept.append({**ref, "steps": to_ranges(live)})
        else:
            emptied.append(int(ref["seq"]))
    data["segments"] = kept
    return emptied


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


# ---------------------------------------------------------------------- reading it from a backend
def read_entries(backend: ByteBackend, stream: StreamId, names: list[str] | None = None) -> dict[int, Any]:
    """The stream's entry files (``names``: a listing already made), decoded; invalid ones as
    :data:`INVALID`, tombstones as None."""
    directory = index_dir(stream)
    names = backend.listdir(directory) if names is None else names
    entries: dict[int, Any] = {}
    for name in names:
        step = step_of_entry_name(stream, name)
        if step is None:
            continue
        data = backend.read(f"{directory}/{name}")
        if data is not None:
            entries[step] = decode_entry(data, stream, step, backend.where(f"{directory}/{name}"))
    return entries


def read_stream_records(backend: ByteBackend) -> dict[StreamId, dict[str, dict[str, Any]]]:
    """Every stream record (a stream announced by its writer), by stream: its methods."""
    records: dict[StreamId, dict[str, dict[str, Any]]] = {}
    for name in backend.listdir(STREAMS_DIR):
        data = backend.read(f"{STREAMS_DIR}/{name}")
        decoded = None if data is None else decode_stream_record(data, backend.where(f"{STREAMS_DIR}/{name}"))
        if decoded is not None and stream_record_name(decoded[0]) == name:
            records[decoded[0]] = decoded[1]
    return records


def read_fingerprint(backend: ByteBackend) -> dict[str, Any] | None:
    """The fingerprint file of a dump not yet compacted (None if absent or not a JSON object)."""
    data = backend.read(FINGERPRINT_NAME)
    if data is None:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        logger.warning("[RolloutMock] ignoring %s: not JSON", backend.where(FINGERPRINT_NAME))
        return None
    return value if isinstance(value, dict) else None


def read_segment(backend: ByteBackend, stream: StreamId, seq: int) -> dict[str, Any]:
    """The raw entries of segment ``seq`` of ``stream`` (see :func:`decode_segment`)."""
    rel = segment_relpath(stream, seq)
    data = backend.read(rel)
    if data is None:
        raise ManifestError(f"{backend.where(rel)}: index segment {seq} of {stream.key} is missing (the manifest "
                            f"references it); restore the dump from a copy", path=backend.where(rel))
    return decode_segment(data, stream, seq, backend.where(rel))

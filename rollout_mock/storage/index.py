"""The scalable index (format 2): one small entry file per recorded step, compacted into
``manifest.json`` when the writer closes.

Layout inside ``dump_dir`` (all names built from validated split/name/rank, see
:mod:`rollout_mock.storage.paths`)::

    manifest.json                          compacted index (format_version 2; 1 still loads)
    .fingerprint.json                      environment of the first writer (create-if-absent)
    .streams/train~math~rank3.json         a stream opened for writing and not compacted yet
    train/step_000005.pkl                  the step's data
    train/.index/step_000005.json          its entry: the commit point of the step

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

Closing a writer compacts: under the manifest lock, merge its stream's entries and methods into
``manifest.json`` (written atomically), then delete the entry files. A crash between the two
leaves duplicates that agree; the next writer of the stream compacts again.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rollout_mock.errors import ManifestError, UnsafePathError
from rollout_mock.storage.manifest import Manifest, StepEntry, StreamId
from rollout_mock.text import logger

__all__ = [
    "FINGERPRINT_NAME", "INDEX_DIR", "STREAMS_DIR", "decode_entry", "decode_stream_record",
    "encode_entry", "encode_stream_record", "entry_relpath", "index_dir", "merge_stream",
    "parse_step_relpath", "step_of_entry_name", "stream_record_name",
]

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
    """Fold a stream's record and entry files into ``manifest`` (entries win; None deletes)."""
    data = manifest.stream(stream, create=True)
    assert data is not None
    if methods:
        data["methods"].update(methods)
    steps = data["steps"]
    for step, raw in entries.items():
        if raw is None:
            steps.pop(str(step), None)
        elif raw is not INVALID:
            steps[str(step)] = raw


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

"""``manifest.json``: the self-describing index of a dump directory.

Listing a dump reads only this file; nothing is unpickled. Layout (format version 1)::

    {
      "format": "rollout_mock.dump",
      "format_version": 1,
      "created_at": "2026-11-21T01:02:03+00:00",
      "writer": {"rollout_mock": "0.1.0", "python": "3.11.7", "pickle_protocol": 5},
      "fingerprint": {...},                      # environment of the first writer
      "streams": {
        "train": {                               # "{split}", "{split}/{name}", "...@rank{r}"
          "split": "train", "name": null, "rank": null,
          "methods": {"get_batch": {"convention": "async", "step_arg": null}},
          "steps": {
            "0": {"file": "train/step_000000.pkl", "size": 123, "checksum": "crc32:0a1b2c3d",
                  "hmac": null, "samples": 128, "type": "verl.protocol.DataProto",
                  "keys": {"batch.input_ids": {"shape": [128, 512], "dtype": "int64"}},
                  "method": "get_batch", "written_at": "...", "rollout_seconds": 1.23}
          }
        }
      }
    }

Format 2 has the same layout; what changed is how it is kept up to date (see
:mod:`rollout_mock.storage.index`): a writer commits each step as one small entry file and folds
them into ``manifest.json``, and the ``hmac`` field is ``"hmac-sha256:<hex>"`` over the stream
key, the step and the bytes. A stream of more than ``INLINE_STEPS`` steps (and any
stream while its writer runs) has, instead of inline entries, ``"segments": [{"seq": 3, "steps":
[[0, 1023]]}]``: references to index segment files holding those steps' entries, read only when a
step is loaded; the manifest then says ``"requires": ["index-segments"]`` (a reader refuses a
feature it does not know). Format 1 still loads.

Updates are read-modify-write under the backend's manifest lock (a local ``flock``, an object-
store lease), and the new manifest replaces the old one atomically.
"""

from __future__ import annotations

import bisect
import json
import platform
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, overload

from rollout_mock.codec import PROTOCOL
from rollout_mock.errors import FormatVersionError, ManifestError, UnsafePathError
from rollout_mock.jsonio import loads_bounded
from rollout_mock.storage.paths import check_name, open_inside, parse_step_key, read_fd
from rollout_mock.text import short_repr
from rollout_mock.version import __version__

__all__ = [
    "CallRecord",
    "PackRecord",
    "FORMAT",
    "FEATURES",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MAX_PIN_CHARS",
    "MAX_PIN_REASONS",
    "Manifest",
    "StepEntry",
    "StepSet",
    "StreamId",
    "dumps_manifest",
    "format_ranges",
    "manifest_path",
    "parse_manifest",
    "parse_step_key",
    "pin_reason",
    "read_manifest",
    "utc_now",
    "valid_pin",
]

FORMAT = "rollout_mock.dump"
FORMAT_VERSION = 2  # 2: data-only step files (rollout_mock.codec), entry-file index, bound HMAC; 1 still read
#: Additions to a format version that a reader must understand, named in the manifest's
#: ``"requires"`` list only when used: a reader refuses a manifest requiring one it does not know.
#: ``index-segments``: streams reference index segment files (``"segments"``).
#: ``call-packs``: steps with several calls keep the further ones in packs (``{split}/.calls/``).
FEATURES = frozenset({"index-segments", "call-packs"})
#: Raw index entries a manifest keeps of the segments it read (about 3 KB each; the least recently
#: used segment goes first, the one just read always stays).
SEGMENT_CACHE_ENTRIES = 32_768
#: Bound on the steps the segment references of one manifest may name (a forged range cannot
#: make a reader allocate without limit).
MAX_RANGED_STEPS = 5_000_000
MANIFEST_NAME = "manifest.json"
_CHECKSUM = re.compile(r"crc32:[0-9a-f]{8}")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True, order=True)
class StreamId:
    """One sequence of steps: a split, optionally a scheduler name and a rank; where its files
    live is built here only, from these validated parts."""

    split: str
    name: str | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        check_name(self.split, "split")
        if self.name is not None:
            check_name(self.name, "scheduler name")
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0):
            raise UnsafePathError(f"[RolloutMock] invalid rank {self.rank!r}: expected an integer >= 0")

    @classmethod
    def from_key(cls, key: str) -> StreamId:
        """Inverse of :attr:`key` (``split[/name][@rankR]``); validated like any StreamId."""
        rest, _, rank = key.partition("@rank")
        split, _, name = rest.partition("/")
        digits = rank.isascii() and rank.isdigit() and len(rank) <= 9
        return cls(split, name or None, int(rank) if digits else None if not rank else -1)

    @property
    def key(self) -> str:
        key = self.split if self.name is None else f"{self.split}/{self.name}"
        return key if self.rank is None else f"{key}@rank{self.rank}"

    @property
    def directory(self) -> str:
        return self.split if self.name is None else f"{self.split}/{self.name}"

    @property
    def suffix(self) -> str:
        """What the rank adds to this stream's file names (``_rank3``; empty without a rank)."""
        return "" if self.rank is None else f"_rank{self.rank}"

    def file_name(self, step: int) -> str:
        return f"step_{step:06d}{self.suffix}.pkl"

    def relpath(self, step: int) -> str:
        return f"{self.directory}/{self.file_name(step)}"

    def __str__(self) -> str:
        return self.key


class StepSet(Sequence[int]):
    """Distinct steps in ascending order, held as runs ``[first, last]``: 5,000,000 contiguous
    steps cost two integers, membership and indexing are a bisection, never a scan. A sequence of
    ints (``len``, ``in``, indexing, iteration, ``==`` with a list); :meth:`add` and
    :meth:`discard` keep it up to date (appending the next step extends the last run)."""

    __slots__ = ("_firsts", "_lasts", "_ends")
    __hash__ = None  # type: ignore[assignment]  # mutable

    def __init__(self, runs: Iterable[tuple[int, int]] | Iterable[list[int]] = ()) -> None:
        self._firsts: list[int] = []
        self._lasts: list[int] = []
        self._ends: list[int] | None = None  # steps up to and including each run (for indexing)
        for first, last in sorted((int(a), int(b)) for a, b in runs):
            if self._lasts and first <= self._lasts[-1] + 1:
                self._lasts[-1] = max(self._lasts[-1], last)
            else:
                self._firsts.append(first)
                self._lasts.append(last)

    @classmethod
    def of(cls, steps: Iterable[int]) -> StepSet:
        result = cls()
        for step in sorted(steps):
            result.add(step)
        return result

    def runs(self) -> list[tuple[int, int]]:
        """The runs ``(first, last)``, ascending and disjoint."""
        return list(zip(self._firsts, self._lasts, strict=True))

    def copy(self) -> StepSet:
        twin = StepSet()
        twin._firsts, twin._lasts = list(self._firsts), list(self._lasts)
        return twin

    def _run_of(self, step: int) -> int:
        """The index of the run holding ``step``, or -1."""
        i = bisect.bisect_right(self._firsts, step) - 1
        return i if i >= 0 and step <= self._lasts[i] else -1

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self._run_of(step) >= 0

    def add(self, step: int) -> None:
        i = bisect.bisect_right(self._firsts, step) - 1
        if i >= 0 and step <= self._lasts[i]:
            return
        self._ends = None
        left = i >= 0 and self._lasts[i] + 1 == step
        right = i + 1 < len(self._firsts) and self._firsts[i + 1] - 1 == step
        if left and right:
            self._lasts[i] = self._lasts.pop(i + 1)
            del self._firsts[i + 1]
        elif left:
            self._lasts[i] = step
        elif right:
            self._firsts[i + 1] = step
        else:
            self._firsts.insert(i + 1, step)
            self._lasts.insert(i + 1, step)

    def discard(self, step: int) -> None:
        i = self._run_of(step)
        if i < 0:
            return
        self._ends = None
        first, last = self._firsts[i], self._lasts[i]
        if first == last:
            del self._firsts[i], self._lasts[i]
        elif step == first:
            self._firsts[i] = step + 1
        elif step == last:
            self._lasts[i] = step - 1
        else:
            self._lasts[i] = step - 1
            self._firsts.insert(i + 1, step + 1)
            self._lasts.insert(i + 1, last)

    def _cumulative(self) -> list[int]:
        if self._ends is None:
            total, ends = 0, []
            for first, last in zip(self._firsts, self._lasts, strict=True):
                total += last - first + 1
                ends.append(total)
            self._ends = ends
        return self._ends

    def __len__(self) -> int:
        ends = self._cumulative()
        return ends[-1] if ends else 0

    def __iter__(self) -> Iterator[int]:
        for first, last in zip(self._firsts, self._lasts, strict=True):
            yield from range(first, last + 1)

    def __reversed__(self) -> Iterator[int]:
        for first, last in zip(reversed(self._firsts), reversed(self._lasts), strict=True):
            yield from range(last, first - 1, -1)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("StepSet index out of range")
        ends = self._cumulative()
        i = bisect.bisect_right(ends, index)
        before = ends[i - 1] if i else 0
        return self._firsts[i] + index - before

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        i = self._run_of(value) if isinstance(value, int) else -1
        position = -1 if i < 0 else (self._cumulative()[i - 1] if i else 0) + value - self._firsts[i]
        if position < 0 or position < start or (stop is not None and position >= stop):
            raise ValueError(f"{value!r} is not in the steps")
        return position

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepSet):
            return self._firsts == other._firsts and self._lasts == other._lasts
        if isinstance(other, (list, tuple, range)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=False))
        return NotImplemented

    def __repr__(self) -> str:
        if len(self) <= 20:
            return repr(list(self))
        return "StepSet(" + ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in self.runs()[:20]) + (
            ", ..." if len(self._firsts) > 20 else "") + ")"


def format_ranges(steps: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``; ``"none"`` when empty (a :class:`StepSet` is
    formatted from its runs, never step by step)."""
    runs = steps.runs() if isinstance(steps, StepSet) else StepSet.of(steps).runs()
    if not runs:
        return "none"
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


@dataclass
class StepEntry:
    """Everything known about one recorded step without opening its file."""

    file: str
    size: int
    checksum: str
    samples: int | None
    type: str
    keys: dict[str, dict[str, Any]]
    written_at: str
    method: str | None = None
    hmac: str | None = None
    rollout_seconds: float | None = None
    call: dict[str, Any] | None = None
    """The call's plain arguments (``{"args": [...], "kwargs": {...}}``), checked in mock mode."""
    pin: list[str] | None = None
    """Why the step is kept beyond the ring (``keep``): at most :data:`MAX_PIN_REASONS` reasons of
    at most :data:`MAX_PIN_CHARS` printable characters each; ``None``: not pinned (left out of
    the JSON)."""
    compression: str | None = None
    """How the file's data chunks are compressed (``zstd``, ``lz4``; ``None``: raw, left out of
    the JSON). Informational: each chunk's header says how it is stored."""

    def to_json(self) -> dict[str, Any]:
        # a shallow copy per field (``asdict`` deep-copies ``keys``: 0.3 ms a step on a small batch)
        data = {name: getattr(self, name) for name in _ENTRY_FIELDS}
        if self.pin is None:
            del data["pin"]
        if self.compression is None:
            del data["compression"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], *, where: str, path: Path | str | None = None) -> StepEntry:
        try:
            if not isinstance(data, dict):
                raise TypeError(f"expected an object, got {type(data).__name__}")
            missing = [key for key in ("file", "size", "checksum") if key not in data]
            if missing:
                raise KeyError(f"missing {', '.join(missing)}")
            if isinstance(data["size"], bool) or not isinstance(data["size"], int) or data["size"] < 0:
                raise ValueError(f"size {data['size']!r} is not a byte count")
            keys = data.get("keys") or {}
            if not isinstance(keys, dict) or not all(isinstance(v, dict) for v in keys.values()):
                raise ValueError("keys is not an object of {dtype, shape} objects")
            if not _CHECKSUM.fullmatch(str(data["checksum"])):
                raise ValueError(f"checksum {data['checksum']!r} is not of the form crc32:xxxxxxxx")
            samples, seconds = data.get("samples"), data.get("rollout_seconds")
            if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int) or samples < 0):
                raise ValueError(f"samples {short_repr(samples)} is not a count")
            if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
                raise ValueError(f"rollout_seconds {short_repr(seconds)} is not a number")
            for name in ("method", "hmac"):
                if data.get(name) is not None and not isinstance(data[name], str):
                    raise ValueError(f"{name} {short_repr(data[name])} is not a string")
            compression = data.get("compression")
            if compression is not None and compression not in _COMPRESSIONS:
                raise ValueError(f"compression {short_repr(compression)} is not one of {', '.join(_COMPRESSIONS)}")
            pin = data.get("pin")
            if pin is not None and not valid_pin(pin):
                raise ValueError(f"pin {short_repr(pin)} is not a list of at most {MAX_PIN_REASONS} reasons "
                                 f"(printable strings of 1 to {MAX_PIN_CHARS} characters)")
            return cls(
                file=str(data["file"]),
                size=int(data["size"]),
                checksum=str(data["checksum"]),
                samples=samples,
                type=str(data.get("type", "?")),
                keys=dict(data.get("keys") or {}),
                written_at=str(data.get("written_at", "")),
                method=data.get("method"),
                hmac=data.get("hmac"),
                rollout_seconds=seconds,
                call=data.get("call") if isinstance(data.get("call"), dict) else None,
                pin=None if pin is None else list(pin),
                compression=compression,
            )
        except (KeyError, TypeError, ValueError) as exc:
            reason = exc.args[0] if exc.args else repr(exc)
            raise ManifestError(
                f"{where}: malformed step entry ({reason}): {short_repr(data, 300)}; the manifest was edited or "
                f"damaged — restore it from a copy, or re-dump",
                path=path,
            ) from None


_ENTRY_FIELDS = tuple(f.name for f in fields(StepEntry))
#: The values of a step entry's ``compression`` field (absent: raw).
_COMPRESSIONS = ("zstd", "lz4")
#: Bounds of a step entry's ``pin`` field (the index is read as hostile input).
MAX_PIN_REASONS = 8
MAX_PIN_CHARS = 200


def valid_pin(pin: Any) -> bool:
    """Whether ``pin`` is a valid ``StepEntry.pin``: a non-empty list of at most
    :data:`MAX_PIN_REASONS` printable strings of 1 to :data:`MAX_PIN_CHARS` characters."""
    return (isinstance(pin, list) and 0 < len(pin) <= MAX_PIN_REASONS
            and all(isinstance(r, str) and 0 < len(r) <= MAX_PIN_CHARS and r.isprintable() for r in pin))


def pin_reason(text: str) -> str:
    """``text`` made a valid pin reason: control characters and line breaks as spaces, cut to
    :data:`MAX_PIN_CHARS` characters (``"?"`` when nothing is left)."""
    clean = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return (clean[: MAX_PIN_CHARS - 1] + "…" if len(clean) > MAX_PIN_CHARS else clean) or "?"


@dataclass
class Manifest:
    """In-memory form of ``manifest.json``. ``streams[key]["steps"][str(step)]`` are entries."""

    created_at: str = field(default_factory=utc_now)
    writer: dict[str, Any] = field(
        default_factory=lambda: {
            "rollout_mock": __version__,
            "python": platform.python_version(),
            "pickle_protocol": PROTOCOL,
        }
    )
    fingerprint: dict[str, Any] | None = None
    streams: dict[str, dict[str, Any]] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    """The on-disk format version it was read with (a writer adding steps sets
    :data:`FORMAT_VERSION`; a selection keeps its source's)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Top-level fields this version does not know (rollout settings, a newer writer's), kept as
    recorded and written back."""
    source: str | None = field(default=None, compare=False)
    """Where it was read from (named in the errors of entries validated on use)."""
    segment_reader: Callable[[StreamId, int], dict[str, Any]] | None = field(default=None, compare=False,
                                                                            repr=False)
    """Reads a referenced index segment (set by the store that opened the manifest)."""
    _segments: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict, compare=False, repr=False)
    _indexes: dict[str, _StreamSteps] = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------ access
    def stream(self, stream: StreamId, *, create: bool = False) -> dict[str, Any] | None:
        data = self.streams.get(stream.key)
        if data is None and create:
            data = {
                "split": stream.split,
                "name": stream.name,
                "rank": stream.rank,
                "methods": {},
                "steps": {},
            }
            self.streams[stream.key] = data
        return data

    def _index(self, stream: StreamId) -> _StreamSteps | None:
        data = self.streams.get(stream.key)
        if not data:
            return None
        index = self._indexes.get(stream.key)
        if index is None:
            index = self._indexes[stream.key] = _StreamSteps(data, self.source)
        return index

    def changed(self, stream: StreamId) -> None:
        """Forget what was derived from a stream's data (call after changing it in place)."""
        self._indexes.pop(stream.key, None)

    def steps(self, stream: StreamId) -> StepSet:
        """The stream's steps (a :class:`StepSet`: ranges stay ranges, whatever their length)."""
        index = self._index(stream)
        return StepSet() if index is None else index.steps

    def raw_entry(self, stream: StreamId, step: int) -> Any:
        """The unvalidated entry of a step (inline, else from the segment referencing it), or None."""
        index = self._index(stream)
        if index is None:
            return None
        raw = index.inline.get(str(step))
        if raw is not None:
            return raw
        seq = index.segment_of(step)
        return None if seq is None else self._segment(stream, seq).get(str(step), _MISSING)

    def _segment(self, stream: StreamId, seq: int) -> dict[str, Any]:
        """A referenced segment's raw entries, through a least-recently-used cache bounded by the
        entries it holds (:data:`SEGMENT_CACHE_ENTRIES`), not by a count of segments: a stream whose
        runs interleave across many segments reads each once when walked in step order."""
        key = (stream.key, seq)
        cached = self._segments.pop(key, None)
        if cached is None:
            if self.segment_reader is None:
                raise ManifestError(f"{self.source}: {stream.key} references index segment {seq}, but this "
                                    f"manifest was read without its dump", path=self.source)
            cached = self.segment_reader(stream, seq)
            held = sum(map(len, self._segments.values())) + len(cached)
            while self._segments and held > SEGMENT_CACHE_ENTRIES:
                held -= len(self._segments.pop(next(iter(self._segments))))
        self._segments[key] = cached  # the most recently used last
        return cached

    def entry(self, stream: StreamId, step: int) -> StepEntry | None:
        raw = self.raw_entry(stream, step)
        if raw is None:
            return None
        where = f"{stream.key} step {step}" if self.source is None else f"{self.source}: {stream.key} step {step}"
        if raw is _MISSING:
            raise ManifestError(f"{where}: the index segment that should hold this step does not; the index was "
                                f"edited or damaged — restore it from a copy, or re-dump", path=self.source)
        parsed = StepEntry.from_json(raw, where=where, path=self.source)
        expected = stream.relpath(step)
        if parsed.file != expected:
            raise ManifestError(
                f"{where}: entry names file {parsed.file!r}, expected {expected!r}; the manifest was "
                f"edited by hand — restore it from a copy, or re-dump",
                path=self.source,
            )
        return parsed

    def methods(self, stream: StreamId) -> dict[str, dict[str, Any]]:
        data = self.streams.get(stream.key)
        return dict(data.get("methods") or {}) if data else {}

    def stream_ids(self) -> list[StreamId]:
        return sorted(
            (StreamId(d["split"], d.get("name"), d.get("rank")) for d in self.streams.values()),
            key=lambda s: (s.split, s.name or "", -1 if s.rank is None else s.rank),
        )

    # ------------------------------------------------------------------ (de)serialisation
    def required(self) -> list[str]:
        """The format features this manifest uses (its ``"requires"``)."""
        required = []
        if any(d.get("segments") for d in self.streams.values()):
            required.append("index-segments")
        if any(d.get("calls") for d in self.streams.values()):
            required.append("call-packs")
        return required

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            **({"requires": required} if (required := self.required()) else {}),
            "created_at": self.created_at,
            "writer": self.writer,
            "fingerprint": self.fingerprint,
            **self.extra,
            "streams": self.streams,
        }

    def select(self, chosen: Mapping[StreamId, Sequence[int]], *, source: str | None = None) -> Manifest:
        """A manifest of only the ``chosen`` steps of each stream (a slice of the dump): its own
        fields, each stream's fields and the steps' entries as recorded (validated first), every
        entry inline (no segment references)."""
        streams: dict[str, dict[str, Any]] = {}
        for stream, wanted in chosen.items():
            data = {k: v for k, v in (self.stream(stream) or {}).items() if k not in ("steps", "segments")}
            data["methods"] = self.methods(stream)
            steps = data["steps"] = {}
            for step in wanted:
                self.entry(stream, step)  # validated (file name, fields) before it is copied
                steps[str(step)] = self.raw_entry(stream, step)
            streams[stream.key] = data
        return Manifest(created_at=self.created_at, writer=self.writer, fingerprint=self.fingerprint,
                        streams=streams, format_version=self.format_version, extra=dict(self.extra),
                        source=source)

    @classmethod
    def from_json(cls, data: Any, *, path: Path | str) -> Manifest:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ManifestError(
                f"{path}: not a rollout_mock manifest (expected \"format\": \"{FORMAT}\")",
                path=path,
            )
        writer = data.get("writer")
        written_by = short_repr(writer.get("rollout_mock", "unknown") if isinstance(writer, dict) else "unknown")
        version = data.get("format_version")
        if not isinstance(version, int):
            raise ManifestError(f"{path}: format_version is missing or not an integer", path=path)
        if version < 1:
            raise FormatVersionError(f"{path}: unknown on-disk format version {version}", path=path)
        if version > FORMAT_VERSION:
            raise FormatVersionError(
                f"{path}: written by on-disk format version {version}, but this rollout_mock "
                f"({__version__}) reads versions up to {FORMAT_VERSION}; upgrade rollout_mock "
                f"(the writer was {written_by})",
                path=path,
            )
        requires = data.get("requires", [])
        if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
            raise ManifestError(f"{path}: \"requires\" is not a list of feature names", path=path)
        unknown = sorted(set(requires) - FEATURES)
        if unknown:
            raise FormatVersionError(
                f"{path}: needs on-disk format features {unknown} that this rollout_mock ({__version__}) does not "
                f"know; upgrade rollout_mock (the writer was {written_by})",
                path=path,
            )
        streams = data.get("streams")
        if not isinstance(streams, dict):
            raise ManifestError(f"{path}: \"streams\" is missing or not an object", path=path)
        for part in ("writer", "fingerprint"):
            if not isinstance(data.get(part) or {}, dict):
                raise ManifestError(f"{path}: \"{part}\" is not an object; the manifest was edited or damaged "
                                    f"— restore it from a copy, or re-dump", path=path)
        ranged = 0
        for key, stream in streams.items():
            if not isinstance(stream, dict) or not isinstance(stream.get("steps"), dict):
                raise ManifestError(f"{path}: stream {key!r} has no \"steps\" object", path=path)
            if not isinstance(stream.get("split"), str):
                raise ManifestError(f"{path}: stream {key!r} has no \"split\"", path=path)
            methods = stream.get("methods") or {}
            if not isinstance(methods, dict) or not all(isinstance(m, dict) for m in methods.values()):
                raise ManifestError(f"{path}: stream {key!r} has a \"methods\" value that is not an object of "
                                    f"objects", path=path)
            stream["methods"] = methods  # null -> {}
            name, rank = stream.get("name"), stream.get("rank")
            if not (name is None or isinstance(name, str)) or not (
                rank is None or (isinstance(rank, int) and not isinstance(rank, bool))
            ):
                raise ManifestError(f"{path}: stream {key!r} has a bad \"name\" or \"rank\"", path=path)
            try:
                stream_id = StreamId(stream["split"], name, rank)
            except UnsafePathError as exc:
                raise ManifestError(f"{path}: stream {key!r}: {exc}", path=path) from None
            if stream_id.key != key:
                raise ManifestError(
                    f"{path}: stream {key!r} describes itself as {stream_id.key!r}; the manifest was "
                    f"edited by hand — restore it from a copy, or re-dump",
                    path=path,
                )
            # Entries themselves are validated when used (Manifest.entry): opening a dump of
            # 100,000 steps must not parse 100,000 entries it will not load.
            for step_key in stream["steps"]:
                parse_step_key(step_key, f"{path}: stream {key!r}")
            ranged += _check_segments(stream, f"{path}: stream {key!r}", path)
            if ranged > MAX_RANGED_STEPS:
                raise ManifestError(f"{path}: the segment references name more than {MAX_RANGED_STEPS:,} steps; the "
                                    f"manifest was forged or damaged — restore it from a copy", path=path)
        return cls(
            created_at=str(data.get("created_at", "")),
            writer=dict(data.get("writer") or {}),
            fingerprint=data.get("fingerprint"),
            streams=streams,
            format_version=version,
            extra={k: v for k, v in data.items() if k not in _TOP_FIELDS},
            source=str(path),
        )


_MISSING = object()
#: The top-level fields of a manifest this version knows (the rest is :attr:`Manifest.extra`).
_TOP_FIELDS = frozenset({"format", "format_version", "requires", "created_at", "writer", "fingerprint", "streams"})


class _StreamSteps:
    """What a stream's manifest data says about its steps, derived once: the inline entries,
    the segment runs sorted for bisection, and the union as a :class:`StepSet`."""

    def __init__(self, data: dict[str, Any], source: str | None) -> None:
        self.inline: dict[str, Any] = data["steps"]
        runs = sorted((int(first), int(last), int(ref["seq"])) for ref in data.get("segments") or ()
                      for first, last in ref["steps"])
        self.firsts = [run[0] for run in runs]
        self.lasts = [run[1] for run in runs]
        self.seqs = [run[2] for run in runs]
        inline = StepSet.of(parse_step_key(key, source) for key in self.inline)
        self.steps = StepSet([*inline.runs(), *zip(self.firsts, self.lasts, strict=True)]) if runs else inline

    def segment_of(self, step: int) -> int | None:
        """The sequence number of the segment whose runs hold ``step`` (runs never overlap)."""
        i = bisect.bisect_right(self.firsts, step) - 1
        return self.seqs[i] if i >= 0 and step <= self.lasts[i] else None


def _check_segments(stream: dict[str, Any], where: str, path: Path | str) -> int:
    """Validate a stream's segment references (``[{"seq": n, "steps": [[first, last], ...]}]``,
    ascending sequence numbers, ordered runs of valid steps, no step in two references); the
    steps they name."""
    refs = stream.get("segments")
    if refs is None:
        return 0
    total, last_seq = 0, -1
    bad = ManifestError(f"{where}: malformed \"segments\" (expected [{{\"seq\": n, \"steps\": [[first, last], "
                        f"...]}}, ...], no step named twice); the manifest was edited or damaged — restore it from a "
                        f"copy", path=path)
    if not isinstance(refs, list):
        raise bad
    runs: list[tuple[int, int]] = []
    for ref in refs:
        if not isinstance(ref, dict) or not isinstance(ref.get("steps"), list):
            raise bad
        seq = ref.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or not last_seq < seq < 10**9:
            raise bad
        last_seq, previous = seq, None
        for run in ref["steps"]:
            if (not isinstance(run, list) or len(run) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) and abs(x) < 10**18 for x in run)
                    or run[0] > run[1] or (previous is not None and run[0] <= previous)):
                raise bad
            previous = run[1]
            total += run[1] - run[0] + 1
            if total > MAX_RANGED_STEPS:
                return total
            runs.append((run[0], run[1]))
    runs.sort()
    if any(runs[i][1] >= runs[i + 1][0] for i in range(len(runs) - 1)):
        raise bad
    return total


def manifest_path(dump_dir: Path) -> Path:
    return Path(dump_dir) / MANIFEST_NAME


def read_manifest(dump_dir: Path) -> Manifest | None:
    """The manifest file of ``dump_dir``, or ``None`` when there is none yet (the file alone:
    uncompacted entries are merged by the store, see :mod:`rollout_mock.storage.index`).

    A manifest that exists but cannot be parsed raises :class:`ManifestError` naming the file.
    """
    path = manifest_path(dump_dir)
    try:  # no symlink, FIFO or device is ever opened (see storage.paths.open_inside)
        data = read_fd(open_inside(dump_dir, MANIFEST_NAME))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return parse_manifest(data, path)


def parse_manifest(data: bytes, path: Path | str) -> Manifest:
    """Parse the bytes of a manifest file; :class:`ManifestError` naming ``path`` if bad (through
    the bounded reader: no nesting, number or size bomb gets past it)."""
    parsed = loads_bounded(data, where=path, what="manifest",
                           fix="it was edited or truncated — restore it from a copy, or re-dump")
    return Manifest.from_json(parsed, path=path)


def dumps_manifest(manifest: Manifest) -> str:
    """The manifest as compact JSON (no indent: the C encoder, ~10x faster at 100,000 steps;
    ``rollout-mock ls --json`` pretty-prints it)."""
    return json.dumps(manifest.to_json(), separators=(",", ":"), sort_keys=False, allow_nan=False)


# --------------------------------------------------------------------------- extra calls
#: Bounds of a pack record (the index is read as hostile input).
MAX_PACK_CALLS = 1 << 20
MAX_PROVENANCE_CHARS = 4096


@dataclass(frozen=True)
class CallRecord:
    """One extra call of a step (the step's first recorded call is its step file): where its batch
    lies inside a pack (``offset``, ``size``, ``checksum`` of those bytes), what was called, and the
    request digest matched in mock mode (``None``: recorded without matching)."""

    step: int
    call: int
    method: str | None
    offset: int
    size: int
    checksum: str
    digest: int | None = None
    seconds: float | None = None
    samples: int | None = None
    item: int | None = None
    """Small calls are written together: their bytes (``offset``, ``size``) encode a list of
    their batches and this is the call's place in it; ``None``: the bytes are the batch itself."""
    task: int | None = None
    """The asyncio task that made the call, numbered from its ``at_step`` block (equal requests
    are matched within the same task first); ``None``: not known."""
    provenance: dict[str, Any] | None = None

    def to_json(self) -> list[Any]:
        row: list[Any] = [self.step, self.call, self.method, self.offset, self.size, self.checksum, self.digest,
                          self.seconds, self.samples, self.item, self.task]
        if self.provenance is not None:
            row.append(self.provenance)
        return row


def _count(value: Any, what: str, *, signed: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (value < 0 and not signed) or abs(value) >= 1 << 63:
        raise ValueError(f"{what} {short_repr(value)} is not a count")
    return value


@dataclass(frozen=True)
class PackRecord:
    """A pack of extra calls (``{split}/.calls/pack_000003.json``): one data file holding the
    batches of calls beyond each step's first, one after the other, each a complete step
    encoding; ``meta`` locates the calls' summaries and request nodes (``[offset, size,
    checksum]``). ``drop``: steps whose calls in earlier packs this pack supersedes (a step
    recorded again with ``overwrite``)."""

    seq: int
    file: str
    size: int
    checksum: str
    calls: tuple[CallRecord, ...]
    meta: tuple[int, int, str] | None = None
    hmac: str | None = None
    drop: tuple[int, ...] = ()
    written_at: str = ""

    def to_json(self, stream_key: str) -> dict[str, Any]:
        data: dict[str, Any] = {"format": PACK_FORMAT, "stream": stream_key, "seq": self.seq, "file": self.file,
                                "size": self.size, "checksum": self.checksum, "hmac": self.hmac,
                                "meta": None if self.meta is None else list(self.meta),
                                "calls": [c.to_json() for c in self.calls], "written_at": self.written_at}
        if self.drop:
            data["drop"] = list(self.drop)
        return data

    @classmethod
    def from_json(cls, data: Any, *, stream_key: str, seq: int, file: str, where: str) -> PackRecord:
        """A validated pack record; :class:`ManifestError` naming ``where`` for anything else."""
        try:
            if not isinstance(data, dict) or data.get("format") != PACK_FORMAT:
                raise ValueError("not a pack record")
            if data.get("stream") != stream_key or data.get("seq") != seq or data.get("file") != file:
                raise ValueError("it names another stream, sequence number or file")
            size = _count(data.get("size"), "size")
            checksum = str(data.get("checksum"))
            if not _CHECKSUM.fullmatch(checksum):
                raise ValueError(f"checksum {short_repr(checksum)} is not of the form crc32:xxxxxxxx")
            mac = data.get("hmac")
            if mac is not None and not isinstance(mac, str):
                raise ValueError("hmac is not a string")
            raw_calls = data.get("calls")
            if not isinstance(raw_calls, list) or len(raw_calls) > MAX_PACK_CALLS:
                raise ValueError("calls is not a list of call rows")
            calls = tuple(_call_row(row, size) for row in raw_calls)
            meta = data.get("meta")
            parsed_meta = None
            if meta is not None:
                if not (isinstance(meta, list) and len(meta) == 3):
                    raise ValueError("meta is not [offset, size, checksum]")
                start, length = _count(meta[0], "meta offset"), _count(meta[1], "meta size")
                if start + length > size or not _CHECKSUM.fullmatch(str(meta[2])):
                    raise ValueError("meta lies outside the pack or has no crc32 checksum")
                parsed_meta = (start, length, str(meta[2]))
            drop = data.get("drop", [])
            if not isinstance(drop, list) or len(drop) > MAX_PACK_CALLS:
                raise ValueError("drop is not a list of steps")
            written = data.get("written_at", "")
            return cls(seq, file, size, checksum, calls, parsed_meta, mac,
                       tuple(_count(s, "dropped step") for s in drop), str(written)[:64])
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{where}: malformed pack of extra calls ({exc}); restore the dump from a copy, or "
                                f"re-dump", path=where) from None


PACK_FORMAT = "rollout_mock.calls"


def _call_row(row: Any, pack_size: int) -> CallRecord:
    if not isinstance(row, list) or len(row) not in (11, 12):
        raise ValueError(f"call row {short_repr(row)} is not [step, call, method, offset, size, checksum, "
                         f"digest, seconds, samples, item, task(, provenance)]")
    step, call = _count(row[0], "step"), _count(row[1], "call index")
    method = row[2]
    if method is not None and (not isinstance(method, str) or len(method) > 200):
        raise ValueError(f"method {short_repr(method)} is not a name")
    offset, size = _count(row[3], "offset"), _count(row[4], "size")
    if offset + size > pack_size:
        raise ValueError(f"call {call} of step {step} lies outside the pack")
    checksum = str(row[5])
    if not _CHECKSUM.fullmatch(checksum):
        raise ValueError(f"checksum {short_repr(checksum)} of call {call} of step {step} is not crc32:xxxxxxxx")
    digest = row[6]
    if digest is not None and not 0 <= _count(digest, "request digest") < 1 << 32:
        raise ValueError(f"request digest {digest} of call {call} of step {step} is not a 32-bit CRC")
    seconds = row[7]
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
        raise ValueError(f"seconds {short_repr(seconds)} is not a number")
    samples = None if row[8] is None else _count(row[8], "samples")
    item = None if row[9] is None else _count(row[9], "item")
    if item is not None and item >= MAX_PACK_CALLS:
        raise ValueError(f"item {item} of call {call} of step {step} is beyond any pack")
    task = None if row[10] is None else _count(row[10], "task", signed=True)
    provenance = row[11] if len(row) == 12 else None
    if provenance is not None and (not isinstance(provenance, dict)
                                   or len(json.dumps(provenance, default=str)) > MAX_PROVENANCE_CHARS):
        raise ValueError(f"provenance of call {call} of step {step} is not a small object")
    return CallRecord(step, call, method, offset, size, checksum, digest, seconds, samples, item, task, provenance)

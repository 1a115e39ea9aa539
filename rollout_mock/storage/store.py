"""The one store: a dump kept as objects of a byte backend (:mod:`rollout_mock.storage.backend`).

The store owns everything above the bytes, whatever the backend: file names and the index of
:mod:`rollout_mock.storage.index` (entry files, segments, a compacted manifest), writer claims,
overwrite protection, retention deletes, the codec, the CRC-32 and the bound HMAC of every step
(:mod:`rollout_mock.storage.digest`), and verified loads. A backend only stores and returns bytes.

:func:`open_store` picks the backend for a ``dump_dir`` (a local path: :class:`LocalBackend`; an
fsspec URL: :class:`FsspecBackend`; a ``.rmb`` bundle: the read-only :class:`BundleBackend`);
:func:`DirectoryStore`, :func:`FsspecStore` and :func:`MemoryStore` build the store over one
backend each.
"""

from __future__ import annotations

import dataclasses
import errno
import hmac as hmac_lib
import json
import os
import re
import shlex
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rollout_mock.codec as codec
from rollout_mock.batch import count_samples, describe_keys, rejected_count, type_name
from rollout_mock.codec import ByteSource, BytesSource, ReadAheadSource
from rollout_mock.crc import crc32
from rollout_mock.errors import (
    ConfigError,
    CorruptStepError,
    DiskFullError,
    DumpNotFoundError,
    DumpNotWritableError,
    MissingExtraError,
    RolloutMockError,
    StepExistsError,
    StepNotFoundError,
    dump_path_is_a_file,
)
from rollout_mock.storage.backend import BackendDefaults, ByteBackend, MemoryBackend, with_defaults
from rollout_mock.storage.bundle import (
    Bundle,
    BundleBackend,
    BundleInfo,
    DumpSlice,
    is_bundle,
    open_bundle,
    pack_store,
    pull_store,
    slice_store,
    unpack_bundle,
)
from rollout_mock.storage.digest import Digest, HashingWriter, mac_context
from rollout_mock.storage.directory import AppendFile, LocalBackend, disk_full_error, free_bytes
from rollout_mock.storage.index import (
    HEALTH_DIR,
    HEALTH_SEGMENT,
    INVALID,
    STREAMS_DIR,
    StreamIndex,
    calls_dir,
    decode_entry,
    encode_entry,
    entry_relpath,
    health_relpath,
    index_dir,
    manifest_lock,
    merge_stream,
    pack_relpath,
    read_entries,
    read_fingerprint,
    read_manifest_file,
    read_packs,
    read_stream_records,
    record_fingerprint,
)
from rollout_mock.storage.manifest import (
    MANIFEST_NAME,
    MAX_PIN_REASONS,
    CallRecord,
    Manifest,
    PackRecord,
    StepEntry,
    StepSet,
    StreamId,
    format_ranges,
    pin_reason,
    utc_now,
)
from rollout_mock.storage.paths import NAME_PATTERN, is_url, list_inside, open_inside, read_fd_range
from rollout_mock.storage.verified import corrupt_error, load_bytes_verified, load_source_verified, load_verified
from rollout_mock.text import jsonable, logger


def _health_lines(data: bytes | None) -> dict[int, bytes]:
    """``step -> line`` of a health side file (lines that do not parse are dropped)."""
    out: dict[int, bytes] = {}
    for line in (data or b"").splitlines():
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(step, int) and not isinstance(step, bool):
            out[step] = line
    return out


#: The side folders of a dump, beside its streams (named here only): the dump run's training
#: metrics (``expected/metrics.jsonl``, ``metrics_rank{R}.jsonl``), and check mode's verdicts
#: (``checks/{split}[/{name}]/step_NNNNNN[_rankR].json``).
EXPECTED_DIR = "expected"
CHECKS_DIR = "checks"
#: The file of the dump run's metrics that replays and ``verify`` read.
EXPECTED_FILE = "metrics.jsonl"


def expected_relpath(rank: int | None = None) -> str:
    """The dump-relative file of the dump run's metrics (of ``rank``, other than the writing one)."""
    return f"{EXPECTED_DIR}/{EXPECTED_FILE if rank is None else f'metrics_rank{rank}.jsonl'}"


def expected_path(dump_dir: str | os.PathLike[str], rank: int | None = None) -> Path:
    """:func:`expected_relpath` under a local ``dump_dir``."""
    return Path(dump_dir) / expected_relpath(rank)


def verdict_relpath(stream: StreamId, step: int) -> str:
    """Where check mode's verdict of ``step`` of ``stream`` lives, relative to the dump."""
    return f"{CHECKS_DIR}/{stream.relpath(step).removesuffix('.pkl')}.json"


__all__ = ["CHECKS_DIR", "EXPECTED_DIR", "EXPECTED_FILE", "BatchInfo", "DirectoryStore", "FsspecStore",
           "MemoryStore", "StepStore", "Store", "StoreSettings", "expected_path", "expected_relpath", "open_store",
           "verdict_relpath"]


#: Objects up to this size are loaded with one GET; larger ones with ranged GETs into the tensors.
WHOLE_READ_BYTES = 16 << 20
#: A pack's HMAC is bound to ``(stream, _PACK_MAC_BASE + seq)``: never a step's context.
_PACK_MAC_BASE = -(1 << 40)
_PACK_NAME = re.compile(r"pack_([0-9]{6,9})(?:_rank[0-9]{1,9})?\.(?:pkl|json)", re.ASCII)


class _MemberSink:
    """Passes one pack member's bytes on to the pack's sink, counting them and taking their CRC."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.size = 0
        self.crc = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.crc = crc32(view, self.crc)
        self.sink.write(view)
        self.size += view.nbytes
        return view.nbytes


@dataclass(frozen=True)
class BatchInfo:
    """What the manifest says about a batch, computed from the live object before it is written."""

    type: str
    samples: int | None
    keys: dict[str, dict[str, Any]]
    rejected: int = 0

    @classmethod
    def of(cls, batch: Any) -> BatchInfo:
        return cls(type_name(batch), count_samples(batch), describe_keys(batch), rejected_count(batch))


def exists_error(stream: StreamId, step: int, where: str) -> StepExistsError:
    return StepExistsError(
        f"[RolloutMock] refusing to overwrite step {step} of {stream} (mode=dump): {where} already "
        f"exists. Either set `overwrite: true` in the rollout_mock config (e.g. when resuming a "
        f"dump run from a checkpoint), or point dump_dir at a new directory.",
        mode="dump", split=stream.split, step=step, path=where,
    )


def missing_step_error(store: Store, stream: StreamId, step: int, *, mode: str) -> StepNotFoundError:
    """The error for a step a store does not hold: where it looked, what is recorded, why."""
    location = store.describe_location(stream, step)
    return StepNotFoundError(
        f"[RolloutMock] Mock file not found: {location}\n"
        f"Recorded steps for {stream}: {format_ranges(store.steps(stream))}\n"
        f"Possible reasons:\n"
        f"  1. step {step} was not run in dump mode (or dump_steps excluded it)\n"
        f"  2. dump_dir is incorrect\n"
        f"  3. mode mismatch (current: {stream.split}): train and val are recorded separately"
        + ("" if stream.name is None else f", and this scheduler is named {stream.name!r}"),
        mode=mode, split=stream.split, step=step, path=location,
    )


#: errno -> (why a local dump cannot be written, the fix)
_NOT_WRITABLE = {
    errno.EROFS: ("it is on a read-only file system", "point dump_dir at a directory on a writable file system"),
    errno.EACCES: ("permission denied", "point dump_dir at a directory this user may write, or fix its permissions"),
    errno.EPERM: ("the operation is not permitted there", "point dump_dir at a directory this user may write"),
    errno.ENOENT: ("it cannot be created there", "point dump_dir at a directory that can be created"),
    errno.ENOTDIR: ("a part of its path is a file, not a directory", "fix dump_dir"),
}


class Store:
    """A dump over ``backend`` (see the module docstring).

    ``hmac_key`` signs steps on save and is required to match on every load; ``verify=False``
    skips checksum verification on load (sizes, and a configured HMAC, are still checked).
    ``backend`` is anything with the five required members of
    :class:`~rollout_mock.storage.backend.ByteBackend`; the optional ones it lacks are filled in
    (``store.backend`` is then a view of it with those defaults).
    """

    def __init__(self, backend: ByteBackend | BackendDefaults, *, hmac_key: bytes | None = None,
                 verify: bool = True) -> None:
        self.backend: BackendDefaults = with_defaults(backend)
        self.hmac_key = hmac_key
        self.verify = verify
        #: where the dump lives: a local path, or the URL of an object-store prefix
        self.dump_dir: Path | str = self.backend.local_path("") or self.backend.where("")
        self._owned: dict[str, StreamIndex] = {}  # the streams this object writes
        self._manifest_sig: Any = None
        self._manifest_file_cache: Manifest | None = None
        self._view_cache: Manifest | None = None
        self._packs: dict[str, tuple[tuple[str, ...], list[PackRecord]]] = {}
        self._pack_cache: list[tuple[tuple[str, int, str], bytes]] = []
        self._group_cache: dict[tuple[str, int, str, int], tuple[list[Any], set[int]]] = {}
        self._health: dict[str, tuple[str, dict[int, bytes]]] = {}  # stream key -> (segment rel, lines)
        self._health_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Store({self.backend!r})"

    # ------------------------------------------------------------------ step health (side files)
    def append_health(self, stream: StreamId, step: int, record: dict[str, Any]) -> None:
        """Add ``step``'s health line (:func:`rollout_mock.codec.scan.health_summary`) to its
        segment side file, ``{split}[/{name}]/.health/segment_NNNNNN[_rankR].jsonl`` (100 steps a
        segment, rewritten whole and atomically: a crash keeps the previous version). A step
        written again replaces its line. Lines survive the step's batch (``keep:`` deletes only
        step files)."""
        segment = health_relpath(stream, step // HEALTH_SEGMENT)
        # strict JSON: a non-finite minimum (a long double beyond float64) is written as "Infinity"
        line = json.dumps(jsonable({"step": step, **record}), separators=(",", ":"), allow_nan=False).encode("utf-8")
        with self._health_lock:
            held = self._health.get(stream.key)
            if held is None or held[0] != segment:
                held = (segment, _health_lines(self.backend.read(segment)))
                self._health[stream.key] = held
            held[1][step] = line
            self.backend.replace(segment, b"".join(held[1][s] + b"\n" for s in sorted(held[1])))

    def health(self, stream: StreamId) -> list[dict[str, Any]]:
        """Every health line of ``stream``, by step (damaged lines are skipped; no side file: [])."""
        directory = f"{stream.directory}/{HEALTH_DIR}"
        names = [n for n in self.backend.listdir(directory)
                 if n.startswith("segment_") and n.endswith(f"{stream.suffix}.jsonl")
                 and (stream.rank is not None or "_rank" not in n)]
        out: dict[int, dict[str, Any]] = {}
        for name in sorted(names)[:100_000]:
            for step, line in _health_lines(self.backend.read(f"{directory}/{name}", 0, 64 << 20)).items():
                record = json.loads(line)
                if isinstance(record, dict):
                    out[step] = record
        return [out[s] for s in sorted(out)]

    # ------------------------------------------------------------------ check mode's verdicts
    def write_verdict(self, stream: StreamId, step: int, record: dict[str, Any]) -> str:
        """Write check mode's verdict of ``step`` of ``stream`` (a JSON object), whole and
        atomically, replacing an earlier check's (:func:`verdict_relpath`); returns its location.
        ``OSError`` as the backend raises it (the caller names the mode and the fix)."""
        rel = verdict_relpath(stream, step)
        self.backend.replace(rel, json.dumps(record, allow_nan=False).encode("utf-8"))
        return self.where(rel)

    def verdict_files(self, limit: int) -> list[str]:
        """The dump-relative verdict files (``checks/.../step_*.json``, three folders deep at most),
        sorted, at most ``limit`` of them; none without a ``checks`` folder."""
        out: list[str] = []

        def walk(rel: str, depth: int) -> None:
            for name in sorted(self.backend.listdir(rel)):
                if len(out) >= limit:
                    return
                child = f"{rel}/{name}"
                if name.startswith("step_") and name.endswith(".json"):
                    out.append(child)
                elif depth < 3 and not name.startswith("."):
                    walk(child, depth + 1)

        walk(CHECKS_DIR, 0)
        return out

    def read_side(self, rel: str, limit: int) -> bytes | None:
        """A side file of the dump (a name :meth:`verdict_files` or :meth:`expected_names`
        gave) read whole, at most ``limit + 1`` bytes (longer: the caller's "too large");
        ``None`` when absent. A FIFO or a link out of the dump is
        :class:`~rollout_mock.errors.UnsafePathError`."""
        return self.backend.read(rel, 0, limit + 1)

    @property
    def bundled(self) -> bool:
        """Whether the dump is a bundle (a ``.rmb`` file, read in place: read-only)."""
        return isinstance(self.backend, BundleBackend)

    # ------------------------------------------------------------------ the dump run's metrics
    def local_path(self, rel: str = "") -> Path | None:
        """The local path of ``rel`` (``""``: the dump's folder), or ``None`` for a dump that has
        no local files (an object store, a bundle)."""
        return self.backend.local_path(rel)

    def expected_file(self, rank: int | None = None) -> Path | None:
        """The local file of the dump run's metrics of ``rank`` when there is one (``None``
        otherwise, and for a dump without local files). Found as :meth:`read_expected` opens it:
        a link on the way, a FIFO or a device is :class:`~rollout_mock.errors.UnsafePathError`."""
        root = self.backend.local_path("")
        if root is None:
            return None
        rel = expected_relpath(rank)
        try:
            os.close(open_inside(root, rel))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return root / rel

    def expected_names(self) -> list[str]:
        """The dump-relative files of the dump run's metrics (``expected/*.jsonl``, safe names
        only), sorted. In a local dump the folder is listed as :meth:`read_expected` opens its
        files: a link on the way is :class:`~rollout_mock.errors.UnsafePathError`."""
        root = self.backend.local_path("")
        names = self.backend.listdir(EXPECTED_DIR) if root is None else list_inside(root, EXPECTED_DIR)
        return [f"{EXPECTED_DIR}/{name}" for name in sorted(names)
                if name.endswith(".jsonl") and NAME_PATTERN.fullmatch(name)]

    def read_expected(self, rank: int | None = None, *, rel: str | None = None, start: int = 0,
                      end: int | None = None) -> bytes | None:
        """Bytes ``[start:end)`` of the dump run's metrics of ``rank`` (or of ``rel``, one of
        :meth:`expected_names`), ``None`` when absent. In a local dump nothing is followed
        through a link and no FIFO is opened (:func:`~rollout_mock.storage.paths.open_inside`:
        :class:`~rollout_mock.errors.UnsafePathError`)."""
        rel = expected_relpath(rank) if rel is None else rel
        if not rel.startswith(f"{EXPECTED_DIR}/"):
            raise ValueError(f"{rel!r} is not a file of the dump run's metrics")
        root = self.backend.local_path("")
        if root is None:
            return self.backend.read(rel, start, end)
        try:
            fd = open_inside(root, rel)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return read_fd_range(fd, start, end)

    def write_expected(self, rel: str, data: bytes) -> None:
        """Write a file of the dump run's metrics (``rel``: one of another store's
        :meth:`expected_names`) whole and atomically."""
        if not rel.startswith(f"{EXPECTED_DIR}/"):
            raise ValueError(f"{rel!r} is not a file of the dump run's metrics")
        self.backend.replace(rel, data)

    def open_expected(self, rank: int | None = None, *, durable: bool = False) -> AppendFile:
        """The local file of the dump run's metrics of ``rank``, to append lines to (created with
        its folder; never through a link, never a FIFO). :class:`DumpNotWritableError` for a dump
        without local files (metrics are kept for local dumps only)."""
        root = self.backend.local_path("")
        if root is None:
            raise DumpNotWritableError(f"[RolloutMock] {self.where('')} has no local files: the dump run's metrics "
                                       f"are kept in local dumps only", mode="dump", path=self.where(""))
        rel = expected_relpath(rank)
        return AppendFile(open_inside(root, rel, AppendFile.FLAGS, make_dirs=True), self.where(rel), durable=durable)

    # ------------------------------------------------------------------ bundles and copies of steps
    def local_source(self) -> str | None:
        """The local directory or bundle file this store reads (``None``: an object store)."""
        local = self.backend.local_path("")
        if local is not None:
            return os.fspath(local)
        if isinstance(self.backend, BundleBackend) and not is_url(self.backend.bundle.where):
            return self.backend.bundle.where
        return None

    def slice(self, *, steps: Sequence[int] | None, splits: Sequence[str] | None = None) -> DumpSlice:
        """The files of this dump that hold ``steps`` (``None``: all) of ``splits`` (``None``: all):
        :func:`~rollout_mock.storage.bundle.slice_store`."""
        return slice_store(self, steps=steps, splits=splits)

    def pack(self, out: str | os.PathLike[str], *, steps: Sequence[int], splits: Sequence[str] | None = None,
             meta: dict[str, Any] | None = None, overwrite: bool = False,
             progress: bool | None = False) -> BundleInfo:
        """``steps`` of this dump as the bundle ``out`` (:func:`~rollout_mock.storage.bundle.pack_store`)."""
        return pack_store(self, out, steps=steps, splits=splits, meta=meta, overwrite=overwrite, progress=progress)

    def pull(self, dst: str | os.PathLike[str], *, steps: Sequence[int] | None, splits: Sequence[str] | None = None,
             overwrite: bool = False, progress: bool | None = False) -> DumpSlice:
        """``steps`` of this dump copied into the new local dump directory ``dst``
        (:func:`~rollout_mock.storage.bundle.pull_store`; an existing ``dst`` holding this dump is
        never replaced)."""
        source = self.local_source()
        return pull_store(self, dst, steps=steps, splits=splits, overwrite=overwrite,
                          protect=[] if source is None else [source], progress=progress)

    def unpack(self, dst: str | os.PathLike[str], *, overwrite: bool = False, progress: bool | None = False) -> Bundle:
        """The bundle this store reads, written back as the dump directory ``dst``, every byte
        checked (:func:`~rollout_mock.storage.bundle.unpack_bundle`). ``TypeError`` for a store that
        does not read a bundle."""
        if not isinstance(self.backend, BundleBackend):
            raise TypeError(f"{self!r} does not read a bundle: nothing to unpack")
        source = self.local_source()
        return unpack_bundle(self.backend.bundle, dst, overwrite=overwrite, protect=[] if source is None else [source],
                             progress=progress)

    def where(self, rel: str) -> str:
        """A human-readable location (path or URL) of ``rel`` under the dump."""
        return self.backend.where(rel)

    def path_of(self, stream: StreamId, step: int) -> Path:
        """The local file of a step (local dumps only)."""
        path = self.backend.local_path(stream.relpath(step))
        if path is None:
            raise TypeError(f"{self.backend!r} has no local files")
        return path

    def open_source(self, rel: str, *, mapped: bool = False) -> ByteSource:
        """A ranged-read :class:`~rollout_mock.codec.safe.ByteSource` over ``rel``."""
        return self.backend.open_source(rel, mapped=mapped)

    def another(self) -> Store:
        """A second store on the same dump, as another process would open it."""
        return Store(self.backend.reopen(), hmac_key=self.hmac_key, verify=self.verify)

    def contains(self, stream: StreamId, step: int) -> bool:
        return self.entry(stream, step) is not None

    def describe_location(self, stream: StreamId, step: int) -> str:
        return self.backend.where(stream.relpath(step))

    def missing_step_error(self, stream: StreamId, step: int, *, mode: str) -> StepNotFoundError:
        return missing_step_error(self, stream, step, mode=mode)

    def sync(self) -> None:
        """Make every step committed so far durable."""
        self.backend.sync()

    # ------------------------------------------------------------------ reading the index
    def manifest_file(self) -> Manifest | None:
        """``manifest.json`` alone (:func:`~rollout_mock.storage.index.read_manifest_file`), cached
        while its signature is unchanged."""
        signature = self.backend.signature(MANIFEST_NAME)
        if signature is None:
            self._manifest_sig, self._manifest_file_cache = None, None
            return None
        if signature != self._manifest_sig or self._manifest_file_cache is None:
            parsed = read_manifest_file(self.backend)
            if parsed is None:
                return None
            self._manifest_file_cache, self._manifest_sig = parsed, signature
        return self._manifest_file_cache

    def manifest(self, *, refresh: bool = False) -> Manifest:
        """The merged index: manifest.json + stream records + entry files (see
        :mod:`rollout_mock.storage.index`). Empty when there is nothing yet."""
        if self._view_cache is not None and not refresh:
            return self._view_cache
        base = self.manifest_file()
        view = Manifest() if base is None else Manifest(
            created_at=base.created_at, writer=base.writer, fingerprint=base.fingerprint, source=base.source,
            format_version=base.format_version, extra=base.extra,
            streams={k: {**v, "steps": dict(v["steps"]), "methods": dict(v.get("methods", {}))}
                     for k, v in base.streams.items()},
        )
        view.segment_reader = None if base is None else base.segment_reader  # segments are manifest.json's
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
        local = self.backend.local_path("")  # (a file is refused where the store is opened: open_store)
        if local is not None and not local.is_dir():
            raise DumpNotFoundError(
                f"[RolloutMock] dump directory not found: {local} (mode={mode}). Run the same steps in dump "
                f"mode first, or fix dump_dir.", mode=mode, split=split, path=local)
        if not self.has_dump():
            pickles = self._foreign_step_files()
            hint = (f" It holds {pickles} step file(s) but no manifest: it was probably written by ROLL or an "
                    f"older tool; convert it with `rollout-mock import {shlex.quote(self.where(''))} NEW_DIR "
                    f"--trust` and "
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

    def steps(self, stream: StreamId) -> StepSet:
        """The recorded steps of ``stream`` (a :class:`~rollout_mock.storage.manifest.StepSet`:
        a sequence of ints held as ranges)."""
        owned = self._owned.get(stream.key)
        if owned is not None:
            return owned.live.copy()
        return self.manifest(refresh=True).steps(stream)

    def methods(self, stream: StreamId) -> dict[str, dict[str, Any]]:
        owned = self._owned.get(stream.key)
        if owned is not None and owned.methods:
            return dict(owned.methods)
        return self.manifest().methods(stream)

    def fingerprint(self) -> dict[str, Any] | None:
        return self.manifest().fingerprint

    # ------------------------------------------------------------------ writing
    @contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """Turn the OS's or the object store's refusal to write into one error naming the dump and
        the fix (:class:`DumpNotWritableError`, :class:`DiskFullError`)."""
        try:
            yield
        except RolloutMockError:
            raise
        except OSError as exc:
            raise self._not_writable(exc, what) from None

    def _not_writable(self, exc: OSError, what: str) -> RolloutMockError | OSError:
        where = self.where("")
        target = exc.filename or where
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            local = self.backend.local_path("")
            free = None if local is None else free_bytes(local)
            return DiskFullError(
                f"[RolloutMock] no space left on the device of {where} while {what}"
                f"{'' if free is None else f' ({free} bytes free)'}: free some space, or point dump_dir at a larger "
                f"disk", mode="dump", path=target, free=free)
        if is_url(where) and isinstance(exc, (PermissionError, FileNotFoundError)):
            reason, fix = (("access denied", "check that the credentials (storage_options, AWS_* variables) may "
                            "write there and that the bucket policy allows it") if isinstance(exc, PermissionError)
                           else ("its bucket does not exist", "create the bucket, or fix the URL"))
        elif exc.errno in _NOT_WRITABLE:
            reason, fix = _NOT_WRITABLE[exc.errno]
        elif isinstance(exc, PermissionError):
            reason, fix = _NOT_WRITABLE[errno.EACCES]
        else:
            return exc
        error = DumpNotWritableError(
            f"[RolloutMock] cannot write the dump at {where} while {what}: {reason} ({target}). {fix[0].upper()}"
            f"{fix[1:]}.", mode="dump", path=target)
        error.errno = exc.errno  # (not strerror/filename: they would replace the message in str())
        return error

    def open_writer(self, stream: StreamId, *, fingerprint: dict[str, Any] | None = None,
                    methods: dict[str, dict[str, Any]] | None = None, compression: str = "none") -> None:
        """Claim ``stream`` for writing by this object (a second writer gets :class:`LockedError`),
        recording ``fingerprint`` (this writer's environment) when the dump has none yet and
        ``methods`` (how each method is called) with the stream: see :meth:`StreamIndex.open
        <rollout_mock.storage.index.StreamIndex.open>`. A stream this object writes already is
        left as it is (:meth:`set_methods` changes its methods). ``compression``: the codec the
        writer's steps will be saved with; one whose package is missing is a :class:`ConfigError`
        before anything is claimed."""
        try:
            codec.require_compression(compression)
        except MissingExtraError as exc:
            raise ConfigError(f"compression: {compression} (dump mode, {stream}, {self.where('')}): {exc}; or set "
                              f"compression: none", mode="dump", split=stream.split, path=self.where("")) from None
        if stream.key in self._owned:
            return
        with self._writing(f"opening {stream} for writing"):
            self._owned[stream.key] = StreamIndex.open(self.backend, stream, fingerprint=fingerprint, methods=methods)
        self._view_cache = None

    def _owner(self, stream: StreamId) -> StreamIndex:
        if stream.key not in self._owned:
            self.open_writer(stream)
        owned = self._owned[stream.key]
        owned.check_held()
        return owned

    def set_methods(self, stream: StreamId, methods: dict[str, dict[str, Any]]) -> None:
        owner = self._owner(stream)
        with self._writing(f"recording the methods of {stream}"):
            owner.set_methods(methods)
        self._view_cache = None

    def set_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        """Record the environment that made the dump, unless it records one already (a writer
        records its own when it claims a stream: :meth:`open_writer`)."""
        if self.fingerprint() is None:
            with self._writing("recording the environment fingerprint"), manifest_lock(self.backend):
                record_fingerprint(self.backend, fingerprint, read_manifest_file(self.backend))
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
             call: dict[str, Any] | None = None, compression: str = "none") -> StepEntry:
        owned = self._owner(stream)
        self.check_writable(stream, step, overwrite=overwrite)
        if overwrite and step in owned.live:
            self.delete(stream, step)
        rel = stream.relpath(step)
        with self._writing(f"writing step {step} of {stream}"):
            size, checksum, mac = self._write_step(
                rel, stream, step, lambda sink: codec.encode(batch, sink, compression=compression))
        entry = StepEntry(file=rel, size=size, checksum=checksum, hmac=mac, samples=info.samples, type=info.type,
                          keys=info.keys, written_at=utc_now(), method=method, rollout_seconds=rollout_seconds,
                          call=call, compression=None if compression == "none" else compression)
        try:
            with self._writing(f"committing step {step} of {stream}"):
                self._commit_entry(stream, step, entry)
        except BaseException:
            self.backend.remove([rel])  # unreferenced data: invisible anyway, but do not leave it
            raise
        self._view_cache = None
        owned.committed(step, entry.to_json())
        return entry

    def _write_step(self, rel: str, stream: StreamId, step: int,
                    produce: Callable[[Any], object]) -> tuple[int, str, str | None]:
        """Write the bytes ``produce`` emits as ``rel``, whole or not at all, hashing them on the
        way (CRC-32, and the HMAC bound to the stream and step): (size, checksum, mac)."""
        context = mac_context(stream.key, step) if self.hmac_key else b""
        upload = self.backend.open_upload(rel)
        sink = HashingWriter(upload, Digest(self.hmac_key, context))
        try:
            produce(sink)
            checksum, mac = sink.finish()
            upload.commit()
        except BaseException as exc:
            upload.abort()
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC and not isinstance(exc, RolloutMockError):
                local = self.backend.local_path(rel)
                raise disk_full_error(local if local is not None else self.where(rel), sink.size) from None
            raise
        return sink.size, checksum, mac

    def _commit_entry(self, stream: StreamId, step: int, entry: StepEntry) -> None:
        """Make the step visible: create its entry file, exclusively (the conditional write
        that refuses a concurrent writer of the same step)."""
        rel, data = entry_relpath(stream, step), encode_entry(stream, step, entry)
        if self.backend.create_unsynced(rel, data):
            return
        existing = self.backend.read(rel)
        if existing is None or decode_entry(existing, stream, step, self.backend.where(rel)) in (None, INVALID):
            self.backend.replace(rel, data)  # a tombstone or garbage of our own stream: ours to replace
            return
        raise exists_error(stream, step, self.backend.where(rel))

    def delete(self, stream: StreamId, step: int) -> None:
        """Hide the step first (remove its entry, or a tombstone over a folded entry), then
        remove its data: a crash in between leaves unreferenced data, never a broken step."""
        self.delete_many(stream, [step])

    def delete_many(self, stream: StreamId, steps: Sequence[int]) -> None:
        """:meth:`delete` of several steps in batched requests: their entries in one removal
        (folded ones get a tombstone each), then their data in another (on S3: two
        DeleteObjects requests, whatever the count). Absent steps: silently nothing."""
        owner = self._owner(stream)
        present = [step for step in dict.fromkeys(steps) if step in owner.live]
        if not present:
            return
        what = f"step {present[0]}" if len(present) == 1 else f"steps {format_ranges(present)}"
        with self._writing(f"deleting {what} of {stream}"):
            owner.deleted(present)
            self.backend.remove([stream.relpath(step) for step in present])
        self._view_cache = None

    def pin(self, stream: StreamId, step: int, reasons: Sequence[str]) -> StepEntry | None:
        """Write why a recorded step is kept into its index entry (``StepEntry.pin``, replacing
        the reasons it had; each made printable and cut to ``MAX_PIN_CHARS``, at most
        ``MAX_PIN_REASONS`` kept). The step's data is not touched (its checksum and HMAC cover the
        data, not the entry). Returns the new entry, ``None`` when the step is not recorded."""
        owner = self._owner(stream)
        if step not in owner.live:
            return None
        entry = self.entry(stream, step)
        if entry is None:
            return None
        entry.pin = [pin_reason(r) for r in reasons][:MAX_PIN_REASONS] or None
        with self._writing(f"pinning step {step} of {stream}"):
            owner.amended(step, entry)
        self._view_cache = None
        return entry

    # ------------------------------------------------------------------ extra calls (packs)
    def next_pack_seq(self, stream: StreamId) -> int:
        """The sequence number the stream's next pack takes (after every record and data file
        there, so that a pack left by a writer that died is never overwritten)."""
        self._owner(stream)
        seqs = [0]
        for name in self.backend.listdir(calls_dir(stream)):
            match = _PACK_NAME.fullmatch(name)
            if match is not None:
                seqs.append(int(match.group(1)) + 1)
        return max(seqs)

    def save_pack(self, stream: StreamId, seq: int, members: Sequence[tuple[Any, Sequence[CallRecord]]],
                  meta: list[dict[str, Any]] | codec.Capture, *, drop: Sequence[int] = (),
                  compression: str = "none") -> PackRecord:
        """Write a pack of extra calls: its members (each a batch, or its codec capture, of one
        call; or a list of the batches of several calls, or its capture: a
        :class:`~rollout_mock.codec.CaptureList` closed, whose records give each call's ``item``)
        encoded one after the other into one data file, then the calls' summaries (``meta``, in
        the order of the members' calls; a list, or its capture),
        then the pack record (the commit point, created exclusively). A member's ``CallRecord``s
        give each call's step, index, method, digest...; their offsets, sizes, checksums and list
        positions (``item``, for a list member) are filled in here."""
        self._owner(stream)
        rel = pack_relpath(stream, seq)
        placed: list[CallRecord] = []
        meta_at: tuple[int, int, str] | None = None

        def produce(sink: Any) -> None:
            nonlocal meta_at
            for payload, records in members:
                start, member = sink.size, _MemberSink(sink)
                codec.encode(payload, member, compression=compression)
                checksum = f"crc32:{member.crc:08x}"
                listed = isinstance(payload, list)
                placed.extend(dataclasses.replace(record, offset=start, size=member.size, checksum=checksum,
                                                  item=i if listed else record.item)
                              for i, record in enumerate(records))
            start, member = sink.size, _MemberSink(sink)
            codec.encode(meta, member)
            meta_at = (start, member.size, f"crc32:{member.crc:08x}")

        with self._writing(f"writing pack {seq} of extra calls of {stream}"):
            size, checksum, mac = self._write_step(rel, stream, _PACK_MAC_BASE + seq, produce)
        record = PackRecord(seq, rel, size, checksum, tuple(placed), meta_at, mac, tuple(drop), utc_now())
        data = json.dumps(record.to_json(stream.key), allow_nan=False, separators=(",", ":")).encode("utf-8")
        try:
            with self._writing(f"committing pack {seq} of extra calls of {stream}"):
                if not self.backend.create(pack_relpath(stream, seq, ".json"), data):
                    raise exists_error(stream, placed[0].step if placed else 0,
                                       self.backend.where(pack_relpath(stream, seq, ".json")))
        except BaseException:
            self.backend.remove([rel])
            raise
        self._packs.pop(stream.key, None)
        self._owner(stream).has_packs = True
        return record

    def packs(self, stream: StreamId) -> list[PackRecord]:
        """The stream's packs of extra calls, by sequence number (re-read when the folder changed)."""
        signature = tuple(sorted(self.backend.listdir(calls_dir(stream))))
        cached = self._packs.get(stream.key)
        if cached is None or cached[0] != signature:
            cached = (signature, read_packs(self.backend, stream))
            self._packs[stream.key] = cached
        return cached[1]

    def extra_calls(self, stream: StreamId) -> dict[int, list[tuple[PackRecord, CallRecord]]]:
        """Every step's extra calls (beyond its step file), in call order, without those a later
        pack dropped (a step recorded again), and only for steps the index holds."""
        packs = self.packs(stream)
        dropped: dict[int, int] = {}
        for pack in packs:
            for step in pack.drop:
                dropped[step] = pack.seq
        steps = self.steps(stream)
        calls: dict[int, list[tuple[PackRecord, CallRecord]]] = {}
        for pack in packs:
            for call in pack.calls:
                if call.step in steps and pack.seq >= dropped.get(call.step, -1):
                    calls.setdefault(call.step, []).append((pack, call))
        for listed in calls.values():
            listed.sort(key=lambda item: item[1].call)
        return calls

    def prune_packs(self, stream: StreamId) -> int:
        """Remove the packs none of whose calls belongs to a step the index still holds (their
        steps were deleted by retention): the record first, then the data. Returns how many."""
        owner = self._owner(stream)
        doomed = [pack for pack in self.packs(stream)
                  if pack.calls and not any(call.step in owner.live for call in pack.calls)]
        for pack in doomed:
            with self._writing(f"removing pack {pack.seq} of extra calls of {stream}"):
                self.backend.remove([pack_relpath(stream, pack.seq, ".json")])
                self.backend.remove([pack.file])
        if doomed:
            self._packs.pop(stream.key, None)
        return len(doomed)

    def _pack_bytes(self, stream: StreamId, pack: PackRecord) -> bytes:
        """A pack's data, read whole and checked against its record (size, CRC, the bound HMAC);
        the last two packs read are kept in memory (the calls of a step are served one by one)."""
        key = (stream.key, pack.seq, pack.checksum)
        for cached_key, data in self._pack_cache:
            if cached_key == key:
                return data
        where = self.where(pack.file)
        read = self.backend.read(pack.file, 0, pack.size + 1)
        if read is None:
            raise corrupt_error(where, stream, None, "the pack of extra calls listed in the index is missing")
        data = read
        if len(data) != pack.size:
            raise corrupt_error(where, stream, None, f"size is {len(data)} bytes, its record says {pack.size}")
        if self.hmac_key is not None and not pack.hmac:
            raise corrupt_error(where, stream, None, "its record has no HMAC signature, but a key is configured")
        if self.verify or self.hmac_key is not None:
            digest = Digest(self.hmac_key, mac_context(stream.key, _PACK_MAC_BASE + pack.seq) if self.hmac_key
                            else b"", threaded=False)
            digest.update(data)
            checksum, mac = digest.finish()
            if checksum != pack.checksum:
                raise corrupt_error(where, stream, None, f"checksum {checksum} does not match its record's "
                                    f"{pack.checksum}")
            if self.hmac_key is not None and not hmac_lib.compare_digest(str(mac), str(pack.hmac)):
                raise corrupt_error(where, stream, None, "HMAC signature does not match: the pack (or its record) "
                                    "was changed or moved, or the key differs from the one used to dump")
        self._pack_cache = [(key, data), *self._pack_cache[:1]]
        return data

    def load_call(self, stream: StreamId, pack: PackRecord, call: CallRecord, *, trusted: bool = False) -> Any:
        """The batch of one extra call (its bytes checked against the pack record). The calls of a
        list member are decoded together once; each is handed out once (a call asked for again
        gets a fresh decode), so that no two callers share a batch."""
        key = (stream.key, pack.seq, pack.checksum, call.offset)
        if call.item is not None:
            cached = self._group_cache.get(key)
            if cached is not None and call.item not in cached[1] and call.item < len(cached[0]):
                cached[1].add(call.item)
                return cached[0][call.item]
        data = self._pack_bytes(stream, pack)
        member = data[call.offset:call.offset + call.size]
        entry = StepEntry(file=pack.file, size=call.size, checksum=call.checksum, samples=call.samples, type="",
                          keys={}, written_at="")
        where = f"{self.where(pack.file)} (call {call.call} of step {call.step})"
        # the whole pack was checked when it was read (CRC, HMAC): its members need no second pass
        value = load_bytes_verified(member, entry, where=where, stream=stream, step=call.step, trusted=trusted,
                                    verify=False)
        if call.item is None:
            return value
        if not isinstance(value, list) or call.item >= len(value):
            raise corrupt_error(where, stream, call.step, f"its record places the call at item {call.item} of a "
                                f"list of its pack, which holds {type(value).__name__} "
                                f"{len(value) if isinstance(value, list) else ''}".rstrip())
        self._group_cache[key] = (value, {call.item})
        while len(self._group_cache) > 4:
            del self._group_cache[next(iter(self._group_cache))]
        return value[call.item]

    def pack_meta(self, stream: StreamId, pack: PackRecord) -> list[Any]:
        """The summaries (arguments, request nodes) of a pack's calls, in the pack's order."""
        if pack.meta is None:
            return []
        start, size, checksum = pack.meta
        data = self._pack_bytes(stream, pack)
        entry = StepEntry(file=pack.file, size=size, checksum=checksum, samples=None, type="", keys={}, written_at="")
        value = load_bytes_verified(data[start:start + size], entry, where=f"{self.where(pack.file)} (summaries)",
                                    stream=stream, step=None, trusted=False, verify=self.verify)
        return value if isinstance(value, list) else []

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
                    with self._writing(f"closing {owned.stream}"):
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
            if self.backend.size(rel) is not None:
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


#: The type the wrappers take (its former name, when it was a protocol with one implementation):
#: the one :class:`Store`, whatever its backend.
StepStore = Store


# ---------------------------------------------------------------------------------------------
# Building a store
# ---------------------------------------------------------------------------------------------

def DirectoryStore(dump_dir: str | os.PathLike[str], *, hmac_key: bytes | None = None,
                   verify: bool = True) -> Store:
    """The store of a dump in a local directory: ``Store(LocalBackend(dump_dir))``."""
    return Store(LocalBackend(dump_dir), hmac_key=hmac_key, verify=verify)


def FsspecStore(url: str, *, storage_options: dict[str, Any] | None = None,
                hmac_key: bytes | None = None, verify: bool = True, lease_ttl: float = 60.0) -> Store:
    """The store of a dump under an fsspec URL (``s3://bucket/prefix``, ``memory://x``, ...):
    ``Store(FsspecBackend(url))``."""
    from rollout_mock.storage.objectstore import FsspecBackend

    return Store(FsspecBackend(url, storage_options=storage_options, lease_ttl=lease_ttl), hmac_key=hmac_key,
                 verify=verify)


def MemoryStore(*, hmac_key: bytes | None = None, verify: bool = True) -> Store:
    """A store over a fresh :class:`~rollout_mock.storage.backend.MemoryBackend` (for tests; a
    second handle on the same contents: ``store.another()``)."""
    return Store(MemoryBackend(), hmac_key=hmac_key, verify=verify)


@dataclass(frozen=True)
class StoreSettings:
    """Where a dump is and how it is opened: what :func:`open_store` needs besides a mode.
    ``config_parts`` builds it from the config (``hmac_key`` already read from the environment);
    a bare location is ``StoreSettings(location)``."""

    dump_dir: str
    #: passed to fsspec for a URL (``None`` or empty: none)
    storage_options: Mapping[str, Any] | None = None
    hmac_key: bytes | None = field(default=None, repr=False)
    verify: bool = True


def open_store(location: str | os.PathLike[str] | StoreSettings, *, mode: str | None = None) -> Store:
    """The store for ``location`` (a path or URL, or :class:`StoreSettings` that also carry the
    fsspec options, the signing key and whether loads verify), the one place that decides how a
    location is opened: a bundle
    (a ``.rmb`` file or URL, :func:`~rollout_mock.storage.bundle.is_bundle`) gets the read-only
    :class:`~rollout_mock.storage.bundle.BundleBackend`, read in place; any other fsspec URL
    (``s3://bucket/prefix``) the :class:`~rollout_mock.storage.objectstore.FsspecBackend`; a local
    path (or ``file://``) the :class:`~rollout_mock.storage.directory.LocalBackend` (atomic rename,
    fsync, flock: fastest). A local file that is no bundle (a step file, the manifest) is refused
    with :func:`~rollout_mock.errors.dump_path_is_a_file` (``mode``: the mode it names)."""
    if not isinstance(location, StoreSettings):
        location = StoreSettings(os.fspath(location))
    backend = _backend(location.dump_dir, location.storage_options, mode)
    return Store(backend, hmac_key=location.hmac_key, verify=location.verify)


def _backend(location: str, storage_options: Mapping[str, Any] | None, mode: str | None) -> ByteBackend:
    """The byte backend :func:`open_store` picks for ``location``."""
    options = dict(storage_options or {}) or None
    if is_bundle(location):
        return BundleBackend(open_bundle(location, storage_options=options))
    if is_url(location) and not location.startswith("file://"):
        from rollout_mock.storage.objectstore import FsspecBackend

        return FsspecBackend(location, storage_options=options)
    path = location.removeprefix("file://")
    if os.path.isfile(path):
        raise dump_path_is_a_file(path, mode=mode)
    return LocalBackend(path)

"""Reading recorded steps: a whole dump outside a training run (a directory or an fsspec URL
such as ``s3://bucket/prefix``) or one step file, for notebooks, scripts and the CLI; only what
is needed of a step (keys, rows, a lazy view); onto another data-parallel layout; and the next
step ahead of time in mock mode. Nothing here unpickles unless a batch is asked for.

* :func:`rank_rows` — the rows a data-parallel rank gets, the way the frameworks' own ``chunk``
  splits a batch (``torch.chunk`` / verl's ``DataProto.chunk``: contiguous, ``ceil(n / size)``
  rows per rank, the last ranks shorter or empty);
* :func:`load_partial` — a step's ``keys`` and ``rows`` from any store: a format-2 step reads its
  header and only the chunks covering them (each chunk's CRC is checked by the codec; ranged
  reads on object stores); with an HMAC key the whole object is read and authenticated first (a
  MAC covers the whole file), then the selection is decoded;
* :func:`load_resplit` — per-rank dumps (``ranks: all``) replayed on another rank count: the
  recorded ranks' rows are concatenated in rank order and split again for the new layout;
* :class:`Prefetcher` — serves ``get(step)`` from a background load started when the previous
  step was served, then starts loading the step after. A wrong guess (a resumed run, a skipped
  step) is discarded: the requested step is always the one returned. Errors of a background
  load are raised when that step is requested, and only then. With a device placement
  (``device: cuda``) a load also copies the step's tensors to the device, from pinned memory.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_mock.batch import concat, count_samples, subset, take_rows
from rollout_mock.codec import StepView
from rollout_mock.codec.device import DevicePlacement
from rollout_mock.errors import IncompleteDumpError, ManifestError, RolloutMockError, StepNotFoundError
from rollout_mock.storage.index import STREAMS_DIR, parse_step_relpath
from rollout_mock.storage.manifest import MANIFEST_NAME, Manifest, StepEntry, StepSet, StreamId
from rollout_mock.storage.store import DirectoryStore, Store, StoreSettings, open_store
from rollout_mock.storage.verified import corrupt_error, load_verified, open_verified
from rollout_mock.text import logger

__all__ = ["Dump", "Prefetcher", "RecordedStep", "load_partial", "load_resplit", "load_step", "open_dump",
           "open_view", "rank_rows"]


def _find_entry(path: Path) -> tuple[StreamId, int, StepEntry | None] | None:
    """The dump holding ``path`` (one to three directories up) and the step it is, with its
    index entry (None if the dump does not list it); None when no dump is found."""
    resolved = path.resolve()
    for dump_dir in list(resolved.parents)[:3]:
        if not ((dump_dir / MANIFEST_NAME).is_file() or (dump_dir / STREAMS_DIR).is_dir()):
            continue
        parsed = parse_step_relpath(resolved.relative_to(dump_dir).as_posix())
        if parsed is None:
            return None
        stream, step = parsed
        return stream, step, DirectoryStore(dump_dir).entry(stream, step)
    return None


def load_step(
    path: str | os.PathLike[str],
    *,
    trusted: bool = False,
    verify: bool = True,
    hmac_key: bytes | None = None,
) -> Any:
    """Load one ``step_*.pkl`` on its own.

    When the dump's index is beside it (one to three directories up), the file's size and
    checksum are verified first-hand against its entry. With ``hmac_key`` the file must be
    signed for exactly the stream and step its path names — with or without ``verify``, and a
    file with no entry (no manifest, renamed, copied elsewhere) is refused. ``trusted=True``
    allows arbitrary pickled objects (only for files you trust: unpickling can run code).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"[RolloutMock] step file not found: {path}")
    found = _find_entry(path) if (verify or hmac_key is not None) else None
    if found is None or found[2] is None:
        if found is not None and hmac_key is None:
            logger.warning("[RolloutMock] %s is not listed in its dump's index; loading it without "
                           "checksum verification", path)
        stream, step = (found[0], found[1]) if found is not None else (None, None)
        return load_verified(path, None, stream=stream, step=step, trusted=trusted, verify=False,
                             hmac_key=hmac_key)
    stream, step, entry = found
    return load_verified(path, entry, stream=stream, step=step, trusted=trusted, verify=True, hmac_key=hmac_key)


@dataclass(frozen=True)
class RecordedStep:
    stream: StreamId
    step: int
    entry: StepEntry
    path: Path | str
    """A local path, or the URL of the object for object-store dumps."""


@dataclass(frozen=True)
class CallInfo:
    """One recorded call of a step (:meth:`Dump.calls`): its index in the step, method, samples
    and the provenance recorded with it (``MockScheduler(provenance=...)``)."""

    step: int
    call: int
    method: str | None
    samples: int | None
    provenance: dict[str, Any] | None


def flag_health(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``anomalies`` to each health line: what sets the step apart from the run.

    * ``nonfinite:KEY`` and ``beyond_fp16:KEY`` as written;
    * ``constant:KEY``: all values of a floating key equal (zero variance: a GRPO group with equal
      rewards) where most steps' are not;
    * ``zero:KEY``: a zero minimum (a log(0) waiting) where most steps' minimum is above 0;
    * ``outlier:KEY``: a largest magnitude over 10x the run's median for that key.
    """
    stats: dict[str, dict[str, list[float]]] = {}
    constant: dict[str, int] = {}
    for line in lines:
        flags = line.get("flags") or []
        for key, value in (line.get("keys") or {}).items():
            bounded = isinstance(value, dict) and all(isinstance(value.get(b), int | float) for b in ("lo", "hi"))
            if bounded:
                entry = stats.setdefault(key, {"mag": [], "lo": []})
                entry["mag"].append(max(abs(value["lo"]), abs(value["hi"])))
                entry["lo"].append(value["lo"])
        for flag in flags:
            if isinstance(flag, str) and flag.startswith("constant:"):
                constant[flag[9:]] = constant.get(flag[9:], 0) + 1
    median = {k: (sorted(v["mag"])[len(v["mag"]) // 2], sorted(v["lo"])[len(v["lo"]) // 2]) for k, v in stats.items()}
    for line in lines:
        found: list[str] = []
        for flag in line.get("flags") or []:
            if not isinstance(flag, str):
                continue
            kind, _, key = flag.partition(":")
            if kind in ("nonfinite", "beyond_fp16") or (kind == "constant" and constant.get(key, 0) * 2 < len(lines)):
                found.append(flag)
        for key, value in (line.get("keys") or {}).items():
            if key not in median or not isinstance(value, dict) or not isinstance(value.get("lo"), int | float):
                continue
            mag_median, lo_median = median[key]
            if value["lo"] == 0 and lo_median > 0:
                found.append(f"zero:{key}")
            if mag_median > 0 and max(abs(value["lo"]), abs(value["hi"])) > 10 * mag_median:
                found.append(f"outlier:{key}")
        line["anomalies"] = found
    return lines


class Dump:
    """A read-only view of a dump. Listing reads only the index (manifest.json, plus the entry
    files of writers that have not compacted yet); nothing is unpickled."""

    def __init__(self, dump_dir: str | os.PathLike[str], *, hmac_key: bytes | None = None,
                 storage_options: dict[str, Any] | None = None, verify: bool = True) -> None:
        self._store: Store = open_store(StoreSettings(os.fspath(dump_dir), storage_options, hmac_key, verify))
        self.dump_dir: Path | str = self._store.dump_dir
        self.manifest: Manifest = self._store.require_manifest(mode="read")

    def __repr__(self) -> str:
        return f"Dump({str(self.dump_dir)!r})"

    @property
    def store(self) -> Store:
        return self._store

    def streams(self) -> list[StreamId]:
        return self.manifest.stream_ids()

    def stream(self, split: str = "train", name: str | None = None, rank: int | None = None) -> StreamId:
        stream = StreamId(split, name, rank)
        if self.manifest.stream(stream) is None:
            known = ", ".join(s.key for s in self.streams()) or "none"
            raise ManifestError(f"{self.dump_dir}: no stream {stream.key!r} (recorded: {known})",
                                path=str(self.dump_dir))
        return stream

    def health(self, stream: StreamId | str = "train") -> list[dict[str, Any]]:
        """The health line of every step of ``stream`` the dump run wrote, by step, kept even for
        steps whose batch was dropped (``keep:``): ``{"step", "keys": {key: {"n", "nf", "lo",
        "hi", "mean", "len"}}, "flags": [...], "anomalies": [...]}`` (see
        :func:`rollout_mock.codec.scan.health_summary`; ``anomalies`` by
        :func:`flag_health`); ``[]`` for a dump written before."""
        return flag_health(self._store.health(self._resolve(stream)))

    def steps(self, stream: StreamId) -> StepSet:
        """The stream's steps (ranges: a dump of millions of steps costs a few integers)."""
        return self.manifest.steps(stream)

    def contains(self, stream: StreamId, step: int) -> bool:
        return step in self.manifest.steps(stream)

    def entry(self, stream: StreamId, step: int) -> StepEntry | None:
        return self.manifest.entry(stream, step)

    def records(self) -> Iterator[RecordedStep]:
        for stream in self.streams():
            for step in self.steps(stream):
                entry = self.entry(stream, step)
                assert entry is not None
                where = self._store.where(entry.file)
                yield RecordedStep(stream, step, entry, Path(where) if isinstance(self.dump_dir, Path) else where)

    def _resolve(self, stream: StreamId | str) -> StreamId:
        """A StreamId, or a key such as ``"train"``, ``"train/math"``, ``"train@rank1"``."""
        if isinstance(stream, StreamId):
            return stream
        parsed = StreamId.from_key(stream)
        return self.stream(parsed.split, parsed.name, parsed.rank)

    def load(self, step: int, stream: StreamId | str = "train", *, keys: Iterable[str] | None = None,
             rows: range | slice | None = None, trusted: bool = False, mapped: bool = False) -> Any:
        """Load and verify one step (``stream`` may be a key: ``"train"``, ``"train/math@rank1"``).

        ``keys`` (top-level keys) and ``rows`` (batch rows, e.g. ``rank_rows(n, dp_rank,
        dp_size)``) read only what is needed from a format-2 step (ranged reads on object stores).
        ``mapped`` (local dumps): tensors are the step file's mapped pages, not a copy (see
        :meth:`open`); every chunk returned is still CRC-checked.
        """
        return load_partial(self._store, self._resolve(stream), step, keys=keys, rows=rows, trusted=trusted,
                            mapped=mapped)

    def calls(self, step: int, stream: StreamId | str = "train") -> list[CallInfo]:
        """Every recorded call of ``step``, in call order: its step file's call, then the
        further calls kept in packs (a step of one call has one)."""
        key = self._resolve(stream)
        entry = self.entry(key, step)
        if entry is None:
            return []
        call = entry.call or {}
        index = call.get("index", 0)
        provenance = call.get("provenance")
        found = [CallInfo(step, index if type(index) is int else 0, entry.method, entry.samples,
                          provenance if isinstance(provenance, dict) else None)]
        found += [CallInfo(step, record.call, record.method, record.samples, record.provenance)
                  for _, record in self._store.extra_calls(key).get(step, [])]
        return sorted(found, key=lambda c: c.call)

    def load_call(self, step: int, call: int, stream: StreamId | str = "train", *, trusted: bool = False) -> Any:
        """Load and verify call ``call`` of ``step`` (see :meth:`calls`)."""
        key = self._resolve(stream)
        entry = self.entry(key, step)
        own = (entry.call or {}).get("index", 0) if entry is not None else None
        if entry is not None and own == call:
            return self.load(step, key, trusted=trusted)
        for pack, record in self._store.extra_calls(key).get(step, []):
            if record.call == call:
                return self._store.load_call(key, pack, record, trusted=trusted)
        known = [c.call for c in self.calls(step, key)]
        raise StepNotFoundError(f"[RolloutMock] {self.dump_dir}: step {step} of {key} has no call {call} (recorded "
                                f"calls: {known or 'none'})", mode="read", split=key.split, step=step,
                                path=str(self.dump_dir))

    def open(self, step: int, stream: StreamId | str = "train", *, trusted: bool = False, mapped: bool = True,
             verify: bool = True) -> StepView:
        """Open one step lazily: a :class:`~rollout_mock.codec.safe.StepView` whose ``keys()``,
        ``nbytes`` and ``load(keys=, rows=)`` read only the header, then only what is asked for.

        Local dumps are mapped (``mapped=True``): a few keys or rows of a multi-GB step take
        milliseconds and no copy. ``verify`` checks the file's size and CRC-32 against the index
        (from the chunk table, without reading the data) and the CRC of every chunk handed out;
        ``verify=False`` reads nothing but the header, and the view's ``verified`` is False.
        """
        return open_view(self._store, self._resolve(stream), step, trusted=trusted, mapped=mapped, verify=verify)


def open_dump(dump_dir: str | os.PathLike[str], *, hmac_key: bytes | None = None,
              storage_options: dict[str, Any] | None = None) -> Dump:
    """Open a dump (a directory or an fsspec URL) for reading; ``DumpNotFoundError`` if empty."""
    return Dump(dump_dir, hmac_key=hmac_key, storage_options=storage_options)


# ---------------------------------------------------------------------------------------------
# Partial loads and data-parallel layouts
# ---------------------------------------------------------------------------------------------

def rank_rows(n_rows: int, dp_rank: int, dp_size: int) -> range:
    """Rows ``dp_rank`` of ``dp_size`` gets from a batch of ``n_rows`` (torch.chunk's split)."""
    if dp_size < 1 or not 0 <= dp_rank < dp_size or n_rows < 0:
        raise ValueError(f"rank_rows: need 0 <= dp_rank < dp_size and n_rows >= 0, got "
                         f"n_rows={n_rows}, dp_rank={dp_rank}, dp_size={dp_size}")
    per = -(-n_rows // dp_size) if n_rows else 0
    start = min(dp_rank * per, n_rows)
    return range(start, min(start + per, n_rows))


def load_partial(store: Any, stream: StreamId, step: int, *, keys: Iterable[str] | None = None,
                 rows: range | slice | None = None, trusted: bool = False, mapped: bool = False) -> Any:
    """``keys`` (top-level) and ``rows`` of a recorded step, reading as little as possible
    (``mapped``: local files are mapped, not read: see :func:`open_view`)."""
    from rollout_mock.codec.decode import normalize_rows

    if store.hmac_key is not None and not mapped:  # authenticate the whole object, then select
        batch = store.load(stream, step, trusted=trusted)
        if keys is None and rows is None:
            return batch
        return subset(batch, keys, normalize_rows(rows))
    if keys is None and rows is None and not mapped:
        return store.load(stream, step, trusted=trusted)
    return open_view(store, stream, step, trusted=trusted, mapped=mapped).load(keys=keys, rows=rows)


def open_view(store: Store, stream: StreamId, step: int, *, trusted: bool = False, mapped: bool = True,
              verify: bool = True) -> StepView:
    """A recorded step opened lazily (:class:`~rollout_mock.codec.safe.StepView`): only its
    header is read. ``mapped`` (local dumps): its data is mapped, not read, and what ``load``
    returns *is* the file's pages (copy-on-write).

    ``verify`` (default): the file's size and its whole-file CRC-32 are checked against the index
    first (the CRC from the chunk table: nothing of the data is read), and every chunk ``load``
    returns is CRC-checked as it is handed out. ``verify=False`` reads and checks nothing beyond
    the header; the view's ``verified`` attribute is then False. With an HMAC key the step is read
    once into private memory and authenticated, and the view serves those bytes (never the file's
    pages), whatever ``mapped`` and ``verify`` say: see
    :func:`~rollout_mock.storage.verified.open_verified`.
    """
    entry = store.entry(stream, step)
    if entry is None:
        raise store.missing_step_error(stream, step, mode="mock")
    try:
        rel = stream.relpath(step)  # (a backend of one's own may not know ``mapped``)
        source = store.open_source(rel, mapped=True) if mapped else store.open_source(rel)
    except FileNotFoundError:
        raise corrupt_error(store.where(stream.relpath(step)), stream, step,
                            "the file listed in the manifest is missing") from None
    return open_verified(source, entry, stream=stream, step=step, trusted=trusted, verify=verify,
                         hmac_key=store.hmac_key)


def _rows_of(batch: Any) -> int:
    n = count_samples(batch)
    if n is None:
        raise RolloutMockError(f"cannot re-split a {type(batch).__name__}: it has no batch dimension")
    return int(n)


def load_resplit(store: Store, split: str, step: int, *, dp_rank: int, dp_size: int, name: str | None = None,
                 trusted: bool = False) -> Any:
    """This rank's rows of ``step`` when the dump was recorded per rank (``ranks: all``) on a
    possibly different number of ranks: concatenate the recorded ranks in order, split again.

    Refuses (with the reason) when the recorded ranks are not contiguous from 0 or the batch type
    cannot be concatenated (:func:`rollout_mock.batch.concat`: dicts of tensors/arrays and the registered
    types that can, e.g. TensorDicts and DataProtos).
    """
    recorded = sorted(s.rank for s in store.stream_ids()
                      if s.split == split and s.name == name and s.rank is not None and store.contains(s, step))
    if not recorded or recorded != list(range(len(recorded))):
        raise IncompleteDumpError(
            f"[RolloutMock] cannot re-split step {step} of {split}: recorded ranks are {recorded or 'none'}, "
            f"expected 0..R-1 (a per-rank dump with every rank's file)", mode="mock", split=split, step=step)
    if len(recorded) == dp_size:
        return store.load(StreamId(split, name, dp_rank), step, trusted=trusted)
    parts = [store.load(StreamId(split, name, r), step, trusted=trusted) for r in recorded]
    whole = _concat(parts, split, step)
    return take_rows(whole, rank_rows(_rows_of(whole), dp_rank, dp_size))


def _concat(parts: list[Any], split: str, step: int) -> Any:
    try:
        return concat(parts)
    except RolloutMockError as exc:
        raise RolloutMockError(f"[RolloutMock] cannot re-split step {step} of {split}: {exc}; replay on "
                               f"the recorded rank count instead", split=split, step=step) from exc


# ---------------------------------------------------------------------------------------------
# Prefetching in mock mode
# ---------------------------------------------------------------------------------------------

class Prefetcher:
    """Serves steps through ``load(step)``, preloading ``next_step(step)`` in the background.

    ``next_step`` runs on the caller's thread (also on an event loop, for :meth:`get_async`), so
    it must be cheap: a lookup, not I/O. ``load`` runs on a worker thread and must be safe to run
    concurrently with itself for different steps. ``enabled=False`` loads synchronously (the
    same code path a user would write by hand; :meth:`get_async` still loads off the loop).

    ``place`` (``device:`` other than ``cpu``): a load reads the step into pinned memory and copies
    its tensors to the device on a side stream, on the worker thread, so step N+1 is copied while
    step N trains; ``get`` hands the batch over on the caller's thread (its current stream waits
    for the copies: see :class:`~rollout_mock.codec.device.DevicePlacement`). The device of
    ``device: cuda`` is the caller's current one when the load is scheduled.

    ``last_stall`` is how long the most recent ``get`` waited for data, in seconds; ``hits`` and
    ``misses`` count requests served from a background load and loaded on demand.
    """

    def __init__(
        self,
        load: Callable[[int], Any],
        next_step: Callable[[int], int | None],
        *,
        enabled: bool = True,
        place: DevicePlacement | None = None,
    ) -> None:
        self._load = load
        self._next_step = next_step
        self.enabled = enabled
        self.place = place
        # Two workers: an on-demand load (async miss) never queues behind a discarded guess that
        # is still running.
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rollout-mock-prefetch")
        self._lock = threading.Lock()
        self._pending: dict[int, Future[Any]] = {}
        self.closed = False
        self.last_stall = 0.0
        self.hits = 0
        self.misses = 0

    def __repr__(self) -> str:
        return (
            f"Prefetcher(enabled={self.enabled}, pending={sorted(self._pending)}, "
            f"hits={self.hits}, misses={self.misses})"
        )

    @property
    def pending(self) -> list[int]:
        """Steps being (or already) loaded in the background, not yet served."""
        with self._lock:
            return sorted(self._pending)

    def _take(self, step: int) -> Future[Any] | None:
        with self._lock:
            future = self._pending.pop(step, None)
            if future is not None and future.cancelled():
                future = None
            if future is None:
                self.misses += 1
            else:
                self.hits += 1
            return future

    def _fetch(self, step: int, target: int | None) -> Any:
        """One load (a worker's job): the batch, or the placed batch waiting for :meth:`_deliver`."""
        if self.place is None:
            return self._load(step)
        return self.place.load(self._load, step, target)

    def _deliver(self, loaded: Any) -> Any:
        """On the caller's thread: the batch, handed over to its streams (``place``)."""
        return loaded if self.place is None else self.place.hand_off(loaded)

    def _target(self) -> int | None:
        return None if self.place is None else self.place.target()

    def _schedule_after(self, step: int) -> None:
        upcoming = self._next_step(step) if self.enabled and not self.closed else None
        target = self._target() if upcoming is not None else None
        with self._lock:
            for other in [s for s in self._pending if s != upcoming]:  # wrong guesses: drop them
                self._pending.pop(other).cancel()
            if upcoming is not None and upcoming not in self._pending and not self.closed:
                self._pending[upcoming] = self._executor.submit(self._fetch, upcoming, target)

    def load_now(self, load: Callable[[int], Any], step: int) -> Any:
        """``load(step)`` on the caller's thread, placed as this prefetcher places its steps (the
        extra calls of a step, read from their pack)."""
        if self.place is None:
            return load(step)
        return self.place.hand_off(self.place.load(load, step, self._target()))

    def get(self, step: int) -> Any:
        """The batch of ``step``; blocks only if its background load has not finished."""
        start = time.perf_counter()
        future = self._take(step)
        try:
            if future is not None:
                return self._deliver(future.result())
            return self._deliver(self._fetch(step, self._target()))
        finally:
            self.last_stall = time.perf_counter() - start
            self._schedule_after(step)

    async def get_async(self, step: int) -> Any:
        """Like :meth:`get`, without blocking the event loop (a miss loads on a worker thread)."""
        start = time.perf_counter()
        future = self._take(step)
        try:
            if future is None:
                target = self._target()
                if self.closed:
                    return self._deliver(await asyncio.get_running_loop().run_in_executor(
                        None, self._fetch, step, target))
                future = self._executor.submit(self._fetch, step, target)
            return self._deliver(await asyncio.wrap_future(future))
        finally:
            self.last_stall = time.perf_counter() - start
            self._schedule_after(step)

    def close(self) -> None:
        """Drop pending loads and stop the workers (waits for a load that is running).
        Later ``get`` calls still work, synchronously, without prefetching. Idempotent."""
        with self._lock:
            self.closed = True
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)

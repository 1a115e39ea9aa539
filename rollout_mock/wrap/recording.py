"""Dump mode: recording batches through the background writer, retention, disk estimates.

:class:`Recorder` is the dump half of :class:`~rollout_mock.wrap.interceptor.Interceptor`: it
owns the writer thread, the snapshot buffers and the retention of one stream. Its state is
declared in ``__init__``; the interceptor decides *when* to record (one dispatch per calling
convention), the recorder *how*. Hooks that run after a live call belong to the interceptor
(``Interceptor.after_live_call``), which runs on the calling thread.

Retention (``keep:``, ``max_keep``, ``pin_steps``) is decided by a
:class:`~rollout_mock.wrap.retention.Retention` and carried out here, on the writer thread: after
each step is written its batch is scanned for NaN/inf, then the ring's deletions and the pins'
index marks are made. :meth:`Recorder.observe` and :meth:`Recorder.pin` come from the training
thread; the index writes they need are queued to the writer (deletions on an object store are
sent :data:`DELETE_BATCH` steps at a time).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import rollout_mock.codec as codec
from rollout_mock.batch import count_samples
from rollout_mock.codec.scan import health_summary, nonfinite_values
from rollout_mock.config import DiskFullPolicy, RecordSettings
from rollout_mock.errors import ConfigError, DiskFullError
from rollout_mock.storage.directory import free_bytes
from rollout_mock.storage.manifest import CallRecord, StreamId, format_ranges
from rollout_mock.storage.store import BatchInfo, Store
from rollout_mock.storage.writer import BackgroundWriter, SyncWriter, WriteJob
from rollout_mock.text import logger, step_log_level
from rollout_mock.wrap.calls import elapsed
from rollout_mock.wrap.retention import MetricWatch, Plan, Retention, register, unregister

__all__ = ["DELETE_BATCH", "DRAIN_BYTES", "DRAIN_CALLS", "PACK_BYTES", "PACK_PENDING_BYTES", "Recorder"]

#: On an object store, the ring's deletions are sent once this many steps are due (two batched
#: requests: entries, then data) and at close; on a local disk at once.
DELETE_BATCH = 16
#: A pack of extra calls holds up to this many bytes (a larger call gets a pack of its own).
PACK_BYTES = 64 << 20
#: Captured extra calls waiting for the writer beyond this many bytes make the next call wait.
PACK_PENDING_BYTES = 512 << 20
#: Further calls are handed to the writer once this many (or bytes) are queued, when a new step
#: starts, and at flush/close: one pack for many calls even when the writer keeps up (a job per
#: call would cost the caller a submission and the writer a file each).
DRAIN_CALLS = 256
DRAIN_BYTES = 8 << 20


#: Extra calls are captured one after the other into one list (:class:`~rollout_mock.codec.CaptureList`:
#: one header for all of them, a replay decodes them together) until it holds this many bytes.
CALL_LIST_BYTES = DRAIN_BYTES


@dataclasses.dataclass(eq=False)
class _CallList:
    """The further calls of one pack, captured on the calling threads: their batches and their
    summaries, each one list (the writer thread writes both as they are)."""

    batches: codec.CaptureList = dataclasses.field(default_factory=codec.CaptureList)
    summaries: codec.CaptureList = dataclasses.field(default_factory=codec.CaptureList)


_Queued = tuple[Any, CallRecord, dict[str, Any], int]


def _same_pack(queued: list[_Queued], start: int, end: int, size: int) -> bool:
    """Whether queued call ``end`` goes into the pack that begins at ``start`` (``size`` bytes so
    far): a captured list is one pack; batches queued as they are fill packs of :data:`PACK_BYTES`."""
    if end == start:
        return True
    here, before = queued[end][0], queued[end - 1][0]
    if isinstance(here, _CallList) or isinstance(before, _CallList):
        return here is before
    return size < PACK_BYTES


def _members(part: list[_Queued]) -> tuple[list[tuple[Any, list[CallRecord]]], Any]:
    """A pack's members and the calls' summaries in the same order: a captured list is one
    member, its summaries one list (both closed here: nothing is encoded again); a batch queued
    as it is (a writer without a thread) is a member of its own."""
    first = part[0][0] if part else None  # no calls: a pack of drops only
    if isinstance(first, _CallList):
        return [(first.batches.close(), [record for _, record, _, _ in part])], first.summaries.close()
    return [(snap, [record]) for snap, record, _, _ in part], [call for _, _, call, _ in part]


class Recorder:
    """Writes one stream's batches (dump mode; see the module docstring).

    ``writes``: the stream is claimed for this process in ``store`` (:meth:`Store.open_writer
    <rollout_mock.storage.store.Store.open_writer>`, which the interceptor calls where it opens
    the store); false (a rank that does not write under ``ranks: one``): nothing is started and
    :meth:`records_step` is always false. ``settings`` are the dump-mode keys of the config.
    """

    def __init__(self, settings: RecordSettings, store: Store, stream: StreamId, *, writes: bool) -> None:
        self.settings = settings
        self.store = store
        self.stream = stream
        self.writes = writes
        #: steps written so far
        self.saved = 0
        #: on_disk_full=skip fired: nothing more is recorded
        self.dump_disabled = False
        self._estimated = False
        self.writer: BackgroundWriter | SyncWriter | None = None
        self.buffers: codec.BufferPool | None = None
        #: which steps are kept (``None`` on a rank that does not write)
        self.retention: Retention | None = None
        #: metric anomalies (``keep``)
        self.watch: MetricWatch | None = None
        self._doomed: list[int] = []  # deletions decided, not sent yet (object stores)
        self._deleted_count = 0
        self._capped_said = False
        self._scan_failed_said = False
        #: steps whose step file this run has recorded (their later calls go to packs)
        self._recorded: set[int] = set()
        self._lock = threading.Lock()
        #: extra calls captured and not written yet: (capture, record, call summary)
        self._pack_queue: list[_Queued] = []
        #: the list the next extra calls are captured into (handed to the writer with the queue)
        self._call_list: _CallList | None = None
        self._pack_bytes = 0
        self._pack_ready = threading.Condition()
        self._drain_queued = False
        self._drops: list[int] = []
        self._pack_seq: int | None = None
        self._old_extra_steps: set[int] | None = None
        #: extra calls written so far
        self.extra_saved = 0
        self.closed = False
        if not writes:
            return
        if settings.background:
            self.writer = BackgroundWriter(max_pending=settings.max_pending, on_error=self._on_write_error)
            self.writer.add_flush_hook(self.drain_pending)
            self.buffers = codec.BufferPool(keep=settings.max_pending)
        else:
            self.writer = SyncWriter(on_error=self._on_write_error)
        self._start_retention()

    def __repr__(self) -> str:
        return f"Recorder({self.stream}, writes={self.writes}, saved={self.saved})"

    def records_step(self, step: int) -> bool:
        return self.writes and not self.dump_disabled and self.settings.records_step(step)

    def before_rollout(self, step: int, index: int = 0) -> None:
        """Fail fast, before an expensive rollout, if its result could not be recorded: the first
        call of a step recorded by an earlier run (unless ``overwrite``). Further calls of a step
        (``index`` > 0) are recorded beside its first one."""
        if index == 0 and self.records_step(step) and step not in self._recorded:
            self.store.check_writable(self.stream, step, overwrite=self.settings.overwrite)
        if self.writer is not None and isinstance(self.writer, BackgroundWriter):
            self.writer.raise_if_failed()

    def record_call(self, step: int, index: int, batch: Any, *, method: str, seconds: float | None,
                    call: dict[str, Any], provenance: dict[str, Any] | None = None) -> None:
        """Record call ``index`` of ``step`` (dump mode, on the calling thread): the first call of
        the step to *finish* becomes its step file, as a step of one call always was (its index
        is noted in the entry when it is not 0); every later one goes to a pack of extra calls
        (:meth:`record_extra`). Concurrent calls of one step are decided under a lock."""
        with self._lock:
            first = step not in self._recorded
            if first:
                self._recorded.add(step)
        if first:
            self.drain_pending()  # a new step: the earlier steps' further calls go to disk now
            if index:
                call = {**call, "index": index}
            if provenance is not None:
                call = {**call, "provenance": provenance}
            if self.settings.overwrite and step in self._old_extra():
                with self._lock:
                    self._drops.append(step)  # its extra calls of an earlier run: superseded
                self._schedule_drain()
            self.record(step, batch, method=method, seconds=seconds, call=call)
        else:
            self.record_extra(step, index, batch, method=method, seconds=seconds, call=call, provenance=provenance)

    def _old_extra(self) -> set[int]:
        if self._old_extra_steps is None:
            self._old_extra_steps = set(self.store.extra_calls(self.stream))
        return self._old_extra_steps

    def record_extra(self, step: int, index: int, batch: Any, *, method: str, seconds: float | None,
                     call: dict[str, Any], provenance: dict[str, Any] | None = None) -> None:
        """Queue call ``index`` of ``step`` for the next pack of extra calls. The batch is captured
        now (the caller may change it once this returns); the writer thread writes everything
        queued as one pack, so many small calls cost one file write, not one each. Blocks while
        :data:`PACK_PENDING_BYTES` of captured calls wait for the writer."""
        if not self.writes or self.writer is None:
            raise ConfigError(f"[RolloutMock] {self.stream} (mode=dump): call {index} of step {step} cannot be "
                              f"recorded: this recorder does not write (a rank that does not write, or not opened)")
        request = call.get("request")
        digest = request.get("d") if isinstance(request, dict) and type(request.get("d")) is int else None
        task = call.get("task")
        record = CallRecord(step, index, method, 0, 0, "crc32:00000000", digest, seconds, count_samples(batch),
                            task=task if type(task) is int else None, provenance=provenance)
        background = isinstance(self.writer, BackgroundWriter)
        with self._pack_ready:
            while self._pack_bytes > PACK_PENDING_BYTES and self._pack_queue:
                self._pack_ready.wait()
            snap: Any = batch
            size = 0
            if background:  # captured into the open list (the writer closes it when it takes the queue)
                if self._call_list is None or self._call_list.batches.nbytes >= CALL_LIST_BYTES:
                    self._call_list = _CallList()
                snap, before = self._call_list, self._call_list.batches.nbytes
                record = dataclasses.replace(record, item=snap.batches.add(batch))
                snap.summaries.add(call)
                size = snap.batches.nbytes - before
            self._pack_queue.append((snap, record, call, size))
            self._pack_bytes += size
            due = (len(self._pack_queue) >= DRAIN_CALLS or self._pack_bytes >= DRAIN_BYTES or not background
                   or any(queued.step != step for _, queued, _, _ in self._pack_queue[:1]))
        if due:
            self._schedule_drain()

    def drain_pending(self, blocking: bool = True) -> None:
        """Have the writer write the further calls still queued (a new step, and the writer's
        flush hook: flush, close, exit, SIGTERM). ``blocking`` False (a signal handler): give up
        rather than wait for a lock the interrupted code may hold."""
        if not self._pack_ready.acquire(blocking=blocking):
            return
        try:
            pending = bool(self._pack_queue)
        finally:
            self._pack_ready.release()
        if pending:
            self._schedule_drain(blocking)

    def _schedule_drain(self, blocking: bool = True) -> None:
        if not self._lock.acquire(blocking=blocking):
            return
        try:
            if self._drain_queued:
                return
            self._drain_queued = True
        finally:
            self._lock.release()
        assert self.writer is not None
        self.writer.submit(WriteJob(self._drain, f"extra calls of {self.stream}"))

    def _drain(self) -> None:
        """Write every queued extra call: a captured list as a pack, batches queued as they are as
        packs of at most :data:`PACK_BYTES` (writer thread)."""
        with self._lock:
            self._drain_queued = False
            drops, self._drops = self._drops, []
        with self._pack_ready:
            queued, self._pack_queue = self._pack_queue, []
            self._pack_bytes, self._call_list = 0, None
            self._pack_ready.notify_all()
        if self.dump_disabled:
            return
        start = 0
        while start < len(queued) or drops:
            end, size = start, 0
            while end < len(queued) and _same_pack(queued, start, end, size):
                size += queued[end][3]
                end += 1
            part = queued[start:end]
            if self._pack_seq is None:
                self._pack_seq = self.store.next_pack_seq(self.stream)
            members, meta = _members(part)
            try:
                pack = self.store.save_pack(self.stream, self._pack_seq, members, meta, drop=drops,
                                            compression=self.settings.compression)
            finally:
                for snap in [*(member for member, _ in members), meta]:
                    if isinstance(snap, codec.Capture):
                        snap.release()
            self._pack_seq += 1
            self.extra_saved += len(part)
            drops = []
            start = end
            logger.log(step_log_level(self.extra_saved), "[RolloutMock] Dumped %d extra call(s) of step%s %s: %s "
                       "(%.2fMB)", len(part), "s" if len({r.step for _, r, _, _ in part}) > 1 else "",
                       format_ranges({r.step for _, r, _, _ in part}), self.store.where(pack.file), pack.size / 2**20)

    def record(self, step: int, batch: Any, *, method: str, seconds: float | None,
               call: dict[str, Any] | None = None, snapshot: bool = True) -> None:
        """Write ``batch`` as ``step``. With ``snapshot`` (and a background writer) it is copied
        first, so the caller may mutate it as soon as this returns; the copy is taken only once
        the writer has a free slot, so at most ``max_pending`` copies exist at a time."""
        assert self.writer is not None
        with self._lock:
            self._recorded.add(step)
        info = BatchInfo.of(batch)
        describe = f"step {step} of {self.stream}"

        def make_job() -> WriteJob:
            if not (isinstance(self.writer, BackgroundWriter) and snapshot):
                return WriteJob(lambda: self._save(step, batch, info, method, seconds, call), describe)
            health = self._health_of(step, batch)  # before the copy: the writer then never rebuilds it
            snap = codec.capture(batch, pool=self.buffers)

            def run() -> None:
                try:
                    self._save(step, snap, info, method, seconds, call, health)  # written as captured
                finally:
                    snap.release()  # written (or failed): its buffers serve the next step

            return WriteJob(run, describe)

        self.writer.submit_when_free(make_job, describe)

    def record_later(self, step: int, produce: Callable[[], Any], *, method: str, started: float,
                     call: dict[str, Any] | None = None, done: Callable[[], None] | None = None) -> None:
        """Write the batch that ``produce()`` returns on the writer thread (e.g. ``ray.get``).

        The rollout's seconds are measured from ``started`` (``time.perf_counter()`` when the
        call was made) to ``produce()`` returning: an upper bound when the writer thread was busy
        with earlier steps. ``done()`` runs once ``produce()`` has returned or raised (the
        interceptor ends the watchdog's view of the call there). If ``produce()`` itself raises,
        the rollout failed (the caller sees the same error from its own ``ray.get``): nothing is
        recorded for ``step``, which stays free for a retry, and recording goes on; only failures
        to *write* stop the dump.
        """
        with self._lock:
            self._recorded.add(step)
        def write() -> None:
            try:
                batch = produce()
                seconds = elapsed(started)
            except Exception as exc:  # noqa: BLE001 - the caller gets the error from its own ray.get
                logger.warning(
                    "[RolloutMock] step %d of %s not recorded: the rollout failed (%s: %s)",
                    step, self.stream, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                )
                return
            finally:
                if done is not None:
                    done()
            self._save(step, batch, BatchInfo.of(batch), method, seconds, call)

        assert self.writer is not None
        self.writer.submit(WriteJob(write, f"step {step} of {self.stream}"))

    def _save(self, step: int, batch: Any, info: BatchInfo, method: str, seconds: float | None,
              call: dict[str, Any] | None = None, health: dict[str, Any] | None = None) -> None:
        if self.dump_disabled:  # on_disk_full=skip fired while this step waited in the queue
            return
        entry = self.store.save(
            self.stream, step, batch, info, method=method, rollout_seconds=seconds,
            overwrite=self.settings.overwrite, call=call, compression=self.settings.compression,
        )
        self.saved += 1
        logger.log(
            step_log_level(self.saved),
            "[RolloutMock] Dumped step %d: %s (samples=%s, size=%.2fMB)",
            step,
            self.store.describe_location(self.stream, step),
            info.samples,
            entry.size / (1024 * 1024),
        )
        if not self._estimated:
            self._estimated = True
            self._log_disk_estimate(step, entry.size)
        self._record_health(step, batch if health is None else None, health)
        self._retain(step, batch, entry.size)

    def _health_of(self, step: int, batch: Any) -> dict[str, Any] | None:
        """:func:`health_summary` of ``batch`` (bounded: at most HEALTH_SAMPLE values per tensor),
        or None (said) when it cannot be taken: the step is recorded all the same."""
        try:
            return health_summary(batch)
        except Exception as exc:  # noqa: BLE001 - an odd tensor subclass must not stop the dump
            logger.warning("[RolloutMock] no health line for step %d of %s (%s: %s)", step, self.stream,
                           type(exc).__name__, str(exc)[:200])
            return None

    def _record_health(self, step: int, batch: Any, health: dict[str, Any] | None) -> None:
        """Append the step's health line through the store (writer thread):
        ``health`` as taken before the capture, or the summary of ``batch`` (a plain batch)."""
        if health is None and batch is not None and not isinstance(batch, codec.Capture):
            health = self._health_of(step, batch)
        if health is not None:
            try:
                self.store.append_health(self.stream, step, health)
            except OSError as exc:  # a full disk for a side file must not stop the dump: said
                logger.warning("[RolloutMock] no health line for step %d of %s: %s", step, self.stream, exc)

    # ------------------------------------------------------------------ retention (keep:)
    def _start_retention(self) -> None:
        keep = self.settings.keep
        existing = []
        if keep is not None and keep.ring:  # a resumed dump: its steps join the ring, its pins stay
            for step in self.store.steps(self.stream):
                entry = self.store.entry(self.stream, step)
                if entry is not None:
                    existing.append((step, entry.size, entry.pin))
        self.retention = Retention(keep, self.settings.pin_steps, existing)
        self.watch = None if keep is None else MetricWatch(keep)
        register(self)

    def _retain(self, step: int, batch: Any, size: int) -> None:
        """After ``step`` was written (writer thread): scan its batch for NaN/inf (``keep``), then
        carry out what the ring decides."""
        if self.retention is None:
            return
        if step in self._doomed:
            self._doomed.remove(step)  # rewritten before its deletion was sent
        keep = self.settings.keep
        if keep is not None and keep.nonfinite and (places := self._scan(step, batch)):
            self._carry_out(self._anomaly(step, "NaN/inf in the batch: " + ", ".join(places), detected=True))
        self._carry_out(self.retention.written(step, size))

    def _scan(self, step: int, batch: Any) -> list[str]:
        """:func:`nonfinite_values` of a written step (a batch, or the codec's capture of one,
        read in place); a batch it cannot look into is said once and recording goes on (the step
        is written: only the scan is missing)."""
        try:
            return nonfinite_values(batch)
        except Exception as exc:  # noqa: BLE001 - an odd tensor subclass must not stop the dump
            if not self._scan_failed_said:
                self._scan_failed_said = True
                logger.warning("[RolloutMock] keep: could not scan step %d of %s for NaN/inf (%s: %s); such steps "
                               "are kept only by the ring, metrics and pins", step, self.stream,
                               type(exc).__name__, str(exc)[:200])
            return []

    def observe(self, step: int, metrics: Mapping[str, Any]) -> list[str]:
        """Check a step's metrics (``keep.metrics``; NaN/inf in any metric by default): each
        anomaly keeps the step and its window, as :meth:`pin` does. Returns the anomalies (empty
        without ``keep``/``max_keep``, on a rank that does not write, after close)."""
        if self.watch is None or self.closed:
            return []
        reasons = self.watch.check(int(step), metrics)
        for reason in reasons:
            self.pin(step, reason, detected=True)
        return reasons

    def pin(self, step: int, reason: str, *, detected: bool = False) -> bool:
        """Keep ``step`` and its ``keep.before``/``keep.after`` window, with ``reason`` in the
        index (written on the writer thread, after the steps queued before). True when the step
        is kept or will be once recorded; False (with a warning) when the ring already deleted
        it, when the anomaly limit is reached (``detected``), on a rank that does not write."""
        if self.retention is None or self.writer is None:
            return False
        step = int(step)
        if self.closed:
            logger.warning("[RolloutMock] pin(%d, %r): the recorder of %s is closed; pin steps before "
                           "closing the scheduler", step, reason, self.stream)
            return False
        plan = self._anomaly(step, reason, detected=detected)
        if plan:
            self.writer.submit(WriteJob(lambda: self._carry_out(plan), f"pinning step {step} of {self.stream}"))
        return not plan.capped and step not in plan.lost

    def _anomaly(self, step: int, reason: str, *, detected: bool) -> Plan:
        """Ask the retention to keep ``step`` and its window; say what happened."""
        assert self.retention is not None
        plan = self.retention.anomaly(step, reason, detected=detected)
        keep = self.settings.keep
        if plan.capped:
            if not self._capped_said:
                self._capped_said = True
                logger.warning(
                    "[RolloutMock] keep: anomaly at step %d of %s (%s) not kept: keep.max_anomalies=%d anomalies "
                    "are kept already; later ones are only logged at DEBUG level (raise keep.max_anomalies to "
                    "keep more)", step, self.stream, reason, keep.max_anomalies if keep else 0)
            else:
                logger.debug("[RolloutMock] keep: anomaly at step %d of %s (%s) not kept (max_anomalies)",
                             step, self.stream, reason)
            return plan
        window = plan.window
        logger.warning("[RolloutMock] %s at step %d of %s: %s; keeping step%s %s", "anomaly" if detected else "pin",
                       step, self.stream, reason, "s" if len(window) > 1 else "",
                       format_ranges(window) if len(window) else step)
        if plan.lost:
            self._say_lost(step, plan.lost)
        return plan

    def _say_lost(self, step: int, lost: list[int]) -> None:
        keep = self.settings.keep
        assert self.retention is not None
        newest = self.retention.newest if self.retention.newest is not None else step
        need = newest - min(lost) + 1
        if keep is not None and keep.last is not None:
            fix = f"raise keep.last (now {keep.last}) to at least {need}"
        else:
            fix = "raise keep.max_bytes" + ("" if keep is None else f" (now {keep.max_bytes})")
        logger.warning(
            "[RolloutMock] keep: step%s %s of %s (%s) %s already deleted by the ring (newest recorded step %d): "
            "not kept. To keep steps this old when the anomaly is known, %s%s",
            "s" if len(lost) > 1 else "", format_ranges(lost), self.stream,
            "the pinned step" if lost == [step] else f"around the anomaly at step {step}",
            "were" if len(lost) > 1 else "was", newest, fix,
            "" if step not in lost else "; or pin the step as soon as it is known",
        )

    def _carry_out(self, plan: Plan) -> None:
        """Do what a retention decision asks (writer thread, or the caller with a SyncWriter)."""
        if self.retention is not None:
            for step in plan.annotate:  # the reasons now: a later plan may have run first
                self.store.pin(self.stream, step, self.retention.reasons_of(step))
        if plan.delete:
            self._doomed.extend(plan.delete)
            local = self.store.local_path() is not None
            if local or len(self._doomed) >= DELETE_BATCH:
                self._send_deletions()

    def _send_deletions(self) -> None:
        doomed, self._doomed = self._doomed, []
        if not doomed:
            return
        self.store.delete_many(self.stream, doomed)
        if self.extra_saved:  # packs of further calls whose steps are all gone go too
            self.store.prune_packs(self.stream)
        self._deleted_count += len(doomed)
        keep = self.settings.keep
        logger.log(step_log_level(self._deleted_count), "[RolloutMock] Deleted step%s %s of %s (keep: %s)",
                   "s" if len(doomed) > 1 else "", format_ranges(doomed), self.stream,
                   keep.describe() if keep is not None else "")

    def _log_disk_estimate(self, step: int, size: int) -> None:
        remaining = self.settings.steps_after(step)
        if remaining is None:
            return
        local = self.store.local_path()
        if local is None:
            return
        needed = remaining * size
        free = free_bytes(local)
        level = logging.WARNING if needed > free else logging.INFO
        logger.log(
            level,
            "[RolloutMock] disk estimate: %d more step(s) of ~%.2f MB need ~%.2f MB; %.2f MB free in %s%s",
            remaining,
            size / 1e6,
            needed / 1e6,
            free / 1e6,
            local,
            " — NOT ENOUGH: the dump will fail part-way" if needed > free else "",
        )

    def close(self, *, failed: bool, interrupted: bool, methods: list[str]) -> None:
        """Write everything pending and stop the writer (see ``Interceptor.close`` for ``failed``
        and ``interrupted``; ``methods``: the intercepted methods that were called)."""
        if self.writer is None:
            return
        self.closed = True
        unregister(self)
        # its flush hook queues the calls held back; a write failure raises here: the deletions
        # still due are not sent
        self.writer.close()
        self._send_deletions()
        if interrupted:
            logger.warning("[RolloutMock] interrupted; %d step(s) kept in %s (stream %s)",
                           self.saved, self.settings.dump_dir, self.stream)
        if not self.saved and not self.dump_disabled and not failed:
            # ROLL could return before its dump and silently record nothing: say so.
            logger.warning(
                "[RolloutMock] dump mode closed without recording any step of %s in %s: "
                "were the batches fetched through this MockScheduler (methods=%s)? "
                "Check dump_steps and the rank settings too.",
                self.stream, self.settings.dump_dir, methods or "none called",
            )

    def _on_write_error(self, job: WriteJob, exc: BaseException) -> bool:
        if isinstance(exc, DiskFullError) and self.settings.on_disk_full is DiskFullPolicy.SKIP:
            self.dump_disabled = True
            logger.error(
                "[RolloutMock] %s. on_disk_full=skip: DUMPING IS NOW DISABLED for %s; training "
                "continues, but the recording stops before %s and is incomplete.",
                exc,
                self.stream,
                job.describe,
            )
            return True
        return False

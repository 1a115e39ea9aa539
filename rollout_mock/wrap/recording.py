"""Dump mode: recording batches through the background writer, retention, disk estimates.

:class:`Recorder` is the dump half of :class:`~rollout_mock.wrap.interceptor.Interceptor`: it
owns the writer thread, the snapshot buffers and the retention of one stream. Its state is
declared in ``__init__``; the interceptor decides *when* to record (one dispatch per calling
convention), the recorder *how*. Hooks that run after a live call belong to the interceptor
(``Interceptor.after_live_call``), which runs on the calling thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import rollout_mock.codec as codec
from rollout_mock.config import DiskFullPolicy, RecordSettings
from rollout_mock.determinism.fingerprint import fingerprint
from rollout_mock.errors import DiskFullError
from rollout_mock.storage.directory import free_bytes
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.store import BatchInfo, StepStore, Store
from rollout_mock.storage.writer import BackgroundWriter, SyncWriter, WriteJob
from rollout_mock.text import logger, step_log_level
from rollout_mock.wrap.calls import elapsed

__all__ = ["Recorder"]


class Recorder:
    """Writes one stream's batches (dump mode; see the module docstring).

    ``writes`` false (a rank that does not write under ``ranks: one``): nothing is opened and
    :meth:`records_step` is always false. ``settings`` are the dump-mode keys of the config.
    """

    def __init__(self, settings: RecordSettings, store: StepStore, stream: StreamId, *, writes: bool) -> None:
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
        if not writes:
            return
        store.open_writer(stream)
        store.set_fingerprint(fingerprint())
        if settings.background:
            self.writer = BackgroundWriter(max_pending=settings.max_pending, on_error=self._on_write_error)
            self.buffers = codec.BufferPool(keep=settings.max_pending)
        else:
            self.writer = SyncWriter(on_error=self._on_write_error)

    def __repr__(self) -> str:
        return f"Recorder({self.stream}, writes={self.writes}, saved={self.saved})"

    def records_step(self, step: int) -> bool:
        return self.writes and not self.dump_disabled and self.settings.records_step(step)

    def before_rollout(self, step: int) -> None:
        """Fail fast, before an expensive rollout, if its result could not be recorded."""
        if self.records_step(step) and isinstance(self.store, Store):
            self.store.check_writable(self.stream, step, overwrite=self.settings.overwrite)
        if self.writer is not None and isinstance(self.writer, BackgroundWriter):
            self.writer.raise_if_failed()

    def record(self, step: int, batch: Any, *, method: str, seconds: float | None,
               call: dict[str, Any] | None = None, snapshot: bool = True) -> None:
        """Write ``batch`` as ``step``. With ``snapshot`` (and a background writer) it is copied
        first, so the caller may mutate it as soon as this returns; the copy is taken only once
        the writer has a free slot, so at most ``max_pending`` copies exist at a time."""
        assert self.writer is not None
        info = BatchInfo.of(batch)
        describe = f"step {step} of {self.stream}"

        def make_job() -> WriteJob:
            if not (isinstance(self.writer, BackgroundWriter) and snapshot):
                return WriteJob(lambda: self._save(step, batch, info, method, seconds, call), describe)
            snap = codec.capture(batch, pool=self.buffers)

            def run() -> None:
                try:
                    self._save(step, snap, info, method, seconds, call)  # written as captured
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
              call: dict[str, Any] | None = None) -> None:
        if self.dump_disabled:  # on_disk_full=skip fired while this step waited in the queue
            return
        entry = self.store.save(
            self.stream, step, batch, info, method=method, rollout_seconds=seconds,
            overwrite=self.settings.overwrite, call=call,
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
        if self.settings.max_keep is not None:
            self._apply_retention(self.settings.max_keep)

    def _apply_retention(self, max_keep: int) -> None:
        """Delete the oldest unpinned steps beyond ``max_keep`` (AReaL's max_keep/pin_steps)."""
        candidates = [s for s in self.store.steps(self.stream) if s not in self.settings.pin_steps]
        for old in candidates[: max(len(candidates) - max_keep, 0)]:
            self.store.delete(self.stream, old)
            logger.info("[RolloutMock] Deleted step %d of %s (max_keep=%d)", old, self.stream, max_keep)

    def _log_disk_estimate(self, step: int, size: int) -> None:
        remaining = self.settings.steps_after(step)
        if remaining is None:
            return
        local = self.store.backend.local_path("") if isinstance(self.store, Store) else None
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
        self.writer.close()
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

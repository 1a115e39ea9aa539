"""Dump mode: recording batches through the background writer, retention, disk estimates."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rollout_mock import codec
from rollout_mock._text import logger
from rollout_mock.config import DiskFullPolicy
from rollout_mock.errors import DiskFullError
from rollout_mock.storage.base import BatchInfo
from rollout_mock.storage.directory import DirectoryStore
from rollout_mock.storage.fileio import free_bytes
from rollout_mock.storage.indexed import IndexedStore
from rollout_mock.storage.writer import BackgroundWriter, SyncWriter, WriteJob

__all__ = ["RecordingMixin"]



class RecordingMixin:
    """The dump half of :class:`~rollout_mock.wrap.interceptor.Interceptor`."""

    def _open_dump(self) -> None:
        if not self.writes:
            return
        self.store.open_writer(self.stream)
        try:
            from rollout_mock.determinism import fingerprint

            self.store.set_fingerprint(fingerprint())
        except ImportError:  # pragma: no cover - determinism is part of the package
            pass
        if self.config.background:
            self._writer = BackgroundWriter(max_pending=self.config.max_pending, on_error=self._on_write_error)
            self._buffers = codec.BufferPool(keep=self.config.max_pending)
        else:
            self._writer = SyncWriter(on_error=self._on_write_error)

    def records_step(self, step: int) -> bool:
        if not self.writes or self._dump_disabled:
            return False
        steps = self.config.dump_steps
        return steps is None or step in steps

    def before_rollout(self, step: int) -> None:
        """Fail fast, before an expensive rollout, if its result could not be recorded."""
        if self.records_step(step) and isinstance(self.store, IndexedStore):
            self.store.check_writable(self.stream, step, overwrite=self.config.overwrite)
        if self._writer is not None and isinstance(self._writer, BackgroundWriter):
            self._writer.raise_if_failed()

    def record(self, step: int, batch: Any, *, method: str, seconds: float | None,
               call: dict[str, Any] | None = None, snapshot: bool = True) -> None:
        """Write ``batch`` as ``step``. With ``snapshot`` (and a background writer) it is copied
        first, so the caller may mutate it as soon as this returns; the copy is taken only once
        the writer has a free slot, so at most ``max_pending`` copies exist at a time."""
        assert self._writer is not None
        info = BatchInfo.of(batch)
        describe = f"step {step} of {self.stream}"

        def make_job() -> WriteJob:
            if not (isinstance(self._writer, BackgroundWriter) and snapshot):
                return WriteJob(lambda: self._save(step, batch, info, method, seconds, call), describe)
            snap = codec.capture(batch, pool=getattr(self, "_buffers", None))

            def run() -> None:
                try:
                    self._save(step, snap.materialize(), info, method, seconds, call)
                finally:
                    snap.release()  # written (or failed): its buffers serve the next step

            return WriteJob(run, describe)

        self._writer.submit_when_free(make_job, describe)

    def record_later(self, step: int, produce: Callable[[], Any], *, method: str, seconds: float | None,
                     call: dict[str, Any] | None = None) -> None:
        """Write the batch that ``produce()`` returns on the writer thread (e.g. ``ray.get``).

        If ``produce()`` itself raises, the rollout failed (the caller sees the same error from
        its own ``ray.get``): nothing is recorded for ``step``, which stays free for a retry,
        and recording goes on; only failures to *write* stop the dump.
        """
        def write() -> None:
            try:
                batch = produce()
            except Exception as exc:
                logger.warning(
                    "[RolloutMock] step %d of %s not recorded: the rollout failed (%s: %s)",
                    step, self.stream, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                )
                return
            self._save(step, batch, BatchInfo.of(batch), method, seconds, call)

        assert self._writer is not None
        self._writer.submit(WriteJob(write, f"step {step} of {self.stream}"))

    def _save(self, step: int, batch: Any, info: BatchInfo, method: str, seconds: float | None,
              call: dict[str, Any] | None = None) -> None:
        if self._dump_disabled:  # on_disk_full=skip fired while this step waited in the queue
            return
        entry = self.store.save(
            self.stream, step, batch, info, method=method, rollout_seconds=seconds,
            overwrite=self.config.overwrite, call=call,
        )
        self.saved += 1
        logger.info(
            "[RolloutMock] Dumped step %d: %s (samples=%s, size=%.2fMB)",
            step,
            self.store.describe_location(self.stream, step),
            info.samples,
            entry.size / (1024 * 1024),
        )
        if not self._estimated:
            self._estimated = True
            self._log_disk_estimate(step, entry.size)
        if self.config.max_keep is not None:
            self._apply_retention()

    def _apply_retention(self) -> None:
        """Delete the oldest unpinned steps beyond ``max_keep`` (AReaL's max_keep/pin_steps)."""
        assert self.config.max_keep is not None
        pinned = set(self.config.pin_steps or ())
        candidates = [s for s in self.store.steps(self.stream) if s not in pinned]
        for old in candidates[: max(len(candidates) - self.config.max_keep, 0)]:
            self.store.delete(self.stream, old)
            logger.info("[RolloutMock] Deleted step %d of %s (max_keep=%d)", old, self.stream, self.config.max_keep)

    def _log_disk_estimate(self, step: int, size: int) -> None:
        if self.config.dump_steps is not None:
            remaining = len([s for s in self.config.dump_steps if s > step])
        elif self.config.max_steps is not None:
            remaining = max(self.config.max_steps - step - 1, 0)
        else:
            return
        if not isinstance(self.store, DirectoryStore):
            return
        needed = remaining * size
        free = free_bytes(self.store.dump_dir)
        level = logging.WARNING if needed > free else logging.INFO
        logger.log(
            level,
            "[RolloutMock] disk estimate: %d more step(s) of ~%.2f MB need ~%.2f MB; %.2f MB free in %s%s",
            remaining,
            size / 1e6,
            needed / 1e6,
            free / 1e6,
            self.store.dump_dir,
            " — NOT ENOUGH: the dump will fail part-way" if needed > free else "",
        )

    def _on_write_error(self, job: WriteJob, exc: BaseException) -> bool:
        if isinstance(exc, DiskFullError) and self.config.on_disk_full is DiskFullPolicy.SKIP:
            self._dump_disabled = True
            logger.error(
                "[RolloutMock] %s. on_disk_full=skip: DUMPING IS NOW DISABLED for %s; training "
                "continues, but the recording stops before %s and is incomplete.",
                exc,
                self.stream,
                job.describe,
            )
            return True
        return False

"""Writing recorded steps off the caller's thread.

:class:`BackgroundWriter` runs jobs on one daemon thread, in submission order, through a bounded
queue: when ``max_pending`` jobs wait, :meth:`~BackgroundWriter.submit` blocks (back-pressure
instead of unbounded memory). A failed job is never lost: its error is raised by the next
:meth:`submit`, by :meth:`flush` and by :meth:`close`, as :class:`~rollout_mock.errors.WriterError`
with the original exception as ``__cause__``; jobs queued after a failure are dropped (a dump with
a hole in it is worse than a dump that stops). Every writer still open at interpreter exit is
flushed by an ``atexit`` hook. :class:`SyncWriter` has the same interface and writes in ``submit``.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollout_mock.errors import WriterError

logger = logging.getLogger("rollout_mock")


@dataclass
class WriteJob:
    """One step to write. ``run`` does the work; ``describe`` names it in errors."""

    run: Callable[[], Any]
    describe: str


#: Called with (job, exception); returns True when the error was handled (e.g. a disk-full
#: policy that disables dumping) and must not be raised to the caller.
ErrorHandler = Callable[[WriteJob, BaseException], bool]


class SyncWriter:
    """Runs each job inside :meth:`submit`; the same interface as :class:`BackgroundWriter`."""

    def __init__(self, *, on_error: ErrorHandler | None = None) -> None:
        self._on_error = on_error
        self.closed = False

    def __repr__(self) -> str:
        return "SyncWriter()"

    def submit(self, job: WriteJob) -> None:
        if self.closed:
            raise WriterError(f"cannot write {job.describe}: the writer is closed")
        try:
            job.run()
        except BaseException as exc:
            if self._on_error is not None and self._on_error(job, exc):
                return
            raise

    def flush(self) -> None:
        """Nothing is ever pending."""

    def close(self) -> None:
        self.closed = True


_OPEN_WRITERS: weakref.WeakSet[BackgroundWriter] = weakref.WeakSet()


def _flush_at_exit() -> None:
    for writer in list(_OPEN_WRITERS):
        try:
            writer.close()
        except Exception as exc:  # at exit there is nobody left to raise to: say it loudly
            logger.error("[RolloutMock] writing recorded steps failed at exit: %s", exc)


atexit.register(_flush_at_exit)


class BackgroundWriter:
    """A single writer thread fed through a bounded queue (see the module docstring)."""

    def __init__(self, *, max_pending: int = 2, on_error: ErrorHandler | None = None) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self._queue: queue.Queue[WriteJob | None] = queue.Queue(maxsize=max_pending)
        self._on_error = on_error
        self._error: BaseException | None = None
        self._failed_job: str | None = None
        self._reported = False
        self.closed = False
        self._thread = threading.Thread(target=self._run, name="rollout-mock-writer", daemon=True)
        self._thread.start()
        _OPEN_WRITERS.add(self)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._queue.qsize()} pending"
        return f"BackgroundWriter({state})"

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                if self._error is not None:
                    logger.error("[RolloutMock] not writing %s: an earlier write failed", job.describe)
                    continue
                try:
                    job.run()
                except BaseException as exc:
                    if self._on_error is not None and self._on_error(job, exc):
                        continue
                    self._error = exc
                    self._failed_job = job.describe
            finally:
                self._queue.task_done()

    def raise_if_failed(self) -> None:
        """Raise the writer's first failure (every call raises it again until closed)."""
        if self._error is not None:
            raise WriterError(
                f"[RolloutMock] writing {self._failed_job} failed in the background: {self._error}"
            ) from self._error

    def submit(self, job: WriteJob) -> None:
        """Queue ``job``; blocks while ``max_pending`` jobs wait. Raises an earlier failure."""
        if self.closed:
            raise WriterError(f"cannot write {job.describe}: the writer is closed")
        self.raise_if_failed()
        self._queue.put(job)

    def flush(self) -> None:
        """Wait until every queued job is written; raise a failure if one happened."""
        if not self.closed:
            self._queue.join()
        self.raise_if_failed()

    def close(self) -> None:
        """Flush, stop the thread, and raise a failure if one happened. Idempotent."""
        if not self.closed:
            self._queue.join()
            self._queue.put(None)
            self._thread.join()
            self.closed = True
            _OPEN_WRITERS.discard(self)
        if self._error is not None and not self._reported:
            self._reported = True
            self.raise_if_failed()

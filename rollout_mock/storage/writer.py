"""Writing recorded steps off the caller's thread.

:class:`BackgroundWriter` runs jobs on one daemon thread, in submission order, with at most
``max_pending`` jobs unfinished (queued or being written): a further
:meth:`~BackgroundWriter.submit` blocks until one is done (back-pressure instead of unbounded
memory). A failed job is never lost: its error is raised by the next
:meth:`submit`, by :meth:`flush` and by :meth:`close`, as :class:`~rollout_mock.errors.WriterError`
with the original exception as ``__cause__``; jobs queued after a failure are dropped (a dump with
a hole in it is worse than a dump that stops). Every writer still open at interpreter exit is
flushed by an ``atexit`` hook. :class:`SyncWriter` has the same interface and writes in ``submit``.

Memory: the writer drops its references to a job (and so to the batch snapshot the job holds) as
soon as the job finishes, successfully or not (a failure keeps the exception, with its traceback
as text in a note instead of frame objects), so with ``max_pending=1`` at most one snapshot is
alive.

SIGTERM (what SLURM, Kubernetes and torchrun send before killing a job): the first submit from
the main thread installs a handler (chaining the one it replaces; none is installed when SIGTERM
is ignored or has a non-Python handler). On SIGTERM it waits up to :data:`SIGTERM_FLUSH_TIMEOUT`
seconds for the queued steps of every open writer to be written, then hands the signal on: to
the previous Python handler, or, if that was the default action, by restoring it and re-sending
SIGTERM, so the process still ends "killed by SIGTERM" (exit status 143 in a shell). While nothing
is pending it hands the signal on at once. It is removed when the last writer closes (from the
main thread, and only if it is still the installed handler).
"""

from __future__ import annotations

import atexit
import os
import queue
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollout_mock.errors import WriterError
from rollout_mock.text import logger

__all__ = ["BackgroundWriter", "ErrorHandler", "SyncWriter", "WriteJob"]



@dataclass
class WriteJob:
    """One step to write. ``run`` does the work; ``describe`` names it in errors."""

    run: Callable[[], Any]
    describe: str


#: Called with (job, exception); returns True when the error was handled (e.g. a disk-full
#: policy that disables dumping) and must not be raised to the caller.
ErrorHandler = Callable[[WriteJob, BaseException], bool]


def _detach_traceback(exc: BaseException) -> None:
    """Keep ``exc`` (and its cause/context chain) without its traceback objects, whose frames
    would keep the failed job, and so the batch it was writing, alive; the traceback is kept as
    text in a note (shown when the error is printed)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        tb = current.__traceback__
        if tb is not None and sys.version_info >= (3, 11):
            current.add_note("[RolloutMock] where the write failed:\n" + "".join(traceback.format_tb(tb)).rstrip())
            traceback.clear_frames(tb)
            current.__traceback__ = None
        current = current.__cause__ or current.__context__


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

    def submit_when_free(self, make_job: Callable[[], WriteJob], describe: str) -> None:
        """Build the job and run it at once (there is always a free slot)."""
        if self.closed:
            raise WriterError(f"[RolloutMock] cannot write {describe}: the writer is closed")
        self.submit(make_job())

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

#: Seconds a SIGTERM waits for queued steps to be written before the signal is handed on
#: (schedulers wait ~30 s between SIGTERM and SIGKILL: SLURM's KillWait, Kubernetes' grace period).
SIGTERM_FLUSH_TIMEOUT = 20.0

_sigterm_lock = threading.RLock()  # re-entrant: the handler may interrupt its own install
#: The SIGTERM handler ours replaced, while ours is installed; ``None`` otherwise.
_previous_sigterm: Any = None


def _install_sigterm_handler() -> None:
    """Install :func:`_on_sigterm` (main thread only; see the module docstring)."""
    global _previous_sigterm
    if _previous_sigterm is not None or threading.current_thread() is not threading.main_thread():
        return
    with _sigterm_lock:
        if _previous_sigterm is not None:
            return
        try:
            previous = signal.getsignal(signal.SIGTERM)
            if previous is None or previous is signal.SIG_IGN or previous is _on_sigterm:
                return  # a C-level handler we could not chain, or SIGTERM ignored: leave it
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # pragma: no cover - e.g. an embedded interpreter
            return
        _previous_sigterm = previous


def _uninstall_sigterm_handler() -> None:
    """Put the previous SIGTERM handler back, if ours is still the installed one."""
    global _previous_sigterm
    if threading.current_thread() is not threading.main_thread():
        return
    with _sigterm_lock:
        previous, _previous_sigterm = _previous_sigterm, None
        if previous is not None and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, previous)


def _flush_for_signal(timeout: float) -> None:
    """Wait (at most ``timeout`` seconds in all) until no open writer has pending steps."""
    for writer in list(_OPEN_WRITERS):
        writer.run_flush_hooks(blocking=False)  # (a signal handler: never wait for a lock)
    writers = [w for w in list(_OPEN_WRITERS) if w.pending]
    if not writers:
        return
    pending = sum(w.pending for w in writers)
    logger.warning(
        "[RolloutMock] SIGTERM: writing %d queued step(s) before exiting (waiting up to %.0f s)",
        pending, timeout,
    )
    deadline = time.monotonic() + timeout
    for writer in writers:
        writer.wait_idle(max(deadline - time.monotonic(), 0.0))
    left = sum(w.pending for w in writers)
    if left:
        logger.error(
            "[RolloutMock] SIGTERM: %d queued step(s) still not written after %.0f s; they are lost "
            "(raise rollout_mock.storage.writer.SIGTERM_FLUSH_TIMEOUT if the scheduler allows it)",
            left, timeout,
        )
    else:
        logger.warning("[RolloutMock] SIGTERM: all %d queued step(s) written", pending)


def _on_sigterm(signum: int, frame: Any) -> None:
    previous = _previous_sigterm
    _flush_for_signal(SIGTERM_FLUSH_TIMEOUT)
    if callable(previous):
        previous(signum, frame)
        return
    # The default action (or no record of a previous handler): die by the signal, as without us.
    _uninstall_sigterm_handler()
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
    os._exit(128 + signum)  # pragma: no cover - only if the signal is blocked in this thread


class BackgroundWriter:
    """A single writer thread fed through a bounded queue (see the module docstring).

    ``max_pending`` counts every job submitted and not yet finished, including the one being
    written: with ``max_pending=1`` a second :meth:`submit` waits until the first job is done.
    So at most ``max_pending`` captured batches are held by the writer at any time.
    """

    def __init__(self, *, max_pending: int = 2, on_error: ErrorHandler | None = None) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.max_pending = max_pending
        self._queue: queue.SimpleQueue[WriteJob | None] = queue.SimpleQueue()
        self._slots = threading.BoundedSemaphore(max_pending)
        self._unfinished = 0
        self._idle = threading.Condition()
        self._close_lock = threading.Lock()
        self._on_error = on_error
        self._flush_hooks: list[Callable[[bool], None]] = []
        self._error: BaseException | None = None
        self._failed_job: str | None = None
        self._reported = False
        self._frames_cleared = False
        self.closed = False
        self._thread = threading.Thread(target=self._run, name="rollout-mock-writer", daemon=True)
        self._thread.start()
        _OPEN_WRITERS.add(self)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._unfinished} pending"
        if self._error is not None:
            state += f", failed on {self._failed_job}"
        return f"BackgroundWriter({state}, max_pending={self.max_pending})"

    @property
    def pending(self) -> int:
        """Jobs submitted and not finished yet (queued or being written)."""
        return self._unfinished

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._execute(job)
            finally:
                # Drop the finished job (and the snapshot it holds) before anyone can see this
                # slot free: a lingering reference would keep max_pending+1 snapshots alive.
                job = None
                if self._error is not None and not self._frames_cleared:
                    self._frames_cleared = True
                    _detach_traceback(self._error)
                self._slots.release()
                with self._idle:
                    self._unfinished -= 1
                    self._idle.notify_all()

    def _execute(self, job: WriteJob) -> None:
        if self._error is not None:
            logger.error(
                "[RolloutMock] not writing %s: writing %s failed earlier", job.describe, self._failed_job
            )
            return
        try:
            job.run()
        except BaseException as exc:
            try:
                handled = self._on_error is not None and self._on_error(job, exc)
            except BaseException as handler_exc:  # a broken handler must not kill the thread
                handler_exc.__context__ = exc
                exc, handled = handler_exc, False
            if not handled:
                self._failed_job = job.describe
                self._error = exc

    def raise_if_failed(self) -> None:
        """Raise the writer's first failure as :class:`WriterError` (again on every call)."""
        if self._error is not None:
            raise WriterError(
                f"[RolloutMock] writing {self._failed_job} failed in the background: "
                f"{type(self._error).__name__}: {self._error}. Steps submitted after it were not "
                f"written; fix the cause and re-dump them."
            ) from self._error

    def submit(self, job: WriteJob) -> None:
        """Queue ``job``; blocks while ``max_pending`` jobs are unfinished. Raises an earlier
        failure (and then drops ``job``)."""
        self.submit_when_free(lambda: job, job.describe)

    def submit_when_free(self, make_job: Callable[[], WriteJob], describe: str) -> None:
        """Like :meth:`submit`, but ``make_job()`` (e.g. taking the in-memory snapshot) runs only
        once a slot is free, so at most ``max_pending`` snapshots exist at any time."""
        if self.closed:
            raise WriterError(f"[RolloutMock] cannot write {describe}: the writer is closed")
        self.raise_if_failed()
        self._slots.acquire()
        if self._error is not None:  # failed while we waited for a slot
            self._slots.release()
            self.raise_if_failed()
        try:
            job = make_job()
        except BaseException:
            self._slots.release()
            raise
        with self._idle:
            self._unfinished += 1
        self._queue.put(job)
        del job
        _install_sigterm_handler()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no job is pending (at most ``timeout`` seconds); True if none is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._unfinished:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def add_flush_hook(self, hook: Callable[[bool], None]) -> None:
        """Run ``hook(blocking)`` first whenever the writer is flushed or closed (at exit and on
        SIGTERM too): it submits the work its owner still holds back (the recorder's queued
        calls). ``blocking`` is False from a signal handler: the hook must not wait for a lock."""
        self._flush_hooks.append(hook)

    def run_flush_hooks(self, *, blocking: bool = True) -> None:
        for hook in list(self._flush_hooks):
            hook(blocking)

    def _wait_idle(self) -> None:
        self.run_flush_hooks()
        self.wait_idle()

    def flush(self) -> None:
        """Wait until every queued job is written; raise a failure if one happened."""
        self._wait_idle()
        self.raise_if_failed()

    def close(self) -> None:
        """Flush, stop the thread, and raise a failure not raised by an earlier ``close``.

        Idempotent: later calls do nothing. Safe to call from several threads (and from the
        interpreter-exit hook) at once.
        """
        with self._close_lock:
            if not self.closed:
                self._wait_idle()
                self._queue.put(None)
                self._thread.join()
                self.closed = True
                _OPEN_WRITERS.discard(self)
                if not _OPEN_WRITERS:
                    _uninstall_sigterm_handler()
            if self._error is None or self._reported:
                return
            self._reported = True
        self.raise_if_failed()

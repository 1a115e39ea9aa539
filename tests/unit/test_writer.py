"""BackgroundWriter / SyncWriter: ordering, back-pressure, error surfacing, close.

Every wait is bounded: a bug shows up as a failed assertion, never as a hung test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from conftest import HANG_S

from rollout_mock import WriterError
from rollout_mock.storage.writer import BackgroundWriter, SyncWriter, WriteJob

WAIT = HANG_S  # a hang bound only: each wait returns as soon as its event happens


def job(run: Callable[[], object], name: str = "job") -> WriteJob:
    return WriteJob(run, name)


def blocked_job(release: threading.Event, started: threading.Event | None = None) -> WriteJob:
    def run() -> None:
        if started is not None:
            started.set()
        assert release.wait(WAIT), "test never released the job"

    return WriteJob(run, "blocked job")


def submit_in_thread(writer: BackgroundWriter, item: WriteJob) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    """Submit from another thread; the Event is set once ``submit`` returned."""
    returned = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            writer.submit(item)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)
        finally:
            returned.set()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, returned, errors


class Boom(RuntimeError):
    pass


def failing(message: str = "disk on fire") -> Callable[[], None]:
    def run() -> None:
        raise Boom(message)

    return run


@pytest.fixture
def writer() -> BackgroundWriter:
    w = BackgroundWriter(max_pending=4)
    yield w
    try:
        w.close()
    except WriterError:
        pass


# ------------------------------------------------------------------ ordering
def test_jobs_run_in_submission_order_on_one_thread(writer: BackgroundWriter) -> None:
    done: list[int] = []
    threads: set[str] = set()

    def record(i: int) -> Callable[[], None]:
        def run() -> None:
            threads.add(threading.current_thread().name)
            done.append(i)

        return run

    for i in range(50):
        writer.submit(job(record(i), f"step {i}"))
    writer.flush()
    assert done == list(range(50))
    assert threads == {"rollout-mock-writer"}


def test_flush_waits_for_the_running_job(writer: BackgroundWriter) -> None:
    release, started = threading.Event(), threading.Event()
    writer.submit(blocked_job(release, started))
    assert started.wait(WAIT)
    flushed = threading.Event()
    thread = threading.Thread(target=lambda: (writer.flush(), flushed.set()), daemon=True)
    thread.start()
    assert not flushed.wait(0.2), "flush returned while a job was still running"
    release.set()
    assert flushed.wait(WAIT)
    assert writer.pending == 0


# ------------------------------------------------------------------ back-pressure
def test_max_pending_one_blocks_the_second_submit_until_the_first_finishes() -> None:
    writer = BackgroundWriter(max_pending=1)
    release, started = threading.Event(), threading.Event()
    writer.submit(blocked_job(release, started))
    assert started.wait(WAIT)
    ran = threading.Event()
    thread, returned, errors = submit_in_thread(writer, job(ran.set, "second"))
    assert not returned.wait(0.3), "submit did not block although max_pending jobs were unfinished"
    assert writer.pending == 1
    release.set()
    assert returned.wait(WAIT), "submit still blocked after the first job finished"
    thread.join(WAIT)
    assert not errors
    writer.close()
    assert ran.is_set()


def test_max_pending_counts_queued_and_running_jobs() -> None:
    writer = BackgroundWriter(max_pending=3)
    release, started = threading.Event(), threading.Event()
    writer.submit(blocked_job(release, started))
    assert started.wait(WAIT)
    writer.submit(job(lambda: None, "queued 1"))
    writer.submit(job(lambda: None, "queued 2"))  # 3 unfinished: still fits
    assert writer.pending == 3
    _, returned, _ = submit_in_thread(writer, job(lambda: None, "fourth"))
    assert not returned.wait(0.3)
    release.set()
    assert returned.wait(WAIT)
    writer.close()
    assert writer.pending == 0


def test_max_pending_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_pending must be at least 1"):
        BackgroundWriter(max_pending=0)


# ------------------------------------------------------------------ errors
def test_failure_surfaces_on_next_submit_with_cause(writer: BackgroundWriter) -> None:
    writer.submit(job(failing(), "step 3 of train"))
    with pytest.raises(WriterError) as info:
        writer.flush()
    assert isinstance(info.value.__cause__, Boom)
    with pytest.raises(WriterError, match=r"writing step 3 of train failed in the background: Boom: disk on fire") as info:
        writer.submit(job(lambda: None, "step 4 of train"))
    assert isinstance(info.value.__cause__, Boom)


def test_failure_surfaces_on_submit_without_flush() -> None:
    writer = BackgroundWriter(max_pending=1)
    writer.submit(job(failing(), "step 0"))
    # max_pending=1: this submit waits for the failing job, then must raise its error.
    with pytest.raises(WriterError) as info:
        writer.submit(job(lambda: None, "step 1"))
    assert isinstance(info.value.__cause__, Boom)
    with pytest.raises(WriterError):
        writer.close()


def test_failure_surfaces_at_close_once_and_close_is_idempotent() -> None:
    writer = BackgroundWriter()
    writer.submit(job(failing("at close"), "step 9"))
    with pytest.raises(WriterError, match="step 9") as info:
        writer.close()
    assert isinstance(info.value.__cause__, Boom)
    assert writer.closed
    writer.close()  # second close: nothing left to report, no error
    writer.close()
    with pytest.raises(WriterError, match="the writer is closed"):
        writer.submit(job(lambda: None, "late"))


def test_jobs_after_a_failure_are_dropped(writer: BackgroundWriter) -> None:
    ran: list[str] = []
    release, started = threading.Event(), threading.Event()
    writer.submit(blocked_job(release, started))
    assert started.wait(WAIT)
    writer.submit(job(failing(), "bad"))
    writer.submit(job(lambda: ran.append("after"), "after"))  # queued before the failure happened
    release.set()
    with pytest.raises(WriterError):
        writer.flush()
    assert ran == []
    with pytest.raises(WriterError):
        writer.submit(job(lambda: ran.append("later"), "later"))
    with pytest.raises(WriterError):
        writer.close()
    assert ran == []


def test_handled_errors_are_not_raised_and_writing_continues() -> None:
    seen: list[str] = []

    def on_error(failed: WriteJob, exc: BaseException) -> bool:
        seen.append(f"{failed.describe}: {exc}")
        return True

    writer = BackgroundWriter(on_error=on_error)
    ran: list[int] = []
    writer.submit(job(failing("full"), "step 1"))
    writer.submit(job(lambda: ran.append(2), "step 2"))
    writer.close()
    assert seen == ["step 1: full"]
    assert ran == [2]


def test_a_broken_error_handler_is_surfaced_and_does_not_kill_the_thread() -> None:
    def on_error(failed: WriteJob, exc: BaseException) -> bool:
        raise KeyError("handler bug")

    writer = BackgroundWriter(max_pending=1, on_error=on_error)
    writer.submit(job(failing(), "step 1"))
    with pytest.raises(WriterError) as info:
        writer.flush()  # would hang forever if the writer thread had died
    assert isinstance(info.value.__cause__, KeyError)
    assert isinstance(info.value.__cause__.__context__, Boom)
    with pytest.raises(WriterError):
        writer.close()


def test_base_exceptions_in_jobs_are_captured() -> None:
    writer = BackgroundWriter()
    writer.submit(job(lambda: (_ for _ in ()).throw(KeyboardInterrupt()), "step 1"))
    with pytest.raises(WriterError) as info:
        writer.close()
    assert isinstance(info.value.__cause__, KeyboardInterrupt)


def test_concurrent_close_calls_report_the_error_once() -> None:
    writer = BackgroundWriter()
    writer.submit(job(failing(), "step 1"))
    raised: list[BaseException] = []

    def close() -> None:
        try:
            writer.close()
        except WriterError as exc:
            raised.append(exc)

    threads = [threading.Thread(target=close) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert len(raised) == 1
    assert writer.closed


def test_repr_names_state() -> None:
    writer = BackgroundWriter(max_pending=2)
    assert repr(writer) == "BackgroundWriter(0 pending, max_pending=2)"
    writer.close()
    assert repr(writer) == "BackgroundWriter(closed, max_pending=2)"


# ------------------------------------------------------------------ SyncWriter
def test_sync_writer_runs_in_submit_and_raises_directly() -> None:
    ran: list[int] = []
    writer = SyncWriter()
    writer.submit(job(lambda: ran.append(1)))
    assert ran == [1]
    with pytest.raises(Boom):
        writer.submit(job(failing()))
    writer.close()
    with pytest.raises(WriterError, match="closed"):
        writer.submit(job(lambda: None))

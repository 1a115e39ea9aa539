"""Recording stays correct with odd call arguments, bad steps, SIGTERM and tight memory bounds."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cfg

from rollout_mock import DirectoryStore, MockScheduler, ReplayMismatchError, RolloutMockError, WriterError, codec
from rollout_mock.errors import StepArgumentError
from rollout_mock.storage import Store
from rollout_mock.storage import writer as writer_module
from rollout_mock.storage.writer import BackgroundWriter, WriteJob


class Scheduler:
    def __init__(self) -> None:
        self.calls = 0

    def get_batch(self, data: Any, global_step: int | None = None, **sampling: Any) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"x": torch.arange(64, dtype=torch.float32) + self.calls}

    def generate_rollout(self, args: Any, rollout_id: Any) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"y": torch.zeros(4)}


class Request:
    def __init__(self, **meta: Any) -> None:
        self.meta_info = meta


# ------------------------------------------------------------------------------ inf / nan arguments
@pytest.mark.parametrize("background", [True, False])
def test_non_finite_keyword_arguments_do_not_stop_recording(dump_dir: Path, background: bool) -> None:
    mock = MockScheduler(Scheduler(), cfg(dump_dir, background=background))
    mock.get_batch(None, global_step=0, temperature=float("inf"))
    mock.get_batch(None, global_step=1, temperature=float("nan"), top_p=float("-inf"))
    mock.get_batch(None, global_step=2, temperature=1.0)
    mock.close()
    store = DirectoryStore(dump_dir)
    stream = mock.interceptor.stream
    assert store.steps(stream) == [0, 1, 2]
    assert store.entry(stream, 0).call["kwargs"] == {"global_step": 0, "temperature": "Infinity"}
    assert store.entry(stream, 1).call["kwargs"]["temperature"] == "NaN"
    assert store.entry(stream, 1).call["kwargs"]["top_p"] == "-Infinity"
    json.loads((dump_dir / "manifest.json").read_text())  # strict JSON (no bare NaN/Infinity)
    assert "Infinity" not in (dump_dir / "manifest.json").read_text().replace('"Infinity"', "").replace('"-Infinity"', "")


def test_mock_mode_compares_non_finite_arguments_exactly(dump_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    recorder = MockScheduler(Scheduler(), cfg(dump_dir))
    recorder.get_batch(None, global_step=0, temperature=float("nan"))
    recorder.get_batch(None, global_step=1, temperature=float("inf"))
    recorder.close()
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    mock = MockScheduler(None, cfg(dump_dir, "mock"))
    mock.get_batch(None, global_step=0, temperature=float("nan"))  # NaN equals NaN
    mock.get_batch(None, global_step=1, temperature=float("inf"))
    assert "asks for other data" not in caplog.text
    mock.close()
    mock = MockScheduler(None, cfg(dump_dir, "mock"))
    with pytest.raises(ReplayMismatchError) as info:
        mock.get_batch(None, global_step=1, temperature=0.7)
    assert "temperature: inf in the dump run, 0.7 now" in str(info.value)
    assert info.value.recorded == "inf" and info.value.live == "0.7"
    mock.close()


def test_recorded_call_arguments_stay_bounded(dump_dir: Path) -> None:
    mock = MockScheduler(Scheduler(), cfg(dump_dir))
    mock.get_batch("p" * 1_000_000, global_step=0, huge=10**5000, **{f"k{i}": i for i in range(100)})
    mock.get_batch("p" * 1_000_000, global_step=1, other="q" * 1_000_000)
    mock.close()
    assert (dump_dir / "manifest.json").stat().st_size < 20_000
    call = DirectoryStore(dump_dir).entry(mock.interceptor.stream, 0).call
    assert call["args"][0].startswith("ppp") and "1000000 chars" in call["args"][0]
    assert call["omitted"] > 0
    # different long strings still compare different
    assert _summary("a" * 10_000) != _summary("a" * 9_999 + "b")


def _summary(text: str) -> Any:
    from rollout_mock.wrap.calls import call_summary

    return call_summary((text,), {})


# ------------------------------------------------------------------------------ global_step
BAD_STEPS = [1.9, "abc", "3", True, torch.tensor([1, 2]), torch.tensor([3]), np.array([3]), -1,
             np.int64(-2), float("inf"), float("nan"), torch.tensor(2.5), object()]


@pytest.mark.parametrize("value", BAD_STEPS, ids=[repr(v)[:20] for v in BAD_STEPS])
@pytest.mark.parametrize("how", ["keyword", "positional", "meta_info", "meta_info_verl", "rollout_id"])
def test_a_bad_step_is_an_error_before_the_rollout(dump_dir: Path, value: Any, how: str) -> None:
    real = Scheduler()
    mock = MockScheduler(real, cfg(dump_dir), methods=("get_batch", "generate_rollout"))
    with pytest.raises(StepArgumentError) as info:
        if how == "keyword":
            mock.get_batch(None, global_step=value)
        elif how == "positional":
            mock.get_batch(None, value)
        elif how == "meta_info":
            mock.get_batch(Request(global_step=value))
        elif how == "meta_info_verl":
            mock.get_batch(Request(global_steps=value))
        else:
            mock.generate_rollout(None, value)
    error = info.value
    assert isinstance(error, RolloutMockError) and isinstance(error, ValueError)
    method = "generate_rollout" if how == "rollout_id" else "get_batch"
    message = str(error)
    assert error.method == method and method in message
    assert error.argument in message and error.value in message
    assert {"keyword": "global_step", "meta_info": "meta_info['global_step']",
            "meta_info_verl": "meta_info['global_steps']", "rollout_id": "<step parameter at position 1>",
            "positional": "<step parameter at position 1>"}[how] == error.argument
    assert "non-negative int" in message and "mode=dump" in message and error.mode == "dump"
    assert len(message) < 500
    assert real.calls == 0, "the rollout ran although its step could not be recorded"
    assert mock.interceptor.next_step == 0, "the counter moved on a refused call"
    mock.close()


GOOD_STEPS = [3, 3.0, np.int64(3), np.int32(3), torch.tensor(3), torch.tensor(3, dtype=torch.int16),
              np.array(3), np.float64(3.0)]


@pytest.mark.parametrize("value", GOOD_STEPS, ids=[repr(v) for v in GOOD_STEPS])
def test_an_integral_scalar_step_is_taken_exactly(dump_dir: Path, value: Any) -> None:
    mock = MockScheduler(Scheduler(), cfg(dump_dir))
    mock.get_batch(Request(global_steps=value))
    mock.get_batch(None, global_step=value + 2)
    mock.close()
    assert DirectoryStore(dump_dir).steps(mock.interceptor.stream) == [3, 5]
    assert mock.interceptor.next_step == 6


def test_calls_without_a_step_use_the_counter(dump_dir: Path) -> None:
    mock = MockScheduler(Scheduler(), cfg(dump_dir))
    mock.get_batch(None)
    mock.get_batch(Request(other=1))
    mock.get_batch(None, global_step=None)
    mock.close()
    assert DirectoryStore(dump_dir).steps(mock.interceptor.stream) == [0, 1, 2]


def test_a_bad_step_is_an_error_in_mock_mode_too(dump_dir: Path) -> None:
    recorder = MockScheduler(Scheduler(), cfg(dump_dir))
    recorder.get_batch(None, global_step=1)
    recorder.close()
    mock = MockScheduler(None, cfg(dump_dir, "mock"))
    with pytest.raises(StepArgumentError, match=r"get_batch \(mode=mock, split=train\).*global_step=1\.9"):
        mock.get_batch(None, global_step=1.9)
    mock.close()


# ------------------------------------------------------------------------------ snapshots
def _tracking_capture(monkeypatch: pytest.MonkeyPatch) -> tuple[list[weakref.ref[Any]], list[int]]:
    """Record a weak reference to every snapshot, and how many were alive when each was taken."""
    refs: list[weakref.ref[Any]] = []
    alive_before: list[int] = []
    real = codec.capture

    def capture(obj: Any, **kwargs: Any) -> Any:
        alive_before.append(sum(r() is not None for r in refs))
        snapshot = real(obj, **kwargs)
        refs.append(weakref.ref(snapshot))
        return snapshot

    monkeypatch.setattr(codec, "capture", capture)
    return refs, alive_before


def test_max_pending_1_keeps_at_most_one_snapshot(dump_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refs, alive_before = _tracking_capture(monkeypatch)
    mock = MockScheduler(Scheduler(), cfg(dump_dir, max_pending=1))
    for step in range(4):
        mock.get_batch(None, global_step=step)
    mock.interceptor.flush()
    assert len(refs) == 4
    assert alive_before == [0, 0, 0, 0], "an older snapshot was still alive when a new one was taken"
    assert [r() for r in refs] == [None] * 4, "the writer kept a finished job's snapshot"
    mock.close()


def test_a_failed_job_does_not_keep_its_snapshot(dump_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refs, _ = _tracking_capture(monkeypatch)
    original_save = Store.save

    def failing_save(self: Store, stream: Any, step: int, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if step == 1:
            raise OSError("injected write failure")
        return original_save(self, stream, step, batch, *args, **kwargs)

    monkeypatch.setattr(Store, "save", failing_save)
    mock = MockScheduler(Scheduler(), cfg(dump_dir, max_pending=1))
    mock.get_batch(None, global_step=0)
    mock.get_batch(None, global_step=1)
    writer = mock.interceptor._writer
    assert isinstance(writer, BackgroundWriter)
    deadline = time.monotonic() + 30
    while writer.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.pending == 0
    assert [r() for r in refs] == [None, None], "the kept failure holds the failed step's snapshot"
    with pytest.raises(WriterError, match="injected write failure") as info:
        mock.interceptor.flush()
    assert isinstance(info.value.__cause__, OSError)
    assert "failing_save" in "\n".join(info.value.__cause__.__notes__), "the traceback text was lost"
    with pytest.raises(WriterError):
        mock.close()


# ------------------------------------------------------------------------------ SIGTERM (in process)
@pytest.fixture
def fresh_writers(monkeypatch: pytest.MonkeyPatch) -> None:
    """No writer of another test counts as open; the SIGTERM state is restored afterwards."""
    if threading.current_thread() is not threading.main_thread():  # pragma: no cover
        pytest.skip("signal handlers need the main thread")
    monkeypatch.setattr(writer_module, "_OPEN_WRITERS", weakref.WeakSet())
    monkeypatch.setattr(writer_module, "_previous_sigterm", None, raising=False)
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def _slow_jobs(writer: BackgroundWriter, done: list[int], count: int, seconds: float) -> None:
    for i in range(count):
        writer.submit(WriteJob(lambda i=i: (time.sleep(seconds), done.append(i)), f"job {i}"))


def test_sigterm_writes_pending_steps_then_calls_the_previous_handler(fresh_writers: None) -> None:
    seen: list[tuple[int, int]] = []
    done: list[int] = []

    def previous(signum: int, frame: Any) -> None:
        seen.append((signum, len(done)))

    signal.signal(signal.SIGTERM, previous)
    writer = BackgroundWriter(max_pending=8)
    assert signal.getsignal(signal.SIGTERM) is previous, "installed before any work was queued"
    _slow_jobs(writer, done, 4, 0.05)
    assert signal.getsignal(signal.SIGTERM) is not previous
    signal.raise_signal(signal.SIGTERM)
    assert seen == [(signal.SIGTERM, 4)]
    writer.close()
    assert signal.getsignal(signal.SIGTERM) is previous, "not removed when the last writer closed"


def test_sigterm_waits_a_bounded_time(fresh_writers: None, monkeypatch: pytest.MonkeyPatch,
                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(writer_module, "SIGTERM_FLUSH_TIMEOUT", 0.2, raising=False)
    seen: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    done: list[int] = []
    writer = BackgroundWriter(max_pending=2)
    _slow_jobs(writer, done, 1, 1.5)
    start = time.perf_counter()
    signal.raise_signal(signal.SIGTERM)
    assert time.perf_counter() - start < 1.0 and seen == [signal.SIGTERM] and done == []
    assert "still not written" in caplog.text
    writer.close()
    assert done == [0]


def test_no_handler_when_sigterm_is_ignored(fresh_writers: None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    writer = BackgroundWriter(max_pending=2)
    _slow_jobs(writer, [], 1, 0.0)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    writer.close()


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("background", [True, False])
def test_a_second_call_with_a_step_this_run_recorded_is_kept_beside_the_first(
        tmp_path: Path, overwrite: bool, background: bool) -> None:
    """verl's validation in several batches calls generate_sequences twice with one global_steps:
    the second batch must not replace the first (a replay would serve one for both), even with
    overwrite (meant for steps of an earlier run): both are recorded, as calls 0 and 1 of the step,
    and a replay serves each its own batch, in order, then refuses a third call."""
    from rollout_mock.errors import ReplayMismatchError

    calls: list[int] = []

    class Rollout:
        def get_batch(self, data: int, global_step: int) -> dict[str, torch.Tensor]:
            calls.append(data)
            return {"x": torch.tensor([global_step, data])}

    dump_dir = tmp_path / "d"
    with MockScheduler(Rollout(), cfg(dump_dir, overwrite=overwrite, background=background)) as mock:
        mock.get_batch(1, 0)
        mock.get_batch(2, 0)
        mock.get_batch(3, 1)
    assert calls == [1, 2, 3]
    with MockScheduler(None, cfg(dump_dir, "mock", match_on=["step"])) as mock:
        assert mock.get_batch(0, 0)["x"].tolist() == [0, 1] and mock.get_batch(0, 0)["x"].tolist() == [0, 2]
        assert mock.get_batch(0, 1)["x"].tolist() == [1, 3]
        with pytest.raises(ReplayMismatchError, match="made 2 call"):
            mock.get_batch(0, 0)

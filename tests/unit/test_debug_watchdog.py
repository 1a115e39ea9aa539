"""The stall watchdog: a deliberately hanging scheduler leaves a stack file naming the hang."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import pytest
from conftest import HANG_S, cfg, wait_until

from rollout_mock import MockScheduler, load_config
from rollout_mock.config.model import WatchdogConfig
from rollout_mock.wrap.watchdog import StallWatchdog


class HangingScheduler:
    """Step ``hang_at`` hangs until the watchdog has reported it (an event: a busy machine wakes the
    watchdog late, never too early), then ``extra`` seconds more."""

    def __init__(self, hang_at: int, stalls: Path | None = None, extra: float = 0.0) -> None:
        self.hang_at, self.stalls, self.extra = hang_at, stalls, extra

    def get_batch(self, data: object, global_step: int) -> dict[str, list[int]]:
        if global_step == self.hang_at:
            deliberately_hanging_rollout(self.stalls, self.extra)
        return {"input_ids": [global_step]}


def deliberately_hanging_rollout(stalls: Path | None, extra: float) -> None:
    assert stalls is not None
    wait_until(lambda: _stall_files(stalls.parent), "the watchdog never reported the hanging call")
    time.sleep(extra)


def _stall_files(dump_dir: Path) -> list[Path]:
    return sorted((dump_dir / "stalls").glob("stall-*.txt"))


def test_hanging_call_writes_the_stacks_once(dump_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = cfg(dump_dir, watchdog={"absolute_seconds": 0.5, "min_seconds": 0.0})
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    # after the report the call hangs 3x the limit more: the watchdog wakes again and must not repeat it
    with MockScheduler(HangingScheduler(hang_at=1, stalls=dump_dir / "stalls", extra=1.5), config) as mock:
        mock.get_batch(None, 0)
        started = time.monotonic()
        mock.get_batch(None, 1)
        assert time.monotonic() - started >= 0.5  # a lower bound: true however busy the machine is
    files = _stall_files(dump_dir)
    assert len(files) == 1, files  # once per stall, although the call ran 4x the limit
    text = files[0].read_text()
    assert "get_batch(step 1)" in text
    assert "deliberately_hanging_rollout" in text
    assert "--- thread MainThread" in text
    assert files[0].name.endswith(f"-{__import__('os').getpid()}.txt")
    assert any("STALL" in r.getMessage() and "deliberately_hanging_rollout" in r.getMessage() for r in caplog.records)


def test_no_report_when_nothing_stalls(dump_dir: Path) -> None:
    config = cfg(dump_dir, watchdog={"absolute_seconds": 5.0})
    with MockScheduler(HangingScheduler(hang_at=-1), config) as mock:
        for step in range(20):
            mock.get_batch(None, step)
        thread = mock.interceptor.watchdog._thread
        assert thread is not None and thread.is_alive()
    assert not thread.is_alive()  # closed with the scheduler
    assert not (dump_dir / "stalls").exists()


def test_relative_limit_catches_a_slow_gap(tmp_path: Path) -> None:
    """Gaps of ~1 ms, then a long one: over 10 x the median (min_seconds 0.2), under no absolute."""
    watchdog = StallWatchdog(WatchdogConfig(factor=10, min_seconds=0.2, absolute_seconds=None), directory=tmp_path)
    try:
        for i in range(5):
            with watchdog.watch(f"call {i}"):
                pass
            time.sleep(0.001)
        limit, why = watchdog.limit("gap")
        assert limit == pytest.approx(0.2) and "median" in why
        wait_until(lambda: watchdog.reports, "the watchdog never reported the gap")  # late on a busy machine
        assert len(watchdog.reports) == 1
        assert "no intercepted call" in watchdog.reports[0].read_text()
    finally:
        watchdog.close()


def test_pending_asyncio_tasks_are_listed(tmp_path: Path) -> None:
    watchdog = StallWatchdog(WatchdogConfig(absolute_seconds=0.3), directory=tmp_path)

    async def waiting_for_a_reply_forever() -> None:  # until the watchdog has reported it (HANG_S at most)
        deadline = time.monotonic() + HANG_S
        while not watchdog.reports and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def main() -> None:
        watchdog.note_loop(asyncio.get_running_loop())
        task = asyncio.create_task(waiting_for_a_reply_forever(), name="stuck-task")
        with watchdog.watch("async call"):
            await task

    thread = threading.Thread(target=asyncio.run, args=(main(),))
    thread.start()
    thread.join(timeout=HANG_S)
    watchdog.close()
    assert watchdog.reports, "the watchdog never reported the pending task"
    text = watchdog.reports[0].read_text()
    assert "stuck-task" in text and "waiting_for_a_reply_forever" in text


def test_config_block() -> None:
    assert load_config({"watchdog": False}).watchdog.enable is False
    config = load_config({"watchdog": {"factor": 5, "absolute_seconds": None}})
    assert config.watchdog.factor == 5 and config.watchdog.absolute_seconds is None
    with pytest.raises(Exception, match="watchdog"):
        load_config({"watchdog": {"factr": 5}})

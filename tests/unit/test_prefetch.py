"""Prefetcher: the right step is always served; wrong guesses are discarded; errors surface on
the requested step only; the async variant keeps the event loop free; a step that takes longer
than a load hides the load. Uses a fake loader with counters and events, not timings."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HANG_S, cfg

from rollout_mock import MockScheduler
from rollout_mock.storage.reader import Prefetcher

WAIT = HANG_S  # a hang bound only: each wait returns as soon as its event happens


class FakeLoader:
    """``load(step)`` returns ``{"step": step}``; counts calls and threads; can fail or block."""

    def __init__(self, *, fail: set[int] | None = None, last: int | None = None) -> None:
        self.calls: Counter[int] = Counter()
        self.threads: list[str] = []
        self.fail = fail or set()
        self.last = last
        self.gate: threading.Event | None = None  # when set, loads wait for it
        self.gates: dict[int, threading.Event] = {}  # per step: the load of it waits for it
        self.loaded: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def event(self, step: int) -> threading.Event:
        with self._lock:
            return self.loaded.setdefault(step, threading.Event())

    def __call__(self, step: int) -> dict[str, int]:
        with self._lock:
            self.calls[step] += 1
            self.threads.append(threading.current_thread().name)
        try:
            gate = self.gates.get(step, self.gate)
            if gate is not None:
                assert gate.wait(WAIT), "test never opened the gate"
            if step in self.fail:
                raise OSError(f"step {step} is corrupt")
            return {"step": step}
        finally:
            self.event(step).set()

    def next_step(self, step: int) -> int | None:
        if self.last is not None and step >= self.last:
            return None
        return step + 1


def make(loader: FakeLoader, **kwargs: Any) -> Prefetcher:
    return Prefetcher(loader, loader.next_step, **kwargs)


def test_sequential_steps_are_served_from_background_loads() -> None:
    loader = FakeLoader(last=5)
    prefetcher = make(loader)
    try:
        for step in range(6):
            if step:
                assert loader.event(step).wait(WAIT)  # "training" outlasts the load
            assert prefetcher.get(step) == {"step": step}
        assert prefetcher.misses == 1 and prefetcher.hits == 5
        assert all(count == 1 for count in loader.calls.values())  # each step loaded once
        assert set(loader.calls) == set(range(6))  # nothing after the last step
        assert loader.threads[0] == "MainThread"
        assert all(name.startswith("rollout-mock-prefetch") for name in loader.threads[1:])
    finally:
        prefetcher.close()


def test_resume_discards_the_wrong_guess_and_serves_the_requested_step() -> None:
    loader = FakeLoader()
    prefetcher = make(loader)
    try:
        assert prefetcher.get(0) == {"step": 0}
        assert loader.event(1).wait(WAIT)
        assert prefetcher.pending == [1]
        assert prefetcher.get(10) == {"step": 10}  # resumed from a checkpoint at step 10
        assert prefetcher.misses == 2 and prefetcher.hits == 0
        assert prefetcher.pending == [11]  # the guess for 1 is gone, 11 is the new one
        assert loader.event(11).wait(WAIT)
        assert prefetcher.get(11) == {"step": 11}
        assert prefetcher.hits == 1
    finally:
        prefetcher.close()


def test_skipped_step_is_loaded_afresh() -> None:
    loader = FakeLoader()
    prefetcher = make(loader)
    try:
        prefetcher.get(0)
        assert prefetcher.get(2) == {"step": 2}  # step 1 skipped
        assert loader.calls[2] == 1
        assert prefetcher.pending == [3]
    finally:
        prefetcher.close()


def test_repeating_a_step_keeps_the_guess_for_the_next() -> None:
    loader = FakeLoader()
    prefetcher = make(loader)
    try:
        prefetcher.get(3)
        assert loader.event(4).wait(WAIT)
        first = prefetcher.get(3)
        second = prefetcher.get(3)
        assert first == second == {"step": 3}
        assert first is not second  # every request gets its own batch
        assert loader.calls[4] == 1  # the prefetched step 4 was not thrown away and reloaded
        assert prefetcher.get(4) == {"step": 4}
        assert prefetcher.hits == 1
    finally:
        prefetcher.close()


def test_a_background_error_is_raised_on_the_requested_step_only() -> None:
    loader = FakeLoader(fail={2})
    prefetcher = make(loader)
    try:
        assert prefetcher.get(1) == {"step": 1}  # step 2 fails in the background: not raised here
        assert loader.event(2).wait(WAIT)
        with pytest.raises(OSError, match="step 2 is corrupt"):
            prefetcher.get(2)
        assert prefetcher.get(3) == {"step": 3}  # and the prefetcher keeps working
    finally:
        prefetcher.close()


def test_the_error_of_a_discarded_guess_is_dropped() -> None:
    loader = FakeLoader(fail={2})
    prefetcher = make(loader)
    try:
        prefetcher.get(1)
        assert loader.event(2).wait(WAIT)
        assert prefetcher.get(7) == {"step": 7}
    finally:
        prefetcher.close()


def test_disabled_loads_synchronously_on_the_caller_thread() -> None:
    loader = FakeLoader()
    prefetcher = make(loader, enabled=False)
    try:
        for step in range(3):
            assert prefetcher.get(step) == {"step": step}
        assert set(loader.threads) == {"MainThread"}
        assert prefetcher.pending == [] and prefetcher.misses == 3
    finally:
        prefetcher.close()


def test_stall_is_near_zero_when_the_step_outlasts_the_load() -> None:
    loader = FakeLoader(last=3)
    loader.gates[1] = threading.Event()  # the load of step 1 is held until the gate opens
    prefetcher = make(loader)
    try:
        prefetcher.get(0)
        assert not loader.event(1).wait(0.05)
        loader.gates[1].set()  # "training step 0" ends after the load: step 1 is ready
        assert loader.event(1).wait(WAIT)
        prefetcher.get(1)
        assert prefetcher.hits == 1
        assert prefetcher.last_stall < 0.05
    finally:
        prefetcher.close()


def test_close_drops_pending_loads_and_later_gets_still_work() -> None:
    loader = FakeLoader()
    prefetcher = make(loader)
    prefetcher.get(0)
    prefetcher.close()
    prefetcher.close()
    assert prefetcher.pending == []
    assert prefetcher.get(5) == {"step": 5}
    assert prefetcher.pending == []


# ------------------------------------------------------------------ async
def test_async_serves_right_steps_and_does_not_block_the_loop() -> None:
    loader = FakeLoader()
    loader.gate = threading.Event()
    prefetcher = make(loader)

    async def main() -> None:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                if ticks == 5:
                    loader.gate.set()  # the loop kept running while the load was blocked
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        assert await asyncio.wait_for(prefetcher.get_async(0), WAIT) == {"step": 0}
        assert ticks >= 5
        assert await asyncio.wait_for(prefetcher.get_async(1), WAIT) == {"step": 1}
        assert await asyncio.wait_for(prefetcher.get_async(9), WAIT) == {"step": 9}  # resume
        task.cancel()

    try:
        asyncio.run(main())
        assert prefetcher.hits == 1 and prefetcher.misses == 2
        assert "MainThread" not in loader.threads
    finally:
        prefetcher.close()


def test_async_error_surfaces_on_the_requested_step() -> None:
    loader = FakeLoader(fail={1})
    prefetcher = make(loader)

    async def main() -> None:
        await prefetcher.get_async(0)
        with pytest.raises(OSError, match="step 1 is corrupt"):
            await asyncio.wait_for(prefetcher.get_async(1), WAIT)
        assert await prefetcher.get_async(2) == {"step": 2}

    try:
        asyncio.run(main())
    finally:
        prefetcher.close()


# ------------------------------------------------------------------ through MockScheduler
class Scheduler:
    def get_batch(self, data: Any, global_step: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((4,), float(global_step))}


def test_mock_scheduler_replays_the_right_step_after_resume_and_skip(dump_dir: Path) -> None:
    with MockScheduler(Scheduler(), cfg(dump_dir, background=True)) as mock:
        for step in range(8):
            mock.get_batch(None, step)
    with MockScheduler(None, cfg(dump_dir, "mock"), spec=Scheduler) as mock:
        for step in (0, 1, 2, 6, 7, 3, 3, 5):  # sequential, skip ahead, go back, repeat
            assert mock.get_batch(None, step)["x"][0].item() == step

"""Loading the next recorded step while the current one trains.

:class:`Prefetcher` serves ``get(step)`` from a background load started when the previous step
was served, and then starts loading the step after. A guess that turns out wrong (a resumed run,
a skipped step, ``step`` set by hand) is simply discarded: the requested step is always the one
returned, loaded afresh if it was not the guess. Errors of a background load (a corrupt file) are
raised when that step is requested, and only then: the error of a discarded guess is dropped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["Prefetcher"]


class Prefetcher:
    """Serves steps through ``load(step)``, preloading ``next_step(step)`` in the background.

    ``next_step`` runs on the caller's thread (also on an event loop, for :meth:`get_async`), so
    it must be cheap: a lookup, not I/O. ``load`` runs on a worker thread and must be safe to run
    concurrently with itself for different steps. ``enabled=False`` loads synchronously (the
    same code path a user would write by hand; :meth:`get_async` still loads off the loop).

    ``last_stall`` is how long the most recent ``get`` waited for data, in seconds; ``hits`` and
    ``misses`` count requests served from a background load and loaded on demand.
    """

    def __init__(
        self,
        load: Callable[[int], Any],
        next_step: Callable[[int], int | None],
        *,
        enabled: bool = True,
    ) -> None:
        self._load = load
        self._next_step = next_step
        self.enabled = enabled
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

    def _schedule_after(self, step: int) -> None:
        upcoming = self._next_step(step) if self.enabled and not self.closed else None
        with self._lock:
            for other in [s for s in self._pending if s != upcoming]:  # wrong guesses: drop them
                self._pending.pop(other).cancel()
            if upcoming is not None and upcoming not in self._pending and not self.closed:
                self._pending[upcoming] = self._executor.submit(self._load, upcoming)

    def get(self, step: int) -> Any:
        """The batch of ``step``; blocks only if its background load has not finished."""
        start = time.perf_counter()
        future = self._take(step)
        try:
            if future is not None:
                return future.result()
            return self._load(step)
        finally:
            self.last_stall = time.perf_counter() - start
            self._schedule_after(step)

    async def get_async(self, step: int) -> Any:
        """Like :meth:`get`, without blocking the event loop (a miss loads on a worker thread)."""
        start = time.perf_counter()
        future = self._take(step)
        try:
            if future is None:
                if self.closed:
                    return await asyncio.get_running_loop().run_in_executor(None, self._load, step)
                future = self._executor.submit(self._load, step)
            return await asyncio.wrap_future(future)
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

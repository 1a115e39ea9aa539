"""Loading the next recorded step while the current one trains.

:class:`Prefetcher` serves ``get(step)`` from a background load started when the previous step
was served, and then starts loading the step after. A guess that turns out wrong (a resumed run,
a skipped step, ``step`` set by hand) is simply discarded: the requested step is always the one
returned. Errors of a background load (a corrupt file) are raised when that step is requested,
not before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class Prefetcher:
    """Serves steps through ``load(step)``, preloading ``next_step(step)`` in the background.

    ``enabled=False`` loads synchronously (the same code path a user would write by hand).
    ``last_stall`` is how long the most recent ``get`` waited for data, in seconds.
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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-mock-prefetch")
        self._pending: dict[int, Future[Any]] = {}
        self.last_stall = 0.0
        self.hits = 0
        self.misses = 0

    def __repr__(self) -> str:
        return f"Prefetcher(enabled={self.enabled}, pending={sorted(self._pending)})"

    def _take(self, step: int) -> Future[Any] | None:
        future = self._pending.pop(step, None)
        for stale in self._pending.values():  # a wrong guess: drop it
            stale.cancel()
        self._pending.clear()
        return future

    def _schedule_after(self, step: int) -> None:
        if not self.enabled:
            return
        upcoming = self._next_step(step)
        if upcoming is not None and upcoming not in self._pending:
            self._pending[upcoming] = self._executor.submit(self._load, upcoming)

    def get(self, step: int) -> Any:
        """The batch of ``step``; blocks only if its background load has not finished."""
        start = time.perf_counter()
        future = self._take(step)
        try:
            if future is not None:
                self.hits += 1
                return future.result()
            self.misses += 1
            return self._load(step)
        finally:
            self.last_stall = time.perf_counter() - start
            self._schedule_after(step)

    async def get_async(self, step: int) -> Any:
        """Like :meth:`get`, without blocking the event loop (the load runs on the worker)."""
        start = time.perf_counter()
        future = self._take(step)
        try:
            if future is None:
                self.misses += 1
                future = self._executor.submit(self._load, step)
            else:
                self.hits += 1
            return await asyncio.wrap_future(future)
        finally:
            self.last_stall = time.perf_counter() - start
            self._schedule_after(step)

    def close(self) -> None:
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        self._executor.shutdown(wait=True)

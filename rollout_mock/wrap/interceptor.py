"""The record/replay engine behind :class:`~rollout_mock.MockScheduler`.

An :class:`Interceptor` owns one stream (split, optional scheduler name, optional rank) of one
dump directory and knows how to run an intercepted call in the current mode:

* dump mode: call the real method, capture its batch, hand it to the writer, return it;
* mock mode: serve the recorded batch (through the prefetcher); the real method is never called.

It is independent of *how* the scheduler is wrapped: :class:`~rollout_mock.MockScheduler` (a
proxy object around an instance or a Ray actor handle) and :func:`~rollout_mock.mock_class` (a
subclass, so that interception happens inside a Ray actor) both drive it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rollout_mock._text import logger
from rollout_mock.config import RankPolicy, RolloutMockConfig
from rollout_mock.debug.watchdog import StallWatchdog
from rollout_mock.storage.base import StepStore
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.prefetch import Prefetcher
from rollout_mock.storage.stores import open_store
from rollout_mock.storage.writer import BackgroundWriter, SyncWriter
from rollout_mock.wrap.calls import (
    STATE_VERSION,
    _distributed_rank,
    _hmac_key,
    call_summary,
    describe_call,
    elapsed,
    step_from_call,
)
from rollout_mock.wrap.recording import RecordingMixin
from rollout_mock.wrap.replay import ReplayMixin
from rollout_mock.wrap.rng import RngHook  # [replay_rng]

__all__ = ["Interceptor"]



class Interceptor(RecordingMixin, ReplayMixin):
    """Runs intercepted calls for one stream in the configured mode (see the module docstring)."""

    def __init__(
        self,
        config: RolloutMockConfig,
        *,
        split: str = "train",
        name: str | None = None,
        store: StepStore | None = None,
        rank: int | None = None,
    ) -> None:
        if not config.enable:
            raise ValueError("Interceptor needs an enabled config")
        self.config = config
        self.mode = config.mode
        self.split = split
        name = name if name is not None else config.name
        self.rank = _distributed_rank() if rank is None else rank
        per_rank = config.ranks is RankPolicy.ALL and self.rank is not None
        self.stream = StreamId(split, name, self.rank if per_rank else None)
        #: dump mode: whether this process writes (only ``dump_rank`` unless ranks: all).
        self.writes = self.mode.records and (
            per_rank or self.rank is None or self.rank == config.dump_rank
        )
        self.store = store or open_store(
            config.dump_dir, storage_options=config.storage_options, hmac_key=_hmac_key(config),
            verify=config.verify_checksum,
        )
        self._next_step = 0
        self._lock = threading.Lock()
        self._dump_disabled = False
        self._call_warned: set[str] = set()
        #: steps written by this interceptor, and the intercepted methods called at all
        self.saved = 0
        self._methods_seen: set[str] = set()
        self._estimated = False
        self._writer: BackgroundWriter | SyncWriter | None = None
        self._prefetcher: Prefetcher | None = None
        self.closed = False
        #: stall reports go to {dump_dir}/stalls/ (not from dump ranks that never touch the dump)
        self.watchdog = None if not config.watchdog.enable else StallWatchdog(
            config.watchdog, directory=config.dump_dir if self.writes or self.mode.replays else None,
            label=str(self.stream))
        if self.mode.records:
            self._open_dump()
        else:
            self._open_mock()
        self.rng = RngHook(enabled=config.replay_rng is True, store=self.store, stream=self.stream,  # [replay_rng]
                           overwrite=config.overwrite)
        logger.info(
            "[RolloutMock] Rollout Mock enabled: mode=%s, dir=%s, scheduler_mode=%s, format=pickle%s",
            self.mode.value,
            config.dump_dir,
            split,
            "" if self.stream.key == split else f", stream={self.stream.key}",
        )

    def __repr__(self) -> str:
        return f"Interceptor(mode={self.mode.value}, stream={self.stream}, store={self.store!r})"

    @property
    def next_step(self) -> int:
        """The step the next call without an explicit step will use."""
        return self._next_step

    @next_step.setter
    def next_step(self, value: int) -> None:
        self._next_step = int(value)

    def resolve_step(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], position: int | None,
                     method: str | None = None) -> int:
        """The call's own step (exact; a bad one raises
        :class:`~rollout_mock.errors.StepArgumentError`), or the counter's next one when the
        call carries no step at all. Either way the counter continues after it."""
        explicit = step_from_call(
            args, kwargs, position, method=method, mode=self.mode.value, split=self.split
        )
        with self._lock:
            step = self._next_step if explicit is None else explicit
            self._next_step = step + 1
        return step

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "stream": self.stream.key, "next_step": self._next_step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != STATE_VERSION or "next_step" not in state:
            raise ValueError(f"not a rollout_mock scheduler state: {dict(state)!r}")
        self._next_step = int(state["next_step"])

    def _next_recorded(self, step: int) -> int | None:
        candidate = step + 1
        return candidate if self.store.contains(self.stream, candidate) else None

    def check_call(self, step: int, method: str, call: dict[str, Any]) -> None:
        """Mock mode: warn (once per method) when a call's plain arguments differ from the
        recorded call's — e.g. another ``batch_size`` than the dump was made with."""
        if method in self._call_warned:
            return
        entry = self.store.entry(self.stream, self.config.dump_step(step))
        recorded = None if entry is None else entry.call
        if recorded is None or recorded == call:
            return
        self._call_warned.add(method)
        logger.warning(
            "[RolloutMock] step %d of %s: %s is called with %s, but the recorded call was %s; the "
            "replayed batch is the recorded one (e.g. its batch size), not what this call asks for. "
            "Further mismatches of %s are not reported.",
            step, self.stream, method, describe_call(call), describe_call(recorded), method,
        )

    def begin(self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any],
              position: int | None) -> tuple[int, dict[str, Any]]:
        """Start an intercepted call: its step and plain-argument summary. Mock mode checks the
        call against the recorded one; dump mode fails fast if the step cannot be recorded.
        A step argument that is present but not a non-negative integer raises
        :class:`~rollout_mock.errors.StepArgumentError` here, before the real rollout runs."""
        self._methods_seen.add(method)
        step = self.resolve_step(args, kwargs, position, method)
        call = call_summary(args, kwargs)
        if self.mode.replays:
            self.check_call(step, method, call)
        else:
            self.before_rollout(step)
        return step, call

    def call(self, method: str, real: Callable[..., Any] | None, args: tuple[Any, ...],
             kwargs: dict[str, Any], position: int | None,
             resolve: Callable[[], Callable[..., Any]] | None = None) -> Any:
        """Run one intercepted plain call: replay, or call ``real`` and record its batch.

        ``resolve`` builds the real method on demand (mock mode, ``on_missing_step: record``)."""
        step, call = self.begin(method, args, kwargs, position)
        with self._watching(method, step):
            if self.mode.replays:
                source = self.replay_source(step)
                if source is not None:
                    served = self.replay_at(source)
                    self.rng.after_replay(source)  # [replay_rng]
                    return served
                real = self._live(method, real, resolve)
                start = time.perf_counter()
                batch = real(*args, **kwargs)
                self.record_missing(self.config.dump_step(step), batch, method=method, seconds=elapsed(start), call=call)
                return batch
            assert real is not None, "dump mode always has the real scheduler"
            rng_before = self.rng.before() if self.records_step(step) else None  # [replay_rng]
            start = time.perf_counter()
            batch = real(*args, **kwargs)
            if self.records_step(step):
                self.record(step, batch, method=method, seconds=elapsed(start), call=call)
                self.rng.after_call(step, rng_before, self._writer)  # [replay_rng]
            return batch

    async def call_async(self, method: str, real: Callable[..., Any] | None, args: tuple[Any, ...],
                         kwargs: dict[str, Any], position: int | None,
                         resolve: Callable[[], Callable[..., Any]] | None = None) -> Any:
        """Like :meth:`call` for ``async def`` methods; capture and I/O stay off the event loop."""
        step, call = self.begin(method, args, kwargs, position)
        if self.watchdog is not None:
            self.watchdog.note_loop(asyncio.get_running_loop())
        with self._watching(method, step):
            if self.mode.replays:
                source = self.replay_source(step)
                if source is not None:
                    served = await self.replay_at_async(source)
                    self.rng.after_replay(source)  # [replay_rng]
                    return served
                real = self._live(method, real, resolve)
                start = time.perf_counter()
                batch = await real(*args, **kwargs)
                seconds = elapsed(start)
                target = self.config.dump_step(step)
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: self.record_missing(target, batch, method=method, seconds=seconds, call=call)
                )
                return batch
            assert real is not None, "dump mode always has the real scheduler"
            rng_before = self.rng.before() if self.records_step(step) else None  # [replay_rng]
            start = time.perf_counter()
            batch = await real(*args, **kwargs)
            if self.records_step(step):
                seconds = elapsed(start)
                self.rng.after_call(step, rng_before, self._writer)  # [replay_rng]
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: self.record(step, batch, method=method, seconds=seconds, call=call)
                )
            return batch

    def _watching(self, method: str, step: int) -> AbstractContextManager[None]:
        return nullcontext() if self.watchdog is None else self.watchdog.watch(f"{method}(step {step})")

    def _live(self, method: str, real: Callable[..., Any] | None,
              resolve: Callable[[], Callable[..., Any]] | None) -> Callable[..., Any]:
        """The real method for ``on_missing_step: record``, or a ConfigError saying what is missing."""
        if real is None and resolve is not None:
            real = resolve()
        if real is None:
            from rollout_mock.errors import ConfigError

            raise ConfigError(
                f"[RolloutMock] on_missing_step=record (mode=mock, split={self.split}): a step of "
                f"{self.stream} is not recorded and there is no real scheduler to run {method}: pass "
                f"the scheduler, or factory=<callable that builds it>, to MockScheduler",
                mode=self.mode.value, split=self.split,
            )
        return real

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Write everything pending, stop background threads, release locks. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.watchdog is not None:
            self.watchdog.close()
        try:
            if self._writer is not None:
                self._writer.close()
                if not self.saved and not self._dump_disabled:
                    # ROLL could return before its dump and silently record nothing: say so.
                    logger.warning(
                        "[RolloutMock] dump mode closed without recording any step of %s in %s: "
                        "were the batches fetched through this MockScheduler (methods=%s)? "
                        "Check dump_steps and the rank settings too.",
                        self.stream, self.config.dump_dir, sorted(self._methods_seen) or "none called",
                    )
        finally:
            if self._prefetcher is not None:
                self._prefetcher.close()
            self.store.close()

"""The record/replay engine behind :class:`~rollout_mock.MockScheduler`.

An :class:`Interceptor` owns one stream (split, optional scheduler name, optional rank) of one
dump directory and knows how to run an intercepted call in the current mode:

* dump mode: call the real method, capture its batch, hand it to the writer, return it;
* mock mode: check that the call asks for what the dump run's call of that step asked for
  (request matching), then serve the recorded batch (through the prefetcher); the real method
  is never called;
* check mode: the same check, then call the real method *and* load the recorded batch, compare
  the two (the verdict is written beside the dump) and serve one of them.

It is independent of *how* the scheduler is wrapped: :class:`~rollout_mock.MockScheduler` (a
proxy object around an instance or a Ray actor handle) and :func:`~rollout_mock.mock_class` (a
subclass, so that interception happens inside a Ray actor) both drive it.

Dispatch: one method per calling convention (:meth:`Interceptor.call`, :meth:`~Interceptor.call_async`,
:meth:`~Interceptor.call_remote`), each the same sequence — :meth:`~Interceptor.begin` (step,
call summary, request digest), the stall watchdog around the call, :meth:`~Interceptor.source_of`
(the recorded step that serves it, request matching), then either the replayed batch
(:meth:`~Interceptor.after_replayed_call`) or the real method, timed, its batch recorded
(:meth:`~Interceptor.after_live_call`) or checked. The configuration is resolved once
(:func:`~rollout_mock.config.config_parts`); what the halves share is opened once, here: the
store, the stream's claim (dump mode, a rank that writes: with the writer's fingerprint and how
its methods are called) and the device placement (mock and check mode). Each half gets its part
and what was opened for it: the dump half is a
:class:`~rollout_mock.wrap.recording.Recorder`, the mock half a
:class:`~rollout_mock.wrap.replay.Replayer` (plus a :class:`~rollout_mock.wrap.check.Checker` in
check mode), request matching a :class:`~rollout_mock.wrap.mismatch.RequestMatcher`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rollout_mock.codec import BufferPool
from rollout_mock.codec.device import DevicePlacement
from rollout_mock.config import ConfigParts
from rollout_mock.determinism.fingerprint import fingerprint
from rollout_mock.errors import ConfigError
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.store import Store, open_store
from rollout_mock.storage.writer import BackgroundWriter, SyncWriter
from rollout_mock.text import logger
from rollout_mock.wrap.calls import (
    STATE_VERSION,
    StepCalls,
    _distributed_rank,
    call_summary,
    elapsed,
    step_from_call,
)
from rollout_mock.wrap.check import Checker
from rollout_mock.wrap.hooks import run_step_hooks
from rollout_mock.wrap.matching import Request
from rollout_mock.wrap.mismatch import KeyFunction, RequestMatcher
from rollout_mock.wrap.recording import Recorder
from rollout_mock.wrap.replay import Recorded, Replayer
from rollout_mock.wrap.rng import RngHook
from rollout_mock.wrap.watchdog import StallWatchdog

__all__ = ["Interceptor"]

#: Dump mode: what is recorded of a live batch (``None``: the batch itself), e.g. AReaL's remote
#: tensor handles replaced by their values; the caller still gets the live batch.
Capture = Callable[[Any], Any]
#: Dump mode: a small JSON-able description recorded with a call, e.g. the weight versions of its
#: samples (``None``: nothing).
Provenance = Callable[[Any], "dict[str, Any] | None"]


class Interceptor:
    """Runs intercepted calls for one stream in the configured mode (see the module docstring).

    ``match_keys``: per-method request key functions (see
    :meth:`~rollout_mock.wrap.mismatch.RequestMatcher.register_key`); ``check_views``: per-method
    functions giving what check mode compares of a batch; ``capture``: what dump mode records
    of a live batch (default: the batch); ``framework``: whose volatile fields request matching
    and check mode leave out (``None``: none). ``parts``: the resolved config
    (:func:`~rollout_mock.config.config_parts`); each component gets its own part. ``methods``
    (dump mode): how each intercepted method is called, and the rollout settings, recorded with
    the stream when this process claims it (``{method: {"convention", "step_arg", "params",
    "settings"}}``, what mock mode reads back with :meth:`~rollout_mock.storage.Store.methods`)."""

    def __init__(
        self,
        parts: ConfigParts,
        *,
        split: str = "train",
        name: str | None = None,
        store: Store | None = None,
        rank: int | None = None,
        match_keys: Mapping[str, KeyFunction] | None = None,
        check_views: Mapping[str, Callable[[Any], Any]] | None = None,
        capture: Capture | None = None,
        provenance: Provenance | None = None,
        framework: str | None = None,
        methods: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.mode = parts.mode
        self.split = split
        #: the dump's location (for messages; the store is opened from ``parts.store``)
        self.dump_dir = parts.store.dump_dir
        self.rank = _distributed_rank() if rank is None else rank
        per_rank = parts.stream.per_rank and self.rank is not None
        self.stream = StreamId(split, name if name is not None else parts.stream.name,
                               self.rank if per_rank else None)
        #: dump mode: whether this process writes (only ``dump_rank`` unless ranks: all).
        self.writes = self.mode.records and parts.stream.writes(self.rank)
        # what the components share is opened here, once, before any of them is built: the store; on
        # a rank that writes, the stream's claim (a second writer fails now), with this writer's
        # environment and methods; in mock and check mode, the device replayed tensors go to
        self.store = store if store is not None else open_store(parts.store, mode=self.mode.value)
        if self.writes:
            self.store.open_writer(self.stream, fingerprint=fingerprint(), methods=methods,
                                   compression=parts.record.compression)
        place = DevicePlacement.for_setting(parts.replay.device, mode=self.mode.value) if self.mode.replays else None
        self._next_step = 0
        self._lock = threading.Lock()
        #: the intercepted methods called at all
        self._methods_seen: set[str] = set()
        #: positional parameter names of each intercepted method (names a call's arguments)
        self.params: dict[str, Sequence[str] | None] = {}
        self.capture = capture
        self.provenance = provenance
        #: the call key's second half: each call's index within its step (and at_step's step)
        self.calls = StepCalls()
        self.closed = False
        #: the dump half (dump mode) and the mock half (mock and check mode): exactly one is set
        self.recorder: Recorder | None = None
        self.replayer: Replayer | None = None
        self.checker: Checker | None = None
        self.matcher = RequestMatcher(parts.match, self.store, self.stream, keys=match_keys, context={
            "mode": self.mode.value, "split": split, "path": self.dump_dir}, framework=framework)
        #: stall reports go to {dump_dir}/stalls/ (not from dump ranks that never touch the dump)
        self.watchdog = None if parts.watchdog is None else StallWatchdog(
            parts.watchdog,
            directory=self.dump_dir if (self.writes or self.mode.replays) and not self.store.bundled else None,
            label=str(self.stream))
        if self.mode.records:
            self.recorder = Recorder(parts.record, self.store, self.stream, writes=self.writes)
        else:
            self.replayer = Replayer(parts.replay, self.store, self.stream, place=place)
            if self.mode.runs_scheduler:
                self.checker = Checker(parts.check, self.store, self.stream, views=check_views,
                                       framework=framework)
        #: replay_rng: generator states recorded after live calls, restored after replayed ones
        self.rng = RngHook(enabled=parts.replay_rng and not self.checker, store=self.store, stream=self.stream,
                           overwrite=parts.record.overwrite)
        logger.info(
            "[RolloutMock] Rollout Mock enabled: mode=%s, dir=%s, scheduler_mode=%s, format=%s%s",
            self.mode.value,
            self.dump_dir,
            split,
            "data-only (trust_pickle: opaque blobs unpickled)" if parts.replay.trust_pickle else "data-only",
            "" if self.stream.key == split else f", stream={self.stream.key}",
        )
        #: calls served from the dump so far (mock mode): said when the run is interrupted
        self.replayed = 0

    def __repr__(self) -> str:
        return f"Interceptor(mode={self.mode.value}, stream={self.stream}, store={self.store!r})"

    @property
    def next_step(self) -> int:
        """The step the next call without an explicit step will use."""
        return self._next_step

    @next_step.setter
    def next_step(self, value: int) -> None:
        self._next_step = int(value)
        if self.replayer is not None:
            self.replayer.rewind()

    def continue_after(self, step: int) -> None:
        """Calls without a step continue after ``step`` (the end of an ``at_step`` block)."""
        with self._lock:
            self._next_step = max(self._next_step, step + 1)

    def resolve_step(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], position: int | None,
                     method: str | None = None) -> int:
        """The call's own step (exact; a bad one raises
        :class:`~rollout_mock.errors.StepArgumentError`), or the counter's next one when the
        call carries no step at all. Either way the counter continues after it."""
        explicit = step_from_call(
            args, kwargs, position, method=method, mode=self.mode.value, split=self.split
        )
        if explicit is None and (current := self.calls.current()) is not None:
            return current  # inside at_step(n): every call is a call of step n
        with self._lock:
            step = self._next_step if explicit is None else explicit
            self._next_step = step + 1
        return step

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "stream": self.stream.key, "next_step": self._next_step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s position; a state of another stream is refused (it would
        silently serve another stream's records)."""
        if state.get("version") != STATE_VERSION or "next_step" not in state:
            raise ValueError(f"not a rollout_mock scheduler state: {dict(state)!r}")
        if "stream" in state and state["stream"] != self.stream.key:
            raise ConfigError(
                f"[RolloutMock] load_state_dict: the state is of stream {state['stream']!r}, this scheduler "
                f"records/replays {self.stream.key!r}; load each scheduler's own state_dict",
                mode=self.mode.value, split=self.split)
        self.next_step = int(state["next_step"])

    # ------------------------------------------------------------------ request matching
    def check_settings(self, settings: Mapping[str, Any] | None, method: str) -> None:
        """Mock and check mode's pre-flight check of the rollout settings recorded with ``method``."""
        if self.mode.replays:
            self.matcher.check_settings(settings, method)

    def source_of(self, step: int, method: str, request: Request | None,
                  task: int | None = None) -> tuple[int, Recorded | None] | None:
        """Mock and check mode: the recorded step that serves run step ``step`` and which of its
        recorded calls serves this call (``None``: the step is run live and recorded,
        ``on_missing_step: record``), after checking that the call asks for what the dump run's
        call asked for (:meth:`Replayer.pick`). Dump mode: ``None``."""
        if self.replayer is None:
            return None
        source = self.replayer.replay_source(step)
        if source is None:
            return None
        exact = source == self.replayer.settings.dump_step(step)
        return source, self.replayer.pick(step, source, method, request, self.matcher if exact else None, task)

    # ------------------------------------------------------------------ the two halves
    @property
    def saved(self) -> int:
        """Steps written by this interceptor (dump mode)."""
        return 0 if self.recorder is None else self.recorder.saved

    @property
    def _writer(self) -> BackgroundWriter | SyncWriter | None:
        return None if self.recorder is None else self.recorder.writer

    @property
    def _buffers(self) -> BufferPool | None:
        return None if self.recorder is None else self.recorder.buffers

    # ------------------------------------------------------------------ hooks
    def after_live_call(self, step: int, method: str, batch: Any) -> None:
        """Runs on the calling thread after the real method returned, whether or not its batch
        is recorded (``batch`` is ``None`` on the Ray path: the call returned an ``ObjectRef``).
        The place for hooks that capture state produced by the live call. Nothing by default."""

    def after_replayed_call(self, step: int, source: int, batch: Any) -> None:
        """Runs on the calling thread after recorded step ``source`` was served for run step
        ``step`` (``batch`` is what the caller gets). The place for hooks that restore state
        the live call would have produced: the random number state (``replay_rng``)."""
        self.replayed += 1
        self.rng.after_replay(source)

    def _rng_before(self, step: int) -> dict[str, Any] | None:
        """Generator states before a live call that dump mode records (``replay_rng``)."""
        return self.rng.before() if self.recorder is not None and self.recorder.records_step(step) else None

    # ------------------------------------------------------------------ dispatch
    def begin(self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any],
              position: int | None) -> tuple[int, int, dict[str, Any], Request | None]:
        """Start an intercepted call: its key (step, and its index among the step's calls in the
        order they begin), plain-argument summary and request digest (kept in the summary, so that
        dump mode records it with the call); dump mode fails fast if the step cannot be recorded.
        A step argument that is present but not a non-negative integer raises
        :class:`~rollout_mock.errors.StepArgumentError` here, before the real rollout runs."""
        self._methods_seen.add(method)
        step = self.resolve_step(args, kwargs, position, method)
        index = self.calls.begin(step)
        run_step_hooks(self.split, step, self.mode.value)
        request = self.matcher.request(method, args, kwargs, self.params.get(method), position)
        call = call_summary(args, kwargs)
        if request is not None:
            call["request"] = request.to_json()
        if (task := self.calls.task()) is not None:
            call["task"] = task
        if self.recorder is not None:
            self.recorder.before_rollout(step, index)
        return step, index, call, request

    def _real(self, method: str, real: Callable[..., Any] | None,
              resolve: Callable[[], Callable[..., Any]] | None) -> Callable[..., Any]:
        """The real method: given, built on demand (mock mode, ``on_missing_step: record``), or a
        ConfigError saying what is missing."""
        if real is None and resolve is not None and self.replayer is not None:
            real = resolve()
        if real is None:
            raise ConfigError(
                f"[RolloutMock] on_missing_step=record (mode={self.mode.value}, split={self.split}): a step of "
                f"{self.stream} is not recorded and there is no real scheduler to run {method}: pass "
                f"the scheduler, or factory=<callable that builds it>, to MockScheduler",
                mode=self.mode.value, split=self.split,
            )
        return real

    def _keep(self, step: int, index: int, batch: Any, *, method: str, seconds: float,
              call: dict[str, Any]) -> None:
        """Record a live call's batch: dump mode (when ``step`` is recorded) or a missing step
        of mock mode (``on_missing_step: record``, written synchronously: it is rare). Check mode
        writes no step."""
        if self.checker is not None:
            logger.warning("[RolloutMock] step %d of %s is not recorded: mode=check serves the live batch "
                           "unchecked and writes no step", step, self.stream)
        elif self.replayer is not None:
            if index:
                logger.warning("[RolloutMock] call %d of missing step %d of %s is not recorded: on_missing_step="
                               "record records the first call of a step only", index, step, self.stream)
                return
            self.replayer.record_missing(self.replayer.settings.dump_step(step), self._captured(batch),
                                         method=method, seconds=seconds, call=call)
        elif self.recorder is not None and self.recorder.records_step(step):
            provenance = None if self.provenance is None else self.provenance(batch)
            self.recorder.record_call(step, index, self._captured(batch), method=method, seconds=seconds, call=call,
                                      provenance=provenance)

    def _captured(self, batch: Any) -> Any:
        return batch if self.capture is None else self.capture(batch)

    def _checked(self, step: int, served: tuple[int, Recorded | None], method: str, live: Any) -> Any:
        assert self.checker is not None and self.replayer is not None
        source, chosen = served
        return self.checker.check(step=step, source=source, method=method, live=live,
                                  recorded=self.replayer.replay_call(source, chosen))

    def _replayed(self, step: int, index: int, served: tuple[int, Recorded | None]) -> Any:
        assert self.replayer is not None
        source, chosen = served
        batch = self.replayer.replay_call(source, chosen)
        if chosen is None or chosen.pack is None:  # the random state is recorded with a step's first call
            self.after_replayed_call(step, source, batch)
        else:
            self.replayed += 1
        return batch

    def _rng_before_call(self, step: int, index: int) -> dict[str, Any] | None:
        return self._rng_before(step) if index == 0 else None

    def call(self, method: str, real: Callable[..., Any] | None, args: tuple[Any, ...],
             kwargs: dict[str, Any], position: int | None,
             resolve: Callable[[], Callable[..., Any]] | None = None) -> Any:
        """One intercepted plain call: replay, or call ``real`` and record (or check) its batch.

        ``resolve`` builds the real method on demand (mock mode, ``on_missing_step: record``)."""
        step, index, call, request = self.begin(method, args, kwargs, position)
        with self._watching(method, step):
            served = self.source_of(step, method, request)
            if served is not None and self.checker is None:
                return self._replayed(step, index, served)
            function = self._real(method, real, resolve)
            start = time.perf_counter()
            rng_before = self._rng_before_call(step, index)
            batch = function(*args, **kwargs)
            seconds = elapsed(start)
            self.after_live_call(step, method, batch)
            if served is not None:
                return self._checked(step, served, method, batch)
            self._keep(step, index, batch, method=method, seconds=seconds, call=call)
            self.rng.after_call(step, rng_before, self._writer)
            return batch

    async def call_async(self, method: str, real: Callable[..., Any] | None, args: tuple[Any, ...],
                         kwargs: dict[str, Any], position: int | None,
                         resolve: Callable[[], Callable[..., Any]] | None = None) -> Any:
        """Like :meth:`call` for ``async def`` methods; capture and I/O stay off the event loop."""
        step, index, call, request = self.begin(method, args, kwargs, position)
        loop = asyncio.get_running_loop()
        if self.watchdog is not None:
            self.watchdog.note_loop(loop)
        with self._watching(method, step):
            served = self.source_of(step, method, request, call.get("task"))
            if served is not None and self.checker is None:
                source, chosen = served
                assert self.replayer is not None
                if chosen is None or chosen.pack is None:
                    batch = await self.replayer.replay_at_async(source)
                    self.after_replayed_call(step, source, batch)
                    return batch
                return self._replayed(step, index, served)  # a pack member: in memory once its pack is read
            function = self._real(method, real, resolve)
            start = time.perf_counter()
            rng_before = self._rng_before_call(step, index)
            batch = await function(*args, **kwargs)
            seconds = elapsed(start)
            self.after_live_call(step, method, batch)
            if served is not None:
                checked = served
                return await loop.run_in_executor(None, lambda: self._checked(step, checked, method, batch))
            self.rng.after_call(step, rng_before, self._writer)
            if index:  # an extra call is captured here and written with others: no thread hop
                self._keep(step, index, batch, method=method, seconds=seconds, call=call)
                return batch
            await loop.run_in_executor(
                None, lambda: self._keep(step, index, batch, method=method, seconds=seconds, call=call))
            return batch

    def call_remote(self, method: str, real: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                    position: int | None, resolve: Callable[[], Any] | None = None,
                    options: Mapping[str, Any] | None = None) -> Any:
        """Like :meth:`call` for a Ray actor method (``real`` is the ``ActorMethod``): returns an
        ``ObjectRef``. Replayed batches are ``ray.put``; a step run live in mock or check mode is
        fetched, recorded or checked, and put back. In dump mode the call does not wait: the batch is
        fetched with ``ray.get`` on the writer thread, the watchdog watches the call until it arrives
        there and its seconds are measured to that point (an upper bound when the writer was busy)."""
        import ray

        step, index, call, request = self.begin(method, args, kwargs, position)
        label = f"{method}(step {step})"
        if self.watchdog is not None:
            self.watchdog.enter(label)
        pending = False
        try:
            served = self.source_of(step, method, request)
            if served is not None and self.checker is None:
                return ray.put(self._replayed(step, index, served))
            function: Any = self._real(method, real, resolve)
            remote = function.options(**options) if options else function
            start = time.perf_counter()
            ref = remote.remote(*args, **kwargs)
            if self.replayer is not None:
                batch = ray.get(ref)
                seconds = elapsed(start)
                self.after_live_call(step, method, batch)
                if served is not None:
                    return ray.put(self._checked(step, served, method, batch))
                self._keep(step, index, batch, method=method, seconds=seconds, call=call)
                return ray.put(batch)
            self.after_live_call(step, method, None)
            if self.recorder is not None and self.recorder.records_step(step) and index:
                # a further call of the step: fetched now (a pack member is captured on this thread)
                batch = ray.get(ref)
                self._keep(step, index, batch, method=method, seconds=elapsed(start), call=call)
            elif self.recorder is not None and self.recorder.records_step(step):
                # Ray objects are immutable: no snapshot needed; fetched on the writer thread.
                self.recorder.record_later(step, lambda: self._captured(ray.get(ref)), method=method,
                                           started=start, call=call, done=lambda: self._unwatch(label))
                pending = True
            return ref
        finally:
            if not pending:
                self._unwatch(label)

    def _unwatch(self, label: str) -> None:
        if self.watchdog is not None:
            self.watchdog.leave(label)

    def _watching(self, method: str, step: int) -> AbstractContextManager[None]:
        return nullcontext() if self.watchdog is None else self.watchdog.watch(f"{method}(step {step})")

    @property
    def last_stall(self) -> float:
        """Seconds the most recent replayed call waited for its data (0 with a prefetch hit)."""
        return 0.0 if self.replayer is None else self.replayer.last_stall

    def flush(self) -> None:
        """Block until every recorded step is written; raise a write failure if one happened."""
        if self.recorder is not None and self.recorder.writer is not None:
            self.recorder.writer.flush()  # (its flush hook queues the calls the recorder held back)

    def close(self, *, failed: bool = False, interrupted: bool = False) -> None:
        """Write everything pending, stop background threads, release locks. Idempotent.

        ``failed``: the caller is unwinding an exception (a ``with`` block that raised); the
        warning about a dump that recorded no step is then not logged, since it would hide the
        real error. ``interrupted``: the block was left by Ctrl-C (KeyboardInterrupt); what was
        kept is said in one line."""
        if self.closed:
            return
        self.closed = True
        if self.watchdog is not None:
            self.watchdog.close()
        try:
            if self.recorder is not None:
                self.recorder.close(failed=failed, interrupted=interrupted, methods=sorted(self._methods_seen))
        finally:
            if self.replayer is not None:
                if interrupted:  # Ctrl-C: say where the replay stopped, as dump mode says what was kept
                    where = "before its first step" if not self._methods_seen else f"at step {self._next_step - 1}"
                    logger.warning("[RolloutMock] interrupted %s of %s (mode=%s); %d step(s) replayed from %s",
                                   where, self.stream, self.mode.value, self.replayed, self.dump_dir)
                self.replayer.close()
            self.store.close()

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
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from rollout_mock import codec
from rollout_mock.config import DiskFullPolicy, FingerprintPolicy, RankPolicy, RolloutMockConfig
from rollout_mock.errors import DiskFullError, FingerprintMismatchError, IncompleteDumpError
from rollout_mock.fileio import free_bytes
from rollout_mock.manifest import StreamId
from rollout_mock.modes import Convention
from rollout_mock.prefetch import Prefetcher
from rollout_mock.store import BatchInfo, DirectoryStore, StepStore, format_ranges
from rollout_mock.writer import BackgroundWriter, SyncWriter, WriteJob

logger = logging.getLogger("rollout_mock")

STEP_ARG = "global_step"
#: Names a call's step goes by: ROLL's ``global_step``, verl's ``meta_info["global_steps"]``,
#: slime's ``generate_rollout(args, rollout_id, ...)``.
STEP_NAMES = (STEP_ARG, "global_steps", "rollout_id")
STATE_VERSION = 1


def _as_step(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def step_arg_position(function: Callable[..., Any] | None, *, bound: bool) -> int | None:
    """Index of the ``global_step`` parameter among positional arguments, if it has one.

    ``function`` may also be a Ray ``ActorMethod`` (its recorded signature, without ``self``, is
    used: Ray 2.x keeps it in ``_signature``, a list of :class:`inspect.Parameter`).
    """
    if function is None:
        return None
    ray_signature = getattr(function, "_signature", None) if is_ray_actor_method(function) else None
    if ray_signature is not None:
        return step_position_in(list(ray_signature))
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    if not bound and parameters and parameters[0].name in ("self", "cls"):
        parameters = parameters[1:]
    return step_position_in(parameters)


def step_position_in(parameters: list[inspect.Parameter]) -> int | None:
    """Index of ``global_step`` among ``parameters`` (``self`` already removed), if positional."""
    for index, parameter in enumerate(parameters):
        if parameter.name in STEP_NAMES and parameter.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            return index
    return None


def step_from_call(args: tuple[Any, ...], kwargs: Mapping[str, Any], position: int | None) -> int | None:
    """The step a call carries: ``global_step`` by keyword or position, or the ``meta_info`` of
    a DataProto-like argument (``global_step``, ROLL; ``global_steps``, verl's trainer)."""
    for name in STEP_NAMES:
        if name in kwargs:
            return _as_step(kwargs[name])
    if position is not None and position < len(args):
        return _as_step(args[position])
    for value in (*args, *kwargs.values()):
        meta = getattr(value, "meta_info", None)
        if isinstance(meta, Mapping):
            for name in STEP_NAMES:
                if name in meta:
                    return _as_step(meta[name])
    return None


def is_ray_actor_method(attribute: Any) -> bool:
    """True for a Ray ``ActorMethod`` (``handle.get_batch``), without importing Ray."""
    return type(attribute).__name__ == "ActorMethod" and hasattr(attribute, "remote")


def detect_convention(attribute: Any) -> Convention:
    """How ``attribute`` (a bound method, a function, or a Ray actor method) is called."""
    if is_ray_actor_method(attribute):
        return Convention.RAY
    target = inspect.unwrap(attribute) if callable(attribute) else attribute
    if inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(attribute):
        return Convention.ASYNC
    return Convention.SYNC


def _distributed_rank() -> int | None:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return None
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return None


def _hmac_key(config: RolloutMockConfig) -> bytes | None:
    if config.hmac_key_env is None:
        return None
    value = os.environ.get(config.hmac_key_env)
    if not value:
        from rollout_mock.errors import ConfigError

        raise ConfigError(
            f"rollout_mock.hmac_key_env: environment variable {config.hmac_key_env!r} is not set "
            f"or empty; export the signing key in it, or remove hmac_key_env from the config"
        )
    return value.encode("utf-8")


class Interceptor:
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
        self.store = store or DirectoryStore(
            config.dump_dir, hmac_key=_hmac_key(config), verify=config.verify_checksum
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
        if self.mode.records:
            self._open_dump()
        else:
            self._open_mock()
        logger.info(
            "[RolloutMock] Rollout Mock enabled: mode=%s, dir=%s, scheduler_mode=%s, format=pickle%s",
            self.mode.value,
            config.dump_dir,
            split,
            "" if self.stream.key == split else f", stream={self.stream.key}",
        )

    def __repr__(self) -> str:
        return f"Interceptor(mode={self.mode.value}, stream={self.stream}, store={self.store!r})"

    # ------------------------------------------------------------------ setup
    def _open_dump(self) -> None:
        if not self.writes:
            return
        self.store.open_writer(self.stream)
        try:
            from rollout_mock.determinism import fingerprint

            self.store.set_fingerprint(fingerprint())
        except ImportError:  # pragma: no cover - determinism is part of the package
            pass
        if self.config.background:
            self._writer = BackgroundWriter(max_pending=self.config.max_pending, on_error=self._on_write_error)
        else:
            self._writer = SyncWriter(on_error=self._on_write_error)

    def _open_mock(self) -> None:
        if isinstance(self.store, DirectoryStore):
            self.store.require_manifest(mode=self.mode.value, split=self.split)
        recorded = self.store.steps(self.stream)
        if self.config.max_steps is not None and self.split == "train":
            missing = sorted(set(range(self.config.max_steps)) - set(recorded))
            if missing:
                raise IncompleteDumpError(
                    f"[RolloutMock] pre-flight check failed (mode=mock): max_steps="
                    f"{self.config.max_steps} but {self.stream} of {self.config.dump_dir} lacks steps "
                    f"{format_ranges(missing)} (recorded: {format_ranges(recorded)}). Lower max_steps, "
                    f"or dump the missing steps first.",
                    mode=self.mode.value,
                    split=self.split,
                    step=missing[0],
                    path=self.config.dump_dir,
                )
        elif not recorded:
            logger.warning(
                "[RolloutMock] %s has no recorded steps for %s; every call will fail "
                "(recorded streams: %s)",
                self.config.dump_dir,
                self.stream,
                ", ".join(s.key for s in self.store.manifest().stream_ids()) or "none"
                if isinstance(self.store, DirectoryStore)
                else "?",
            )
        self._check_fingerprint()
        self._prefetcher = Prefetcher(self._load, self._next_recorded, enabled=self.config.prefetch)

    def _check_fingerprint(self) -> None:
        if self.config.fingerprint is FingerprintPolicy.OFF:
            return
        recorded = self.store.fingerprint()
        if not recorded:
            return
        try:
            from rollout_mock.determinism import compare_fingerprints, fingerprint, format_differences
        except ImportError:  # pragma: no cover
            return
        differences = compare_fingerprints(recorded, fingerprint())
        if not differences:
            return
        table = format_differences(differences)
        message = (
            f"[RolloutMock] this run's environment differs from the one that recorded "
            f"{self.config.dump_dir}; replayed numbers may not match:\n{table}"
        )
        relevant = any(d.numerics_relevant for d in differences)
        if self.config.fingerprint is FingerprintPolicy.ERROR and relevant:
            raise FingerprintMismatchError(
                message + "\nSet `fingerprint: warn` to only warn.",
                mode=self.mode.value,
                split=self.split,
                path=self.config.dump_dir,
            )
        logger.warning(message)

    # ------------------------------------------------------------------ steps
    @property
    def next_step(self) -> int:
        """The step the next call without an explicit step will use."""
        return self._next_step

    @next_step.setter
    def next_step(self, value: int) -> None:
        self._next_step = int(value)

    def resolve_step(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], position: int | None) -> int:
        explicit = step_from_call(args, kwargs, position)
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

    # ------------------------------------------------------------------ dump
    def records_step(self, step: int) -> bool:
        if not self.writes or self._dump_disabled:
            return False
        steps = self.config.dump_steps
        return steps is None or step in steps

    def before_rollout(self, step: int) -> None:
        """Fail fast, before an expensive rollout, if its result could not be recorded."""
        if self.records_step(step) and isinstance(self.store, DirectoryStore):
            self.store.check_writable(self.stream, step, overwrite=self.config.overwrite)
        if self._writer is not None and isinstance(self._writer, BackgroundWriter):
            self._writer.raise_if_failed()

    def record(self, step: int, batch: Any, *, method: str, seconds: float | None,
               call: dict[str, Any] | None = None, snapshot: bool = True) -> None:
        """Write ``batch`` as ``step``. With ``snapshot`` (and a background writer) it is copied
        first, so the caller may mutate it as soon as this returns; the copy is taken only once
        the writer has a free slot, so at most ``max_pending`` copies exist at a time."""
        assert self._writer is not None
        info = BatchInfo.of(batch)
        describe = f"step {step} of {self.stream}"

        def make_job() -> WriteJob:
            if isinstance(self._writer, BackgroundWriter) and snapshot:
                produce: Callable[[], Any] = codec.capture(batch).materialize
            else:
                produce = lambda: batch  # noqa: E731
            return WriteJob(lambda: self._save(step, produce(), info, method, seconds, call), describe)

        self._writer.submit_when_free(make_job, describe)

    def record_later(self, step: int, produce: Callable[[], Any], *, method: str, seconds: float | None,
                     call: dict[str, Any] | None = None) -> None:
        """Write the batch that ``produce()`` returns on the writer thread (e.g. ``ray.get``).

        If ``produce()`` itself raises, the rollout failed (the caller sees the same error from
        its own ``ray.get``): nothing is recorded for ``step``, which stays free for a retry,
        and recording goes on; only failures to *write* stop the dump.
        """
        def write() -> None:
            try:
                batch = produce()
            except Exception as exc:
                logger.warning(
                    "[RolloutMock] step %d of %s not recorded: the rollout failed (%s: %s)",
                    step, self.stream, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                )
                return
            self._save(step, batch, BatchInfo.of(batch), method, seconds, call)

        assert self._writer is not None
        self._writer.submit(WriteJob(write, f"step {step} of {self.stream}"))

    def _save(self, step: int, batch: Any, info: BatchInfo, method: str, seconds: float | None,
              call: dict[str, Any] | None = None) -> None:
        if self._dump_disabled:  # on_disk_full=skip fired while this step waited in the queue
            return
        entry = self.store.save(
            self.stream, step, batch, info, method=method, rollout_seconds=seconds,
            overwrite=self.config.overwrite, call=call,
        )
        self.saved += 1
        logger.info(
            "[RolloutMock] Dumped step %d: %s (samples=%s, size=%.2fMB)",
            step,
            self.store.describe_location(self.stream, step),
            info.samples,
            entry.size / (1024 * 1024),
        )
        if not self._estimated:
            self._estimated = True
            self._log_disk_estimate(step, entry.size)
        if self.config.max_keep is not None:
            self._apply_retention()

    def _apply_retention(self) -> None:
        """Delete the oldest unpinned steps beyond ``max_keep`` (AReaL's max_keep/pin_steps)."""
        assert self.config.max_keep is not None
        pinned = set(self.config.pin_steps or ())
        candidates = [s for s in self.store.steps(self.stream) if s not in pinned]
        for old in candidates[: max(len(candidates) - self.config.max_keep, 0)]:
            self.store.delete(self.stream, old)
            logger.info("[RolloutMock] Deleted step %d of %s (max_keep=%d)", old, self.stream, self.config.max_keep)

    def _log_disk_estimate(self, step: int, size: int) -> None:
        if self.config.dump_steps is not None:
            remaining = len([s for s in self.config.dump_steps if s > step])
        elif self.config.max_steps is not None:
            remaining = max(self.config.max_steps - step - 1, 0)
        else:
            return
        if not isinstance(self.store, DirectoryStore):
            return
        needed = remaining * size
        free = free_bytes(self.store.dump_dir)
        level = logging.WARNING if needed > free else logging.INFO
        logger.log(
            level,
            "[RolloutMock] disk estimate: %d more step(s) of ~%.2f MB need ~%.2f MB; %.2f MB free in %s%s",
            remaining,
            size / 1e6,
            needed / 1e6,
            free / 1e6,
            self.store.dump_dir,
            " — NOT ENOUGH: the dump will fail part-way" if needed > free else "",
        )

    def _on_write_error(self, job: WriteJob, exc: BaseException) -> bool:
        if isinstance(exc, DiskFullError) and self.config.on_disk_full is DiskFullPolicy.SKIP:
            self._dump_disabled = True
            logger.error(
                "[RolloutMock] %s. on_disk_full=skip: DUMPING IS NOW DISABLED for %s; training "
                "continues, but the recording stops before %s and is incomplete.",
                exc,
                self.stream,
                job.describe,
            )
            return True
        return False

    # ------------------------------------------------------------------ mock
    def _load(self, step: int) -> Any:
        batch = self.store.load(self.stream, step, trusted=self.config.trust_pickle)
        entry = self.store.entry(self.stream, step)
        logger.info(
            "[RolloutMock] Loaded step %d: %s (samples=%s)",
            step,
            self.store.describe_location(self.stream, step),
            None if entry is None else entry.samples,
        )
        return batch

    def replay(self, step: int) -> Any:
        assert self._prefetcher is not None
        return self._prefetcher.get(step)

    async def replay_async(self, step: int) -> Any:
        assert self._prefetcher is not None
        return await self._prefetcher.get_async(step)

    @property
    def last_stall(self) -> float:
        return 0.0 if self._prefetcher is None else self._prefetcher.last_stall

    # ------------------------------------------------------------------ calls
    def check_call(self, step: int, method: str, call: dict[str, Any]) -> None:
        """Mock mode: warn (once per method) when a call's plain arguments differ from the
        recorded call's — e.g. another ``batch_size`` than the dump was made with."""
        if method in self._call_warned:
            return
        entry = self.store.entry(self.stream, step)
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
        call against the recorded one; dump mode fails fast if the step cannot be recorded."""
        self._methods_seen.add(method)
        step = self.resolve_step(args, kwargs, position)
        call = call_summary(args, kwargs)
        if self.mode.replays:
            self.check_call(step, method, call)
        else:
            self.before_rollout(step)
        return step, call

    def call(self, method: str, real: Callable[..., Any] | None, args: tuple[Any, ...],
             kwargs: dict[str, Any], position: int | None) -> Any:
        """Run one intercepted plain call: replay, or call ``real`` and record its batch."""
        step, call = self.begin(method, args, kwargs, position)
        if self.mode.replays:
            return self.replay(step)
        assert real is not None, "dump mode always has the real scheduler"
        start = time.perf_counter()
        batch = real(*args, **kwargs)
        if self.records_step(step):
            self.record(step, batch, method=method, seconds=elapsed(start), call=call)
        return batch

    async def call_async(self, method: str, real: Callable[..., Any] | None, args: tuple[Any, ...],
                         kwargs: dict[str, Any], position: int | None) -> Any:
        """Like :meth:`call` for ``async def`` methods; capture and I/O stay off the event loop."""
        step, call = self.begin(method, args, kwargs, position)
        if self.mode.replays:
            return await self.replay_async(step)
        assert real is not None, "dump mode always has the real scheduler"
        start = time.perf_counter()
        batch = await real(*args, **kwargs)
        if self.records_step(step):
            seconds = elapsed(start)
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.record(step, batch, method=method, seconds=seconds, call=call)
            )
        return batch

    # ------------------------------------------------------------------ lifecycle
    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Write everything pending, stop background threads, release locks. Idempotent."""
        if self.closed:
            return
        self.closed = True
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


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return f"<{type(value).__qualname__}>"


def call_summary(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The plain arguments of a call (numbers, strings, None); other objects by type name."""
    return {"args": [_plain(a) for a in args], "kwargs": {k: _plain(v) for k, v in sorted(kwargs.items())}}


def describe_call(call: Mapping[str, Any]) -> str:
    parts = [repr(a) if not str(a).startswith("<") else str(a) for a in call.get("args", [])]
    parts += [f"{k}={v!r}" for k, v in call.get("kwargs", {}).items()]
    return f"({', '.join(parts)})"


def elapsed(start: float) -> float:
    return round(time.perf_counter() - start, 6)

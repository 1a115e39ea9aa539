"""Mock and check mode: the pre-flight check, the fingerprint check and serving recorded steps.

Replay policies (all in the ``rollout_mock:`` block, see :mod:`rollout_mock.config`):

* which recorded step a call gets: run step ``M`` replays dump step ``step_map[M]`` if given,
  else ``M + step_offset`` (resume a run mid-way on a dump);
* a step that is not recorded (``on_missing_step``): ``error`` (StepNotFoundError),
  ``repeat_nearest`` (the nearest recorded step, earlier first: verl's ``action: repeat``), or
  ``record`` (the interceptor runs the real scheduler and records the step);
* ``subsample``: only a deterministic fraction of each replayed batch is served: of ``n`` rows
  (what a row is, for each batch type, is :mod:`rollout_mock.batch`'s answer) ``k = max(1,
  int(n * fraction))`` are kept, the first ``k // 2`` and the last ``k - k // 2`` (slime's
  ``--load-debug-rollout-data-subsample`` rule), in order;
* ``device``: where replayed tensors go (:class:`~rollout_mock.codec.device.DevicePlacement`,
  checked when the replay starts).

:class:`Replayer` is the mock half of :class:`~rollout_mock.wrap.interceptor.Interceptor`, with
its state declared in ``__init__``; the interceptor decides when a call is replayed.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_mock.batch import batch_type_of
from rollout_mock.codec.device import DevicePlacement
from rollout_mock.config import FingerprintPolicy, MissingStepPolicy, ReplaySettings
from rollout_mock.config.model import VerdictAction
from rollout_mock.determinism.fingerprint import compare_fingerprints, fingerprint, format_differences
from rollout_mock.errors import (
    CorruptStepError,
    FingerprintMismatchError,
    IncompleteDumpError,
    ReplayMismatchError,
    StepNotFoundError,
)
from rollout_mock.storage.manifest import CallRecord, PackRecord, StreamId, format_ranges
from rollout_mock.storage.reader import Prefetcher, load_partial, rank_rows
from rollout_mock.storage.store import BatchInfo, Store
from rollout_mock.text import logger, step_log_level
from rollout_mock.wrap.matching import Request
from rollout_mock.wrap.mismatch import RequestMatcher

__all__ = ["Recorded", "Replayer", "describe_expected",
           "keep_rows", "subsample_batch"]


def keep_rows(n: int, fraction: float) -> list[int]:
    """Indices ``subsample`` keeps out of ``n`` rows (see the module docstring)."""
    if n <= 0:
        return []
    k = min(n, max(1, int(n * fraction)))
    head = k // 2
    return list(range(head)) + list(range(n - (k - head), n))


def subsample_batch(batch: Any, fraction: float) -> Any:
    """``batch`` with only the kept rows; a type without rows (or with none) is returned unchanged."""
    batch_type = batch_type_of(batch)
    if batch_type is None:
        return batch
    n = batch_type.rows(batch)
    if not n:
        return batch
    return batch_type.take(batch, keep_rows(n, fraction))


#: Run steps whose served calls are remembered (a count mismatch of an older step is said then).
SERVED_STEPS = 64


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


@dataclass
class Recorded:
    """One recorded call of a step: its step file (``pack`` is ``None``: the step's first recorded
    call) or a member of a pack of extra calls."""

    call: int
    method: str | None
    digest: int | None
    task: int | None = None
    pack: PackRecord | None = None
    record: CallRecord | None = None
    raw_request: Any = None
    load_meta: Callable[[], list[Any]] | None = field(default=None, repr=False)

    def request(self) -> Any:
        """The recorded request's JSON (a pack call's is read from its pack on demand)."""
        if self.pack is None or self.record is None or self.load_meta is None:
            return self.raw_request
        meta = self.load_meta()
        position = self.pack.calls.index(self.record)
        item = meta[position] if position < len(meta) else None
        return item.get("request") if isinstance(item, dict) else None


class _Taken:
    """The recorded calls of the step serving one run step, and which were served: the calls
    by (method, digest) and the first not served yet per method, found without a scan."""

    def __init__(self, source: int, calls: list[Recorded]) -> None:
        self.source = source
        self.calls = calls
        self.served: set[int] = set()
        self._by_digest: dict[tuple[str | None, int | None], deque[Recorded]] = {}
        for call in calls:
            self._by_digest.setdefault((call.method, call.digest), deque()).append(call)
        self._next: dict[str, int] = {}

    def first_unserved(self, method: str) -> Recorded | None:
        i, calls = self._next.get(method, 0), self.calls
        while i < len(calls) and (calls[i].call in self.served or calls[i].method not in (None, method)):
            i += 1
        self._next[method] = i
        return calls[i] if i < len(calls) else None

    def equal(self, method: str, digest: int, task: int | None = None) -> Recorded | None:
        """The first call not served yet of ``method`` recorded with request digest ``digest``:
        the first one made by ``task`` when it is known and one was, else the first."""
        for key in ((method, digest), (None, digest)):
            queue = self._by_digest.get(key)
            while queue and queue[0].call in self.served:
                queue.popleft()
            if queue:
                if task is not None and queue[0].task != task:
                    same = next((c for c in queue if c.task == task and c.call not in self.served), None)
                    if same is not None:
                        return same
                return queue[0]
        return None


def _recorded_digest(call: Any) -> int | None:
    """The digest of a step entry's recorded request (``None``: none, or not this format's)."""
    request = Request.from_json(call.get("request")) if isinstance(call, dict) else None
    return None if request is None else request.digest


def _call_index(call: Any) -> int:
    index = call.get("index", 0) if isinstance(call, dict) else 0
    return index if type(index) is int and 0 <= index < 1 << 62 else 0


class Replayer:
    """Serves one stream's recorded batches (mock mode; see the module docstring).

    Opening it runs the pre-flight checks: the dump exists and holds the stream (else an error
    naming the splits that are there), ``max_steps`` is covered, the fingerprint matches.
    ``settings`` are the replay keys of the config; ``place``: where replayed tensors go (the
    ``device`` setting's :class:`~rollout_mock.codec.device.DevicePlacement`; ``None``: the CPU).
    """

    def __init__(self, settings: ReplaySettings, store: Store, stream: StreamId, *,
                 place: DevicePlacement | None = None) -> None:
        self.settings = settings
        self.store = store
        self.stream = stream
        self.split = stream.split
        self.mode = settings.mode
        self._repeat_warned: set[int] = set()
        #: steps loaded so far (per-step log lines: see step_log_level)
        self.loaded = 0
        #: on_missing_step: record took the stream's writer lock
        self._recorder_open = False
        self.prefetcher: Prefetcher | None = None
        #: the extra calls of every recorded step (read once, on the first step that needs them)
        self._extra: dict[int, list[tuple[PackRecord, CallRecord]]] | None = None
        #: run step -> (the recorded step serving it, its recorded calls, the calls served so far)
        self._taken: dict[int, _Taken] = {}
        self._open(place)

    def __repr__(self) -> str:
        return f"Replayer({self.stream}, store={self.store!r})"

    def close(self) -> None:
        for step in list(self._taken):
            self._forget(step)
        if self.prefetcher is not None:
            self.prefetcher.close()

    # ------------------------------------------------------------------ the calls of a step
    def recorded_calls(self, source: int) -> list[Recorded]:
        """Every recorded call of step ``source``, in call order: its step file's, then the
        extra calls of its packs."""
        entry = self.store.entry(self.stream, source)
        calls = []
        if entry is not None:
            call = entry.call or {}
            if (problem := Request.problem(call.get("request"))) is not None:
                raise CorruptStepError(
                    f"[RolloutMock] mode={self.mode.value}, {self.stream} step {source}: the recorded call of "
                    f"{entry.method} is damaged ({problem}), so no call can be matched against it; re-dump that "
                    f"step (mode: dump, overwrite: true) or restore the dump from a copy",
                    mode=self.mode.value, split=self.split, step=source, path=str(self.settings.dump_dir))
            task = call.get("task")
            calls.append(Recorded(_call_index(call), entry.method, _recorded_digest(call),
                                  task if type(task) is int else None, raw_request=call.get("request")))
        if self._extra is None:
            self._extra = self.store.extra_calls(self.stream)
        for pack, record in self._extra.get(source, []):
            calls.append(Recorded(record.call, record.method, record.digest, record.task, pack, record,
                                  load_meta=functools.partial(self._pack_meta, pack)))
        calls.sort(key=lambda c: c.call)
        return calls

    def _pack_meta(self, pack: PackRecord) -> list[Any]:
        return self.store.pack_meta(self.stream, pack)

    def pick(self, step: int, source: int, method: str, request: Request | None,
             matcher: RequestMatcher | None, task: int | None = None) -> Recorded | None:
        """The recorded call of step ``source`` that serves this call of run step ``step``: the
        first not yet served (in recorded order) whose request digest equals this call's, so that
        equal requests are served in recorded order; a recorded call without a digest matches by
        its place. With ``match_on`` (a part of the request is compared) or without matching, the
        first not yet served, checked. A call equal to none is explained against the first not yet
        served (``on_mismatch: error`` raises, ``warn`` serves it). Each recorded call is served
        once per run step. ``matcher`` is ``None`` where the run step maps to another recorded step
        than its own (nothing is compared then). Raises :class:`ReplayMismatchError` naming the
        step and both counts when this run makes more calls of ``method`` at the step than the dump
        run did. A step of one recorded call is served and checked as it always was. ``task``:
        the asyncio task making the call (:meth:`StepCalls.task`): among equal requests, the one
        the same task made in the dump run is served first."""
        held = self._taken.get(step)
        if held is None or held.source != source:
            if held is not None:
                self._forget(step)
            held = self._taken[step] = _Taken(source, self.recorded_calls(source))
            while len(self._taken) > SERVED_STEPS:
                self._forget(next(iter(self._taken)))
        if len(held.calls) <= 1:  # a step of one call: served (and checked) as before calls were keyed
            if matcher is not None:
                matcher.check(request, step=step, dump_step=source, method=method)
            only = held.calls[0] if held.calls else None
            held.served.add(0 if only is None else only.call)
            return only
        first = held.first_unserved(method)
        if first is None:
            recorded = sum(1 for c in held.calls if c.method is None or c.method == method)
            mapped = "" if source == step else f" (dump step {source})"
            raise ReplayMismatchError(
                f"[RolloutMock] mode={self.mode.value}, {self.stream} step {step}{mapped}: the dump run made "
                f"{recorded} call(s) of {method} at this step and this run makes a {_ordinal(recorded + 1)}, so "
                f"there is no recorded batch left to serve it (each recorded call is served once; nothing is "
                f"cycled). The run asks for more data than the dump run did: check the batch and group sizes, "
                f"the number of validation batches and agent turns, or re-dump with this run's settings.",
                method=method, dump_step=source, counts=(recorded, recorded + 1), mode=self.mode.value,
                split=self.split, step=step, path=str(self.settings.dump_dir))
        chosen: Recorded = first
        if matcher is not None and request is not None:
            equal = None
            if matcher.settings.match_on is None:
                equal = held.equal(method, request.digest, task) or (first if first.digest is None else None)
            if equal is None:  # explained against the first call not served yet (warn: served)
                matcher.check_recorded(first.request(), request, step=step, dump_step=source, method=method,
                                       call=first.call)
            else:
                chosen = equal
        held.served.add(chosen.call)
        return chosen

    def rewind(self) -> None:
        """Forget which calls were served (the run was moved to another step: a resume)."""
        self._taken.clear()

    def _forget(self, step: int) -> None:
        """Stop tracking run step ``step``; say so when it was served fewer calls than recorded."""
        held = self._taken.pop(step)
        source, calls, served = held.source, held.calls, held.served
        if len(calls) > 1 and len(served) < len(calls):
            logger.warning(
                "[RolloutMock] %s step %d%s: the dump run made %d call(s) at this step, this run was served %d; "
                "the recorded calls %s were never asked for (a run that consumes less than the dump run did)",
                self.stream, step, "" if source == step else f" (dump step {source})", len(calls), len(served),
                format_ranges(sorted(c.call for c in calls if c.call not in served)))

    def replay_call(self, source: int, chosen: Recorded | None) -> Any:
        """Serve ``chosen`` (a recorded call of step ``source``): its step file through the
        prefetcher, or its member of a pack."""
        if chosen is None or chosen.pack is None or chosen.record is None:
            return self.replay_at(source)
        store = self.store
        assert self.prefetcher is not None
        pack, record = chosen.pack, chosen.record
        batch = self.prefetcher.load_now(
            lambda _: store.load_call(self.stream, pack, record, trusted=self.settings.trust_pickle), source)
        self.loaded += 1
        logger.log(step_log_level(self.loaded), "[RolloutMock] Loaded step %d, call %d: %s (samples=%s)", source,
                   record.call, self.store.describe_location(self.stream, source), record.samples)
        return self._served(batch)

    def _open(self, place: DevicePlacement | None) -> None:
        manifest = self.store.require_manifest(mode=self.mode.value, split=self.split)
        metrics = self.store.expected_file()
        recorded = self.store.steps(self.stream)
        settings = self.settings
        lenient = settings.on_missing_step is not MissingStepPolicy.ERROR
        if settings.max_steps is not None and self.split == "train":
            wanted = {settings.dump_step(step) for step in range(settings.max_steps)}
            missing = sorted(wanted - set(recorded))
            if missing and lenient:
                logger.warning(
                    "[RolloutMock] %s of %s lacks steps %s of the max_steps=%d run; "
                    "on_missing_step=%s serves them anyway",
                    self.stream, settings.dump_dir, format_ranges(missing), settings.max_steps,
                    settings.on_missing_step.value,
                )
            elif missing:
                raise IncompleteDumpError(
                    f"[RolloutMock] pre-flight check failed (mode={self.mode.value}): max_steps="
                    f"{settings.max_steps} but {self.stream} of {settings.dump_dir} lacks steps "
                    f"{format_ranges(missing)} (recorded: {format_ranges(recorded)}). Lower max_steps, "
                    f"or dump the missing steps first (or set on_missing_step: repeat_nearest / "
                    f"record).",
                    mode=self.mode.value,
                    split=self.split,
                    step=missing[0],
                    path=settings.dump_dir,
                )
        elif not recorded:
            logger.debug(  # not a warning: a run may never call it (verl without validation)
                "[RolloutMock] %s has no step of %s; a call of it raises StepNotFoundError "
                "(recorded streams: %s)",
                settings.dump_dir,
                self.stream,
                ", ".join(s.key for s in self.store.stream_ids()) or "none",
            )
        if (note := describe_expected(metrics, settings.verdict)) is not None:
            logger.info(note)
        self._check_fingerprint(manifest.fingerprint)
        self.prefetcher = Prefetcher(self._load, self._next_recorded, enabled=settings.prefetch, place=place)

    def _next_recorded(self, step: int) -> int | None:
        candidate = step + 1
        return candidate if self.store.contains(self.stream, candidate) else None

    def _check_fingerprint(self, recorded: dict[str, Any] | None) -> None:
        """Compare the environment the dump run recorded (``recorded``, from the manifest the
        pre-flight read) with this run's (``fingerprint:`` says whether a difference is an error)."""
        if self.settings.fingerprint is FingerprintPolicy.OFF:
            return
        if not recorded:
            return
        differences = compare_fingerprints(recorded, fingerprint())
        if not differences:
            return
        table = format_differences(differences)
        message = (
            f"[RolloutMock] this run's environment differs from the one that recorded "
            f"{self.settings.dump_dir}; replayed numbers may not match:\n{table}"
        )
        relevant = any(d.numerics_relevant for d in differences)
        if self.settings.fingerprint is FingerprintPolicy.ERROR and relevant:
            raise FingerprintMismatchError(
                message + "\nSet `fingerprint: warn` to only warn.",
                mode=self.mode.value,
                split=self.split,
                path=self.settings.dump_dir,
            )
        logger.warning(message)

    def _load(self, step: int) -> Any:
        entry = self.store.entry(self.stream, step)
        if self.settings.replay_rows is None and self.settings.replay_keys is None:
            batch = self.store.load(self.stream, step, trusted=self.settings.trust_pickle)
        else:
            batch = self._load_part(step, entry)
        self.loaded += 1
        logger.log(
            step_log_level(self.loaded),
            "[RolloutMock] Loaded step %d: %s (samples=%s)",
            step,
            self.store.describe_location(self.stream, step),
            None if entry is None else entry.samples,
        )
        return batch

    def _load_part(self, step: int, entry: Any) -> Any:
        """replay_rows / replay_keys: this rank's rows and the wanted keys only."""
        if entry is None:
            raise self.store.missing_step_error(self.stream, step, mode=self.mode.value)
        rows = None
        layout = self.settings.replay_rows
        if layout is not None:
            if entry.samples is None:
                raise IncompleteDumpError(
                    f"[RolloutMock] replay_rows: step {step} of {self.stream} has no batch dimension "
                    f"recorded ({entry.type}); replay whole batches (remove replay_rows)",
                    mode=self.mode.value, split=self.split, step=step)
            rows = rank_rows(entry.samples, layout.dp_rank, layout.dp_size)
        keys = None if self.settings.replay_keys is None else list(self.settings.replay_keys)
        return load_partial(self.store, self.stream, step, keys=keys, rows=rows, trusted=self.settings.trust_pickle)

    def replay_source(self, step: int) -> int | None:
        """The recorded step that serves run step ``step``; ``None`` when the step must be run
        and recorded live (``on_missing_step: record``). Raises :class:`StepNotFoundError` under
        ``on_missing_step: error`` (and when nothing at all is recorded)."""
        source = self.settings.dump_step(step)
        if self.store.contains(self.stream, source):
            return source
        policy = self.settings.on_missing_step
        if policy is MissingStepPolicy.RECORD:
            return None
        recorded = self.store.steps(self.stream)
        if policy is MissingStepPolicy.REPEAT_NEAREST and recorded:
            earlier = [s for s in recorded if s < source]
            nearest = earlier[-1] if earlier else recorded[0]
            if source not in self._repeat_warned:
                self._repeat_warned.add(source)
                logger.warning(
                    "[RolloutMock] step %d of %s is not recorded; on_missing_step=repeat_nearest "
                    "serves recorded step %d instead", source, self.stream, nearest,
                )
            return nearest
        base = self.store.missing_step_error(self.stream, source, mode=self.mode.value)
        mapped = "" if source == step else f" (run step {step} maps to dump step {source})"
        raise StepNotFoundError(
            f"{base}{mapped}\nTo go on anyway: on_missing_step: repeat_nearest (serve the nearest "
            f"recorded step) or on_missing_step: record (run the real scheduler for it).",
            mode=self.mode.value, split=self.split, step=source, path=base.path,
        )

    def _served(self, batch: Any) -> Any:
        if self.settings.subsample is not None:
            return subsample_batch(batch, self.settings.subsample)
        return batch

    def replay_at(self, source: int) -> Any:
        """Serve recorded step ``source`` (through the prefetcher, then ``subsample``)."""
        assert self.prefetcher is not None
        return self._served(self.prefetcher.get(source))

    async def replay_at_async(self, source: int) -> Any:
        assert self.prefetcher is not None
        return self._served(await self.prefetcher.get_async(source))

    # ------------------------------------------------------------------ on_missing_step: record
    def _open_recorder(self) -> None:
        """Mock mode, ``on_missing_step: record``: take the stream's writer lock on first use."""
        if self._recorder_open:
            return
        self.store.open_writer(self.stream)
        self._recorder_open = True

    def record_missing(self, source: int, batch: Any, *, method: str, seconds: float | None,
                       call: dict[str, Any] | None) -> None:
        """Write a batch produced live for a missing step (synchronously: it is rare)."""
        self._open_recorder()
        entry = self.store.save(self.stream, source, batch, BatchInfo.of(batch), method=method,
                                rollout_seconds=seconds, overwrite=False, call=call)
        logger.warning(
            "[RolloutMock] step %d of %s was not recorded: on_missing_step=record ran the real "
            "scheduler and recorded it (%s, %.2f MB)",
            source, self.stream, self.store.describe_location(self.stream, source), entry.size / 1e6,
        )

    @property
    def last_stall(self) -> float:
        return 0.0 if self.prefetcher is None else self.prefetcher.last_stall


# --------------------------------------------------------------------------- expected values
# The dump run's training metrics (:meth:`~rollout_mock.storage.store.Store.expected_file`; written and
# checked by :class:`rollout_mock.compare.expected.ExpectedMetrics`): a replay announces them at start-up.
def describe_expected(path: Path | None, verdict: VerdictAction) -> str | None:
    """Mock mode's start-up line about the dump run's metrics at ``path`` (``None`` when the dump
    holds none: :meth:`~rollout_mock.storage.store.Store.expected_file`); ``verdict``: the config's
    ``verdict.action``."""
    if path is None:
        return None
    if verdict is VerdictAction.OFF:
        return f"[RolloutMock] {path} holds the dump run's metrics (verdict: off, not compared)"
    return (f"[RolloutMock] {path} holds the dump run's metrics; verdict={verdict.value}: "
            f"metrics logged through MetricsWriter(..., expected=<scheduler>) are compared as they are logged")

"""AReaL: one call wraps the engine whose ``rollout_batch`` / ``prepare_batch`` feed training.

::

    actor_rollout = wrap_areal(self.actor, cfg, step=lambda: global_step)    # or .step = N per step
    batch = actor_rollout.prepare_batch(dataloader, workflow=workflow, ...)    # list of trajectory dicts

Both methods return a list of trajectory dicts (tensors ``[group, seqlen, ...]``; ``None`` for a
rejected one), recorded and replayed as is. They carry no step argument: pass ``step=`` a
zero-argument callable returning the trainer's 0-based ``global_step`` (read before every call;
AReaL's PR #1407 numbers its files the same way), or set ``wrapper.step = global_step`` each
iteration; otherwise each call takes the next step. Per-rank dumps (SPMD, each data-parallel head
sees a different subset): ``ranks: all``. Other attributes pass through to the engine.

Single-controller mode (AReaL >= 1.0): the controller's ``rollout_batch``/``prepare_batch``
return *remote-tensor handles* (``areal.infra.rpc.rtensor.RTensor``: a shard id, the address of
the worker holding the data and a ``meta``-device tensor of its shape) instead of tensors. Their
data lives in another process and is gone by replay time, so dump mode records the values: each
handle is fetched with its own ``to_local()`` (AReaL's batched fetch, cached by AReaL) before the
batch is captured, and the caller still gets the handles. A handle whose data cannot be fetched
stops the dump with :class:`~rollout_mock.errors.UnrecordableBatchError` at dump time, naming
the handle; replay never meets a handle. Mock mode serves the recorded values as local tensors.

Asynchronous rollout (``submit(data, workflow)`` many times, then ``wait(count)``; staleness
bounded by ``max_head_offpolicyness``): what ``wait`` returns depends on which rollouts finished
first, so it is recorded as *consumed*: each ``wait`` call is one step of the ``{split}/wait``
stream (its step: ``step=``, or the next), holding the trajectories in the order ``wait`` returned
them, each with its ``versions`` (the weight version of every token; the per-row min/max is the
record's provenance). Mock mode: ``submit`` does nothing (no engine, no generation) and ``wait``
serves the record, whatever the timing; a ``count`` other than the recorded call's is a
:class:`~rollout_mock.errors.ReplayMismatchError` naming the step and both counts (as is a
``prepare_batch`` whose ``dataloader.batch_size`` differs from the recorded batch's length).
Nothing is keyed by the submitted data: ``wait`` is keyed by its step, in call order.

Resume: pass ``step=`` (the trainer's ``global_step``, restored by AReaL's recover/checkpoint
logic), or ``state_dict()``/``load_state_dict()`` of the wrapper with your checkpoint: the resumed
mock run then serves the records the dump run made at those steps.

AReaL's own ``trajectory_debug`` files are read by :mod:`rollout_mock.adapters.foreign`.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from rollout_mock.adapters.frameworks import is_tokenizer, tokenizer_fingerprint
from rollout_mock.config import config_parts, load_config
from rollout_mock.errors import ConfigError, ReplayMismatchError, UnrecordableBatchError
from rollout_mock.storage.store import open_store
from rollout_mock.wrap.scheduler import MockScheduler

__all__ = ["BATCH_METHODS", "ENGINE_CONTROL", "ArealRollout", "LoaderTurn", "is_remote_tensor", "localize",
           "request_key", "versions_provenance", "wrap_areal"]

#: The engine's batch methods the wrapper records and replays (those the engine has).
BATCH_METHODS = ("rollout_batch", "prepare_batch")


def is_remote_tensor(value: Any) -> bool:
    """An AReaL remote-tensor handle (``RTensor``): a ``shard`` and a ``to_local()`` (duck-typed:
    AReaL is not imported)."""
    return (type(value).__name__ == "RTensor" and hasattr(value, "shard")
            and callable(getattr(value, "to_local", None)))


def localize(batch: Any, *, _depth: int = 0) -> Any:
    """``batch`` with every remote-tensor handle replaced by its values (lists, tuples and dicts
    are rebuilt; other values are kept). :class:`UnrecordableBatchError` when a handle's data
    cannot be fetched."""
    if is_remote_tensor(batch):
        try:
            return batch.to_local()
        except Exception as exc:  # noqa: BLE001 - any fetch failure means: this batch cannot be recorded
            shard = getattr(batch, "shard", None)
            raise UnrecordableBatchError(
                f"[RolloutMock] AReaL (mode=dump): a remote-tensor handle of the batch could not be fetched "
                f"({type(exc).__name__}: {exc}; shard {getattr(shard, 'shard_id', '?')!r} on "
                f"{getattr(shard, 'node_addr', '?')!r}); its values are needed to record the step (replay "
                f"cannot reach the worker that holds them). Record while the rollout workers are up, or "
                f"localize the batch (RTensor.localize) before returning it.", mode="dump") from exc
    if _depth > 32:
        return batch
    if isinstance(batch, list):
        return [localize(item, _depth=_depth + 1) for item in batch]
    if isinstance(batch, tuple) and not hasattr(batch, "_fields"):
        return tuple(localize(item, _depth=_depth + 1) for item in batch)
    if isinstance(batch, dict):
        return {key: localize(value, _depth=_depth + 1) for key, value in batch.items()}
    return batch

def versions_provenance(batch: Any) -> dict[str, Any]:
    """Per trajectory of ``batch`` (a list of trajectory dicts; ``None`` for a rejected one), per
    row: the lowest and highest weight version of its generated tokens (``versions`` >= 0; AReaL
    writes -1 on prompt tokens), ``None`` where a trajectory has no ``versions`` tensor here (a
    remote-tensor handle of single-controller mode: its values are fetched for the record only)."""
    import torch

    lows: list[Any] = []
    highs: list[Any] = []
    for item in batch if isinstance(batch, list) else [batch]:
        versions = item.get("versions") if isinstance(item, dict) else None
        if not isinstance(versions, torch.Tensor) or versions.device.type == "meta":  # a remote handle: no values
            lows.append(None)
            highs.append(None)
            continue
        rows = versions if versions.dim() > 1 else versions[None]
        low, high = [], []
        for row in rows:
            generated = row[row >= 0]
            low.append(int(generated.min()) if generated.numel() else None)
            high.append(int(generated.max()) if generated.numel() else None)
        lows.append(low)
        highs.append(high)
    return {"min": lows, "max": highs}


class _WaitAPI:
    """The signature of AReaL's ``wait`` (``areal.api.engine_api.InferenceEngine``), for mock
    mode without an engine."""

    def wait(self, count: int, timeout: float | None = None, raise_timeout: bool = True) -> list[Any]:
        raise NotImplementedError


def _provenance_option() -> dict[str, Any]:
    if "provenance" in inspect.signature(MockScheduler.__init__).parameters:
        return {"provenance": versions_provenance}
    return {}


#: What AReaL's trainer calls on its rollout engine besides the batch methods (weight updates,
#: offloading, shutdown). In mock mode there is no engine: these become no-ops (``get_version``
#: returns the last ``set_version``), as the ``NoOpRollout`` of AReaL's PR #1407 does.
ENGINE_CONTROL = ("pause", "resume", "set_version", "get_version", "destroy", "offload", "onload",
                  "pause_generation", "continue_generation")


# --------------------------------------------------------------------------- the data loader
class _LoaderFeed:
    """One data loader read in one sequence of batches by both the wrapper and the engine.

    ``prepare_batch(dataloader, ...)`` never shows its prompts: the engine draws them from the
    loader itself (AReaL's ``cycle_dataloader``, ahead of time when rollouts run asynchronously),
    and in mock mode there is no engine. So the wrapper draws the loader's ``k``-th batch for its
    ``k``-th call (what the request digest compares) and the engine reads the very same sequence
    through :class:`LoaderTurn`; in mock mode the wrapper alone draws, so the loader advances as in
    the dump run (its state_dict too). An exhausted loader starts its next epoch, as AReaL's does.
    Batches are kept until both readers are past them."""

    def __init__(self, loader: Any, engine_reads: bool) -> None:
        self.loader = loader
        self.engine_reads = engine_reads
        self._iterator: Iterator[Any] | None = None
        self._drawn: list[Any] = []
        self._base = 0
        self._claimed = 0
        self._served = 0
        self._lock = threading.Lock()

    def _at(self, index: int) -> Any:
        while self._base + len(self._drawn) <= index:
            if self._iterator is None:
                self._iterator = iter(self.loader)
            try:
                batch = next(self._iterator)
            except StopIteration:
                self._iterator = iter(self.loader)  # the next epoch
                try:
                    batch = next(self._iterator)
                except StopIteration:
                    raise ConfigError("[RolloutMock] AReaL: prepare_batch's data loader yields no batch") from None
            self._drawn.append(batch)
        return self._drawn[index - self._base]

    def _trim(self) -> None:
        low = min(self._claimed, self._served) if self.engine_reads else self._claimed
        if low > self._base:
            del self._drawn[: low - self._base]
            self._base = low

    def claim(self) -> Any:
        """The batch of the wrapper's next call."""
        with self._lock:
            batch = self._at(self._claimed)
            self._claimed += 1
            self._trim()
            return batch

    def batches(self) -> Iterator[Any]:
        """The engine's endless reading of the same sequence."""
        while True:
            with self._lock:
                batch = self._at(self._served)
                self._served += 1
                self._trim()
            yield batch


class LoaderTurn:
    """What ``prepare_batch`` gets in place of the data loader: iterating it reads the loader's
    batches in order (the same sequence whichever object of a loader's turns the engine kept);
    every other attribute (``batch_size``, ``state_dict``...) is the loader's. :attr:`batch` is
    the loader's batch for this call: what request matching compares (:func:`request_key`)."""

    def __init__(self, feed: _LoaderFeed, batch: Any) -> None:
        self._feed = feed
        self.batch = batch

    def __iter__(self) -> Iterator[Any]:
        return self._feed.batches()

    def __len__(self) -> int:
        return len(self._feed.loader)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") or attribute in ("_feed", "batch"):
            raise AttributeError(attribute)
        return getattr(self._feed.loader, attribute)

    def __repr__(self) -> str:
        return f"LoaderTurn({self._feed.loader!r})"


def _is_loader(value: Any) -> bool:
    """A data loader (an iterable that is not a batch: not a list, tuple, mapping or string)."""
    return value is not None and hasattr(value, "__iter__") and not isinstance(
        value, list | tuple | dict | str | bytes | Mapping) and not hasattr(value, "shape")


# --------------------------------------------------------------------------- the request key
@functools.lru_cache(maxsize=8)
def _path_fingerprint(path: str, stamp: float) -> Any:
    from transformers import AutoTokenizer

    return tokenizer_fingerprint(AutoTokenizer.from_pretrained(path))


def _tokenizer_value(value: Any) -> Any:
    """A tokenizer, or the local directory of one (AReaL's ``workflow_kwargs["tokenizer"]``), as its
    fingerprint (:func:`~rollout_mock.adapters.tokenizer_fingerprint`): another copy on another
    machine or under another model path is the same request. Anything else as it is."""
    if is_tokenizer(value):
        return tokenizer_fingerprint(value)
    if isinstance(value, str) and os.path.isdir(value):
        try:
            return _path_fingerprint(os.path.realpath(value), os.path.getmtime(value))
        except Exception:  # noqa: BLE001 - not a tokenizer's directory: the path is the request
            return value
    return value


def _keyed(value: Any, depth: int = 0) -> Any:
    if isinstance(value, LoaderTurn):
        return value.batch
    if isinstance(value, Mapping) and depth < 2:
        return {k: _tokenizer_value(v) if "tokenizer" in str(k) else _keyed(v, depth + 1) for k, v in value.items()}
    if depth < 2 and not isinstance(value, type) and is_tokenizer(getattr(value, "tokenizer", None)):
        # a workflow object holding its tokenizer: the object by type, the tokenizer by content
        return {"type": type(value).__qualname__, "tokenizer": tokenizer_fingerprint(value.tokenizer)}
    return value


def request_key(arguments: dict[str, Any]) -> dict[str, Any]:
    """What request matching compares of a ``prepare_batch``/``rollout_batch`` call: its
    arguments, with the data loader replaced by the batch it yields for this call
    (:class:`LoaderTurn`) and tokenizers (objects, or the directory in ``workflow_kwargs``) by
    their fingerprints."""
    return {name: _keyed(value) for name, value in arguments.items()}


def _recorded_methods(config: Any, split: str) -> tuple[str, ...]:
    """The batch methods the dump recorded for ``split`` (mock mode without an engine)."""
    cfg = load_config(config)
    if not cfg.enable or not cfg.mode.replays:
        return BATCH_METHODS
    parts = config_parts(cfg)
    try:
        store = open_store(parts.store)
    except Exception:  # noqa: BLE001 - the wrapper itself says what is wrong with the dump
        return BATCH_METHODS
    try:
        found = {m for stream in store.stream_ids() if stream.split == split for m in store.methods(stream)}
    finally:
        store.close()
    return tuple(m for m in BATCH_METHODS if m in found) or BATCH_METHODS


class ArealRollout:
    """The engine with its batch methods recorded/replayed (see the module docstring)."""

    def __init__(self, engine: Any, config: Any, *, step: Callable[[], int] | None = None,
                 methods: Iterable[str] | None = None, split: str = "train",
                 factory: Callable[[], Any] | None = None,
                 rollout_settings: Mapping[str, Any] | None = None, tokenizer: Any = None) -> None:
        if methods is None:
            methods = [m for m in BATCH_METHODS if callable(getattr(engine, m, None))] if engine is not None \
                else _recorded_methods(config, split)
            if not methods:
                raise ConfigError(
                    f"wrap_areal: {type(engine).__qualname__} has neither rollout_batch nor prepare_batch")
        settings = dict(rollout_settings or {})
        if tokenizer is not None:
            settings["tokenizer"] = tokenizer_fingerprint(tokenizer) if is_tokenizer(tokenizer) \
                else _tokenizer_value(tokenizer)
        self._mock = MockScheduler(engine, config, methods=tuple(methods), split=split, factory=factory,
                                   rollout_settings=settings if rollout_settings is not None or settings else None,
                                   capture=localize, framework="areal",
                                   match_keys=dict.fromkeys(methods, request_key), **_provenance_option())
        self._engine = engine
        self._split = split
        self._config = config
        self._rollout_settings = settings if rollout_settings is not None or settings else None
        self._waits: MockScheduler[Any] | None = None
        self._step = step
        self._version = 0
        self._feeds: dict[int, _LoaderFeed] = {}
        #: mock mode without an engine: the engine-control calls are no-ops
        self._no_engine = engine is None and self._mock.enabled and not self._mock.config.mode.runs_scheduler
        for method in self._mock.methods:
            setattr(self, method, self._stepped(method))

    def _turn(self, loader: Any) -> Any:
        """``prepare_batch``'s data loader as this call's :class:`LoaderTurn` (see :class:`_LoaderFeed`)."""
        if not self._mock.enabled or not _is_loader(loader) or isinstance(loader, LoaderTurn):
            return loader
        feed = self._feeds.get(id(loader))
        if feed is None or feed.loader is not loader:
            feed = self._feeds[id(loader)] = _LoaderFeed(loader, engine_reads=self._mock.config.mode.runs_scheduler)
        return LoaderTurn(feed, feed.claim())

    def _replays(self) -> bool:
        return self._mock.enabled and not self._mock.config.mode.runs_scheduler

    def _count_mismatch(self, method: str, asked: int, recorded: int, step: int) -> ReplayMismatchError:
        mode = self._mock.config.mode.value
        return ReplayMismatchError(
            f"[RolloutMock] AReaL (mode={mode}, split={self._split}, step={step}): {method} asks for {asked} "
            f"trajectories, the recorded call returned {recorded}: another batch size than the dump run's "
            f"(nothing is cycled or cut to fit)", mode=mode, split=self._split, step=step, method=method,
            argument="count", recorded=str(recorded), live=str(asked))

    def _stepped(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self._step is not None:
                self._mock.step = int(self._step())
            if method == "prepare_batch":
                if args:
                    args = (self._turn(args[0]), *args[1:])
                elif "dataloader" in kwargs:
                    kwargs["dataloader"] = self._turn(kwargs["dataloader"])
            step = self._mock.step
            batch = getattr(self._mock, method)(*args, **kwargs)
            if method == "prepare_batch" and self._replays() and isinstance(batch, list):
                loader = args[0] if args else kwargs.get("dataloader")
                size = getattr(loader, "batch_size", None)
                if isinstance(size, int) and size != len(batch):
                    raise self._count_mismatch(method, size, len(batch), step)
            return batch

        call.__name__ = method
        return call

    def submit(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        """AReaL's ``submit(data, workflow, ...)``: passed to the engine; nothing in mock mode
        (the trajectories ``wait`` returns are the recorded ones)."""
        if self._replays():
            return None
        return self._real().submit(data, *args, **kwargs)

    def _real(self) -> Any:
        engine = self._mock.scheduler
        if engine is None:
            raise ConfigError("[RolloutMock] AReaL: no engine to call (pass it, or a factory)")
        return engine

    def wait(self, count: int, *args: Any, **kwargs: Any) -> Any:
        """AReaL's ``wait(count, ...)``: recorded (dump) or served (mock) as consumed; see the
        module docstring."""
        if not self._mock.enabled:
            return self._real().wait(count, *args, **kwargs)
        if self._waits is None:
            self._waits = MockScheduler(None if self._replays() else self._mock.scheduler, self._config,
                                        methods=("wait",), split=self._split, name="wait", spec=_WaitAPI,
                                        rollout_settings=self._rollout_settings, capture=localize,
                                        match_keys={"wait": lambda arguments: None}, **_provenance_option())
        if self._step is not None:
            self._waits.step = int(self._step())
        step = self._waits.step
        batch = self._waits.wait(count, *args, **kwargs)
        if self._replays() and isinstance(batch, list) and len(batch) != int(count):
            raise self._count_mismatch("wait", int(count), len(batch), step)
        return batch

    @property
    def step(self) -> int:
        return self._mock.step

    @step.setter
    def step(self, value: int) -> None:
        self._mock.step = value

    def state_dict(self) -> dict[str, Any]:
        return self._mock.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self._mock.load_state_dict(state)

    def close(self) -> None:
        if self._waits is not None:
            self._waits.close()
        self._mock.close()

    def __enter__(self) -> ArealRollout:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self._mock.__exit__(exc_type, *exc_info)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") or attribute in ("_mock", "_step", "_version", "_no_engine", "_feeds", "_waits",
                                                       "_engine", "_split", "_config", "_rollout_settings"):
            raise AttributeError(attribute)
        if attribute in ENGINE_CONTROL and self._no_engine:
            return self._control(attribute)
        return getattr(self._mock, attribute)

    def _control(self, name: str) -> Callable[..., Any]:
        def control(*args: Any, **kwargs: Any) -> Any:
            if name == "set_version" and args:
                self._version = int(args[0])
            return self._version if name == "get_version" else None

        control.__name__ = name
        return control


def wrap_areal(engine: Any, config: Any, *, step: Callable[[], int] | None = None,
               methods: Iterable[str] | None = None,
               factory: Callable[[], Any] | None = None,
               rollout_settings: Mapping[str, Any] | None = None, tokenizer: Any = None) -> ArealRollout:
    """``engine`` (AReaL's train/inference engine, or ``None`` with ``factory`` in mock mode) with
    ``rollout_batch``/``prepare_batch`` recorded or replayed: ``methods`` (default: those of
    :data:`BATCH_METHODS` the engine has; without an engine, those the dump recorded).
    ``rollout_settings``: e.g. the ``gconfig`` (GenerationHyperparameters) and batch size, and
    ``tokenizer`` (the tokenizer, or its local directory: fingerprinted with its chat template),
    compared by mock mode's pre-flight check."""
    return ArealRollout(engine, config, step=step, methods=methods, factory=factory,
                        rollout_settings=rollout_settings, tokenizer=tokenizer)

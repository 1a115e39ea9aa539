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

Resume: pass ``step=`` (the trainer's ``global_step``, restored by AReaL's recover/checkpoint
logic), or ``state_dict()``/``load_state_dict()`` of the wrapper with your checkpoint: the resumed
mock run then serves the records the dump run made at those steps.

AReaL's own ``trajectory_debug`` files are read by :mod:`rollout_mock.adapters.foreign`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rollout_mock.errors import UnrecordableBatchError
from rollout_mock.wrap.scheduler import MockScheduler

__all__ = ["ENGINE_CONTROL", "ArealRollout", "is_remote_tensor", "localize", "wrap_areal"]


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

#: What AReaL's trainer calls on its rollout engine besides the batch methods (weight updates,
#: offloading, shutdown). In mock mode there is no engine: these become no-ops (``get_version``
#: returns the last ``set_version``), as the ``NoOpRollout`` of AReaL's PR #1407 does.
ENGINE_CONTROL = ("pause", "resume", "set_version", "get_version", "destroy", "offload", "onload",
                  "pause_generation", "continue_generation")


class ArealRollout:
    """The engine with its batch methods recorded/replayed (see the module docstring)."""

    def __init__(self, engine: Any, config: Any, *, step: Callable[[], int] | None = None,
                 methods: Iterable[str] = ("rollout_batch", "prepare_batch"), split: str = "train",
                 factory: Callable[[], Any] | None = None,
                 rollout_settings: Mapping[str, Any] | None = None) -> None:
        self._mock = MockScheduler(engine, config, methods=tuple(methods), split=split, factory=factory,
                                   rollout_settings=rollout_settings, capture=localize)
        self._step = step
        self._version = 0
        #: mock mode without an engine: the engine-control calls are no-ops
        self._no_engine = engine is None and self._mock.enabled and not self._mock.config.mode.runs_scheduler
        for method in self._mock.methods:
            setattr(self, method, self._stepped(method))

    def _stepped(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self._step is not None:
                self._mock.step = int(self._step())
            return getattr(self._mock, method)(*args, **kwargs)

        call.__name__ = method
        return call

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
        self._mock.close()

    def __enter__(self) -> ArealRollout:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self._mock.__exit__(exc_type, *exc_info)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") or attribute in ("_mock", "_step", "_version", "_no_engine"):
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
               methods: Iterable[str] = ("rollout_batch", "prepare_batch"),
               factory: Callable[[], Any] | None = None,
               rollout_settings: Mapping[str, Any] | None = None) -> ArealRollout:
    """``engine`` (AReaL's train/inference engine, or ``None`` with ``factory`` in mock mode) with
    ``rollout_batch``/``prepare_batch`` recorded or replayed. ``rollout_settings``: e.g. the
    ``gconfig`` (GenerationHyperparameters) and batch size, compared by mock mode's pre-flight
    check."""
    return ArealRollout(engine, config, step=step, methods=methods, factory=factory,
                        rollout_settings=rollout_settings)

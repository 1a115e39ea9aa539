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

AReaL's own ``trajectory_debug`` files are read by :mod:`rollout_mock.adapters.foreign`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rollout_mock.wrap.scheduler import MockScheduler

__all__ = ["ENGINE_CONTROL", "ArealRollout", "wrap_areal"]

#: What AReaL's trainer calls on its rollout engine besides the batch methods (weight updates,
#: offloading, shutdown). In mock mode there is no engine: these become no-ops (``get_version``
#: returns the last ``set_version``), as the ``NoOpRollout`` of AReaL's PR #1407 does.
ENGINE_CONTROL = ("pause", "resume", "set_version", "get_version", "destroy", "offload", "onload",
                  "pause_generation", "continue_generation")


class ArealRollout:
    """The engine with its batch methods recorded/replayed (see the module docstring)."""

    def __init__(self, engine: Any, config: Any, *, step: Callable[[], int] | None = None,
                 methods: Iterable[str] = ("rollout_batch", "prepare_batch"), split: str = "train",
                 factory: Callable[[], Any] | None = None) -> None:
        self._mock = MockScheduler(engine, config, methods=tuple(methods), split=split, factory=factory)
        self._step = step
        self._version = 0
        #: mock mode without an engine: the engine-control calls are no-ops
        self._no_engine = engine is None and self._mock.enabled and self._mock.config.mode.replays
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
               factory: Callable[[], Any] | None = None) -> ArealRollout:
    """``engine`` (AReaL's train/inference engine, or ``None`` with ``factory`` in mock mode) with
    ``rollout_batch``/``prepare_batch`` recorded or replayed."""
    return ArealRollout(engine, config, step=step, methods=methods, factory=factory)

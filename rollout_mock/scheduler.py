"""Wrapping a rollout scheduler: :class:`MockScheduler` (around an object) and
:func:`mock_class` (a subclass, so the interception runs inside a Ray actor).

Both intercept only the batch-producing methods named in ``methods``; everything else passes
through to the real scheduler untouched.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rollout_mock.config import RolloutMockConfig, load_config
from rollout_mock.errors import ConfigError, SchedulerUnavailableError
from rollout_mock.interceptor import (
    Interceptor,
    detect_convention,
    step_arg_position,
)
from rollout_mock.modes import Convention
from rollout_mock.store import StepStore

_OWN_ATTRIBUTES = frozenset(
    {"scheduler", "config", "split", "methods", "interceptor", "step", "state_dict",
     "load_state_dict", "close", "flush", "enabled"}
)


class _RemoteMethod:
    """Stands in for a Ray ``ActorMethod``: ``.remote(...)`` returns an ``ObjectRef``."""

    def __init__(self, call: Callable[..., Any], options: Callable[..., Any] | None = None) -> None:
        self._call = call
        self._options = options

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(None, args, kwargs)

    def options(self, **options: Any) -> _RemoteMethod:
        """Ray call options (``num_returns``...) are forwarded in dump mode, ignored in mock mode."""
        return _RemoteMethod(lambda _, a, k: self._call(options, a, k), self._options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("Actor methods cannot be called directly; use .remote(...)")


def _method_info(method: str, target: Any, *, bound: bool) -> dict[str, Any]:
    attribute = getattr(target, method)
    convention = detect_convention(attribute)
    function = attribute
    if convention is Convention.RAY:
        function = getattr(attribute, "_function", None) or getattr(attribute, "__wrapped__", None)
        bound = False
    return {"convention": convention.value, "step_arg": step_arg_position(function, bound=bound)}


def _spec_methods(spec: Any, methods: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Conventions from a class (or a ``ray.remote`` actor class), never instantiated."""
    actor_class = getattr(spec, "__ray_actor_class__", None)
    cls = actor_class if actor_class is not None else spec
    info: dict[str, dict[str, Any]] = {}
    for method in methods:
        function = getattr(cls, method, None)
        if function is None:
            raise ConfigError(f"spec {cls.__qualname__} has no method {method!r} to intercept")
        convention = Convention.RAY if actor_class is not None else detect_convention(function)
        info[method] = {"convention": convention.value, "step_arg": step_arg_position(function, bound=False)}
    return info


class MockScheduler:
    """Record or replay what a rollout scheduler's batch methods return.

    Args:
        scheduler: the real scheduler: an object, or a Ray actor handle. May be ``None`` in mock
            mode (nothing is ever called on it) or when ``factory`` is given.
        config: the ``rollout_mock:`` block in any form :func:`~rollout_mock.load_config` takes.
        split: ``"train"`` or ``"val"`` (any name): recorded separately.
        methods: names of the batch-producing methods (ROLL ``get_batch``; AReaL
            ``rollout_batch``/``prepare_batch``; verl ``generate_sequences``).
        factory: zero-argument callable that builds the scheduler; called only when the real
            scheduler is needed (dump mode, or ``enable: false``), never in mock mode.
        spec: the scheduler's class (never instantiated), telling mock mode each method's calling
            convention when there is no scheduler; otherwise the convention recorded in the
            manifest is used.
        name: namespace of this scheduler's files when several share a dump_dir and split.
        store: a :class:`~rollout_mock.store.StepStore` to use instead of the dump directory.

    The step of a call is its ``global_step`` argument (keyword or positional), else
    ``meta_info["global_step"]`` of an argument, else an internal counter (:attr:`step`) that
    :meth:`state_dict` / :meth:`load_state_dict` save and restore.

    ``enable: false`` means no interception at all: attribute access goes straight to the real
    scheduler. Attributes this class defines itself (``close``, ``state_dict``...) wrap the
    scheduler's own ones of the same name, which are still called.
    """

    def __init__(
        self,
        scheduler: Any = None,
        config: Any = None,
        *,
        split: str = "train",
        methods: Iterable[str] = ("get_batch",),
        factory: Callable[[], Any] | None = None,
        spec: Any = None,
        name: str | None = None,
        store: StepStore | None = None,
    ) -> None:
        self.config: RolloutMockConfig = load_config(config if config is not None else {})
        self.split = split
        self.methods: tuple[str, ...] = (methods,) if isinstance(methods, str) else tuple(methods)
        if not self.methods:
            raise ConfigError("MockScheduler needs at least one method name to intercept")
        self.enabled = self.config.enable
        self.interceptor: Interceptor | None = None
        self._intercepted: dict[str, Any] = {}
        needs_real = not self.enabled or self.config.mode.records
        if scheduler is None and factory is not None and needs_real:
            scheduler = factory()
        if scheduler is None and needs_real:
            what = "enable: false" if not self.enabled else "mode=dump"
            raise ConfigError(
                f"MockScheduler ({what}, split={split}) needs the real scheduler: pass it, or a "
                f"factory that builds it (factories are never called in mock mode)"
            )
        self.scheduler = scheduler
        if not self.enabled:
            return
        self.interceptor = Interceptor(self.config, split=split, name=name, store=store)
        conventions = self._conventions(scheduler, spec)
        if self.config.mode.records and self.interceptor.writes:
            self.interceptor.store.set_methods(self.interceptor.stream, conventions)
        for method in self.methods:
            self._intercepted[method] = self._make(method, conventions[method])

    def __repr__(self) -> str:
        state = "disabled" if self.interceptor is None else f"{self.config.mode.value}, {self.interceptor.stream}"
        return f"MockScheduler({self.scheduler!r}, {state}, methods={list(self.methods)})"

    # ------------------------------------------------------------------ conventions
    def _conventions(self, scheduler: Any, spec: Any) -> dict[str, dict[str, Any]]:
        assert self.interceptor is not None
        if scheduler is not None:
            info = {}
            for method in self.methods:
                if not hasattr(scheduler, method):
                    raise ConfigError(f"{type(scheduler).__qualname__} has no method {method!r} to intercept")
                info[method] = _method_info(method, scheduler, bound=True)
            return info
        if spec is not None:
            return _spec_methods(spec, self.methods)
        recorded = self.interceptor.store.methods(self.interceptor.stream)
        info = {}
        for method in self.methods:
            if method not in recorded:
                raise ConfigError(
                    f"mock mode without a scheduler: the manifest of {self.config.dump_dir} does not "
                    f"record how {self.split}.{method} is called (recorded: {sorted(recorded) or 'none'}); "
                    f"pass spec=<scheduler class> or check `methods`"
                )
            info[method] = recorded[method]
        return info

    def _make(self, method: str, info: Mapping[str, Any]) -> Any:
        convention = Convention(info["convention"])
        position = info.get("step_arg")
        interceptor = self.interceptor
        assert interceptor is not None
        real = None if self.scheduler is None else getattr(self.scheduler, method)

        if convention is Convention.RAY:
            def call_remote(options: dict[str, Any] | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                import ray

                step = interceptor.resolve_step(args, kwargs, position)
                if interceptor.mode.replays:
                    return ray.put(interceptor.replay(step))
                assert real is not None
                interceptor.before_rollout(step)
                remote = real.options(**options) if options else real
                ref = remote.remote(*args, **kwargs)
                if interceptor.records_step(step):
                    # Ray objects are immutable: no snapshot needed; fetch on the writer thread.
                    interceptor.record_later(step, lambda: ray.get(ref), method=method, seconds=None)
                return ref

            return _RemoteMethod(call_remote)

        if convention is Convention.ASYNC:
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                return await interceptor.call_async(method, real, args, kwargs, position)

            if real is not None:
                functools.update_wrapper(call_async, real)
            return call_async

        def call(*args: Any, **kwargs: Any) -> Any:
            return interceptor.call(method, real, args, kwargs, position)

        if real is not None:
            functools.update_wrapper(call, real)
        return call

    # ------------------------------------------------------------------ pass-through
    def __getattr__(self, attribute: str) -> Any:
        intercepted = self.__dict__.get("_intercepted", {})
        if attribute in intercepted:
            return intercepted[attribute]
        scheduler = self.__dict__.get("scheduler")
        if scheduler is None:
            if attribute.startswith("__"):
                raise AttributeError(attribute)
            config = self.__dict__.get("config")
            raise SchedulerUnavailableError(
                f"[RolloutMock] {attribute!r} is not available in mock mode: there is no real "
                f"scheduler (it is never built in mock mode), and only "
                f"{list(self.__dict__.get('methods', ()))} are replayed. Add {attribute!r} to "
                f"`methods` if it returns batches, or avoid calling it in mock mode.",
                mode=None if config is None else config.mode.value,
                split=self.__dict__.get("split"),
            )
        return getattr(scheduler, attribute)

    # ------------------------------------------------------------------ step & state
    @property
    def step(self) -> int:
        """The step the next call without an explicit step will use."""
        return 0 if self.interceptor is None else self.interceptor.next_step

    @step.setter
    def step(self, value: int) -> None:
        if self.interceptor is not None:
            self.interceptor.next_step = value

    def state_dict(self) -> dict[str, Any]:
        """rollout_mock's position, plus the wrapped scheduler's own state if it has one."""
        state: dict[str, Any] = {}
        if self.interceptor is not None:
            state["rollout_mock"] = self.interceptor.state_dict()
        inner = getattr(self.scheduler, "state_dict", None)
        if callable(inner) and not inspect.iscoroutinefunction(inner):
            state["scheduler"] = inner()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (the scheduler part only when there is one)."""
        if self.interceptor is not None and "rollout_mock" in state:
            self.interceptor.load_state_dict(state["rollout_mock"])
        inner = getattr(self.scheduler, "load_state_dict", None)
        if callable(inner) and "scheduler" in state:
            inner(state["scheduler"])

    # ------------------------------------------------------------------ lifecycle
    @property
    def last_stall(self) -> float:
        """Seconds the most recent replayed call waited for its data (0 with a prefetch hit)."""
        return 0.0 if self.interceptor is None else self.interceptor.last_stall

    def flush(self) -> None:
        """Block until every recorded step is on disk; raise a write failure if one happened."""
        if self.interceptor is not None:
            self.interceptor.flush()

    def close(self) -> None:
        """Finish recording (nothing is lost), release the dump directory, then close the
        wrapped scheduler if it has a ``close``. Idempotent for rollout_mock's part."""
        try:
            if self.interceptor is not None:
                self.interceptor.close()
        finally:
            inner = getattr(self.scheduler, "close", None)
            if callable(inner) and detect_convention(inner) is Convention.SYNC:
                inner()

    def __enter__(self) -> MockScheduler:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def mock_class(
    cls: type,
    config: Any,
    *,
    split: str = "train",
    methods: Iterable[str] = ("get_batch",),
    name: str | None = None,
) -> type:
    """A subclass of ``cls`` whose ``methods`` are recorded/replayed inside each instance.

    Made for Ray: ``ray.remote(mock_class(RolloutScheduler, cfg))`` runs the interception inside
    the actor, so ``ray.get(actor.get_batch.remote(data, batch_size))`` is unchanged for the
    driver. In mock mode ``cls.__init__`` is **not** run (it would start inference engines): the
    instance only replays. Async methods record off the actor's event loop.
    """
    resolved = load_config(config)
    method_names = (methods,) if isinstance(methods, str) else tuple(methods)
    for method in method_names:
        if not callable(getattr(cls, method, None)):
            raise ConfigError(f"{cls.__qualname__} has no method {method!r} to intercept")
    if not resolved.enable:
        return cls

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if resolved.mode.records:
            cls.__init__(self, *args, **kwargs)
        self._rollout_mock = _InstanceMock(cls, resolved, split, method_names, name)

    namespace: dict[str, Any] = {"__init__": __init__, "__module__": cls.__module__}
    for method in method_names:
        namespace[method] = _class_level_method(cls, method)
    namespace["rollout_mock_close"] = lambda self: self._rollout_mock.close()
    namespace["rollout_mock_state_dict"] = lambda self: self._rollout_mock.interceptor.state_dict()
    subclass = type(cls.__name__, (cls,), namespace)
    subclass.__qualname__ = cls.__qualname__
    subclass.__doc__ = cls.__doc__
    return subclass


class _InstanceMock:
    """Per-instance state of a :func:`mock_class` instance."""

    def __init__(self, cls: type, config: RolloutMockConfig, split: str, methods: tuple[str, ...], name: str | None) -> None:
        self.interceptor = Interceptor(config, split=split, name=name)
        self.positions = {m: step_arg_position(getattr(cls, m), bound=False) for m in methods}
        if config.mode.records and self.interceptor.writes:
            self.interceptor.store.set_methods(
                self.interceptor.stream,
                {m: {"convention": detect_convention(getattr(cls, m)).value, "step_arg": self.positions[m]} for m in methods},
            )

    def close(self) -> None:
        self.interceptor.close()


def _class_level_method(cls: type, method: str) -> Any:
    original = getattr(cls, method)

    if inspect.iscoroutinefunction(original):
        async def async_method(self: Any, *args: Any, **kwargs: Any) -> Any:
            state: _InstanceMock = self._rollout_mock
            real = functools.partial(original, self)
            return await state.interceptor.call_async(method, real, args, kwargs, state.positions[method])

        return functools.wraps(original)(async_method)

    def sync_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        state: _InstanceMock = self._rollout_mock
        real = functools.partial(original, self)
        return state.interceptor.call(method, real, args, kwargs, state.positions[method])

    return functools.wraps(original)(sync_method)

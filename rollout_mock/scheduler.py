"""Wrapping a rollout scheduler: :class:`MockScheduler` (around an object) and
:func:`mock_class` (a subclass, so the interception runs inside a Ray actor).

Both intercept only the batch-producing methods named in ``methods``; everything else passes
through to the real scheduler untouched.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import logging
import os
import weakref
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

logger = logging.getLogger("rollout_mock")


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
    """Calling convention and ``global_step`` position of ``target.method``.

    For a Ray actor handle, ``target.method`` is an ``ActorMethod``: it has no Python function to
    inspect (no ``_function`` / ``__wrapped__`` in Ray 2.x); its parameters (without ``self``)
    are in ``ActorMethod._signature``, which :func:`step_arg_position` reads.
    """
    attribute = getattr(target, method)
    convention = detect_convention(attribute)
    return {"convention": convention.value, "step_arg": step_arg_position(attribute, bound=bound)}


def _ray_actor_class(spec: Any) -> type | None:
    """The user's class behind a ``ray.remote`` actor class (``ActorClass``), else ``None``.

    Ray 2.x sets ``__ray_actor_class__`` on the ``ActorClass`` (and on its internal modified
    subclass); a plain class does not have it.
    """
    if isinstance(spec, type) and "__ray_actor_class__" not in vars(spec) and not hasattr(spec, "remote"):
        return None
    actor_class = getattr(spec, "__ray_actor_class__", None)
    return actor_class if isinstance(actor_class, type) else None


def _spec_methods(
    spec: Any, methods: Iterable[str], recorded: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """Conventions from a class (or a ``ray.remote`` actor class), never instantiated.

    A ``ray.remote`` class means the Ray convention (``.remote()`` returning an ``ObjectRef``).
    A plain class gives the ``global_step`` position; its convention is the one the dump
    recorded for the method when there is one (a plain ``RolloutScheduler`` class as the spec of
    a dump recorded around its actor handle still replays as ``.remote()``), else the class's own.
    """
    actor_class = _ray_actor_class(spec)
    cls = actor_class if actor_class is not None else spec
    if not isinstance(cls, type):
        raise ConfigError(f"spec must be a class or a ray.remote actor class, got {spec!r}")
    info: dict[str, dict[str, Any]] = {}
    for method in methods:
        function = getattr(cls, method, None)
        if function is None or not callable(function):
            raise ConfigError(f"spec {cls.__qualname__} has no method {method!r} to intercept")
        if actor_class is not None:
            convention = Convention.RAY
        elif recorded and method in recorded and "convention" in recorded[method]:
            convention = Convention(recorded[method]["convention"])
        else:
            convention = detect_convention(function)
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
        name: namespace of this scheduler's files when several share a dump_dir and split
            (``{split}/{name}/step_...``); overrides the config's ``name``.
        store: a :class:`~rollout_mock.store.StepStore` to use instead of the dump directory.
        rank: this process's rank; default: ``torch.distributed.get_rank()`` when a process
            group is initialised, else none. With ``ranks: one`` only ``dump_rank`` writes (the
            other ranks do not touch the dump directory at all) and every rank replays the same
            files; with ``ranks: all`` each rank writes and replays ``step_NNNNNN_rankR.pkl``.

    A Ray actor handle is wrapped on the driver: ``wrapped.get_batch.remote(...)`` returns an
    ``ObjectRef`` as before. Dump mode fetches the batch with ``ray.get`` on the writer thread
    (the call itself does not wait); mock mode creates no actor at all (pass ``factory=`` to
    build the actor only when needed, and ``spec=`` the ``ray.remote`` class or rely on the
    convention recorded in the manifest) and ``.remote()`` returns ``ray.put(<replayed batch>)``.

    The step of a call is its ``global_step`` argument (keyword or positional), else
    ``meta_info["global_step"]`` (or verl's ``"global_steps"``) of an argument, else an internal
    counter (:attr:`step`) that :meth:`state_dict` / :meth:`load_state_dict` save and restore.

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
        rank: int | None = None,
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
        self.interceptor = Interceptor(self.config, split=split, name=name, store=store, rank=rank)
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
        recorded = self.interceptor.store.methods(self.interceptor.stream)
        if spec is not None:
            return _spec_methods(spec, self.methods, recorded if self.config.mode.replays else None)
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

                step, call = interceptor.begin(method, args, kwargs, position)
                if interceptor.mode.replays:
                    return ray.put(interceptor.replay(step))
                assert real is not None
                remote = real.options(**options) if options else real
                ref = remote.remote(*args, **kwargs)
                if interceptor.records_step(step):
                    # Ray objects are immutable: no snapshot needed; fetch on the writer thread.
                    interceptor.record_later(step, lambda: ray.get(ref), method=method, seconds=None, call=call)
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


def _is_async_class(cls: type) -> bool:
    """Whether Ray would run ``cls`` as an async actor (any ``async def`` method)."""
    for attribute in dir(cls):
        try:
            member = inspect.getattr_static(cls, attribute)
        except AttributeError:  # pragma: no cover
            continue
        function = getattr(member, "__func__", member)
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            return True
    return False


def mock_class(
    cls: type,
    config: Any,
    *,
    split: str = "train",
    methods: Iterable[str] = ("get_batch",),
    name: str | None = None,
    rank: int | None = None,
    apply_determinism: bool = True,
) -> Any:
    """A subclass of ``cls`` whose ``methods`` are recorded/replayed inside each instance.

    Made for Ray: ``ray.remote(mock_class(RolloutScheduler, cfg))`` runs the interception inside
    the actor, so ``ray.get(actor.get_batch.remote(data, batch_size))`` is unchanged for the
    driver. ``cls`` may also be a ``ray.remote`` actor class: the result is then a ``ray.remote``
    actor class too, with the same default options.

    * Dump mode: ``cls.__init__`` runs as usual; each batch is captured and written off the
      actor's event loop (capture in an executor thread, write on the writer thread), so other
      actor methods keep answering while a large batch is recorded.
    * Mock mode: ``cls.__init__`` is **not** run (it would start inference engines and
      environment workers); the instance only replays. Attributes ``__init__`` would have set do
      not exist: reading one raises :class:`~rollout_mock.errors.SchedulerUnavailableError`
      (an ``AttributeError``) saying so.
    * Extra methods: ``rollout_mock_close()`` (flush every pending step to disk and release the
      dump directory: call it, e.g. ``ray.get(actor.rollout_mock_close.remote())``, before
      ``ray.kill(actor)``, which gives the process no chance to flush), ``rollout_mock_flush()``,
      ``rollout_mock_state_dict()`` / ``rollout_mock_load_state_dict(state)`` and
      ``rollout_mock_info()``. They are ``async`` when ``cls`` is an async actor class, so they
      do not block its event loop. A normal process exit (``__ray_terminate__``,
      ``ray.actor.exit_actor()``, interpreter exit) also flushes pending steps.
    * With ``apply_determinism`` (default), the instance first calls
      :func:`rollout_mock.determinism.apply_from_env`, a no-op unless ``DETERMINISTIC_MODE=1`` is
      in the environment: with ``.options(runtime_env=ray_runtime_env())`` the actor is
      deterministic in both modes (Ray ignores a per-actor ``worker_process_setup_hook``).
    """
    resolved = load_config(config)
    method_names = (methods,) if isinstance(methods, str) else tuple(methods)
    if not method_names:
        raise ConfigError("mock_class needs at least one method name to intercept")
    remote_options: dict[str, Any] | None = None
    actor_class = _ray_actor_class(cls) if not isinstance(cls, type) else None
    if actor_class is not None:
        remote_options = dict(getattr(cls, "_default_options", None) or {})
        cls = actor_class
    if not isinstance(cls, type):
        raise ConfigError(f"mock_class needs a class (or a ray.remote actor class), got {cls!r}")
    for method in method_names:
        if not callable(getattr(cls, method, None)):
            raise ConfigError(f"{cls.__qualname__} has no method {method!r} to intercept")
    if not resolved.enable:
        subclass: type = cls
    else:
        subclass = _build_mock_subclass(cls, resolved, split, method_names, name, rank, apply_determinism)
    if remote_options is None:
        return subclass
    import ray

    return ray.remote(**remote_options)(subclass) if remote_options else ray.remote(subclass)


def _build_mock_subclass(
    cls: type,
    resolved: RolloutMockConfig,
    split: str,
    method_names: tuple[str, ...],
    name: str | None,
    rank: int | None,
    apply_determinism: bool,
) -> type:
    replays = resolved.mode.replays

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if apply_determinism:
            from rollout_mock.determinism import apply_from_env

            apply_from_env()
        if not replays:
            cls.__init__(self, *args, **kwargs)
        self._rollout_mock = _InstanceMock(cls, resolved, split, method_names, name, rank)

    namespace: dict[str, Any] = {"__init__": __init__, "__module__": cls.__module__}
    if replays:
        def __getattr__(self: Any, attribute: str) -> Any:
            # Only called when normal lookup failed: an attribute cls.__init__ would have set.
            if attribute.startswith("__") or attribute == "_rollout_mock":
                raise AttributeError(attribute)
            raise SchedulerUnavailableError(
                f"[RolloutMock] {cls.__qualname__}.{attribute} is not available in mock mode: "
                f"{cls.__qualname__}.__init__ is not run in mock mode (no inference engines are "
                f"started), so attributes it sets do not exist. Only {list(method_names)} are "
                f"replayed; add the method that needs {attribute!r} to `methods` if it returns "
                f"batches, or do not call it in mock mode.",
                mode=resolved.mode.value,
                split=split,
            )

        namespace["__getattr__"] = __getattr__
    for method in method_names:
        namespace[method] = _class_level_method(cls, method)

    def _state(self: Any) -> _InstanceMock:
        return self.__dict__["_rollout_mock"]

    if _is_async_class(cls):
        async def rollout_mock_close(self: Any) -> None:
            await asyncio.get_running_loop().run_in_executor(None, _state(self).close)

        async def rollout_mock_flush(self: Any) -> None:
            await asyncio.get_running_loop().run_in_executor(None, _state(self).flush)

        async def rollout_mock_state_dict(self: Any) -> dict[str, Any]:
            return _state(self).interceptor.state_dict()

        async def rollout_mock_load_state_dict(self: Any, state: Mapping[str, Any]) -> None:
            _state(self).interceptor.load_state_dict(state)

        async def rollout_mock_info(self: Any) -> dict[str, Any]:
            return _state(self).info()
    else:
        def rollout_mock_close(self: Any) -> None:  # type: ignore[misc]
            _state(self).close()

        def rollout_mock_flush(self: Any) -> None:  # type: ignore[misc]
            _state(self).flush()

        def rollout_mock_state_dict(self: Any) -> dict[str, Any]:  # type: ignore[misc]
            return _state(self).interceptor.state_dict()

        def rollout_mock_load_state_dict(self: Any, state: Mapping[str, Any]) -> None:  # type: ignore[misc]
            _state(self).interceptor.load_state_dict(state)

        def rollout_mock_info(self: Any) -> dict[str, Any]:  # type: ignore[misc]
            return _state(self).info()

    for function in (rollout_mock_close, rollout_mock_flush, rollout_mock_state_dict,
                     rollout_mock_load_state_dict, rollout_mock_info):
        function.__qualname__ = f"{cls.__qualname__}.{function.__name__}"
        namespace[function.__name__] = function
    subclass = type(cls.__name__, (cls,), namespace)
    subclass.__qualname__ = cls.__qualname__
    subclass.__doc__ = cls.__doc__
    subclass.__rollout_mock_wrapped__ = cls  # type: ignore[attr-defined]
    return subclass


class _InstanceMock:
    """Per-instance state of a :func:`mock_class` instance."""

    def __init__(
        self,
        cls: type,
        config: RolloutMockConfig,
        split: str,
        methods: tuple[str, ...],
        name: str | None,
        rank: int | None = None,
    ) -> None:
        self.interceptor = Interceptor(config, split=split, name=name, rank=rank)
        self.positions = {m: step_arg_position(getattr(cls, m), bound=False) for m in methods}
        if config.mode.records and self.interceptor.writes:
            self.interceptor.store.set_methods(
                self.interceptor.stream,
                {m: {"convention": detect_convention(getattr(cls, m)).value, "step_arg": self.positions[m]} for m in methods},
            )
        # Steps still pending at a normal process exit are written by the writer's atexit hook;
        # this one releases the dump directory afterwards (ray.kill gives no chance for either).
        atexit.register(_close_quietly, weakref.ref(self))

    def info(self) -> dict[str, Any]:
        interceptor = self.interceptor
        return {
            "mode": interceptor.mode.value,
            "stream": interceptor.stream.key,
            "writes": interceptor.writes,
            "next_step": interceptor.next_step,
            "pid": os.getpid(),
            "closed": interceptor.closed,
        }

    def flush(self) -> None:
        self.interceptor.flush()

    def close(self) -> None:
        self.interceptor.close()


def _close_quietly(reference: weakref.ref[_InstanceMock]) -> None:
    state = reference()
    if state is None:
        return
    try:
        state.close()
    except Exception as exc:  # at exit there is nobody left to raise to: say it loudly
        logger.error("[RolloutMock] closing %s at exit failed: %s", state.interceptor.stream, exc)


def _class_level_method(cls: type, method: str) -> Any:
    original = getattr(cls, method)

    if inspect.iscoroutinefunction(original):
        async def async_method(self: Any, *args: Any, **kwargs: Any) -> Any:
            state: _InstanceMock = self.__dict__["_rollout_mock"]
            real = functools.partial(original, self)
            return await state.interceptor.call_async(method, real, args, kwargs, state.positions[method])

        return functools.wraps(original)(async_method)

    def sync_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        state: _InstanceMock = self.__dict__["_rollout_mock"]
        real = functools.partial(original, self)
        return state.interceptor.call(method, real, args, kwargs, state.positions[method])

    return functools.wraps(original)(sync_method)

"""Interception inside the scheduler's own class (and so inside a Ray actor): :func:`mock_class`."""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

from rollout_mock.codec.structure import flatten_settings
from rollout_mock.config import RolloutMockConfig, config_parts, load_config
from rollout_mock.determinism import apply_from_env
from rollout_mock.errors import ConfigError, SchedulerUnavailableError
from rollout_mock.text import logger
from rollout_mock.wrap.calls import detect_convention, parameter_names, ray_actor_class, step_arg_position
from rollout_mock.wrap.hooks import prepare_scheduler
from rollout_mock.wrap.interceptor import Interceptor
from rollout_mock.wrap.mismatch import KeyFunction

__all__ = ["mock_class"]

_C = TypeVar("_C")



def _constructor(cls: type) -> Callable[..., None]:
    """``cls.__init__`` as a plain function of ``(self, *args, **kwargs)``."""
    init: Callable[..., None] = vars(type)["__getattribute__"](cls, "__init__")
    return init


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


def _bound_arguments(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The constructor's arguments by parameter name (defaults applied), for split/name callables."""
    try:
        bound = inspect.signature(_constructor(cls)).bind(None, *args, **kwargs)
    except TypeError:
        return dict(kwargs)
    bound.apply_defaults()
    return dict(list(bound.arguments.items())[1:])


def mock_class(
    cls: _C,
    config: Any,
    *,
    split: str | Callable[[dict[str, Any]], str] = "train",
    methods: Iterable[str] = ("get_batch",),
    name: str | Callable[[dict[str, Any]], str | None] | None = None,
    rank: int | None = None,
    apply_determinism: bool = True,
    rollout_settings: Mapping[str, Any] | None = None,
    match_keys: Mapping[str, KeyFunction] | None = None,
    framework: str | None = None,
) -> _C:
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
      (an ``AttributeError``) saying so. Check mode runs ``cls.__init__``, as dump mode does.
    * ``rollout_settings``, ``match_keys`` and ``framework``: as for :class:`~rollout_mock.MockScheduler`; the
      settings are compared when each instance is built (the pre-flight check).
    * Extra methods: ``rollout_mock_close()`` (flush every pending step to disk and release the
      dump directory: call it, e.g. ``ray.get(actor.rollout_mock_close.remote())``, before
      ``ray.kill(actor)``, which gives the process no chance to flush), ``rollout_mock_flush()``,
      ``rollout_mock_state_dict()`` / ``rollout_mock_load_state_dict(state)`` and
      ``rollout_mock_info()``. They are ``async`` when ``cls`` is an async actor class, so they
      do not block its event loop. A normal process exit (``__ray_terminate__``,
      ``ray.actor.exit_actor()``, interpreter exit) also flushes pending steps.
    * ``split`` and ``name`` may be callables of the constructor's arguments (a dict by parameter
      name), e.g. ``split=lambda a: a["mode"]`` for ROLL's ``RolloutScheduler(..., mode="val")``.
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
    target: Any = cls
    actor_class = ray_actor_class(target) if not isinstance(target, type) else None
    if actor_class is not None:
        remote_options = dict(getattr(target, "_default_options", None) or {})
        target = actor_class
    if not isinstance(target, type):
        raise ConfigError(f"mock_class needs a class (or a ray.remote actor class), got {target!r}")
    for method in method_names:
        if not callable(getattr(target, method, None)):
            raise ConfigError(f"{target.__qualname__} has no method {method!r} to intercept")
    if not resolved.enable:
        subclass: type = target
    else:
        subclass = _build_mock_subclass(target, resolved, split, method_names, name, rank, apply_determinism,
                                        _Extras(flatten_settings(rollout_settings), dict(match_keys or {}),
                                               framework))
    if remote_options is None:
        return cast(_C, subclass)
    import ray

    return cast(_C, ray.remote(**remote_options)(subclass) if remote_options else ray.remote(subclass))


class _Extras:
    """What ``mock_class`` hands every instance besides the config: rollout settings, match keys."""

    def __init__(self, settings: dict[str, Any] | None, keys: dict[str, KeyFunction],
                 framework: str | None = None) -> None:
        self.settings = settings
        self.keys = keys
        self.framework = framework


def _build_mock_subclass(
    cls: type,
    resolved: RolloutMockConfig,
    split: Any,
    method_names: tuple[str, ...],
    name: Any,
    rank: int | None,
    apply_determinism: bool,
    extras: _Extras,
) -> type:
    replays = not resolved.mode.runs_scheduler

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if apply_determinism:
            apply_from_env()
        if not replays:
            _constructor(cls)(self, *args, **kwargs)
            prepare_scheduler(self)
        if callable(split) or callable(name):
            arguments = _bound_arguments(cls, args, kwargs)
            this_split = split(arguments) if callable(split) else split
            this_name = name(arguments) if callable(name) else name
        else:
            this_split, this_name = split, name
        self._rollout_mock = _InstanceMock(cls, resolved, this_split, method_names, this_name, rank, extras)
        if replays:  # on_missing_step: record builds the real scheduler on first need
            self._rollout_mock.init_args = (args, kwargs)

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
                split=split if isinstance(split, str) else None,
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
        extras: _Extras | None = None,
    ) -> None:
        extras = extras or _Extras(None, {})
        self.positions = {m: step_arg_position(getattr(cls, m), bound=False) for m in methods}
        params = {m: parameter_names(getattr(cls, m), bound=False) for m in methods}
        info: dict[str, dict[str, Any]] | None = None
        if config.mode.records:  # recorded with the stream when this process claims it
            info = {m: {"convention": detect_convention(getattr(cls, m)).value, "step_arg": self.positions[m],
                        "params": params[m]} for m in methods}
            if extras.settings is not None:
                info = {m: {**i, "settings": extras.settings} for m, i in info.items()}
        self.interceptor = Interceptor(config_parts(config), split=split, name=name, rank=rank, match_keys=extras.keys,
                                       framework=extras.framework, methods=info)
        self.interceptor.params.update(params)
        self.interceptor.check_settings(extras.settings, methods[0])
        # Steps still pending at a normal process exit are written by the writer's atexit hook;
        # this one releases the dump directory afterwards (ray.kill gives no chance for either).
        atexit.register(_close_quietly, weakref.ref(self))

    init_args: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def resolver(self, owner: Any, cls: type, method: str) -> Any:
        """A callable building the real method of ``owner`` on demand (mock mode, record policy):
        runs ``cls.__init__`` with the constructor's arguments the first time."""
        def resolve() -> Any:
            if self.init_args is not None:
                args, kwargs = self.init_args
                self.init_args = None
                logger.info("[RolloutMock] running %s.__init__ (on_missing_step=record)", cls.__qualname__)
                _constructor(cls)(owner, *args, **kwargs)
                prepare_scheduler(owner)
            return functools.partial(getattr(cls, method), owner)

        return resolve

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
    except Exception as exc:  # noqa: BLE001 - at exit there is nobody left to raise to: say it loudly
        logger.error("[RolloutMock] closing %s at exit failed: %s", state.interceptor.stream, exc)


def _class_level_method(cls: type, method: str) -> Any:
    original = getattr(cls, method)

    if inspect.iscoroutinefunction(original):
        async def async_method(self: Any, *args: Any, **kwargs: Any) -> Any:
            state: _InstanceMock = self.__dict__["_rollout_mock"]
            real = functools.partial(original, self) if state.init_args is None else None
            return await state.interceptor.call_async(method, real, args, kwargs, state.positions[method],
                                                      state.resolver(self, cls, method))

        return functools.wraps(original)(async_method)

    def sync_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        state: _InstanceMock = self.__dict__["_rollout_mock"]
        real = functools.partial(original, self) if state.init_args is None else None
        return state.interceptor.call(method, real, args, kwargs, state.positions[method],
                                      state.resolver(self, cls, method))

    return functools.wraps(original)(sync_method)

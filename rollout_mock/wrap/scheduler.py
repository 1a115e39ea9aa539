"""Wrapping a rollout scheduler object or Ray actor handle: :class:`MockScheduler`."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast, overload

from rollout_mock.codec.structure import flatten_settings
from rollout_mock.config import RolloutMockConfig, config_parts, load_config
from rollout_mock.errors import ConfigError, ReplayMismatchError, SchedulerUnavailableError, StreamNotFoundError
from rollout_mock.modes import Convention, Mode
from rollout_mock.storage.store import Store
from rollout_mock.text import logger
from rollout_mock.wrap.calls import as_step, detect_convention, parameter_names, ray_actor_class, step_arg_position
from rollout_mock.wrap.hooks import prepare_scheduler
from rollout_mock.wrap.interceptor import Capture, Interceptor, Provenance
from rollout_mock.wrap.mismatch import KeyFunction

__all__ = ["MockScheduler", "wrap_scheduler"]

T = TypeVar("T")



class _RemoteMethod:
    """Stands in for a Ray ``ActorMethod``: ``.remote(...)`` returns an ``ObjectRef``."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self._call = call

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(None, args, kwargs)

    def options(self, **options: Any) -> _RemoteMethod:
        """Ray call options (``num_returns``...) are forwarded in dump mode, ignored in mock mode."""
        return _RemoteMethod(lambda _, a, k: self._call(options, a, k))

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
    return {"convention": convention.value, "step_arg": step_arg_position(attribute, bound=bound),
            "params": parameter_names(attribute, bound=bound)}


def _spec_methods(
    spec: Any, methods: Iterable[str], recorded: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """Conventions from a class (or a ``ray.remote`` actor class), never instantiated.

    A ``ray.remote`` class means the Ray convention (``.remote()`` returning an ``ObjectRef``).
    A plain class gives the ``global_step`` position; its convention is the one the dump
    recorded for the method when there is one (a plain ``RolloutScheduler`` class as the spec of
    a dump recorded around its actor handle still replays as ``.remote()``), else the class's own.
    """
    actor_class = ray_actor_class(spec)
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
        info[method] = {"convention": convention.value, "step_arg": step_arg_position(function, bound=False),
                        "params": parameter_names(function, bound=False)}
    return info


class MockScheduler(Generic[T]):
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
        store: a :class:`~rollout_mock.storage.Store` to use instead of the dump directory (e.g. ``MemoryStore()``).
        rank: this process's rank; default: ``torch.distributed.get_rank()`` when a process
            group is initialised, else none. With ``ranks: one`` only ``dump_rank`` writes (the
            other ranks do not touch the dump directory at all) and every rank replays the same
            files; with ``ranks: all`` each rank writes and replays ``step_NNNNNN_rankR.pkl``.
        rollout_settings: the rollout side's settings (sampling parameters, group size, batch
            size...; a mapping, nested or flat): recorded with the dump in dump mode; mock and
            check mode compare them now, before the first call, and raise
            :class:`~rollout_mock.errors.RolloutSettingsMismatchError` listing every difference.
        match_keys: ``{method: key function}``: request matching digests ``key(arguments)``
            (the call's arguments by name, the step left out) instead of every argument; also
            :meth:`match_key`. The same function must be given in dump and mock mode.
        check_views: ``{method: function}``: what check mode compares of a batch (default: all).
        capture: dump mode: what is recorded of a live batch (the caller still gets the batch).
        provenance: dump mode: ``provenance(batch)``, a small JSON-able dict recorded with each
            call (the weight versions its samples were generated with, for instance); read back
            with :meth:`rollout_mock.storage.Store.extra_calls` and the step entries.
        framework: whose volatile fields (:func:`~rollout_mock.register_volatile_fields`) request
            matching and check mode leave out: each adapter passes its own (``"verl"``...);
            default: none, every field is compared.

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
        scheduler: T | None = None,
        config: Any = None,
        *,
        split: str = "train",
        methods: Iterable[str] = ("get_batch",),
        factory: Callable[[], T] | None = None,
        spec: Any = None,
        name: str | None = None,
        store: Store | None = None,
        rank: int | None = None,
        rollout_settings: Mapping[str, Any] | None = None,
        match_keys: Mapping[str, KeyFunction] | None = None,
        check_views: Mapping[str, Callable[[Any], Any]] | None = None,
        capture: Capture | None = None,
        provenance: Provenance | None = None,
        framework: str | None = None,
    ) -> None:
        #: the ``rollout_mock:`` block as loaded (read here only: each component gets its part)
        self.config: RolloutMockConfig = load_config(config if config is not None else {})
        self.mode: Mode = self.config.mode
        self.split = split
        self.methods: tuple[str, ...] = (methods,) if isinstance(methods, str) else tuple(methods)
        if not self.methods:
            raise ConfigError("MockScheduler needs at least one method name to intercept")
        self.enabled = self.config.enable
        self.interceptor: Interceptor | None = None
        #: each intercepted method's calling convention, step position and real method (``None``:
        #: none yet); its callable is made at its first look-up (:meth:`__getattr__`), kept in
        #: ``_intercepted``
        self._calls: dict[str, tuple[Convention, int | None, Any]] = {}
        self._intercepted: dict[str, Any] = {}
        needs_real = not self.enabled or self.mode.runs_scheduler
        self._factory = factory
        if scheduler is None and factory is not None and needs_real:
            scheduler = factory()
        if scheduler is None and needs_real:
            what = "enable: false" if not self.enabled else f"mode={self.mode.value}"
            raise ConfigError(
                f"MockScheduler ({what}, split={split}) needs the real scheduler: pass it, or a "
                f"factory that builds it (factories are never called in mock mode)"
            )
        self.scheduler = scheduler
        if not self.enabled:
            return
        if scheduler is not None and self.mode.runs_scheduler:
            prepare_scheduler(scheduler)
        # how the real scheduler's methods are called, read before the dump is opened (dump mode records it)
        live = None if scheduler is None else self._live_conventions(scheduler)
        settings = flatten_settings(rollout_settings)
        recorded = None if live is None or not self.mode.records else {
            m: {**info, "settings": settings} if settings is not None else info for m, info in live.items()}
        self.interceptor = Interceptor(config_parts(self.config), split=split, name=name, store=store, rank=rank,
                                       match_keys=match_keys, check_views=check_views, capture=capture,
                                       provenance=provenance, framework=framework, methods=recorded)
        if self.mode.replays:
            _check_recorded_methods(self.interceptor, self.methods)
        conventions = live if live is not None else self._recorded_conventions(spec)
        self.interceptor.check_settings(settings, self.methods[0])
        for method in self.methods:
            params = conventions[method].get("params")
            self.interceptor.params[method] = params if isinstance(params, list) else None
            real = None if scheduler is None else getattr(scheduler, method)
            self._calls[method] = (Convention(conventions[method]["convention"]), conventions[method].get("step_arg"),
                                   real)

    def __repr__(self) -> str:
        state = "disabled" if self.interceptor is None else f"{self.mode.value}, {self.interceptor.stream}"
        return f"MockScheduler({self.scheduler!r}, {state}, methods={list(self.methods)})"

    def _live_conventions(self, scheduler: Any) -> dict[str, dict[str, Any]]:
        """How each method of the real ``scheduler`` is called (dump mode records it)."""
        info = {}
        for method in self.methods:
            if not hasattr(scheduler, method):
                raise ConfigError(f"{type(scheduler).__qualname__} has no method {method!r} to intercept")
            info[method] = _method_info(method, scheduler, bound=True)
        return info

    def _recorded_conventions(self, spec: Any) -> dict[str, dict[str, Any]]:
        """Mock mode without a scheduler: how each method is called, from ``spec`` or the dump."""
        assert self.interceptor is not None
        recorded = self.interceptor.store.methods(self.interceptor.stream)
        if spec is not None:
            return _spec_methods(spec, self.methods, recorded if self.mode.replays else None)
        info = {}
        for method in self.methods:
            if method not in recorded:
                self._raise_if_stream_missing()
                raise ConfigError(
                    f"mock mode without a scheduler: the manifest of {self.interceptor.dump_dir} does not "
                    f"record how {self.split}.{method} is called (recorded: {sorted(recorded) or 'none'}); "
                    f"pass spec=<scheduler class> or check `methods`"
                )
            info[method] = recorded[method]
        return info

    def _raise_if_stream_missing(self) -> None:
        """Mock mode without a scheduler on a dump that has no step of this stream: say which
        split (or name) is missing and which are there, rather than that a call spec is."""
        interceptor = self.interceptor
        assert interceptor is not None
        store = interceptor.store
        stream = interceptor.stream
        if store.steps(stream):
            return
        present = store.stream_ids()
        splits = sorted({s.split for s in present})
        if self.split not in splits:
            what = f"no {self.split!r} split"
            fix = (f"record the {self.split!r} split in dump mode first (a MockScheduler with "
                   f"split={self.split!r}), or replay one of the recorded splits")
        else:
            what = f"no stream {stream.key!r}"
            fix = "check the scheduler's `name` and the rank settings"
        raise StreamNotFoundError(
            f"[RolloutMock] mode={self.mode.value}: {interceptor.dump_dir} has {what} (splits recorded: "
            f"{', '.join(splits) or 'none'}; streams: {', '.join(s.key for s in present) or 'none'}); {fix}",
            mode=self.mode.value, split=self.split, path=interceptor.dump_dir,
        )

    def _resolve(self, method: str) -> Any:
        """The real ``method``, building the scheduler with ``factory`` if needed (mock mode,
        ``on_missing_step: record``); ``None`` when there is neither."""
        if self.scheduler is None and self._factory is not None:
            logger.info("[RolloutMock] building the real scheduler (on_missing_step=record)")
            self.scheduler = self._factory()
            prepare_scheduler(self.scheduler)
        return None if self.scheduler is None else getattr(self.scheduler, method)

    def _make(self, method: str, convention: Convention, position: int | None, real: Any) -> Any:
        interceptor = self.interceptor
        assert interceptor is not None
        resolve = functools.partial(self._resolve, method)

        if convention is Convention.RAY:
            def call_remote(options: dict[str, Any] | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                return interceptor.call_remote(method, real, args, kwargs, position, resolve, options)

            return _RemoteMethod(call_remote)

        if convention is Convention.ASYNC:
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                return await interceptor.call_async(method, real, args, kwargs, position, resolve)

            if real is not None:
                functools.update_wrapper(call_async, real)
            return call_async

        def call(*args: Any, **kwargs: Any) -> Any:
            return interceptor.call(method, real, args, kwargs, position, resolve)

        if real is not None:
            functools.update_wrapper(call, real)
        return call

    # ------------------------------------------------------------------ pass-through
    def __getattr__(self, attribute: str) -> Any:
        """Every other attribute is the wrapped scheduler's; to a type checker it is ``Any``:
        :func:`wrap_scheduler` is the typed entry point."""
        intercepted = self.__dict__.get("_intercepted", {})
        if attribute in intercepted:
            return intercepted[attribute]
        calls = self.__dict__.get("_calls", {})
        if attribute in calls:  # made once: every look-up returns the same callable
            return intercepted.setdefault(attribute, self._make(attribute, *calls[attribute]))
        scheduler = self.__dict__.get("scheduler")
        if scheduler is None:
            if attribute.startswith("__"):
                raise AttributeError(attribute)
            mode = self.__dict__.get("mode")
            raise SchedulerUnavailableError(
                f"[RolloutMock] {attribute!r} is not available in mock mode: there is no real "
                f"scheduler (it is never built in mock mode), and only "
                f"{list(self.__dict__.get('methods', ()))} are replayed. Add {attribute!r} to "
                f"`methods` if it returns batches, or avoid calling it in mock mode.",
                mode=None if mode is None else mode.value,
                split=self.__dict__.get("split"),
            )
        return getattr(scheduler, attribute)

    def match_key(self, method: str, key: KeyFunction) -> None:
        """Request matching digests ``key(arguments)`` for ``method`` instead of its arguments
        (``arguments``: the call's arguments by parameter name, the step left out; a returned
        mapping's items become the compared names). Register the same key in dump and mock mode."""
        if self.interceptor is not None:
            self.interceptor.matcher.register_key(method, key)

    # ------------------------------------------------------------------ step & state
    @property
    def step(self) -> int:
        """The step the next call without an explicit step will use."""
        return 0 if self.interceptor is None else self.interceptor.next_step

    @step.setter
    def step(self, value: int) -> None:
        if self.interceptor is not None:
            self.interceptor.next_step = value

    @contextlib.contextmanager
    def at_step(self, step: int) -> Iterator[int]:
        """Make every call without a step argument inside the block a call of ``step`` (an agent
        loop's many ``generate`` calls of one training step, a validation in several batches):
        each is recorded as the next call of the step, in the order the calls begin, and replayed
        by its request (see the docs' "Several calls per step"). A context variable: asyncio
        tasks created inside the block inherit it; other threads see it while the block is open.
        Afterwards the counter continues at ``step + 1``. Does nothing when disabled."""
        interceptor = self.interceptor
        checked = as_step(step, method="at_step", argument="step",
                          mode=None if interceptor is None else interceptor.mode.value, split=self.split)
        assert checked is not None
        step = checked
        if interceptor is None:
            yield step
            return
        token = interceptor.calls.enter(step)
        try:
            yield step
        finally:
            interceptor.calls.leave(token, step)
            interceptor.continue_after(step)

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

    # ------------------------------------------------------------------ flight recorder (keep:)
    def observe(self, step: int, metrics: Mapping[str, Any]) -> list[str]:
        """Dump mode: check step ``step``'s training metrics for anomalies (``keep.metrics``: NaN
        or inf, and jumps of more than ``z`` robust deviations where configured); an anomaly keeps
        the step and its ``keep.before``/``keep.after`` window, with the reason in the index.
        Returns the anomalies found. Does nothing (returns ``[]``) without ``keep``/``max_keep``,
        in mock and check mode, and on a rank that does not write: call it unconditionally.
        ``MetricsWriter(path, expected=scheduler)`` calls it for every logged line."""
        recorder = None if self.interceptor is None else self.interceptor.recorder
        return [] if recorder is None else recorder.observe(step, metrics)

    def pin(self, step: int, reason: str) -> bool:
        """Dump mode: keep step ``step`` (and its ``keep.before``/``keep.after`` window) whatever
        the ring does, with ``reason`` in the index (``rollout-mock ls`` shows it). A step not
        recorded yet is kept when it is. True when the step is (or will be) kept; False in mock
        and check mode, on a rank that does not write, and when the ring already deleted the step
        (a warning names it and the fix: raise ``keep.last``)."""
        recorder = None if self.interceptor is None else self.interceptor.recorder
        return False if recorder is None else recorder.pin(step, reason)

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
        self._close(failed=False)

    def _close(self, *, failed: bool, interrupted: bool = False) -> None:
        try:
            if self.interceptor is not None:
                self.interceptor.close(failed=failed, interrupted=interrupted)
        finally:
            inner = getattr(self.scheduler, "close", None)
            if callable(inner) and detect_convention(inner) is Convention.SYNC:
                inner()

    def __enter__(self) -> MockScheduler[T]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self._close(failed=exc_type is not None,
                    interrupted=exc_type is not None and issubclass(exc_type, KeyboardInterrupt))


def _check_recorded_methods(interceptor: Interceptor, methods: Sequence[str]) -> None:
    """Mock and check mode: the stream was recorded by a call of one of ``methods``. A dump of
    another method (another framework's adapter: verl's ``generate_sequences`` read by slime's
    ``generate_rollout``) would fail later on its arguments with generic fixes, after a warning
    about rollout settings that is beside the point: say what was recorded and what is called."""
    recorded = sorted(interceptor.store.methods(interceptor.stream))
    if not recorded or set(recorded) & set(methods):
        return
    context = interceptor.matcher.context
    names = " or ".join(f"`{m}`" for m in recorded)
    calls = " or ".join(f"`{m}`" for m in methods)
    raise ReplayMismatchError(
        f"[RolloutMock] mode={context.get('mode')}: {context.get('path')} ({context.get('stream')}) recorded {names}; "
        f"this run calls {calls}. A dump made through another framework's adapter (or another method) cannot be "
        f"replayed here: replay it with the adapter that recorded it, or record a new dump (mode: dump).",
        method=methods[0], recorded=names, live=calls, mode=context.get("mode"), split=interceptor.stream.split)


@overload
def wrap_scheduler(scheduler: None, config: Any = None, *, split: str = ..., methods: Iterable[str] = ...,
                   factory: Callable[[], T], spec: Any = ..., name: str | None = ...,
                   store: Store | None = ..., rank: int | None = ...) -> T: ...
@overload
def wrap_scheduler(scheduler: None, config: Any = None, *, split: str = ..., methods: Iterable[str] = ...,
                   factory: None = ..., spec: type[T], name: str | None = ...,
                   store: Store | None = ..., rank: int | None = ...) -> T: ...
@overload
def wrap_scheduler(scheduler: T, config: Any = None, *, split: str = ..., methods: Iterable[str] = ...,
                   factory: Callable[[], T] | None = ..., spec: Any = ..., name: str | None = ...,
                   store: Store | None = ..., rank: int | None = ...) -> T: ...
def wrap_scheduler(scheduler: Any, config: Any = None, **options: Any) -> Any:
    """:class:`MockScheduler` typed as what it wraps: ``wrap_scheduler(real, cfg)`` is a
    ``MockScheduler`` at run time, and to a type checker the type of ``real`` (or of what
    ``factory`` builds, or an instance of the ``spec`` class), so that a misspelt method
    (``rollout.get_btach(...)``) is an error in mypy. The arguments are MockScheduler's.

    Use the :class:`MockScheduler` name when the code calls rollout_mock's own methods
    (``close``, ``flush``, ``state_dict``...), which the wrapped type may not declare.
    """
    return cast(Any, MockScheduler(scheduler, config, **options))

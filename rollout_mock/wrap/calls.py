"""Call bookkeeping: which argument is the step, how a method is called, what a call looked like."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import math
import operator
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from rollout_mock.batch import batch_meta, batch_type_of, register_step_name, step_names
from rollout_mock.errors import StepArgumentError
from rollout_mock.modes import Convention
from rollout_mock.text import json_float, short_repr

__all__ = [
    "STATE_VERSION",
    "StepCalls",
    "STEP_ARG",
    "call_summary",
    "detect_convention",
    "elapsed",
    "is_ray_actor_method",
    "parameter_names",
    "ray_actor_class",
    "register_step_name",
    "step_arg_position",
    "step_from_call",
    "step_names",
    "step_position_in",
]



#: The step argument of a wrapped call: ``get_batch(..., global_step=3)``.
STEP_ARG = "global_step"
STATE_VERSION = 1
_STEP_FIX = (
    "pass the step as a non-negative int (e.g. global_step=int(step)), or pass no step argument "
    "at all to let the scheduler count calls"
)


def as_step(value: Any, *, method: str | None, argument: str, **context: Any) -> int | None:
    """The step ``value`` stands for, taken exactly, or :class:`StepArgumentError`.

    ``None`` means "no step" (the caller uses the scheduler's counter). Accepted: a non-negative
    ``int``, an integral ``float`` (``3.0``), and 0-d numpy/torch integer or integral-float scalars
    (``np.int64(3)``, ``torch.tensor(3)``). Refused, with an error naming ``method`` and
    ``argument``: booleans, strings, fractional or non-finite floats, tensors/arrays with a
    dimension (even of one element), anything else, and negative steps. A present but bad step
    never falls back to the counter: a recording under the wrong step is worse than an error.
    """
    if value is None:
        return None
    original = value
    if getattr(value, "ndim", 0) == 0 and type(value).__module__.split(".")[0] in {"numpy", "torch"}:
        item = getattr(value, "item", None)
        if callable(item):
            value = item()
    step: int | None = None
    if isinstance(value, bool):
        step = None
    elif isinstance(value, int):
        step = int(value)
    elif isinstance(value, float):
        step = int(value) if math.isfinite(value) and value.is_integer() else None
    elif not isinstance(value, (str, bytes)) and getattr(value, "ndim", 0) == 0:
        try:
            step = operator.index(value)
        except TypeError:
            step = None
    if step is None or step < 0:
        why = "a negative step" if step is not None else f"not an integer ({type(original).__qualname__})"
        shape = getattr(original, "shape", None)
        if shape is not None and getattr(original, "ndim", False):
            why = f"a {type(original).__qualname__} of shape {tuple(shape)}, not a single number"
        shown = short_repr(original)
        where = ", ".join(f"{k}={v}" for k, v in context.items() if k in ("mode", "split") and v)
        raise StepArgumentError(
            f"[RolloutMock] {method or 'intercepted call'}{f' ({where})' if where else ''}: "
            f"step argument {argument}={shown} is {why}; "
            f"{_STEP_FIX}",
            method=method, argument=argument, value=shown, **context,
        )
    return step


def _parameters(function: Callable[..., Any] | None, *, bound: bool) -> list[inspect.Parameter] | None:
    """The parameters of ``function`` without ``self`` (``None`` when it has no signature).

    ``function`` may also be a Ray ``ActorMethod`` (its recorded signature, without ``self``, is
    used: Ray 2.x keeps it in ``_signature``, a list of :class:`inspect.Parameter`)."""
    if function is None:
        return None
    ray_signature = getattr(function, "_signature", None) if is_ray_actor_method(function) else None
    if ray_signature is not None:
        return list(ray_signature)
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    if not bound and parameters and parameters[0].name in ("self", "cls"):
        parameters = parameters[1:]
    return parameters


def step_arg_position(function: Callable[..., Any] | None, *, bound: bool) -> int | None:
    """Index of the step parameter (:func:`step_names`) among positional arguments, if it has one
    (``function`` may be a Ray ``ActorMethod``)."""
    parameters = _parameters(function, bound=bound)
    return None if parameters is None else step_position_in(parameters)


def parameter_names(function: Callable[..., Any] | None, *, bound: bool) -> list[str] | None:
    """Names of the parameters a positional argument can fill, in order (``None`` without a
    signature): what request matching calls the arguments of a call."""
    parameters = _parameters(function, bound=bound)
    if parameters is None:
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in parameters if p.kind in positional]


def step_position_in(parameters: list[inspect.Parameter]) -> int | None:
    """Index of the step parameter among ``parameters`` (``self`` already removed), if positional."""
    names = step_names()
    for index, parameter in enumerate(parameters):
        if parameter.name in names and parameter.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            return index
    return None


def step_from_call(args: tuple[Any, ...], kwargs: Mapping[str, Any], position: int | None,
                   *, method: str | None = None, **context: Any) -> int | None:
    """The step a call carries, or ``None`` when it carries none (then the counter is used).

    Looked up in order: a keyword argument named like one of :func:`step_names`; the positional
    step parameter at ``position``; the metadata of a batch argument
    (:func:`rollout_mock.batch.batch_meta`: a DataProto's ``meta_info``, ``global_step`` in ROLL's,
    ``global_steps`` in verl's trainer). The first one present decides: a bad value raises
    :class:`StepArgumentError` (see :func:`as_step`, ``context`` gives its ``mode``/``split``)
    instead of falling back to the counter.
    """
    names = step_names()
    for name in names:
        if name in kwargs:
            return as_step(kwargs[name], method=method, argument=name, **context)
    if position is not None and position < len(args):
        return as_step(args[position], method=method, argument=f"<step parameter at position {position}>", **context)
    for value in (*args, *kwargs.values()):
        meta = batch_meta(value)
        if meta is not None:
            part = getattr(batch_type_of(value), "meta_key", None)
            for name in names:
                if name in meta:
                    return as_step(meta[name], method=method, argument=f"{part}[{name!r}]", **context)
    return None


def is_ray_actor_method(attribute: Any) -> bool:
    """True for a Ray ``ActorMethod`` (``handle.get_batch``), without importing Ray."""
    return type(attribute).__name__ == "ActorMethod" and hasattr(attribute, "remote")


def ray_actor_class(spec: Any) -> type | None:
    """The user's class behind a ``ray.remote`` actor class (``ActorClass``), else ``None``.

    Ray 2.x sets ``__ray_actor_class__`` on the ``ActorClass`` (and on its internal modified
    subclass); a plain class does not have it.
    """
    if isinstance(spec, type) and "__ray_actor_class__" not in vars(spec) and not hasattr(spec, "remote"):
        return None
    actor_class = getattr(spec, "__ray_actor_class__", None)
    return actor_class if isinstance(actor_class, type) else None


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


#: Bounds of a call summary (it is stored in the manifest once per step).
SUMMARY_MAX_STR = 200
SUMMARY_MAX_ITEMS = 32


def _bounded_str(text: str) -> str:
    if len(text) <= SUMMARY_MAX_STR:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{text[:SUMMARY_MAX_STR]}...<{len(text)} chars, sha256 {digest}>"


def _plain(value: Any) -> Any:
    """One argument as strict JSON: ``None``, bools, ints of up to 64 bits, floats (non-finite
    ones as ``"NaN"``/``"Infinity"``/``"-Infinity"``, see :func:`rollout_mock.text.json_float`),
    strings (long ones cut, with their length and hash so that different values still differ);
    any other object as ``"<TypeName>"``."""
    if value is None or isinstance(value, bool):
        return None if value is None else bool(value)
    if isinstance(value, int):
        return int(value) if -(2**63) <= value < 2**64 else f"<int of {value.bit_length()} bits>"
    if isinstance(value, float):
        return json_float(float(value))
    if isinstance(value, str):
        return _bounded_str(str(value))
    return _bounded_str(f"<{type(value).__qualname__}>")


def call_summary(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The plain arguments of a call (numbers, strings, None); other objects by type name.

    Strict JSON (it goes into ``manifest.json``) and bounded: at most :data:`SUMMARY_MAX_ITEMS`
    positional and keyword arguments each, strings cut at :data:`SUMMARY_MAX_STR` characters.
    It is what a reader of the manifest sees of a call; the interceptor adds the request digest
    (``"request"``) that mock mode compares.
    """
    summary: dict[str, Any] = {
        "args": [_plain(a) for a in args[:SUMMARY_MAX_ITEMS]],
        "kwargs": {_bounded_str(str(k)): _plain(v) for k, v in sorted(kwargs.items())[:SUMMARY_MAX_ITEMS]},
    }
    dropped = max(len(args) - SUMMARY_MAX_ITEMS, 0) + max(len(kwargs) - SUMMARY_MAX_ITEMS, 0)
    if dropped:
        summary["omitted"] = dropped
    return summary


def elapsed(start: float) -> float:
    return round(time.perf_counter() - start, 6)


class StepCalls:
    """The call key's second half: each call of a step gets the next index of that step, in the
    order calls *begin* (thread-safe), so that threads, asyncio tasks and Ray calls that finish
    in any order keep the index they started with; and the step that calls without a step
    argument take inside :meth:`at_step` (a context variable, inherited by asyncio tasks created
    inside, else the step pinned by the innermost open block of any thread).

    Only the indices of the :data:`KEEP` most recent steps are kept (a step seen again after that
    starts over at 0)."""

    KEEP = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}
        self._current: contextvars.ContextVar[int | None] = contextvars.ContextVar("rollout_mock_step", default=None)
        self._pinned: list[int] = []
        self._task_base: contextvars.ContextVar[int | None] = contextvars.ContextVar("rollout_mock_tasks",
                                                                                     default=None)

    def begin(self, step: int) -> int:
        """The index of a call of ``step`` that begins now (0 for the first)."""
        with self._lock:
            index = self._next.get(step, 0)
            self._next[step] = index + 1
            if len(self._next) > self.KEEP:
                for old in sorted(self._next)[: len(self._next) - self.KEEP]:
                    del self._next[old]
            return index

    def begun(self, step: int) -> int:
        """How many calls of ``step`` began so far."""
        with self._lock:
            return self._next.get(step, 0)

    def current(self) -> int | None:
        """The step of an open :meth:`at_step` block (this context's, else any thread's), or None."""
        step = self._current.get()
        if step is None and self._pinned:
            step = self._pinned[-1]
        return step

    def enter(self, step: int) -> contextvars.Token[int | None]:
        with self._lock:
            self._pinned.append(step)
        self._task_base.set(_next_task_number())
        return self._current.set(step)

    def leave(self, token: contextvars.Token[int | None], step: int) -> None:
        try:
            self._current.reset(token)
        except ValueError:  # left from another context (a generator moved between tasks)
            self._current.set(None)
        self._task_base.set(None)
        with self._lock:
            if step in self._pinned:
                self._pinned.reverse()
                self._pinned.remove(step)
                self._pinned.reverse()

    def task(self) -> int | None:
        """Which asyncio task of the open :meth:`at_step` block is calling: the task's creation
        number counted from the block's start (an episode created by ``asyncio.gather`` keeps its
        number from run to run, whatever order its calls finish in), or ``None`` (no block, not
        in a task, a task named by the user). Calls with equal requests are matched to the
        recorded call of the same task first."""
        base = self._task_base.get()
        if base is None:
            return None
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop
            return None
        match = _TASK_NAME.fullmatch(task.get_name()) if task is not None else None
        return None if match is None else int(match.group(1)) - base


_TASK_NAME = re.compile(r"Task-([0-9]{1,18})", re.ASCII)


def _next_task_number() -> int | None:
    """The number asyncio gives the next task it names (``Task-N``; the number is taken)."""
    counter = getattr(asyncio.tasks, "_task_name_counter", None)
    try:
        return int(counter()) if callable(counter) else None
    except (TypeError, ValueError):
        return None

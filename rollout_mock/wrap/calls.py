"""Call bookkeeping: which argument is the step, how a method is called, what a call looked like."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from rollout_mock.config import RolloutMockConfig
from rollout_mock.modes import Convention

__all__ = [
    "STATE_VERSION",
    "STEP_ARG",
    "STEP_NAMES",
    "call_summary",
    "describe_call",
    "detect_convention",
    "elapsed",
    "is_ray_actor_method",
    "step_arg_position",
    "step_from_call",
    "step_position_in",
]



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

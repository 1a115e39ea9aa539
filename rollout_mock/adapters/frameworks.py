"""Switching off ROLL's own rollout mock on a scheduler that rollout_mock wraps.

ROLL's schedulers inherit ``RolloutMockMixin``, which reads the same ``rollout_mock:`` block and,
in dump mode, pickles every batch to ``{dump_dir}/{train|val}/step_N.pkl`` itself — the very
paths rollout_mock writes (with a manifest and checksums), so the two would collide. A wrapped
scheduler therefore gets ``mock_config = None`` (the mixin's own off state) after its
``__init__``; rollout_mock records and replays instead. Nothing else of the scheduler changes.
"""

from __future__ import annotations

from typing import Any

from rollout_mock.text import logger
from rollout_mock.wrap.calls import is_ray_actor_method
from rollout_mock.wrap.hooks import register_scheduler_hook

__all__ = [
    "disable_native_roll_mock", "disable_native_roll_mock_in_actor", "has_native_roll_mock",
    "prepare_roll_scheduler",
]



def has_native_roll_mock(obj: Any) -> bool:
    """Whether ``obj`` carries ROLL's RolloutMockMixin state with the mock switched on."""
    try:
        cfg = obj.__dict__.get("mock_config")
    except AttributeError:
        return False
    return (
        cfg is not None
        and bool(getattr(cfg, "enable", False))
        and callable(getattr(type(obj), "_maybe_dump_batch", None))
        and callable(getattr(type(obj), "_should_load_mock", None))
    )


def disable_native_roll_mock(obj: Any) -> bool:
    """Turn ROLL's own rollout mock off on ``obj``; return whether it was on."""
    if not has_native_roll_mock(obj):
        return False
    obj.mock_config = None
    logger.info(
        "[RolloutMock] %s: ROLL's built-in rollout mock is switched off for this scheduler; "
        "rollout_mock records and replays its batches instead", type(obj).__qualname__,
    )
    return True


def disable_native_roll_mock_in_actor(handle: Any) -> bool:
    """Same, inside a Ray actor (through ``__ray_call__``); ``False`` when not possible."""
    caller = getattr(handle, "__ray_call__", None)
    if caller is None:
        return False
    import ray

    try:
        return bool(ray.get(caller.remote(_disable_in_actor), timeout=60))
    except Exception as exc:  # noqa: BLE001 - an actor that cannot run it: its own dump stays as it was
        logger.debug("[RolloutMock] could not check the actor for ROLL's rollout mock: %s", exc)
        return False


def _disable_in_actor(instance: Any) -> bool:
    return disable_native_roll_mock(instance)


@register_scheduler_hook
def prepare_roll_scheduler(scheduler: Any) -> None:
    """The scheduler hook (:mod:`rollout_mock.wrap.hooks`): ROLL's own mock off on an object, an
    instance inside an actor, or (through ``__ray_call__``) the actor behind a handle."""
    if is_ray_actor_method(getattr(scheduler, "get_batch", None)):
        disable_native_roll_mock_in_actor(scheduler)
    else:
        disable_native_roll_mock(scheduler)

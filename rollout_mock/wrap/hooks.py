"""Hooks through which framework adapters adjust a real scheduler that rollout_mock wraps.

wrap/ knows no framework. An adapter that must change something on the real scheduler before its
batches are recorded (ROLL: switch off its built-in ``RolloutMockMixin``, which would write the
same files) registers a hook here; :func:`prepare_scheduler` runs every registered hook on each
real scheduler, in registration order, when it is attached in dump mode or built on demand in
mock mode (``on_missing_step: record``). The scheduler is an object, an instance inside a Ray
actor (:func:`~rollout_mock.mock_class`) or a Ray actor handle: a hook tells them apart itself
(:func:`rollout_mock.wrap.calls.is_ray_actor_method`) and ignores what it does not know.

The built-in adapters register theirs when ``rollout_mock.adapters`` is imported, which
``import rollout_mock`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["SchedulerHook", "prepare_scheduler", "register_scheduler_hook", "scheduler_hooks"]

#: Called with the real scheduler; the return value is ignored.
SchedulerHook = Callable[[Any], object]

_HOOKS: list[SchedulerHook] = []


def register_scheduler_hook(hook: SchedulerHook) -> SchedulerHook:
    """Add ``hook`` (once: registering the same callable again does nothing); returns it, so
    that it can be used as a decorator."""
    if hook not in _HOOKS:
        _HOOKS.append(hook)
    return hook


def scheduler_hooks() -> tuple[SchedulerHook, ...]:
    """The registered hooks, in the order they run."""
    return tuple(_HOOKS)


def prepare_scheduler(scheduler: Any) -> None:
    """Run every registered hook on ``scheduler`` (exceptions propagate: a hook that cannot do
    its job must say so rather than let two recorders write the same files)."""
    for hook in tuple(_HOOKS):
        hook(scheduler)

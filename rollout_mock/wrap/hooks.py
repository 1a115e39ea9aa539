"""Hooks through which framework adapters adjust a real scheduler that rollout_mock wraps, and
declare what request matching must not compare.

wrap/ knows no framework. An adapter that must change something on the real scheduler before its
batches are recorded (ROLL: switch off its built-in ``RolloutMockMixin``, which would write the
same files) registers a hook here; :func:`prepare_scheduler` runs every registered hook on each
real scheduler, in registration order, when it is attached in dump mode or built on demand in
mock mode (``on_missing_step: record``). The scheduler is an object, an instance inside a Ray
actor (:func:`~rollout_mock.mock_class`) or a Ray actor handle: a hook tells them apart itself
(:func:`rollout_mock.wrap.calls.is_ray_actor_method`) and ignores what it does not know.

Adapters also declare the *volatile fields* of their framework's requests
(:func:`register_volatile_fields`): values that differ between two faithful runs of the same
training (verl's random ``uid`` per prompt, ROLL's OpenTelemetry trace context), which request
matching (:mod:`rollout_mock.wrap.matching`) and check mode leave out — of that framework's calls
only: a wrapper names its framework (``MockScheduler(..., framework="verl")``, what each adapter
passes) and :func:`volatile_patterns` gives that framework's patterns; a wrapper that names none
(the generic ``wrap_scheduler``) compares every field.

Tools that act at a given step (``rollout-mock explain`` starts its anomaly probe when step N is
called) register a *step hook* (:func:`register_step_hook`): the interceptor runs each with the
split, the step and the mode when a call starts, on the calling thread, before the step is served.

The built-in adapters register theirs when ``rollout_mock.adapters`` is imported, which
``import rollout_mock`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "SchedulerHook", "StepHook", "prepare_scheduler",
    "register_scheduler_hook", "register_step_hook", "register_volatile_fields", "run_step_hooks", "scheduler_hooks",
    "volatile_fields", "volatile_patterns",
]

#: Called with the real scheduler; the return value is ignored.
SchedulerHook = Callable[[Any], object]

#: Called with (split, step, mode) when an intercepted call starts; exceptions propagate.
StepHook = Callable[[str, int, str], object]

_HOOKS: list[SchedulerHook] = []
_STEP_HOOKS: list[StepHook] = []
_VOLATILE: dict[str, tuple[str, ...]] = {}


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


def register_step_hook(hook: StepHook) -> StepHook:
    """Add ``hook`` (once), run by :func:`run_step_hooks` when a call starts; returns it."""
    if hook not in _STEP_HOOKS:
        _STEP_HOOKS.append(hook)
    return hook


def run_step_hooks(split: str, step: int, mode: str) -> None:
    """Run every step hook (nothing, cheaply, when none is registered)."""
    for hook in tuple(_STEP_HOOKS):
        hook(split, step, mode)


def register_volatile_fields(owner: str, *patterns: str) -> None:
    """Declare fields of ``owner``'s requests (a framework name) that differ between faithful runs.

    A pattern is a dotted path matched against the *end* of a value's path in a call, with ``*``
    matching one component (a mapping key, an attribute or a ``[i]`` list index):
    ``non_tensor_batch.uid`` leaves out ``data.non_tensor_batch.uid`` of any argument. Calling it
    again for the same ``owner`` replaces its patterns."""
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern.strip(".") or ".." in pattern:
            raise ValueError(f"volatile field pattern {pattern!r}: expected a dotted path such as 'batch.uid'")
    _VOLATILE[str(owner)] = tuple(patterns)


def volatile_fields() -> dict[str, tuple[str, ...]]:
    """Every declared volatile-field pattern, by owner."""
    return dict(_VOLATILE)


def volatile_patterns(framework: str | None) -> tuple[str, ...]:
    """The volatile-field patterns of ``framework``'s calls (``None``, or a name nothing was
    declared for: none, every field is compared)."""
    return () if framework is None else _VOLATILE.get(str(framework), ())

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
matching (:mod:`rollout_mock.wrap.matching`) and check mode leave out.

The built-in adapters register theirs when ``rollout_mock.adapters`` is imported, which
``import rollout_mock`` does.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "SchedulerHook", "compile_patterns", "matches_pattern", "prepare_scheduler", "register_scheduler_hook",
    "register_volatile_fields", "scheduler_hooks", "volatile_fields",
]

#: Called with the real scheduler; the return value is ignored.
SchedulerHook = Callable[[Any], object]

_HOOKS: list[SchedulerHook] = []
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


def compile_patterns(patterns: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """Dotted patterns as tuples of components (for :func:`matches_pattern`)."""
    return _compiled(tuple(patterns))


@functools.lru_cache(maxsize=64)
def _compiled(patterns: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(p.strip(".").split(".")) for p in patterns if p.strip("."))


def matches_pattern(path: tuple[str, ...], patterns: tuple[tuple[str, ...], ...]) -> bool:
    """Whether the end of ``path`` matches one of ``patterns`` (``*`` matches one component)."""
    for pattern in patterns:
        if len(pattern) <= len(path) and all(
            w == p or fnmatch.fnmatchcase(p, w) for p, w in zip(path[len(path) - len(pattern):], pattern)
        ):
            return True
    return False

"""Interception: wrapping a rollout scheduler so that its calls are recorded or replayed.

:class:`MockScheduler` wraps an object or a Ray actor handle from outside; :func:`mock_class`
subclasses the scheduler so that interception happens inside its own process (a Ray actor).
Both drive one :class:`~rollout_mock.wrap.interceptor.Interceptor` per stream. Framework
adapters adjust the real scheduler through :mod:`rollout_mock.wrap.hooks` (wrap/ imports no
adapter). Names are imported lazily, so that ``rollout_mock.wrap.hooks`` stays cheap to import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["MockScheduler", "mock_class", "wrap_scheduler"]

_EXPORTS = {"MockScheduler": "scheduler", "wrap_scheduler": "scheduler", "mock_class": "actor"}

if TYPE_CHECKING:  # pragma: no cover
    from rollout_mock.wrap.actor import mock_class
    from rollout_mock.wrap.scheduler import MockScheduler, wrap_scheduler


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout_mock.wrap' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rollout_mock.wrap.{module}"), name)
    globals()[name] = value
    return value

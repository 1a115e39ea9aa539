"""Interception: wrapping a rollout scheduler so that its calls are recorded or replayed.

:class:`MockScheduler` wraps an object or a Ray actor handle from outside; :func:`mock_class`
subclasses the scheduler so that interception happens inside its own process (a Ray actor).
Both drive one :class:`~rollout_mock.wrap.interceptor.Interceptor` per stream.
"""

from rollout_mock.wrap.actor import mock_class
from rollout_mock.wrap.scheduler import MockScheduler

__all__ = ["MockScheduler", "mock_class"]

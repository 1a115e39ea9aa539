"""Record/replay modes.

Behaviour elsewhere is derived from :attr:`Mode.records` and :attr:`Mode.replays`, never from
comparing mode strings, so that a new mode only needs its two properties defined here.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Convention", "Mode"]


class Mode(str, Enum):
    """What an enabled :class:`~rollout_mock.MockScheduler` does with each batch.

    ``Mode("dump")`` and ``Mode.DUMP`` are the same value; parsing is case-insensitive.
    """

    DUMP = "dump"
    """Call the real scheduler and record every batch it returns."""

    MOCK = "mock"
    """Serve recorded batches; the real scheduler is never called (nor built)."""

    @property
    def records(self) -> bool:
        """True when batches are written to the dump directory."""
        return self is Mode.DUMP

    @property
    def replays(self) -> bool:
        """True when batches are read from the dump directory instead of being generated."""
        return self is Mode.MOCK

    @classmethod
    def _missing_(cls, value: object) -> Mode | None:
        if isinstance(value, str):
            lowered = value.strip().lower()
            for member in cls:
                if member.value == lowered:
                    return member
        return None

    @classmethod
    def choices(cls) -> list[str]:
        return [member.value for member in cls]

    def __str__(self) -> str:
        return self.value


class Convention(str, Enum):
    """How a scheduler method is called: the convention mock mode must reproduce."""

    SYNC = "sync"
    """A plain method: ``batch = scheduler.get_batch(...)``."""

    ASYNC = "async"
    """An ``async def`` method: ``batch = await scheduler.get_batch(...)``."""

    RAY = "ray"
    """A Ray actor method: ``ref = scheduler.get_batch.remote(...)``; ``ray.get(ref)`` is the batch."""

    def __str__(self) -> str:
        return self.value

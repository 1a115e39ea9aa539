"""Record/replay modes.

Behaviour elsewhere is derived from :attr:`Mode.records`, :attr:`Mode.replays` and
:attr:`Mode.runs_scheduler`, never from comparing mode strings, so that a new mode only needs its
properties defined here:

========  ===========  ===========  ==================
mode      ``records``  ``replays``  ``runs_scheduler``
========  ===========  ===========  ==================
dump      yes          no           yes
mock      no           yes          no
check     no           yes          yes
========  ===========  ===========  ==================
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

    CHECK = "check"
    """Run the real scheduler *and* read the recorded batch of each step, compare the two key by
    key (the verdict is logged and written beside the dump), then serve the recorded batch (or,
    with ``check_serves: live``, the live one). No step is written (miles' "inject" mode)."""

    @property
    def records(self) -> bool:
        """True when batches are written to the dump directory as steps."""
        return self is Mode.DUMP

    @property
    def replays(self) -> bool:
        """True when the dump directory is read: recorded steps must be there (mock, check)."""
        return self is not Mode.DUMP

    @property
    def runs_scheduler(self) -> bool:
        """True when the real scheduler is built and called for every step (dump, check)."""
        return self is not Mode.MOCK

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

"""The store interface every backend implements, and what a step entry records about a batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from rollout_mock.batch import count_samples, describe_keys, rejected_count, type_name
from rollout_mock.errors import (
    StepExistsError,
    StepNotFoundError,
)
from rollout_mock.storage.manifest import (
    StepEntry,
    StreamId,
)

__all__ = ["BatchInfo", "StepStore", "exists_error", "format_ranges", "missing_step_error"]


@dataclass(frozen=True)
class BatchInfo:
    """What the manifest says about a batch, computed from the live object before it is written."""

    type: str
    samples: int | None
    keys: dict[str, dict[str, Any]]
    rejected: int = 0

    @classmethod
    def of(cls, batch: Any) -> BatchInfo:
        return cls(type_name(batch), count_samples(batch), describe_keys(batch), rejected_count(batch))


def format_ranges(steps: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``; ``"none"`` when empty."""
    if not steps:
        return "none"
    parts: list[str] = []
    start = prev = steps[0]
    for step in [*steps[1:], None]:
        if step is not None and step == prev + 1:
            prev = step
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if step is not None:
            start = prev = step
    return ", ".join(parts)


def exists_error(stream: StreamId, step: int, where: str) -> StepExistsError:
    return StepExistsError(
        f"[RolloutMock] refusing to overwrite step {step} of {stream} (mode=dump): {where} already "
        f"exists. Either set `overwrite: true` in the rollout_mock config (e.g. when resuming a "
        f"dump run from a checkpoint), or point dump_dir at a new directory.",
        mode="dump",
        split=stream.split,
        step=step,
        path=where,
    )


@runtime_checkable
class StepStore(Protocol):
    """What the wrappers need of a store: saves and loads recorded steps of streams (a
    ``typing.Protocol``: :class:`~rollout_mock.storage.store.Store` satisfies it without naming
    it; a store of your own may subclass it to inherit the defaults below). Implementations must
    be thread-safe for one writer thread plus readers of *other* steps."""

    def save(
        self,
        stream: StreamId,
        step: int,
        batch: Any,
        info: BatchInfo,
        *,
        method: str | None = None,
        rollout_seconds: float | None = None,
        overwrite: bool = False,
        call: dict[str, Any] | None = None,
    ) -> StepEntry:
        """Record ``batch`` as ``step`` of ``stream``. If the step exists and not ``overwrite``,
        raise :class:`StepExistsError` and change nothing."""

    def load(self, stream: StreamId, step: int, *, trusted: bool = False) -> Any:
        """Return a fresh copy of the recorded batch; :class:`StepNotFoundError` if absent,
        :class:`CorruptStepError` if it does not match its entry."""

    def entry(self, stream: StreamId, step: int) -> StepEntry | None:
        """The manifest entry of a step, or ``None``."""

    def steps(self, stream: StreamId) -> list[int]:
        """Recorded steps of ``stream``, ascending."""

    def methods(self, stream: StreamId) -> dict[str, dict[str, Any]]:
        """Calling conventions recorded for the stream's intercepted methods."""

    def set_methods(self, stream: StreamId, methods: dict[str, dict[str, Any]]) -> None:
        """Record (merge) the calling conventions of the stream's intercepted methods."""

    def fingerprint(self) -> dict[str, Any] | None:
        """The environment fingerprint recorded by the first writer, if any."""

    def set_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        """Record the environment fingerprint unless one is recorded already."""

    def delete(self, stream: StreamId, step: int) -> None:
        """Remove a recorded step (file and manifest entry). Absent steps: silently nothing."""

    def contains(self, stream: StreamId, step: int) -> bool:
        return self.entry(stream, step) is not None

    def describe_location(self, stream: StreamId, step: int) -> str:
        """A human-readable location of a step (a path for directory stores)."""
        return f"{stream.relpath(step)}"

    def open_writer(self, stream: StreamId) -> None:
        """Claim ``stream`` for writing by this object (no-op for stores without locking)."""
        return None

    def close(self) -> None:
        """Release locks held by this store (nothing by default)."""
        return None

    def missing_step_error(self, stream: StreamId, step: int, *, mode: str) -> StepNotFoundError:
        return missing_step_error(self, stream, step, mode=mode)


def missing_step_error(store: StepStore, stream: StreamId, step: int, *, mode: str) -> StepNotFoundError:
    """The error for a step a store does not hold: where it looked, what is recorded, why."""
    recorded = store.steps(stream)
    location = store.describe_location(stream, step)
    return StepNotFoundError(
        f"[RolloutMock] Mock file not found: {location}\n"
        f"Recorded steps for {stream}: {format_ranges(recorded)}\n"
        f"Possible reasons:\n"
        f"  1. step {step} was not run in dump mode (or dump_steps excluded it)\n"
        f"  2. dump_dir is incorrect\n"
        f"  3. mode mismatch (current: {stream.split}): train and val are recorded separately"
        + ("" if stream.name is None else f", and this scheduler is named {stream.name!r}"),
        mode=mode,
        split=stream.split,
        step=step,
        path=location,
    )


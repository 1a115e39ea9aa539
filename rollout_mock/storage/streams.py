"""A stream of recorded steps (a split, optionally a scheduler name and a rank) and where its
files live under a dump: the one place those names are built, from validated parts."""

from __future__ import annotations

from dataclasses import dataclass

from rollout_mock.errors import UnsafePathError
from rollout_mock.storage.paths import check_name

__all__ = ["StreamId"]


@dataclass(frozen=True, order=True)
class StreamId:
    """One sequence of steps: a split, optionally a scheduler name and a rank."""

    split: str
    name: str | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        check_name(self.split, "split")
        if self.name is not None:
            check_name(self.name, "scheduler name")
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0):
            raise UnsafePathError(f"[RolloutMock] invalid rank {self.rank!r}: expected an integer >= 0")

    @classmethod
    def from_key(cls, key: str) -> StreamId:
        """Inverse of :attr:`key` (``split[/name][@rankR]``); validated like any StreamId."""
        rest, _, rank = key.partition("@rank")
        split, _, name = rest.partition("/")
        digits = rank.isascii() and rank.isdigit() and len(rank) <= 9
        return cls(split, name or None, int(rank) if digits else None if not rank else -1)

    @property
    def key(self) -> str:
        key = self.split if self.name is None else f"{self.split}/{self.name}"
        return key if self.rank is None else f"{key}@rank{self.rank}"

    @property
    def directory(self) -> str:
        return self.split if self.name is None else f"{self.split}/{self.name}"

    def file_name(self, step: int) -> str:
        suffix = "" if self.rank is None else f"_rank{self.rank}"
        return f"step_{step:06d}{suffix}.pkl"

    def relpath(self, step: int) -> str:
        return f"{self.directory}/{self.file_name(step)}"

    def __str__(self) -> str:
        return self.key

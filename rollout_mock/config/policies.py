"""The choices the configuration offers, as ``str`` enums (a typo lists the valid values)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CheckServes", "DiskFullPolicy", "FingerprintPolicy", "MismatchPolicy", "MissingStepPolicy", "RankPolicy",
    "ReplayRows", "Tolerance",
]


class DiskFullPolicy(str, Enum):
    """What dump mode does when the disk fills up."""

    FAIL = "fail"
    """Raise :class:`~rollout_mock.errors.DiskFullError` (default): the run stops."""

    SKIP = "skip"
    """Log a loud warning, stop dumping, and let training continue without a recording."""


class FingerprintPolicy(str, Enum):
    """What mock mode does when its environment differs from the one that recorded the dump."""

    WARN = "warn"
    ERROR = "error"
    OFF = "off"


class MissingStepPolicy(str, Enum):
    """What mock mode does when a call asks for a step the dump does not hold."""

    ERROR = "error"
    """Raise :class:`~rollout_mock.errors.StepNotFoundError` listing the recorded steps (default)."""

    REPEAT_NEAREST = "repeat_nearest"
    """Serve the nearest recorded step instead (the closest earlier one, else the closest later
    one: verl's ``action: repeat``), with a warning naming both steps."""

    RECORD = "record"
    """Run the real scheduler for that step and record it into the dump (needs the real
    scheduler: an instance or a ``factory``; ``mock_class`` runs the class's ``__init__`` then)."""


class MismatchPolicy(str, Enum):
    """What mock (and check) mode does when a call asks for other data than the recorded call."""

    ERROR = "error"
    """Raise :class:`~rollout_mock.errors.ReplayMismatchError` before serving the step (default)."""

    WARN = "warn"
    """Log the same explanation as a warning (once per method) and serve the recorded step."""


class CheckServes(str, Enum):
    """Check mode: which of the two batches of a step the caller gets."""

    RECORDED = "recorded"
    """The recorded batch (default): training stays on the recorded data."""

    LIVE = "live"
    """The batch the real rollout just produced."""


class RankPolicy(str, Enum):
    """Which torch.distributed ranks write in dump mode."""

    ONE = "one"
    """Only ``dump_rank`` writes (default): every rank sees the same batch."""

    ALL = "all"
    """Every rank writes its own file ``step_NNNNNN_rankR.pkl`` (per data-parallel head batches)."""


class ReplayRows(BaseModel):
    """Mock mode: this process is data-parallel rank ``dp_rank`` of ``dp_size`` and replays only
    its rows of each recorded batch (split like ``torch.chunk`` / verl's ``DataProto.chunk``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dp_rank: int = Field(ge=0)
    dp_size: int = Field(ge=1)

    def model_post_init(self, __context: Any) -> None:
        if self.dp_rank >= self.dp_size:
            raise ValueError(f"dp_rank {self.dp_rank} must be below dp_size {self.dp_size}")


class Tolerance(BaseModel):
    """Check mode: how close two floating-point values of a key must be to count as equal
    (``|live - recorded| <= atol + rtol * |recorded|``, NaN equal to NaN)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rtol: float = Field(default=0.0, ge=0)
    atol: float = Field(default=0.0, ge=0)

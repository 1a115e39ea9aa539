"""The ``watchdog:`` and ``verdict:`` sub-blocks of the ``rollout_mock:`` configuration.

Both are optional; a plain string is shorthand (``verdict: fail``, ``watchdog: false``)::

    rollout_mock:
      verdict: {action: warn, rtol: {pg_loss: 1.0e-6}, atol: 0.0}
      watchdog: {enable: true, factor: 10, min_seconds: 60, absolute_seconds: 3600}
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["VerdictAction", "VerdictConfig", "WatchdogConfig"]


class VerdictAction(str, Enum):
    """What mock mode does when a logged metric differs from the value the dump run logged."""

    WARN = "warn"
    """Log the first divergence (step, metric, both values) as a warning; training goes on."""

    FAIL = "fail"
    """Raise :class:`~rollout_mock.errors.MetricsDivergenceError` from ``MetricsWriter.log``."""

    OFF = "off"
    """Do not compare (dump mode still records the expected values)."""


def _tolerances(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"default": float(value)}
    return value


class VerdictConfig(BaseModel):
    """On-line comparison of a replaying run's metrics with the values the dump run logged.

    ``rtol``/``atol``: a number for every metric, or ``{metric: tol, "default": tol}``. Both 0
    (the default) means bitwise equality, as ``rollout-mock verify``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: VerdictAction = VerdictAction.WARN
    rtol: dict[str, float] = Field(default_factory=lambda: {"default": 0.0})
    atol: dict[str, float] = Field(default_factory=lambda: {"default": 0.0})

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str | VerdictAction):
            return {"action": value}
        if isinstance(value, bool):
            return {"action": "warn" if value else "off"}
        return value

    @field_validator("rtol", "atol", mode="before")
    @classmethod
    def _parse_tol(cls, value: Any) -> Any:
        return _tolerances(value)

    @field_validator("rtol", "atol")
    @classmethod
    def _check_tol(cls, value: dict[str, float]) -> dict[str, float]:
        for name, tol in value.items():
            if not (tol >= 0.0) or tol == float("inf"):
                raise ValueError(f"tolerance of {name!r} must be a finite number >= 0, got {tol!r}")
        return value

    def tolerance(self, metric: str) -> tuple[float, float]:
        """``(rtol, atol)`` of one metric."""
        return (
            self.rtol.get(metric, self.rtol.get("default", 0.0)),
            self.atol.get(metric, self.atol.get("default", 0.0)),
        )


class WatchdogConfig(BaseModel):
    """Stall detection around intercepted calls (see :mod:`rollout_mock.wrap.watchdog`).

    A call (or the time between two calls) is a stall when it lasts longer than
    ``max(min_seconds, factor * median of the recent durations of the same kind)``, or longer than
    ``absolute_seconds`` whatever the history. Before any history exists only
    ``absolute_seconds`` applies.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enable: bool = True
    factor: float = Field(default=10.0, gt=1.0)
    min_seconds: float = Field(default=60.0, ge=0.0)
    absolute_seconds: float | None = Field(default=3600.0, gt=0.0)
    history: int = Field(default=20, ge=1)
    """How many recent durations the running median is taken over."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return {"enable": value}
        return value

"""The ``watchdog:``, ``verdict:`` and ``keep:`` sub-blocks of the ``rollout_mock:`` configuration.

All are optional; a plain value is shorthand (``verdict: fail``, ``watchdog: false``, a metric
rule ``loss: 6``)::

    rollout_mock:
      verdict: {action: warn, rtol: {pg_loss: 1.0e-6}, atol: 0.0}
      watchdog: {enable: true, factor: 10, min_seconds: 60, absolute_seconds: 3600}
      keep: {last: 50, max_bytes: 20GB, before: 5, after: 5, metrics: {loss: {z: 6}, "*": {z: 8}}}
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ByteSize, ConfigDict, Field, field_validator, model_validator

__all__ = ["KeepConfig", "MetricRule", "VerdictAction", "VerdictConfig", "WatchdogConfig"]


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


#: Most steps an anomaly window may reach on either side, and most values a metric window holds.
MAX_WINDOW = 10_000


class MetricRule(BaseModel):
    """When a metric's value is an anomaly (the ``keep.metrics`` block; a number is shorthand for
    ``{z: number}``).

    A value is an anomaly when it is NaN or ±inf (``nonfinite``), or when it lies more than ``z``
    robust deviations from the median of the metric's last ``window`` finite values: ``|x -
    median| / (1.4826 * MAD) > z`` (MAD: the median absolute deviation; where it is 0, the mean
    absolute deviation × 1.2533 instead; where that is 0 too, every value of the window is the
    same and no value is flagged). Nothing is flagged as a spike before the window holds
    ``warmup`` values.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    z: float | None = Field(default=None, gt=0)
    """Robust deviations from the window's median beyond which a value is a spike; ``null``: only
    NaN/inf (with ``nonfinite``)."""

    window: int = Field(default=50, ge=3, le=MAX_WINDOW)
    """How many recent finite values the median and MAD are taken over."""

    warmup: int = Field(default=10, ge=3, le=MAX_WINDOW)
    """Values the window must hold before a spike can be flagged (at most ``window``)."""

    nonfinite: bool = True
    """A NaN or ±inf value is an anomaly."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return {"z": value}
        return value

    @model_validator(mode="after")
    def _warmup_in_window(self) -> MetricRule:
        if self.warmup > self.window:
            raise ValueError(f"warmup ({self.warmup}) must be at most window ({self.window})")
        return self


class KeepConfig(BaseModel):
    """Dump mode's flight recorder: which recorded steps are kept (see ``docs/debugging.md``).

    The newest ``last`` steps (the ring, also bounded by ``max_bytes``), plus every pinned step
    and the steps around an anomaly (``before`` steps before it, ``after`` after it, by step
    number). Anomalies: NaN/inf in a recorded batch (``nonfinite``), a metric given to
    ``MockScheduler.observe`` (or a ``MetricsWriter(..., expected=scheduler)``) that ``metrics``
    flags, an explicit ``MockScheduler.pin(step, reason)``. ``max_keep: N`` is shorthand for
    ``keep: {last: N}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    last: int | None = Field(default=None, ge=1)
    """Size of the ring: the newest recorded steps kept whatever happens; older steps are deleted
    unless pinned or in an anomaly window. ``null``: no ring, every step is kept (anomalies are
    still detected and their reasons written in the index)."""

    max_bytes: ByteSize | None = None
    """The ring's bound in bytes (``20GB``, ``512MiB`` or a number): the oldest ring steps go
    while the ring holds more, the newest step always stays. Pinned and window steps are not
    counted (``max_anomalies`` bounds them)."""

    before: int = Field(default=0, ge=0, le=MAX_WINDOW)
    """Steps before an anomaly that are kept (must be below ``last``: the ring must still hold
    them when the anomaly is detected)."""

    after: int = Field(default=0, ge=0, le=MAX_WINDOW)
    """Steps after an anomaly that are kept, as they are recorded."""

    nonfinite: bool = True
    """Scan each recorded batch for NaN/inf (on the writer thread, after the copy is taken)."""

    metrics: dict[str, MetricRule] = Field(default_factory=dict)
    """``{metric name or glob pattern: rule}`` (exact names first, then the patterns in order;
    ``"*"`` matches every metric). Without a rule a metric is an anomaly only when NaN or inf."""

    max_anomalies: int = Field(default=16, ge=0)
    """Detected anomalies (batch or metric) kept with their windows; later ones are only logged,
    so a run that stays NaN does not keep every step. Explicit pins are always kept."""

    @field_validator("max_bytes")
    @classmethod
    def _positive_bytes(cls, value: ByteSize | None) -> ByteSize | None:
        if value is not None and value < 1:
            raise ValueError("must be at least 1 byte")
        return value

    @model_validator(mode="after")
    def _ring_holds_the_window(self) -> KeepConfig:
        if self.last is not None and self.before >= self.last:
            raise ValueError(
                f"before ({self.before}) must be below last ({self.last}): the ring must still hold the "
                f"steps before an anomaly when it is detected; raise last to at least {self.before + 1}")
        return self

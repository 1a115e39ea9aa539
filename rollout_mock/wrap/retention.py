"""Dump mode's flight recorder (``keep:``): which recorded steps are kept, and why.

Record every step, keep what matters: the newest steps (a ring bounded in steps, ``keep.last``,
and in bytes, ``keep.max_bytes``), every pinned step, and the steps around an anomaly
(``keep.before`` steps before it and ``keep.after`` after it, by step number). Three pure parts
decide it; the :class:`~rollout_mock.wrap.recording.Recorder` does the writes and deletions
they ask for, on its writer thread:

* a NaN/inf in a recorded batch — :func:`rollout_mock.codec.scan.nonfinite_values`, run on the
  writer thread over the codec's capture of the batch, in place (the walk of a batch's values
  lives below wrap/, in the codec, with the health line's: :mod:`rollout_mock.codec.scan`);
* :class:`MetricWatch` — a metric that is NaN/inf, or more than ``z`` robust deviations from the
  median of its recent window (``keep.metrics``): fed by :meth:`MockScheduler.observe
  <rollout_mock.MockScheduler.observe>`, by ``MetricsWriter(..., expected=scheduler)`` and by
  :func:`observe`.
* :class:`Retention` — the ring, the pins and the windows of one stream, thread-safe: a step is
  recorded (:meth:`~Retention.written`) on the writer thread while an anomaly or an explicit pin
  (:meth:`~Retention.anomaly`) may come from the training thread; each returns a :class:`Plan`
  (index entries to mark, steps to delete, kept steps the ring already deleted).

A step outside the ring is deleted unless a reason keeps it; the reasons are written into its
index entry (``StepEntry.pin``) and ``rollout-mock ls`` shows them. Metric anomalies arrive after
their step was recorded (the loss is known once the step trained): the ring still holds the
``before`` steps then, as ``keep.before < keep.last`` is required; a kept step the ring had already
deleted is named in a warning with the fix.

:func:`observe` and :func:`pin` (``rollout_mock.observe`` / ``rollout_mock.pin``) reach every
recorder of this process that writes (dump mode), so training code can call them without holding
the scheduler; in mock and check mode, and without rollout_mock, they do nothing.
"""

from __future__ import annotations

import math
import statistics
import threading
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollout_mock.config import KeepSettings, MetricRule
from rollout_mock.storage.manifest import MAX_PIN_REASONS, StepSet, pin_reason
from rollout_mock.text import logger

__all__ = [
    "MAX_METRICS", "MetricWatch", "Plan", "Retention", "active_recorders", "observe", "pin", "register", "robust_z",
    "unregister",
]

#: Most distinct metric names one watch follows (more are not checked; said once).
MAX_METRICS = 1024
#: MAD and mean absolute deviation as estimates of a normal distribution's standard deviation.
_MAD_SCALE = 1.4826
_MEAN_AD_SCALE = 1.2533


# ----------------------------------------------------------------------------- metrics
def robust_z(value: float, window: Iterable[float]) -> float | None:
    """How many robust deviations ``value`` lies from the median of ``window`` (finite values):
    ``|value - median| / (1.4826 * MAD)``; where the MAD is 0 (more than half the values equal),
    the mean absolute deviation × 1.2533 is the scale instead. ``None`` when the window is empty
    or all its values are equal (there is no scale: nothing can be called a jump)."""
    values = list(window)
    if not values:
        return None
    median = statistics.median(values)
    deviations = [abs(x - median) for x in values]
    scale = _MAD_SCALE * statistics.median(deviations)
    if scale == 0:
        scale = _MEAN_AD_SCALE * statistics.fmean(deviations)
    if scale == 0 or not math.isfinite(scale):
        return None
    return abs(value - median) / scale


def _as_float(value: Any) -> float | None:
    """A metric's value as a float (Python and numpy numbers, one-element tensors); ``None``
    for booleans, text and what has no float value."""
    if isinstance(value, bool | str | bytes) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None


@dataclass
class _Series:
    window: deque[float]
    last_step: int


class MetricWatch:
    """Flags metric values that are anomalies under ``keep.metrics`` (see :class:`MetricRule
    <rollout_mock.config.MetricRule>`). Thread-safe.

    Each metric keeps its last ``window`` finite values; a value is checked against the window
    *before* it joins it (a spike joins too: the median and the MAD barely move). A step at or
    before the last one seen for a metric is ignored (the same line logged twice, by a
    ``MetricsWriter`` and by hand, counts once). Values that are not numbers are ignored."""

    def __init__(self, keep: KeepSettings) -> None:
        self.keep = keep
        self._series: dict[str, _Series] = {}
        self._lock = threading.Lock()
        self._full_said = False

    def __repr__(self) -> str:
        return f"MetricWatch({len(self._series)} metrics)"

    def check(self, step: int, metrics: Mapping[str, Any]) -> list[str]:
        """The anomalies among ``metrics`` of ``step``, one reason each (empty: none)."""
        reasons = []
        with self._lock:
            for name, raw in metrics.items():
                value = _as_float(raw)
                if value is None or not isinstance(name, str):
                    continue
                reason = self._check_one(step, name, value, self.keep.rule(name))
                if reason is not None:
                    reasons.append(reason)
        return reasons

    def _check_one(self, step: int, name: str, value: float, rule: MetricRule) -> str | None:
        series = self._series.get(name)
        if series is None:
            if len(self._series) >= MAX_METRICS:
                if not self._full_said:
                    self._full_said = True
                    logger.warning("[RolloutMock] keep: following %d metrics already; %r and later new names "
                                   "are not checked for anomalies", MAX_METRICS, name[:80])
                return None
            series = self._series[name] = _Series(deque(maxlen=rule.window), step - 1)
        if step <= series.last_step:
            return None
        series.last_step = step
        if not math.isfinite(value):
            return f"metric {name} = {value}" if rule.nonfinite else None
        window = series.window
        z = robust_z(value, window) if rule.z is not None and len(window) >= rule.warmup else None
        reason = None
        if z is not None and rule.z is not None and z > rule.z:
            reason = (f"metric {name} = {value:.6g}: {z:.1f} robust deviations from the median "
                      f"{statistics.median(window):.6g} of the last {len(window)} (z > {rule.z:g})")
        window.append(value)
        return reason


# ----------------------------------------------------------------------------- the ring
@dataclass
class Plan:
    """What the recorder must do after a :class:`Retention` decision."""

    #: steps on disk whose index entry must be marked with their reasons (those the plan saw;
    #: write :meth:`Retention.reasons_of`, the latest)
    annotate: dict[int, tuple[str, ...]] = field(default_factory=dict)
    #: steps to delete (they left the ring, nothing keeps them)
    delete: list[int] = field(default_factory=list)
    #: steps that should be kept but the ring deleted them already
    lost: list[int] = field(default_factory=list)
    #: the steps an anomaly keeps (its window; empty for a recorded step)
    window: range = range(0)
    #: the anomaly was not kept: ``keep.max_anomalies`` detected anomalies are kept already
    capped: bool = False

    def __bool__(self) -> bool:
        return bool(self.annotate or self.delete)


class Retention:
    """The ring, the pins and the anomaly windows of one stream (see the module docstring).

    ``keep`` ``None``: nothing is ever deleted (pins are still written into the index).
    ``existing``: ``(step, size, reasons)`` of the steps the stream holds already (a resumed
    dump): they join the ring, the oldest first, and those the index marks pinned stay pinned.

    The ring is the newest ``keep.last`` recorded steps (by step number) holding at most
    ``keep.max_bytes`` bytes (the newest step always stays); a step leaving it is deleted unless
    it has a reason to be kept. Kept steps are not counted in ``max_bytes``: the number of
    detected anomalies kept (``keep.max_anomalies``) bounds them."""

    def __init__(self, keep: KeepSettings | None, pin_steps: Iterable[int] = (),
                 existing: Iterable[tuple[int, int, list[str] | None]] = ()) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        #: why each kept step (on disk or not recorded yet) is kept, in the order the reasons came
        self.reasons: dict[int, list[str]] = {int(s): ["pin_steps"] for s in pin_steps}
        #: the reasons the index holds for each step on disk
        self._annotated: dict[int, tuple[str, ...]] = {}
        self.on_disk = StepSet()
        self.deleted = StepSet()
        self.newest: int | None = None
        self._ring: deque[int] = deque()  # ascending; only with a bound (keep.ring)
        self._sizes: dict[int, int] = {}
        self._ring_bytes = 0
        self._anomalous: set[int] = set()
        #: what the existing steps ask for (deletions beyond the ring): done with the first new step
        self._carry = Plan()
        for step, size, reasons in sorted(existing):
            if reasons:
                merged = dict.fromkeys([*reasons, *self.reasons.get(step, ())])
                self.reasons[step] = list(merged)[:MAX_PIN_REASONS]
                self._annotated[step] = tuple(reasons)
            self._enter(step, size, self._carry)

    def __repr__(self) -> str:
        kept = sum(1 for s in self.reasons if s in self.on_disk)
        return f"Retention({len(self.on_disk)} on disk, {kept} kept beyond the ring, ring={len(self._ring)})"

    @property
    def ring(self) -> list[int]:
        """The steps in the ring now (ascending; empty without a bound)."""
        with self._lock:
            return list(self._ring)

    def reasons_of(self, step: int) -> tuple[str, ...]:
        """``step``'s reasons now (a plan's marks are written with these, not with the reasons
        the plan saw: plans made on two threads may be carried out in either order)."""
        with self._lock:
            return tuple(self.reasons.get(step, ()))

    def kept(self) -> dict[int, tuple[str, ...]]:
        """The steps on disk that have reasons to be kept, with their reasons."""
        with self._lock:
            return {s: tuple(r) for s, r in sorted(self.reasons.items()) if s in self.on_disk}

    def written(self, step: int, size: int) -> Plan:
        """``step`` (of ``size`` bytes) was recorded: mark it if a reason keeps it, and what
        leaves the ring."""
        with self._lock:
            plan, self._carry = self._carry, Plan()
            self._annotated.pop(step, None)  # a rewritten step's entry is new: it holds no reason
            plan.annotate.pop(step, None)
            self._enter(step, size, plan)
        return plan

    def _enter(self, step: int, size: int, plan: Plan) -> None:
        self.on_disk.add(step)
        self.deleted.discard(step)
        self.newest = step if self.newest is None else max(self.newest, step)
        self._mark(step, plan)
        keep = self.keep
        if keep is None or not keep.ring:
            return
        if step in self._sizes:
            self._ring_bytes -= self._sizes[step]
        else:
            self._insert(step)
        self._sizes[step] = size
        self._ring_bytes += size
        last = keep.last if keep.last is not None else math.inf
        while self._ring and (len(self._ring) > last or (
                keep.max_bytes is not None and self._ring_bytes > keep.max_bytes and len(self._ring) > 1)):
            old = self._ring.popleft()
            self._ring_bytes -= self._sizes.pop(old)
            if old in self.reasons:
                continue  # kept beyond the ring
            self.on_disk.discard(old)
            self.deleted.add(old)
            plan.delete.append(old)

    def _insert(self, step: int) -> None:
        if not self._ring or step > self._ring[-1]:
            self._ring.append(step)
            return
        position = next(i for i, s in enumerate(self._ring) if s > step)
        self._ring.insert(position, step)

    def _mark(self, step: int, plan: Plan) -> None:
        """Put ``step``'s reasons in ``plan`` if it is on disk and its entry lacks some."""
        reasons = tuple(self.reasons.get(step, ()))
        if reasons and step in self.on_disk and self._annotated.get(step) != reasons:
            self._annotated[step] = reasons
            plan.annotate[step] = reasons

    def anomaly(self, step: int, reason: str, *, detected: bool = True) -> Plan:
        """Keep ``step`` and its window (``keep.before`` steps before it, ``keep.after`` after
        it) for ``reason`` (the steps of the window for ``"window of step N"``: the reasons are
        on step N itself). ``detected``: found by a scan or a metric, so bounded by
        ``keep.max_anomalies`` (an explicit pin is not). Steps of the window the ring already
        deleted are in ``plan.lost``; steps not recorded yet are kept when they are."""
        keep = self.keep
        before, after = (0, 0) if keep is None else (keep.before, keep.after)
        reason = pin_reason(reason)
        plan = Plan(window=range(step - before, step + after + 1))
        with self._lock:
            if detected and keep is not None and step not in self._anomalous:
                if len(self._anomalous) >= keep.max_anomalies:
                    plan.capped = True
                    return plan
                self._anomalous.add(step)
            for s in plan.window:
                self._add_reason(s, reason if s == step else f"window of step {step}")
                if s in self.on_disk:
                    self._mark(s, plan)
                elif s in self.deleted:
                    plan.lost.append(s)
        return plan

    def _add_reason(self, step: int, reason: str) -> None:
        reasons = self.reasons.setdefault(step, [])
        if reason not in reasons and len(reasons) < MAX_PIN_REASONS:
            reasons.append(reason)


# ----------------------------------------------------------------------------- module-level
class _Pinnable(Protocol):
    def observe(self, step: int, metrics: Mapping[str, Any]) -> list[str]: ...

    def pin(self, step: int, reason: str) -> bool: ...


_ACTIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_ACTIVE_LOCK = threading.Lock()


def register(recorder: _Pinnable) -> None:
    """Make ``recorder`` reachable by :func:`observe` and :func:`pin` (until :func:`unregister`)."""
    with _ACTIVE_LOCK:
        _ACTIVE.add(recorder)


def unregister(recorder: _Pinnable) -> None:
    with _ACTIVE_LOCK:
        _ACTIVE.discard(recorder)


def active_recorders() -> list[Any]:
    """The recorders :func:`observe` and :func:`pin` reach now (open, writing, dump mode)."""
    with _ACTIVE_LOCK:
        return list(_ACTIVE)


def observe(step: int, metrics: Mapping[str, Any]) -> list[str]:
    """Check a step's metrics for anomalies (``keep.metrics``) in every recorder of this process
    (each open dump-mode scheduler that writes); an anomaly keeps the step and its window. Returns
    the anomalies found (empty: none, or no recorder). Pass Python numbers: a CUDA tensor is
    read with ``.item()``, a device synchronisation."""
    found: list[str] = []
    for recorder in active_recorders():
        found += [reason for reason in recorder.observe(step, metrics) if reason not in found]
    return found


def pin(step: int, reason: str) -> bool:
    """Keep ``step`` (and its ``keep.before``/``keep.after`` window) in every recorder of this
    process, with ``reason`` in the index; True when some recorder keeps it (or will, once it is
    recorded), False when none does (no recorder, or the ring already deleted it: a warning says
    so)."""
    kept = False
    for recorder in active_recorders():
        kept = recorder.pin(step, reason) or kept
    return kept

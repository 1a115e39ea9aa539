"""Dump mode's flight recorder (``keep:``): which recorded steps are kept, and why.

Record every step, keep what matters: the newest steps (a ring bounded in steps, ``keep.last``,
and in bytes, ``keep.max_bytes``), every pinned step, and the steps around an anomaly
(``keep.before`` steps before it and ``keep.after`` after it, by step number). Three pure parts
decide it; the :class:`~rollout_mock.wrap.recording.Recorder` does the writes and deletions
they ask for, on its writer thread:

* :func:`nonfinite_values` — where a recorded batch holds NaN or ±inf: a walk of the batch model
  (:func:`rollout_mock.batch.batch_parts`), one ``torch.aminmax`` per floating-point tensor or
  array (NaN and ±inf propagate to the minimum or the maximum: exact, no temporary the size of
  the tensor), Python floats one by one. It runs on the writer thread, on the codec's capture
  of the batch, in place (:meth:`rollout_mock.codec.Capture.tensors`: no second encode, no
  decode), so the training thread never pays for it.
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
import sys
import threading
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rollout_mock.batch import batch_parts, is_array, is_tensor
from rollout_mock.codec import Capture, view_capture
from rollout_mock.config import KeepSettings, MetricRule
from rollout_mock.storage.manifest import MAX_PIN_REASONS, StepSet, pin_reason
from rollout_mock.text import logger

__all__ = [
    "FP16_MAX", "MAX_METRICS", "MetricWatch", "Plan", "Retention", "active_recorders", "health_summary",
    "nonfinite_values", "observe", "pin",
    "register", "robust_z", "unregister",
]

#: Most distinct metric names one watch follows (more are not checked; said once).
MAX_METRICS = 1024
#: Most places :func:`nonfinite_values` names, and most nodes it visits in Python (tensors and
#: arrays cost one vectorised reduction each, whatever their size).
MAX_PLACES = 4
_MAX_NODES = 200_000
_MAX_DEPTH = 32
#: MAD and mean absolute deviation as estimates of a normal distribution's standard deviation.
_MAD_SCALE = 1.4826
_MEAN_AD_SCALE = 1.2533


# ----------------------------------------------------------------------------- NaN/inf in a batch
def _tensor_counts(tensor: Any) -> tuple[int, int] | None:
    """``(NaN count, inf count)`` of a floating-point tensor holding any, else ``None``."""
    import torch

    if tensor.is_nested:
        pieces = [p for p in tensor.unbind() if p.numel()]
    elif tensor.layout is not torch.strided or tensor.device.type == "meta" or not tensor.numel():
        return None  # sparse and meta tensors: no values to look at here
    else:
        pieces = [tensor]
    bad = False
    for piece in pieces:
        if piece.is_complex():
            piece = torch.view_as_real(piece)
        try:
            low, high = torch.aminmax(piece)
            bad = bad or not (bool(torch.isfinite(low)) and bool(torch.isfinite(high)))
        except (RuntimeError, TypeError):  # a dtype aminmax does not cover (float8...): the plain check
            bad = bad or not bool(torch.isfinite(piece).all())
        if bad:
            break
    if not bad:
        return None
    nans = sum(int(torch.isnan(p).sum()) for p in pieces)
    infs = sum(int(torch.isinf(p).sum()) for p in pieces)
    return nans, infs


def _array_counts(array: Any) -> tuple[int, int] | None:
    import numpy as np

    if array.dtype.kind not in "fc" or not array.size:
        return None
    if "torch" in sys.modules and array.dtype.kind == "f" and array.dtype.itemsize in (2, 4, 8) \
            and array.dtype.isnative:
        import torch

        return _tensor_counts(torch.from_numpy(np.ascontiguousarray(array)))  # aminmax, no copy when contiguous
    values = array.view(array.real.dtype) if array.dtype.kind == "c" else array
    if bool(np.isfinite(values.min())) and bool(np.isfinite(values.max())):
        return None
    return int(np.isnan(values).sum()), int(np.isinf(values).sum())


def _counts_text(counts: tuple[int, int]) -> str:
    nans, infs = counts
    return ", ".join(part for part in (f"{nans} NaN" if nans else "", f"{infs} inf" if infs else "") if part)


class _Scan:
    """One walk of a batch (see :func:`nonfinite_values`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.places: list[str] = []
        self.nodes = 0

    def walk(self, obj: Any, path: str, depth: int) -> None:
        self.nodes += 1
        if len(self.places) >= self.limit or self.nodes > _MAX_NODES or depth > _MAX_DEPTH:
            return
        if isinstance(obj, float):
            if not math.isfinite(obj):
                self.places.append(f"{path or '<value>'} ({obj})")
        elif obj is None or isinstance(obj, int | str | bytes | bool | complex):
            return
        elif is_tensor(obj):
            counts = _tensor_counts(obj) if (obj.is_floating_point() or obj.is_complex()) else None
            if counts is not None:
                self.places.append(f"{path or '<value>'} ({_counts_text(counts)})")
        elif is_array(obj):
            if obj.dtype.kind == "O":
                for i, item in enumerate(obj.reshape(-1)):
                    if self.nodes > _MAX_NODES:
                        return
                    self.walk(item, f"{path}[{i}]", depth + 1)
            elif (counts := _array_counts(obj)) is not None:
                self.places.append(f"{path or '<value>'} ({_counts_text(counts)})")
        elif isinstance(obj, Mapping):
            for key, value in obj.items():
                self.walk(value, f"{path}.{key}" if path else str(key), depth + 1)
        elif isinstance(obj, list | tuple):
            if obj and isinstance(obj[0], int | str | bytes) and not isinstance(obj[0], bool):
                return  # token ids, texts: nothing to look at (a float among them is not expected)
            for i, item in enumerate(obj):
                if self.nodes > _MAX_NODES:
                    return
                self.walk(item, f"{path}[{i}]", depth + 1)
        elif (parts := batch_parts(obj)) is not None:
            for name, part in parts.items():
                self.walk(part, f"{path}.{name}" if path else str(name), depth + 1)


def nonfinite_values(batch: Any, *, limit: int = MAX_PLACES) -> list[str]:
    """Where ``batch`` holds NaN or ±inf: at most ``limit`` places, each ``"key (counts)"``
    (``"batch.old_log_probs (3 NaN)"``, ``"[2].rewards (nan)"``); empty when every value is
    finite. ``batch`` may be the codec's capture of a batch (what the writer thread holds in
    background mode): it is read in place (:func:`_captured_nonfinite`).

    Walks what the batch model sees (a DataProto's ``batch``/``non_tensor_batch``/``meta_info``,
    a TensorDict's keys, mappings, lists and tuples, numpy object arrays item by item), at most
    32 levels deep and 200,000 nodes (tensors and arrays count one each); integer, boolean and
    text data are skipped, lists of ints or strings (token ids, texts) without a look. A
    floating-point tensor or array costs one ``aminmax`` pass (NaN and ±inf reach the minimum or
    the maximum); only a tensor holding some is counted exactly. Nested tensors are checked per
    component; sparse and meta tensors are skipped. A CUDA tensor is checked where it is (the
    recorder hands over its CPU copy in background mode)."""
    if isinstance(batch, Capture):
        return _captured_nonfinite(batch, limit)
    scan = _Scan(limit)
    scan.walk(batch, "", 0)
    return scan.places


def _captured_nonfinite(captured: Capture, limit: int) -> list[str]:
    """:func:`nonfinite_values` of the batch ``captured`` holds, read in place: its tensors and
    numeric arrays over the capture's own memory (:meth:`Capture.tensors`: no encode, no decode,
    no copy), its Python floats by :meth:`Capture.floats_finite` (a look at the header's nodes
    and a byte search of the msgpack body). Only a step that holds NaN/inf (or bytes that look
    like one) is rebuilt over the capture's memory (:func:`rollout_mock.codec.view_capture`), to
    name its places exactly as the walk of the batch names them: the step is kept, and the
    reason says where."""
    suspect = False
    for _, value in captured.tensors():
        if isinstance(value, np.ndarray):
            suspect = _array_counts(value) is not None
        else:
            suspect = (value.is_floating_point() or value.is_complex()) and _tensor_counts(value) is not None
        if suspect:
            break
    if not suspect and captured.floats_finite():
        return []
    return nonfinite_values(view_capture(captured), limit=limit)


# ----------------------------------------------------------------------------- health
#: Float keys whose largest magnitude passes this do not fit float16 (65504): flagged.
FP16_MAX = 65504.0
_HEALTH_KEYS = 64
#: Values of one tensor read exactly; a larger one is summarised over evenly spaced rows.
HEALTH_SAMPLE = 1 << 16
#: Values of one list of Python floats read (evenly spaced), at most HEALTH_SAMPLE per key.
HEALTH_LIST = 64
#: Items of a longer list of containers (samples) walked, evenly spaced; the counts under them
#: are scaled to the whole list (``s`` says which fraction was read).
HEALTH_ITEMS = 64
_FLOAT_ITEMS = frozenset({float, int})
#: Values a health walk passes by (by exact type; subclasses are checked with isinstance).
_SKIPPED = frozenset({str, bytes, bool, type(None), complex})


class _NumpyDtypes:
    """The torch dtypes numpy reads as they are (others are widened first)."""

    def __contains__(self, dtype: Any) -> bool:
        import torch

        return dtype in (torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


_NUMPY_DTYPES = _NumpyDtypes()


def _g(x: float) -> float:
    """Five significant digits: a health line stays a few hundred bytes."""
    return float(f"{x:.5g}")


class _Health:
    """One walk of a batch (see :func:`health_summary`); stats per dotted key, list items under ``[]``."""

    def __init__(self) -> None:
        self.keys: dict[str, dict[str, Any]] = {}
        self.nodes = 0
        #: values each one read stands for: > 1 inside a long list read at evenly spaced items
        self.weight = 1.0

    def _acc(self, path: str, kind: str) -> dict[str, Any]:
        return self.keys.setdefault(path or "<value>", {"kind": kind, "n": 0, "nf": 0})

    def _bounds(self, acc: dict[str, Any], lo: float, hi: float) -> None:
        acc["lo"] = lo if "lo" not in acc else min(acc["lo"], lo)
        acc["hi"] = hi if "hi" not in acc else max(acc["hi"], hi)

    def walk(self, obj: Any, path: str, depth: int) -> None:
        self.nodes += 1
        if self.nodes > _MAX_NODES or depth > _MAX_DEPTH or len(self.keys) > _HEALTH_KEYS:
            return
        cls = type(obj)  # the plain types first, by identity: a sample dict's values cost ~0.3 µs each
        if cls in _SKIPPED:
            return
        if cls is float or cls is int:
            self._number(obj, path, cls is float)
        elif cls is dict:
            self._mapping(obj, path, depth)
        elif cls is list:
            self._items(obj, path, depth)
        elif isinstance(obj, bool) or isinstance(obj, str | bytes | complex):
            return
        elif isinstance(obj, int | float):
            self._number(obj, path, isinstance(obj, float))
        elif is_tensor(obj):
            self._tensor(obj, path)
        elif is_array(obj):
            if obj.dtype.kind == "O":
                for item in obj.reshape(-1)[:4096]:
                    self.walk(item, f"{path}[]", depth + 1)
            elif obj.dtype.kind in "fiu" and obj.size:
                self._tensor(obj, path)
        elif isinstance(obj, Mapping):
            self._mapping(obj, path, depth)
        elif isinstance(obj, list | tuple):
            self._items(obj, path, depth)
        elif (parts := batch_parts(obj)) is not None:
            for name, part in parts.items():
                self.walk(part, f"{path}.{name}" if path else str(name), depth + 1)

    def _number(self, value: int | float, path: str, floating: bool) -> None:
        """A Python number: kept (up to :data:`HEALTH_SAMPLE` per key) for :meth:`result`'s one
        numpy pass over the key."""
        acc = self.keys.get(path or "<value>") or self._acc(path, "float" if floating else "int")
        acc["n"] += self.weight
        values = acc.setdefault("values", [])
        if len(values) < HEALTH_SAMPLE:
            values.append(value)

    def _mapping(self, obj: Mapping[Any, Any], path: str, depth: int) -> None:
        for key, value in obj.items():
            if type(value) in _SKIPPED:  # (what walk() passes by, counted as it counts them: no call, no path)
                self.nodes += 1
                continue
            self.walk(value, f"{path}.{key}" if path else str(key), depth + 1)

    def _items(self, obj: list[Any] | tuple[Any, ...], path: str, depth: int) -> None:
        if obj and isinstance(obj[0], list | tuple) and obj[0] and isinstance(obj[0][0], int):
            acc = self._acc(path, "tokens")  # token rows: their lengths
            lengths = [len(row) for row in obj]
            acc["n"] += sum(lengths) * self.weight
            acc["read"] = acc.get("read", 0) + sum(lengths)
            acc.setdefault("lengths", []).extend(lengths)
        elif obj and isinstance(obj[0], int) and not isinstance(obj[0], bool):
            acc = self._acc(path, "tokens")
            acc["n"] += len(obj) * self.weight
            acc["read"] = acc.get("read", 0) + len(obj)
            acc.setdefault("lengths", []).append(len(obj))
        elif obj and type(obj[0]) is float and self._floats(obj, f"{path}[]"):
            return
        elif obj:
            stride = -(-len(obj) // HEALTH_ITEMS)
            items = obj[::stride] if stride > 1 else obj  # a long list (of samples): evenly spaced items
            saved, self.weight = self.weight, self.weight * len(obj) / len(items)
            try:
                for item in items:
                    if self.nodes > _MAX_NODES:
                        return
                    self.walk(item, f"{path}[]", depth + 1)
            finally:
                self.weight = saved

    def _floats(self, obj: list[Any] | tuple[Any, ...], path: str) -> bool:
        """A list of Python floats (log-probs of a sample): at most :data:`HEALTH_LIST` of its
        values, evenly spaced, are kept for one numpy pass per key (:meth:`result`), and no more
        than :data:`HEALTH_SAMPLE` per key; a walk value by value costs a microsecond each, in the
        caller's thread. False (walked item by item) when the sample holds anything but floats
        and ints."""
        stride = -(-len(obj) // HEALTH_LIST)
        sample = obj[::stride] if stride > 1 else obj
        if not set(map(type, sample)) <= _FLOAT_ITEMS:
            return False
        acc = self.keys.get(path) or self._acc(path, "float")
        acc["n"] += len(obj) * self.weight
        values = acc.setdefault("values", [])
        room = HEALTH_SAMPLE - len(values)
        if room > 0:
            values.extend(sample[:room])
        return True

    def _tensor(self, t: Any, path: str) -> None:
        """A tensor's (or array's) values, through numpy: the sample is small, and numpy's
        single-threaded reductions do not wake torch's intra-op thread pool, which the training
        thread and the writer thread share."""
        import torch

        if isinstance(t, torch.Tensor):
            if t.is_sparse or t.is_nested or t.device.type == "meta" or t.dtype == torch.bool or t.is_complex():
                return
            floating = t.is_floating_point()
        else:
            floating = t.dtype.kind == "f"
        acc = self._acc(path, "float" if floating else "int")
        n = int(t.numel() if isinstance(t, torch.Tensor) else t.size)
        acc["n"] += n * self.weight
        if not n:
            return
        if n > HEALTH_SAMPLE:  # evenly spaced rows (whole rows: the lengths stay right), at most ~HEALTH_SAMPLE values
            stride = -(-n // HEALTH_SAMPLE)
            rows = t.shape[0] if t.ndim > 1 else n
            t = t[::stride] if t.ndim > 1 and rows >= stride else t.reshape(-1)[::stride]
        if isinstance(t, torch.Tensor):
            t = t.detach().cpu()
            if (floating and t.element_size() < 4) or t.dtype not in _NUMPY_DTYPES:
                t = t.float() if floating else t.long()
            a = t.numpy()
        else:
            a = t
        if floating:
            self._float_values(acc, a)
        else:
            acc["read"] = acc.get("read", 0) + a.size
            self._bounds(acc, float(a.min()), float(a.max()))
            name = path.rsplit(".", 1)[-1]
            if name.endswith("mask") and a.ndim == 2:  # attention / response / loss masks: the lengths
                acc["lengths"] = acc.get("lengths", []) + a.sum(-1).tolist()

    def _float_values(self, acc: dict[str, Any], a: Any) -> None:
        """Counts, bounds and sum of a float array's values (those read of a key)."""
        import numpy as np

        acc["read"] = acc.get("read", 0) + a.size
        lo_f, hi_f = float(a.min()), float(a.max())
        if not (math.isfinite(lo_f) and math.isfinite(hi_f)):  # rare: count, then the finite part
            finite = np.isfinite(a)
            acc["nf"] += int(a.size - finite.sum())
            a = a[finite]
            if not a.size:
                return
            lo_f, hi_f = float(a.min()), float(a.max())
        self._bounds(acc, lo_f, hi_f)
        acc["sum"] = acc.get("sum", 0.0) + float(a.sum(dtype=np.float64))

    def result(self) -> dict[str, Any]:
        import numpy as np

        keys: dict[str, dict[str, Any]] = {}
        flags: list[str] = []
        for key, acc in self.keys.items():
            values = acc.pop("values", None)
            if values:  # the Python numbers kept (:meth:`_number`, :meth:`_floats`), in one pass
                self._float_values(acc, np.array(values, dtype=np.float64))
            out: dict[str, Any] = {"n": round(acc["n"])}
            if acc.get("read", acc["n"]) < acc["n"]:
                out["s"] = _g(acc["read"] / round(acc["n"]))  # the fraction of the values read
            if acc["nf"]:
                out["nf"] = acc["nf"]
                flags.append(f"nonfinite:{key}")
            if "lo" in acc:
                out["lo"], out["hi"] = _g(acc["lo"]), _g(acc["hi"])
                if acc["kind"] == "float":
                    finite = acc.get("read", acc["n"]) - acc["nf"]
                    out["mean"] = _g(acc["sum"] / finite) if finite else None
                    if finite > 1 and acc["lo"] == acc["hi"]:
                        flags.append(f"constant:{key}")
                    if max(abs(acc["lo"]), abs(acc["hi"])) > FP16_MAX:
                        flags.append(f"beyond_fp16:{key}")
            if acc.get("lengths"):
                lengths = sorted(int(x) for x in acc["lengths"])
                out["len"] = [lengths[0], lengths[len(lengths) // 2], lengths[-1],
                              _g(sum(lengths) / len(lengths))]
            keys[key] = out
        return {"keys": keys, "flags": flags}


def health_summary(batch: Any) -> dict[str, Any]:
    """A few hundred bytes that say how a batch looks, kept for every step even when its batch is
    dropped (``keep:``): per dotted key (list items under ``[]``), ``n`` values, ``nf`` NaN/inf
    (left out when 0), ``lo``/``hi`` (finite values) and, for floating keys, ``mean``; for token
    keys (lists of token rows) and 2-D ``*mask`` keys, ``len``: [min, median, max, mean] of the
    row lengths. ``flags``: ``nonfinite:KEY``, ``constant:KEY`` (a floating key whose values are
    all equal: a GRPO group with equal rewards), ``beyond_fp16:KEY`` (a magnitude over 65504).

    Cost: one ``aminmax`` pass per tensor and one sum per floating tensor (and per 2-D mask),
    over at most :data:`HEALTH_SAMPLE` values per tensor (the recorder takes it just before its
    copy of the batch; the writer thread writes it): a larger tensor is
    summarised over evenly spaced rows, and its line says which fraction was read (``s``; ``n``
    is still every value, ``nf`` counts the NaN/inf among those read; a NaN elsewhere is the
    ``keep:`` scan's to find). Python objects are read the same way, since the walk runs in the
    dump-mode call: a list of more than :data:`HEALTH_ITEMS` containers (sample dicts) at that
    many evenly spaced items (its counts scaled to the whole list), a list of floats at
    :data:`HEALTH_LIST` evenly spaced values, and the numbers of a key in one numpy pass. See
    benchmarks/README.md, bench_health and bench_shapes."""
    walk = _Health()
    walk.walk(batch, "", 0)
    return walk.result()


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

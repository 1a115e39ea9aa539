"""Compare two dump directories step by step and key by key: ``rollout-mock diff DUMP_A DUMP_B``.

How it works, cheapest first:

1. Only ``manifest.json`` of each dump is read to list streams and steps. Streams and steps
   recorded on one side only are reported as such.
2. A step whose manifest entries have the same checksum and size on both sides is **identical**
   without opening its files (the fast path: nothing is unpickled).
3. Only steps whose checksums differ are loaded (and verified against their manifests), one step
   at a time, both sides, and compared structurally; each pair is released before the next one.
   Identical content with different file bytes (e.g. another pickling order of ``meta_info``)
   counts as equal.

Batches are walked in parallel and reported with dotted keys: dicts (nested), TensorDict,
DataProto-like objects (``batch`` / ``non_tensor_batch`` / ``meta_info``), dataclasses, and
lists of per-trajectory dicts (AReaL; ``None`` = rejected trajectory; keys like ``[3].rewards``).

For tensors and numpy arrays: shape, dtype, bitwise equality (NaN-aware: equal bit patterns are
equal, so two identical NaNs match while ``0.0`` and ``-0.0`` do not), the maximum absolute
difference over the differing elements (NaN when a NaN faces a number), how many samples (rows
along dim 0) differ and the first of them. Object arrays are compared element by element; other
values (``meta_info`` entries, strings, numbers) with ``==`` (floats by bit pattern).

With ``atol``/``rtol`` a numeric key that is not bitwise equal but satisfies
``|a - b| <= atol + rtol * |b|`` everywhere (same shape and dtype) is *close*, which passes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import torch

from rollout_mock.errors import RolloutMockError
from rollout_mock.loading import Dump, open_dump
from rollout_mock.manifest import StepEntry, StreamId
from rollout_mock.store import format_ranges

__all__ = [
    "DiffInputError",
    "DiffReport",
    "KeyDiff",
    "Progress",
    "StepDiff",
    "StreamDiff",
    "compare_batches",
    "diff_dumps",
    "format_diff",
    "parse_steps",
]

#: Differing keys listed per step in the text report, and differing steps shown in detail.
MAX_KEYS_SHOWN = 12
MAX_STEPS_SHOWN = 20
_REPR_WIDTH = 60


class DiffInputError(RolloutMockError, ValueError):
    """The arguments of :func:`diff_dumps` are inconsistent (bad step range, unknown split)."""


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyDiff:
    """One key that is not identical on both sides.

    ``status``: ``"different"``, ``"close"`` (within atol/rtol), ``"only_in_a"``, ``"only_in_b"``.
    ``kind``: ``"tensor"``, ``"ndarray"``, ``"object_array"``, ``"value"`` or ``"type"`` (the two
    sides are different kinds of things). Shapes/dtypes are ``None`` for non-arrays.
    ``first_index`` is the first differing sample (index along dim 0) of an array, or the first
    differing position of a list/tuple value; ``samples_differ`` counts differing samples;
    ``first_element`` is the full index of the first differing element and ``first_a``/``first_b``
    the ``repr`` of its two values.
    """

    key: str
    status: str
    kind: str
    a: str | None = None
    b: str | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    max_abs_diff: float | None = None
    elements_differ: int | None = None
    samples_differ: int | None = None
    samples: int | None = None
    first_index: int | None = None
    first_element: tuple[int, ...] | None = None
    first_a: str | None = None
    first_b: str | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in ("shape_a", "shape_b", "first_element"):
            if out[name] is not None:
                out[name] = list(out[name])
        out["max_abs_diff"] = _json_float(self.max_abs_diff)
        return out


@dataclass(frozen=True)
class StepDiff:
    """One step of one stream.

    ``status``: ``"identical"`` (same checksum: not loaded), ``"equal"`` (loaded: same content,
    different file bytes), ``"close"`` (within tolerance), ``"different"``,
    ``"checksum_differs"`` (``quick`` mode: not loaded), ``"only_in_a"``, ``"only_in_b"``.
    """

    step: int
    status: str
    loaded: bool = False
    type_a: str | None = None
    type_b: str | None = None
    samples_a: int | None = None
    samples_b: int | None = None
    keys_compared: int = 0
    keys: tuple[KeyDiff, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status in ("identical", "equal", "close")

    @property
    def first_differing_sample(self) -> int | None:
        """Smallest differing sample index over the differing array keys of this step."""
        found = [k.first_index for k in self.keys if k.first_index is not None and k.kind != "value"]
        return min(found) if found else None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "loaded": self.loaded,
            "type_a": self.type_a,
            "type_b": self.type_b,
            "samples_a": self.samples_a,
            "samples_b": self.samples_b,
            "keys_compared": self.keys_compared,
            "first_differing_sample": self.first_differing_sample,
            "keys": [k.to_json() for k in self.keys],
        }


@dataclass(frozen=True)
class StreamDiff:
    """One stream: ``status`` is ``"both"``, ``"only_in_a"`` or ``"only_in_b"``."""

    stream: str
    status: str
    steps: tuple[StepDiff, ...] = ()
    steps_a: int = 0
    steps_b: int = 0

    def count(self, *statuses: str) -> int:
        return sum(s.status in statuses for s in self.steps)

    @property
    def ok(self) -> bool:
        return self.status == "both" and all(s.ok for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "status": self.status,
            "steps_a": self.steps_a,
            "steps_b": self.steps_b,
            "steps": [s.to_json() for s in self.steps],
        }


@dataclass(frozen=True)
class DiffReport:
    a: str
    b: str
    streams: tuple[StreamDiff, ...]
    atol: float = 0.0
    rtol: float = 0.0
    quick: bool = False
    fingerprint_differs: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Everything compared is identical (or within tolerance) and nothing is one-sided."""
        return all(s.ok for s in self.streams)

    @property
    def identical(self) -> bool:
        """Like :attr:`ok`, without tolerance: every step identical or equal after loading."""
        return self.ok and not any(s.status == "close" for st in self.streams for s in st.steps)

    @property
    def loaded_steps(self) -> int:
        return sum(s.loaded for st in self.streams for s in st.steps)

    def first_difference(self) -> tuple[str, StepDiff] | None:
        """The (stream, step) of the first differing step, by stream then step."""
        for stream in self.streams:
            for step in stream.steps:
                if not step.ok:
                    return stream.stream, step
        return None

    def to_json(self) -> dict[str, Any]:
        first = self.first_difference()
        return {
            "ok": self.ok,
            "identical": self.identical,
            "a": self.a,
            "b": self.b,
            "atol": self.atol,
            "rtol": self.rtol,
            "quick": self.quick,
            "loaded_steps": self.loaded_steps,
            "first_difference": None if first is None else {"stream": first[0], "step": first[1].step},
            "fingerprint_differs": list(self.fingerprint_differs),
            "streams": [s.to_json() for s in self.streams],
        }


def _json_float(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


# --------------------------------------------------------------------------------------------
# Progress bar
# --------------------------------------------------------------------------------------------


class Progress:
    """A minimal progress bar on a text stream (stderr), redrawn at most 10 times a second.

    Disabled (does nothing) unless ``enabled``; by default enabled only when the stream is a TTY.
    Nothing is drawn during the first ``delay`` seconds, so short work shows no bar at all.
    """

    def __init__(
        self,
        total: float,
        *,
        label: str = "",
        stream: TextIO | None = None,
        enabled: bool | None = None,
        delay: float = 0.5,
        unit_scale: float = 1.0,
        unit: str = "",
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled and total > 0
        self.total = float(total)
        self.done = 0.0
        self.label = label
        self.unit_scale = unit_scale
        self.unit = unit
        self.delay = delay
        self._start = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def update(self, amount: float = 1.0, *, label: str | None = None) -> None:
        self.done += amount
        if label is not None:
            self.label = label
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._start < self.delay or (now - self._last < 0.1 and self.done < self.total):
            return
        self._last = now
        self._draw()

    def _draw(self) -> None:
        frac = min(1.0, self.done / self.total) if self.total else 1.0
        width = 24
        filled = int(frac * width)
        bar = "#" * filled + "-" * (width - filled)
        amount = f"{self.done / self.unit_scale:.1f}/{self.total / self.unit_scale:.1f}{self.unit}"
        self.stream.write(f"\r[{bar}] {frac * 100:5.1f}% {amount} {self.label}"[:120].ljust(80))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\r" + " " * 80 + "\r")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Structural comparison
# --------------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"ndarray {value.dtype.name} {list(value.shape)}"
    if _is_dataproto(value) or _is_tensordict(value) or isinstance(value, Mapping):
        try:
            return f"{type(value).__name__} ({len(_children(value))} keys)"
        except Exception:
            return type(value).__name__
    if isinstance(value, (list, tuple)) and _structured(value):
        return f"{type(value).__name__} of {len(value)}"
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _REPR_WIDTH else text[: _REPR_WIDTH - 3] + "..."


def _is_tensordict(obj: Any) -> bool:
    return (
        not isinstance(obj, (Mapping, torch.Tensor, np.ndarray))
        and hasattr(obj, "batch_size")
        and hasattr(obj, "items")
        and hasattr(obj, "keys")
    )


def _is_dataproto(obj: Any) -> bool:
    return not isinstance(obj, type) and all(
        hasattr(obj, attr) for attr in ("batch", "non_tensor_batch", "meta_info")
    )


def _is_container(obj: Any) -> bool:
    return (
        isinstance(obj, (Mapping, torch.Tensor, np.ndarray))
        or _is_tensordict(obj)
        or _is_dataproto(obj)
        or (dataclasses.is_dataclass(obj) and not isinstance(obj, type))
    )


def _structured(seq: list[Any] | tuple[Any, ...]) -> bool:
    """A list walked item by item: it holds dicts, arrays or batches (``None`` = rejected)."""
    return any(_is_container(item) for item in seq)


def _node_kind(obj: Any) -> str:
    if isinstance(obj, torch.Tensor):
        return "tensor"
    if isinstance(obj, np.ndarray):
        return "object_array" if obj.dtype == object else "ndarray"
    if _is_dataproto(obj):
        return "dataproto"
    if _is_tensordict(obj):
        return "tensordict"
    if isinstance(obj, Mapping):
        return "mapping"
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return "dataclass"
    if isinstance(obj, (list, tuple)) and _structured(obj):
        return "sequence"
    return "value"


def _children(obj: Any) -> dict[str, Any]:
    kind = _node_kind(obj)
    if kind == "dataproto":
        return {"batch": obj.batch, "non_tensor_batch": obj.non_tensor_batch, "meta_info": obj.meta_info}
    if kind in ("tensordict", "mapping"):
        return {str(k): v for k, v in obj.items()}
    if kind == "dataclass":
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if kind == "sequence":
        return {f"[{i}]": v for i, v in enumerate(obj)}
    raise TypeError(kind)


def _join(prefix: str, key: str) -> str:
    if not prefix:
        return key
    return prefix + key if key.startswith("[") else f"{prefix}.{key}"


def _float_bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _same_value(x: Any, y: Any) -> bool:
    """Exact equality of arbitrary values: types must match, floats by bit pattern, arrays bitwise."""
    if type(x) is not type(y):
        return False
    if isinstance(x, float):
        return _float_bits(x) == _float_bits(y)
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return _compare_arrays("", x, y, 0.0, 0.0) is None
    if isinstance(x, np.generic):
        return x.dtype == y.dtype and x.tobytes() == y.tobytes()
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_same_value(i, j) for i, j in zip(x, y))
    if isinstance(x, Mapping):
        return x.keys() == y.keys() and all(_same_value(x[k], y[k]) for k in x)
    if _is_container(x):
        a, b = _children(x), _children(y)
        return list(a) == list(b) and all(_same_value(a[k], b[k]) for k in a)
    try:
        return bool(x == y)
    except Exception:
        try:
            return repr(x) == repr(y)
        except Exception:
            return False


def _dtype_name(x: torch.Tensor | np.ndarray) -> str:
    if isinstance(x, torch.Tensor):
        return str(x.dtype).removeprefix("torch.")
    return x.dtype.name if x.dtype != object else "object"


def _raw_bytes(x: torch.Tensor | np.ndarray) -> np.ndarray | None:
    """``(numel, itemsize)`` uint8 view of the values in C order, or ``None`` if not possible."""
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided or x.is_quantized or getattr(x, "is_nested", False):
            return None
        t = x.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
        size = t.element_size()
        if t.numel() == 0:
            return np.empty((0, size), dtype=np.uint8)
        return t.view(torch.uint8).numpy().reshape(t.numel(), size)
    arr = np.ascontiguousarray(x).reshape(-1)
    if arr.size == 0 or arr.itemsize == 0:
        return np.zeros((arr.size, arr.itemsize), dtype=np.uint8)
    return arr.view(np.uint8).reshape(arr.size, arr.itemsize)


def _numeric_values(x: torch.Tensor | np.ndarray, index: np.ndarray) -> np.ndarray | None:
    """The values at flat ``index`` as float64 (complex128 for complex), or ``None``."""
    try:
        if isinstance(x, torch.Tensor):
            flat = x.detach().cpu().reshape(-1)[torch.from_numpy(index)]
            if flat.dtype == torch.bool:
                flat = flat.to(torch.int64)
            target = torch.complex128 if flat.is_complex() else torch.float64
            return flat.to(target).numpy()
        if x.dtype.kind not in "biufc":
            return None
        flat = np.asarray(x).reshape(-1)[index]
        return flat.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
    except (RuntimeError, TypeError, ValueError):
        return None


def _compare_arrays(
    key: str, a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray, atol: float, rtol: float
) -> KeyDiff | None:
    """``None`` when ``a`` and ``b`` are bitwise identical (same shape, dtype and bits)."""
    kind = "tensor" if isinstance(a, torch.Tensor) else ("object_array" if a.dtype == object else "ndarray")
    shape_a, shape_b = tuple(a.shape), tuple(b.shape)
    dtype_a, dtype_b = _dtype_name(a), _dtype_name(b)
    common: dict[str, Any] = {
        "key": key, "kind": kind, "a": _short(a), "b": _short(b), "shape_a": shape_a,
        "shape_b": shape_b, "dtype_a": dtype_a, "dtype_b": dtype_b,
        "samples": shape_a[0] if shape_a else None,
    }
    same_dtype = dtype_a == dtype_b
    if shape_a != shape_b:
        return KeyDiff(status="different", **common)
    status = "different"
    max_abs: float | None = None
    if kind == "object_array":
        if not same_dtype:
            return KeyDiff(status="different", **common)
        fa, fb = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
        mask = np.fromiter((_same_value(x, y) for x, y in zip(fa, fb)), dtype=bool, count=fa.size)
        bad = np.flatnonzero(~mask)
        if bad.size == 0:
            return None
        first_vals = (_short(fa[bad[0]]), _short(fb[bad[0]]))
    else:
        ra, rb = _raw_bytes(a), _raw_bytes(b)
        if ra is None or rb is None:  # sparse / quantized / nested tensors: compare values only
            if same_dtype and bool(torch.equal(a, b)):  # type: ignore[arg-type]
                return None
            return KeyDiff(status="different", note="not a strided tensor: compared by value only", **common)
        if same_dtype:
            bad = np.flatnonzero(~(ra == rb).all(axis=1))
            if bad.size == 0:
                return None
        else:  # bit patterns of different dtypes are not comparable: compare values
            bad = np.arange(ra.shape[0])
        va, vb = _numeric_values(a, bad), _numeric_values(b, bad)
        first_vals = None
        if va is None or vb is None:
            if not same_dtype:
                return KeyDiff(status="different", **common)
        else:
            both_nan = np.isnan(va) & np.isnan(vb)
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.abs(va - vb)
            diff[both_nan] = 0.0
            if not same_dtype:
                differs = (diff != 0) | np.isnan(diff)
                bad, diff, vb, both_nan = bad[differs], diff[differs], vb[differs], both_nan[differs]
                if bad.size == 0:
                    return KeyDiff(status="different", max_abs_diff=0.0, elements_differ=0,
                                   note="values equal", **common)
            max_abs = float(diff.max())
            first_vals = (_element(a, int(bad[0])), _element(b, int(bad[0])))
            if same_dtype and (atol > 0 or rtol > 0):
                with np.errstate(invalid="ignore", over="ignore"):
                    if bool(np.all(both_nan | (diff <= atol + rtol * np.abs(vb)))):
                        status = "close"
    if shape_a:
        per_sample = max(1, int(np.prod(shape_a[1:])))
        rows = bad // per_sample
        first, samples_differ = int(rows[0]), int(np.unique(rows).size)
    else:  # 0-d
        first, samples_differ = None, None
    if first_vals is None:
        first_vals = (_element(a, int(bad[0])), _element(b, int(bad[0])))
    note = None
    if max_abs == 0.0 and same_dtype:
        note = "bits differ, values equal: signed zeros or NaN payloads"
    return KeyDiff(
        status=status, max_abs_diff=max_abs, elements_differ=int(bad.size),
        samples_differ=samples_differ, first_index=first,
        first_element=tuple(int(i) for i in np.unravel_index(int(bad[0]), shape_a)) if shape_a else (),
        first_a=first_vals[0], first_b=first_vals[1], note=note, **common,
    )


def _element(x: torch.Tensor | np.ndarray, flat_index: int) -> str:
    """``repr`` of one element by flat index (exact: floats with ``repr`` of float64)."""
    try:
        value = x.reshape(-1)[flat_index]
        if isinstance(value, torch.Tensor):
            value = value.item()
        elif isinstance(value, np.generic):
            value = value.item()
        return _short(value)
    except Exception:
        return "?"


def _first_seq_difference(x: Any, y: Any) -> int | None:
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        for i, (p, q) in enumerate(zip(x, y)):
            if not _same_value(p, q):
                return i
        return min(len(x), len(y)) if len(x) != len(y) else None
    return None


def _walk(prefix: str, a: Any, b: Any, atol: float, rtol: float, out: list[KeyDiff], counter: list[int]) -> None:
    kind_a, kind_b = _node_kind(a), _node_kind(b)
    key = prefix or "<batch>"
    if kind_a != kind_b or (kind_a == "sequence" and type(a) is not type(b)):
        counter[0] += 1
        out.append(KeyDiff(key=key, status="different", kind="type", a=_short(a), b=_short(b),
                           note=f"{type(a).__name__} vs {type(b).__name__}"))
        return
    if kind_a in ("tensor", "ndarray", "object_array"):
        counter[0] += 1
        found = _compare_arrays(key, a, b, atol, rtol)
        if found is not None:
            out.append(found)
        return
    if kind_a == "value":
        counter[0] += 1
        if not _same_value(a, b):
            note = None
            if type(a) is not type(b):
                note = f"{type(a).__name__} vs {type(b).__name__}"
            out.append(KeyDiff(key=key, status="different", kind="value", a=_short(a), b=_short(b),
                               first_index=_first_seq_difference(a, b), note=note))
        return
    if type(a) is not type(b):
        # Same structure kind, different classes (e.g. dict vs OrderedDict): note it, go on.
        out.append(KeyDiff(key=key, status="different", kind="type", a=type(a).__name__,
                           b=type(b).__name__, note="container types differ"))
    ca, cb = _children(a), _children(b)
    for name in list(ca) + [k for k in cb if k not in ca]:
        child = _join(prefix, name)
        if name not in cb:
            counter[0] += 1
            out.append(KeyDiff(key=child, status="only_in_a", kind=_leaf_kind(ca[name]), a=_short(ca[name])))
        elif name not in ca:
            counter[0] += 1
            out.append(KeyDiff(key=child, status="only_in_b", kind=_leaf_kind(cb[name]), b=_short(cb[name])))
        else:
            _walk(child, ca[name], cb[name], atol, rtol, out, counter)


def _leaf_kind(value: Any) -> str:
    kind = _node_kind(value)
    return kind if kind in ("tensor", "ndarray", "object_array") else "value"


def compare_batches(a: Any, b: Any, *, atol: float = 0.0, rtol: float = 0.0) -> tuple[list[KeyDiff], int]:
    """Compare two batches; return the non-identical keys and the number of keys compared."""
    out: list[KeyDiff] = []
    counter = [0]
    _walk("", a, b, atol, rtol, out, counter)
    return out, counter[0]


# --------------------------------------------------------------------------------------------
# Dumps
# --------------------------------------------------------------------------------------------


def parse_steps(spec: str) -> list[tuple[int, int | None]]:
    """``"0-9,12,20-"`` -> ``[(0, 9), (12, 12), (20, None)]`` (inclusive; ``None`` = open)."""
    ranges: list[tuple[int, int | None]] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                lo_s, hi_s = part.split("-", 1)
                lo, hi = int(lo_s), (int(hi_s) if hi_s.strip() else None)
            else:
                lo = hi = int(part)
        except ValueError:
            raise DiffInputError(f"--steps {spec!r}: expected N, A-B, A- or a comma list of them, e.g. 0-9,12") from None
        if lo < 0 or (hi is not None and hi < lo):
            raise DiffInputError(f"--steps {spec!r}: bad range {part!r}")
        ranges.append((lo, hi))
    if not ranges:
        raise DiffInputError(f"--steps {spec!r}: no steps given")
    return ranges


def _selected(step: int, ranges: list[tuple[int, int | None]] | None) -> bool:
    return ranges is None or any(lo <= step and (hi is None or step <= hi) for lo, hi in ranges)


def _same_file(x: StepEntry, y: StepEntry) -> bool:
    return x.checksum == y.checksum and x.size == y.size


def _flat(prefix: str, obj: Any, out: dict[str, Any]) -> None:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = obj


def _fingerprint_differences(a: Dump, b: Dump) -> tuple[str, ...]:
    fa: dict[str, Any] = {}
    fb: dict[str, Any] = {}
    _flat("", a.manifest.fingerprint or {}, fa)
    _flat("", b.manifest.fingerprint or {}, fb)
    return tuple(
        f"{k}: {fa.get(k)!r} vs {fb.get(k)!r}" for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)
    )


def _manifest_keys(x: StepEntry, y: StepEntry) -> tuple[KeyDiff, ...]:
    """Keys whose manifest shape/dtype differ, or that are listed on one side only (quick mode)."""
    out: list[KeyDiff] = []
    for key in list(x.keys) + [k for k in y.keys if k not in x.keys]:
        p, q = x.keys.get(key), y.keys.get(key)
        if q is None:
            out.append(KeyDiff(key=key, status="only_in_a", kind="value"))
        elif p is None:
            out.append(KeyDiff(key=key, status="only_in_b", kind="value"))
        elif p != q:
            shape_a = None if p.get("shape") is None else tuple(p["shape"])
            shape_b = None if q.get("shape") is None else tuple(q["shape"])
            out.append(KeyDiff(key=key, status="different", kind="tensor", shape_a=shape_a, shape_b=shape_b,
                               dtype_a=p.get("dtype"), dtype_b=q.get("dtype"), note="from manifest.json"))
    return tuple(out)


def _resolve_streams(dump_a: Dump, dump_b: Dump, split: str | None) -> list[tuple[str, StreamId | None, StreamId | None]]:
    by_a = {s.key: s for s in dump_a.streams()}
    by_b = {s.key: s for s in dump_b.streams()}
    keys = sorted(set(by_a) | set(by_b))
    if split is not None:
        keys = [k for k in keys if (by_a.get(k) or by_b[k]).split == split]
        if not keys:
            known = ", ".join(sorted(set(by_a) | set(by_b))) or "none"
            raise DiffInputError(f"--split {split}: neither dump has a stream of that split (recorded: {known})")
    return [(k, by_a.get(k), by_b.get(k)) for k in keys]


def diff_dumps(
    dump_a: str | os.PathLike[str] | Dump,
    dump_b: str | os.PathLike[str] | Dump,
    *,
    steps: str | list[tuple[int, int | None]] | None = None,
    split: str | None = None,
    trusted: bool = False,
    quick: bool = False,
    atol: float = 0.0,
    rtol: float = 0.0,
    progress: bool | None = False,
    progress_stream: TextIO | None = None,
) -> DiffReport:
    """Compare two dumps (see the module docstring).

    ``steps``: a ``"0-9,12"`` spec or parsed ranges; ``split``: only streams of that split;
    ``trusted``: load with the plain unpickler (arbitrary objects; only for trusted dumps);
    ``quick``: never load, compare manifests only (checksums, keys, shapes, dtypes);
    ``progress``: draw a bar on stderr (``None``: when stderr is a TTY).

    Raises :class:`~rollout_mock.errors.DumpNotFoundError` / ``ManifestError`` for a path that
    is not a readable dump, :class:`DiffInputError` for bad arguments, and the loading errors
    (``CorruptStepError``, ``UnsafePickleError``) of steps that had to be loaded.
    """
    if not (atol >= 0 and rtol >= 0 and math.isfinite(atol) and math.isfinite(rtol)):
        raise DiffInputError(f"atol/rtol must be finite numbers >= 0, got atol={atol} rtol={rtol}")
    a = dump_a if isinstance(dump_a, Dump) else open_dump(dump_a)
    b = dump_b if isinstance(dump_b, Dump) else open_dump(dump_b)
    ranges = parse_steps(steps) if isinstance(steps, str) else steps
    plan = _resolve_streams(a, b, split)

    # Plan first (manifests only), so the progress bar knows the total work.
    per_stream: list[tuple[str, StreamId | None, StreamId | None, list[int], list[int]]] = []
    total_bytes = 0
    any_selected = False
    for key, sa, sb in plan:
        steps_a = [s for s in (a.steps(sa) if sa else []) if _selected(s, ranges)]
        steps_b = [s for s in (b.steps(sb) if sb else []) if _selected(s, ranges)]
        any_selected = any_selected or bool(steps_a or steps_b)
        per_stream.append((key, sa, sb, steps_a, steps_b))
        if sa and sb and not quick:
            for step in sorted(set(steps_a) & set(steps_b)):
                ea, eb = a.entry(sa, step), b.entry(sb, step)
                assert ea is not None and eb is not None
                if not _same_file(ea, eb):
                    total_bytes += ea.size + eb.size
    if ranges is not None and not any_selected:
        raise DiffInputError("--steps: no selected step is recorded in either dump")

    streams: list[StreamDiff] = []
    bar = Progress(total_bytes, stream=progress_stream, enabled=progress, unit_scale=1e6, unit=" MB")
    with bar:
        for key, sa, sb, steps_a, steps_b in per_stream:
            if sa is None or sb is None:
                only = "only_in_a" if sb is None else "only_in_b"
                streams.append(StreamDiff(key, only, (), len(steps_a), len(steps_b)))
                continue
            results: list[StepDiff] = []
            set_a, set_b = set(steps_a), set(steps_b)
            for step in sorted(set_a | set_b):
                ea = a.entry(sa, step) if step in set_a else None
                eb = b.entry(sb, step) if step in set_b else None
                if ea is None or eb is None:
                    entry = ea or eb
                    assert entry is not None
                    results.append(StepDiff(
                        step, "only_in_a" if eb is None else "only_in_b",
                        type_a=None if ea is None else ea.type, type_b=None if eb is None else eb.type,
                        samples_a=None if ea is None else ea.samples, samples_b=None if eb is None else eb.samples,
                    ))
                    continue
                meta = {"type_a": ea.type, "type_b": eb.type, "samples_a": ea.samples, "samples_b": eb.samples}
                if _same_file(ea, eb):
                    results.append(StepDiff(step, "identical", **meta))
                    continue
                if quick:
                    results.append(StepDiff(step, "checksum_differs", keys=_manifest_keys(ea, eb), **meta))
                    continue
                bar.update(0, label=f"{key} step {step}")
                batch_a = a.load(step, sa, trusted=trusted)
                bar.update(ea.size)
                batch_b = b.load(step, sb, trusted=trusted)
                bar.update(eb.size)
                keys, compared = compare_batches(batch_a, batch_b, atol=atol, rtol=rtol)
                del batch_a, batch_b
                if not keys:
                    status = "equal"
                elif all(k.status == "close" for k in keys):
                    status = "close"
                else:
                    status = "different"
                results.append(StepDiff(step, status, loaded=True, keys_compared=compared, keys=tuple(keys), **meta))
            streams.append(StreamDiff(key, "both", tuple(results), len(steps_a), len(steps_b)))
    return DiffReport(
        a=str(a.dump_dir), b=str(b.dump_dir), streams=tuple(streams), atol=atol, rtol=rtol, quick=quick,
        fingerprint_differs=_fingerprint_differences(a, b),
    )


# --------------------------------------------------------------------------------------------
# Text report
# --------------------------------------------------------------------------------------------


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0.0:
        return "0"
    return f"{x:.3g}"


def _shape(shape: tuple[int, ...] | None) -> str:
    return "?" if shape is None else str(list(shape))


def _describe_key(k: KeyDiff) -> str:
    if k.status == "only_in_a":
        return f"{k.key}: only in A" + (f" ({k.a})" if k.a else "")
    if k.status == "only_in_b":
        return f"{k.key}: only in B" + (f" ({k.b})" if k.b else "")
    if k.kind == "type":
        return f"{k.key}: {k.a} vs {k.b}"
    if k.kind == "value":
        where = f" (first differing index {k.first_index})" if k.first_index is not None else ""
        return f"{k.key}: {k.a} vs {k.b}{where}"
    parts: list[str] = []
    if k.shape_a != k.shape_b:
        parts.append(f"shape {_shape(k.shape_a)} vs {_shape(k.shape_b)}")
    if k.dtype_a != k.dtype_b:
        parts.append(f"dtype {k.dtype_a} vs {k.dtype_b}")
    if not parts:
        parts.append(f"{k.dtype_a} {_shape(k.shape_a)}")
    if k.shape_a == k.shape_b:
        if k.status == "close":
            parts.append("within tolerance")
        if k.max_abs_diff is not None:
            parts.append(f"max abs diff {_num(k.max_abs_diff)}")
        if k.elements_differ:
            values = f"{k.first_a} vs {k.first_b}"
            if k.shape_a:
                where = k.first_index if len(k.shape_a) == 1 else k.first_element
                parts.append(
                    f"{k.samples_differ} of {k.samples} samples differ, first at sample {k.first_index} "
                    f"([{', '.join(map(str, where if isinstance(where, tuple) else (where,)))}]: {values})"
                )
            else:
                parts.append(f"value {values}")
    text = f"{k.key}: " + ", ".join(parts)
    return text + (f" ({k.note})" if k.note else "")


def format_diff(report: DiffReport, *, max_steps: int = MAX_STEPS_SHOWN, max_keys: int = MAX_KEYS_SHOWN) -> str:
    """Render the report as plain text: a verdict line, then per stream a summary and details."""
    n_streams = len(report.streams)
    all_steps = [s for st in report.streams for s in st.steps]
    bad_steps = [s for s in all_steps if not s.ok]
    one_sided = [st for st in report.streams if st.status != "both"]
    if report.ok:
        verdict = "IDENTICAL" if report.identical else f"WITHIN TOLERANCE (atol={report.atol:g}, rtol={report.rtol:g})"
    else:
        parts = []
        if bad_steps:
            parts.append(f"{len(bad_steps)} of {len(all_steps)} steps differ")
        if one_sided:
            parts.append(f"{len(one_sided)} of {n_streams} streams on one side only")
        verdict = "DIFFERENT (" + "; ".join(parts) + ")"
    lines = [f"rollout-mock diff: {verdict}", f"  A: {report.a}", f"  B: {report.b}"]
    if not n_streams:
        lines.append("  (neither dump has any stream)")
    identical = sum(s.status == "identical" for s in all_steps)
    if report.ok and identical == len(all_steps) and all_steps:
        lines.append(
            f"  all {len(all_steps)} steps of {n_streams} stream(s) have equal checksums in manifest.json: "
            f"identical without loading (nothing unpickled)"
        )
    for st in report.streams:
        lines.append("")
        if st.status != "both":
            side, n = ("A", st.steps_a) if st.status == "only_in_a" else ("B", st.steps_b)
            lines.append(f"stream {st.stream}: only in {side} ({n} steps)")
            continue
        counts = [
            f"{st.count('identical')} identical by checksum (not loaded)",
            f"{st.count('equal')} equal after loading",
        ]
        if st.count("close"):
            counts.append(f"{st.count('close')} within tolerance")
        if st.count("checksum_differs"):
            counts.append(f"{st.count('checksum_differs')} with different checksums (not loaded: --quick)")
        counts.append(f"{st.count('different')} different")
        common = len([s for s in st.steps if s.status not in ("only_in_a", "only_in_b")])
        lines.append(f"stream {st.stream}: {common} steps in both: " + ", ".join(counts))
        shown = 0
        for s in st.steps:
            if s.status not in ("different", "close", "checksum_differs"):
                continue
            if shown == max_steps:
                rest = sum(x.status in ("different", "close", "checksum_differs") for x in st.steps) - shown
                lines.append(f"  ... {rest} more differing steps (--json lists all)")
                break
            shown += 1
            head = f"  step {s.step}:"
            if s.status == "checksum_differs":
                head += " checksums differ"
            else:
                first = s.first_differing_sample
                head += f" {sum(k.status != 'close' for k in s.keys)} of {s.keys_compared} keys differ"
                if s.status == "close":
                    head = f"  step {s.step}: within tolerance ({len(s.keys)} keys not bitwise equal)"
                elif first is not None:
                    head += f", first differing sample {first}"
            if s.type_a != s.type_b:
                head += f"; type {s.type_a} vs {s.type_b}"
            if s.samples_a != s.samples_b:
                head += f"; samples {s.samples_a} vs {s.samples_b}"
            lines.append(head)
            for k in s.keys[:max_keys]:
                lines.append(f"    {_describe_key(k)}")
            if len(s.keys) > max_keys:
                lines.append(f"    ... {len(s.keys) - max_keys} more keys (--json lists all)")
        only_a = [s.step for s in st.steps if s.status == "only_in_a"]
        only_b = [s.step for s in st.steps if s.status == "only_in_b"]
        if only_a:
            lines.append(f"  steps only in A: {format_ranges(only_a)}")
        if only_b:
            lines.append(f"  steps only in B: {format_ranges(only_b)}")
    if report.fingerprint_differs:
        lines.append("")
        lines.append("note: the dumps were recorded in different environments:")
        lines.extend(f"  {d}" for d in report.fingerprint_differs[:10])
        if len(report.fingerprint_differs) > 10:
            lines.append(f"  ... {len(report.fingerprint_differs) - 10} more")
    return "\n".join(lines)


def iter_differences(report: DiffReport) -> Iterator[tuple[str, StepDiff]]:
    """Every (stream, step) that is not identical/equal/close, in order."""
    for st in report.streams:
        for s in st.steps:
            if not s.ok:
                yield st.stream, s

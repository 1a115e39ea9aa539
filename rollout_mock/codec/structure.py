"""A value's structure, walked one way: the structural comparison engine and the request record.

The engine (:func:`compare_batches`) walks two values side by side, bit for bit or within
tolerances: one :class:`KeyDiff` (path, status, kind, both values' summaries) per key that is not
identical. Batches through their parts (:func:`rollout_mock.batch.batch_parts`), mappings (and
objects with ``keys()`` and ``[key]``) key by key, dataclasses and records (``to_dict()``) field by
field, lists of containers item by item; tensors, numpy arrays (object arrays element by element)
and plain values are leaves. One tolerance rule, :func:`rollout_mock.text.within_tolerance`
(element-wise: :func:`~rollout_mock.text.within_tolerance_array`), as ``verify`` applies it. It
serves ``diff`` (:mod:`rollout_mock.compare.diff`) and check mode (:mod:`rollout_mock.wrap.check`
scores the leaves of :func:`leaves` with :func:`same_value`).

The request record (:func:`record_request`) folds one value into CRCs: the request digest of
:mod:`rollout_mock.wrap.matching` (format 2: type tags, CRC chaining, block prefix CRCs, one C
call for a list of numbers, a block of dicts by column, a flat dict; described there) and its
fields to ``node_depth`` as nodes with a short summary (a tensor by dtype, shape and CRC, never its
bytes). The volatile-field patterns left out are the caller's (wrap/ passes its framework's).

Both read a value with one dispatch, :func:`kind_of`, and a container's fields with
:func:`node_fields`. The module lives below wrap/ (it needs the batch model, numbers and CRCs).
"""

from __future__ import annotations

import array
import dataclasses
import enum
import fnmatch
import functools
import itertools
import operator
import re
import reprlib
import struct
import types
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack
import numpy as np
import torch

from rollout_mock.batch import batch_parts, batch_type_of, meta_part_names, step_names
from rollout_mock.crc import crc32
from rollout_mock.text import json_float, logger, within_tolerance, within_tolerance_array

__all__ = [
    "BLOCKS", "HEAD", "KeyDiff", "Recorded", "block_bounds", "compare_batches", "compile_patterns", "is_timing_key",
    "kind_of", "leaves", "matches_pattern", "node_fields", "record_request", "same_value",
]

_REPR_WIDTH = 60


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
        out["max_abs_diff"] = json_float(self.max_abs_diff)
        return out


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"ndarray {value.dtype.name} {list(value.shape)}"
    if _node_kind(value) not in ("sequence", "value", "dataclass", "record"):
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


def _is_mapping_like(obj: Any) -> bool:
    """A Mapping, or an object with ``keys()`` and ``[key]`` (a proxy without ``len``,
    ``iter``, ``values`` or ``==``; only ``keys()``, returning a set, and ``__getitem__``)."""
    if isinstance(obj, Mapping):
        return True
    if isinstance(obj, (type, torch.Tensor, np.ndarray, str, bytes)):
        return False
    return callable(getattr(type(obj), "keys", None)) and callable(getattr(type(obj), "__getitem__", None))


def _keys_readable(obj: Any) -> bool:
    """Whether a mapping-like object lists its keys (a stand-in of a damaged step, whose parts
    are not mappings, cannot: it is then compared as a value)."""
    if isinstance(obj, Mapping):
        return True
    try:
        obj.keys()
    except Exception:  # noqa: BLE001 - whatever a damaged object raises
        return False
    return True


def _record(obj: Any) -> dict[str, Any] | None:
    """The fields of a record: an object (not a tensor, an array or a type) whose ``to_dict()``
    returns a mapping; ``None`` for anything else."""
    if isinstance(obj, (type, torch.Tensor, np.ndarray, Mapping, str, bytes)):
        return None
    to_dict = getattr(obj, "to_dict", None)
    if not callable(to_dict):
        return None
    try:
        fields = to_dict()
    except Exception:  # noqa: BLE001 - a record that cannot list its fields is compared as a value
        return None
    return {str(k): v for k, v in fields.items()} if isinstance(fields, Mapping) else None


#: The kinds of :func:`kind_of` that hold other values by name or by index (not lists: see
#: :func:`_structured`).
_CONTAINER_KINDS = frozenset({"tensor", "ndarray", "object_array", "mapping", "dataclass"})


def _is_container(obj: Any) -> bool:
    kind = kind_of(obj)
    if kind in _CONTAINER_KINDS or kind.startswith("batch:"):
        return True
    if kind in ("scalar", "list", "tuple"):
        return False
    return _is_mapping_like(obj) or (callable(getattr(obj, "to_dict", None)) and not isinstance(obj, type))


def _structured(seq: list[Any] | tuple[Any, ...], depth: int = 0) -> bool:
    """A list walked item by item: it holds dicts, arrays, batches or records, or lists of them
    (a list of token lists is one value)."""
    return any(_is_container(item) or (depth < 4 and isinstance(item, (list, tuple)) and _structured(item, depth + 1))
               for item in seq)


#: The plain values (``"scalar"`` to :func:`kind_of`).
_SCALARS = (int, float, str, bytes, bool, type(None))
#: Functions, classes, methods and partials (``"callable"`` to :func:`kind_of`).
_CALLABLES = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial)


def kind_of(obj: Any) -> str:
    """The one type dispatch of the structural walks: what ``obj`` is, for this engine
    (:func:`leaves`, :func:`compare_batches`) and for the request digest
    (:mod:`rollout_mock.wrap.matching`), which both walk the containers' :func:`node_fields`.

    The first that applies, in this order: ``"list"``/``"tuple"`` (exactly), ``"scalar"`` (an
    int, float, str, bytes, bool or ``None``, subclasses too), ``"tensor"``, ``"ndarray"``,
    ``"object_array"``, ``"numpy_scalar"``, ``"enum"``, ``"list"``/``"tuple"`` (a subclass),
    ``"batch:<name>"`` (a registered batch type with named parts, :func:`batch_parts`; not the
    built-in ``mapping`` type), ``"mapping"`` (a :class:`~collections.abc.Mapping`), ``"set"``,
    ``"dataclass"``, ``"namespace"`` (a ``SimpleNamespace`` or an argparse ``Namespace``),
    ``"callable"`` (a function, class, method or partial), else ``"object"``. No user code runs
    (an object's ``keys()`` or ``to_dict()`` is left to the walk that reads it: :func:`_engine_kind`)."""
    cls = type(obj)
    if cls is list or cls is tuple:
        return cls.__name__
    if isinstance(obj, _SCALARS):
        return "scalar"
    if isinstance(obj, torch.Tensor):
        return "tensor"
    if isinstance(obj, np.ndarray):
        return "object_array" if obj.dtype == object else "ndarray"
    if isinstance(obj, np.generic):
        return "numpy_scalar"
    if isinstance(obj, enum.Enum):
        return "enum"
    if isinstance(obj, list):
        return "list"
    if isinstance(obj, tuple):
        return "tuple"
    kind = batch_type_of(obj)
    if kind is not None and kind.name != "mapping" and (kind.parts is not None or kind.columns is not None):
        return f"batch:{kind.name}"  # (it has parts: batch_parts gives them)
    if isinstance(obj, Mapping):
        return "mapping"
    if isinstance(obj, set | frozenset):
        return "set"
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return "dataclass"
    if isinstance(obj, types.SimpleNamespace) or cls.__name__ == "Namespace":
        return "namespace"
    if callable(obj) and isinstance(obj, _CALLABLES):
        return "callable"
    return "object"


def node_fields(obj: Any, kind: str) -> Mapping[Any, Any]:
    """The named fields of a container of ``kind`` (:func:`kind_of`), under their own keys: a
    batch's parts, a mapping itself, a dataclass's fields (``None`` for one not set), a
    namespace's attributes; and, for this engine's ``"keyed"`` and ``"record"`` objects, a key
    proxy's items (keys in text order) and a record's ``to_dict()``."""
    if kind.startswith("batch:"):
        return batch_parts(obj) or {}
    if kind == "mapping":
        return obj
    if kind == "dataclass":
        return {f.name: getattr(obj, f.name, None) for f in dataclasses.fields(obj)}
    if kind == "namespace":
        return dict(vars(obj))
    if kind == "keyed":
        return {k: obj[k] for k in sorted(obj.keys(), key=str)}  # keys() may be a set
    if kind == "record":
        return _record(obj) or {}
    raise TypeError(f"a {kind} has no named fields")


#: How this engine walks the kinds of :func:`kind_of` that it does not look into further.
_ENGINE_KINDS = {"mapping": "mapping", "dataclass": "dataclass", "tensor": "tensor", "ndarray": "ndarray",
                 "object_array": "object_array"}


def _engine_kind(obj: Any, kind: str) -> str:
    """How this engine walks a value of :func:`kind_of` ``kind``: ``batch:<name>``, ``mapping``
    (a mapping, or an object with ``keys()`` and ``[key]`` that lists its keys: ``keyed``),
    ``dataclass``, ``record`` (an object whose ``to_dict()`` returns a mapping; a namespace
    too), ``sequence`` (a list of containers, item by item), ``tensor``, ``ndarray``,
    ``object_array``, else ``value`` (a leaf)."""
    if kind.startswith("batch:"):
        return kind
    if kind == "list" or kind == "tuple":
        return "sequence" if _structured(obj) else "value"
    if kind == "object" and _is_mapping_like(obj) and _keys_readable(obj):
        return "keyed"
    if kind == "object" or kind == "namespace":
        return "record" if _record(obj) is not None else "value"
    return _ENGINE_KINDS.get(kind, "value")


def _node_kind(obj: Any) -> str:
    kind = _engine_kind(obj, kind_of(obj))
    return "mapping" if kind == "keyed" else kind


def _children(obj: Any) -> dict[str, Any]:
    kind = kind_of(obj)
    walked = _engine_kind(obj, kind)
    if walked == "sequence":
        return {f"[{i}]": v for i, v in enumerate(obj)}
    if walked == "value":
        raise TypeError(walked)
    return {str(k): v for k, v in node_fields(obj, walked if walked in ("keyed", "record") else kind).items()}


def _join(prefix: str, key: str) -> str:
    if not prefix:
        return key
    return prefix + key if key.startswith("[") else f"{prefix}.{key}"


def _same_value(x: Any, y: Any) -> bool:
    """Exact equality of arbitrary values: types must match, floats by bit pattern, arrays bitwise."""
    if type(x) is not type(y):
        return False
    if isinstance(x, float):
        return struct.pack("<d", x) == struct.pack("<d", y)
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return _compare_arrays("", x, y, 0.0, 0.0) is None
    if isinstance(x, np.generic):
        return x.dtype == y.dtype and x.tobytes() == y.tobytes()
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_same_value(i, j) for i, j in zip(x, y))
    if isinstance(x, Mapping):
        return x.keys() == y.keys() and all(_same_value(x[k], y[k]) for k in x)
    if x is None:
        return True
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


def same_value(x: Any, y: Any) -> bool:
    """Exact equality of two values as the engine compares them: same type, floats by bit
    pattern, arrays bitwise, containers item by item."""
    return _same_value(x, y)


#: Depth past which :func:`leaves` takes a value as a leaf (a self-referencing structure ends).
MAX_DEPTH = 32


def leaves(obj: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf of ``obj`` (a tensor, an array, a value) with its path, by the walk of
    :func:`compare_batches`; the items of a list of containers share one component, ``"[]"``
    (so that one key gathers a list's items: check mode's per-key scores)."""
    yield from _leaves(obj, path, 0)


def _leaves(obj: Any, path: tuple[str, ...], depth: int) -> Iterator[tuple[tuple[str, ...], Any]]:
    kind = _node_kind(obj) if depth <= MAX_DEPTH else "value"
    if kind in ("tensor", "ndarray", "object_array", "value"):
        yield path, obj
    elif kind == "sequence":
        for item in obj:
            yield from _leaves(item, (*path, "[]"), depth + 1)
    else:
        for name, child in _children(obj).items():
            if child is not None or not kind.startswith("batch:"):  # a batch's absent part is no key
                yield from _leaves(child, (*path, name), depth + 1)


def _dtype_name(x: torch.Tensor | np.ndarray) -> str:
    if isinstance(x, torch.Tensor):
        return str(x.dtype).removeprefix("torch.")
    return x.dtype.name if x.dtype != object else "object"


def _raw_bytes(x: torch.Tensor | np.ndarray) -> np.ndarray | None:
    """``(numel, itemsize)`` uint8 view of the values in C order, or ``None`` if not possible."""
    if isinstance(x, torch.Tensor):
        buffer = None if x.is_quantized or x.device.type == "meta" else _host_buffer(x)
        return None if buffer is None else buffer.reshape(-1).view(np.uint8).reshape(x.numel(), x.element_size())
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
            # only tensors get here (arrays always have raw bytes)
            if same_dtype and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b):
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
            if same_dtype and (atol > 0 or rtol > 0) and bool(np.all(within_tolerance_array(va, vb, rtol, atol))):
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


#: Metadata keys that only say when or how long: ``--ignore-timing`` skips them (any depth).
_TIMING_WORDS = ("time", "timing", "timestamp", "duration", "elapsed", "seconds", "latency")


def is_timing_key(name: str) -> bool:
    """Whether a metadata key names a time or a duration (``get_batch_return_start_time``,
    ``timing``, ``time/rollout``...)."""
    lowered = name.lower()
    return any(word in lowered for word in _TIMING_WORDS)


def _ignored(key: str, ignore_meta: frozenset[str], ignore_timing: bool) -> bool:
    parts = key.split(".")
    metas = meta_part_names()  # a batch type's metadata part (BatchType.meta_key)
    at = next((i for i, part in enumerate(parts) if part in metas), None)
    if at is None:
        return False
    below = parts[at + 1:]
    if not below:
        return False
    if ".".join(below) in ignore_meta or below[0] in ignore_meta:
        return True
    return ignore_timing and any(is_timing_key(p) for p in below)


def _walk(prefix: str, a: Any, b: Any, atol: float, rtol: float, out: list[KeyDiff], counter: list[int],
          ignore: tuple[frozenset[str], bool] = (frozenset(), False)) -> None:
    if (ignore[0] or ignore[1]) and _ignored(prefix, *ignore):
        return
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
            close = (atol > 0 or rtol > 0) and type(a) is type(b) and isinstance(a, (float, np.floating)) \
                and within_tolerance(float(a), float(b), rtol, atol)
            out.append(KeyDiff(key=key, status="close" if close else "different", kind="value", a=_short(a),
                               b=_short(b), first_index=_first_seq_difference(a, b), note=note,
                               max_abs_diff=abs(float(a) - float(b)) if close else None))
        return
    if type(a) is not type(b):
        # Same structure kind, different classes (e.g. dict vs OrderedDict): note it, go on.
        out.append(KeyDiff(key=key, status="different", kind="type", a=type(a).__name__,
                           b=type(b).__name__, note="container types differ"))
    ca, cb = _children(a), _children(b)
    for name in list(ca) + [k for k in cb if k not in ca]:
        child = _join(prefix, name)
        if (ignore[0] or ignore[1]) and _ignored(child, *ignore):
            continue
        if name not in cb:
            counter[0] += 1
            out.append(KeyDiff(key=child, status="only_in_a", kind=_leaf_kind(ca[name]), a=_short(ca[name])))
        elif name not in ca:
            counter[0] += 1
            out.append(KeyDiff(key=child, status="only_in_b", kind=_leaf_kind(cb[name]), b=_short(cb[name])))
        else:
            _walk(child, ca[name], cb[name], atol, rtol, out, counter, ignore)


def _leaf_kind(value: Any) -> str:
    kind = _node_kind(value)
    return kind if kind in ("tensor", "ndarray", "object_array") else "value"


def compare_batches(
    a: Any, b: Any, *, atol: float = 0.0, rtol: float = 0.0,
    ignore_meta: tuple[str, ...] | list[str] | frozenset[str] = (), ignore_timing: bool = False,
) -> tuple[list[KeyDiff], int]:
    """Compare two batches; return the non-identical keys and the number of keys compared.

    Batches are walked through their parts (:func:`rollout_mock.batch.batch_parts`); other
    mapping-like containers (dicts, proxies with ``keys()``) key by key via ``keys()`` and ``[key]``
    only. ``ignore_meta``: keys of a batch's metadata part (``BatchType.meta_key``), or dotted
    paths below it, left out; ``ignore_timing``: also every metadata key naming a time or duration."""
    out: list[KeyDiff] = []
    counter = [0]
    _walk("", a, b, atol, rtol, out, counter, (frozenset(ignore_meta), ignore_timing))
    return out, counter[0]


# --------------------------------------------------------------------------- the request record
def compile_patterns(patterns: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """Dotted patterns (``meta_info.*_time``) as tuples of components (for :func:`matches_pattern`)."""
    return tuple(tuple(p.strip(".").split(".")) for p in patterns if p.strip("."))


def matches_pattern(path: tuple[str, ...], patterns: tuple[tuple[str, ...], ...]) -> bool:
    """Whether the end of ``path`` matches one of ``patterns`` (``*`` matches one component)."""
    for pattern in patterns:
        if len(pattern) <= len(path) and all(
            w == p or fnmatch.fnmatchcase(p, w) for p, w in zip(path[len(path) - len(pattern):], pattern)
        ):
            return True
    return False


class Recorded(NamedTuple):
    """A request's ``digest``; the ``nodes`` it can keep, breadth first, as ``(depth, dotted path,
    CRC, summary)``; ``skipped``: fields never offered (past ``node_depth``, a big flat mapping's)."""

    digest: int
    nodes: list[tuple[int, str, int, dict[str, Any]]]
    skipped: int


def record_request(arguments: Mapping[str, Any], *, volatile: Sequence[str] = (), forced: Collection[str] = (),
                   node_depth: int, max_nodes: int) -> Recorded:
    """The record of a call's named ``arguments`` (see the module docstring). ``volatile``: dotted
    patterns of fields left out (the caller's framework's); ``forced``: paths offered as nodes at any
    depth (``match_on``); ``max_nodes``: the nodes a big flat mapping offers at most."""
    return _RequestFold(compile_patterns(volatile), frozenset(forced), node_depth, max_nodes).run(arguments)


#: Blocks a list is digested in (its items, or a tensor's rows, when there are at least
#: 2 * BLOCKS of them); the CRCs of their prefixes locate a difference.
BLOCKS = 8
#: Leading values kept per tensor, array and list; all of them up to SMALL values.
HEAD = 4
SMALL = 64
#: Lists of lists (or tuples) at most this long on average are digested one level flatter.
FLATTEN = 64
#: Deeper values are digested by type name only (a self-referencing structure terminates).
FOLD_DEPTH = 64
_STR_SHOWN = 48
#: A kept list of containers (an object column: chat messages, ``extra_info`` dicts, AReaL's
#: prompt dicts) keeps the CRC of each of its first :data:`ROW_CRCS` rows (``"rc"``: the first
#: differing row is named) and a short text of its first :data:`ROWS_SHOWN` rows (``"rv"``: a dict
#: row key by key, so the first differing key is named with both values).
ROWS_SHOWN = 2
#: Rows whose CRCs are kept (past them, the block prefix CRCs locate a difference).
ROW_CRCS = 16
_ROW_CHARS = 240
_ROW_KEYS = 8
_ROW_REPR = reprlib.Repr()
_ROW_REPR.maxstring, _ROW_REPR.maxother, _ROW_REPR.maxlevel, _ROW_REPR.maxlist, _ROW_REPR.maxdict = 400, 120, 4, 8, 12
_ROW_REPR.maxtuple = 8
#: Exactly these types (not subclasses: an IntEnum packs otherwise) go through msgpack in one call.
_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})
#: Lists of exactly these types are tried as one int64, else float64, array.
_NUMBERS = frozenset({int, float})
#: What converting a tensor to a host buffer raises (GPU, bfloat16, requires_grad, conj...) and
#: what a CRC of a non-contiguous array raises.
_BUFFER_ERRORS = (TypeError, RuntimeError, ValueError, BufferError)
_DTYPE = operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")


#: A CRC as 4 little-endian bytes.
_u32 = struct.Struct("<I").pack


def block_bounds(rows: int) -> list[int]:
    """Ends of the row blocks whose prefix CRCs are kept (``[]`` below ``2 * BLOCKS`` rows)."""
    return [] if rows < 2 * BLOCKS else [-(-rows * (i + 1) // BLOCKS) for i in range(BLOCKS)]


def _scalar_bytes(value: Any) -> bytes:
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"B1" if value else b"B0"
    if isinstance(value, int):
        return b"I" + int(value).to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
    if isinstance(value, float):
        return b"Fnan" if value != value else b"F" + struct.pack("<d", value)
    if isinstance(value, str):
        return b"S" + value.encode("utf-8", "surrogatepass")
    return b"Y" + bytes(value)


def _scalar_info(value: Any) -> dict[str, Any]:
    if isinstance(value, str | bytes):
        return {"k": type(value).__name__, "len": len(value), "v": value[:_STR_SHOWN] if isinstance(value, str) else ""}
    if isinstance(value, float):
        return {"k": "float", "v": json_float(value)}
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return {"k": "int", "v": f"<int of {value.bit_length()} bits>"}
    return {"k": type(value).__name__.lower().replace("nonetype", "none"), "v": value}


def _head(values: Any, n: int) -> list[Any]:
    return [json_float(item) if isinstance(item, float) else _head_int(item) if isinstance(item, int | bool)
            else _str_of(item)[:16] for item in values[: SMALL if n <= SMALL else HEAD]]


def _head_int(value: int) -> int | str:
    """An int of a kept head (JSON in the index: past int64, its size, never its 5,000 digits)."""
    return value if isinstance(value, bool) or -(2**63) <= value < 2**64 else f"<int of {value.bit_length()} bits>"


def _str_of(value: Any) -> str:
    """``str(value)``, or ``<TypeName>`` when its ``__str__`` raises (or is past the int-string limit)."""
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a user's __str__
        return f"<{type(value).__qualname__}>"


#: (path, type name) of unreadable values already logged (one line each, per process).
_WARNED_UNREADABLE: set[tuple[str, str]] = set()
#: fnmatch's special characters (a pattern without them is an exact name).
_MAGIC = re.compile(r"[*?\[]")


def _row_text(value: Any) -> str:
    """A row's value as bounded text (a string as itself)."""
    if isinstance(value, str):
        return value[:_ROW_CHARS]
    try:
        text = _ROW_REPR.repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__: the type names it
        text = f"<{type(value).__qualname__}>"
    return text[:_ROW_CHARS]


def _numbers(items: Sequence[Any], first: type) -> tuple[bytes, array.array[Any]] | None:
    """``items`` (the first of type ``first``) as one array and its tag: of uint64 (the fastest),
    else int64, else float64; ``None`` when not all are numbers or an int is beyond int64."""
    if first is int:
        try:
            return b"Q", array.array("Q", items)
        except OverflowError:  # a negative int (or one beyond uint64)
            try:
                return b"q", array.array("q", items)
            except OverflowError:
                return None
            except TypeError:
                pass
        except TypeError:  # a float (or no number) among them
            pass
    try:
        return b"d", array.array("d", items)
    except (TypeError, ValueError, OverflowError):
        return None


def _number_lists(lists: Sequence[Sequence[Any]], crc: int) -> int | None:
    """The CRC of lists of numbers, each as one array (:func:`_numbers`), continuing ``crc``;
    ``None`` when one of them is not all numbers."""
    codes = bytearray()
    for values in lists:
        if values:
            packed = _numbers(values, first) if (first := type(values[0])) in _NUMBERS else None
            if packed is None:
                return None
            codes += packed[0]
            crc = crc32(packed[1], crc)
    return crc32(codes, crc)


def _sorted_keys(obj: Mapping[Any, Any]) -> list[Any]:
    try:
        return sorted(obj.keys())
    except TypeError:  # keys of several types
        return sorted(obj.keys(), key=lambda k: (type(k).__name__, str(k)))


def _host_buffer(tensor: torch.Tensor) -> np.ndarray[Any, Any] | None:
    """A C-contiguous host array holding ``tensor``'s bytes (its own memory where it can:
    a contiguous CPU tensor is not copied), or ``None`` for a meta, sparse or nested tensor."""
    try:
        buffer = tensor.numpy()
        if buffer.flags.c_contiguous:
            return buffer
    except _BUFFER_ERRORS:
        pass
    if tensor.is_nested or tensor.layout != torch.strided or tensor.device.type == "meta":
        return None
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.resolve_conj().resolve_neg().contiguous()
    try:
        return tensor.numpy()
    except TypeError:  # bfloat16, float8...: their bytes
        return tensor.reshape(-1).view(torch.uint8).numpy()


def _tensor_head(tensor: torch.Tensor) -> list[Any]:
    """The first :data:`SMALL` values of ``tensor`` in row-major order, copying only the rows
    that hold them."""
    flat = tensor.detach()
    if flat.dim() and not flat.is_contiguous():
        per_row = max(flat[0].numel(), 1)
        flat = flat[: -(-SMALL // per_row)]
    return list(flat.reshape(-1)[:SMALL].tolist())


def _tensor_chain(tensors: Sequence[torch.Tensor], crc: int) -> int | None:
    """The CRC of a block of tensors: their dtypes and shapes in one msgpack call, then each one's
    bytes' CRC (C-level maps, no copy where none is needed); ``None`` for a meta, sparse or nested one."""
    try:
        buffers = list(map(torch.Tensor.numpy, tensors))
        crcs = array.array("I", map(crc32, buffers))
        shapes = list(map(_SHAPE, buffers))
    except _BUFFER_ERRORS:  # on a GPU, bfloat16, requires_grad, not contiguous...: one by one
        crcs = array.array("I")
        for tensor in tensors:
            buffer = _host_buffer(tensor)
            if buffer is None:
                return None
            crcs.append(crc32(buffer))
        shapes = [tuple(tensor.shape) for tensor in tensors]
    dtypes = set(map(_DTYPE, tensors))
    names = [str(d) for d in dtypes] if len(dtypes) == 1 else [str(d) for d in map(_DTYPE, tensors)]
    return crc32(crcs, crc32(msgpack.packb([names, shapes]), crc32(b"t", crc)))


def _array_chain(arrays: Sequence[np.ndarray[Any, Any]], crc: int) -> int | None:
    """As :func:`_tensor_chain`, for numpy arrays (``None`` for an object array among them)."""
    dtypes = set(map(_DTYPE, arrays))
    if any(d.hasobject for d in dtypes):
        return None
    try:
        crcs = array.array("I", map(crc32, map(np.ascontiguousarray, arrays)))
    except _BUFFER_ERRORS:  # a dtype without a plain buffer: one by one
        return None
    meta = [[d.str for d in map(_DTYPE, arrays)], list(map(_SHAPE, arrays))]
    return crc32(crcs, crc32(msgpack.packb(meta), crc32(b"a", crc)))


def _block_crcs(buffer: Any, rows: int, crc: int) -> tuple[int, list[int]]:
    """The CRC of a contiguous ``buffer`` (``rows`` rows of equal size) continuing ``crc``, and
    the CRCs of its :func:`block_bounds` prefixes (``[]`` when there are no blocks)."""
    bounds = block_bounds(rows)
    if not bounds:
        return crc32(buffer, crc), []
    view = np.frombuffer(buffer, dtype=np.uint8)
    if view.size % rows:
        return crc32(view, crc), []
    size = view.size // rows
    prefixes, start = [], 0
    for end in bounds:
        crc = crc32(view[start * size:end * size], crc)
        prefixes.append(crc)
        start = end
    return crc, prefixes


class _RequestFold:
    """The request record's fold over one value's traversal (see :func:`record_request`)."""

    def __init__(self, ignore: tuple[tuple[str, ...], ...], forced: frozenset[str], node_depth: int,
                 max_nodes: int) -> None:
        self.ignore = ignore
        self.node_depth, self.max_nodes = node_depth, max_nodes
        #: which names can end a volatile path (a pattern's last component), memoised per name
        self._last = [p[-1] for p in ignore]
        self._may_end: dict[str, bool] = {}
        self._flat_keys: dict[tuple[tuple[Any, ...], tuple[str, ...] | None], bool] = {}
        self.forced = forced
        self.candidates: list[tuple[int, int, str, int, dict[str, Any]]] = []
        #: fields never considered as nodes (past ``node_depth``, past a big flat mapping's first ones)
        self.skipped = 0
        #: the volatile fields' names as bytes (``None`` when a pattern's name is a wildcard):
        #: a packed row that holds none of them holds no volatile field
        self._row_names = None if any(any(c in p[-1] for c in "*?[") for p in ignore) else \
            tuple(p[-1].encode("utf-8", "surrogatepass") for p in ignore)
        self._last_exact = frozenset(w for w in self._last if not _MAGIC.search(w))
        magic = [w for w in self._last if _MAGIC.search(w)]
        self._last_rx = re.compile("|".join(map(fnmatch.translate, magic))) if magic else None
        # a text every key matching a pattern holds (its longest run without wildcards)
        self._literals = [max(re.split(r"[*?]|\[[^]]*\]", w), key=len) for w in magic]

    def run(self, arguments: Mapping[str, Any]) -> Recorded:
        total = 0
        for name in sorted(arguments):
            digest = self.value(arguments[name], (name,), 1)
            total = crc32(_u32(digest), crc32(name.encode("utf-8", "surrogatepass"), total))
        self.candidates.sort(key=lambda c: (c[0], c[1]))
        return Recorded(total, [(depth, path, digest, info) for depth, _, path, digest, info in self.candidates],
                        self.skipped)

    def _forced_below(self, path: tuple[str, ...] | None) -> bool:
        """Whether a ``match_on`` path names a field inside the value at ``path``."""
        if not self.forced or path is None:
            return False
        prefix = ".".join(path) + "."
        return any(p.startswith(prefix) for p in self.forced)

    def _is_node(self, path: tuple[str, ...], depth: int) -> bool:
        """Whether the value at ``path`` (on an argument's path, not inside a list) is kept."""
        return depth <= self.node_depth or (bool(self.forced) and ".".join(path) in self.forced)

    def may_end(self, name: str) -> bool:
        """Whether ``name`` matches the last component of a volatile pattern (memoised)."""
        if (found := self._may_end.get(name)) is None:
            found = self._may_end[name] = any(w == name or fnmatch.fnmatchcase(name, w) for w in self._last)
        return found

    def _ignored(self, path: tuple[str, ...]) -> bool:
        return bool(self.ignore) and self.may_end(path[-1]) and matches_pattern(path, self.ignore)

    def _unreadable(self, obj: Any, path: tuple[str, ...] | None, exc: Exception) -> tuple[int, dict[str, Any]]:
        """The digest of a value that raised while being read (a ``__getitem__`` that lies, a
        ``__str__`` that raises, a mapping without items): its type's name, said once per path."""
        name = type(obj).__qualname__
        where = "a mapping key" if path is None else ".".join(path)
        if (where, name) not in _WARNED_UNREADABLE and len(_WARNED_UNREADABLE) < 1024:
            _WARNED_UNREADABLE.add((where, name))
            logger.warning("[RolloutMock] request matching: %s (a %s) cannot be read (%s: %s); it is compared "
                           "by its type only", where[:200], name[:80], type(exc).__name__, _str_of(exc)[:200])
        return crc32(b"?!" + name.encode("utf-8", "surrogatepass")), {"k": "object", "t": name, "unreadable": True}

    def _volatile_keys(self, keys: tuple[Any, ...]) -> list[Any]:
        """The keys among ``keys`` that may end a volatile pattern, found in C-level passes (a
        set intersection, one regular expression), not one ``fnmatch`` per key and pattern."""
        if not self._last:
            return []
        found = list(self._last_exact.intersection(keys))
        if self._last_rx is not None:
            if len(keys) > 64 and all(self._literals):  # substring searches over all keys at once
                joined = "\x00".join(keys)
                if not any(literal in joined for literal in self._literals):
                    return found
            found += [k for k in filter(self._last_rx.fullmatch, keys) if k not in self._last_exact]
        return found

    # ------------------------------------------------------------------ values
    def value(self, obj: Any, path: tuple[str, ...] | None, depth: int, keep: bool = True) -> int:
        """The CRC of ``obj`` at ``path`` (``None``: where no volatile field can be, e.g. a mapping
        key); ``keep``: on an argument's path (not inside a list), where nodes are kept."""
        node = keep and path is not None and self._is_node(path, depth)
        info: dict[str, Any] | None = None
        cls = type(obj)
        try:  # zero cost unless raised (3.11): a user object that cannot be read is digested by its type
            if (cls is list or cls is tuple) and depth <= FOLD_DEPTH:  # the commonest inside lists: first
                digest, info = self._sequence(obj, path, depth, node)
            elif isinstance(obj, _SCALARS):  # (kind_of's "scalar")
                digest, info = crc32(_scalar_bytes(obj)), (_scalar_info(obj) if node else None)
            elif depth > FOLD_DEPTH:
                digest, info = crc32(b"?deep"), {"k": "object", "t": "too deep"}
            elif isinstance(obj, Mapping):
                # every mapping by its items, a batch type that is one too (a TensorDict, a slime
                # record): no batch type is asked about a mapping
                digest, info = self._mapping(b"D", node_fields(obj, "mapping"), path, depth, keep)
            elif (kind := kind_of(obj)) == "tensor":
                digest, info = self._tensor(obj, node)
            elif kind == "ndarray" or kind == "object_array":
                digest, info = self._array(obj, path, depth, node)
            elif kind == "numpy_scalar":
                return self.value(obj.item(), path, depth, keep)
            elif kind == "enum":
                digest, info = self.value(obj.value, None, depth + 1), {"k": "enum", "v": str(obj)[:_STR_SHOWN]}
            elif kind == "list" or kind == "tuple":
                digest, info = self._sequence(obj, path, depth, node)
            elif kind.startswith("batch:"):
                # a registered batch type (a DataProto...): its named parts, as the batch model gives
                # them, under the type's name (and batch size, where it has one)
                name = kind[6:]
                sizes = [int(s) for s in getattr(obj, "batch_size", ())] if hasattr(obj, "batch_size") else []
                digest, info = self._mapping(b"B" + name.encode() + str(sizes).encode(), node_fields(obj, kind), path,
                                             depth, keep)
                info = {"k": name, "t": type(obj).__qualname__, "keys": info.get("keys", []),
                        **({"batch_size": sizes} if sizes else {})}
            elif kind == "set":
                items = sorted(self.value(x, None, depth + 1) for x in obj)
                digest, info = crc32(b"".join(map(_u32, items)), crc32(b"Z")), {"k": "set", "len": len(obj)}
            elif kind == "dataclass":
                tag = b"C" + type(obj).__qualname__.encode()
                digest, info = self._mapping(tag, node_fields(obj, kind), path, depth, keep)
                info["k"], info["t"] = "dataclass", type(obj).__qualname__
            elif kind == "namespace":
                digest, info = self._mapping(b"NS", node_fields(obj, kind), path, depth, keep)
            elif kind == "callable":
                target = obj.func if isinstance(obj, functools.partial) else obj
                name = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__name__)}"
                digest, info = crc32(b"Q" + name.encode("utf-8", "surrogatepass")), {"k": "callable", "v": name[-80:]}
            else:  # any other object (a key proxy, a record too): by its type's name, not compared
                name = type(obj).__qualname__
                digest, info = crc32(b"?" + name.encode()), {"k": "object", "t": name}
        except Exception as exc:  # noqa: BLE001 - any error of a user's object: never the training call's
            digest, info = self._unreadable(obj, path, exc)
        if node and path is not None and info is not None:
            self.candidates.append((depth, len(self.candidates), ".".join(path), digest, info))
        return digest

    def _row_crcs(self, rows: Sequence[Any], item_path: tuple[str, ...] | None, depth: int) -> list[int]:
        """The CRC of each row (only compared with the same node's rows in another request): one
        msgpack call per row where no volatile field can be inside it (no volatile name among its
        bytes), else the row's digest."""
        if self._row_names is not None:
            try:
                packed = [msgpack.packb(row) for row in rows]
            except (TypeError, OverflowError, ValueError):  # not plain data: row by row below
                packed = []
            if packed and not any(name in row for row in packed for name in self._row_names):
                return [crc32(row) for row in packed]
        return [self.value(row, item_path, depth, False) for row in rows]

    def _row_info(self, value: Any, item_path: tuple[str, ...] | None) -> Any:
        """What a kept row shows: a dict key by key (:data:`_ROW_KEYS` keys, volatile ones left
        out), else its text."""
        if not isinstance(value, Mapping):
            return _row_text(value)
        keys = [k for k in _sorted_keys(value)
                if item_path is None or not self._ignored((*item_path, str(k)))][:_ROW_KEYS]
        return {str(k)[:40]: _row_text(value[k])[:_ROW_CHARS // 2] for k in keys}

    def _flat_items(self, obj: Any, path: tuple[str, ...] | None) -> list[tuple[str, Any]] | None:
        """The sorted items of a dict of plain scalars under string keys (digested in one
        msgpack call), or ``None`` (another mapping, a volatile or step key among its keys)."""
        if type(obj) is not dict or not _PLAIN.issuperset(map(type, obj.values())):
            return None
        keys = tuple(obj)
        flat = self._flat_keys.get((keys, path))
        if flat is None:  # once per key set and place: dicts of one column share their keys
            step_in_meta = path is not None and path[-1] in meta_part_names() and not set(step_names()).isdisjoint(keys)
            flat = set(map(type, keys)) <= {str} and not step_in_meta and not (
                path is not None and any(self._ignored((*path, k)) for k in self._volatile_keys(keys)))
            self._flat_keys[(keys, path)] = flat
        return sorted(obj.items()) if flat else None

    def _mapping(self, tag: bytes, obj: Mapping[Any, Any], path: tuple[str, ...] | None,
                 depth: int, keep: bool) -> tuple[int, dict[str, Any]]:
        """The CRC of a mapping (items in key order, volatile keys and the step keys of a batch's
        metadata part left out); kept mappings also keep their fields as nodes."""
        flat = self._flat_items(obj, path)
        crc = crc32(tag)
        if flat is not None:
            try:
                crc = crc32(msgpack.packb(flat), crc32(b"f", crc))
            except (OverflowError, ValueError):  # an int beyond 64 bits: field by field
                flat = None
        # the fields are kept where one of them can be a node
        if keep and path is not None and depth >= self.node_depth and not self.forced and obj:
            self.skipped += len(obj)  # fields past the depth kept: counted as dropped
        keep = keep and path is not None and (depth < self.node_depth or bool(self.forced))
        if flat is not None and not keep:
            return crc, {}
        meta_part = path is not None and path[-1] in meta_part_names()
        if flat is not None and len(flat) > self.max_nodes and not self._forced_below(path):
            # a big plain mapping: digested in one msgpack call above; only its first fields can
            # be kept as nodes (``max_nodes`` at most), so only they are walked
            self.skipped += len(flat) - self.max_nodes
            for key, item in flat[:self.max_nodes]:
                self.value(item, None if path is None else (*path, key), depth + 1, keep)
            return crc, {"k": "dict", "len": len(flat), "keys": [key[:40] for key, _ in flat[:12]]}
        keys = _sorted_keys(obj)
        shown: list[str] = []
        for key in keys:
            text = str(key)
            child = None if path is None else (*path, text)
            if (meta_part and text in step_names()) or (child is not None and self._ignored(child)):
                continue
            if len(shown) < 12:
                shown.append(text[:40])
            digest = self.value(obj[key], child, depth + 1, keep)
            if flat is None:
                key_crc = crc32(text.encode("utf-8", "surrogatepass")) if isinstance(key, str) \
                    else self.value(key, None, depth + 1)
                crc = crc32(_u32(digest), crc32(_u32(key_crc), crc))
        return crc, {"k": "dict", "len": len(keys), "keys": shown}

    def _sequence(self, obj: Sequence[Any], path: tuple[str, ...] | None, depth: int,
                  node: bool) -> tuple[int, dict[str, Any]]:
        """The CRC of a list or tuple: its length, then a list of numbers as one array, else its
        items block by block (:meth:`_items`); a kept one also gets its first values and the
        CRCs of its block prefixes."""
        n = len(obj)
        is_list = isinstance(obj, list)
        head = (b"L%d" if is_list else b"U%d") % n
        prefixes: list[int] = []
        first = type(obj[0]) if n else None
        packed = _numbers(obj, first) if first in _NUMBERS else None
        if packed is not None:
            code, values = packed
            crc = crc32(head + code)
            if node:
                crc, prefixes = _block_crcs(values, n, crc)
            else:
                crc = crc32(values, crc)
        else:
            crc = crc32(head)
            item_path = None if path is None else (*path, "[]")
            start = 0
            for end in block_bounds(n) or [n]:
                crc = self._items(obj[start:end], item_path, depth + 1, crc)
                prefixes.append(crc)
                start = end
        if not node:
            return crc, {}
        info: dict[str, Any] = {"k": "list" if is_list else "tuple", "len": n}
        shown = obj[: SMALL if n <= SMALL else HEAD]
        if n and all(isinstance(item, _SCALARS) for item in shown):
            info["head"] = _head(shown, n)
        elif n and depth < FOLD_DEPTH:  # rows of containers: their CRCs and the first ones' values
            item_path = None if path is None else (*path, "[]")
            info["rc"] = self._row_crcs(obj[:ROW_CRCS], item_path, depth + 1)
            info["rv"] = [self._row_info(item, item_path) for item in obj[:ROWS_SHOWN]]
        if len(prefixes) > 1:
            info["b"] = prefixes
        return crc, info

    def _items(self, items: Sequence[Any], item_path: tuple[str, ...] | None, depth: int, crc: int) -> int:
        """The CRC of a block of list items at ``depth`` (or of one dict key's values, a column),
        continuing ``crc``: in one or two C calls where the items allow it (see the module
        docstring), else item by item."""
        if not items:
            return crc
        first = type(items[0])
        if first in _NUMBERS and (packed := _numbers(items, first)) is not None:
            return crc32(packed[1], crc32(packed[0], crc))
        kinds = set(map(type, items))
        if kinds <= _PLAIN:
            try:
                return crc32(msgpack.packb(items), crc32(b"m", crc))
            except (OverflowError, ValueError):  # an int beyond 64 bits, a lone surrogate: one by one
                pass
        if len(kinds) == 1 and depth <= FOLD_DEPTH and (found := self._uniform(first, items, item_path, depth,
                                                                                crc)) is not None:
            return found
        for item in items:
            crc = crc32(_u32(self.value(item, item_path, depth, False)), crc)
        return crc

    def _uniform(self, kind: type, items: Sequence[Any], item_path: tuple[str, ...] | None, depth: int,
                 crc: int) -> int | None:
        """The CRC of a block of items all of type ``kind`` in a few C calls: dicts by column, tensors and
        arrays by their bytes, lists (tuples) by their lengths, then their items one level flatter
        when short (chat messages), else one array each (token ids); ``None`` where none applies."""
        if kind is dict:
            return self._columns(items, item_path, depth, crc)
        if kind is torch.Tensor:
            return _tensor_chain(items, crc)
        if kind is np.ndarray:
            return _array_chain(items, crc)
        if kind is list or kind is tuple:
            lengths = array.array("Q", map(len, items))
            tag = b"l" if kind is list else b"u"
            if sum(lengths) > FLATTEN * len(items):
                return _number_lists(items, crc32(lengths, crc32(tag + b"n", crc)))
            flat = list(itertools.chain.from_iterable(items))
            inner = None if item_path is None else (*item_path, "[]")
            return self._items(flat, inner, depth + 1, crc32(lengths, crc32(tag, crc)))
        return None

    def _columns(self, rows: Sequence[dict[Any, Any]], item_path: tuple[str, ...] | None, depth: int,
                 crc: int) -> int | None:
        """The CRC of a block of dicts sharing one key set, column by column: the sorted keys
        (volatile ones left out), then each key's values as one list (:meth:`_items`).
        ``None`` when the dicts do not share their keys."""
        if set(map(len, rows)) != {len(rows[0])}:
            return None
        keys = _sorted_keys(rows[0])
        if item_path is not None and self.ignore:
            keys = [k for k in keys if not self._ignored((*item_path, str(k)))]
        try:
            columns = [list(map(operator.itemgetter(key), rows)) for key in keys]
        except KeyError:  # the same number of keys, other ones
            return None
        try:
            crc = crc32(msgpack.packb(keys), crc32(b"c", crc))
        except (TypeError, OverflowError, ValueError):  # keys msgpack does not take
            crc = crc32(b"".join(_u32(self.value(k, None, depth + 1)) for k in keys), crc32(b"C", crc))
        for key, column in zip(keys, columns):
            crc = self._items(column, None if item_path is None else (*item_path, str(key)), depth + 1, crc)
        return crc

    def _tensor(self, obj: torch.Tensor, node: bool) -> tuple[int, dict[str, Any]]:
        dtype = str(obj.dtype)
        buffer = _host_buffer(obj)
        if buffer is None:
            shape = [] if obj.is_nested else [int(s) for s in obj.shape]
            info = {"k": "tensor", "dtype": dtype[6:], "shape": shape,
                    "t": f"{obj.layout}/{obj.device.type}: not compared"}
            return crc32(f"T?{dtype}{shape}".encode()), info
        meta = crc32(f"T{dtype}{tuple(obj.shape)}".encode())
        if not node:
            return crc32(_u32(crc32(buffer)), meta), {}
        shape = [int(s) for s in obj.shape]
        numel = obj.numel()
        kept: dict[str, Any] = {"k": "tensor", "dtype": dtype[6:], "shape": shape,
                                "head": _head(_tensor_head(obj), numel)}
        return crc32(_u32(self._bytes(buffer, shape[0] if shape else 1, numel, kept)), meta), kept

    def _array(self, obj: np.ndarray[Any, Any], path: tuple[str, ...] | None, depth: int,
               node: bool) -> tuple[int, dict[str, Any]]:
        shape = [int(s) for s in obj.shape]
        if obj.dtype.hasobject:
            crc, info = self._sequence(obj.reshape(-1).tolist(), path, depth, node)
            if node:
                info.update(k="array", dtype="object", shape=shape)
            return crc32(_u32(crc), crc32(f"O{shape}".encode())), info
        flat = np.ascontiguousarray(obj).reshape(-1)
        meta = crc32(f"A{obj.dtype.str}{shape}".encode())
        if not node:
            return crc32(_u32(crc32(flat)), meta), {}
        info = {"k": "array", "dtype": obj.dtype.str, "shape": shape, "head": _head(flat[:SMALL].tolist(), flat.size)}
        return crc32(_u32(self._bytes(flat, shape[0] if shape else 1, flat.size, info)), meta), info

    @staticmethod
    def _bytes(buffer: Any, rows: int, count: int, info: dict[str, Any]) -> int:
        """CRC of a contiguous buffer of ``count`` values in ``rows`` rows; ``info`` gets the CRCs of
        its block prefixes (``b``) and what a block is made of (``bu``: ``rows``, or ``elements``
        when rows are few)."""
        units, unit = (rows, "rows") if rows >= 2 * BLOCKS or count <= SMALL else (count, "elements")
        crc, prefixes = _block_crcs(buffer, units, 0)
        if len(prefixes) > 1:
            info["b"], info["bu"] = prefixes, unit
        return crc

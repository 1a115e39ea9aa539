"""A value's structure, walked one way: the structural comparison engine.

The engine (:func:`compare_batches`) walks two values side by side, bit for bit or within
tolerances: one :class:`KeyDiff` (path, status, kind, both values' summaries) per key that is not
identical. Batches through their parts (:func:`rollout_mock.batch.batch_parts`), mappings (and
objects with ``keys()`` and ``[key]``) key by key, dataclasses and records (``to_dict()``) field by
field, lists of containers item by item; tensors, numpy arrays (object arrays element by element)
and plain values are leaves. One tolerance rule, :func:`rollout_mock.text.within_tolerance`
(element-wise: :func:`~rollout_mock.text.within_tolerance_array`), as ``verify`` applies it. It
serves ``diff`` (:mod:`rollout_mock.compare.diff`), check mode (:mod:`rollout_mock.wrap.check`
scores the leaves of :func:`leaves` with :func:`same_value`), the explanation of a request
mismatch (:mod:`rollout_mock.wrap.mismatch` walks the recorded and the live request's kept
structure with it) and the rollout-settings pre-flight check (:func:`flatten_settings` records
the settings as dotted keys; :func:`differing_keys` compares two such mappings by
:func:`same_value`).

The request record (:mod:`rollout_mock.codec.request`) folds a value with the same dispatch,
:func:`kind_of`, and the same reading of a container's fields, :func:`node_fields`; both leave
out the volatile fields a caller names (:func:`compile_patterns`, :func:`matches_pattern`). The
module lives below wrap/ (it needs the batch model and numbers).
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import functools
import struct
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rollout_mock.batch import batch_parts, batch_type_of, meta_part_names
from rollout_mock.text import json_float, jsonable, short_repr, within_tolerance, within_tolerance_array

__all__ = [
    "BUFFER_ERRORS", "MAX_SETTINGS", "SCALARS", "KeyDiff", "compare_batches", "compile_patterns", "differing_keys",
    "flatten_settings", "host_buffer", "is_timing_key", "kind_of", "leaves", "matches_pattern", "node_fields",
    "same_value",
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
SCALARS = (int, float, str, bytes, bool, type(None))
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
    if isinstance(obj, SCALARS):
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


#: What converting a tensor to a host buffer raises (GPU, bfloat16, requires_grad, conj...) and
#: what a CRC of a non-contiguous array raises.
BUFFER_ERRORS = (TypeError, RuntimeError, ValueError, BufferError)


def host_buffer(tensor: torch.Tensor) -> np.ndarray[Any, Any] | None:
    """A C-contiguous host array holding ``tensor``'s bytes (its own memory where it can:
    a contiguous CPU tensor is not copied), or ``None`` for a meta, sparse or nested tensor."""
    try:
        buffer = tensor.numpy()
        if buffer.flags.c_contiguous:
            return buffer
    except BUFFER_ERRORS:
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


def _raw_bytes(x: torch.Tensor | np.ndarray) -> np.ndarray | None:
    """``(numel, itemsize)`` uint8 view of the values in C order, or ``None`` if not possible."""
    if isinstance(x, torch.Tensor):
        buffer = None if x.is_quantized or x.device.type == "meta" else host_buffer(x)
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


# --------------------------------------------------------------------------- volatile-field patterns
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


# --------------------------------------------------------------------------- flat mappings (settings)
#: Keys :func:`flatten_settings` keeps (more are cut).
MAX_SETTINGS = 512
#: Nesting :func:`flatten_settings` opens (a deeper mapping is one JSON value).
_FLAT_DEPTH = 8
#: The kinds of :func:`kind_of` that :func:`flatten_settings` opens into dotted keys.
_FLAT_KINDS = frozenset({"mapping", "dataclass", "namespace"})


def flatten_settings(settings: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``settings`` as a flat, JSON-ready, bounded mapping of dotted keys (``None`` stays ``None``):
    mappings, dataclasses and namespaces (read by :func:`node_fields`) are opened, keys in text
    order, 8 levels deep; anything else is one value made JSON-ready
    (:func:`rollout_mock.text.jsonable`), a string cut at 200 characters, a long list at 400. At
    most :data:`MAX_SETTINGS` keys. This is what a dump records as its rollout settings: the
    output is pinned (a change would make every recorded dump differ from its own run)."""
    if settings is None:
        return None
    out: dict[str, Any] = {}
    _flat("", settings, out, 0)
    return out


def _flat(prefix: str, value: Any, out: dict[str, Any], depth: int) -> None:
    if len(out) >= MAX_SETTINGS:
        return
    kind = kind_of(value)
    if kind in _FLAT_KINDS:
        value = node_fields(value, kind)  # (a mapping is itself)
        if depth < _FLAT_DEPTH:
            for key in sorted(value, key=str):
                _flat(f"{prefix}.{key}" if prefix else str(key), value[key], out, depth + 1)
            return
    plain = jsonable(value)
    if isinstance(plain, str) and len(plain) > 200:
        plain = plain[:200] + f"...<{len(plain)} chars>"
    elif isinstance(plain, list) and len(str(plain)) > 400:
        plain = short_repr(plain, 400)
    out[prefix or "value"] = plain


def _same_setting(x: Any, y: Any) -> bool:
    """A setting's equality: numbers by value (``1`` and ``1.0``, ``True`` and ``1``: the same
    sampling, however the config spelled it; NaN equals NaN), anything else by :func:`same_value`."""
    if isinstance(x, int | float) and isinstance(y, int | float):
        return bool(x == y) or (x != x and y != y)
    return _same_value(x, y)


def differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The keys of two flat mappings (:func:`flatten_settings`'s) that one of them lacks or whose
    values differ (numbers by value, anything else by :func:`same_value`), in text order."""
    return [key for key in sorted(set(a) | set(b)) if key not in a or key not in b or not _same_setting(a[key], b[key])]

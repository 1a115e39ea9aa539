"""What a batch holds, read without a copy: where it holds NaN/inf, and a health line.

Two reads of a recorded batch's values, for dump mode's flight recorder
(:mod:`rollout_mock.wrap.retention` decides what is kept; the recorder calls these):

* :func:`nonfinite_values` — where a batch holds NaN or ±inf: a walk of the batch (a batch
  type's parts, mappings, lists, object arrays), one ``torch.aminmax`` per floating-point tensor or
  array (NaN and ±inf propagate to the minimum or the maximum: exact, no temporary the size of
  the tensor), Python floats one by one. Given the codec's capture of a batch (what the writer
  thread holds in background mode), it reads the capture in place
  (:meth:`rollout_mock.codec.Capture.tensors`: no second encode, no decode), so the training
  thread never pays for it, and rebuilds the batch over the capture's memory only for a step that
  holds some, to name the places.
* :func:`health_summary` — a few hundred bytes per step that say how the batch looks (counts,
  bounds, means, lengths, flags), taken in the dump-mode call before the batch is captured, over
  bounded samples of each key.

Both walk a value below wrap/ (wrap/ holds no value walk, issue 36), bounded in depth and in
nodes visited, and tell what a value is by the structural walks' one dispatch,
:func:`~rollout_mock.codec.structure.kind_of`, and read a container's fields with its
:func:`~rollout_mock.codec.structure.node_fields` (the health walk takes the plain ``float``,
``int``, ``dict`` and ``list`` by type identity first: a sample dict's values cost ~0.3 µs each).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from rollout_mock.codec import view_capture
from rollout_mock.codec.encode import Capture
from rollout_mock.codec.structure import kind_of, node_fields

__all__ = ["FP16_MAX", "HEALTH_ITEMS", "HEALTH_LIST", "HEALTH_SAMPLE", "MAX_PLACES", "health_summary",
           "nonfinite_values"]

#: Most places :func:`nonfinite_values` names, and most nodes it visits in Python (tensors and
#: arrays cost one vectorised reduction each, whatever their size).
MAX_PLACES = 4
_MAX_NODES = 200_000
_MAX_DEPTH = 32


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
        cls = type(obj)  # the plain values first, by identity: a list of log-probs is walked value by value
        if cls is float:
            if not math.isfinite(obj):
                self.places.append(f"{path or '<value>'} ({obj})")
            return
        if cls in _SKIPPED or cls is int:
            return
        kind = kind_of(obj)
        if kind == "scalar":
            if isinstance(obj, float) and not math.isfinite(obj):
                self.places.append(f"{path or '<value>'} ({obj})")
        elif kind == "tensor":
            counts = _tensor_counts(obj) if (obj.is_floating_point() or obj.is_complex()) else None
            if counts is not None:
                self.places.append(f"{path or '<value>'} ({_counts_text(counts)})")
        elif kind == "ndarray":
            if (counts := _array_counts(obj)) is not None:
                self.places.append(f"{path or '<value>'} ({_counts_text(counts)})")
        elif kind == "object_array":
            for i, item in enumerate(obj.reshape(-1)):
                if self.nodes > _MAX_NODES:
                    return
                self.walk(item, f"{path}[{i}]", depth + 1)
        elif kind == "list" or kind == "tuple":
            if obj and isinstance(obj[0], int | str | bytes) and not isinstance(obj[0], bool):
                return  # token ids, texts: nothing to look at (a float among them is not expected)
            for i, item in enumerate(obj):
                if self.nodes > _MAX_NODES:
                    return
                self.walk(item, f"{path}[{i}]", depth + 1)
        elif kind == "mapping" or kind.startswith("batch:"):
            for name, part in node_fields(obj, kind).items():
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
#: Values both walks pass by (by exact type; subclasses are checked by the dispatch).
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
        else:
            self._other(obj, path, depth)

    def _other(self, obj: Any, path: str, depth: int) -> None:
        """What :meth:`walk`'s plain types are not, by the structural walks' one dispatch."""
        kind = kind_of(obj)
        if kind == "scalar":
            if isinstance(obj, int | float) and not isinstance(obj, bool):
                self._number(obj, path, isinstance(obj, float))
        elif kind == "tensor":
            self._tensor(obj, path)
        elif kind == "ndarray":
            if obj.dtype.kind in "fiu" and obj.size:
                self._tensor(obj, path)
        elif kind == "object_array":  # (verl's columns of per-row dicts): read as a list is
            self._items(obj.reshape(-1).tolist(), path, depth)
        elif kind == "list" or kind == "tuple":
            self._items(obj, path, depth)
        elif kind == "mapping":
            self._mapping(obj, path, depth)
        elif kind.startswith("batch:"):
            for name, part in node_fields(obj, kind).items():
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

"""The request record: one value folded into CRCs and a bounded summary of its fields.

:func:`record_request` folds a call's named arguments into the request digest of
:mod:`rollout_mock.wrap.matching` (format 2: type tags, CRC chaining, block prefix CRCs, one C
call for a list of numbers, a block of dicts by column, a flat dict; described there) and its
fields to ``node_depth`` as nodes with a short summary (a tensor by dtype, shape and CRC, never its
bytes). It reads a value with the structural comparison engine's dispatch,
:func:`~rollout_mock.codec.structure.kind_of`, and its reading of a container's fields,
:func:`~rollout_mock.codec.structure.node_fields`; the volatile-field patterns left out are the
caller's (wrap/ passes its framework's). :func:`read_summary` reads a recorded node's summary
back from a dump, bounded (the index may be damaged or hostile).

The digests are pinned (tests compare them with values recorded by earlier versions): a change
to the fold makes every recorded call differ from its own replay.
"""

from __future__ import annotations

import array
import fnmatch
import functools
import itertools
import operator
import re
import reprlib
import struct
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

import msgpack
import numpy as np
import torch

from rollout_mock.batch import meta_part_names, step_names
from rollout_mock.codec.structure import (
    BUFFER_ERRORS,
    SCALARS,
    compile_patterns,
    host_buffer,
    kind_of,
    matches_pattern,
    node_fields,
)
from rollout_mock.crc import crc32
from rollout_mock.text import json_float, logger

__all__ = ["BLOCKS", "HEAD", "Recorded", "block_bounds", "read_summary", "record_request"]


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
    except BUFFER_ERRORS:  # on a GPU, bfloat16, requires_grad, not contiguous...: one by one
        crcs = array.array("I")
        for tensor in tensors:
            buffer = host_buffer(tensor)
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
    except BUFFER_ERRORS:  # a dtype without a plain buffer: one by one
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
            elif isinstance(obj, SCALARS):  # (kind_of's "scalar")
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
        if n and all(isinstance(item, SCALARS) for item in shown):
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
        buffer = host_buffer(obj)
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


# --------------------------------------------------------------------------- reading a summary back
#: Longest string, list and mapping a recorded node's summary keeps when read back: a forged
#: index entry cannot put megabytes into a mismatch message.
_INFO_STR, _INFO_ITEMS = 256, 256
#: Summary fields that are lists when present (a malformed one is dropped, never iterated).
_INFO_LISTS = ("head", "b", "keys", "shape", "batch_size")
#: Nesting of a summary's values kept when read back (deeper lists and mappings come back empty).
_INFO_DEPTH = 3


def read_summary(info: dict[str, Any]) -> dict[str, Any]:
    """A recorded node's summary (the ``info`` of :func:`record_request`'s nodes) as read back from
    a dump, bounded: 32 fields, strings cut at 256 characters, lists at 256 items, mappings at 32,
    nesting at 3 levels; the list fields that are not lists dropped (a damaged or hostile index)."""
    out: dict[str, Any] = {}
    for key, value in list(info.items())[:32]:
        if isinstance(key, str) and not (key in _INFO_LISTS and not isinstance(value, list)):
            out[key[:32]] = _bounded(value, 0)
    return out


def _bounded(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= _INFO_STR else value[:_INFO_STR] + "..."
    if isinstance(value, list):
        return [_bounded(v, depth + 1) for v in value[:_INFO_ITEMS]] if depth < _INFO_DEPTH else []
    if isinstance(value, dict):
        return {str(k)[:64]: _bounded(v, depth + 1) for k, v in list(value.items())[:32]} if depth < _INFO_DEPTH \
            else {}
    return value


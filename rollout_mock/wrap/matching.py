"""Request digests: what a call asked for, by content, in a few bytes.

Dump mode records, with every step, a digest of the call that produced it (every argument but
the step); mock and check mode digest each call the same way and compare it with the recorded
one *before* serving the recorded batch (:mod:`rollout_mock.wrap.mismatch` acts on a difference).

How a value is digested (CRC-32, ISA-L's, ~10-20 GB/s; 32 bits per node): tensors and arrays by
dtype, shape and raw bytes (a GPU tensor is copied to the host; meta, sparse and nested tensors by
dtype and shape only); ``DataProto`` by its ``batch``, ``non_tensor_batch`` and ``meta_info``;
``TensorDict`` by batch size and items; mappings by their items in key order (a dict built in
another order is the same request); dataclasses and namespaces by their fields; lists of plain
scalars (and of flat dicts of them) in one C call, other lists item by item, object arrays as
lists; scalars, strings and bytes by value (NaN equal to NaN); enums by value; functions and
classes by qualified name; any other object by its type name only (not compared). Left out: the
step (a keyword or parameter named like it, those keys of a ``meta_info``) and the volatile
fields adapters declare (:func:`rollout_mock.wrap.hooks.register_volatile_fields`). A digest
does not depend on which nodes are kept.

Besides the digest of the whole request, at most :data:`MAX_NODES` *nodes* (the arguments, then
their fields breadth first) are kept with a short summary (kind, dtype, shape, the first values,
CRCs of block prefixes), so that a mismatch can be explained.
"""

from __future__ import annotations

import array
import dataclasses
import enum
import fnmatch
import functools
import struct
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import torch

from rollout_mock.batch import batch_parts, batch_type_of, meta_part_names
from rollout_mock.crc import crc32
from rollout_mock.text import json_float
from rollout_mock.wrap.calls import step_names
from rollout_mock.wrap.hooks import compile_patterns, matches_pattern, volatile_fields

__all__ = ["BLOCKS", "HEAD", "MAX_NODES", "REQUEST_FORMAT", "Node", "Request", "block_bounds", "digest_request"]

#: ``v`` of a recorded request; a reader refuses another.
REQUEST_FORMAT = 1
#: Nodes kept per request (arguments first, then breadth first), besides ``match_on`` paths.
MAX_NODES = 24
#: Nodes are taken from this depth at most (``data.batch.input_ids`` is depth 3).
NODE_DEPTH = 4
#: Blocks whose prefix CRCs are kept for tensors, arrays and lists of at least 2 * BLOCKS rows
#: (or, with fewer rows, elements).
BLOCKS = 8
#: Leading values kept per tensor, array and list; all of them up to SMALL values.
HEAD = 4
SMALL = 64
#: Deeper values are digested by type name only (a self-referencing structure terminates).
MAX_DEPTH = 64
_STR_SHOWN = 48
_SCALARS = (int, float, str, bytes, bool, type(None))
#: Exactly these types (not subclasses: an IntEnum packs otherwise) go through msgpack in one call.
_PLAIN = frozenset({int, float, str, bool, type(None)})


def _u32(value: int) -> bytes:
    return value.to_bytes(4, "little")


def block_bounds(rows: int) -> list[int]:
    """Ends of the row blocks whose prefix CRCs are kept (``[]`` below ``2 * BLOCKS`` rows)."""
    return [] if rows < 2 * BLOCKS else [-(-rows * (i + 1) // BLOCKS) for i in range(BLOCKS)]


@dataclass
class Node:
    """One digested value of a request: its dotted path, CRC and a short summary."""

    path: str
    digest: int
    info: dict[str, Any]


@dataclass
class Request:
    """A call's digest (:attr:`digest`), its argument names and its kept nodes (see the module
    docstring)."""

    digest: int
    arguments: list[str]
    nodes: list[Node]

    def to_json(self) -> dict[str, Any]:
        return {"v": REQUEST_FORMAT, "d": self.digest, "a": self.arguments,
                "n": [[n.path, n.digest, n.info] for n in self.nodes]}

    @classmethod
    def from_json(cls, data: Any) -> Request | None:
        """A recorded request, or ``None`` when ``data`` is not one (a damaged or foreign entry)."""
        if not isinstance(data, dict) or data.get("v") != REQUEST_FORMAT or type(data.get("d")) is not int:
            return None
        nodes: list[Node] = []
        raw = data.get("n")
        for item in raw if isinstance(raw, list) else []:
            if (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                    and type(item[1]) is int and isinstance(item[2], dict)):
                nodes.append(Node(item[0][:1000], item[1], item[2]))
            if len(nodes) >= 4 * MAX_NODES:
                break
        raw_names = data.get("a")
        names = [a[:200] for a in raw_names[: 4 * MAX_NODES] if isinstance(a, str)] \
            if isinstance(raw_names, list) else []
        return cls(data["d"], names, nodes)


#: How a list of plain scalars is turned into bytes in one C call, tried in order.
_PACKERS: tuple[tuple[bytes, Callable[[Sequence[Any]], Any]], ...] = (
    (b"q", functools.partial(array.array, "q")), (b"d", functools.partial(array.array, "d")), (b"m", msgpack.packb),
)


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
    return [json_float(item) if isinstance(item, float) else item if isinstance(item, int | bool) else str(item)[:16]
            for item in values[: SMALL if n <= SMALL else HEAD]]


class _Digester:
    """One request's walk (see the module docstring); :meth:`run` returns the :class:`Request`."""

    def __init__(self, ignore: tuple[tuple[str, ...], ...], forced: frozenset[str]) -> None:
        self.ignore = ignore
        #: which names can end a volatile path (a pattern's last component), memoised per name
        self._last = [p[-1] for p in ignore]
        self._may_end: dict[str, bool] = {}
        self._flat_keys: dict[tuple[tuple[Any, ...], tuple[str, ...] | None], bool] = {}
        self.forced = forced
        self.candidates: list[tuple[int, int, Node]] = []

    def run(self, arguments: Mapping[str, Any]) -> Request:
        total = 0
        for name in sorted(arguments):
            digest = self.value(arguments[name], (name,), 1)
            total = crc32(_u32(digest), crc32(name.encode("utf-8", "surrogatepass"), total))
        self.candidates.sort(key=lambda c: (c[0], c[1]))
        nodes = [n for depth, _, n in self.candidates if depth == 1 or n.path in self.forced]
        rest = [n for depth, _, n in self.candidates if depth > 1 and n.path not in self.forced]
        return Request(total, sorted(arguments), nodes + rest[: max(MAX_NODES - len(nodes), 0)])

    def _keep(self, path: tuple[str, ...], depth: int, digest: int, info: dict[str, Any]) -> None:
        if depth <= NODE_DEPTH or ".".join(path) in self.forced:
            self.candidates.append((depth, len(self.candidates), Node(".".join(path), digest, info)))

    def may_end(self, name: str) -> bool:
        """Whether ``name`` matches the last component of a volatile pattern (memoised)."""
        if (found := self._may_end.get(name)) is None:
            found = self._may_end[name] = any(w == name or fnmatch.fnmatchcase(name, w) for w in self._last)
        return found

    def _ignored(self, path: tuple[str, ...]) -> bool:
        return bool(self.ignore) and self.may_end(path[-1]) and matches_pattern(path, self.ignore)

    # ------------------------------------------------------------------ values
    def value(self, obj: Any, path: tuple[str, ...] | None, depth: int, keep: bool = True) -> int:
        """The CRC of ``obj`` at ``path`` (``None``: where no volatile field can be, e.g. a mapping
        key); a node is kept for it with ``keep`` (not for list items and what is inside them)."""
        keep = keep and path is not None
        info: dict[str, Any] | None = None
        if isinstance(obj, _SCALARS):
            digest = crc32(_scalar_bytes(obj))
            if keep:
                info = _scalar_info(obj)
        elif depth > MAX_DEPTH:
            digest, info = crc32(b"?deep"), {"k": "object", "t": "too deep"}
        elif isinstance(obj, torch.Tensor):
            digest, info = self._tensor(obj, keep)
        elif isinstance(obj, np.ndarray):
            digest, info = self._array(obj, path, depth, keep)
        elif isinstance(obj, np.generic):
            return self.value(obj.item(), path, depth, keep)
        elif isinstance(obj, enum.Enum):
            digest, info = self.value(obj.value, None, depth + 1), {"k": "enum", "v": str(obj)[:_STR_SHOWN]}
        elif isinstance(obj, list | tuple):
            digest, info = self._sequence(obj, path, depth, keep)
        elif isinstance(obj, Mapping):
            digest, info = self._mapping(b"D", obj, path, depth, keep)
        elif (batch_type := batch_type_of(obj)) is not None and (parts := batch_parts(obj)) is not None:
            # a registered batch type (a DataProto, a TensorDict...): its named parts, as the batch
            # model gives them, under the type's name (and batch size, where it has one)
            sizes = [int(s) for s in getattr(obj, "batch_size", ())] if hasattr(obj, "batch_size") else []
            tag = b"B" + batch_type.name.encode() + str(sizes).encode()
            digest, info = self._mapping(tag, parts, path, depth, keep)
            info = {"k": batch_type.name, "t": type(obj).__qualname__, "keys": info.get("keys", [])}
            if sizes:
                info["batch_size"] = sizes
        elif isinstance(obj, set | frozenset):
            items = sorted(self.value(x, None, depth + 1) for x in obj)
            digest, info = crc32(b"".join(map(_u32, items)), crc32(b"Z")), {"k": "set", "len": len(obj)}
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = {f.name: getattr(obj, f.name, None) for f in dataclasses.fields(obj)}
            digest, info = self._mapping(b"C" + type(obj).__qualname__.encode(), fields, path, depth, keep)
            info["k"], info["t"] = "dataclass", type(obj).__qualname__
        elif isinstance(obj, types.SimpleNamespace) or type(obj).__name__ == "Namespace":
            digest, info = self._mapping(b"NS", dict(vars(obj)), path, depth, keep)
        elif callable(obj) and isinstance(obj, type | types.FunctionType | types.BuiltinFunctionType
                                          | types.MethodType | functools.partial):
            target = obj.func if isinstance(obj, functools.partial) else obj
            name = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__name__)}"
            digest, info = crc32(b"Q" + name.encode("utf-8", "surrogatepass")), {"k": "callable", "v": name[-80:]}
        else:
            name = type(obj).__qualname__
            digest, info = crc32(b"?" + name.encode()), {"k": "object", "t": name}
        if keep and path is not None and info is not None:
            self._keep(path, depth, digest, info)
        return digest

    def _flat_items(self, obj: Any, path: tuple[str, ...] | None) -> list[tuple[str, Any]] | None:
        """The sorted items of a dict of plain scalars under string keys (digested in one
        msgpack call), or ``None`` (another mapping, a volatile or step key among its keys)."""
        if type(obj) is not dict or not all(map(_PLAIN.__contains__, map(type, obj.values()))):
            return None
        keys = tuple(obj)
        flat = self._flat_keys.get((keys, path))
        if flat is None:  # once per key set and place: dicts of one column share their keys
            step_in_meta = path is not None and path[-1] in meta_part_names() and not set(step_names()).isdisjoint(keys)
            flat = all(type(k) is str for k in keys) and not step_in_meta and not (
                path is not None and any(self.may_end(k) and self._ignored((*path, k)) for k in keys))
            self._flat_keys[(keys, path)] = flat
        if not flat:
            return None
        return sorted(obj.items())

    def _mapping(self, tag: bytes, obj: Mapping[Any, Any], path: tuple[str, ...] | None,
                 depth: int, keep: bool) -> tuple[int, dict[str, Any]]:
        """The CRC of a mapping (items in key order, volatile keys and the step keys of a batch's
        metadata part left out);
        kept mappings also keep their fields as nodes."""
        flat = self._flat_items(obj, path)
        crc = crc32(tag)
        if flat is not None:
            try:
                crc = crc32(msgpack.packb(flat), crc32(b"f", crc))
            except (OverflowError, ValueError):  # an int beyond 64 bits: field by field
                flat = None
        if flat is not None and not keep:
            return crc, {}
        meta_part = path is not None and path[-1] in meta_part_names()
        try:
            keys = sorted(obj.keys())
        except TypeError:  # keys of several types
            keys = sorted(obj.keys(), key=lambda k: (type(k).__name__, str(k)))
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
                  keep: bool = True) -> tuple[int, dict[str, Any]]:
        """The CRC of a list or tuple (plain scalars, or dicts of them, in one C pass; other items
        one by one); a kept one also gets its first values and block-prefix CRCs."""
        n = len(obj)
        tag = b"L" if isinstance(obj, list) else b"U"
        # msgpack's encoding of a block is not a slice of the whole list's: those are always cut
        # into the same blocks; the array packers and item CRCs chain alike however they are cut
        blocked = block_bounds(n) or [n]
        bounds = blocked if keep else [n]
        crc, head = crc32(tag + str(n).encode()), None
        prefixes: list[int] = []
        if n and isinstance(obj[0], _SCALARS):
            for packer_tag, pack in _PACKERS:
                try:
                    running, prefixes, start = crc32(packer_tag, crc), [], 0
                    for end in (blocked if packer_tag == b"m" else bounds):
                        running = crc32(pack(obj[start:end]), running)
                        prefixes.append(running)
                        start = end
                except Exception:  # noqa: BLE001 - not all of one packable type: the next packer, else item by item
                    continue
                crc, head = running, _head(obj, n) if keep else []
                break
        item_path = None if path is None else (*path, "[]")
        if head is None and n and type(obj[0]) is dict:
            running, prefixes, start = crc32(b"f", crc), [], 0
            for end in blocked:
                rows = [self._flat_items(item, item_path) for item in obj[start:end]]
                if any(row is None for row in rows):
                    prefixes = []
                    break
                try:
                    running = crc32(msgpack.packb(rows), running)
                except (OverflowError, ValueError):
                    prefixes = []
                    break
                prefixes.append(running)
                start = end
            if prefixes:
                crc, head = running, []
        if head is None:
            running, prefixes, start = crc, [], 0
            for end in bounds:
                for item in obj[start:end]:
                    running = crc32(_u32(self.value(item, item_path, depth + 1, False)), running)
                prefixes.append(running)
                start = end
            crc = running
            if n and keep and isinstance(obj[0], _SCALARS):
                head = _head(obj, n)
        info: dict[str, Any] = {"k": "list" if tag == b"L" else "tuple", "len": n}
        if head:
            info["head"] = head
        if keep and len(prefixes) > 1:
            info["b"] = prefixes
        return crc, info

    def _tensor(self, obj: torch.Tensor, keep: bool) -> tuple[int, dict[str, Any]]:
        dtype = str(obj.dtype)
        if obj.is_nested or obj.layout != torch.strided or obj.device.type == "meta":
            shape = [] if obj.is_nested else [int(s) for s in obj.shape]
            info = {"k": "tensor", "dtype": dtype[6:], "shape": shape,
                    "t": f"{obj.layout}/{obj.device.type}: not compared"}
            return crc32(f"T?{dtype}{shape}".encode()), info
        tensor = obj.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        try:
            buffer = tensor.numpy()
        except (TypeError, RuntimeError):  # bfloat16, float8...: their bytes
            buffer = tensor.reshape(-1).view(torch.uint8).numpy()
        meta = crc32(f"T{dtype}{tuple(tensor.shape)}".encode())
        if not keep:
            return crc32(_u32(crc32(buffer.reshape(-1))), meta), {}
        shape = [int(s) for s in obj.shape]
        flat = tensor.reshape(-1)
        crc, prefixes, unit = self._bytes(buffer, shape[0] if shape else 1, flat.numel())
        kept: dict[str, Any] = {"k": "tensor", "dtype": dtype[6:], "shape": shape,
                                "head": _head(flat[:SMALL].tolist(), flat.numel())}
        if len(prefixes) > 1:
            kept["b"], kept["bu"] = prefixes, unit
        return crc32(_u32(crc), meta), kept

    def _array(self, obj: np.ndarray, path: tuple[str, ...] | None, depth: int,
               keep: bool) -> tuple[int, dict[str, Any]]:
        shape = [int(s) for s in obj.shape]
        if obj.dtype.hasobject:
            crc, info = self._sequence(obj.reshape(-1).tolist(), path, depth, keep)
            info.update(k="array", dtype="object", shape=shape)
            return crc32(_u32(crc), crc32(f"O{shape}".encode())), info
        flat = np.ascontiguousarray(obj).reshape(-1)
        crc, prefixes, unit = self._bytes(flat, shape[0] if shape else 1, flat.size)
        info = {"k": "array", "dtype": obj.dtype.str, "shape": shape, "head": _head(flat[:SMALL].tolist(), flat.size)}
        if len(prefixes) > 1:
            info["b"], info["bu"] = prefixes, unit
        return crc32(_u32(crc), crc32(f"A{obj.dtype.str}{shape}".encode())), info

    @staticmethod
    def _bytes(buffer: Any, rows: int, count: int) -> tuple[int, list[int], str]:
        """CRC of a contiguous buffer of ``count`` values in ``rows`` rows, the CRCs of its block
        prefixes and what a block is made of (``rows``, or ``elements`` when rows are few)."""
        view = memoryview(buffer).cast("B")
        units, unit = (rows, "rows") if rows >= 2 * BLOCKS or count <= SMALL else (count, "elements")
        bounds = block_bounds(units)
        if not bounds or view.nbytes % units:
            return crc32(view), [], unit
        size = view.nbytes // units
        running, prefixes, start = 0, [], 0
        for end in bounds:
            running = crc32(view[start * size:end * size], running)
            prefixes.append(running)
            start = end
        return running, prefixes, unit


def digest_request(arguments: Mapping[str, Any], *, volatile: Sequence[str] | None = None,
                   forced: Sequence[str] = ()) -> Request:
    """The :class:`Request` of a call's named ``arguments`` (see
    :func:`~rollout_mock.wrap.mismatch.bind_arguments`).

    ``volatile``: patterns of fields left out; default: every pattern the adapters declared.
    ``forced``: dotted paths kept as nodes whatever their depth (``match_on``)."""
    if volatile is None:
        volatile = [p for patterns in volatile_fields().values() for p in patterns]
    return _Digester(compile_patterns(volatile), frozenset(forced)).run(arguments)

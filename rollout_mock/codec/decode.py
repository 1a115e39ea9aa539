"""Decoding format-2 step files without any pickle machinery (opaque blobs need ``trusted``)."""

from __future__ import annotations

import collections
import datetime
import math
import pickle
import struct
from typing import Any

import numpy as np
import torch

from rollout_mock.batch import subset
from rollout_mock.codec import chunks as _chunks
from rollout_mock.codec.batches import build_batch
from rollout_mock.codec.bodydec import BodyReader
from rollout_mock.codec.classes import CLASS_TAGS, decode_class, finish_tensordict
from rollout_mock.codec.hashguard import check_keys
from rollout_mock.codec.jsonitems import parse_items
from rollout_mock.codec.layout import TORCH_DTYPES, numpy_dtype
from rollout_mock.codec.strcol import read_strings
from rollout_mock.errors import UnsafePickleError

__all__ = ["NodeDecoder", "materialize_snapshot"]

OPT_IN = (
    "trust_pickle: true in the rollout_mock config, trusted=True in rollout_mock.load_step / "
    "rollout_mock.codec.decode, or --trust on the command line"
)
_FACTORIES: dict[Any, Any] = {None: None, "list": list, "dict": dict, "set": set, "int": int,
                              "float": float, "str": str, "tuple": tuple}


def normalize_rows(rows: Any) -> slice | None:
    if rows is None or isinstance(rows, slice):
        return rows
    if isinstance(rows, range):
        return slice(rows.start, rows.stop, rows.step)
    raise TypeError(f"rows must be a slice or range, not {type(rows).__name__}")


def _rows_range(rows: slice, n: int) -> range:
    return range(n)[rows]


class NodeDecoder:
    """Rebuilds objects from validated nodes; data comes from ``fetch`` (chunk reader)."""

    def __init__(self, reader: Any, *, trusted: bool, batch_class: type | None, name: str) -> None:
        self.reader = reader
        self.trusted = trusted
        self.batch_class = batch_class
        self.name = name
        self.body: BodyReader | None = None
        #: a capture's pickles (set by materialize_snapshot only: files never decode ``snap``)
        self.pickled: list[Any] | None = None

    def use_body(self, body: list[int] | None, raws: list[int], *, surrogates: bool,
                 table: list[list[int]] | None, used: list[int]) -> None:
        """Header version 4: where ``mp`` nodes and body tensors are read from."""
        self.body = BodyReader(self, body, raws, surrogates=surrogates, table=table, used=used)

    # ------------------------------------------------------------------ data nodes
    def tensor(self, node: dict[str, Any], rows: slice | None = None) -> torch.Tensor:
        dtype = TORCH_DTYPES[node["dtype"]]
        shape = list(node["shape"])
        itemsize = dtype.itemsize
        if rows is not None and shape:
            picked = _rows_range(rows, shape[0])
            row_bytes = math.prod(shape[1:]) * itemsize
            if not len(picked):
                out = torch.empty([0, *shape[1:]], dtype=dtype)
            else:
                lo, hi = min(picked), max(picked) + 1
                raw = self.reader.span(node["c"], lo * row_bytes, hi * row_bytes)
                out = self._view(raw, dtype, [hi - lo, *shape[1:]])
                if picked.step != 1 or len(picked) != hi - lo:
                    out = out[torch.tensor([i - lo for i in picked], dtype=torch.long)]
        else:
            nbytes = math.prod(shape) * itemsize
            if nbytes == 0:
                out = torch.zeros(shape, dtype=dtype)
            else:
                out = self._view(self.reader.whole(node["c"], nbytes, defer=True), dtype, shape)
        if node.get("param"):
            return torch.nn.Parameter(out, requires_grad=bool(node.get("grad")))
        if node.get("grad"):
            out.requires_grad_(True)
        return out

    def _view(self, raw: torch.Tensor, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        if math.prod(shape) == 0:
            return torch.zeros(shape, dtype=dtype)
        if dtype is torch.bool:
            def check() -> None:
                if bool((raw > 1).any()):
                    raise ValueError("bool tensor holds bytes other than 0 and 1")

            self.reader.after(check)
        return raw.view(dtype).reshape(shape)

    def ndarray(self, node: dict[str, Any], rows: slice | None = None) -> np.ndarray:
        dtype = numpy_dtype(node["dtype"])
        shape = list(node["shape"])
        if rows is not None and shape:
            picked = _rows_range(rows, shape[0])
            row_bytes = math.prod(shape[1:]) * dtype.itemsize
            if not len(picked):
                out = np.zeros([0, *shape[1:]], dtype=dtype)
            else:
                lo, hi = min(picked), max(picked) + 1
                raw = self.reader.span(node["c"], lo * row_bytes, hi * row_bytes).numpy()
                out = raw.view(dtype).reshape([hi - lo, *shape[1:]])
                if picked.step != 1 or len(picked) != hi - lo:
                    out = out[[i - lo for i in picked]]
        else:
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes == 0:
                out = np.zeros(shape, dtype=dtype)
            else:
                out = self.reader.whole(node["c"], nbytes, defer=True).numpy().view(dtype).reshape(shape)
        if node.get("ro"):
            out.flags.writeable = False
        return out

    def objarray(self, node: dict[str, Any], rows: slice | None = None) -> np.ndarray:
        shape = list(node["shape"])
        items = node["items"] if "items" in node else self._json_items(node, math.prod(shape))
        if rows is not None and shape:
            picked = _rows_range(rows, shape[0])
            per_row = math.prod(shape[1:])
            items = [x for r in picked for x in items[r * per_row: (r + 1) * per_row]]
            shape = [len(picked), *shape[1:]]
        values = [self.value(x) for x in items]
        array = np.empty(len(values), dtype=object)
        for i, x in enumerate(values):
            array[i] = x
        return array.reshape(shape)

    def _json_items(self, node: dict[str, Any], count: int) -> list[Any]:
        """An object array's items stored as a JSON data chunk (header version 3): plain
        scalars only, as many as its shape says (:mod:`~rollout_mock.codec.jsonitems`)."""
        return parse_items(self.reader.whole(node["c"], None).numpy().data, count)

    def tensordict(self, node: dict[str, Any], rows: slice | None = None,
                   keys: frozenset[str] | None = None) -> Any:
        from tensordict import TensorDict

        batch_size = list(node["batch_size"])
        sub = rows if batch_size else None
        if sub is not None:
            batch_size[0] = len(_rows_range(sub, batch_size[0]))
        items = {k: self.value(v, sub) for k, v in node["items"] if keys is None or k in keys}
        names = node.get("names")
        td = TensorDict(items, batch_size=batch_size, device=node.get("device"), names=names)
        return finish_tensordict(td, node, self.reader.flush)  # classes.py: lock and consolidation state

    def blob(self, node: dict[str, Any]) -> Any:
        if not self.trusted:
            raise UnsafePickleError(
                f"{self.name}: {node.get('path') or 'the root object'} holds {node.get('what')}, stored "
                f"as an opaque pickle; the safe loader never unpickles. If you trust this dump, load "
                f"it with {OPT_IN}.",
                path=self.name,
            )
        return pickle.loads(self.reader.whole(node["c"], None).numpy().tobytes())

    def raw_bytes(self, node: dict[str, Any]) -> bytes:
        if "hex" in node:
            return bytes.fromhex(node["hex"])
        return self.reader.whole(node["c"], None).numpy().tobytes()

    # ------------------------------------------------------------------ dispatch
    def value(self, node: Any, rows: slice | None = None) -> Any:
        kind = type(node)
        if node is None or kind in (bool, int, float, str):
            return node
        if kind is list:
            if rows is not None:
                return [self.value(node[i]) for i in _rows_range(rows, len(node))]
            return [self.value(x) for x in node]
        tag = node.get("$")
        if tag is None:
            return {k: self.value(v, rows) for k, v in node.items()} if rows is not None \
                else {k: self.value(v) for k, v in node.items()}
        if tag == "mp":
            if self.body is None:
                raise ValueError("body value outside a version-4 step")
            value = self.body.value(node)
            return value if rows is None else subset(value, None, rows)
        if tag == "snap":  # a capture's in-memory pickle: only Snapshot.materialize has these
            if self.body is None or self.pickled is None:
                raise ValueError("snapshot value outside a snapshot")
            return self.body.snapshot_value(self.pickled, node)
        if tag == "strs":
            return read_strings(self.reader, node, None if rows is None or not node["shape"]
                                else _rows_range(rows, node["shape"][0]))
        if tag == "tensor":
            return self.tensor(node, rows)
        if tag == "ndarray":
            return self.ndarray(node, rows)
        if tag == "objarray":
            return self.objarray(node, rows)
        if tag == "tensordict":
            return self.tensordict(node, rows)
        if tag == "batch":
            return self.batch(node, rows)
        if tag == "nested":
            items = node["items"]
            if rows is not None:
                items = [items[i] for i in _rows_range(rows, len(items))]
            layout = torch.jagged if node["layout"] == "jagged" else torch.strided
            parts = [self.value(x) for x in items]
            self.reader.flush()  # nested_tensor copies its components: their data first
            return torch.nested.nested_tensor(parts, layout=layout)
        if tag in CLASS_TAGS:  # classes.py: numpy string scalars, tensordict classes, jagged tensors
            return decode_class(self, node, tag, rows)
        return self._small(node, tag)

    def _small(self, node: dict[str, Any], tag: str) -> Any:
        if tag == "tuple":
            return tuple(self.value(x) for x in node["v"])
        if tag in ("set", "frozenset"):
            members = [self.value(x) for x in node["v"]]
            check_keys(members)
            return (set if tag == "set" else frozenset)(members)
        if tag in ("map", "odict", "counter", "defaultdict"):
            pairs = [(self.value(k), self.value(v)) for k, v in node["items"]]
            check_keys([k for k, _ in pairs])
            if tag == "map":
                return dict(pairs)
            if tag == "odict":
                return collections.OrderedDict(pairs)
            if tag == "counter":
                return collections.Counter(dict(pairs))
            out: collections.defaultdict[Any, Any] = collections.defaultdict(_FACTORIES[node.get("factory")])
            out.update(pairs)
            return out
        if tag == "deque":
            return collections.deque((self.value(x) for x in node["v"]), maxlen=node.get("maxlen"))
        if tag in ("bytes", "bytearray"):
            data = self.raw_bytes(node)
            return data if tag == "bytes" else bytearray(data)
        if tag == "pickle":
            return self.blob(node)
        if tag == "int":
            return int(node["v"])
        if tag == "float":
            return struct.unpack("<d", bytes.fromhex(node["hex"]))[0]
        if tag == "complex":
            return complex(self.value(node["re"]), self.value(node["im"]))
        if tag == "npscalar":
            return np.frombuffer(bytes.fromhex(node["hex"]), dtype=numpy_dtype(node["dtype"]))[0].copy()
        if tag == "size":
            return torch.Size(node["v"])
        if tag == "device":
            return torch.device(node["v"])
        if tag == "dtype":
            return TORCH_DTYPES[node["v"]]
        if tag == "slice":
            return slice(*(self.value(x) for x in node["v"]))
        if tag == "range":
            return range(*node["v"])
        if tag == "timedelta":
            return datetime.timedelta(*node["v"])
        if tag in ("datetime", "date", "time"):
            return getattr(datetime, tag).fromisoformat(node["iso"])
        raise ValueError(f"unknown node tag {tag!r}")

    def batch(self, node: dict[str, Any], rows: slice | None = None,
              keys: frozenset[str] | None = None) -> Any:
        extra = {k: self.value(v) for k, v in node["extra"]}
        fields: dict[str, Any] = {}
        if node["kind"] == "dataproto":
            fields["batch"] = self.field(node.get("batch"), rows, keys)
            fields["non_tensor_batch"] = self.field(node.get("non_tensor_batch"), rows, keys)
            fields["meta_info"] = self.value(node.get("meta_info"))
        return build_batch(node["kind"], node["class"], node["layout"], fields, extra,
                           batch_class=self.batch_class)

    def field(self, node: Any, rows: slice | None, keys: frozenset[str] | None) -> Any:
        """A batch or non-tensor field: dict-like node filtered by ``keys``, rows applied."""
        if type(node) is dict and node.get("$") is None:
            return {k: self.value(v, rows) for k, v in node.items() if keys is None or k in keys}
        if type(node) is dict and node.get("$") == "tensordict":
            return self.tensordict(node, rows, keys)
        return self.value(node, rows)


class _MemoryReader:
    """Chunk reader over a snapshot's in-memory chunks (shares memory where it can)."""

    def __init__(self, chunks: list[tuple[memoryview, int]], spans: dict[int, Any]) -> None:
        self.chunks = chunks
        self.spans = spans

    def whole(self, ref: list[int], nbytes: int | None, *, defer: bool = False) -> torch.Tensor:
        first, count = ref
        span = self.spans.get(first)
        if span is not None and span.nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        if span is not None and (nbytes is None or span.nbytes == nbytes) and count:
            if span.readonly:
                return torch.from_numpy(np.frombuffer(span, np.uint8).copy())
            return torch.frombuffer(span, dtype=torch.uint8)
        parts = [np.frombuffer(self.chunks[i][0], np.uint8) for i in range(first, first + count)]
        return torch.from_numpy(np.concatenate(parts) if parts else np.empty(0, np.uint8))

    def span(self, ref: list[int], lo: int, hi: int) -> torch.Tensor:
        return self.whole(ref, None)[lo:hi]

    @staticmethod
    def after(check: Any) -> None:
        check()  # the data is in memory already

    def flush(self) -> None:
        """Nothing is deferred."""


def materialize_snapshot(snapshot: Any, *, batch_class: type | None = None) -> Any:
    reader = _MemoryReader(snapshot.chunks, getattr(snapshot, "spans", {}))
    decoder = NodeDecoder(reader, trusted=True, batch_class=batch_class, name="<snapshot>")
    decoder.use_body(getattr(snapshot, "body", None), [view.nbytes for view, _ in snapshot.chunks],
                     surrogates=getattr(snapshot, "surrogates", False), table=None, used=[0])
    decoder.pickled = getattr(snapshot, "pickled", None)
    return decoder.value(snapshot.root)


def crc_check(data: Any, expected: int, index: int) -> None:
    if _chunks.crc32(data) != expected:
        raise ValueError(f"chunk {index} fails its CRC-32 check (the file is corrupt)")

"""Structural classes of the step format: numpy string scalars, tensordict's non-tensor and
stacked classes, TensorDict lock/consolidation state, and jagged nested tensors.

Each is stored as data (no pickle) and rebuilt as the same class by rollout_mock's own code;
the class is chosen by the node's tag, never by a name in the file. The tags and keys below
need header version :data:`CLASS_VERSION` (4): an older reader refuses such a file with "written
by a newer rollout_mock" instead of silently losing the state.

* ``{"$": "npstr", "v": str}`` / ``{"$": "npbytes", "hex": str}``: ``np.str_`` / ``np.bytes_``
  scalars (which are ``str``/``bytes`` subclasses, so the value alone would lose the type);
* ``{"$": "nontensor", "data": NODE, "batch_size": [...], "device": "cpu"|None, "locked": bool}``:
  ``tensordict.NonTensorData`` (verl's ``to_tensordict`` meta values);
* ``{"$": "tdstack", "cls": "nontensor"|"lazy", "stack_dim": int, "items": [NODE...],
  "locked": bool}``: ``tensordict.NonTensorStack`` (verl's uids, prompts, turn scores; nested
  stacks for lists of lists) and ``LazyStackedTensorDict``;
* ``{"$": "njt", "values": NODE, "offsets": NODE, "lengths": NODE|None, "ragged": int,
  "sym": int, "min": int|None, "max": int|None}``: a jagged nested tensor by its own buffers.
  ``ragged`` is ``_ragged_idx``; ``sym`` the position of the symbolic (ragged) size in
  ``.shape``, which differs from ``ragged`` for tensors whose ``_ragged_idx`` was set after
  construction, as verl's ``nested_tensor_from_tensor_list(..., ragged_idx=2)`` does: both are
  restored, so shape, ragged dimension, offsets, lengths (holes) and values come back equal;
* TensorDict nodes (``{"$": "tensordict"}``) gain ``"locked": true`` and ``"consolidated": true``:
  a consolidated TensorDict is rebuilt with ``consolidate()`` (which also locks it, as in
  tensordict), a locked one with ``lock_()``.

Strides are not kept (a transposed nested tensor comes back contiguous, like dense tensors).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

from rollout_mock.codec.layout import TORCH_DTYPES
from rollout_mock.text import logger

__all__ = [
    "CLASS_TAGS", "CLASS_VERSION", "check_class_node", "decode_class", "encode_class", "encode_scalar",
    "finish_tensordict", "keeps_structure", "needs_class_version", "tensordict_state",
]

#: Header version of files that use the tags and keys of this module.
CLASS_VERSION = 4
CLASS_TAGS = frozenset({"npstr", "npbytes", "nontensor", "tdstack", "njt"})
_STACKS = {("tensordict.tensorclass", "NonTensorStack"): "nontensor",
           ("tensordict._lazy", "LazyStackedTensorDict"): "lazy"}
_NONTENSOR = ("tensordict.tensorclass", "NonTensorData")
_MAX_STACK_DIM = 32


def _name(cls: type) -> tuple[str, str]:
    return cls.__module__, cls.__qualname__


def _cpu(device: Any) -> str | None:
    return "cpu" if device is not None and torch.device(device).type == "cpu" else None


# --------------------------------------------------------------------------- write side
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning("[RolloutMock] %s", message)


def encode_scalar(obj: Any) -> dict[str, Any] | None:
    """The node of a numpy ``str_``/``bytes_`` scalar, else None."""
    cls = type(obj)
    if cls is np.str_:
        return {"$": "npstr", "v": str(obj)}
    if cls is np.bytes_:
        return {"$": "npbytes", "hex": bytes(obj).hex()}
    return None


def keeps_structure(obj: Any) -> bool:
    """Whether ``obj`` must reach :func:`encode_class` / the TensorDict node itself: a generic
    path (a pickle taken in memory, a msgpack body) would lose its class or state — pickling a
    nested tensor renormalises its ragged dimension and strides, pickling verl's DataProto
    consolidates its TensorDict."""
    cls = type(obj)
    name = _name(cls)
    if name == _NONTENSOR or name in _STACKS or name == ("tensordict._td", "TensorDict"):
        return True
    return isinstance(obj, torch.Tensor) and bool(obj.is_nested)


def encode_class(enc: Any, obj: Any, cls: type, path: str) -> dict[str, Any] | None:
    """The node of a structural class (``enc.node`` encodes the parts), else None."""
    name = _name(cls)
    if name == _NONTENSOR:
        return {"$": "nontensor", "data": enc.node(obj.data, f"{path}.data"),
                "batch_size": list(obj.batch_size), "device": _cpu(obj.device), "locked": bool(obj.is_locked)}
    kind = _STACKS.get(name)
    if kind is not None:
        return {"$": "tdstack", "cls": kind, "stack_dim": int(obj.stack_dim), "locked": bool(obj.is_locked),
                "items": [enc.node(td, f"{path}[{i}]") for i, td in enumerate(obj.tensordicts)]}
    if isinstance(obj, torch.Tensor) and obj.is_nested and obj.layout is torch.jagged:
        return _encode_njt(enc, obj, path)
    return None


def _encode_njt(enc: Any, nt: Any, path: str) -> dict[str, Any] | None:
    symbolic = [i for i, size in enumerate(nt.shape) if not isinstance(size, int)]
    cache = getattr(nt, "_metadata_cache", None) or {}
    lengths = nt.lengths()
    values, order = nt.values(), None
    if str(values.dtype).removeprefix("torch.") not in TORCH_DTYPES:
        return None  # not plain data: the generic nested path keeps it for trusted loads
    if not values.is_contiguous():  # a transposed tensor: keep its memory order, not only values
        dims = sorted(range(values.dim()), key=lambda d: -int(values.stride(d)))
        if values.permute(dims).is_contiguous():
            values, order = values.permute(dims), dims
        else:
            _warn_once("njt-strides", f"{path}: a nested tensor over a non-contiguous view (not a "
                       f"transpose) is recorded by value: it loads contiguous")
    node: dict[str, Any] = {
        "$": "njt", "values": enc.node(values, f"{path}.values"), "order": order,
        "offsets": enc.node(nt.offsets(), f"{path}.offsets"),
        "lengths": None if lengths is None else enc.node(lengths, f"{path}.lengths"),
        "ragged": int(nt._ragged_idx), "sym": symbolic[0] if symbolic else int(nt._ragged_idx),
        "min": int(nt._min_seqlen) if "min_seqlen" in cache else None,
        "max": int(nt._max_seqlen) if "max_seqlen" in cache else None,
    }
    return node


def tensordict_state(td: Any, path: str = "") -> dict[str, Any]:
    """The extra keys of a TensorDict node: its lock and consolidation state (when set)."""
    state: dict[str, Any] = {}
    if td.device is not None and td.device.type != "cpu":
        _warn_once(f"td-device-{td.device.type}", f"{path or 'a TensorDict'}: the TensorDict device "
                   f"{td.device} is not recorded: it loads on the CPU with device=None")
    if td.is_locked:
        state["locked"] = True
    consolidated = getattr(td, "is_consolidated", None)
    if consolidated is not None and consolidated():
        state["consolidated"] = True
    return state


def needs_class_version(node: dict[str, Any]) -> bool:
    """Whether a (tagged) node needs header version :data:`CLASS_VERSION`."""
    tag = node.get("$")
    return tag in CLASS_TAGS or (tag == "tensordict" and ("locked" in node or "consolidated" in node))


# --------------------------------------------------------------------------- validation
def _bool(node: dict[str, Any], key: str) -> None:
    if type(node.get(key, False)) is not bool:
        raise ValueError(f"bad {node.get('$')} node: {key} must be a boolean")


def _opt_int(value: Any) -> None:
    if value is not None and (type(value) is not int or not 0 <= value < 1 << 62):
        raise ValueError("bad njt node: min/max must be null or a non-negative integer")


def check_class_node(node: dict[str, Any], tag: str, check_shape: Any) -> list[Any]:
    """Validate a node of this module; returns its child nodes (``check_shape`` checks a shape)."""
    if tag == "npstr":
        if type(node.get("v")) is not str:
            raise ValueError("bad npstr node")
        return []
    if tag == "npbytes":
        text = node.get("hex")
        if type(text) is not str or len(text) % 2:
            raise ValueError("bad npbytes node")
        return []
    if tag == "nontensor":
        check_shape(node.get("batch_size"))
        if node.get("device") not in (None, "cpu"):
            raise ValueError("bad nontensor device")
        _bool(node, "locked")
        return [node.get("data")]
    if tag == "tdstack":
        if node.get("cls") not in ("nontensor", "lazy"):
            raise ValueError("bad tdstack class")
        dim = node.get("stack_dim")
        if type(dim) is not int or not 0 <= dim <= _MAX_STACK_DIM:
            raise ValueError("bad tdstack stack_dim")
        _bool(node, "locked")
        items = node.get("items")
        if type(items) is not list:
            raise ValueError("tdstack node without items")
        return items
    if tag == "njt":
        for key in ("ragged", "sym"):
            if type(node.get(key)) is not int or not 1 <= node[key] <= 32:
                raise ValueError(f"bad njt {key}")
        order = node.get("order")
        if order is not None and (type(order) is not list or sorted(order) != list(range(len(order)))
                                  or any(type(d) is not int for d in order)):
            raise ValueError("bad njt order")
        _opt_int(node.get("min"))
        _opt_int(node.get("max"))
        for key in ("values", "offsets", "lengths"):
            child = node.get(key)
            if not (key == "lengths" and child is None) and (type(child) is not dict or child.get("$") != "tensor"):
                raise ValueError(f"njt {key} must be a tensor node")
        return [node["values"], node["offsets"], node.get("lengths")]
    raise ValueError(f"unknown node tag {tag!r:.40}")


# --------------------------------------------------------------------------- load side
def _rows_of(rows: slice | None, n: int) -> list[int] | None:
    return None if rows is None else list(range(n)[rows])


def decode_class(dec: Any, node: dict[str, Any], tag: str, rows: slice | None = None) -> Any:
    """Rebuild a node of this module (``dec.value`` decodes the parts)."""
    if tag == "npstr":
        return np.str_(node["v"])
    if tag == "npbytes":
        return np.bytes_(bytes.fromhex(node["hex"]))
    if tag == "nontensor":
        from tensordict import NonTensorData

        batch_size = list(node["batch_size"])
        if rows is not None and batch_size:
            batch_size[0] = len(range(batch_size[0])[rows])
        out = NonTensorData(data=dec.value(node["data"]), batch_size=batch_size, device=node.get("device"))
        return out.lock_() if node.get("locked") else out
    if tag == "tdstack":
        return _decode_stack(dec, node, rows)
    if tag == "njt":
        return _decode_njt(dec, node, rows)
    raise ValueError(f"unknown node tag {tag!r:.40}")


def _decode_stack(dec: Any, node: dict[str, Any], rows: slice | None) -> Any:
    from tensordict import LazyStackedTensorDict, NonTensorStack

    items, dim = node["items"], node["stack_dim"]
    if rows is not None and dim == 0:
        parts = [dec.value(items[i]) for i in range(len(items))[rows]]
    else:
        parts = [dec.value(x, rows) for x in items]
    cls = NonTensorStack if node["cls"] == "nontensor" else LazyStackedTensorDict
    for part in parts:
        if not hasattr(part, "batch_size") or not hasattr(part, "is_locked"):
            raise ValueError("a tdstack item is not a TensorDict-like node")
    out = cls(*parts, stack_dim=dim)  # no parts: an empty stack (what from_list([]) makes)
    return out.lock_() if node.get("locked") else out


def _decode_njt(dec: Any, node: dict[str, Any], rows: slice | None) -> Any:
    values, offsets = dec.value(node["values"]), dec.value(node["offsets"])
    lengths = None if node.get("lengths") is None else dec.value(node["lengths"])
    ragged, sym, order = node["ragged"], node["sym"], node.get("order")
    if order is not None:  # stored in memory order: the writer's strides come back
        if len(order) != values.dim():
            raise ValueError("njt order does not match its values")
        values = values.permute([order.index(d) for d in range(len(order))])
    if values.dim() < 1 or offsets.dim() != 1 or offsets.dtype not in (torch.int64, torch.int32) \
            or not 1 <= ragged <= values.dim() or not 1 <= sym <= values.dim():
        raise ValueError("njt node with inconsistent values/offsets")
    dec.reader.flush()  # the rebuilt tensor may copy its buffers: their data first
    grad = bool(values.requires_grad)
    if grad:  # a leaf nested tensor that requires grad, not a view of a leaf that does
        values = values.detach()
    axis = ragged - 1
    bounds = offsets.tolist()
    sizes = lengths.tolist() if lengths is not None else [b - a for a, b in itertools.pairwise(bounds)]
    if len(sizes) != len(bounds) - 1 \
            or any(a < 0 or s < 0 or a + s > values.shape[axis] for a, s in zip(bounds, sizes)):
        raise ValueError("njt offsets do not fit its values")
    minimum, maximum = node.get("min"), node.get("max")
    picked = _rows_of(rows, len(sizes))
    if picked is not None:
        segments = [values.narrow(axis, bounds[i], sizes[i]) for i in picked]
        sizes = [sizes[i] for i in picked]
        values = torch.cat(segments, dim=axis) if segments else values.narrow(axis, 0, 0)
        offsets = torch.tensor([0, *np.cumsum(sizes, dtype=np.int64).tolist()], dtype=offsets.dtype)
        lengths, minimum, maximum = None, None, None
    out: Any = torch.nested.nested_tensor_from_jagged(values, offsets, lengths, jagged_dim=sym,
                                                 min_seqlen=minimum, max_seqlen=maximum)
    if out._ragged_idx != ragged:  # set after construction by the writer (verl does this)
        out._ragged_idx = ragged
    return out.requires_grad_(True) if grad else out


def finish_tensordict(td: Any, node: dict[str, Any], flush: Any) -> Any:
    """Apply a TensorDict node's recorded state: consolidated (which locks), or locked.
    ``flush`` completes deferred reads (consolidating copies the tensors' data)."""
    if node.get("consolidated"):
        flush()
        td = td.consolidate()
    if node.get("locked") and not td.is_locked:
        td.lock_()
    return td

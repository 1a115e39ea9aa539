"""Request digests: what a call asked for, by content, in a few bytes.

Dump mode records, with every step, a digest of the call that produced it (every argument but
the step); mock and check mode digest each call the same way and compare it with the recorded
one *before* serving the recorded batch (:mod:`rollout_mock.wrap.mismatch` acts on a difference).

A digest is a CRC-32 (ISA-L's, ~25 GB/s, 32 bits per node) of a canonical encoding (format 2:
:data:`REQUEST_FORMAT`), computed at memory speed: the Python work of a call is per container
along the arguments' paths and per list block, not per item, wherever the items allow it.

* Tensors and arrays: dtype, shape and raw bytes, CRC'd in place (a C-contiguous CPU tensor is
  not copied; a GPU, non-contiguous or bfloat16 tensor goes through a contiguous host copy);
  meta, sparse and nested tensors by dtype and shape only.
* Lists and tuples: their length, then their items in :func:`block_bounds` blocks, each block in
  one or two C calls where its items allow it: numbers (every one an int within int64, else a
  float) as one int64 or float64 array; plain scalars (str, bytes, int, float, bool, None) with
  one msgpack call; tensors (or arrays) by their bytes in a tight loop, their dtypes and shapes
  in one msgpack call; dicts with one key set *by column* (each key's values as one list, so a
  block of 1,024 dicts of two strings is two msgpack calls); anything else item by item.
  Numbers in a list compare as int64 or float64 values (``[1, True]`` equals ``[1, 1]``, as in
  Python; ``[0.5, 1]`` equals ``[0.5, 1.0]``).
* Mappings by their items in key order (a dict built in another order is the same request; a
  dict of plain scalars in one msgpack call), a batch type that is a mapping too (a
  ``TensorDict``, recent tensordict's) as a mapping; other registered batch types (a
  ``DataProto``) by their parts, type name and batch size; dataclasses and namespaces by their
  fields; object arrays as lists.
* Scalars, strings and bytes by value (NaN equal to NaN); enums by value; functions and classes
  by qualified name; any other object by its type name only (not compared: an object with
  ``keys()`` or ``to_dict()`` too, which the comparison engine walks).

The walk and this encoding live below wrap/, in the codec: the request record
(:func:`rollout_mock.codec.request.record_request`) folds a value read with the structural
comparison engine's dispatch and fields (:func:`~rollout_mock.codec.structure.kind_of`,
:func:`~rollout_mock.codec.structure.node_fields`), and reads a recorded node's summary back,
bounded (:func:`~rollout_mock.codec.request.read_summary`). This module keeps the model
(:class:`Request`, :class:`Node`), the volatile fields of the call's framework it passes in, and
the bounds of the record (which nodes are kept).

Left out: the step (a keyword or parameter named like it, those keys of a ``meta_info``) and the
volatile fields the call's framework adapter declares
(:func:`rollout_mock.wrap.hooks.register_volatile_fields`).
Equal values (up to dict order and volatile fields) always take the same path, so they always
digest alike; a digest does not depend on which nodes are kept.

Besides the digest of the whole request, its *structure* is recorded: the arguments, then their
fields breadth first (mappings, batch parts, dataclasses; never inside a list), down to
:data:`NODE_DEPTH`, each with its CRC and a short summary (kind, dtype, shape, the first values,
CRCs of block prefixes; a tensor by dtype, shape and digest, never its bytes). It is bounded: at
most :data:`MAX_NODES` nodes and :data:`MAX_STRUCTURE_BYTES` bytes of JSON, the shallowest
first (``match_on`` paths always); what the bound left out is counted (``dropped``). So any
path of a request of ordinary depth can be matched (``match_on: [data.a.b.c.d.e]``) and a
difference is explained at its real path with both values. Dumps of older versions kept 24
nodes to depth 4 (no ``"s"`` in their JSON: :attr:`Request.deep` is false); they replay, and a
path they did not keep is refused with the fix (re-dump). :data:`REQUEST_FORMAT` versions the
digest encoding: a request of another format is not compared (see
:mod:`rollout_mock.wrap.mismatch`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout_mock.codec.request import BLOCKS, HEAD, block_bounds, read_summary, record_request
from rollout_mock.wrap.hooks import volatile_patterns

__all__ = [
    "BLOCKS", "HEAD", "MAX_NODES", "MAX_STRUCTURE_BYTES", "NODE_DEPTH", "REQUEST_FORMAT", "STRUCTURE", "Node",
    "Request", "block_bounds", "digest_request",
]

#: ``v`` of a recorded request: the encoding digests are computed with (2: by blocks and
#: columns). A request of another format cannot be compared with this one's digests.
REQUEST_FORMAT = 2
#: Nodes kept per request (arguments first, then breadth first), besides ``match_on`` paths.
MAX_NODES = 128
#: Nodes are taken from this depth at most (``data.batch.input_ids`` is depth 3).
NODE_DEPTH = 16
#: JSON bytes of the kept nodes at most (the arguments and ``match_on`` paths always kept).
MAX_STRUCTURE_BYTES = 16_000
#: ``s`` of a recorded request whose structure is kept deep (this version); absent in the
#: requests older versions recorded (24 nodes to depth 4).
STRUCTURE = 2


@dataclass
class Node:
    """One digested value of a request: its dotted path, CRC and a short summary."""

    path: str
    digest: int
    info: dict[str, Any]


@dataclass
class Request:
    """A call's digest (:attr:`digest`), its argument names and its recorded structure, the kept
    nodes (see the module docstring). ``deep``: recorded by this version (the structure to
    :data:`NODE_DEPTH`), not an older one's 24 nodes to depth 4; ``dropped``: nodes the bound
    left out."""

    digest: int
    arguments: list[str]
    nodes: list[Node]
    deep: bool = True
    dropped: int = 0

    def to_json(self) -> dict[str, Any]:
        out = {"v": REQUEST_FORMAT, "d": self.digest, "a": self.arguments,
               "n": [[n.path, n.digest, n.info] for n in self.nodes], "s": STRUCTURE}
        if self.dropped:
            out["x"] = self.dropped
        return out

    def get(self, path: str) -> Node | None:
        """The kept node at dotted ``path`` (an argument name, ``data.batch.input_ids``), or ``None``."""
        return next((n for n in self.nodes if n.path == path), None)

    def below(self, path: str) -> list[Node]:
        """The kept nodes inside the value at ``path`` (its fields, at any depth)."""
        prefix = path + "."
        return [n for n in self.nodes if n.path.startswith(prefix)]

    def kept_everything(self) -> bool:
        """Whether every field of the call (to :data:`NODE_DEPTH`, outside lists) was kept: a
        path not among the nodes is then not in the call."""
        return self.deep and not self.dropped

    @staticmethod
    def problem(data: Any) -> str | None:
        """What makes a recorded request of this format unusable (its digest not a 32-bit CRC, its
        argument names or nodes not lists), or ``None``. Mock mode refuses such a step as corrupt:
        a malformed digest must never replay as "recorded without digests"."""
        if not isinstance(data, dict) or data.get("v") != REQUEST_FORMAT:
            return None
        digest = data.get("d")
        if type(digest) is not int or not 0 <= digest < 2**32:
            shown = f"a {type(digest).__name__}" if not isinstance(digest, int) or isinstance(digest, bool) \
                else "an int out of range"
            return f"its request digest is {shown}, not a 32-bit CRC"
        for field, what in (("a", "argument names"), ("n", "nodes")):
            if field in data and not isinstance(data[field], list):
                return f"its {what} are a {type(data[field]).__name__}, not a list"
        return None

    @staticmethod
    def format_of(data: Any) -> Any:
        """The ``v`` of a recorded request (``None`` when ``data`` is not a mapping)."""
        return data.get("v") if isinstance(data, dict) else None

    @classmethod
    def from_json(cls, data: Any) -> Request | None:
        """A recorded request, or ``None`` when ``data`` is not one of this format (a damaged or
        foreign entry, or another :data:`REQUEST_FORMAT`: :meth:`format_of` tells them apart)."""
        if not isinstance(data, dict) or data.get("v") != REQUEST_FORMAT or Request.problem(data) is not None:
            return None
        nodes: list[Node] = []
        raw = data.get("n")
        for item in raw if isinstance(raw, list) else []:
            if (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                    and type(item[1]) is int and isinstance(item[2], dict)):
                nodes.append(Node(item[0][:1000], item[1], read_summary(item[2])))
            if len(nodes) >= 4 * MAX_NODES:
                break
        raw_names = data.get("a")
        names = [a[:200] for a in raw_names[: 4 * MAX_NODES] if isinstance(a, str)] \
            if isinstance(raw_names, list) else []
        dropped = data.get("x", 0)
        return cls(data["d"], names, nodes, deep=data.get("s") == STRUCTURE,
                   dropped=dropped if type(dropped) is int and dropped >= 0 else 0)


def _node_bytes(node: Node) -> int:
    """About the JSON size of a kept node (its path, CRC and summary)."""
    return len(node.path) + 16 + len(json.dumps(node.info, default=str, separators=(",", ":")))


def digest_request(arguments: Mapping[str, Any], *, volatile: Sequence[str] | None = None,
                   forced: Sequence[str] = (), framework: str | None = None) -> Request:
    """The :class:`Request` of a call's named ``arguments`` (see
    :func:`~rollout_mock.wrap.mismatch.bind_arguments`): the codec's record of them
    (:func:`rollout_mock.codec.request.record_request`), its nodes chosen by this module's bounds.

    ``volatile``: patterns of fields left out; default: the patterns declared for ``framework``
    (:func:`~rollout_mock.wrap.hooks.volatile_patterns`; none without a framework).
    ``forced``: dotted paths kept as nodes whatever their depth (``match_on``)."""
    if volatile is None:
        volatile = volatile_patterns(framework)
    paths = frozenset(forced)
    record = record_request(arguments, volatile=volatile, forced=paths, node_depth=NODE_DEPTH, max_nodes=MAX_NODES)
    # the arguments and the match_on paths always, then breadth first within the bounds
    offered = [(depth == 1 or path in paths, Node(path, digest, info)) for depth, path, digest, info in record.nodes]
    budget = MAX_STRUCTURE_BYTES - sum(_node_bytes(node) for always, node in offered if always)
    room = max(MAX_NODES - sum(always for always, _ in offered), 0)
    chosen, dropped = [], record.skipped
    for always, node in offered:
        if not always:
            budget -= _node_bytes(node)
            if room <= 0 or budget < 0:
                room, dropped = 0, dropped + 1
                continue
            room -= 1
        chosen.append(node)
    return Request(record.digest, sorted(arguments), chosen, dropped=dropped)

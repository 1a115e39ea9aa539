"""Reading and validating the fixed prefix, container head and JSON header of format-2 files.

Everything here treats the file as hostile: every length is checked against the file size
before anything is read or allocated, the JSON parser's nesting is bounded, and
:func:`check_tree` validates every node (required fields, types, dtypes from the allow-list,
``prod(shape) * itemsize == bytes referenced``, chunk references inside the table)
and totals the raw bytes the file declares, which must stay under ``max_expansion`` times the
file size (plus 1 MiB).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from typing import Any

from rollout_mock.codec import chunks as _chunks
from rollout_mock.codec.classes import CLASS_TAGS, check_class_node
from rollout_mock.codec.layout import (
    CONTAINER_HEAD,
    DATA_MAGIC,
    HEADER_VERSIONS,
    MAX_CHUNK_RAW,
    MAX_DEPTH,
    MAX_NDIM,
    PREFIX_HEAD,
    PREFIX_LEN,
    SUFFIX,
    TORCH_DTYPES,
    numpy_dtype,
)

__all__ = ["DEFAULT_MAX_EXPANSION", "ITEM_OVERHEAD", "Layout", "check_tree", "prefix_sums", "read_layout", "ref_raw"]

#: Declared raw bytes may be at most this multiple of the file size (+1 MiB): the bound on what a
#: (compressed) file can make the reader allocate. Raise it with ``max_expansion=`` or the
#: environment variable ROLLOUT_MOCK_MAX_EXPANSION for legitimately very compressible data.
DEFAULT_MAX_EXPANSION = 64
_TAGS_WITH_DATA = {"tensor", "ndarray", "bytes", "bytearray", "pickle"}
_MAX_DIM = 1 << 48
_DEVICE = re.compile(r"(cpu|cuda|meta|mps|xpu|npu|hpu)(:[0-9]{1,4})?")


def max_expansion_default() -> float:
    try:
        return float(os.environ.get("ROLLOUT_MOCK_MAX_EXPANSION", DEFAULT_MAX_EXPANSION))
    except ValueError:
        return DEFAULT_MAX_EXPANSION


@dataclass
class Layout:
    size: int
    data_base: int  # file offset of the data section
    data_len: int
    root: Any
    table: list[list[int]]
    declared_raw: int = 0
    version: int = 2
    #: header version 4: the chunks of the msgpack body, and whether it decodes surrogate-pass
    body: list[int] | None = None
    surrogates: bool = False


def _parse_header(header: bytes | str) -> Any:
    """``json.loads`` of a hostile header, with its nesting bounded.

    The C scanner guards its own recursion (``RecursionError`` near the interpreter's limit, so
    a million ``[`` cost microseconds and no memory), and :func:`check_tree` then enforces
    :data:`MAX_DEPTH` on the parsed tree before anything recurses over it.
    """
    try:
        # decoded here, strictly: json.loads would guess UTF-16/32 for bytes that look like it
        # (and import those codecs)
        return json.loads(header.decode("utf-8") if isinstance(header, (bytes, bytearray)) else header)
    except RecursionError:
        raise ValueError(f"header nesting depth exceeds {MAX_DEPTH}") from None


def read_layout(source: Any) -> Layout:
    """Read and check prefix, container head, suffix and header; raises ValueError when bad."""
    size = source.size()
    head_end = PREFIX_LEN + CONTAINER_HEAD.size
    if size < head_end + len(SUFFIX):
        raise ValueError(f"file of {size} bytes is too short for a format-2 step")
    head = bytes(source.read_range(0, head_end))
    if head[: len(PREFIX_HEAD)] != PREFIX_HEAD:
        raise ValueError("format-2 prefix does not match")
    (container_len,) = struct.unpack_from("<Q", head, len(PREFIX_HEAD))
    if container_len != size - PREFIX_LEN - len(SUFFIX):
        raise ValueError(f"container length field {container_len} does not match the file size {size}")
    if bytes(source.read_range(size - len(SUFFIX), len(SUFFIX))) != SUFFIX:
        raise ValueError("format-2 suffix does not match (truncated file?)")
    magic, header_len, data_offset, data_len, header_crc, _ = CONTAINER_HEAD.unpack_from(head, PREFIX_LEN)
    if magic != DATA_MAGIC:
        raise ValueError(f"bad container magic {magic!r}")
    if not (CONTAINER_HEAD.size + header_len <= data_offset and data_offset + data_len == container_len):
        raise ValueError("container head offsets are inconsistent with the file size")
    header = bytes(source.read_range(head_end, header_len))
    if _chunks.crc32(header) != header_crc:
        raise ValueError("header CRC-32 mismatch")
    doc = _parse_header(header)
    if not isinstance(doc, dict) or doc.get("format") != "rollout_mock.step":
        raise ValueError("header is not a rollout_mock format-2 header")
    if doc.get("version") not in HEADER_VERSIONS:
        version = doc.get("version")
        if type(version) is int and version > max(HEADER_VERSIONS):
            raise ValueError(f"the step header has version {version}: it was written by a newer "
                             f"rollout_mock (this one reads {list(HEADER_VERSIONS)}); upgrade rollout_mock")
        raise ValueError(f"the step header has an unknown version {version!r:.20}")
    table = doc.get("chunks")
    if not isinstance(table, list):
        raise ValueError("header has no chunk table")
    for entry in table:
        _check_chunk(entry, data_len)
    body = doc.get("body")
    if body is not None:
        if doc["version"] < 4:
            raise ValueError("a body in a header older than version 4")
        ref_raw(table, body)
        if any(table[i][4] != 0 for i in range(body[0], body[0] + body[1])):
            raise ValueError("the body is stored compressed")
    if doc.get("sp", False) is not True and "sp" in doc:
        raise ValueError("bad sp flag")
    return Layout(size, PREFIX_LEN + data_offset, data_len, doc.get("root"), table, version=doc["version"],
                  body=body, surrogates=bool(doc.get("sp")))


def _int(value: Any, lo: int = 0, hi: int = 1 << 62) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise ValueError(f"expected an integer in [{lo}, {hi}], got {value!r:.80}")
    return value


def _check_chunk(entry: Any, data_len: int) -> None:
    if type(entry) is not list or len(entry) != 6:
        raise ValueError("bad chunk table entry")
    offset, stored, raw, _crc, codec, shuf = entry
    _int(offset), _int(stored), _int(raw, 0, MAX_CHUNK_RAW), _int(_crc, 0, 0xFFFFFFFF)
    if offset + stored > data_len:
        raise ValueError(f"chunk [{offset}, +{stored}) lies outside the data section ({data_len} bytes)")
    _int(codec, 0, 2)
    _int(shuf, 0, 16)
    if codec == 0 and (stored != raw or shuf):
        raise ValueError("uncompressed chunk whose stored size differs from its raw size")
    if shuf and (shuf < 2 or raw % shuf):
        raise ValueError("bad shuffle item size")


def _shape(value: Any) -> list[int]:
    if type(value) is not list or len(value) > MAX_NDIM:
        raise ValueError(f"bad shape {value!r:.80}")
    return [_int(d, 0, _MAX_DIM) for d in value]


def prefix_sums(table: list[list[int]]) -> list[int]:
    """``sums[i]`` = raw bytes of chunks ``0..i-1``: any reference's size in O(1) (a header
    with many references to long chunk runs costs linear time, not references x run length)."""
    sums = [0]
    for row in table:
        sums.append(sums[-1] + row[2])
    return sums


def ref_raw(table: list[list[int]] | list[int], ref: Any, sums: list[int] | None = None) -> int:
    """Raw bytes a ``[first, count]`` reference covers (``sums``: :func:`prefix_sums` of the table)."""
    if type(ref) is not list or len(ref) != 2:
        raise ValueError("bad chunk reference")
    first, count = _int(ref[0]), _int(ref[1])
    size = len(table) if sums is None else len(sums) - 1
    if first + count > size:
        raise ValueError(f"chunk reference [{first}, +{count}) outside the table ({size} chunks)")
    if sums is None:
        sums = prefix_sums(table)  # type: ignore[arg-type]
    return sums[first + count] - sums[first]


#: Memory a decoded JSON item may take beyond its text (a str object's head and the list slot):
#: object arrays whose items live in a JSON chunk count this per item against the bound.
ITEM_OVERHEAD = 64


def _node_list(node: dict[str, Any], name: str) -> list[Any]:
    value = node.get(name)
    if type(value) is not list:
        raise ValueError(f"{node.get('$')} node without a {name} list")
    return value


def _pairs(node: dict[str, Any], name: str) -> list[Any]:
    items = _node_list(node, name)
    for pair in items:
        if type(pair) is not list or len(pair) != 2:
            raise ValueError(f"{node.get('$')} node with a bad item")
    return items


def check_tree(root: Any, table: list[list[int]], *, used: list[int] | None = None, body: int = -1) -> int:
    """Validate every node; returns the raw bytes the tree references (plus the memory its string
    columns and JSON items may take). ``used``: chunk references counted so far (updated; a
    step references each chunk once); ``body``: the body's size (version 4; -1: ``mp`` nodes
    are refused, as inside a body's own node extensions)."""
    total = 0
    refs = used[0] if used else 0
    body_used = 0
    sums = prefix_sums(table)
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        kind = type(node)
        if node is None or kind in (bool, int, str):
            continue
        if kind is float:
            if not math.isfinite(node):
                raise ValueError("non-finite float outside a float node")
            continue
        if depth >= MAX_DEPTH:  # the (MAX_DEPTH + 1)-th nested list or object
            raise ValueError(f"node nesting deeper than {MAX_DEPTH}")
        if kind is list:
            stack.extend((x, depth + 1) for x in node)
            continue
        if kind is not dict:
            raise ValueError(f"unexpected JSON value {node!r:.40}")
        tag = node.get("$")
        if tag is None:
            stack.extend((x, depth + 1) for x in node.values())
            continue
        if tag == "mp":
            if body < 0:
                raise ValueError("body value outside a version-4 header")
            body_used += _int(node.get("n"))
            if _int(node.get("o")) + node["n"] > body or body_used > body:
                raise ValueError("body values overlap or lie outside the body")
            continue
        if tag == "strs":
            count = math.prod(_shape(node.get("shape")))
            if ref_raw(sums, node.get("o"), sums) != 8 * (count + 1) or count == 0:
                raise ValueError("string column offsets do not match its shape")
            total += ref_raw(sums, node.get("c"), sums) + 8 * (count + 1) + ITEM_OVERHEAD * count
            refs += node["c"][1] + node["o"][1]
            if refs > len(table):
                raise ValueError("chunks are referenced more than once")
            continue
        children = _check_tagged(node, tag, sums)
        if (tag in _TAGS_WITH_DATA or tag == "objarray") and "c" in node:
            total += ref_raw(sums, node["c"], sums)
            if tag == "objarray":  # the Python objects its JSON items become
                total += ITEM_OVERHEAD * math.prod(node["shape"])
            refs += node["c"][1]
            if refs > len(table):  # writers reference every chunk once: decoding stays linear
                raise ValueError("chunks are referenced more than once (the header references "
                                 f"more than the {len(table)} chunks of its table)")
        stack.extend((x, depth + 1) for x in children)
    if used is not None:
        used[0] = refs
    return total


def _check_tagged(node: dict[str, Any], tag: Any, sums: list[int]) -> list[Any]:
    if tag in ("tuple", "set", "frozenset", "deque", "slice", "size"):
        values = _node_list(node, "v")
        if tag == "size":
            [_int(d, 0, _MAX_DIM) for d in values]
        if tag == "slice" and len(values) != 3:
            raise ValueError("bad slice node")
        if tag == "deque" and node.get("maxlen") is not None:
            _int(node["maxlen"])
        return values
    if tag in ("map", "odict", "counter", "defaultdict"):
        if tag == "defaultdict" and node.get("factory") not in (
                None, "list", "dict", "set", "int", "float", "str", "tuple"):
            raise ValueError("bad defaultdict factory")
        return [x for pair in _pairs(node, "items") for x in pair]
    if tag == "tensor":
        dtype = node.get("dtype")
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"torch dtype {dtype!r:.40} is not allowed")
        shape = _shape(node.get("shape"))
        itemsize = TORCH_DTYPES[dtype].itemsize
        if math.prod(shape) * itemsize != ref_raw(sums, node.get("c"), sums):
            raise ValueError(f"tensor of shape {shape} and dtype {dtype} does not match its data size")
        return []
    if tag == "ndarray":
        dtype = numpy_dtype(node.get("dtype"))
        shape = _shape(node.get("shape"))
        if math.prod(shape) * dtype.itemsize != ref_raw(sums, node.get("c"), sums):
            raise ValueError(f"array of shape {shape} and dtype {dtype} does not match its data size")
        return []
    if tag == "objarray":
        shape = _shape(node.get("shape"))
        if "c" in node and "items" not in node:  # items in a JSON data chunk (header version 3)
            ref_raw(sums, node["c"], sums)
            return []
        items = _node_list(node, "items")
        if math.prod(shape) != len(items):
            raise ValueError("object array shape does not match its item count")
        return items
    if tag in ("bytes", "bytearray", "pickle"):
        if "c" in node:
            ref_raw(sums, node["c"], sums)
        elif tag == "pickle" or type(node.get("hex")) is not str:
            raise ValueError(f"{tag} node without data")
        return []
    if tag == "tensordict":
        _shape(node.get("batch_size"))
        names = node.get("names")
        if names is not None and (type(names) is not list or any(n is not None and type(n) is not str for n in names)):
            raise ValueError("bad tensordict names")
        if node.get("device") not in (None, "cpu"):
            raise ValueError("bad tensordict device")
        if any(type(node.get(k, False)) is not bool for k in ("locked", "consolidated")):
            raise ValueError("bad tensordict state")
        pairs = _pairs(node, "items")
        if any(type(k) is not str for k, _ in pairs):
            raise ValueError("tensordict keys must be strings")
        return [v for _, v in pairs]
    if tag == "batch":
        if node.get("kind") not in ("dataproto", "object") or type(node.get("class")) is not str \
                or node.get("layout") not in ("public", "private", "dict"):
            raise ValueError("bad batch node")
        extra = _pairs(node, "extra")
        if any(type(k) is not str for k, _ in extra):
            raise ValueError("batch attribute names must be strings")
        names = ("batch", "non_tensor_batch", "meta_info") if node["kind"] == "dataproto" else ()
        fields = [node.get(n) for n in names]
        return fields + [v for _, v in extra]
    if tag == "nested":
        if node.get("layout") not in ("strided", "jagged"):
            raise ValueError("bad nested layout")
        return _node_list(node, "items")
    if tag in CLASS_TAGS:  # classes.py
        return check_class_node(node, tag, _shape)
    if tag in ("int", "float", "npscalar", "complex", "device", "dtype", "range", "datetime", "date",
               "time", "timedelta"):
        return _check_scalar(node, tag)
    raise ValueError(f"unknown node tag {tag!r:.40}")


def _check_scalar(node: dict[str, Any], tag: str) -> list[Any]:
    if tag == "int":
        if type(node.get("v")) is not str or len(node["v"]) > 4300:
            raise ValueError("bad int node")
    elif tag == "float" or tag == "npscalar":
        text = node.get("hex")
        if type(text) is not str or len(text) > 64:
            raise ValueError(f"bad {tag} node")
        if tag == "float" and len(text) != 16:
            raise ValueError("bad float node")
        if tag == "npscalar" and numpy_dtype(node.get("dtype")).itemsize * 2 != len(text):
            raise ValueError("numpy scalar size mismatch")
    elif tag == "complex":
        return [node.get("re"), node.get("im")]
    elif tag == "device":
        if type(node.get("v")) is not str or not _DEVICE.fullmatch(node["v"]):
            raise ValueError("bad device")
    elif tag == "dtype":
        if node.get("v") not in TORCH_DTYPES:
            raise ValueError("bad dtype")
    elif tag in ("range", "timedelta"):
        values = node.get("v")
        if type(values) is not list or len(values) != 3 or any(type(v) is not int for v in values):
            raise ValueError(f"bad {tag} node")
    elif type(node.get("iso")) is not str or len(node["iso"]) > 64:
        raise ValueError(f"bad {tag} node")
    return []

"""The step-file format: its byte layout, constants, chunk payloads, the grammar of its header and
of its JSON item chunks (:func:`parse_items`), and the bound on keys that share a hash
(:func:`check_keys`), which every decoder of maps and sets keeps.

Format 2 (written since format_version 2 of the manifest)
=========================================================

A step file is a fixed prefix, a container and a fixed suffix::

    prefix    b"\\x80\\x05" b"crollout_mock.codec\\n_load_v2\\n" b"\\x8e" <u64 LE container length>
    container magic b"RMSTEP\\x00\\x02", u64 header length, u64 data offset, u64 data length,
              u32 CRC-32 of the header, u32 reserved; the JSON header; zero padding; the data
              section (chunks, each starting at a file offset that is a multiple of 64)
    suffix    b"\\x85R."

The prefix and suffix make the file a valid pickle too (PROTO 5, GLOBAL, BINBYTES8 ... TUPLE1,
REDUCE, STOP): ``pickle.load`` calls ``rollout_mock.codec._load_v2`` on the container, which runs
the same safe decoder. The safe reader never runs pickle: it checks the prefix bytes, the length
field against the file size, the suffix, the header CRC, then parses the container itself.

The header is ``{"format": "rollout_mock.step", "version": 2, "root": NODE, "chunks": TABLE}``.
``TABLE`` rows are ``[offset, stored, raw, crc32, codec, shuffle]``: offset/stored locate the chunk
in the data section, ``raw`` is its decoded size (at most 64 MiB; writers use 4 MiB, aligned to
whole rows), ``crc32`` is of the stored bytes, ``codec`` is 0 none / 1 zstd / 2 lz4 and
``shuffle`` the itemsize the bytes were shuffled by (0: not shuffled). A ``NODE`` is a JSON value:
``null``/bools/strings/finite floats/ints under 2**63 are themselves, JSON arrays are lists, JSON
objects without a ``"$"`` key are str-keyed dicts; other values are tagged objects ``{"$": TAG,
...}``: ``tuple``/``set``/``frozenset``/``deque`` (``v``), ``map``/``odict``/``counter``/
``defaultdict`` (``items``: key/value node pairs), ``int`` (decimal string), ``float`` (IEEE bits
in hex: non-finite values), ``complex``, ``bytes``/``bytearray`` (``hex`` inline or ``c``),
``npscalar``, ``size``/``device``/``dtype``, ``slice``/``range``, ``datetime``/``date``/``time``/
``timedelta``, ``tensor`` (``dtype``, ``shape``, ``c`` = ``[first chunk, count]``, ``param``,
``cuda``: the index of the CUDA device it was recorded on, absent for other devices and in files
written before it was recorded; files written before 0.1 may say ``grad``, which is ignored: a
step holds data, not autograd state), ``ndarray`` (numpy ``dtype`` string, ``shape``, ``c``, ``ro``), ``objarray``
(``shape``, and ``items``, or ``c``: a JSON data chunk of plain scalars, header version 3),
``nested`` (a ``torch.nested`` tensor's components and layout), the node of a class made of
parts (``items``: keyed or listed part nodes, or ``data``: one, beside plain head keys; tags
``tensordict``, ``nontensor``, ``tdstack``), written and checked by the description its adapter
registers (:class:`rollout_mock.batch.KeyedCodec`),
``batch`` (a DataProto-like object: ``kind``, the writer's
``class`` as ``module:qualname`` (information only), ``layout``, ``batch``/``non_tensor_batch``/
``meta_info`` nodes, ``extra`` attributes; see :mod:`~rollout_mock.codec.classes`) and ``pickle``
(an opaque cloudpickle blob for anything that is not data; only a trusted load unpickles it).

Header version 4 (written now; 2 and 3 keep loading) keeps only the batch's structure in the
JSON header: plain Python values live in one msgpack *body* (``"body": [first, count]``, nodes
``{"$": "mp", "o", "n"}``; the extension types are the ``EXT_*`` constants below), object arrays
of strings are string columns (``{"$": "strs"}``), tensors under 1 MiB inside the body share
4 MiB chunks, and the structural-class tags of :data:`CLASS_TAGS` (numpy string scalars,
jagged nested tensors) and the class keys of registered descriptions may appear.

Decoding bounds (hostile files): every offset and length inside the data section; tensors and
arrays need ``prod(shape) * itemsize`` == the raw bytes they reference; dtypes from fixed
allow-lists (no object/void/structured raw arrays); decompression never exceeds the declared raw
size; the total declared raw bytes stay under ``max_expansion`` (default 64, env
``ROLLOUT_MOCK_MAX_EXPANSION``) times the file size + 1 MiB; JSON nesting at most 96; no tensor is
ever backed by uninitialised memory; the format has no shared references.

Format 1 (older dumps) is a protocol-5 pickle (:data:`PROTOCOL`); the safe path reads it with a
data-only opcode interpreter (:mod:`~rollout_mock.codec.legacy`). Format-1 files reference
``rollout_mock.codec._rebuild_*``: those names stay (:mod:`~rollout_mock.codec.trusted`).

Everything here treats a file as hostile: :func:`read_layout` checks every length against the
file size before anything is read or allocated, the JSON parser's nesting is bounded, and
:func:`check_tree` validates every node (required fields, types, dtypes from the allow-list,
``prod(shape) * itemsize == bytes referenced``, chunk references inside the table) and totals the
raw bytes the file declares.
"""

from __future__ import annotations

import collections
import json
import json.decoder
import math
import os
import re
import struct
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

import rollout_mock.crc as _crc
from rollout_mock.batch import keyed_codec_of_tag
from rollout_mock.errors import ConfigError, MissingExtraError

__all__ = [
    "ALIGN", "BODY_VERSION", "CHUNK_BYTES", "CLASS_TAGS", "CLASS_VERSION", "CODECS", "CONTAINER_HEAD",
    "DATA_MAGIC", "DEFAULT_MAX_EXPANSION", "EXT_FROZENSET", "EXT_INT", "EXT_NDARRAY", "EXT_NODE", "EXT_OBJARRAY",
    "EXT_SET", "EXT_TENSOR", "EXT_TUPLE", "FORMAT_VERSION", "FileSink", "HEADER_VERSIONS", "ITEM_OVERHEAD",
    "JSON_ITEMS_MIN", "MAX_CHUNK_RAW", "MAX_COLLISIONS", "MAX_DEPTH", "MAX_NDIM", "PACK_ALIGN", "PARALLEL_BYTES",
    "PREFIX", "PREFIX_HEAD", "PREFIX_LEN", "PROTOCOL", "SMALL_BYTES", "SUFFIX", "KeyBudget", "Sink", "TENSOR_HEAD",
    "TORCH_DTYPES", "TORCH_DTYPE_NAMES", "Layout",
    "array_head", "check_keys", "check_shape", "check_tree", "compress", "crc32", "decompress", "max_expansion",
    "needs_class_version",
    "numpy_dtype", "parse_items", "pool", "prefix_sums", "read_layout", "ref_raw", "write_container",
]

# --------------------------------------------------------------------------- constants
FORMAT_VERSION = 2
#: The pickle protocol of format-1 step files (fixed, so files do not depend on the writer's Python).
PROTOCOL = 5
#: The header's ``version``: 2, 3 (an object array's items as a JSON data chunk,
#: ``{"$": "objarray", "shape": [...], "c": [first, count]}``) or 4 (the msgpack body).
HEADER_VERSIONS = (2, 3, 4)
BODY_VERSION = 4
#: Header version of files that use the structural-class tags (:data:`CLASS_TAGS`) and the
#: ``class_keys`` of a registered description (:class:`rollout_mock.batch.KeyedCodec`): an older
#: reader refuses such a file with "written by a newer rollout_mock" instead of silently losing
#: the state.
CLASS_VERSION = 4
CLASS_TAGS = frozenset({"npstr", "npbytes", "njt"})
#: Header version 3: object arrays of at least this many plain JSON items (strings, numbers,
#: booleans, None) keep their items in a data chunk.
JSON_ITEMS_MIN = 32
#: PROTO 5, GLOBAL rollout_mock.codec._load_v2, BINBYTES8 <u64 little-endian container length>.
PREFIX_HEAD = b"\x80\x05crollout_mock.codec\n_load_v2\n\x8e"
PREFIX_LEN = len(PREFIX_HEAD) + 8
#: TUPLE1, REDUCE, STOP: ``pickle.load`` calls ``_load_v2(container_bytes)``.
SUFFIX = b"\x85R."
#: Container: magic, u64 header length, u64 data offset (from the container start), u64 data
#: length, u32 CRC-32 of the header JSON, u32 reserved (0).
DATA_MAGIC = b"RMSTEP\x00\x02"
CONTAINER_HEAD = struct.Struct("<8sQQQII")
ALIGN = 64
#: Writer's chunk size (raw bytes); the reader accepts chunks up to MAX_CHUNK_RAW.
CHUNK_BYTES = 4 << 20
MAX_CHUNK_RAW = 64 << 20
#: Maximum JSON nesting of the header (each tagged node adds one or two levels).
MAX_DEPTH = 96
MAX_NDIM = 32
_MAX_DIM = 1 << 48

#: Body extension types (header version 4): marked arrays (tuple, set, frozenset, numpy object
#: array: ``[ExtType(k, b""), ...]``), an int beyond 64 bits (signed little-endian bytes), a
#: tensor and a numeric numpy array (:data:`TENSOR_HEAD` + dims [+ numpy dtype string]), and a
#: version-2 node (msgpack of the node) for anything else.
EXT_TUPLE, EXT_INT, EXT_SET, EXT_FROZENSET, EXT_TENSOR, EXT_OBJARRAY, EXT_NDARRAY, EXT_NODE = 1, 2, 3, 4, 5, 6, 7, 8
#: dtype code (index in :data:`TORCH_DTYPE_NAMES`), flags (2 Parameter, 4 read-only array, 8 recorded
#: on a CUDA device; 1 was requires_grad, ignored), ndim, the CUDA device index (flag 8; else 0),
#: first chunk, chunk count, byte offset. Readers ignore flags and the fourth byte they do not know.
TENSOR_HEAD = struct.Struct("<BBBBIIQ")
#: Tensors and arrays smaller than this share chunks with their neighbours (64-byte aligned).
SMALL_BYTES = 1 << 20
PACK_ALIGN = 64


def PREFIX(container_length: int) -> bytes:  # noqa: N802 - reads like a constant
    return PREFIX_HEAD + struct.pack("<Q", container_length)


def array_head(n: int) -> bytes:
    """msgpack's array header for ``n`` items (a string column's data starts with it)."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


#: Append-only: a tensor's dtype code in a version-4 body is its index here.
TORCH_DTYPE_NAMES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
)
#: The torch dtypes a step file may hold (plain numeric types; no quantized or bit types).
TORCH_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in TORCH_DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)
}

_NUMPY_DTYPE = re.compile(
    r"[<>|=]?(b1|[iu][1248]|f(2|4|8|16)|c(8|16|32)|[mM]8(\[[0-9]*[a-zA-Z]{1,2}\])?|[SU][0-9]{1,6})")


def numpy_dtype(text: object) -> np.dtype:
    """A numpy dtype from the allow-list (no object, void or structured dtypes); ValueError else."""
    if not isinstance(text, str) or not _NUMPY_DTYPE.fullmatch(text):
        raise ValueError(f"numpy dtype {text!r} is not allowed in step files")
    dtype = np.dtype(text)
    if dtype.hasobject or dtype.fields is not None or dtype.itemsize == 0:
        raise ValueError(f"numpy dtype {text!r} is not allowed in step files")
    return dtype


# --------------------------------------------------------------------------- the codec's threads
#: Steps (or tensors) at least this large are processed chunk by chunk on two threads: chunk
#: reads, compression and CRC-32 release the GIL, so large steps use both cores of a small
#: machine (and two of a big one, leaving the rest to training).
PARALLEL_BYTES = 8 << 20
_POOL: ThreadPoolExecutor | None = None


def pool() -> ThreadPoolExecutor:
    """The codec's shared two-thread pool (created on first use)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rollout-mock-codec")
    return _POOL


_DECODER: ThreadPoolExecutor | None = None


def decoder_thread() -> ThreadPoolExecutor:
    """The codec's one thread for the decodes that build a load's strings (string columns, on
    the caller's behalf while it checks their CRC): one glibc arena then holds the strings of
    every load and reuses their memory from load to load. On the two-thread pool each thread's
    arena grew and shrank by a column in turn (verl: 4,700 pages faulted in again every other
    load, 3.5 -> 15 ms for that column). msgpack holds the GIL while it decodes: a second thread
    would not decode at the same time anyway."""
    global _DECODER
    if _DECODER is None:
        _DECODER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-mock-decode")
    return _DECODER


# --------------------------------------------------------------------------- the allocation bound
#: Declared raw bytes may be at most this multiple of the file size (+1 MiB): the bound on what a
#: (compressed) file can make the reader allocate. Raise it with ``max_expansion=`` or the
#: environment variable ROLLOUT_MOCK_MAX_EXPANSION for legitimately very compressible data.
DEFAULT_MAX_EXPANSION = 64
EXPANSION_ENV = "ROLLOUT_MOCK_MAX_EXPANSION"


def max_expansion(value: float | None = None) -> float:
    """The allocation bound to apply: ``value`` if given, else ``$ROLLOUT_MOCK_MAX_EXPANSION``,
    else :data:`DEFAULT_MAX_EXPANSION`. Either must be a finite number > 0: anything else (``nan``,
    ``inf``, ``0``, ``-1``, ``"lots"``) would switch the bound off or refuse every file, so it is a
    :class:`~rollout_mock.errors.ConfigError` naming where it came from."""
    text: object
    if value is not None:
        where, text = "max_expansion=", value
    else:
        raw = os.environ.get(EXPANSION_ENV)
        if raw is None or raw.strip() == "":
            return DEFAULT_MAX_EXPANSION
        where, text = f"the environment variable {EXPANSION_ENV}", raw
    try:
        number = float(text) if isinstance(text, (int, float, str)) and not isinstance(text, bool) else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(f"[RolloutMock] {where} is {text!r:.40}: it must be a finite number greater "
                          f"than 0 (the default is {DEFAULT_MAX_EXPANSION}: a step may declare at most that "
                          f"many times its file size + 1 MiB of data)")
    return number


# --------------------------------------------------------------------------- chunk payloads
# Every chunk carries the CRC-32 (zlib's polynomial; ISA-L when installed, else zlib) of its
# *stored* bytes, so corruption is caught before a decompressor sees the data. Compression (zstd
# or lz4, extra ``rollout_mock[compress]``) is per chunk; multi-byte dtypes are byte-shuffled first
# (all first bytes, then all second bytes, ...) when that makes the chunk smaller. Decompression
# never produces more than the chunk's declared raw size.

#: Codec ids as stored in the chunk table.
CODECS: dict[str, int] = {"none": 0, "zstd": 1, "lz4": 2}


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 of a chunk (:func:`rollout_mock.crc.crc32`: ISA-L when installed, else zlib)."""
    return _crc.crc32(data, value) & 0xFFFFFFFF


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:
        raise MissingExtraError(
            "zstd compression needs the zstandard package: pip install 'rollout_mock[compress]'"
        ) from None
    return zstandard


def _lz4() -> Any:
    try:
        import lz4.block
    except ImportError:
        raise MissingExtraError(
            "lz4 compression needs the lz4 package: pip install 'rollout_mock[compress]'"
        ) from None
    return lz4.block


def require_compression(codec: str) -> None:
    """Check that ``codec`` (``none``, ``zstd``, ``lz4``) can be written here: ValueError for
    an unknown name, :class:`~rollout_mock.errors.MissingExtraError` when its package is missing."""
    if codec not in CODECS:
        raise ValueError(f"unknown compression {codec!r}; choose one of {sorted(CODECS)}")
    if codec == "zstd":
        _zstd()
    elif codec == "lz4":
        _lz4()


def shuffle(raw: memoryview, itemsize: int) -> bytes:
    array = np.frombuffer(raw, dtype=np.uint8)
    return array.reshape(-1, itemsize).T.tobytes()


def unshuffle(data: Any, itemsize: int) -> bytes:
    array = np.frombuffer(data, dtype=np.uint8)
    return array.reshape(itemsize, -1).T.tobytes()


def compress(raw: memoryview, codec: str, itemsize: int) -> tuple[Any, int, int]:
    """Compress one chunk. Returns (stored bytes, codec id, shuffle itemsize or 0).

    Falls back to storing the raw bytes when compression does not pay. ``itemsize`` 0 marks a
    chunk that is never compressed (a version-4 body: its decoded size bounds the decoder's work).
    """
    if codec == "none" or raw.nbytes < 256 or itemsize == 0:
        return raw, 0, 0
    if codec not in CODECS:
        raise ValueError(f"unknown compression {codec!r}; choose one of {sorted(CODECS)}")
    candidates = [(raw, 0)]
    if itemsize > 1 and raw.nbytes % itemsize == 0:
        candidates.append((memoryview(shuffle(raw, itemsize)), itemsize))
    best: tuple[Any, int, int] = (raw, 0, 0)
    best_len = raw.nbytes * 0.9  # compress only when it saves at least 10%
    for data, shuf in candidates:
        if codec == "zstd":
            packed = _zstd().ZstdCompressor(level=3, write_content_size=True).compress(data)
        else:
            packed = _lz4().compress(data, store_size=False)
        if len(packed) < best_len:
            best, best_len = (packed, CODECS[codec], shuf), len(packed)
    return best


def decompress(stored: Any, codec_id: int, shuf: int, raw_size: int) -> Any:
    """Inverse of :func:`compress`; raises ValueError when the data does not fit ``raw_size``."""
    if codec_id == 0:
        if shuf:
            raise ValueError("shuffled chunk stored without compression")
        if len(memoryview(stored)) != raw_size:
            raise ValueError("stored size differs from raw size")
        return stored
    if codec_id == 1:
        zstandard = _zstd()
        declared = zstandard.frame_content_size(bytes(stored[:18]) if len(stored) > 18 else bytes(stored))
        if declared != raw_size:
            raise ValueError(f"zstd frame declares {declared} bytes, chunk table says {raw_size}")
        out = zstandard.ZstdDecompressor().decompress(stored, max_output_size=raw_size)
    elif codec_id == 2:
        out = _lz4().decompress(stored, uncompressed_size=raw_size)
    else:
        raise ValueError(f"unknown codec id {codec_id}")
    if len(out) != raw_size:
        raise ValueError(f"chunk decompressed to {len(out)} bytes, expected {raw_size}")
    if shuf:
        if shuf < 2 or raw_size % shuf:
            raise ValueError("bad shuffle item size")
        out = unshuffle(out, shuf)
    return out


# --------------------------------------------------------------------------- the container and its header
_TAGS_WITH_DATA = {"tensor", "ndarray", "bytes", "bytearray", "pickle"}
_DEVICE = re.compile(r"(cpu|cuda|meta|mps|xpu|npu|hpu)(:[0-9]{1,4})?")


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
    if crc32(header) != header_crc:
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


def check_shape(value: Any) -> list[int]:
    """A shape of a node (a list of at most MAX_NDIM sizes), else ValueError."""
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
            count = math.prod(check_shape(node.get("shape")))
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
        shape = check_shape(node.get("shape"))
        itemsize = TORCH_DTYPES[dtype].itemsize
        if math.prod(shape) * itemsize != ref_raw(sums, node.get("c"), sums):
            raise ValueError(f"tensor of shape {shape} and dtype {dtype} does not match its data size")
        if "cuda" in node:
            _int(node["cuda"], 0, 1 << 16)
        return []
    if tag == "ndarray":
        dtype = numpy_dtype(node.get("dtype"))
        shape = check_shape(node.get("shape"))
        if math.prod(shape) * dtype.itemsize != ref_raw(sums, node.get("c"), sums):
            raise ValueError(f"array of shape {shape} and dtype {dtype} does not match its data size")
        return []
    if tag == "objarray":
        shape = check_shape(node.get("shape"))
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
        return _check_class_node(node, tag)
    if tag in ("int", "float", "npscalar", "complex", "device", "dtype", "range", "datetime", "date",
               "time", "timedelta"):
        return _check_scalar(node, tag)
    keyed = keyed_codec_of_tag(tag)  # a registered class made of parts (a TensorDict, its non-tensor data)
    if keyed is not None:
        keyed.check(node)
        return keyed.children(node)
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


# --------------------------------------------------------------------------- writing the container
@runtime_checkable
class Sink(Protocol):
    """Takes the step's bytes in order; returns how many it took (or None: all of them)."""

    def write(self, data: Any) -> int | None: ...


@runtime_checkable
class FileSink(Protocol):
    """A checksumming sink with ranged writes (a local file:
    :class:`~rollout_mock.storage.digest.HashingWriter`); see the module docstring."""

    #: the running checksum (``update``, ``update_known``) the body's chunk CRCs are fed to
    #: when written head last
    digest: Any

    def write(self, data: Any) -> int: ...

    def write_vector(self, pieces: list[tuple[Any, int | None]]) -> int:
        """Write ``(data, crc or None)`` pieces in order in one call; a given CRC is trusted."""
        ...

    def write_known(self, data: Any, crc: int) -> int:
        """Write ``data`` whose CRC-32 the caller computed already."""
        ...

    def reserve_head(self, length: int) -> bool:
        """Leave ``length`` bytes for a head written last; False if the sink cannot."""
        ...

    def write_unhashed(self, data: Any) -> int:
        """Write body bytes whose CRCs the caller will hand to :meth:`write_head`'s digest."""
        ...

    def write_head(self, data: Any) -> None:
        """Write the reserved head (after the body)."""
        ...


_WIDEST_CRC = 0xFFFFFFFF  # ten digits: the header's room for any CRC-32


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _header(root_json: bytes, table: list[list[int]], version: int, extra: bytes) -> bytes:
    """The JSON header (``root_json``: the root serialised once, even when the header is built
    twice: it can hold megabytes of strings for large version-2 batches)."""
    return b'{"format":"rollout_mock.step","version":%d,"root":%s,"chunks":%s%s}' % (
        version, root_json, _dumps(table), extra)


def _pad(n: int) -> int:
    return (-n) % ALIGN


class DeferredChunk:
    """A chunk whose bytes are made only as it is written: its size is known up front, its bytes
    are put into a buffer the writer reuses (a slice of a string column: packing a column of
    18 MB into fresh memory is mostly the kernel faulting in and zeroing 4,600 new pages).

    ``make(out)`` fills ``out`` (a writable byte memoryview of exactly ``nbytes``)."""

    __slots__ = ("make", "nbytes")

    def __init__(self, nbytes: int, make: Callable[[memoryview], None]) -> None:
        self.nbytes = nbytes
        self.make = make

    def materialized(self) -> memoryview:
        """The bytes in memory of their own (what a writer that keeps its pieces is given)."""
        out = np.empty(self.nbytes, np.uint8).data.cast("B")
        self.make(out)
        return out


class _MakeBuffers:
    """The writers' reused buffers of :class:`DeferredChunk` bytes (:data:`CHUNK_BYTES` each,
    resident after their first use), two per writing thread (one is filled while the codec's
    thread checksums the other); at most :data:`MAKE_BUFFERS` kept between writes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []

    def take(self) -> np.ndarray:
        with self._lock:
            return self._free.pop() if self._free else np.empty(CHUNK_BYTES, np.uint8)

    def give(self, buffers: list[np.ndarray]) -> None:
        with self._lock:
            self._free.extend(buffers[: max(0, MAKE_BUFFERS - len(self._free))])


#: Buffers of :class:`DeferredChunk` bytes kept between writes.
MAKE_BUFFERS = 4
_MADE = _MakeBuffers()


def _forked_child() -> None:
    """In a forked child (a DataLoader worker, a fork-started process) none of the parent's
    threads exist: the codec's executors are made anew on first use (the parent's would queue a
    load's work for threads that are gone, and wait forever), and so are the writers' buffers
    (their lock may have been held by a parent thread at the fork)."""
    global _POOL, _DECODER, _MADE
    _POOL = _DECODER = None
    _MADE = _MakeBuffers()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)


def write_container(root: Any, chunks: list[tuple[Any, int]], file: Any, *, version: int = BODY_VERSION,
                    body: list[int] | None = None, surrogates: bool = False, compression: str = "none",
                    checksums: bool = True) -> int:
    """Write a step file: the prefix, the container (head, JSON header of ``root``, the chunk table,
    ``chunks`` as ``(raw bytes, itemsize for shuffling)``) and the suffix, to ``file`` (a
    :class:`Sink` or :class:`FileSink`); returns the bytes written. The mirror of
    :func:`read_layout`. ``body``: header version 4's body reference; ``checksums=False`` writes 0
    for every chunk's CRC-32 (a step that never leaves the process and is opened without
    verification); the header's own CRC is always written."""
    extra = b""
    if body is not None:
        extra = b',"body":%s' % _dumps(body)
    if surrogates:
        extra += b',"sp":true'
    root_json = _dumps(root)
    if compression == "none" and checksums:
        written = _write_head_last(root_json, chunks, version, extra, file)
        if written is not None:
            return written
    chunks = [(raw.materialized() if isinstance(raw, DeferredChunk) else raw, itemsize) for raw, itemsize in chunks]

    def prepare(chunk: tuple[Any, int]) -> tuple[Any, int, int, int]:
        raw, itemsize = chunk
        data, codec_id, shuf = compress(raw, compression, itemsize)
        return data, codec_id, shuf, crc32(data) if checksums else 0

    # compression and CRC-32 release the GIL: large steps use both cores
    if checksums and len(chunks) > 1 and sum(raw.nbytes for raw, _ in chunks) >= PARALLEL_BYTES:
        prepared = list(pool().map(prepare, chunks))
    else:
        prepared = [prepare(chunk) for chunk in chunks]
    table: list[list[int]] = []
    stored: list[Any] = []
    offset = 0
    for (raw, _itemsize), (data, codec_id, shuf, crc) in zip(chunks, prepared, strict=True):
        size = len(memoryview(data).cast("B")) if not isinstance(data, bytes) else len(data)
        table.append([offset, size, raw.nbytes, crc, codec_id, shuf])
        stored.append(data)
        offset += size + _pad(size)
    header = _header(root_json, table, version, extra)
    data_offset = CONTAINER_HEAD.size + len(header)
    data_offset += _pad(PREFIX_LEN + data_offset)
    container_len = data_offset + offset
    head = CONTAINER_HEAD.pack(DATA_MAGIC, len(header), data_offset, offset, crc32(header), 0)
    lead = PREFIX(container_len) + head + header + bytes(data_offset - CONTAINER_HEAD.size - len(header))
    sink: FileSink | None = file if isinstance(file, FileSink) else None
    if sink is not None and len(stored) < 500:
        # one system call for the whole file (small steps are bound by per-call costs); the
        # writer takes each chunk's CRC as computed above instead of hashing it again
        pieces: list[tuple[Any, int | None]] = [(lead, None)]
        for data, row in zip(stored, table, strict=True):
            pieces.append((data, row[3]))
            if _pad(row[1]):
                pieces.append((bytes(_pad(row[1])), None))
        pieces.append((SUFFIX, None))
        return int(sink.write_vector(pieces))
    written = _put(file, lead)
    for data, row in zip(stored, table, strict=True):
        written += sink.write_known(data, row[3]) if sink is not None else _put(file, data)
        if _pad(row[1]):
            written += _put(file, bytes(_pad(row[1])))
    return written + _put(file, SUFFIX)


def _put(file: Any, data: Any) -> int:
    """``file.write`` until all of ``data`` is taken (a sink may take part of it)."""
    view, written = memoryview(data).cast("B"), 0
    while view.nbytes:
        n = file.write(view)
        n = view.nbytes if n is None else n
        written += n
        view = view[n:]
    return written


def _write_head_last(root_json: bytes, chunks: list[tuple[Any, int]], version: int, extra: bytes,
                     file: Any) -> int | None:
    """A large uncompressed step to a :class:`FileSink`: the header's room is reserved (its CRCs
    written at their widest, the rest padded with JSON whitespace), the chunks are written while
    the two codec threads compute their CRCs, and the head goes to offset 0 before the file is
    fsync-ed, so the checksum no longer delays the first byte written. A :class:`DeferredChunk`
    is made into one of two reused buffers, checksummed on a codec thread while the next is made
    into the other, and written from it. None when it does not apply."""
    total = sum(raw.nbytes for raw, _ in chunks)
    if len(chunks) < 2 or total < PARALLEL_BYTES or not isinstance(file, FileSink):
        return None
    table, offset = [], 0
    for raw, _itemsize in chunks:
        table.append([offset, raw.nbytes, raw.nbytes, _WIDEST_CRC, 0, 0])
        offset += raw.nbytes + _pad(raw.nbytes)
    room = len(_header(root_json, table, version, extra))
    data_offset = CONTAINER_HEAD.size + room
    data_offset += _pad(PREFIX_LEN + data_offset)
    if not file.reserve_head(PREFIX_LEN + data_offset):
        return None
    futures: list[Future[int] | None] = [
        None if isinstance(raw, DeferredChunk) else pool().submit(crc32, raw) for raw, _ in chunks]
    buffers: list[np.ndarray] = []
    made: list[Future[int] | None] = [None, None]  # the last checksum of each of the two buffers
    made_count = 0
    written = PREFIX_LEN + data_offset
    try:
        for index, (raw, _itemsize) in enumerate(chunks):
            data = raw
            if isinstance(raw, DeferredChunk):
                if raw.nbytes > CHUNK_BYTES:
                    raise ValueError(f"a deferred chunk of {raw.nbytes} bytes (at most {CHUNK_BYTES})")
                turn, made_count = made_count % 2, made_count + 1
                if len(buffers) <= turn:
                    buffers.append(_MADE.take())
                last = made[turn]
                if last is not None:
                    last.result()  # the buffer's previous bytes are checksummed: it may be reused
                data = buffers[turn][: raw.nbytes]
                raw.make(data.data.cast("B"))
                futures[index] = made[turn] = pool().submit(crc32, data)
            written += file.write_unhashed(data)
            if _pad(raw.nbytes):
                written += file.write_unhashed(bytes(_pad(raw.nbytes)))
    finally:
        wait([future for future in futures if future is not None])  # no thread reads a reused buffer
        _MADE.give(buffers)
    for row, future, (raw, _itemsize) in zip(table, futures, chunks, strict=True):
        assert future is not None
        row[3] = future.result()
        file.digest.update_known(row[3], raw.nbytes)
        if _pad(raw.nbytes):
            file.digest.update(bytes(_pad(raw.nbytes)))
    written += file.write(SUFFIX)
    header = _header(root_json, table, version, extra)
    header += b" " * (room - len(header))  # JSON whitespace: the header keeps its reserved size
    head = CONTAINER_HEAD.pack(DATA_MAGIC, room, data_offset, offset, crc32(header), 0)
    file.write_head(PREFIX(data_offset + offset) + head + header + bytes(data_offset - CONTAINER_HEAD.size - room))
    return written


# --------------------------------------------------------------------------- structural classes
def _opt_int(value: Any) -> None:
    if value is not None and (type(value) is not int or not 0 <= value < 1 << 62):
        raise ValueError("bad njt node: min/max must be null or a non-negative integer")


def _check_class_node(node: dict[str, Any], tag: str) -> list[Any]:
    """Validate a structural-class node (:data:`CLASS_TAGS`); returns its child nodes."""
    if tag == "npstr":
        if type(node.get("v")) is not str:
            raise ValueError("bad npstr node")
        return []
    if tag == "npbytes":
        text = node.get("hex")
        if type(text) is not str or len(text) % 2:
            raise ValueError("bad npbytes node")
        return []
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




# --------------------------------------------------------------------------- hash flooding
#: At most this many keys of one set/map may share their hash with an earlier key: the cost of
#: building it stays under ~MAX_COLLISIONS**2 / 2 comparisons (well under a second).
MAX_COLLISIONS = 1024
_SMALL = 64


def check_keys(keys: Any) -> None:
    """Raise ValueError when ``keys`` (a sized collection) would flood a set or dict."""
    n = len(keys)
    if n <= _SMALL:
        return
    # hash(h) == h for every value hash() returns, so this set has no collisions of its own
    distinct = len(set(map(hash, keys)))
    if n - distinct > MAX_COLLISIONS:
        raise ValueError(f"a set or map of {n} keys has {n - distinct} hash collisions "
                         f"(more than {MAX_COLLISIONS}): refusing a hash-flooding file")


class KeyBudget:
    """Collision accounting across many insertions into the same containers (format 1 builds
    sets and dicts item batch by item batch)."""

    def __init__(self) -> None:
        self._counts: dict[int, collections.Counter[int]] = {}
        self._total: dict[int, int] = {}

    def add(self, container: Any, keys: Iterable[Any]) -> None:
        counts = self._counts.setdefault(id(container), collections.Counter())
        hashes = list(map(hash, keys))
        counts.update(hashes)
        total = self._total.get(id(container), 0) + len(hashes)
        self._total[id(container)] = total
        if total - len(counts) > MAX_COLLISIONS:
            raise ValueError(f"a set or map of {total} keys has {total - len(counts)} hash collisions "
                             f"(more than {MAX_COLLISIONS}): refusing a hash-flooding file")


# --------------------------------------------------------------------------- JSON item chunks (header version 3)
_SCALAR = re.compile(
    r'[ \t\n\r]*(?:(")|(-?(?:0|[1-9][0-9]*))((?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)|(true)|(false)|(null))')
_SEP = re.compile(r"[ \t\n\r]*([,\]])")
_OPEN = re.compile(r"[ \t\n\r]*\[[ \t\n\r]*")
_scanstring: Any = json.decoder.scanstring  # type: ignore[attr-defined]
_LITERALS = {4: True, 5: False, 6: None}


def parse_items(data: bytes | memoryview, count: int) -> list[Any]:
    """The ``count`` items of a JSON array of plain scalars; ValueError for anything else."""
    text = str(data, "utf-8")  # no copy of the bytes first
    opened = _OPEN.match(text)
    if opened is None:
        raise ValueError("object array items are not a JSON array")
    pos = opened.end()
    items: list[Any] = []
    if text.startswith("]", pos):
        pos += 1
    else:
        while True:
            if len(items) >= count:
                raise ValueError("object array chunk holds more items than its shape")
            match = _SCALAR.match(text, pos)
            if match is None:
                raise ValueError("object array chunk holds a value that is not a plain JSON scalar")
            if match.group(1):
                value, pos = _scanstring(text, match.end(), True)
            elif match.group(2) is not None:
                whole, rest = match.group(2), match.group(3)
                if rest:
                    value = float(whole + rest)
                    if not math.isfinite(value):
                        raise ValueError("object array chunk holds a non-finite number")
                else:
                    value = int(whole)  # ValueError beyond 4300 digits
                pos = match.end()
            else:
                value = _LITERALS[match.lastindex or 0]
                pos = match.end()
            items.append(value)
            sep = _SEP.match(text, pos)
            if sep is None:
                raise ValueError("object array chunk is not a JSON array")
            pos = sep.end()
            if sep.group(1) == "]":
                break
    if text[pos:].strip(" \t\n\r"):
        raise ValueError("object array chunk has data after its JSON array")
    if len(items) != count:
        raise ValueError("object array items do not match its shape")
    return items



def needs_class_version(node: dict[str, Any]) -> bool:
    """Whether a (tagged) node needs header version :data:`CLASS_VERSION`."""
    tag = node.get("$")
    if tag in CLASS_TAGS:
        return True
    keyed = keyed_codec_of_tag(tag)
    return keyed is not None and any(key in node for key in keyed.class_keys)

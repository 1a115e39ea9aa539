"""Encoding batches to step files and back.

Format 2 (written since format_version 2 of the manifest)
=========================================================

A step file is a fixed prefix, a container and a fixed suffix::

    prefix    b"\\x80\\x05" b"crollout_mock.codec\\n_load_v2\\n" b"\\x8e" <u64 LE container length>
    container magic b"RMSTEP\\x00\\x02", u64 header length, u64 data offset, u64 data length,
              u32 CRC-32 of the header, u32 reserved; the JSON header; zero padding; the data
              section (chunks, each starting at a file offset that is a multiple of 64)
    suffix    b"\\x85R."

The prefix and suffix make the file a valid pickle too (PROTO 5, GLOBAL, BINBYTES8 ... TUPLE1,
REDUCE, STOP): ``pickle.load`` calls :func:`_load_v2` on the container, which runs the same safe
decoder. The safe reader never runs pickle: it checks the prefix bytes, the length field against
the file size, the suffix, the header CRC, then parses the container itself.

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
``timedelta``, ``tensor`` (``dtype``, ``shape``, ``c`` = ``[first chunk, count]``, ``grad``,
``param``), ``ndarray`` (numpy ``dtype`` string, ``shape``, ``c``, ``ro``), ``objarray``
(``shape``, and ``items``, or ``c``: a JSON data chunk of plain scalars, header version 3),
``nested`` (a ``torch.nested`` tensor's components and layout),
``tensordict`` (``batch_size``, ``names``, ``device``, ``items``), ``batch`` (a DataProto-like
object: ``kind``, the writer's ``class`` as ``module:qualname`` (information only), ``layout``,
``batch``/``non_tensor_batch``/``meta_info`` nodes, ``extra`` attributes; see
:mod:`~rollout_mock.codec.batches`) and ``pickle`` (an opaque cloudpickle blob for anything that
is not data; only ``trusted=True`` unpickles it).

Header version 4 (written now; 2 and 3 keep loading) keeps only the batch's structure in the
JSON header: plain Python values live in one msgpack *body* (``"body": [first, count]``, nodes
``{"$": "mp", "o", "n"}``; :mod:`~rollout_mock.codec.bodyenc` lists its extension types),
object arrays of strings are string columns (``{"$": "strs"}``, :mod:`~rollout_mock.codec.strcol`)
and tensors under 1 MiB inside the body share 4 MiB chunks. Its bounds:
:mod:`~rollout_mock.codec.bodydec`.

Decoding bounds (hostile files): every offset and length inside the data section; tensors and
arrays need ``prod(shape) * itemsize`` == the raw bytes they reference; dtypes from fixed
allow-lists (no object/void/structured raw arrays); decompression never exceeds the declared raw
size; the total declared raw bytes stay under ``max_expansion`` (default 64, env
``ROLLOUT_MOCK_MAX_EXPANSION``) times the file size + 1 MiB; JSON nesting at most 96; no tensor is
ever backed by uninitialised memory; the format has no shared references.

Format 1 (older dumps) is a protocol-5 pickle (:mod:`~rollout_mock.codec.pickler`); the safe path
reads it with a data-only opcode interpreter (:mod:`~rollout_mock.codec.legacy`). Format-1 files
reference ``rollout_mock.codec._rebuild_*``: those names stay here.
"""

from rollout_mock.codec.batches import (
    Batch,
    batch_class_names,
    is_batch_class,
    register_batch_class,
)
from rollout_mock.codec.buffers import BufferPool
from rollout_mock.codec.layout import FORMAT_VERSION
from rollout_mock.codec.pickler import (
    PROTOCOL,
    _rebuild_ndarray,
    _rebuild_np_scalar,
    _rebuild_object,
    _rebuild_object_array,
    _rebuild_parameter,
    _rebuild_tensor,
    _rebuild_tensordict,
    dtype_name,
    dump_v1,
    dumps_v1,
    loads_unrestricted,
    torch_dtype,
)
from rollout_mock.codec.snapshot import Snapshot, capture, encode, encode_bytes, encode_snapshot
from rollout_mock.codec.source import ByteSource, BytesSource, FileSource, MappedSource
from rollout_mock.codec.step import StepView, _load_v2, decode, open_step, sniff_version

#: Deprecated aliases: ``dump``/``dumps`` write format 2 now.
dump = encode
dumps = encode_bytes

__all__ = [
    "FORMAT_VERSION", "PROTOCOL", "Batch", "BufferPool", "ByteSource", "BytesSource", "FileSource", "MappedSource",
    "Snapshot",
    "StepView", "batch_class_names", "capture", "decode", "dtype_name", "dump", "dump_v1", "dumps",
    "dumps_v1", "encode", "encode_bytes", "encode_snapshot", "is_batch_class", "loads_unrestricted",
    "open_step", "register_batch_class", "sniff_version", "torch_dtype",
]
# The _rebuild_* names and _load_v2 are deliberately not in __all__: they are format, not API.
_FORMAT_NAMES = (_rebuild_ndarray, _rebuild_np_scalar, _rebuild_object, _rebuild_object_array,
                 _rebuild_parameter, _rebuild_tensor, _rebuild_tensordict, _load_v2)
_load_v2.__module__ = "rollout_mock.codec"

"""The fixed byte layout of format-2 step files (see :mod:`rollout_mock.codec` for the spec)."""

from __future__ import annotations

import re
import struct

import numpy as np
import torch

__all__ = [
    "ALIGN", "BODY_VERSION", "CHUNK_BYTES", "CONTAINER_HEAD", "DATA_MAGIC", "FORMAT_VERSION", "HEADER_VERSIONS",
    "JSON_ITEMS_MIN", "MAX_CHUNK_RAW",
    "MAX_DEPTH", "PREFIX", "PREFIX_HEAD", "SUFFIX", "TORCH_DTYPES", "TORCH_DTYPE_NAMES", "numpy_dtype",
]

FORMAT_VERSION = 2
#: The header's ``version``: 2, or 3 when the file stores an object array's items as a JSON data
#: chunk (``{"$": "objarray", "shape": [...], "c": [first, count]}``) instead of inline ``items``.
#: Version-3 headers are written only by files that use it; readers accept both.
HEADER_VERSIONS = (2, 3, 4)
#: Header version 4: plain Python values live in one msgpack *body* (``"body": [first, count]``
#: in the header, nodes ``{"$": "mp", "o": offset, "n": length}``), object arrays of strings are
#: string columns (``{"$": "strs", ...}``), small tensors share chunks (see :mod:`.packed`).
BODY_VERSION = 4
#: Version 4 files may also use the structural-class tags of :mod:`~rollout_mock.codec.classes`.
#: Object arrays of at least this many plain JSON items (strings, numbers, booleans, None) keep
#: their items in a data chunk: the header stays small, and a lazy open parses them only when asked.
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


def PREFIX(container_length: int) -> bytes:  # noqa: N802 - reads like a constant
    return PREFIX_HEAD + struct.pack("<Q", container_length)


#: Append-only: a tensor's dtype code in a version-4 body is its index here.
TORCH_DTYPE_NAMES = _TORCH_NAMES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
)
#: The torch dtypes a step file may hold (plain numeric types; no quantized or bit types).
TORCH_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in _TORCH_NAMES if isinstance(getattr(torch, name, None), torch.dtype)
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

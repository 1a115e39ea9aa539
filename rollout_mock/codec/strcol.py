"""String columns (header version 4): an object array of ``str`` stored as one msgpack array of
strings plus the byte offset of every item.

``{"$": "strs", "shape": [...], "c": [first, count], "o": [first, count], "sp": true?}``: ``c``
is the msgpack array (``n`` strings, ``str8/16/32`` or fixstr items), ``o`` holds ``n + 1``
little-endian int64 offsets into it (``o[0]`` is the array header's size, ``o[n]`` its total size),
``sp`` says the strings hold lone surrogates (UTF-8 with ``surrogatepass``). A full load is one
read and one C decode (msgpack's, as fast as ``pickle.loads`` of the same list); ``rows`` reads
only the offsets and the bytes of those rows.

Hostile columns are checked before msgpack sees them, in one vectorised pass: offsets start at the
header, never decrease and end at the data's size; the array header declares exactly the shape's
count; every item starts with a string marker whose length is exactly its span. So decoding can
produce nothing but the declared number of strings (and msgpack then checks their UTF-8).
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

__all__ = ["read_strings", "string_column"]


def _array_head(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def string_column(array: np.ndarray, add_raw: Any) -> dict[str, Any] | None:
    """The string-column node of an object array of ``str`` (None: not all items are ``str``)."""
    flat = array.reshape(-1).tolist()
    if not flat or set(map(type, flat)) != {str}:
        return None
    surrogates = False
    try:
        data = msgpack.packb(flat, use_bin_type=True)
    except UnicodeEncodeError:
        data, surrogates = msgpack.packb(flat, use_bin_type=True, unicode_errors="surrogatepass"), True
    n = len(flat)
    if all(map(str.isascii, flat)):
        lengths = np.fromiter(map(len, flat), dtype=np.int64, count=n)
    else:
        lengths = np.fromiter((len(s.encode("utf-8", "surrogatepass")) for s in flat), dtype=np.int64, count=n)
    heads = np.where(lengths < 32, 1, np.where(lengths < 256, 2, np.where(lengths < 1 << 16, 3, 5)))
    offsets = np.empty(n + 1, dtype="<i8")
    offsets[0] = len(_array_head(n))
    np.cumsum(heads + lengths, out=offsets[1:])
    offsets[1:] += offsets[0]
    if int(offsets[-1]) != len(data):  # not the layout this reader expects: a body value instead
        return None
    node: dict[str, Any] = {"$": "strs", "shape": list(array.shape),
                            "c": add_raw(np.frombuffer(data, np.uint8), 1, 0),
                            "o": add_raw(offsets.view(np.uint8), 8, 8)}
    if surrogates:
        node["sp"] = True
    return node


def _check_items(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
    """Every item in ``data`` (offsets relative to it) is one msgpack string spanning exactly
    ``[start, end)``."""
    if not len(starts):
        return
    if int(starts[0]) < 0 or int(ends[-1]) > data.size or bool((ends < starts).any()) \
            or bool((starts[1:] != ends[:-1]).any()):
        raise ValueError("string column offsets are out of order or outside its bytes")
    if bool((ends == starts).any()):
        raise ValueError("string column item of no bytes")
    last = data.size - 1  # starts < ends <= size: every start indexes the data
    first, b1, b2, b3, b4 = (data[np.minimum(starts + k, last)].astype(np.int64) for k in range(5))
    fix = (first >= 0xA0) & (first <= 0xBF)
    length = np.where(fix, first & 0x1F, np.where(first == 0xD9, b1, np.where(
        first == 0xDA, (b1 << 8) | b2, (b1 << 24) | (b2 << 16) | (b3 << 8) | b4)))
    head = np.where(fix, 1, np.where(first == 0xD9, 2, np.where(first == 0xDA, 3, 5)))
    valid = fix | (first == 0xD9) | (first == 0xDA) | (first == 0xDB)
    if not bool(valid.all()) or bool((head + length != ends - starts).any()):
        raise ValueError("string column item is not a string of its offsets' length")


def read_strings(reader: Any, node: dict[str, Any], rows: range | None) -> np.ndarray:
    """A string column; ``rows`` (a range over the first dimension): only those rows are read."""
    shape = list(node["shape"])
    per_row = math.prod(shape[1:]) if shape else 1
    errors = "surrogatepass" if node.get("sp") else "strict"
    if rows is not None and shape:
        if not len(rows):
            return np.empty([0, *shape[1:]], dtype=object)
        lo, hi = min(rows) * per_row, (max(rows) + 1) * per_row
        offsets = reader.span(node["o"], lo * 8, (hi + 1) * 8).numpy().view("<i8")
        start, stop = int(offsets[0]), int(offsets[-1])
        if not 0 <= start <= stop:
            raise ValueError("string column offsets are out of order")
        data = reader.span(node["c"], start, stop).numpy()
        _check_items(data, offsets[:-1] - start, offsets[1:] - start)
        unpacker = msgpack.Unpacker(raw=False, unicode_errors=errors, max_buffer_size=max(1, data.size))
        unpacker.feed(memoryview(data))
        items = [unpacker.unpack() for _ in range(hi - lo)]
    else:
        count = math.prod(shape)
        offsets = reader.whole(node["o"], None).numpy().view("<i8")
        data = reader.whole(node["c"], None).numpy()
        head = _array_head(count)
        if int(offsets[0]) != len(head) or data[: len(head)].tobytes() != head or int(offsets[-1]) != data.size:
            raise ValueError("string column header does not match its shape")
        _check_items(data, offsets[:-1], offsets[1:])
        items = msgpack.unpackb(memoryview(data), raw=False, unicode_errors=errors)
    array = np.empty(len(items), dtype=object)
    array[:] = items
    if rows is not None and shape:
        first = min(rows)
        array = array.reshape([-1, *shape[1:]])
        if rows.step != 1 or len(rows) != max(rows) + 1 - first:
            array = array[[i - first for i in rows]]
        return array
    return array.reshape(shape)

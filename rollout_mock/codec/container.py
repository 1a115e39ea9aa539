"""Writing a captured batch as a format-2 container: prefix, head, JSON header with the chunk
table, the chunks (64-byte aligned), suffix.

Two ways to the same bytes. The plain one computes every chunk's CRC-32 (and compression) first,
then writes the header and the chunks in file order. For a large uncompressed step written to a
checksumming file (:class:`~rollout_mock.storage.digest.HashingWriter`, no HMAC), the head is
written *last*: the header's room is reserved (its CRCs written at their widest, the rest padded
with JSON whitespace), the chunks are written while the two codec threads compute their CRCs, and
the head goes to offset 0 before the file is fsync-ed, so the checksum no longer delays the
first byte written.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import wait
from dataclasses import dataclass
from typing import Any, BinaryIO

from rollout_mock.codec import chunks as _chunks
from rollout_mock.codec._threads import PARALLEL_BYTES, pool
from rollout_mock.codec.classes import CLASS_VERSION, needs_class_version
from rollout_mock.codec.layout import (
    ALIGN,
    BODY_VERSION,
    CHUNK_BYTES,
    CONTAINER_HEAD,
    DATA_MAGIC,
    FORMAT_VERSION,
    JSON_ITEMS_MIN,
    PREFIX,
    PREFIX_LEN,
    SUFFIX,
)
from rollout_mock.codec.sink import FileSink

__all__ = ["encode_snapshot"]

_WIDEST_CRC = 0xFFFFFFFF  # ten digits: the header's room for any CRC-32


@dataclass
class _Prepared:
    """What is written: the root and chunks after :func:`_move_items`."""

    root: Any
    chunks: list[tuple[Any, int]]
    header_version: int
    #: header keys beyond root and chunks (version 4: ``body``, ``sp``), serialised
    extra: bytes = b""


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _header(root: Any, table: list[list[int]], *, root_json: bytes | None = None, version: int = FORMAT_VERSION,
            extra: bytes = b"") -> bytes:
    """The JSON header. ``root_json``: the root already serialised (it can hold strings,
    megabytes for large batches: serialised once even when the header is built twice)."""
    if root_json is None:
        root_json = _dumps(root)
    return b'{"format":"rollout_mock.step","version":%d,"root":%s,"chunks":%s%s}' % (
        version, root_json, _dumps(table), extra)


def _plain_json(node: Any) -> bool:
    """A JSON scalar the header could hold as is: no tagged node, no container."""
    return node is None or type(node) in (str, bool, int) or (type(node) is float and math.isfinite(node))


def _items_chunk(items: list[Any]) -> memoryview:
    # ASCII with \u escapes: json's C encoder is ~2.5x faster than with ensure_ascii=False
    # (9 ms against 23 ms for the 4.8 MB of prompts of the benchmark batch), and it escapes
    # lone surrogates, which UTF-8 cannot encode
    return memoryview(json.dumps(items, separators=(",", ":")).encode("ascii"))


def _move_items(root: Any, chunks: list[tuple[Any, int]]) -> tuple[Any, int]:
    """``root`` with every object array of at least JSON_ITEMS_MIN plain items turned into a
    reference to a JSON data chunk (appended to ``chunks``), and the header version that needs.
    Done at write time (on the background writer's thread in dump mode): the snapshot keeps its
    inline items, and nodes are copied, never changed in place."""
    moved = 0
    classes = False

    def walk(node: Any) -> Any:
        nonlocal moved, classes
        if type(node) is list:
            return [walk(x) for x in node]
        if type(node) is not dict:
            return node
        if node.get("$") == "objarray" and "items" in node:
            items = node["items"]
            if len(items) >= JSON_ITEMS_MIN and all(_plain_json(x) for x in items):
                text, first = _items_chunk(items), len(chunks)
                chunks.extend((text[i: i + CHUNK_BYTES], 1) for i in range(0, len(text), CHUNK_BYTES))
                moved += 1
                return {"$": "objarray", "shape": node["shape"], "c": [first, len(chunks) - first]}
        if node.get("$") in ("tensor", "ndarray", "bytes", "bytearray", "pickle"):
            return node
        classes = classes or needs_class_version(node)
        return {k: walk(v) for k, v in node.items()}

    new_root = walk(root)
    return new_root, (CLASS_VERSION if classes else 3 if moved else FORMAT_VERSION)


def _write_head_last(snapshot: Any, file: Any) -> int | None:
    """The overlapped write (see the module docstring); None when it does not apply."""
    chunks = snapshot.chunks
    total = sum(raw.nbytes for raw, _ in chunks)
    if len(chunks) < 2 or total < PARALLEL_BYTES or not isinstance(file, FileSink):
        return None
    table, offset = [], 0
    for raw, _itemsize in chunks:
        table.append([offset, raw.nbytes, raw.nbytes, _WIDEST_CRC, 0, 0])
        offset += raw.nbytes + _pad(raw.nbytes)
    root_json = _dumps(snapshot.root)
    version = snapshot.header_version
    room = len(_header(None, table, root_json=root_json, version=version, extra=snapshot.extra))
    data_offset = CONTAINER_HEAD.size + room
    data_offset += _pad(PREFIX_LEN + data_offset)
    if not file.reserve_head(PREFIX_LEN + data_offset):
        return None
    futures = [pool().submit(_chunks.crc32, raw) for raw, _ in chunks]
    written = PREFIX_LEN + data_offset
    try:
        for raw, _itemsize in chunks:
            written += file.write_unhashed(raw)
            if _pad(raw.nbytes):
                written += file.write_unhashed(bytes(_pad(raw.nbytes)))
    finally:
        wait(futures)  # never leave a thread reading a buffer the caller may reuse
    for row, future, (raw, _itemsize) in zip(table, futures, chunks, strict=True):
        row[3] = future.result()
        file.digest.update_known(row[3], raw.nbytes)
        if _pad(raw.nbytes):
            file.digest.update(bytes(_pad(raw.nbytes)))
    written += file.write(SUFFIX)
    header = _header(None, table, root_json=root_json, version=version, extra=snapshot.extra)
    header += b" " * (room - len(header))  # JSON whitespace: the header keeps its reserved size
    head = CONTAINER_HEAD.pack(DATA_MAGIC, room, data_offset, offset, _chunks.crc32(header), 0)
    file.write_head(PREFIX(data_offset + offset) + head + header + bytes(data_offset - CONTAINER_HEAD.size - room))
    return written


def _pad(n: int) -> int:
    return (-n) % ALIGN


def encode_snapshot(snapshot: Any, file: BinaryIO, *, compression: str = "none") -> int:
    """Write a captured batch as a format-2 step file; returns the number of bytes written."""
    chunks = list(snapshot.chunks)
    body = getattr(snapshot, "body", None)
    if body is not None or getattr(snapshot, "header_version", None) == BODY_VERSION:
        extra = b',"body":%s' % _dumps(body) if body is not None else b""
        if getattr(snapshot, "surrogates", False):
            extra += b',"sp":true'
        snapshot = _Prepared(snapshot.root, chunks, BODY_VERSION, extra)
    else:
        root, version = _move_items(snapshot.root, chunks)
        snapshot = _Prepared(root, chunks, version)
    if compression == "none":
        written = _write_head_last(snapshot, file)
        if written is not None:
            return written
    table: list[list[int]] = []
    stored: list[Any] = []
    offset = 0

    def prepare(chunk: tuple[Any, int]) -> tuple[Any, int, int, int]:
        raw, itemsize = chunk
        data, codec_id, shuf = _chunks.compress(raw, compression, itemsize)
        return data, codec_id, shuf, _chunks.crc32(data)

    # compression and CRC-32 release the GIL: large steps use both cores
    total = sum(raw.nbytes for raw, _ in snapshot.chunks)
    if len(snapshot.chunks) > 1 and total >= PARALLEL_BYTES:
        prepared = list(pool().map(prepare, snapshot.chunks))
    else:
        prepared = [prepare(chunk) for chunk in snapshot.chunks]
    for (raw, _itemsize), (data, codec_id, shuf, crc) in zip(snapshot.chunks, prepared, strict=True):
        size = len(memoryview(data).cast("B")) if not isinstance(data, bytes) else len(data)
        table.append([offset, size, raw.nbytes, crc, codec_id, shuf])
        stored.append(data)
        offset += size + _pad(size)
    header = _header(snapshot.root, table, version=snapshot.header_version, extra=snapshot.extra)
    data_offset = CONTAINER_HEAD.size + len(header)
    data_offset += _pad(PREFIX_LEN + data_offset)
    data_len = offset
    container_len = data_offset + data_len
    head = CONTAINER_HEAD.pack(DATA_MAGIC, len(header), data_offset, data_len, _chunks.crc32(header), 0)
    written = 0

    def put(data: Any) -> None:
        nonlocal written
        view = memoryview(data).cast("B")
        while view.nbytes:
            n = file.write(view)
            n = view.nbytes if n is None else n
            written += n
            view = view[n:]

    sink: FileSink | None = file if isinstance(file, FileSink) else None
    if sink is not None and len(stored) < 500:
        # one system call for the whole file (small steps are bound by per-call costs); the
        # writer takes each chunk's CRC as computed above instead of hashing it again
        pieces: list[tuple[Any, int | None]] = [
            (PREFIX(container_len) + head + header + bytes(data_offset - CONTAINER_HEAD.size - len(header)), None)]
        for data, row in zip(stored, table, strict=True):
            pieces.append((data, row[3]))
            if _pad(row[1]):
                pieces.append((bytes(_pad(row[1])), None))
        pieces.append((SUFFIX, None))
        return int(sink.write_vector(pieces))
    put(PREFIX(container_len))
    put(head)
    put(header)
    put(bytes(data_offset - CONTAINER_HEAD.size - len(header)))
    # A writer that checksums what it writes can take each chunk's CRC as computed above
    # instead of hashing the chunk a second time (HashingWriter.write_known).
    for data, row in zip(stored, table, strict=True):
        if sink is not None:
            written += sink.write_known(data, row[3])
        else:
            put(data)
        pad = _pad(len(memoryview(data).cast("B")))
        if pad:
            put(bytes(pad))
    put(SUFFIX)
    return written

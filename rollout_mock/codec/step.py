"""The public read API: :func:`open_step`, :func:`decode`, :func:`sniff_version`."""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterable
from typing import Any

from rollout_mock.batch import batch_keys, subset
from rollout_mock.codec.chunkread import ChunkReader
from rollout_mock.codec.decode import NodeDecoder, normalize_rows
from rollout_mock.codec.header import Layout, check_tree, max_expansion_default, read_layout, ref_raw
from rollout_mock.codec.layout import BODY_VERSION, PREFIX_HEAD
from rollout_mock.codec.source import BytesSource, FileSource, MappedSource, as_source
from rollout_mock.errors import CorruptStepError, RolloutMockError

__all__ = ["BODY_FACTOR", "StepView", "decode", "open_step", "sniff_version"]

#: Memory one byte of a version-4 body may become, counted against the allocation bound.
BODY_FACTOR = 63


def sniff_version(prefix: bytes | memoryview) -> int:
    """1 or 2 from the first bytes of a step file (at least 32); CorruptStepError otherwise."""
    head = bytes(prefix[: len(PREFIX_HEAD)])
    if head == PREFIX_HEAD:
        return 2
    if head[:1] == b"\x80" and len(head) >= 2 and 2 <= head[1] <= 5:
        return 1
    raise CorruptStepError(f"not a rollout_mock step file (starts with {head[:8]!r})")


def _corrupt(name: str, exc: BaseException) -> CorruptStepError:
    error = CorruptStepError(
        f"{name}: the step file cannot be decoded: {exc}. It is corrupt or was not written by "
        f"rollout_mock: re-dump the step or restore the dump from a copy.",
        path=name,
    )
    error.__cause__ = exc
    return error


def _guard(where: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``call``; anything but a rollout_mock error becomes a CorruptStepError naming ``where``."""
    try:
        return call(*args, **kwargs)
    except RolloutMockError as exc:
        if exc.path is None:
            exc.path = where
        raise
    except (Exception, RecursionError, MemoryError) as exc:  # hostile input: never leak a bare error
        raise _corrupt(where, exc) from exc


def _root_keys(root: Any) -> list[str]:
    if type(root) is dict:
        tag = root.get("$")
        if tag is None:
            return list(root)
        if tag == "tensordict":
            return [k for k, _ in root["items"]]
        if tag == "batch" and root.get("kind") == "dataproto":
            keys: list[str] = []
            for name in ("batch", "non_tensor_batch"):
                field = root.get(name)
                if type(field) is dict and field.get("$") is None:
                    keys += [k for k in field if k not in keys]
                elif type(field) is dict and field.get("$") == "tensordict":
                    keys += [k for k, _ in field["items"] if k not in keys]
            return keys
    if type(root) is list:
        keys = []
        for item in root:
            if type(item) is dict and item.get("$") is None:
                keys += [k for k in item if k not in keys]
        return keys
    return []


class StepView:
    """A step file opened lazily: the header is read, the data is read by :meth:`load`.

    ``mapped=True`` (local files) maps the file instead of reading it: :meth:`load` returns
    tensors and arrays that *are* the mapped file's pages (no copy, nothing read until touched,
    copy-on-write), so a few keys or rows of a multi-GB step cost milliseconds. ``verify``
    (default) still CRC-checks every chunk :meth:`load` hands out, which reads those chunks;
    ``verify=False`` reads nothing at all, and the view says so: :attr:`verified` is False.
    """

    def __init__(self, source: Any, *, trusted: bool = False, batch_class: type | None = None,
                 max_expansion: float | None = None, mapped: bool = False, verify: bool = True) -> None:
        if mapped and isinstance(source, FileSource) and not isinstance(source, MappedSource):
            source = source.path
        if mapped and isinstance(source, (str, os.PathLike)):
            source = _guard(str(source), MappedSource, source)
        self.source = as_source(source)
        self.name = str(getattr(self.source, "name", "<source>"))
        self.trusted = trusted
        self.batch_class = batch_class
        #: Whether :meth:`load` checks the CRC-32 of every chunk it returns (False: unchecked).
        self.verified = verify
        size = _guard(self.name, self.source.size)
        prefix = _guard(self.name, self.source.read_range, 0, min(size, len(PREFIX_HEAD)))
        self.format_version = _guard(self.name, sniff_version, prefix)
        self._layout: Layout | None = None
        self._v1: Any = None
        self._v1_loaded = False
        if self.format_version == 2:
            self._layout = _guard(self.name, read_layout, self.source)
            layout = self._layout
            self._used = [0]
            body = -1
            if layout.version >= BODY_VERSION:
                body = 0 if layout.body is None else ref_raw(layout.table, layout.body)
            declared = _guard(self.name, check_tree, layout.root, layout.table, used=self._used, body=body)
            if layout.version >= BODY_VERSION:
                # every chunk (shared small tensors, the body's own), and the objects a body of
                # this size can become (at most ~72 bytes per msgpack byte)
                declared += sum(row[2] for row in layout.table) + BODY_FACTOR * max(body, 0)
            self._layout.declared_raw = declared
            limit = (max_expansion or max_expansion_default()) * size + (1 << 20)
            if declared > limit:
                raise CorruptStepError(
                    f"{self.name}: the step declares {declared} bytes of data in a {size}-byte file "
                    f"(more than {max_expansion or max_expansion_default():g}x + 1 MiB); refusing to "
                    f"allocate it. If the data is legitimately this compressible, raise the limit "
                    f"with max_expansion= or ROLLOUT_MOCK_MAX_EXPANSION.",
                    path=self.name,
                )

    @property
    def nbytes(self) -> int:
        """Raw bytes of the data chunks (tensors, arrays, object-array items) of a format-2 step,
        or the file size (format 1)."""
        if self._layout is not None:
            return self._layout.declared_raw
        return int(self.source.size())

    def file_crc32(self) -> int:
        """The CRC-32 of the whole file as the writer computed it, from the chunk table's CRCs
        and the bytes between chunks (header, padding, suffix): nothing of the data is read.

        Every chunk :meth:`load` uses is checked against its table CRC, so when this value
        matches the manifest's checksum and the load succeeds, the file is exactly the one that
        was written. Format-1 files (no chunk table) are hashed whole.
        """
        import rollout_mock.crc as _crc

        if self._layout is None:
            size = self.source.size()
            value, pos = 0, 0
            while pos < size:
                piece = self.source.read_range(pos, min(16 << 20, size - pos))
                value = _crc.crc32(piece, value)
                pos += len(piece)
            return value & 0xFFFFFFFF
        layout = self._layout
        rows = sorted(self._layout.table, key=lambda row: row[0])
        value, pos = 0, 0
        for offset, stored, _raw, crc, _codec, _shuf in rows:
            start = layout.data_base + offset
            if start < pos:
                raise CorruptStepError(f"{self.name}: chunks overlap; the file is corrupt", path=self.name)
            if start > pos:
                value = _crc.crc32(self.source.read_range(pos, start - pos), value)
            value = _crc.crc32_combine(value & 0xFFFFFFFF, crc, stored)
            pos = start + stored
        size = self.source.size()
        if pos < size:
            value = _crc.crc32(self.source.read_range(pos, size - pos), value)
        return value & 0xFFFFFFFF

    def keys(self) -> list[str]:
        """Top-level keys: batch + non-tensor keys of a batch, a dict's or TensorDict's keys."""
        if self._layout is not None:
            root = self._layout.root
            if type(root) is dict and root.get("$") == "mp":  # keys live in the body
                return _keys_of(self.load())
            return _root_keys(root)
        return _keys_of(self._load_v1())

    def _load_v1(self) -> Any:
        if not self._v1_loaded:
            from rollout_mock.codec.legacy import load_v1

            data = _guard(self.name, self.source.read_range, 0, self.source.size())
            if self.trusted:
                self._v1 = _guard(self.name, pickle.loads, bytes(data))
            else:
                self._v1 = _guard(self.name, load_v1, data, name=self.name, batch_class=self.batch_class)
            self._v1_loaded = True
        return self._v1

    def load(self, keys: Iterable[str] | None = None, rows: slice | range | None = None) -> Any:
        """Decode the step, optionally only ``keys`` and the batch rows ``rows``."""
        wanted = None if keys is None else frozenset(keys)
        sel = normalize_rows(rows)
        if self._layout is None:
            return select(self._load_v1(), wanted, sel)
        reader = ChunkReader(self.source, self._layout, verify=self.verified)
        decoder = NodeDecoder(reader, trusted=self.trusted, batch_class=self.batch_class, name=self.name)
        layout = self._layout
        decoder.use_body(layout.body, [row[2] for row in layout.table], surrogates=layout.surrogates,
                         table=layout.table, used=list(self._used))
        reader.pending = []
        result = _guard(self.name, _decode_root, decoder, self._layout.root, wanted, sel)
        _guard(self.name, reader.finish)
        return result


def _decode_root(decoder: NodeDecoder, root: Any, keys: frozenset[str] | None, rows: slice | None) -> Any:
    if keys is None and rows is None:
        return decoder.value(root)
    if type(root) is dict:
        tag = root.get("$")
        if tag == "mp":  # one body value (a list of samples, ...): decoded, then selected
            return select(decoder.value(root), keys, rows)
        if tag is None:
            return {k: decoder.value(v, rows) for k, v in root.items() if keys is None or k in keys}
        if tag == "tensordict":
            return decoder.tensordict(root, rows, keys)
        if tag == "batch":
            return decoder.batch(root, rows, keys)
    if type(root) is list:
        items = root if rows is None else [root[i] for i in range(len(root))[rows]]
        return [_decode_root(decoder, x, keys, None) if type(x) is dict and x.get("$") is None
                else decoder.value(x) for x in items]
    return decoder.value(root, rows)


def _keys_of(obj: Any) -> list[str]:
    return batch_keys(obj)


def select(obj: Any, keys: frozenset[str] | None, rows: slice | None) -> Any:
    """Keys and rows of an already decoded batch (format-1 files, body values): the batch
    model's selection (:func:`rollout_mock.batch.subset`), the same as partial format-2 loads."""
    return subset(obj, keys, rows)


def open_step(source: Any, *, trusted: bool = False, batch_class: type | None = None,
              max_expansion: float | None = None, mapped: bool = False, verify: bool = True) -> StepView:
    """Open a step lazily (reads only the header of a format-2 file); ``mapped``/``verify``:
    see :class:`StepView`."""
    return StepView(source, trusted=trusted, batch_class=batch_class, max_expansion=max_expansion,
                    mapped=mapped, verify=verify)


def decode(source: Any, *, trusted: bool = False, keys: Iterable[str] | None = None,
           rows: slice | range | None = None, batch_class: type | None = None,
           max_expansion: float | None = None) -> Any:
    """Decode a step file of format 1 or 2 from a ByteSource, a path or bytes.

    Safe by default: format 2 is decoded without pickle; format 1 by a data-only interpreter of
    the pickle subset rollout_mock wrote. ``trusted=True`` unpickles opaque blobs (format 2) or
    runs plain pickle (format 1).
    """
    view = StepView(source, trusted=trusted, batch_class=batch_class, max_expansion=max_expansion)
    return view.load(keys=keys, rows=rows)


def _load_v2(data: bytes) -> Any:
    """What ``pickle.load`` of a format-2 file calls: the safe decoder over the container."""
    from rollout_mock.codec.layout import PREFIX, SUFFIX

    whole = io.BytesIO()
    whole.write(PREFIX(len(data)))
    whole.write(data)
    whole.write(SUFFIX)
    return decode(BytesSource(whole.getbuffer(), "<pickle stream>"))

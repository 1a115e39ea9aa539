"""Decoding step files of format 2: validated nodes, the msgpack body, string columns and chunk
reads become the batch again, without any pickle machinery.

The decoder only ever sees a header that :func:`~rollout_mock.codec.format.check_tree` accepted,
and checks everything the header check cannot see as it reads it:

* **Chunks** (:class:`ChunkReader`): every chunk is CRC-checked before a decompressor or the
  batch sees it. During a load, tensor and array reads are *deferred*: each tensor gets its
  (still empty) memory at once, and :meth:`ChunkReader.finish` fills every chunk of the step (on
  two threads for large local steps: reads, page faults and CRCs release the GIL), checks each
  CRC, and only then runs the checks that needed the data (bool tensors hold only 0 and 1).
  Mapped sources are used in place.
* **The body** (:class:`BodyReader`, header version 4): it is stored uncompressed and the
  header check counts it 63 times against the file's allocation bound (the most memory a byte of
  msgpack can become is ~72 bytes: an empty dict); msgpack's own limits refuse any length beyond
  the buffer and nesting beyond its C stack; msgpack's timestamp extension (-1), which
  rollout_mock never writes, decodes to a plain int (nanoseconds); maps decode with string keys
  only (hashed with Python's per-process key), and any other key sends the value through a slow
  path that checks hash collisions first (``check_keys``, below), as do sets; extension
  payloads are fixed-layout structs checked field by field; tensor data must lie inside its
  chunk, runs of chunks are counted against the table once; version-2 nodes inside the body
  pass the same ``check_tree`` as the header's. A long column of small maps (verl's
  ``extra_info``) is decoded by ormsgpack instead, which refuses any key but a string, after
  msgpack has measured the value (``skip``: no bytes after it); anything else (a tuple, set
  or object array inside the value, a key that is not a string, any extension but a big int)
  goes to msgpack's path (:meth:`BodyReader._cached_keys`).
* **Shared chunks** (small tensors side by side): every view is checked to lie inside its chunk,
  and bool views are checked once per chunk over the union of their ranges, so 4,000 views of
  one 16 MiB chunk cost one pass over 16 MiB, not 4,000.
* **String columns**: offsets, the array header's count and every item's string marker are
  checked in one vectorised pass once msgpack (safe on any bytes) has decoded them, before the
  column is returned; a failed check is the error raised, before any decode error
  (:func:`read_strings`).
* **JSON item chunks** (header version 3): parsed item by item, never beyond the declared count
  (:func:`~rollout_mock.codec.format.parse_items`).
* **Hash flooding** (:func:`~rollout_mock.codec.format.check_keys` and ``KeyBudget`` in
  :mod:`~rollout_mock.codec.format`): ints, floats, tuples and frozensets hash
  deterministically, so a file could hold thousands of distinct keys with one hash value
  (``k * (2**61 - 1) + c``) and make building a set or dict cost n**2 comparisons. Every decoder
  (format-1 interpreter, format-2 nodes, the body) builds sets and non-string-keyed maps through
  these: more than ``MAX_COLLISIONS`` keys sharing a hash with another key are refused before
  anything is inserted.

**Replayed tensors own their memory.** Every tensor the decoder returns has a storage of its own,
exactly its size, even where many tensors are views of one chunk read (small tensors packed
together, a mapped file): ``torch.save``, ``pickle`` and Ray see only each tensor's own bytes.
This costs no copy: the storages are made over the chunk's memory (``torch.frombuffer``).
Bytes that only pass through on their way to Python objects (string columns, the body) are read
into a reused :class:`Scratch` of at most :data:`SCRATCH_BYTES` instead (still CRC-checked);
nothing returned points into it.

A step holds data, not autograd state: every tensor is a leaf with ``requires_grad=False``
(``grad`` flags written by older files are ignored); a recorded ``nn.Parameter`` keeps its
class. Opaque pickle blobs are refused (:class:`~rollout_mock.errors.UnsafePickleError`) unless the
caller hands the decoder an ``unpickle`` function (a trusted load, see
:mod:`~rollout_mock.codec.trusted`): no unpickler is reachable from this module.
"""

from __future__ import annotations

import bisect
import collections
import datetime
import gc
import math
import os
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import numpy as np
import ormsgpack
import torch

from rollout_mock.batch import keyed_codec_of_tag, subset
from rollout_mock.codec.classes import build_batch, decode_class
from rollout_mock.codec.device import host_empty, note_device
from rollout_mock.codec.format import (
    CLASS_TAGS,
    EXT_FROZENSET,
    EXT_INT,
    EXT_NDARRAY,
    EXT_NODE,
    EXT_OBJARRAY,
    EXT_SET,
    EXT_TENSOR,
    EXT_TUPLE,
    MAX_NDIM,
    PARALLEL_BYTES,
    TENSOR_HEAD,
    TORCH_DTYPE_NAMES,
    TORCH_DTYPES,
    Layout,
    array_head,
    check_keys,
    check_tree,
    crc32,
    decoder_thread,
    decompress,
    numpy_dtype,
    parse_items,
    pool,
)
from rollout_mock.crc import crc32_combine
from rollout_mock.errors import UnsafePickleError

__all__ = [
    "SCRATCH_BUFFERS", "SCRATCH_BYTES", "BodyReader", "ChunkReader", "NodeDecoder",
    "Scratch", "lease_scratch", "normalize_rows", "read_strings", "return_scratch",
]

#: How to opt in to unpickling opaque blobs (named in every UnsafePickleError).
OPT_IN = (
    "trust_pickle: true in the rollout_mock config, trusted=True in rollout_mock.load_step / "
    "rollout_mock.codec.decode, or --trust on the command line"
)
#: What a trusted load hands the decoder to read opaque blobs with (codec/trusted.py provides it).
Unpickle = Callable[[bytes], Any]


def _memory(raw: torch.Tensor) -> memoryview:
    """A flat uint8 tensor's memory as a buffer (what :func:`_own` takes)."""
    view: Any = memoryview(raw.numpy())  # type: ignore[arg-type]  # numpy arrays are buffers
    return view


def _own(memory: memoryview, offset: int, nbytes: int) -> torch.Tensor:
    """Bytes ``[offset, offset + nbytes)`` of ``memory`` as a tensor with a storage of its own
    over the same memory (no copy): pickling it carries its bytes only."""
    return torch.frombuffer(memory[offset: offset + nbytes], dtype=torch.uint8)


# --------------------------------------------------------------------------- string columns
def _check_items(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
    """Every item in ``data`` (offsets relative to it) is one msgpack string spanning exactly
    ``[start, end)``."""
    if not len(starts):
        return
    if int(starts[0]) < 0 or int(ends[-1]) > data.size or bool((ends < starts).any()) \
            or bool((starts[1:] != ends[:-1]).any()):
        raise ValueError("string column offsets are out of order or outside its bytes")
    span = ends - starts
    shortest = int(span.min())
    if shortest == 0:
        raise ValueError("string column item of no bytes")
    first = data[starts]  # starts < ends <= size: every start indexes the data
    lo, hi = int(first.min()), int(first.max())
    # one header form for the whole column (the usual case: a column of short strings, or of
    # 256 B - 64 KiB ones), checked in a few passes; any mixture by the general check below
    if 0xA0 <= lo and hi <= 0xBF:  # fixstr: the length is in the first byte
        good = bool(((first & 0x1F).astype(np.int64) + 1 == span).all())
    elif lo == hi and lo in _STR_HEADS and shortest >= _STR_HEADS[lo]:  # bytes after the first lie in the item
        head = _STR_HEADS[lo]
        length = data[starts + 1].astype(np.int64)
        for k in range(2, head):
            length = (length << 8) | data[starts + k]
        good = bool((length + head == span).all())
    else:
        last = data.size - 1
        b1, b2, b3, b4 = (data[np.minimum(starts + k, last)].astype(np.int64) for k in range(1, 5))
        first64 = first.astype(np.int64)
        fix = (first64 >= 0xA0) & (first64 <= 0xBF)
        length = np.where(fix, first64 & 0x1F, np.where(first64 == 0xD9, b1, np.where(
            first64 == 0xDA, (b1 << 8) | b2, (b1 << 24) | (b2 << 16) | (b3 << 8) | b4)))
        head_of = np.where(fix, 1, np.where(first64 == 0xD9, 2, np.where(first64 == 0xDA, 3, 5)))
        valid = fix | (first64 == 0xD9) | (first64 == 0xDA) | (first64 == 0xDB)
        good = bool(valid.all()) and not bool((head_of + length != span).any())
    if not good:
        raise ValueError("string column item is not a string of its offsets' length")


#: msgpack's str8, str16 and str32 markers: the bytes of each one's header (marker and length)
_STR_HEADS = {0xD9: 2, 0xDA: 3, 0xDB: 5}


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
        with reader.transient(node["o"]) as offset_bytes:
            offsets = offset_bytes.view("<i8").copy()
        head = array_head(count)

        def decode(data: np.ndarray) -> Any:
            if int(offsets[0]) != len(head) or data[: len(head)].tobytes() != head \
                    or int(offsets[-1]) != data.size:
                raise ValueError("string column header does not match its shape")
            try:
                return msgpack.unpackb(data.data, raw=False, unicode_errors=errors)
            except Exception as exc:  # noqa: BLE001 - raised below, once the check has run
                return exc

        # the items are checked against their offsets after the decode (safe on any bytes), on
        # this thread: the pages are mapped by then, and the check's NumPy calls, which let go
        # of the GIL, do not hand it back and forth with a thread waiting for it. A failed check
        # is the error raised (it names what is wrong), else a failed decode's own.
        items = reader.decoded(node["c"], decode, lambda data: _check_items(data, offsets[:-1], offsets[1:]))
        if isinstance(items, Exception):
            raise items
    array = np.empty(len(items), dtype=object)
    array[:] = items
    if rows is not None and shape:
        first = min(rows)
        array = array.reshape([-1, *shape[1:]])
        if rows.step != 1 or len(rows) != max(rows) + 1 - first:
            array = array[[i - first for i in rows]]
        return array
    return array.reshape(shape)


# --------------------------------------------------------------------------- scratch memory
#: The most memory one load's transient reads may take from :class:`Scratch` (string columns and
#: the body: bytes that msgpack copies into Python objects and that are dropped right after).
#: Reads beyond it get new memory of their own: a file cannot make the scratch grow.
SCRATCH_BYTES = 32 << 20
#: How many scratch buffers the process keeps (loads on more threads at once get new memory).
SCRATCH_BUFFERS = 2
#: Transient reads of at least this many bytes from a local file are decoded from a read-only map
#: of the file (:meth:`~rollout_mock.codec.safe.FileSource.view_range`), CRC-checked in place;
#: smaller ones (a map costs a few system calls) go to the scratch.
VIEW_BYTES = 1 << 20
_ALIGN = 64


class Scratch:
    """Reused memory for one load's transient reads, at most ``cap`` bytes.

    Reading into new memory costs a page fault and the zeroing of every page (~4x the read
    itself: 38 MB of string columns take ~35 ms into ``torch.empty`` memory, ~8 ms into touched
    memory), so transient bytes go here instead: the pages stay mapped from one load to the next.
    :meth:`take` hands out ranges one after another; :meth:`drop` gives back everything taken
    after a :attr:`top` it was given (the ranges nest: a string column inside a body value).
    """

    def __init__(self, cap: int = SCRATCH_BYTES) -> None:
        self.cap = cap
        self.top = 0
        #: the most bytes ever taken at once (never more than ``cap``)
        self.peak = 0
        self._memory: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of memory held (0 until first used, then ``cap``: untouched pages cost nothing)."""
        return 0 if self._memory is None else self._memory.nbytes

    def take(self, nbytes: int) -> np.ndarray | None:
        """``nbytes`` of the scratch memory, or None when they do not fit under the cap."""
        end = self.top + nbytes
        if end > self.cap:
            return None
        if self._memory is None:
            self._memory = np.empty(self.cap, dtype=np.uint8)  # pages are mapped as they are touched
        out = self._memory[self.top: end]
        self.top = min(self.cap, -(-end // _ALIGN) * _ALIGN)
        self.peak = max(self.peak, end)
        return out

    def drop(self, top: int) -> None:
        """Give back what was taken after :attr:`top` was ``top``."""
        self.top = min(self.top, top)


_SCRATCH_FREE: list[Scratch] = []
_SCRATCH_MADE = [0]
_SCRATCH_LOCK = threading.Lock()


def lease_scratch() -> Scratch | None:
    """A scratch buffer of the process's :data:`SCRATCH_BUFFERS` (None when all are in use)."""
    with _SCRATCH_LOCK:
        if _SCRATCH_FREE:
            return _SCRATCH_FREE.pop()
        if _SCRATCH_MADE[0] < SCRATCH_BUFFERS:
            _SCRATCH_MADE[0] += 1
            return Scratch()
    return None


def return_scratch(scratch: Scratch) -> None:
    scratch.drop(0)
    with _SCRATCH_LOCK:
        _SCRATCH_FREE.append(scratch)


#: The block :func:`settle_allocator` allocates and frees: just under glibc's largest dynamic
#: mmap threshold (``DEFAULT_MMAP_THRESHOLD_MAX``, 32 MiB on 64-bit).
SETTLE_BYTES = (32 << 20) - (8 << 10)
_SETTLED = [False]


def settle_allocator() -> None:
    """Once per process, at the first load: allocate and free one block of
    :data:`SETTLE_BYTES`, never touched (one ``mmap`` and ``munmap``, no page faulted in).

    glibc's ``free`` of such a block raises the allocator's dynamic thresholds (mmap 128 KiB ->
    32 MiB, heap trim 256 KiB -> 64 MiB), as they are in a process that has freed a tensor of a
    few MB. Below them the heap hands the memory of freed strings back to the kernel, and the
    next load's strings (verl's two text columns: 36 MB) fault in and zero 9,300 new pages
    again, ~2x the load, whichever loader (msgpack's or ``pickle.load``) runs after the free.
    A process whose thresholds were set (``mallopt``, ``MALLOC_TRIM_THRESHOLD_``,
    ``MALLOC_MMAP_THRESHOLD_``) keeps them: glibc then ignores the free; other allocators see
    one malloc and one free. See docs/performance.md."""
    if not _SETTLED[0]:
        _SETTLED[0] = True
        try:
            np.empty(SETTLE_BYTES, np.uint8)
        except MemoryError:  # (no overcommit, a tight ulimit): the thresholds stay as they were
            pass


# --------------------------------------------------------------------------- chunks
def _crc_check(data: Any, expected: int, index: int) -> None:
    if crc32(data) != expected:
        raise ValueError(f"chunk {index} fails its CRC-32 check (the file is corrupt)")


class ChunkReader:
    """Reads and CRC-checks chunks of a format-2 file (see the module docstring).

    ``verify``: check each chunk's CRC-32; ``parallel``: fill large steps on two threads (local
    files: remote sources keep their own request pattern); ``scratch``: where :meth:`transient`
    reads go (default: one of the process's, leased on first use, given back by :meth:`close`).
    """

    def __init__(self, source: Any, layout: Layout, *, verify: bool = True, parallel: bool = False,
                 scratch: Scratch | None = None) -> None:
        self.source = source
        self.layout = layout
        self.table = layout.table
        self.verify = verify
        self.parallel = parallel
        self.direct = hasattr(source, "readinto_range")
        self.mapped = hasattr(source, "map_range")
        self.pending: list[tuple[int, Any, bool]] | None = None
        self.pending_bytes = 0
        self.checks: list[Any] = []
        self.scratch = scratch
        self._leased = False
        settle_allocator()

    def _chunk(self, index: int) -> Any:
        offset, stored, raw, crc, codec, shuf = self.table[index]
        data = self.source.read_range(self.layout.data_base + offset, stored)
        if self.verify:
            _crc_check(data, crc, index)
        return decompress(data, codec, shuf, raw)

    def _fill(self, job: tuple[int, Any, bool]) -> None:
        """Job ``(chunk, memory, in_place)``: read the chunk into the memory, or (``in_place``:
        the memory is the mapped file itself) only check it."""
        i, part, in_place = job
        offset, stored, raw, crc, codec, shuf = self.table[i]
        if in_place:
            if self.verify:
                _crc_check(part, crc, i)
        elif codec == 0 and self.direct:
            self.source.readinto_range(self.layout.data_base + offset, part)
            if self.verify:
                _crc_check(part, crc, i)
        else:
            part[:] = memoryview(self._chunk(i)).cast("B")

    def _run(self, jobs: list[tuple[int, Any, bool]], total: int) -> None:
        if len(jobs) > 1 and total >= PARALLEL_BYTES and self.parallel:
            # local reads (and page faults of the fresh memory) and CRCs release the GIL: two at
            # once (remote sources keep their own request pattern)
            list(pool().map(self._fill, jobs))
        else:
            for job in jobs:
                self._fill(job)

    def _mapped_run(self, first: int, count: int) -> int | None:
        """File offset of chunks ``first..first+count-1`` when they can be used in place: mapped,
        stored uncompressed and back to back; None otherwise."""
        return self._contiguous(first, count) if self.mapped else None

    def _contiguous(self, first: int, count: int) -> int | None:
        """File offset of chunks ``first..first+count-1`` when they are stored uncompressed and
        back to back (their stored bytes are their raw bytes); None otherwise."""
        if count == 0:
            return None
        expected = self.table[first][0]
        for i in range(first, first + count):
            offset, stored, _raw, _crc, codec, _shuf = self.table[i]
            if codec != 0 or offset != expected:
                return None
            expected += stored
        return self.layout.data_base + self.table[first][0]

    def _schedule(self, jobs: list[tuple[int, Any, bool]], total: int, defer: bool) -> None:
        if defer and self.pending is not None:
            self.pending.extend(jobs)
            self.pending_bytes += total
        else:
            self._run(jobs, total)

    def whole(self, ref: list[int], nbytes: int | None, *, defer: bool = False) -> torch.Tensor:
        """The bytes of a reference as a uint8 tensor: new memory (``defer``: filled by
        :meth:`finish`), or the mapped file itself for a :class:`MappedSource`."""
        first, count = ref
        total = sum(self.table[i][2] for i in range(first, first + count))
        if nbytes is not None and total != nbytes:
            raise ValueError("data size mismatch")
        start = self._mapped_run(first, count)
        if start is not None and total:
            view = self.source.map_range(start, total)
            jobs, pos = [], 0
            for i in range(first, first + count):
                jobs.append((i, view[pos: pos + self.table[i][1]], True))
                pos += self.table[i][1]
            self._schedule(jobs, total, defer)
            return torch.frombuffer(view, dtype=torch.uint8)
        out = host_empty(total)
        target = out.numpy()
        jobs, pos = [], 0
        for i in range(first, first + count):
            jobs.append((i, target[pos: pos + self.table[i][2]], False))
            pos += self.table[i][2]
        self._schedule(jobs, total, defer)
        return out

    def kept(self, ref: list[int]) -> np.ndarray:
        """The bytes of a reference, read and checked now, for a caller that copies what it needs
        out of them (msgpack) and drops them: in this load's scratch memory when they fit
        (valid until :meth:`close`), else new memory; the mapped file itself when mapped."""
        first, count = ref
        viewed = self._viewed(ref)
        if viewed is not None:
            view, jobs = viewed
            self._run(jobs, view.nbytes)
            return view
        if self._mapped_run(first, count) is None:
            scratch = self._scratch()
            total = sum(self.table[i][2] for i in range(first, first + count))
            target = None if scratch is None else scratch.take(total)
            if target is not None:
                jobs, pos = [], 0
                for i in range(first, first + count):
                    jobs.append((i, target[pos: pos + self.table[i][2]], False))
                    pos += self.table[i][2]
                self._run(jobs, total)
                return target
        data: np.ndarray = self.whole(ref, None).numpy()
        return data

    def _viewed(self, ref: list[int]) -> tuple[np.ndarray, list[tuple[int, Any, bool]]] | None:
        """A large run of uncompressed chunks of a local file: a read-only map of it
        (:data:`VIEW_BYTES`) and the CRC checks to run on it; None otherwise."""
        first, count = ref
        start = None if self.mapped else self._contiguous(first, count)
        if start is None or not hasattr(self.source, "view_range"):
            return None
        total = sum(self.table[i][2] for i in range(first, first + count))
        if total < VIEW_BYTES:
            return None
        view = self.source.view_range(start, total)
        jobs, pos = [], 0
        for i in range(first, first + count):
            jobs.append((i, view[pos: pos + self.table[i][1]], True))
            pos += self.table[i][1]
        return np.frombuffer(view, dtype=np.uint8), jobs

    def decoded(self, ref: list[int], decode: Callable[[np.ndarray], Any],
                check: Callable[[np.ndarray], None]) -> Any:
        """``decode(bytes of ref)``, for a decoder that copies what it needs out of the bytes
        (:meth:`transient`), then ``check(bytes of ref)`` on this thread, which raises where the
        bytes do not hold what the decode assumed (the decoded value is then dropped). A mapped
        run (:meth:`_viewed`) is decoded on the codec's decoder thread
        (:func:`~rollout_mock.codec.format.decoder_thread`) while this one checks its CRC in one
        call over the whole run, without the GIL (compared with the chunks' CRCs combined), so
        the CRC costs no wall time where a core is free; a failed CRC is the error raised, also
        when the decode failed (a corrupt chunk is named as such, not as the decode error it
        caused). The decoder is safe on any bytes."""
        viewed = self._viewed(ref) if self.verify else None
        if viewed is None:
            with self.transient(ref) as data:
                value = decode(data)
                check(data)
                return value
        view, jobs = viewed
        work = decoder_thread().submit(decode, view)
        expected = None
        for i, _part, _in_place in jobs:
            crc, stored = self.table[i][3], self.table[i][1]
            expected = crc if expected is None else crc32_combine(expected, crc, stored)
        if crc32(view) != expected:
            work.exception()  # the decode reads the map: wait for it to end before raising
            for job in jobs:
                self._fill(job)  # names the corrupt chunk
            raise ValueError("a run of chunks fails its CRC-32 check (the file is corrupt)")
        value = work.result()
        check(view)
        return value

    @contextmanager
    def transient(self, ref: list[int]) -> Iterator[np.ndarray]:
        """:meth:`kept`, given back to the scratch memory when the block ends."""
        scratch = self._scratch()
        top = 0 if scratch is None else scratch.top
        try:
            yield self.kept(ref)
        finally:
            if scratch is not None:
                scratch.drop(top)

    def _scratch(self) -> Scratch | None:
        if self.scratch is None and not self._leased:
            self.scratch, self._leased = lease_scratch(), True
        return self.scratch

    def close(self) -> None:
        """Give the scratch memory back (what :meth:`kept` returned is reused by later loads)."""
        if self._leased and self.scratch is not None:
            return_scratch(self.scratch)
        self.scratch, self._leased = None, True

    def after(self, check: Any) -> None:
        """Run ``check`` once the deferred data is in (at once when nothing is deferred)."""
        if self.pending is None:
            check()
        else:
            self.checks.append(check)

    def flush(self) -> None:
        """Fill every chunk deferred so far (for decoders that copy data: nested tensors)."""
        if self.pending:
            jobs, self.pending = self.pending, []
            self._run(jobs, self.pending_bytes)
            self.pending_bytes = 0

    def finish(self) -> None:
        """Fill (and CRC-check) every deferred chunk, then run the checks that needed the data."""
        self.flush()
        self.pending = None
        checks, self.checks = self.checks, []
        for check in checks:
            check()

    def span(self, ref: list[int], lo: int, hi: int) -> torch.Tensor:
        """Bytes [lo, hi) of a reference; reads (and checks) only the chunks covering them."""
        first, count = ref
        starts = [0]
        for i in range(first, first + count):
            starts.append(starts[-1] + self.table[i][2])
        if not 0 <= lo <= hi <= starts[-1]:
            raise ValueError("row range outside the data")
        k = max(0, bisect.bisect_right(starts, lo) - 1)
        last = k
        while last < count and starts[last] < hi:
            last += 1
        start = self._mapped_run(first + k, last - k)
        if start is not None and hi > lo:  # in place: check the covering chunks, copy nothing
            view = self.source.map_range(start, starts[last] - starts[k])
            for j in range(k, last):
                self._fill((first + j, view[starts[j] - starts[k]: starts[j + 1] - starts[k]], True))
            return torch.frombuffer(view[lo - starts[k]: hi - starts[k]], dtype=torch.uint8)
        out = host_empty(hi - lo)
        target = out.numpy()
        while k < count and starts[k] < hi:
            data = memoryview(self._chunk(first + k)).cast("B")
            a, b = max(lo, starts[k]), min(hi, starts[k + 1])
            target[a - lo: b - lo] = data[a - starts[k]: b - starts[k]]
            k += 1
        return out


# --------------------------------------------------------------------------- the body
class _CollectorPause:
    """The cyclic garbage collector off while body values are decoded, on any thread, and as it
    was when the last of them ends (a caller that disabled it keeps it disabled).

    msgpack builds no cycles, but every list and dict it makes counts towards the collector's
    thresholds: a slime body (512 samples, ~2M numbers in ~2,600 lists) would trigger young
    collections that walk the new lists' items again and again (~20% of the decode), and with
    the collector merely paused, the first allocation after the load still runs one that walks
    them all (~5 ms). A decoded batch is long-lived by nature, so when the last decode ends, its
    objects go straight to the oldest generation (``gc.freeze(); gc.unfreeze()``: list merges,
    no walk) and only full collections see them, as they see a batch ``pickle.load`` built.
    The trade-off: young objects of other threads move up with it (cyclic garbage among them
    waits for the next full collection), and nothing moves when the caller froze objects
    itself (``gc.freeze()`` before a fork: unfreezing would undo it) or disabled the collector.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0  # body decodes in progress (all threads)
        self._resume = False  # whether the first of them found the collector enabled

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._depth += 1
        done = False
        try:
            yield
            done = True
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._resume:
                    if done and gc.get_freeze_count() == 0:
                        gc.freeze()
                        gc.unfreeze()
                    gc.enable()


_collector_paused = _CollectorPause()


def _forked_child() -> None:
    """In a forked child none of the parent's threads exist: the scratch buffers they leased
    are free again, and a decode one of them was in does not keep the collector off (the
    collector comes back as that decode found it)."""
    global _SCRATCH_LOCK, _collector_paused
    _SCRATCH_LOCK = threading.Lock()
    _SCRATCH_FREE.clear()
    _SCRATCH_MADE[0] = 0
    if _collector_paused._depth and _collector_paused._resume:
        gc.enable()
    _collector_paused = _CollectorPause()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)


_MAX_DIM = 1 << 48
_MAX_INT_BYTES = 1 << 16


class _Marker:
    """What a marker extension decodes to until its array is rebuilt (never returned)."""

    __slots__ = ("code",)

    def __init__(self, code: int) -> None:
        self.code = code

    def __repr__(self) -> str:
        return f"<rollout_mock marker {self.code}>"


_MARKERS = {code: _Marker(code) for code in (EXT_TUPLE, EXT_SET, EXT_FROZENSET, EXT_OBJARRAY)}


#: What :meth:`BodyReader._cached_keys` returns where msgpack's path must decode the value.
_SLOW_PATH = object()
#: Body values below this size go through msgpack's path (either path is fast on them).
_SMALL_MAPS_BYTES = 16 << 10
#: How many items a value must have, and how much of its start is looked at, for
#: :func:`_many_small_maps` to send it to ormsgpack
_SMALL_MAPS_ITEMS = 256
_SNIFF_BYTES = 1024
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _many_small_maps(data: memoryview) -> bool:
    """Whether a body value is a long list (or object array) whose first item is a map of plain
    scalars: verl's ``extra_info`` and ``reward_model`` columns, per-sample metadata. Such values
    decode in half the time with ormsgpack (:meth:`BodyReader._cached_keys`); lists of numbers
    (a slime sample's tokens and log-probs) decode faster with msgpack (ints 1.3x slower with
    ormsgpack, maps holding 64-item lists 1.3x), so only the first kind goes there. Looks at the
    value's first :data:`_SNIFF_BYTES` bytes only."""
    if data.nbytes < _SMALL_MAPS_BYTES:
        return False
    sniff = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=_SNIFF_BYTES)
    sniff.feed(data[:_SNIFF_BYTES])
    try:
        count = sniff.read_array_header()
        first = sniff.unpack()
        if type(first) is msgpack.ExtType and first.code == EXT_OBJARRAY:
            sniff.skip()  # the object array's shape
            first, count = sniff.unpack(), count - 2
    except (ValueError, msgpack.UnpackException):
        return False
    return count >= _SMALL_MAPS_ITEMS and type(first) is dict and all(type(v) in _SCALARS for v in first.values())


def _dims(data: bytes, ndim: int, at: int) -> list[int]:
    if ndim > MAX_NDIM or len(data) < at + 8 * ndim:
        raise ValueError("bad tensor extension (dimensions)")
    dims = list(struct.unpack_from(f"<{ndim}Q", data, at))
    if any(d > _MAX_DIM for d in dims):
        raise ValueError("bad tensor extension (dimension too large)")
    return dims


class BodyReader:
    """Decodes ``mp`` nodes: msgpack from the body, tensors from (shared) chunks.

    ``decoder``: the :class:`~rollout_mock.codec.decode.NodeDecoder` (its chunk reader, and its
    :meth:`value` for version-2 nodes); ``raws``: each chunk's raw size; ``table``: the chunk
    table for checks; ``used``: chunk references so far.
    """

    def __init__(self, decoder: Any, body: list[int] | None, raws: list[int], *, surrogates: bool,
                 table: list[list[int]] | None, used: list[int]) -> None:
        self.decoder = decoder
        self.reader = decoder.reader
        self.body_ref = body
        self.raws = raws
        self.table = table
        self.used = used
        self.errors = "surrogatepass" if surrogates else "strict"
        self._body: memoryview | None = None
        #: shared chunks read so far: the chunk's tensor and its memory
        self._shared: dict[int, tuple[torch.Tensor, memoryview]] = {}
        #: bool views of shared chunks: checked once per chunk, over the union of their ranges
        self._bools: dict[int, list[tuple[int, int]]] = {}

    def value(self, node: dict[str, Any]) -> Any:
        if self._body is None:
            if self.body_ref is None:
                raise ValueError("body value in a step without a body")
            self._body = memoryview(self.reader.kept(self.body_ref)).cast("B")
        offset, length = node["o"], node["n"]
        if offset + length > self._body.nbytes:
            raise ValueError("body value outside the body")
        data = self._body[offset: offset + length]
        used = self.used[0]
        try:
            with _collector_paused():
                if self.errors == "strict" and _many_small_maps(data):
                    value = self._cached_keys(data)
                    if value is not _SLOW_PATH:
                        return value
                    self.used[0] = used  # its references are counted again below
                try:
                    return msgpack.unpackb(data, ext_hook=self.ext, list_hook=self.lists, strict_map_key=True,
                                           unicode_errors=self.errors, raw=False, timestamp=2)
                except ValueError as exc:
                    if "is not allowed for map key" not in str(exc):
                        raise
                self.used[0] = used  # the references of the first pass are counted again below
                # non-string keys: every map goes through the hash-collision check
                return msgpack.unpackb(data, ext_hook=self.ext, list_hook=self.lists, strict_map_key=False,
                                       object_pairs_hook=self.pairs, unicode_errors=self.errors, raw=False, timestamp=2)
        except msgpack.StackError:
            raise ValueError("body value nested deeper than msgpack's limit") from None
        except msgpack.FormatError:
            raise ValueError("body value is not valid msgpack") from None

    def _cached_keys(self, data: memoryview) -> Any:
        """``data`` decoded by ormsgpack, which makes one ``str`` per distinct map key where
        msgpack-python makes and interns one per key (4,096 maps of three keys: 0.4 ms against
        0.9 ms, pickle's 0.4 ms); :data:`_SLOW_PATH` wherever msgpack's path (:meth:`value`)
        could decode the bytes differently, and that path then decides: any bytes ormsgpack
        refuses (a key that is not a string, invalid UTF-8, nesting of 1,023), a marker anywhere
        but at the head of the value (a tuple, set or object array inside it: only msgpack's list
        hook rebuilds those), bytes left after the value (ormsgpack ignores them: msgpack's
        ``skip`` measures the value first, without building anything), and every extension but
        big ints and the head's marker (tensors, arrays, nodes, msgpack's timestamp): a value
        decoded again by msgpack's path runs its hook again, so this path runs only hooks that
        do nothing but return a value. An error of the hook itself is raised as it is
        (ormsgpack would turn it, even a KeyboardInterrupt, into a ValueError)."""
        seen, marked = 0, False
        failed: list[BaseException] = []

        def ext(code: int, payload: bytes) -> Any:
            nonlocal seen, marked
            if code != EXT_INT and (code not in _MARKERS or seen):
                raise ValueError("for msgpack's path")  # (not an error of the hook: not in failed)
            seen += 1
            marked = marked or code in _MARKERS
            try:
                return self.ext(code, payload)
            except BaseException as exc:
                failed.append(exc)
                raise

        measure = msgpack.Unpacker(max_buffer_size=data.nbytes)
        measure.feed(data)
        try:
            measure.skip()
        except (ValueError, msgpack.UnpackException):
            return _SLOW_PATH
        if measure.tell() != data.nbytes:
            return _SLOW_PATH
        try:
            value = ormsgpack.unpackb(data, ext_hook=ext)
        except ValueError:
            if failed:
                raise failed[0] from None
            return _SLOW_PATH
        if not marked:
            return value
        if type(value) is not list or not value or type(value[0]) is not _Marker:
            return _SLOW_PATH  # the first extension was a marker, but inside the value
        return self.lists(value)

    @staticmethod
    def pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        check_keys([k for k, _ in pairs])
        return dict(pairs)

    @staticmethod
    def lists(items: list[Any]) -> Any:
        if not items or type(items[0]) is not _Marker:
            return items
        code = items[0].code
        if code == EXT_TUPLE:
            return tuple(items[1:])
        if code == EXT_SET or code == EXT_FROZENSET:
            members = items[1:]
            check_keys(members)
            return set(members) if code == EXT_SET else frozenset(members)
        shape = items[1] if len(items) > 1 else None
        if type(shape) is not list or len(shape) > MAX_NDIM or any(type(d) is not int or d < 0 for d in shape) \
                or math.prod(shape) != len(items) - 2:
            raise ValueError("object array shape does not match its items")
        # fromiter keeps each item as it is (a list item stays one object, never a new dimension)
        return np.fromiter(items[2:], dtype=object, count=len(items) - 2).reshape(shape)

    def ext(self, code: int, data: bytes) -> Any:
        if code in _MARKERS:
            if data:
                raise ValueError("marker extension with a payload")
            return _MARKERS[code]
        if code == EXT_INT:
            if not data or len(data) > _MAX_INT_BYTES:
                raise ValueError("bad integer extension")
            return int.from_bytes(data, "little", signed=True)
        if code == EXT_TENSOR or code == EXT_NDARRAY:
            return self._tensor(data, code == EXT_NDARRAY)
        if code == EXT_NODE:
            try:
                node = msgpack.unpackb(data, strict_map_key=True, unicode_errors="surrogatepass", raw=False,
                                       timestamp=2)
            except (msgpack.StackError, msgpack.FormatError):
                raise ValueError("node extension is not valid msgpack") from None
            if self.table is not None:
                check_tree(node, self.table, used=self.used)
            return self.decoder.value(node)
        raise ValueError(f"unknown body extension {code}")

    def _raw(self, first: int, count: int, offset: int, nbytes: int) -> torch.Tensor:
        if count == 1:
            if first >= len(self.raws) or offset + nbytes > self.raws[first]:
                raise ValueError("tensor data outside its chunk")
            shared = self._shared.get(first)
            if shared is None:
                chunk = self.reader.whole([first, 1], None, defer=True)
                shared = self._shared[first] = (chunk, _memory(chunk))
            return _own(shared[1], offset, nbytes)
        if offset or first + count > len(self.raws) or sum(self.raws[first: first + count]) != nbytes:
            raise ValueError("tensor data does not match its chunks")
        self.used[0] += count
        if self.table is not None and self.used[0] > len(self.table):
            raise ValueError("chunks are referenced more than once")
        return self.reader.whole([first, count], nbytes, defer=True)

    def _tensor(self, data: bytes, numpy: bool) -> Any:
        if len(data) < TENSOR_HEAD.size:
            raise ValueError("bad tensor extension")
        code, flags, ndim, device, first, count, offset = TENSOR_HEAD.unpack_from(data)
        dims = _dims(data, ndim, TENSOR_HEAD.size)
        if numpy:
            dtype = numpy_dtype(data[TENSOR_HEAD.size + 8 * ndim:].decode("ascii"))
            nbytes = math.prod(dims) * dtype.itemsize
            raw = self._raw(first, count, offset, nbytes) if nbytes else torch.empty(0, dtype=torch.uint8)
            array = raw.numpy().view(dtype).reshape(dims)
            if flags & 4:
                array.flags.writeable = False
            return array
        if code >= len(TORCH_DTYPE_NAMES) or TORCH_DTYPE_NAMES[code] not in TORCH_DTYPES \
                or len(data) != TENSOR_HEAD.size + 8 * ndim:
            raise ValueError("bad tensor extension (dtype)")
        torch_dtype = TORCH_DTYPES[TORCH_DTYPE_NAMES[code]]
        nbytes = math.prod(dims) * torch_dtype.itemsize
        if offset % torch_dtype.itemsize:  # writers align to 64 bytes; torch needs whole items
            raise ValueError("tensor data is not aligned to its item size")
        if nbytes == 0:
            out = torch.zeros(dims, dtype=torch_dtype)
        else:
            raw = self._raw(first, count, offset, nbytes)
            if torch_dtype is torch.bool:
                self._check_bools(first, count, offset, raw)
            out = raw.view(torch_dtype).view(dims)
        # flag 1 (requires_grad, written before 0.1) is ignored: a step holds data
        out = torch.nn.Parameter(out, requires_grad=False) if flags & 2 else out
        if flags & 8:  # recorded on cuda:<the fourth byte>
            note_device(out, device)
        return out

    def _check_bools(self, first: int, count: int, offset: int, raw: torch.Tensor) -> None:
        """Check a bool tensor's bytes once the data is in: a run of chunks of its own at once,
        a view of a shared chunk together with every other bool view of that chunk."""
        if count != 1:  # chunks of its own (counted once against the table)
            self.reader.after(lambda: _check_bool(raw))
            return
        ranges = self._bools.setdefault(first, [])
        if not ranges:
            self.reader.after(lambda: self._check_shared_bools(first))
        ranges.append((offset, offset + raw.numel()))

    def _check_shared_bools(self, first: int) -> None:
        chunk, start, end = self._shared[first][0], 0, -1
        for lo, hi in sorted(self._bools.pop(first)):
            if lo > end:
                if end > start:
                    _check_bool(chunk[start:end])
                start, end = lo, hi
            else:
                end = max(end, hi)
        if end > start:
            _check_bool(chunk[start:end])


def _check_bool(raw: torch.Tensor) -> None:
    if bool((raw > 1).any()):
        raise ValueError("bool tensor holds bytes other than 0 and 1")


# --------------------------------------------------------------------------- nodes
_FACTORIES: dict[Any, Any] = {None: None, "list": list, "dict": dict, "set": set, "int": int,
                              "float": float, "str": str, "tuple": tuple}


def normalize_rows(rows: Any) -> slice | None:
    """``rows`` of a partial load as a slice (None: every row); TypeError for anything else."""
    if rows is None or isinstance(rows, slice):
        return rows
    if isinstance(rows, range):
        return slice(rows.start, rows.stop, rows.step)
    raise TypeError(f"rows must be a slice or range, not {type(rows).__name__}")


def _rows_range(rows: slice, n: int) -> range:
    return range(n)[rows]


class NodeDecoder:
    """Rebuilds objects from validated nodes; data comes from ``reader`` (a :class:`ChunkReader`).

    ``unpickle``: how opaque pickle blobs are read (a trusted load); None refuses them.
    """

    def __init__(self, reader: Any, *, unpickle: Unpickle | None, batch_class: type | None, name: str) -> None:
        self.reader = reader
        self.unpickle = unpickle
        self.batch_class = batch_class
        self.name = name
        self.body: BodyReader | None = None

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
        # "grad" (written before 0.1) is ignored: a step holds data, not autograd state
        out = torch.nn.Parameter(out, requires_grad=False) if node.get("param") else out
        if "cuda" in node:  # recorded on that CUDA device
            note_device(out, node["cuda"])
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
        scalars only, as many as its shape says (:func:`~rollout_mock.codec.format.parse_items`)."""
        return parse_items(self.reader.whole(node["c"], None).numpy().data, count)

    def keyed(self, node: dict[str, Any], rows: slice | None = None, keys: frozenset[str] | None = None) -> Any:
        """A registered class made of parts (a TensorDict, its non-tensor data), rebuilt by its
        description (:class:`~rollout_mock.batch.KeyedCodec`); ``rows`` of its first dimension."""
        keyed = keyed_codec_of_tag(node["$"])
        if keyed is None:
            raise ValueError(f"unknown node tag {node['$']!r:.40}")
        if rows is not None:
            node, rows = keyed.rows(node, rows) or (node, None)
        return keyed.build(node, keyed.read(node, lambda part: self.value(part, rows), keys), self.reader.flush)

    def blob(self, node: dict[str, Any]) -> Any:
        if self.unpickle is None:
            raise UnsafePickleError(
                f"{self.name}: {node.get('path') or 'the root object'} holds {node.get('what')}, stored "
                f"as an opaque pickle; the safe loader never unpickles. If you trust this dump, load "
                f"it with {OPT_IN}.",
                path=self.name,
            )
        return self.unpickle(self.reader.whole(node["c"], None).numpy().tobytes())

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
        if tag == "strs":
            return read_strings(self.reader, node, None if rows is None or not node["shape"]
                                else _rows_range(rows, node["shape"][0]))
        if tag == "tensor":
            return self.tensor(node, rows)
        if tag == "ndarray":
            return self.ndarray(node, rows)
        if tag == "objarray":
            return self.objarray(node, rows)
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
        if tag in CLASS_TAGS:  # classes.py: numpy string scalars, jagged tensors
            return decode_class(self, node, tag, rows)
        return self._small(node, tag, rows)

    def _small(self, node: dict[str, Any], tag: str, rows: slice | None) -> Any:
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
        return self.keyed(node, rows)  # a registered batch class's tag, or an unknown one (refused)

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
        if type(node) is dict and keyed_codec_of_tag(node.get("$")) is not None:
            return self.keyed(node, rows, keys)
        return self.value(node, rows)

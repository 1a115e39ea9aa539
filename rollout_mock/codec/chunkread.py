"""Reading the chunks of a format-2 step file: CRC-checked, deferred and filled on two threads
for large local steps, or used in place when the file is mapped (:class:`MappedSource`)."""

from __future__ import annotations

import bisect
from typing import Any

import torch

from rollout_mock.codec import chunks as _chunks
from rollout_mock.codec._threads import PARALLEL_BYTES, pool
from rollout_mock.codec.decode import crc_check
from rollout_mock.codec.header import Layout
from rollout_mock.codec.source import FileSource

__all__ = ["ChunkReader"]


class ChunkReader:
    """Reads and CRC-checks chunks of a format-2 file.

    During :meth:`StepView.load` the reads of tensor and array data are *deferred*: the decoder
    gets each tensor's (still empty) memory at once, and :meth:`finish` then fills every chunk of
    the step, on two threads for large local steps (reads, page faults and CRCs release the GIL),
    and checks each chunk's CRC before the step is returned.
    """

    def __init__(self, source: Any, layout: Layout, *, verify: bool = True) -> None:
        self.source = source
        self.layout = layout
        self.table = layout.table
        self.verify = verify
        self.direct = hasattr(source, "readinto_range")
        self.mapped = hasattr(source, "map_range")
        self.pending: list[tuple[int, Any, bool]] | None = None
        self.pending_bytes = 0
        self.checks: list[Any] = []

    def _chunk(self, index: int) -> Any:
        offset, stored, raw, crc, codec, shuf = self.table[index]
        data = self.source.read_range(self.layout.data_base + offset, stored)
        if self.verify:
            crc_check(data, crc, index)
        return _chunks.decompress(data, codec, shuf, raw)

    def _fill(self, job: tuple[int, Any, bool]) -> None:
        """Job ``(chunk, memory, in_place)``: read the chunk into the memory, or (``in_place``:
        the memory is the mapped file itself) only check it."""
        i, part, in_place = job
        offset, stored, raw, crc, codec, shuf = self.table[i]
        if in_place:
            if self.verify:
                crc_check(part, crc, i)
        elif codec == 0 and self.direct:
            self.source.readinto_range(self.layout.data_base + offset, part)
            if self.verify:
                crc_check(part, crc, i)
        else:
            part[:] = memoryview(self._chunk(i)).cast("B")

    def _run(self, jobs: list[tuple[int, Any, bool]], total: int) -> None:
        if len(jobs) > 1 and total >= PARALLEL_BYTES and isinstance(self.source, FileSource):
            # local reads (and page faults of the fresh memory) and CRCs release the GIL: two at
            # once (remote sources keep their own request pattern)
            list(pool().map(self._fill, jobs))
        else:
            for job in jobs:
                self._fill(job)

    def _mapped_run(self, first: int, count: int) -> int | None:
        """File offset of chunks ``first..first+count-1`` when they can be used in place: mapped,
        stored uncompressed and back to back; None otherwise."""
        if not self.mapped or count == 0:
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
        out = torch.empty(total, dtype=torch.uint8)
        target = out.numpy()
        jobs, pos = [], 0
        for i in range(first, first + count):
            jobs.append((i, target[pos: pos + self.table[i][2]], False))
            pos += self.table[i][2]
        self._schedule(jobs, total, defer)
        return out

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
        out = torch.empty(hi - lo, dtype=torch.uint8)
        target = out.numpy()
        while k < count and starts[k] < hi:
            data = memoryview(self._chunk(first + k)).cast("B")
            a, b = max(lo, starts[k]), min(hi, starts[k + 1])
            target[a - lo: b - lo] = data[a - starts[k]: b - starts[k]]
            k += 1
        return out

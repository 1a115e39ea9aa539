"""ReadAheadSource: a step's chunk reads from an object store in a few block requests."""

from __future__ import annotations

import os
from typing import Any

from rollout_mock.codec import BytesSource, ReadAheadSource


class Counting:
    def __init__(self, data: bytes) -> None:
        self.inner, self.name, self.requests = BytesSource(data, "counting"), "counting", []

    def size(self) -> int:
        return self.inner.size()

    def read_range(self, offset: int, length: int) -> Any:
        self.requests.append((offset, length))
        return bytes(self.inner.read_range(offset, length))

    def readinto_range(self, offset: int, buffer: Any) -> None:
        self.requests.append((offset, memoryview(buffer).nbytes))
        self.inner.readinto_range(offset, buffer)


def test_sequential_chunks_cost_one_request_per_block() -> None:
    data = os.urandom(1 << 20) * 20  # 20 MiB
    inner = Counting(data)
    source = ReadAheadSource(inner, block=8 << 20)
    assert bytes(source.read_range(0, 64)) == data[:64]  # the head: a small window
    assert bytes(source.read_range(len(data) - 3, 3)) == data[-3:]  # the tail: another window
    assert bytes(source.read_range(80, 3000)) == data[80:3080]  # the header: inside the first window
    offset = 4096
    while offset < len(data):  # 1 MiB chunks, in order, as the decoder reads them
        length = min(1 << 20, len(data) - offset)
        out = bytearray(length)
        source.readinto_range(offset, out)
        assert out == data[offset:offset + length]
        offset += length
    assert len(inner.requests) == 2 + 3  # two windows, then 20 MiB in blocks of 8 MiB
    big = bytearray(8 << 20)
    source.readinto_range(0, big)  # a block or more: straight through, nothing cached
    assert big == data[: 8 << 20] and inner.requests[-1] == (0, 8 << 20)

"""The storage conformance suite (rollout_mock.storage.testing) on the shipped backends: the local
directory, memory, and fsspec on ``memory://`` (the S3 run is in tests/integration/test_s3_store.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollout_mock.storage import FsspecBackend, LocalBackend, MemoryBackend
from rollout_mock.storage.backend import ByteBackend
from rollout_mock.storage.testing import BackendConformance, StoreConformance


class TestLocalBackend(BackendConformance, StoreConformance):
    @pytest.fixture
    def backends(self, tmp_path: Path) -> Callable[[], ByteBackend]:
        return lambda: LocalBackend(tmp_path / "dump")


class TestMemoryBackend(BackendConformance, StoreConformance):
    @pytest.fixture
    def backends(self) -> Callable[[], ByteBackend]:
        return MemoryBackend().reopen


class TestFsspecMemoryBackend(BackendConformance, StoreConformance):
    @pytest.fixture
    def backends(self) -> Iterator[Callable[[], ByteBackend]]:
        url = f"memory://rollout-mock-conformance/{uuid.uuid4().hex}"
        yield lambda: FsspecBackend(url)
        import fsspec

        fs = fsspec.filesystem("memory")
        if fs.exists(url):
            fs.rm(url, recursive=True)


class TestSmallPartsFsspecBackend(BackendConformance, StoreConformance):
    """Parts of 64 KiB: every step above that goes up as a multipart-style streamed write."""

    @pytest.fixture
    def backends(self) -> Iterator[Callable[[], ByteBackend]]:
        url = f"memory://rollout-mock-parts/{uuid.uuid4().hex}"
        yield lambda: FsspecBackend(url, part_size=64 << 10)
        import fsspec

        fs = fsspec.filesystem("memory")
        if fs.exists(url):
            fs.rm(url, recursive=True)

"""The store conformance suite on the local stores: DirectoryStore, MemoryStore, and the fsspec
store on ``memory://`` (the S3 run is in tests/integration/test_s3_store.py)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from storage_conformance import StoreConformance

from rollout_mock import DirectoryStore, MemoryStore
from rollout_mock.storage import FsspecStore
from rollout_mock.storage.indexed import IndexedStore


class TestDirectoryStore(StoreConformance):
    @pytest.fixture
    def handles(self, tmp_path: Path) -> Any:
        return lambda **kw: DirectoryStore(tmp_path / "dump", **kw)


class TestMemoryStore(StoreConformance):
    @pytest.fixture
    def handles(self) -> Any:
        first = MemoryStore()

        def make(**kw: Any) -> IndexedStore:
            return MemoryStore(_contents=first._c, **kw)

        return make


class TestFsspecMemoryStore(StoreConformance):
    @pytest.fixture
    def handles(self) -> Any:
        url = f"memory://rollout-mock-conformance/{uuid.uuid4().hex}"
        yield lambda **kw: FsspecStore(url, **kw)
        import fsspec

        fs = fsspec.filesystem("memory")
        if fs.exists(url):
            fs.rm(url, recursive=True)

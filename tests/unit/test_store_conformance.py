"""The storage conformance suite (rollout_mock.storage.testing) on the shipped backends (the local
directory, memory, and fsspec on ``memory://``; the S3 run is in tests/integration/test_s3_store.py),
and on two backends written from docs/contributing.md alone: a dict-backed one with only the five
required methods, and the docs' own SQLite example."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_mock.storage import FsspecBackend, LocalBackend, MemoryBackend, Store
from rollout_mock.storage.backend import ByteBackend
from rollout_mock.storage.paths import check_relpath
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


# ---------------------------------------------------------------------------------------------
# Backends written from docs/contributing.md ("Adding a storage backend") alone
# ---------------------------------------------------------------------------------------------

class DictBackend:
    """The five required methods over a dict, and nothing else (no BackendDefaults: the store fills
    in every optional member, locks included). Written from the rules table of the docs."""

    def __init__(self, objects: dict[str, bytes], mutex: threading.Lock) -> None:
        self.objects, self.mutex = objects, mutex

    def read(self, rel: str, start: int = 0, end: int | None = None) -> bytes | None:
        data = self.objects.get(check_relpath(rel))
        return None if data is None else data[start:end]

    def create(self, rel: str, data: bytes) -> bool:
        with self.mutex:
            if check_relpath(rel) in self.objects:
                return False
            self.objects[rel] = bytes(data)
            return True

    def replace(self, rel: str, data: bytes) -> None:
        with self.mutex:
            self.objects[check_relpath(rel)] = bytes(data)

    def listdir(self, rel_dir: str) -> list[str]:
        prefix = check_relpath(rel_dir) + "/" if rel_dir else ""
        with self.mutex:
            return sorted({rel[len(prefix):].split("/")[0] for rel in self.objects if rel.startswith(prefix)})

    def remove(self, rels: list[str]) -> None:
        with self.mutex:
            for rel in rels:
                self.objects.pop(check_relpath(rel), None)


class TestDictBackendFromTheDocs(BackendConformance, StoreConformance):
    @pytest.fixture
    def backends(self) -> Callable[[], ByteBackend]:
        objects: dict[str, bytes] = {}
        mutex = threading.Lock()
        return lambda: DictBackend(objects, mutex)


def _docs_example() -> dict[str, Any]:
    """The runnable SQLite backend of docs/contributing.md, its class only (the block's own
    save/load lines run in tests/unit/test_docs_examples.py)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "contributing.md").read_text(encoding="utf-8")
    section = text.split("## Adding a storage backend", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(block.split("\nstore = Store(", 1)[0], "contributing.md", "exec"), namespace)
    return namespace


class TestSQLiteBackendOfTheDocs(BackendConformance, StoreConformance):
    @pytest.fixture
    def backends(self, tmp_path: Path) -> Callable[[], ByteBackend]:
        cls = _docs_example()["SQLiteBackend"]
        return lambda: cls(tmp_path / "dump.sqlite")


def test_the_store_names_what_a_backend_lacks() -> None:
    class Half:
        def read(self, rel: str, start: int = 0, end: int | None = None) -> bytes | None:
            return None

    with pytest.raises(TypeError, match="create, replace, listdir, remove"):
        Store(Half())  # type: ignore[arg-type]


def test_byte_backend_has_at_most_eight_required_members() -> None:
    """The interface a stranger implements: the protocol's own members, nothing inherited."""
    members = {name for name in vars(ByteBackend) if not name.startswith("_")}
    assert members == {"read", "create", "replace", "listdir", "remove"}

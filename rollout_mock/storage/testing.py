"""The storage conformance suite: what every byte backend, and the store over it, must do
(zarr's ``StoreTests`` pattern). It ships with the package so that a backend of your own is
checked by the very tests the shipped ones pass::

    import pytest
    from rollout_mock.storage.testing import BackendConformance, StoreConformance

    class TestMyBackend(BackendConformance, StoreConformance):
        @pytest.fixture
        def backends(self, tmp_path):
            return lambda: MyBackend(tmp_path / "objects")  # a NEW handle on the SAME objects per call

``backends`` returns a function making a new handle on the same objects each call (as another
process would open them). :class:`BackendConformance` checks the byte-level rules of
:mod:`rollout_mock.storage.backend` (ranged reads, conditional creates across handles, atomic
replaces, listings, batched removes, and the optional members, yours or the defaults: signatures,
uploads that appear whole or not at all, ranged sources, locks); :class:`StoreConformance` runs
the one :class:`~rollout_mock.storage.store.Store` over the backend (saves, loads, deletes,
overwrite protection, torn entries, compaction, crash before commit, HMAC binding). Needs pytest
and torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from rollout_mock.errors import CorruptStepError, LockedError, StepExistsError, StepNotFoundError, UnsafePathError
from rollout_mock.storage.backend import BackendDefaults, ByteBackend, with_defaults
from rollout_mock.storage.index import entry_relpath
from rollout_mock.storage.manifest import MANIFEST_NAME, StreamId
from rollout_mock.storage.store import BatchInfo, Store

__all__ = ["BackendConformance", "StoreConformance", "batch_for", "same", "save"]

TRAIN = StreamId("train")
MATH = StreamId("train", "math")
RANK1 = StreamId("train", None, 1)
Handles = Callable[..., Store]


def batch_for(step: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(step)
    return {"ids": torch.randint(0, 1000, (4, 8), generator=gen), "reward": torch.randn(4, generator=gen),
            "meta": {"step": step}}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return torch.equal(a["ids"], b["ids"]) and torch.equal(a["reward"], b["reward"]) and a["meta"] == b["meta"]


def save(store: Store, stream: StreamId, step: int, **kw: Any) -> Any:
    batch = kw.pop("batch", None) or batch_for(step)
    return store.save(stream, step, batch, BatchInfo.of(batch), method="get_batch", **kw)


class StoreConformance:
    """The store's behaviour over a backend. Subclasses provide the ``backends`` fixture (see the
    module docstring), or ``handles`` directly."""

    @pytest.fixture
    def handles(self, backends: Callable[[], ByteBackend]) -> Handles:
        return lambda **kw: Store(backends(), **kw)

    @pytest.fixture
    def store(self, handles: Handles) -> Iterator[Store]:
        store = handles()
        yield store
        store.close()

    def test_save_load_entry(self, store: Store) -> None:
        entry = save(store, TRAIN, 3)
        assert entry.file == "train/step_000003.pkl" and entry.samples == 4 and entry.size > 0
        assert entry.checksum.startswith("crc32:") and entry.keys["ids"]["shape"] == [4, 8]
        assert store.entry(TRAIN, 3) == entry
        assert same(store.load(TRAIN, 3), batch_for(3))

    def test_steps_contains_and_streams(self, store: Store, handles: Handles) -> None:
        for step in (5, 0, 2):
            save(store, TRAIN, step)
        save(store, MATH, 0)
        save(store, RANK1, 7)
        assert store.steps(TRAIN) == [0, 2, 5] and store.steps(MATH) == [0] and store.steps(RANK1) == [7]
        assert store.contains(TRAIN, 2) and not store.contains(TRAIN, 3)
        reader = handles()  # another process sees the steps before the writer closes
        assert reader.steps(TRAIN) == [0, 2, 5] and reader.steps(RANK1) == [7]
        assert {s.key for s in reader.stream_ids()} == {"train", "train/math", "train@rank1"}
        assert same(reader.load(RANK1, 7), batch_for(7))

    def test_delete(self, store: Store, handles: Handles) -> None:
        for step in range(3):
            save(store, TRAIN, step)
        store.delete(TRAIN, 1)
        store.delete(TRAIN, 42)  # absent: nothing
        assert store.steps(TRAIN) == [0, 2] and not store.contains(TRAIN, 1)
        with pytest.raises(StepNotFoundError):
            store.load(TRAIN, 1)
        store.close()
        again = handles()  # a deleted step that was compacted: hidden by a tombstone, then gone
        again.delete(TRAIN, 0)
        assert handles().steps(TRAIN) == [2]
        again.close()
        assert handles().steps(TRAIN) == [2]

    def test_overwrite_refused_then_allowed(self, store: Store, handles: Handles) -> None:
        save(store, TRAIN, 0)
        with pytest.raises(StepExistsError, match="refusing to overwrite step 0"):
            save(store, TRAIN, 0, batch=batch_for(9))
        assert same(store.load(TRAIN, 0), batch_for(0))
        save(store, TRAIN, 0, batch=batch_for(9), overwrite=True)
        assert same(store.load(TRAIN, 0), batch_for(9))
        store.close()
        writer = handles()  # after compaction the manifest holds step 0: still refused
        with pytest.raises(StepExistsError):
            save(writer, TRAIN, 0)
        save(writer, TRAIN, 0, batch=batch_for(4), overwrite=True)
        assert same(handles().load(TRAIN, 0), batch_for(4))  # the entry wins over the stale manifest
        writer.close()
        assert same(handles().load(TRAIN, 0), batch_for(4))

    def test_missing_step_error(self, store: Store) -> None:
        save(store, TRAIN, 0)
        with pytest.raises(StepNotFoundError) as info:
            store.load(TRAIN, 1)
        assert info.value.step == 1 and "Recorded steps for train: 0" in str(info.value)

    def test_corrupt_data_detected(self, store: Store, handles: Handles) -> None:
        save(store, TRAIN, 0)
        data = bytearray(store.backend.read(TRAIN.relpath(0)) or b"")
        data[-30] ^= 0x40
        store.backend.replace(TRAIN.relpath(0), bytes(data))
        with pytest.raises(CorruptStepError, match="step 0 of train"):
            handles().load(TRAIN, 0)
        store.backend.replace(TRAIN.relpath(0), bytes(data[:-5]))
        with pytest.raises(CorruptStepError, match="size is"):
            handles().load(TRAIN, 0)

    def test_two_writers_refused(self, store: Store, handles: Handles) -> None:
        store.open_writer(TRAIN)
        other = handles()
        with pytest.raises(LockedError, match="another writer"):
            other.open_writer(TRAIN)
        with pytest.raises(LockedError):
            save(other, TRAIN, 0)
        other.open_writer(MATH)  # another stream is fine
        other.close()
        store.close()
        third = handles()
        third.open_writer(TRAIN)  # released on close
        third.close()

    def test_failure_before_commit_leaves_no_step(self, store: Store, handles: Handles,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
        save(store, TRAIN, 0)

        def die(*args: Any) -> None:
            raise KeyboardInterrupt("killed between the data write and the commit")

        monkeypatch.setattr(store, "_commit_entry", die)
        monkeypatch.setattr(store.backend, "remove", lambda rels: None)  # a dead writer cleans nothing up
        with pytest.raises(KeyboardInterrupt):
            save(store, TRAIN, 1)
        reader = handles()
        assert reader.backend.size(TRAIN.relpath(1))  # the data is there ...
        assert reader.steps(TRAIN) == [0] and reader.entry(TRAIN, 1) is None  # ... but no step
        with pytest.raises(CorruptStepError, match="not in the index"):
            reader.load(TRAIN, 1)

    def test_torn_or_foreign_entry_is_never_a_step(self, store: Store, handles: Handles) -> None:
        save(store, TRAIN, 0)
        save(store, TRAIN, 1)
        good = store.backend.read(entry_relpath(TRAIN, 1)) or b""
        store.backend.replace(entry_relpath(TRAIN, 2), good[: len(good) // 2])  # torn
        store.backend.replace(entry_relpath(TRAIN, 3), good)  # step 1's entry copied to step 3
        reader = handles()
        assert reader.steps(TRAIN) == [0, 1] and reader.entry(TRAIN, 3) is None

    def test_close_compacts_and_reopens(self, store: Store, handles: Handles) -> None:
        for step in range(4):
            save(store, TRAIN, step)
        store.set_methods(TRAIN, {"get_batch": {"convention": "sync", "step_arg": 1}})
        store.set_fingerprint({"python": "3.11"})
        store.close()
        assert not [n for n in store.backend.listdir("train/.index") if n.startswith("step_")]
        assert store.backend.read(MANIFEST_NAME) is not None
        reader = handles()
        assert reader.steps(TRAIN) == [0, 1, 2, 3] and reader.fingerprint() == {"python": "3.11"}
        assert reader.methods(TRAIN)["get_batch"]["convention"] == "sync"
        writer = handles()
        save(writer, TRAIN, 4)
        assert handles().steps(TRAIN) == [0, 1, 2, 3, 4]
        writer.close()

    def test_hmac_binds_stream_and_step(self, handles: Handles) -> None:
        key = b"secret"
        writer = handles(hmac_key=key)
        save(writer, TRAIN, 0)
        save(writer, TRAIN, 1)
        save(writer, MATH, 0)
        signed = writer.entry(TRAIN, 0)
        assert signed is not None and (signed.hmac or "").startswith("hmac-sha256:")
        writer.close()
        reader = handles(hmac_key=key)
        assert same(reader.load(TRAIN, 1), batch_for(1))
        with pytest.raises(CorruptStepError, match="HMAC"):
            handles(hmac_key=b"other").load(TRAIN, 0)
        # swap step 0's signed data and entry into step 1, and train's into train/math
        swapper = handles()
        for src, dst in ((TRAIN, TRAIN), (TRAIN, MATH)):
            compacted = swapper.manifest_file()
            assert compacted is not None
            raw = compacted.streams[src.key]["steps"]["0"]
            data = swapper.backend.read(src.relpath(0)) or b""
            dst_step = 1 if dst == src else 0
            swapper.backend.replace(dst.relpath(dst_step), data)
            manifest = json.loads(swapper.backend.read(MANIFEST_NAME) or b"{}")
            manifest["streams"][dst.key]["steps"][str(dst_step)] = {**raw, "file": dst.relpath(dst_step)}
            swapper.backend.replace(MANIFEST_NAME, json.dumps(manifest).encode())
            with pytest.raises(CorruptStepError, match="HMAC signature does not match"):
                handles(hmac_key=key).load(dst, dst_step)
            assert same(handles().load(dst, dst_step), batch_for(0))  # unkeyed: checksum only

    def test_unsigned_step_refused_with_key(self, store: Store, handles: Handles) -> None:
        save(store, TRAIN, 0)
        with pytest.raises(CorruptStepError, match="no HMAC signature"):
            handles(hmac_key=b"k").load(TRAIN, 0)

    def test_names_cannot_leave_the_dump(self) -> None:
        for bad in ("../x", "a/b", "/abs", "..", ".hidden", "", "a\\b"):
            with pytest.raises(UnsafePathError):
                StreamId(bad)
            with pytest.raises(UnsafePathError):
                StreamId("train", bad)


class BackendConformance:
    """The byte-level rules of :mod:`rollout_mock.storage.backend`. Subclasses provide
    ``backends`` (see the module docstring). The optional members are checked as the store sees
    them: the backend's own where it has them, the defaults where it does not."""

    @pytest.fixture
    def backend(self, backends: Callable[[], ByteBackend]) -> BackendDefaults:
        return with_defaults(backends())

    @pytest.fixture
    def another(self, backends: Callable[[], ByteBackend]) -> Callable[[], BackendDefaults]:
        return lambda: with_defaults(backends())

    def test_is_a_byte_backend(self, backends: Callable[[], ByteBackend], backend: BackendDefaults) -> None:
        assert isinstance(backends(), ByteBackend)
        assert backend.where("") and backend.where("a/b.json").endswith("b.json")

    def test_read_whole_and_ranges(self, backend: BackendDefaults) -> None:
        assert backend.read("r/absent.json") is None and backend.read("r/absent.json", 0, 4) is None
        backend.replace("r/obj.bin", b"0123456789")
        assert backend.read("r/obj.bin") == b"0123456789"
        assert backend.read("r/obj.bin", 2, 5) == b"234" and backend.read("r/obj.bin", 7) == b"789"
        assert backend.read("r/obj.bin", 8, 100) == b"89" and backend.read("r/obj.bin", 10, 20) == b""
        assert backend.size("r/obj.bin") == 10 and backend.size("r/absent.json") is None

    def test_create_is_conditional(self, backend: BackendDefaults, another: Callable[[], BackendDefaults]) -> None:
        assert backend.read("x/a.json") is None and backend.signature("x/a.json") is None
        assert backend.create("x/a.json", b"one")
        assert not another().create("x/a.json", b"two")  # another handle is refused too
        assert not backend.create("x/a.json", b"two")
        assert another().read("x/a.json") == b"one"
        assert backend.create_unsynced("x/b.json", b"b") and not backend.create_unsynced("x/b.json", b"c")
        backend.sync()
        assert another().read("x/b.json") == b"b"

    def test_replace_changes_the_signature(self, backend: BackendDefaults) -> None:
        backend.replace("m.json", b"1")
        first = backend.signature("m.json")
        assert first is not None
        backend.replace("m.json", b"22")
        assert backend.read("m.json") == b"22" and backend.signature("m.json") != first

    def test_list_and_batched_remove(self, backend: BackendDefaults, another: Callable[[], BackendDefaults]) -> None:
        assert backend.listdir("d") == []
        for i in range(5):
            backend.replace(f"d/f{i}.json", b"x")
        backend.replace("d/sub/deep.json", b"x")
        assert sorted(n for n in backend.listdir("d") if n.startswith("f")) == [f"f{i}.json" for i in range(5)]
        assert "deep.json" not in backend.listdir("d")  # only the names directly under it
        backend.remove([f"d/f{i}.json" for i in range(4)] + ["d/absent.json"])
        assert [n for n in another().listdir("d") if n.startswith("f")] == ["f4.json"]
        backend.remove(["d/f4.json"])
        backend.remove([])
        assert backend.read("d/f4.json") is None

    def test_upload_appears_whole(self, backend: BackendDefaults, another: Callable[[], BackendDefaults]) -> None:
        data = bytes(range(256)) * 4096  # 1 MiB, in several writes
        upload = backend.open_upload("train/step_000000.pkl")
        upload.write(memoryview(data)[:1000])
        assert another().read("train/step_000000.pkl") is None  # nothing visible before the commit
        for i in range(1000, len(data), 100_000):
            upload.write(memoryview(data)[i:i + 100_000])
        upload.commit()
        assert another().read("train/step_000000.pkl") == data
        source = another().open_source("train/step_000000.pkl")
        assert source.size() == len(data) and bytes(source.read_range(1000, 24)) == data[1000:1024]
        with pytest.raises(FileNotFoundError):
            backend.open_source("train/absent.pkl")

    def test_aborted_upload_leaves_nothing(self, backend: BackendDefaults,
                                           another: Callable[[], BackendDefaults]) -> None:
        upload = backend.open_upload("train/step_000002.pkl")
        upload.write(memoryview(b"x" * 1000))
        upload.abort()
        other = another()
        assert other.read("train/step_000002.pkl") is None
        assert [n for n in other.listdir("train") if "step_000002" in n] == []

    def test_paths_stay_inside(self, backend: BackendDefaults) -> None:
        for bad in ("../escape.json", "/etc/passwd", "a/../../b"):
            with pytest.raises(UnsafePathError):
                backend.replace(bad, b"x")
            with pytest.raises(UnsafePathError):
                backend.read(bad)

    def test_locks(self, backend: BackendDefaults, another: Callable[[], BackendDefaults]) -> None:
        handle = backend.lock("train/.writer.lock", "the first writer")
        other = another()
        with pytest.raises(LockedError):
            other.lock("train/.writer.lock", "the second writer")
        with pytest.raises(LockedError):
            backend.lock("train/.writer.lock", "the same handle again")  # a lock is not re-entrant
        assert backend.lock_lost(handle) is None
        backend.unlock(handle)
        again = other.lock("train/.writer.lock", "the second writer", wait=5.0)
        other.unlock(again)

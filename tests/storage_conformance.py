"""The store conformance suite: what every :class:`~rollout_mock.storage.StepStore` backend must
do, whatever it keeps steps in (zarr's ``StoreTests`` pattern).

A test module subclasses :class:`StoreConformance` and provides the ``handles`` fixture: a
function returning a *new handle on the same store* each call (another process's view), with
optional ``hmac_key``. Every test here then runs against that backend.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from rollout_mock import CorruptStepError, LockedError, StepExistsError, StepNotFoundError, UnsafePathError
from rollout_mock.storage import BatchInfo
from rollout_mock.storage.index import entry_relpath
from rollout_mock.storage.indexed import IndexedStore
from rollout_mock.storage.manifest import MANIFEST_NAME, StreamId

TRAIN = StreamId("train")
MATH = StreamId("train", "math")
RANK1 = StreamId("train", None, 1)
Handles = Callable[..., IndexedStore]


def batch_for(step: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(step)
    return {"ids": torch.randint(0, 1000, (4, 8), generator=gen), "reward": torch.randn(4, generator=gen),
            "meta": {"step": step}}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return torch.equal(a["ids"], b["ids"]) and torch.equal(a["reward"], b["reward"]) and a["meta"] == b["meta"]


def save(store: IndexedStore, stream: StreamId, step: int, **kw: Any) -> Any:
    batch = kw.pop("batch", None) or batch_for(step)
    return store.save(stream, step, batch, BatchInfo.of(batch), method="get_batch", **kw)


class StoreConformance:
    """Subclasses provide ``handles`` (see the module docstring)."""

    @pytest.fixture
    def store(self, handles: Handles) -> Iterator[IndexedStore]:
        store = handles()
        yield store
        store.close()

    def test_save_load_entry(self, store: IndexedStore) -> None:
        entry = save(store, TRAIN, 3)
        assert entry.file == "train/step_000003.pkl" and entry.samples == 4 and entry.size > 0
        assert entry.checksum.startswith("crc32:") and entry.keys["ids"]["shape"] == [4, 8]
        assert store.entry(TRAIN, 3) == entry
        assert same(store.load(TRAIN, 3), batch_for(3))

    def test_steps_contains_and_streams(self, store: IndexedStore, handles: Handles) -> None:
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

    def test_delete(self, store: IndexedStore, handles: Handles) -> None:
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

    def test_overwrite_refused_then_allowed(self, store: IndexedStore, handles: Handles) -> None:
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

    def test_missing_step_error(self, store: IndexedStore) -> None:
        save(store, TRAIN, 0)
        with pytest.raises(StepNotFoundError) as info:
            store.load(TRAIN, 1)
        assert info.value.step == 1 and "Recorded steps for train: 0" in str(info.value)

    def test_corrupt_data_detected(self, store: IndexedStore, handles: Handles) -> None:
        save(store, TRAIN, 0)
        data = bytearray(store._read(TRAIN.relpath(0)) or b"")
        data[-30] ^= 0x40
        store._replace(TRAIN.relpath(0), bytes(data))
        with pytest.raises(CorruptStepError, match="step 0 of train"):
            handles().load(TRAIN, 0)
        store._replace(TRAIN.relpath(0), bytes(data[:-5]))
        with pytest.raises(CorruptStepError, match="size is"):
            handles().load(TRAIN, 0)

    def test_two_writers_refused(self, store: IndexedStore, handles: Handles) -> None:
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

    def test_failure_before_commit_leaves_no_step(self, store: IndexedStore, handles: Handles,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
        save(store, TRAIN, 0)

        def die(*args: Any) -> None:
            raise KeyboardInterrupt("killed between the data write and the commit")

        monkeypatch.setattr(store, "_commit_entry", die)
        monkeypatch.setattr(store, "_remove", lambda rels: None)  # a dead writer cleans nothing up
        with pytest.raises(KeyboardInterrupt):
            save(store, TRAIN, 1)
        reader = handles()
        assert reader._exists(TRAIN.relpath(1))  # the data is there ...
        assert reader.steps(TRAIN) == [0] and reader.entry(TRAIN, 1) is None  # ... but no step
        with pytest.raises(CorruptStepError, match="not in the index"):
            reader.load(TRAIN, 1)

    def test_torn_or_foreign_entry_is_never_a_step(self, store: IndexedStore, handles: Handles) -> None:
        save(store, TRAIN, 0)
        save(store, TRAIN, 1)
        good = store._read(entry_relpath(TRAIN, 1)) or b""
        store._replace(entry_relpath(TRAIN, 2), good[: len(good) // 2])  # torn
        store._replace(entry_relpath(TRAIN, 3), good)  # step 1's entry copied to step 3
        reader = handles()
        assert reader.steps(TRAIN) == [0, 1] and reader.entry(TRAIN, 3) is None

    def test_close_compacts_and_reopens(self, store: IndexedStore, handles: Handles) -> None:
        for step in range(4):
            save(store, TRAIN, step)
        store.set_methods(TRAIN, {"get_batch": {"convention": "sync", "step_arg": 1}})
        store.set_fingerprint({"python": "3.11"})
        store.close()
        assert not [n for n in store._list("train/.index") if n.startswith("step_")]
        assert store._read(MANIFEST_NAME) is not None
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
        assert (writer.entry(TRAIN, 0).hmac or "").startswith("hmac-sha256:")
        writer.close()
        reader = handles(hmac_key=key)
        assert same(reader.load(TRAIN, 1), batch_for(1))
        with pytest.raises(CorruptStepError, match="HMAC"):
            handles(hmac_key=b"other").load(TRAIN, 0)
        # swap step 0's signed data and entry into step 1, and train's into train/math
        swapper = handles()
        for src, dst in ((TRAIN, TRAIN), (TRAIN, MATH)):
            raw = swapper.manifest_file().streams[src.key]["steps"]["0"]
            data = swapper._read(src.relpath(0)) or b""
            dst_step = 1 if dst == src else 0
            swapper._replace(dst.relpath(dst_step), data)
            import json

            manifest = json.loads(swapper._read(MANIFEST_NAME) or b"{}")
            manifest["streams"][dst.key]["steps"][str(dst_step)] = {**raw, "file": dst.relpath(dst_step)}
            swapper._replace(MANIFEST_NAME, json.dumps(manifest).encode())
            with pytest.raises(CorruptStepError, match="HMAC signature does not match"):
                handles(hmac_key=key).load(dst, dst_step)
            assert same(handles().load(dst, dst_step), batch_for(0))  # unkeyed: checksum only

    def test_unsigned_step_refused_with_key(self, store: IndexedStore, handles: Handles) -> None:
        save(store, TRAIN, 0)
        with pytest.raises(CorruptStepError, match="no HMAC signature"):
            handles(hmac_key=b"k").load(TRAIN, 0)

    def test_names_cannot_leave_the_dump(self) -> None:
        for bad in ("../x", "a/b", "/abs", "..", ".hidden", "", "a\\b"):
            with pytest.raises(UnsafePathError):
                StreamId(bad)
            with pytest.raises(UnsafePathError):
                StreamId("train", bad)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, Any]]:
    """A moto S3 server on 127.0.0.1 (random free port) with one bucket; stopped at the end.

    Yields ``storage_options`` for s3fs (endpoint, dummy credentials, bounded timeouts and
    retries) and the bucket name.
    """
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    options = {
        "endpoint_url": endpoint, "key": "testing", "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
        "config_kwargs": {"connect_timeout": 5, "read_timeout": 20, "retries": {"max_attempts": 2}},
        "skip_instance_cache": True,
    }
    bucket = f"rollout-mock-{uuid.uuid4().hex[:8]}"
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        yield {"storage_options": options, "bucket": bucket, "endpoint": endpoint}
    finally:
        server.stop()

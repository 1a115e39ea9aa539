"""The bundle container (rollout_mock.storage.bundle): layout, ranged reads, checks, the read-only
backend and the store over it."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from rollout_mock import BundleError, DumpNotWritableError
from rollout_mock.errors import DebugInputError, UnsafePathError
from rollout_mock.storage.bundle import ALIGNMENT, MAGIC, Bundle, BundleBackend, BundleWriter, is_bundle
from rollout_mock.storage.store import Store, open_store


def write(path: Path, members: dict[str, bytes], **kwargs: object) -> Path:
    with BundleWriter(path, **kwargs) as writer:  # type: ignore[arg-type]
        for name, data in members.items():
            writer.add(name, [data[:3], data[3:]])
        writer.commit({"note": "test"})
    return path


def test_layout_is_the_documented_one(tmp_path: Path) -> None:
    path = write(tmp_path / "a.rmb", {"manifest.json": b"{}", "train/step_000001.pkl": b"x" * 5000, "e/m.jsonl": b""})
    data = path.read_bytes()
    magic, version, flags, alignment, reserved = struct.unpack_from("<8sHHI16s", data)
    assert (magic, version, flags, alignment, reserved) == (MAGIC, 1, 0, ALIGNMENT, bytes(16))
    toc_offset, toc_size, toc_sha, zeros, end = struct.unpack_from("<QQ32s8s8s", data, len(data) - 64)
    assert end == b"RMB-END\n" and zeros == bytes(8) and toc_offset + toc_size + 64 == len(data)
    toc = data[toc_offset:toc_offset + toc_size]
    assert hashlib.sha256(toc).digest() == toc_sha
    doc = json.loads(toc)
    assert doc["format"] == "rollout_mock.bundle" and doc["version"] == 1 and doc["meta"] == {"note": "test"}
    for member in doc["members"]:
        assert member["offset"] % ALIGNMENT == 0
        body = data[member["offset"]:member["offset"] + member["size"]]
        assert hashlib.sha256(body).hexdigest() == member["sha256"]
    assert [m["size"] for m in doc["members"]] == [2, 5000, 0]
    bundle = Bundle.open(path)
    assert bundle.digest == "sha256:" + toc_sha.hex()
    bundle.verify()


def test_reads_listing_and_slices(tmp_path: Path) -> None:
    bundle = Bundle.open(write(tmp_path / "a.rmb", {"manifest.json": b"0123456789", "train/math/s.pkl": b"abc",
                                                    "train/t.pkl": b"zz"}))
    assert bundle.read("manifest.json") == b"0123456789"
    assert bundle.read("manifest.json", 2, 5) == b"234" and bundle.read("manifest.json", 8, 100) == b"89"
    assert bundle.read("manifest.json", 20, 30) == b"" and bundle.read("nope") is None
    assert bundle.listdir("") == ["manifest.json", "train"] and bundle.listdir("train") == ["math", "t.pkl"]
    assert bundle.listdir("train/math") == ["s.pkl"] and bundle.listdir("other") == []


def test_backend_is_read_only(tmp_path: Path) -> None:
    backend = BundleBackend(write(tmp_path / "a.rmb", {"manifest.json": b"{}"}))
    store = Store(backend)
    assert store.dump_dir == str(tmp_path / "a.rmb") and backend.where("x/y") == f"{tmp_path / 'a.rmb'}:x/y"
    assert backend.size("manifest.json") == 2 and backend.signature("nope") is None
    for attempt in (lambda: backend.create("a", b""), lambda: backend.replace("a", b""), lambda: backend.remove(["a"]),
                    lambda: backend.lock("a", "me")):
        with pytest.raises(DumpNotWritableError, match="is a bundle, read-only.*rollout-mock unpack"):
            attempt()
    with pytest.raises(UnsafePathError, match="not a plain relative path"):
        backend.read("../x")


def test_writer_refuses_and_leaves_nothing(tmp_path: Path) -> None:
    path = write(tmp_path / "a.rmb", {"m": b"1"})
    with pytest.raises(DebugInputError, match="exists; pick another name, or pass --overwrite"):
        BundleWriter(path)
    with pytest.raises(DebugInputError, match="is a directory"):
        BundleWriter(tmp_path)
    with pytest.raises(RuntimeError), BundleWriter(tmp_path / "b.rmb") as writer:
        writer.add("m", [b"partial"])
        raise RuntimeError("interrupted")
    with pytest.raises(BundleError, match="member name"), BundleWriter(tmp_path / "c.rmb") as writer:
        writer.add("../m", [b""])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.rmb"]
    write(path, {"m": b"2"}, overwrite=True)
    assert Bundle.open(path).read("m") == b"2"


def test_is_bundle_and_open_store(tmp_path: Path) -> None:
    path = write(tmp_path / "shared.bin", {"manifest.json": b"{}"})  # any name: the magic says
    assert is_bundle(path) and is_bundle(tmp_path / "shared.bin") and not is_bundle(tmp_path)
    assert is_bundle("s3://bucket/x.rmb") and not is_bundle("s3://bucket/dump")
    assert isinstance(open_store(path).backend, BundleBackend)
    (tmp_path / "text.rmb").write_text("not a bundle, but long enough to hold a header and a footer " * 2)
    with pytest.raises(BundleError, match="not a rollout_mock bundle"):
        open_store(tmp_path / "text.rmb")
    (tmp_path / "notes.txt").write_text("hello")
    assert not is_bundle(tmp_path / "notes.txt")


def test_open_store_decides_how_a_location_opens(tmp_path: Path) -> None:
    """One home: a bundle is read in place (``bundled``), a folder is a directory store, a file
    that is no bundle is refused with the one "is a file" message, naming the caller's mode."""
    from rollout_mock import DumpNotFoundError

    assert open_store(write(tmp_path / "b.rmb", {"manifest.json": b"{}"})).bundled
    assert not open_store(tmp_path / "dump").bundled
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "manifest.json").write_text("{}")
    for location in (tmp_path / "dump" / "manifest.json", f"file://{tmp_path}/dump/manifest.json"):
        with pytest.raises(DumpNotFoundError, match=rf"is a file; pass the dump folder: {tmp_path / 'dump'}$") as info:
            open_store(location, mode="mock")
        assert info.value.mode == "mock"
    store = open_store(tmp_path / "dump")
    assert store.expected_file() is None
    (tmp_path / "dump" / "expected").mkdir()
    (tmp_path / "dump" / "expected" / "metrics.jsonl").write_text("{}\n")
    assert store.expected_file() == tmp_path / "dump" / "expected" / "metrics.jsonl"


def test_open_store_takes_the_store_part_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Callers hand ``open_store`` the config's store part: its key, its verify switch and its
    fsspec options (a read-only mapping, or empty: none) are applied in that one place."""
    from types import MappingProxyType

    from rollout_mock import load_config
    from rollout_mock.config import config_parts
    from rollout_mock.storage.objectstore import FsspecBackend
    from rollout_mock.storage.store import StoreSettings

    monkeypatch.setenv("RM_TEST_KEY", "secret")
    parts = config_parts(load_config({"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d"),
                                      "hmac_key_env": "RM_TEST_KEY", "verify_checksum": False,
                                      "storage_options": {}}))
    store = open_store(parts.store, mode="dump")
    assert (store.dump_dir, store.hmac_key, store.verify) == (tmp_path / "d", b"secret", False)
    options = MappingProxyType({"skip_instance_cache": True})
    for given, passed in ((options, {"skip_instance_cache": True}), ({}, {}), (None, {})):
        backend = open_store(StoreSettings("memory://rm-open-store", given)).backend
        assert isinstance(backend, FsspecBackend) and backend.storage_options == passed
    assert repr(StoreSettings("d", hmac_key=b"secret")) == (
        "StoreSettings(dump_dir='d', storage_options=None, verify=True)")


def test_the_store_packs_pulls_and_unpacks_its_own_steps(tmp_path: Path) -> None:
    """Bundles are operations of the store, whatever its backend: a dump held in memory packs
    into a bundle, the store over that bundle unpacks it, and a few steps pull into a directory."""
    import torch

    from rollout_mock.storage.manifest import StreamId
    from rollout_mock.storage.store import BatchInfo, DirectoryStore, MemoryStore

    stream = StreamId("train")
    store = MemoryStore()
    for step in range(3):
        batch = {"x": torch.full((2,), step)}
        store.save(stream, step, batch, BatchInfo.of(batch))
    store.close()
    assert store.local_source() is None
    info = store.pack(tmp_path / "b.rmb", steps=[1, 2])
    assert info.meta["streams"] == {"train": [1, 2]}
    bundled = open_store(tmp_path / "b.rmb")
    assert bundled.local_source() == str(tmp_path / "b.rmb")
    assert list(bundled.steps(stream)) == [1, 2] and torch.equal(bundled.load(stream, 2)["x"], torch.full((2,), 2))
    bundled.unpack(tmp_path / "u")
    unpacked = DirectoryStore(tmp_path / "u")
    assert list(unpacked.steps(stream)) == [1, 2] and (tmp_path / "u" / "bundle.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind
    pulled = store.pull(tmp_path / "p", steps=[0])
    assert pulled.streams == {"train": [0]} and list(DirectoryStore(tmp_path / "p").steps(stream)) == [0]
    with pytest.raises(TypeError, match="does not read a bundle"):
        store.unpack(tmp_path / "x")


def test_the_store_writes_and_lists_check_verdicts(tmp_path: Path) -> None:
    from rollout_mock.storage.manifest import StreamId
    from rollout_mock.storage.store import DirectoryStore, MemoryStore

    for store in (MemoryStore(), DirectoryStore(tmp_path / "d")):
        assert store.verdict_files(10) == [] and store.expected_names() == []
        store.write_verdict(StreamId("val", "judge"), 3, {"step": 3})
        store.write_verdict(StreamId("train"), 1, {"step": 1})
        files = store.verdict_files(10)
        assert files == ["checks/train/step_000001.json", "checks/val/judge/step_000003.json"]
        assert json.loads(store.read_side(files[1], 100) or b"") == {"step": 3}
        assert store.verdict_files(1) == files[:1]

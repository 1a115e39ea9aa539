"""Lazy, mapped opens of a step (``Dump.open``, ``Dump.load(mapped=True)``) and the load path's
deferred, two-thread chunk reads: zero copy, every handed-out chunk CRC-checked, corruption
refused where it is read, and ``verify=False`` marked as unchecked."""

from __future__ import annotations

import ctypes
import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rollout_mock import CorruptStepError, DirectoryStore, open_dump
from rollout_mock.codec import MappedSource, open_step
from rollout_mock.storage import BatchInfo
from rollout_mock.storage.manifest import StreamId

TRAIN = StreamId("train")


def batch(rows: int = 64, width: int = 4096) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    return {
        "a": torch.randint(0, 1 << 30, (rows, width), generator=gen),
        "b": torch.randn(rows, width, generator=gen),
        "m": torch.rand(rows, 8, generator=gen) > 0.5,
        "text": [f"sample {i}" for i in range(rows)],
    }


def dump_one(tmp_path: Path, data: dict[str, Any], step: int = 0) -> tuple[Path, Path]:
    store = DirectoryStore(tmp_path / "d")
    store.save(TRAIN, step, data, BatchInfo.of(data))
    store.close()
    return tmp_path / "d", store.path_of(TRAIN, step)


def data_offset(path: Path, key: str) -> int:
    """File offset of the first chunk of ``key`` (from the step's own header)."""
    view = open_step(path)
    layout = view._layout
    assert layout is not None
    first = dict(layout.root.items())[key]["c"][0]
    return layout.data_base + layout.table[first][0]


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0xFF]))


def test_mapped_open_returns_the_files_pages_without_copying(tmp_path: Path) -> None:
    data = batch()
    root, path = dump_one(tmp_path, data)
    view = open_dump(root).open(0)
    assert view.verified and sorted(view.keys()) == ["a", "b", "m", "text"]
    assert isinstance(view.source, MappedSource)
    out = view.load(keys=["a", "text"])
    assert sorted(out) == ["a", "text"] and torch.equal(out["a"], data["a"]) and out["text"] == data["text"]
    base = ctypes.addressof(ctypes.c_char.from_buffer(view.source._map))
    assert base <= out["a"].data_ptr() < base + path.stat().st_size  # the mapping itself
    out["a"].add_(1)  # copy-on-write: the file is unchanged
    assert torch.equal(open_dump(root).load(0)["a"], data["a"])


def test_mapped_rows_match_a_copying_load(tmp_path: Path) -> None:
    data = batch(rows=100)
    root, _ = dump_one(tmp_path, data)
    dump = open_dump(root)
    for rows in (range(8), range(37, 64), range(90, 100), slice(3, 50, 7), range(0)):
        mapped = dump.load(0, keys=["a", "b", "m"], rows=rows, mapped=True)
        copied = dump.load(0, keys=["a", "b", "m"], rows=rows)
        for key in ("a", "b", "m"):
            assert torch.equal(mapped[key], copied[key]) and torch.equal(mapped[key], data[key][rows])


def test_mapped_open_checks_what_it_hands_out(tmp_path: Path) -> None:
    root, path = dump_one(tmp_path, batch())
    flip(path, data_offset(path, "b") + 1000)
    view = open_dump(root).open(0)  # the index checksum comes from the chunk table: still fine
    assert torch.equal(view.load(keys=["a"])["a"], batch()["a"])  # checked, and intact
    with pytest.raises(CorruptStepError, match="CRC"):
        view.load(keys=["b"])
    with pytest.raises(CorruptStepError, match="CRC"):
        open_dump(root).load(0, mapped=True)
    with pytest.raises(CorruptStepError):
        open_dump(root).load(0)  # the copying load too
    unchecked = open_dump(root).open(0, verify=False)
    assert unchecked.verified is False
    assert not torch.equal(unchecked.load(keys=["b"])["b"], batch()["b"])  # read as is: unchecked


def test_mapped_open_refuses_a_changed_header_or_size(tmp_path: Path) -> None:
    root, path = dump_one(tmp_path, batch())
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(CorruptStepError, match="size"):
        open_dump(root).open(0)
    text = data.replace(b'"a":{', b'"A":{')  # same size, header bytes changed
    assert text != data
    path.write_bytes(text)
    with pytest.raises(CorruptStepError):
        open_dump(root).open(0)


def test_deferred_two_thread_reads_refuse_a_corrupt_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.import_module("rollout_mock.codec.decode"), "PARALLEL_BYTES", 1)  # every load takes the threaded path
    data = batch()
    root, path = dump_one(tmp_path, data)
    loaded = open_dump(root).load(0)
    assert all(torch.equal(loaded[k], data[k]) for k in ("a", "b", "m"))
    flip(path, data_offset(path, "m"))
    with pytest.raises(CorruptStepError):
        open_dump(root).load(0)


def test_nested_tensors_survive_deferred_reads(tmp_path: Path) -> None:
    nested = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0)], layout=torch.jagged)
    root, _ = dump_one(tmp_path, {"n": nested, "x": torch.arange(10)})
    out = open_dump(root).load(0)
    assert [x.tolist() for x in out["n"].unbind()] == [[0, 1, 2], [0, 1, 2, 3, 4]]


def test_a_lost_entry_hides_its_step_and_the_step_can_be_recorded_again(tmp_path: Path) -> None:
    """What a power cut between a step's commit and the next sync can do: the entry file (written
    without fsync) comes back empty. The step is then invisible, never half-visible."""
    store = DirectoryStore(tmp_path / "d")
    for step in range(3):
        store.save(TRAIN, step, batch(rows=4), BatchInfo.of(batch(rows=4)))
    entry = tmp_path / "d" / "train" / ".index" / "step_000002.json"
    assert entry.exists()
    entry.write_bytes(b"")  # as after a power cut (the process itself is gone: no close)
    owned = store._owned.pop(TRAIN.key)  # the writer dies: its lock goes, nothing is compacted
    store.backend.unlock(owned.handle)
    reader = DirectoryStore(tmp_path / "d")
    assert sorted(reader.steps(TRAIN)) == [0, 1]
    again = DirectoryStore(tmp_path / "d")
    again.save(TRAIN, 2, batch(rows=4), BatchInfo.of(batch(rows=4)))
    again.close()
    assert sorted(open_dump(tmp_path / "d").steps(TRAIN)) == [0, 1, 2]


def test_entries_are_synced_on_close_and_in_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from rollout_mock.storage import directory

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    monkeypatch.setattr(directory, "_SYNC_EVERY", 3)
    store = DirectoryStore(tmp_path / "d")
    store.save(TRAIN, 0, {"x": torch.arange(4)}, BatchInfo.of({"x": torch.arange(4)}))  # + stream setup
    first = len(synced)
    store.save(TRAIN, 1, {"x": torch.arange(4)}, BatchInfo.of({"x": torch.arange(4)}))
    assert len(synced) - first == 2  # the step file and its directory; the entry waits
    assert len(store.backend.unsynced) == 2
    store.save(TRAIN, 2, {"x": torch.arange(4)}, BatchInfo.of({"x": torch.arange(4)}))
    assert store.backend.unsynced == []  # the third entry triggered a sync of all three
    store.save(TRAIN, 3, {"x": torch.arange(4)}, BatchInfo.of({"x": torch.arange(4)}))
    before = len(synced)
    store.close()
    assert store.backend.unsynced == [] and len(synced) > before
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert sorted(manifest["streams"]["train"]["steps"]) == ["0", "1", "2", "3"]


def test_large_steps_write_their_head_last_and_checksum_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step of 8 MB and more is written body first (CRCs computed while writing), head last:
    the file, its index checksum and a plain full-file CRC agree, and every reader reads it."""
    codec_encode = importlib.import_module("rollout_mock.codec.format")  # the container writer
    from rollout_mock.storage.digest import file_digest

    used: list[int | None] = []
    real = codec_encode._write_head_last
    monkeypatch.setattr(codec_encode, "_write_head_last", lambda *a: used.append(real(*a)) or used[-1])
    data = batch(rows=512, width=2048)  # 16 MB of tensors
    root, path = dump_one(tmp_path, data)
    assert used and used[-1] == path.stat().st_size
    entry = open_dump(root).entry(TRAIN, 0)
    assert entry.checksum == file_digest(path)[0]
    loaded = open_dump(root).load(0)
    assert all(torch.equal(loaded[k], data[k]) for k in ("a", "b", "m")) and loaded["text"] == data["text"]
    import pickle

    with open(path, "rb") as file:  # the file is still a pickle of the safe decoder
        assert torch.equal(pickle.load(file)["a"], data["a"])
    signed = DirectoryStore(tmp_path / "signed", hmac_key=b"k" * 32)  # an HMAC: bytes in order
    signed.save(TRAIN, 0, data, BatchInfo.of(data))
    assert used[-1] is None
    assert torch.equal(signed.load(TRAIN, 0)["a"], data["a"])

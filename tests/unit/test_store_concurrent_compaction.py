"""Two writers of one dump close at the same moment: one may prune an index directory that the
other is still syncing or about to write into (seen with two ROLL domain schedulers)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import rollout_mock.storage.directory as directory_module
from rollout_mock import DirectoryStore
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.store import BatchInfo


def test_a_directory_pruned_before_its_fsync_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batch = {"x": torch.arange(4)}
    stores = {name: DirectoryStore(tmp_path) for name in ("math", "code")}
    for name, store in stores.items():
        stream = StreamId("train", name)
        store.open_writer(stream)
        store.save(stream, 0, batch, BatchInfo.of(batch))
    real_fsync_dir = directory_module.fsync_dir

    def pruned_first(path: Path) -> None:
        # the other writer's compaction removed this (now empty) directory just before
        if path.is_dir() and not os.listdir(path):
            os.rmdir(path)
        real_fsync_dir(path)

    monkeypatch.setattr(directory_module, "fsync_dir", pruned_first)
    for store in stores.values():
        store.close()
    monkeypatch.undo()
    reader = DirectoryStore(tmp_path)
    for name in ("math", "code"):
        assert torch.equal(reader.load(StreamId("train", name), 0)["x"], batch["x"])


def test_a_create_retries_when_its_directory_vanishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = DirectoryStore(tmp_path)
    real_write_temp = directory_module.write_temp
    calls = {"n": 0}

    def vanishing(path: Path, *args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise FileNotFoundError(2, "No such file or directory", str(path.parent))
        return real_write_temp(path, *args, **kwargs)

    monkeypatch.setattr(directory_module, "write_temp", vanishing)
    assert store.backend.create(".streams/train.json", b"{}")
    assert calls["n"] == 2 and (tmp_path / ".streams" / "train.json").read_bytes() == b"{}"

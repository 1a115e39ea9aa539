"""Nothing in a config, a manifest, an entry or a caller's argument can make rollout_mock touch a
path outside dump_dir; lock and temp files never follow symlinks; HMAC binds every load path."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from rollout_mock import (
    ConfigError,
    CorruptStepError,
    DirectoryStore,
    ManifestError,
    MockScheduler,
    UnsafePathError,
    load_step,
    open_dump,
)
from rollout_mock.storage import BatchInfo
from rollout_mock.storage.manifest import StreamId


class Scheduler:
    def get_batch(self, data: Any, global_step: int) -> dict[str, Any]:
        return {"x": torch.full((2, 3), float(global_step))}


def dump(tmp_path: Path, **extra: Any) -> Path:
    target = tmp_path / "dump"
    with MockScheduler(Scheduler(), {"enable": True, "mode": "dump", "dump_dir": str(target), **extra}) as s:
        for step in range(3):
            s.get_batch(None, global_step=step)
    return target


def test_name_and_split_arguments_cannot_escape(tmp_path: Path) -> None:
    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "dump")}
    with pytest.raises(UnsafePathError, match="invalid scheduler name '../../x'"):
        MockScheduler(Scheduler(), config, name="../../x")
    with pytest.raises(UnsafePathError, match="invalid split"):
        MockScheduler(Scheduler(), config, split="../x")
    with pytest.raises(ConfigError, match="name"):
        MockScheduler(Scheduler(), {**config, "name": "a/../../b"})
    assert not any(p.name == "x" for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("split", ["../x", "/etc", "a/b", ".."])
def test_manifest_split_cannot_escape(tmp_path: Path, split: str) -> None:
    target = dump(tmp_path)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["streams"]["train"]["split"] = split
    (target / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="invalid split"):
        open_dump(target)


def test_symlinked_lock_file_is_refused_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "dump"
    (target / "train").mkdir(parents=True)
    os.symlink(victim, target / "train" / ".writer.lock")
    with pytest.raises(UnsafePathError, match="outside dump_dir"):
        DirectoryStore(target).open_writer(StreamId("train"))
    assert victim.read_text() == "precious"
    inside = target / "keep.txt"  # a link to a file inside dump_dir: O_NOFOLLOW refuses it too
    inside.write_text("precious")
    (target / "train" / ".writer.lock").unlink()
    os.symlink(inside, target / "train" / ".writer.lock")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        DirectoryStore(target).open_writer(StreamId("train"))
    assert inside.read_text() == "precious"
    os.symlink(victim, target / ".manifest.lock")
    (target / "train" / ".writer.lock").unlink()
    with pytest.raises(UnsafePathError, match="symbolic link|outside dump_dir"):  # the manifest lock: refused too
        DirectoryStore(target).save(StreamId("train"), 0, {"x": torch.ones(1)}, BatchInfo.of({"x": torch.ones(1)}))
    assert victim.read_text() == "precious"


def test_symlinked_split_directory_inside_is_followed_outside_refused(tmp_path: Path) -> None:
    target = dump(tmp_path)
    outside = tmp_path / "elsewhere"
    os.rename(target / "train", outside)
    os.symlink(outside, target / "train")
    with pytest.raises(UnsafePathError, match="outside dump_dir"):
        open_dump(target).load(0)
    os.unlink(target / "train")
    os.rename(outside, target / "train-real")
    os.symlink("train-real", target / "train")  # inside dump_dir: followed
    assert torch.equal(open_dump(target).load(1)["x"], torch.full((2, 3), 1.0))


def test_load_step_with_key_binds_stream_and_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RM_KEY", "k1")
    target = dump(tmp_path, hmac_key_env="RM_KEY")
    key = b"k1"
    step1 = target / "train" / "step_000001.pkl"
    assert torch.equal(load_step(step1, hmac_key=key)["x"], torch.full((2, 3), 1.0))
    assert torch.equal(load_step(step1, hmac_key=key, verify=False)["x"], torch.full((2, 3), 1.0))
    # a signed file swapped into another step (entry fixed to match): refused on every path
    manifest = json.loads((target / "manifest.json").read_text())
    entries = manifest["streams"]["train"]["steps"]
    (target / "train" / "step_000002.pkl").write_bytes(step1.read_bytes())
    entries["2"] = {**entries["1"], "file": "train/step_000002.pkl"}
    (target / "manifest.json").write_text(json.dumps(manifest))
    for verify in (True, False):
        with pytest.raises(CorruptStepError, match="HMAC"):
            load_step(target / "train" / "step_000002.pkl", hmac_key=key, verify=verify)
    with pytest.raises(CorruptStepError, match="HMAC"):
        open_dump(target, hmac_key=key).load(2)
    # a copy outside any dump, or without its manifest: no entry, so it cannot be authenticated
    loose = tmp_path / "loose.pkl"
    loose.write_bytes(step1.read_bytes())
    with pytest.raises(CorruptStepError, match="cannot be checked"):
        load_step(loose, hmac_key=key)
    (target / "manifest.json").unlink()
    with pytest.raises(CorruptStepError, match="cannot be checked"):
        load_step(step1, hmac_key=key, verify=False)


def test_format1_hmac_is_refused_with_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RM_KEY", "k1")
    target = dump(tmp_path, hmac_key_env="RM_KEY")
    manifest = json.loads((target / "manifest.json").read_text())
    entry = manifest["streams"]["train"]["steps"]["0"]
    entry["hmac"] = entry["hmac"].removeprefix("hmac-sha256:")  # what format 1 stored
    (target / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptStepError, match="format-1 HMAC of the bytes alone"):
        open_dump(target, hmac_key=b"k1").load(0)


def test_the_dump_runs_metrics_are_reached_through_the_one_contained_open(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way the store reaches a local file of the dump run's metrics (finding, listing,
    reading, appending) goes through ``storage.paths.open_dir_inside`` (the descriptor walk
    that refuses links), and so refuses what it refuses, instead of checking names itself."""
    import rollout_mock.storage.paths as paths

    store = DirectoryStore(tmp_path / "dump")
    (tmp_path / "dump" / "expected").mkdir(parents=True)
    (tmp_path / "dump" / "expected" / "metrics.jsonl").write_text('{"step": 0}\n')
    walked: list[str] = []
    real = paths.open_dir_inside

    def spy(root: str | os.PathLike[str], parts: list[str], where: object, make_dirs: bool) -> int:
        walked.append(str(where))
        return real(root, parts, where, make_dirs)

    monkeypatch.setattr(paths, "open_dir_inside", spy)
    uses = {
        "expected_file": lambda: store.expected_file(),
        "expected_names": lambda: store.expected_names(),
        "read_expected": lambda: store.read_expected(),
        "open_expected": lambda: store.open_expected(rank=2).close(),
    }
    for name, use in uses.items():
        walked.clear()
        use()
        assert walked, f"Store.{name} reached expected/ without storage.paths.open_dir_inside"
    assert store.expected_names() == ["expected/metrics.jsonl", "expected/metrics_rank2.jsonl"]
    assert store.expected_file() == tmp_path / "dump" / "expected" / "metrics.jsonl"
    assert store.expected_file(rank=5) is None

    outside = tmp_path / "outside.jsonl"
    outside.write_text('{"step": 0, "secret": 1}\n')
    os.symlink(outside, tmp_path / "dump" / "expected" / "metrics_rank3.jsonl")
    os.mkfifo(tmp_path / "dump" / "expected" / "metrics_rank4.jsonl")
    for rank in (3, 4):
        with pytest.raises(UnsafePathError, match=f"metrics_rank{rank}.jsonl"):
            store.expected_file(rank=rank)
    (tmp_path / "dump" / "expected").rename(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", tmp_path / "dump" / "expected")
    for find in (store.expected_file, store.expected_names):
        with pytest.raises(UnsafePathError, match="'expected' is a symbolic link"):
            find()

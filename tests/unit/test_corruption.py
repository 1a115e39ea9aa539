"""Damaged dumps raise errors naming the file, the step and what is wrong; never a wrong batch."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_mock import (
    CorruptStepError,
    DirectoryStore,
    FormatVersionError,
    ManifestError,
    MemoryStore,
    MockScheduler,
    RolloutMockError,
    load_step,
    open_dump,
)
from rollout_mock.storage import BatchInfo
from rollout_mock.storage.manifest import StreamId

STREAM = StreamId("train")
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def batch_for(step: int) -> dict[str, Any]:
    return {"ids": torch.arange(64, dtype=torch.int32) * (step + 1), "r": torch.randn(8), "step": step}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dump_dir = tmp_path_factory.mktemp("pristine")
    store = DirectoryStore(dump_dir)
    store.open_writer(STREAM)
    store.set_methods(STREAM, {"get_batch": {"convention": "sync", "step_arg": 1}})
    for step in range(3):
        store.save(STREAM, step, batch_for(step), BatchInfo.of(batch_for(step)))
    store.close()
    return dump_dir


@pytest.fixture
def dump(pristine: Path, tmp_path: Path) -> Path:
    target = tmp_path / "dump"
    target.mkdir()
    (target / "train").mkdir()
    for path in [pristine / "manifest.json", *(pristine / "train").glob("step_*.pkl")]:
        (target / path.relative_to(pristine)).write_bytes(path.read_bytes())
    return target


def loaders(dump_dir: Path, step: int) -> list[Callable[[], Any]]:
    """Every way a user loads a step: the store, load_step(path), open_dump, mock mode."""
    def mock() -> Any:
        config = {"enable": True, "mode": "mock", "dump_dir": str(dump_dir), "prefetch": False}
        with MockScheduler(None, config) as sched:
            return sched.get_batch(None, global_step=step)

    return [
        lambda: DirectoryStore(dump_dir).load(STREAM, step),
        lambda: load_step(dump_dir / "train" / f"step_{step:06d}.pkl"),
        lambda: open_dump(dump_dir).load(step),
        mock,
    ]


def assert_refused(dump_dir: Path, step: int, error: type[RolloutMockError], *words: str) -> None:
    path = dump_dir / "train" / f"step_{step:06d}.pkl"
    for load in loaders(dump_dir, step):
        with pytest.raises(error) as info:
            load()
        message = str(info.value)
        assert str(path) in message and f"step {step}" in message, message
        for word in words:
            assert word in message, message
        assert info.value.step == step


def step_file(dump_dir: Path, step: int) -> Path:
    return dump_dir / "train" / f"step_{step:06d}.pkl"


@FUZZ
@given(data=st.data())
def test_flipped_bytes_are_detected(dump: Path, data: st.DataObject) -> None:
    path = step_file(dump, 1)
    original = path.read_bytes()
    flips = data.draw(
        st.lists(st.tuples(st.integers(0, len(original) - 1), st.integers(1, 255)), min_size=1, max_size=4,
                 unique_by=lambda t: t[0])
    )
    damaged = bytearray(original)
    for index, mask in flips:
        damaged[index] ^= mask
    path.write_bytes(bytes(damaged))
    try:
        with pytest.raises(CorruptStepError, match="checksum") as info:
            DirectoryStore(dump).load(STREAM, 1)
        assert str(path) in str(info.value) and "step 1 of train" in str(info.value)
        with pytest.raises(CorruptStepError, match="step 1"):
            load_step(path)
    finally:
        path.write_bytes(original)


@FUZZ
@given(data=st.data())
def test_truncated_or_extended_files_are_detected(dump: Path, data: st.DataObject) -> None:
    path = step_file(dump, 2)
    original = path.read_bytes()
    if data.draw(st.booleans()):
        damaged = original[: data.draw(st.integers(0, len(original) - 1))]
    else:
        damaged = original + data.draw(st.binary(min_size=1, max_size=64))
    path.write_bytes(damaged)
    try:
        with pytest.raises(CorruptStepError, match=rf"size is {len(damaged)} bytes, manifest says {len(original)}") as info:
            DirectoryStore(dump).load(STREAM, 2)
        assert str(path) in str(info.value) and "step 2 of train" in str(info.value)
    finally:
        path.write_bytes(original)


def test_every_loader_refuses_a_flipped_byte(dump: Path) -> None:
    path = step_file(dump, 0)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert_refused(dump, 0, CorruptStepError, "checksum", "does not match")


def test_appended_bytes_refused_everywhere(dump: Path) -> None:
    path = step_file(dump, 0)
    path.write_bytes(path.read_bytes() + b"\x00")
    assert_refused(dump, 0, CorruptStepError, "size is")


def test_deleted_step_file(dump: Path) -> None:
    path = step_file(dump, 1)
    path.unlink()
    with pytest.raises(CorruptStepError, match="missing") as info:
        DirectoryStore(dump).load(STREAM, 1)
    assert str(path) in str(info.value) and "step 1 of train" in str(info.value)
    config = {"enable": True, "mode": "mock", "dump_dir": str(dump), "prefetch": False}
    with MockScheduler(None, config) as sched, pytest.raises(CorruptStepError, match="step 1"):
        sched.get_batch(None, global_step=1)


def edit_manifest(dump_dir: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    path = dump_dir / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def entry(data: dict[str, Any], step: int) -> dict[str, Any]:
    return data["streams"]["train"]["steps"][str(step)]


def test_manifest_with_wrong_checksum(dump: Path) -> None:
    edit_manifest(dump, lambda d: entry(d, 1).update(checksum="crc32:00000000"))
    assert_refused(dump, 1, CorruptStepError, "does not match the manifest's crc32:00000000")


def test_manifest_with_wrong_size(dump: Path) -> None:
    edit_manifest(dump, lambda d: entry(d, 1).update(size=entry(d, 1)["size"] + 1))
    assert_refused(dump, 1, CorruptStepError, "size is")


@pytest.mark.parametrize(
    ("change", "what"),
    [
        (lambda d: entry(d, 1).pop("checksum"), "missing checksum"),
        (lambda d: entry(d, 1).pop("size"), "missing size"),
        (lambda d: entry(d, 1).pop("file"), "missing file"),
        (lambda d: entry(d, 1).update(size="12 bytes"), "is not a byte count"),
        (lambda d: entry(d, 1).update(size=-1), "is not a byte count"),
        (lambda d: entry(d, 1).update(checksum="md5:abc"), "is not of the form crc32"),
        (lambda d: entry(d, 1).update(file="../../etc/passwd"), "expected 'train/step_000001.pkl'"),
        (lambda d: d["streams"]["train"]["steps"].__setitem__("1", "oops"), "expected an object"),
    ],
)
def test_manifest_entry_edited_by_hand(dump: Path, change: Callable[[dict[str, Any]], None], what: str) -> None:
    manifest = edit_manifest(dump, change)
    for load in loaders(dump, 1)[:3]:
        with pytest.raises(ManifestError) as info:
            load()
        message = str(info.value)
        assert str(manifest) in message and "train step 1" in message and what in message, message
        assert info.value.path == str(manifest)


@pytest.mark.parametrize(
    ("change", "error", "what"),
    [
        (lambda d: d.pop("format"), ManifestError, "not a rollout_mock manifest"),
        (lambda d: d.pop("format_version"), ManifestError, "format_version is missing"),
        (lambda d: d.pop("streams"), ManifestError, '"streams" is missing'),
        (lambda d: d["streams"]["train"].pop("steps"), ManifestError, 'has no "steps"'),
        (lambda d: d["streams"]["train"]["steps"].__setitem__("one", {}), ManifestError, "step key 'one'"),
        (lambda d: d.update(format_version=3), FormatVersionError, "format version 3"),
        (lambda d: d.update(requires=["index-segments", "from-the-future"]), FormatVersionError,
         "'from-the-future'"),
        (lambda d: d.update(requires="index-segments"), ManifestError, '"requires" is not a list'),
        (lambda d: d.update(format_version=0), FormatVersionError, "unknown on-disk format version 0"),
    ],
)
def test_manifest_structure_edited_by_hand(dump: Path, change: Callable[[dict[str, Any]], None],
                                          error: type[Exception], what: str) -> None:
    manifest = edit_manifest(dump, change)
    for load in loaders(dump, 1):
        with pytest.raises(error) as info:
            load()
        assert str(manifest) in str(info.value) and what in str(info.value), str(info.value)


def test_newer_format_says_upgrade(dump: Path) -> None:
    edit_manifest(dump, lambda d: d.update(format_version=99))
    with pytest.raises(FormatVersionError, match=r"reads versions up to 2; upgrade rollout_mock"):
        open_dump(dump)


@FUZZ
@given(data=st.data())
def test_manifest_cut_short_or_garbled(dump: Path, data: st.DataObject) -> None:
    path = dump / "manifest.json"
    original = path.read_bytes()
    if data.draw(st.booleans()):
        damaged = original[: data.draw(st.integers(0, len(original) - 2))]
    else:
        index = data.draw(st.integers(0, len(original) - 1))
        damaged = original[:index] + data.draw(st.sampled_from([b"\xff", b"{", b"\x00", b'"'])) + original[index + 1:]
    path.write_bytes(damaged)
    try:
        try:
            batch = DirectoryStore(dump).load(STREAM, 1)
        except (ManifestError, CorruptStepError) as exc:
            assert str(path) in str(exc) or str(step_file(dump, 1)) in str(exc), str(exc)
        else:  # a change that keeps the manifest valid (e.g. inside a string): the batch is right
            assert torch.equal(batch["ids"], batch_for(1)["ids"])
    finally:
        path.write_bytes(original)


def test_manifest_bad_json_names_line_and_column(dump: Path) -> None:
    path = dump / "manifest.json"
    path.write_text(path.read_text()[:50])
    with pytest.raises(ManifestError, match=rf"{path}: unreadable manifest \(.* at line \d+, column \d+\)"):
        DirectoryStore(dump).load(STREAM, 0)


def test_step_file_not_in_manifest(dump: Path) -> None:
    edit_manifest(dump, lambda d: d["streams"]["train"]["steps"].pop("2"))
    with pytest.raises(CorruptStepError, match="is not in") as info:
        DirectoryStore(dump).load(STREAM, 2)
    assert str(step_file(dump, 2)) in str(info.value) and "step 2 of train" in str(info.value)


def test_memory_store_detects_corruption() -> None:
    store = MemoryStore()
    store.save(STREAM, 0, batch_for(0), BatchInfo.of(batch_for(0)))
    good = store.load(STREAM, 0)
    assert torch.equal(good["ids"], batch_for(0)["ids"])
    import rollout_mock.codec as codec

    data = bytearray(codec.encode_bytes(batch_for(0)))
    data[-20] ^= 0x10
    store.backend.replace(STREAM.relpath(0), bytes(data))
    with pytest.raises(CorruptStepError, match="step 0 of train"):
        store.load(STREAM, 0)

"""Index segments (issue 18): entries folded every N steps, bounded crash recovery, lazy entries,
inline manifests for short streams, and hostile segment references. N is made small here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HANG_S

from rollout_mock import CorruptStepError, ManifestError, open_dump
from rollout_mock.errors import FormatVersionError
from rollout_mock.storage import BatchInfo, DirectoryStore, FsspecStore, MemoryStore
from rollout_mock.storage.index import INDEX_DIR, StreamIndex, segment_relpath
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.testing import StoreConformance

TRAIN = StreamId("train")
N = 4  # entries per segment in these tests


@pytest.fixture(autouse=True)
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StreamIndex, "segment_steps", N)
    monkeypatch.setattr(StreamIndex, "inline_steps", 10)


def batch(step: int) -> dict[str, Any]:
    return {"x": torch.full((3,), step)}


def save(store: Any, step: int, stream: StreamId = TRAIN) -> None:
    b = batch(step)
    store.save(stream, step, b, BatchInfo.of(b))


def index_names(dump: Path, stream: StreamId = TRAIN) -> list[str]:
    path = dump / stream.directory / INDEX_DIR
    return sorted(os.listdir(path)) if path.is_dir() else []


def manifest(dump: Path) -> dict[str, Any]:
    return dict(json.loads((dump / "manifest.json").read_text()))


def test_entries_fold_into_segments_while_recording(tmp_path: Path) -> None:
    dump = tmp_path / "d"
    store = DirectoryStore(dump)
    for step in range(10):
        save(store, step)
    # two folds of 4: segments 0 and 1, and the 2 newest entries still as files
    assert index_names(dump) == ["segment_000000.json", "segment_000001.json", "step_000008.json", "step_000009.json"]
    data = manifest(dump)
    assert data["requires"] == ["index-segments"] and data["format_version"] == 2
    assert data["streams"]["train"]["segments"] == [{"seq": 0, "steps": [[0, 3]]}, {"seq": 1, "steps": [[4, 7]]}]
    reader = DirectoryStore(dump)  # another process, while the writer runs
    assert reader.steps(TRAIN) == list(range(10))
    assert torch.equal(reader.load(TRAIN, 2)["x"], batch(2)["x"])  # its entry comes from segment 0
    assert torch.equal(reader.load(TRAIN, 9)["x"], batch(9)["x"])  # from its entry file
    store.close()


def test_a_fold_keeps_the_manifest_fields_it_does_not_know(tmp_path: Path) -> None:
    """A writer's read-modify-write of manifest.json keeps top-level fields this version does not
    know (a newer writer's, rollout settings), and says the format of the steps it adds."""
    dump = tmp_path / "d"
    store = DirectoryStore(dump)
    save(store, 0)
    store.close()
    data = manifest(dump)
    data.update(format_version=1, rollout_settings_v9={"temperature": 0.7})
    (dump / "manifest.json").write_text(json.dumps(data))
    assert DirectoryStore(dump).manifest().to_json()["format_version"] == 1  # read as recorded
    store = DirectoryStore(dump)
    save(store, 1)
    store.close()
    data = manifest(dump)
    assert data["rollout_settings_v9"] == {"temperature": 0.7} and data["format_version"] == 2
    assert sorted(map(int, data["streams"]["train"]["steps"])) == [0, 1]


def test_short_stream_is_inline_at_close_long_one_keeps_segments(tmp_path: Path) -> None:
    short, long = tmp_path / "short", tmp_path / "long"
    for dump, steps in ((short, 9), (long, 14)):
        store = DirectoryStore(dump)
        for step in range(steps):
            save(store, step)
        store.close()
    data = manifest(short)
    assert "requires" not in data and "segments" not in data["streams"]["train"]
    assert sorted(map(int, data["streams"]["train"]["steps"])) == list(range(9)) and index_names(short) == []
    data = manifest(long)
    assert data["streams"]["train"]["steps"] == {} and data["requires"] == ["index-segments"]
    assert [r["steps"] for r in data["streams"]["train"]["segments"]] == [[[0, 3]], [[4, 7]], [[8, 11]], [[12, 13]]]
    assert all(n.startswith("segment_") for n in index_names(long))
    dump = open_dump(long)
    assert dump.steps(TRAIN) == list(range(14))
    for step in (0, 5, 13):
        assert torch.equal(dump.load(step)["x"], batch(step)["x"])
        entry = dump.entry(TRAIN, step)
        assert entry is not None and entry.file == TRAIN.relpath(step)


def test_deletes_and_overwrites_across_segments(tmp_path: Path) -> None:
    dump = tmp_path / "d"
    store = DirectoryStore(dump)
    for step in range(12):
        save(store, step)
    store.delete(TRAIN, 1)  # folded in segment 0: a tombstone
    store.delete(TRAIN, 11)  # not folded: its entry file goes
    b = {"x": torch.full((3,), 99)}
    store.save(TRAIN, 5, b, BatchInfo.of(b), overwrite=True)  # folded in segment 1, then rewritten
    assert DirectoryStore(dump).steps(TRAIN) == [0, *range(2, 11)]
    for step in range(2, 4):
        store.delete(TRAIN, step)
    store.delete(TRAIN, 0)  # segment 0 now holds no live step
    store.close()
    data = manifest(dump)
    assert sorted(map(int, data["streams"]["train"]["steps"])) == list(range(4, 11))  # 7 steps: inline
    assert index_names(dump) == []  # segments folded back inline, emptied ones removed
    reader = open_dump(dump)
    assert torch.equal(reader.load(5)["x"], b["x"])
    with pytest.raises(Exception, match="step 1"):
        reader.load(1)


def test_many_deletes_keep_the_index_bounded(tmp_path: Path) -> None:
    """Retention (max_keep) deletes a step per step: tombstones fold too, emptied segments go."""
    dump = tmp_path / "d"
    store = DirectoryStore(dump)
    for step in range(60):
        save(store, step)
        if step >= 3:
            store.delete(TRAIN, step - 3)
    assert store.steps(TRAIN) == [57, 58, 59]
    assert len(index_names(dump)) <= 2 * N + 2, index_names(dump)
    refs = manifest(dump)["streams"]["train"].get("segments", [])
    assert sum(last - first + 1 for r in refs for first, last in r["steps"]) <= 3 + N  # + tombstones not folded yet
    store.close()
    assert open_dump(dump).steps(TRAIN) == [57, 58, 59]


CRASHING = textwrap.dedent(
    """
    import os, signal, sys, torch
    from rollout_mock.storage import BatchInfo, DirectoryStore
    from rollout_mock.storage.manifest import StreamId
    from rollout_mock.storage.index import StreamIndex
    StreamIndex.segment_steps = 4
    StreamIndex.inline_steps = 10
    store, stream = DirectoryStore(sys.argv[1]), StreamId("train")
    for step in range(int(sys.argv[2])):
        b = {"x": torch.full((3,), step)}
        store.save(stream, step, b, BatchInfo.of(b))
    if sys.argv[3] == "orphan":  # killed between a segment file and its reference in the manifest
        index = store._owned[stream.key]
        index.backend.create(f"train/.index/segment_{index.next_seq:06d}.json", b"{}")
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("leftover", ["entries", "orphan"])
def test_resume_after_sigkill_folds_at_most_one_segment(tmp_path: Path, leftover: str) -> None:
    dump = tmp_path / "d"
    proc = subprocess.run([sys.executable, "-c", CRASHING, str(dump), "23", leftover], capture_output=True,
                          text=True, timeout=HANG_S)
    assert proc.returncode == -9, proc.stderr[-2000:]
    names = index_names(dump)
    assert len([n for n in names if n.startswith("step_")]) == 3  # 23 = 5 segments of 4 + 3 entries
    assert open_dump(dump).steps(TRAIN) == list(range(23))  # readers see every committed step
    store = DirectoryStore(dump)
    store.open_writer(TRAIN)  # the dead writer's flock is gone with it
    assert [n for n in index_names(dump) if n.startswith("step_")] == []
    assert len([n for n in index_names(dump) if n.startswith("segment_")]) == 6  # the orphan removed
    save(store, 23)
    store.close()
    dump_view = open_dump(dump)
    assert dump_view.steps(TRAIN) == list(range(24))
    assert all(torch.equal(dump_view.load(s)["x"], batch(s)["x"]) for s in (0, 21, 22, 23))


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        (lambda m: m["streams"]["train"]["segments"][0].update(steps=[[0, 10**17]]), ManifestError, "more than"),
        (lambda m: m["streams"]["train"]["segments"][0].update(steps=[[3, 1]]), ManifestError, "malformed"),
        (lambda m: m["streams"]["train"]["segments"][0].update(steps=[[0, 2], [1, 3]]), ManifestError, "malformed"),
        (lambda m: m["streams"]["train"]["segments"][0].update(seq=True), ManifestError, "malformed"),
        (lambda m: m["streams"]["train"].update(segments={"seq": 0}), ManifestError, "malformed"),
        (lambda m: m["streams"]["train"]["segments"].append({"seq": 0, "steps": []}), ManifestError, "malformed"),
        (lambda m: m.update(requires=["index-segments", "time-travel"]), FormatVersionError, "time-travel"),
    ],
)
def test_hostile_segment_references_are_refused(tmp_path: Path, edit: Any, error: type[Exception],
                                                match: str) -> None:
    dump = tmp_path / "d"
    store = DirectoryStore(dump)
    for step in range(14):
        save(store, step)
    store.close()
    data = manifest(dump)
    edit(data)
    (dump / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(error, match=match):
        open_dump(dump)


@pytest.mark.parametrize("damage", ["missing", "other stream", "garbage", "step absent"])
def test_damaged_segment_files_are_named(tmp_path: Path, damage: str) -> None:
    dump = tmp_path / "d"
    store = DirectoryStore(dump)
    for step in range(14):
        save(store, step)
    store.close()
    path = dump / segment_relpath(TRAIN, 0)
    if damage == "missing":
        path.unlink()
    elif damage == "other stream":
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "stream": "val"}))
    elif damage == "garbage":
        path.write_bytes(b"\xff" * 100)
    else:
        record = json.loads(path.read_text())
        del record["entries"]["2"]
        path.write_text(json.dumps(record))
    reader = open_dump(dump)
    assert reader.steps(TRAIN) == list(range(14))  # listing reads no segment
    with pytest.raises(ManifestError, match="segment"):
        reader.load(2)
    assert torch.equal(reader.load(5)["x"], batch(5)["x"])  # other segments are fine


def test_a_segment_cannot_vouch_for_a_changed_step(tmp_path: Path) -> None:
    dump = tmp_path / "d"
    store = DirectoryStore(dump)
    for step in range(14):
        save(store, step)
    store.close()
    step_file = dump / TRAIN.relpath(1)
    data = bytearray(step_file.read_bytes())
    data[-40] ^= 0xFF
    step_file.write_bytes(bytes(data))
    with pytest.raises(CorruptStepError):
        open_dump(dump).load(1)


class TestSmallSegmentsMemory(StoreConformance):
    """The whole store conformance suite with folds every 4 steps (autouse fixture above)."""

    @pytest.fixture
    def backends(self) -> Any:
        from rollout_mock.storage import MemoryBackend

        return MemoryBackend().reopen


class TestSmallSegmentsFsspec(StoreConformance):
    @pytest.fixture
    def backends(self) -> Iterator[Any]:
        import uuid

        import fsspec

        from rollout_mock.storage import FsspecBackend

        url = f"memory://rollout-mock-segments/{uuid.uuid4().hex}"
        yield lambda: FsspecBackend(url)
        fs = fsspec.filesystem("memory")
        if fs.exists(url):
            fs.rm(url, recursive=True)


def test_stores_over_every_backend_agree(tmp_path: Path) -> None:
    """The same 14 steps through the three backends: the same steps and entries."""
    stores = [DirectoryStore(tmp_path / "d"), MemoryStore(), FsspecStore(f"memory://agree/{tmp_path.name}")]
    for store in stores:
        for step in range(14):
            save(store, step)
    views = [s.another() for s in stores]
    for store in stores:
        store.close()
    for view in views:
        assert view.steps(TRAIN) == list(range(14))
        assert [view.entry(TRAIN, s).checksum for s in (0, 7, 13)] == [  # type: ignore[union-attr]
            views[0].entry(TRAIN, s).checksum for s in (0, 7, 13)]  # type: ignore[union-attr]


def test_a_dead_writers_temporary_segment_is_removed_on_resume(tmp_path: Path) -> None:
    """Found by the SIGKILL crash test: a writer killed while writing a segment leaves its
    temporary file; the next writer of the stream removes it (and only its own stream's)."""
    dump = tmp_path / "d"
    store = DirectoryStore(dump)
    for step in range(6):
        save(store, step)
    store.close()
    index = dump / "train" / INDEX_DIR
    index.mkdir(exist_ok=True)
    mine, other = index / ".segment_000007.json.tmp-999-abcd", index / ".segment_000007_rank1.json.tmp-999-abcd"
    mine.write_bytes(b"{")
    other.write_bytes(b"{")
    DirectoryStore(dump).open_writer(TRAIN)
    assert not mine.exists() and other.exists()

"""Replay onto another data-parallel layout, reading only the needed rows and keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rollout_mock import DirectoryStore, IncompleteDumpError, MockScheduler, open_dump, rank_rows
from rollout_mock.storage import BatchInfo, FsspecStore, load_resplit
from rollout_mock.storage.manifest import StreamId

ROWS = 64


def batch_for(step: int, rows: int = ROWS, offset: int = 0, width: int = 64) -> dict[str, Any]:
    ids = torch.arange(offset, offset + rows, dtype=torch.int64)[:, None].repeat(1, width) + step
    return {"input_ids": ids, "reward": ids[:, 0].float(), "meta": {"step": step}}


@pytest.mark.parametrize(("n", "size"), [(64, 8), (10, 4), (3, 4), (0, 2), (7, 1)])
def test_rank_rows_matches_torch_chunk(n: int, size: int) -> None:
    chunks = torch.arange(n).chunk(size) if n else ()
    for rank in range(size):
        expected = chunks[rank].tolist() if rank < len(chunks) else []
        assert list(rank_rows(n, rank, size)) == expected
    with pytest.raises(ValueError):
        rank_rows(n, size, size)


def test_partial_load_reads_only_its_rows(tmp_path: Path) -> None:
    store = FsspecStore(f"memory://partial-{tmp_path.name}")
    batch = batch_for(3, width=65536)  # 32 MB: 8 of the codec's 4 MiB chunks
    store.save(StreamId("train"), 3, batch, BatchInfo.of(batch))
    store.close()
    dump = open_dump(f"memory://partial-{tmp_path.name}")
    full = dump.entry(StreamId("train"), 3).size
    source = dump.store.open_source("train/step_000003.pkl")
    reads: list[int] = []
    dump.store.open_source = lambda rel: source  # type: ignore[method-assign]
    original = source.read_range
    source.read_range = lambda o, n: reads.append(n) or original(o, n)  # type: ignore[method-assign]
    rows = rank_rows(ROWS, 2, 8)
    part = dump.load(3, "train", rows=rows, keys=["input_ids"])
    assert set(part) == {"input_ids"} and torch.equal(part["input_ids"], batch["input_ids"][16:24])
    # 1/8 of the rows of one key: the header plus the one chunk holding them, not the whole step
    assert sum(reads) < full / 6, (sum(reads), full)


def test_mock_mode_replay_rows_and_keys(tmp_path: Path) -> None:
    class Scheduler:
        def get_batch(self, data: Any, global_step: int) -> dict[str, Any]:
            return batch_for(global_step)

    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path)}
    with MockScheduler(Scheduler(), config) as sched:
        for step in range(2):
            sched.get_batch(None, global_step=step)
    for rank in range(4):
        mock = {**config, "mode": "mock", "replay_rows": {"dp_rank": rank, "dp_size": 4},
                "replay_keys": ["input_ids", "meta"]}
        with MockScheduler(None, mock, spec=Scheduler) as sched:
            got = sched.get_batch(None, global_step=1)
        assert set(got) == {"input_ids", "meta"} and got["meta"] == {"step": 1}
        assert torch.equal(got["input_ids"], batch_for(1)["input_ids"][rank * 16:(rank + 1) * 16])


def test_per_rank_dump_resplit_onto_another_rank_count(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    for rank in range(2):  # recorded on 2 ranks, 8 rows each
        batch = batch_for(0, rows=8, offset=8 * rank)
        store.save(StreamId("train", None, rank), 0, batch, BatchInfo.of(batch))
    store.close()
    whole = batch_for(0, rows=16)
    reader = DirectoryStore(tmp_path)
    for rank in range(4):  # replayed on 4 ranks
        got = load_resplit(reader, "train", 0, dp_rank=rank, dp_size=4)
        assert torch.equal(got["input_ids"], whole["input_ids"][4 * rank:4 * rank + 4])
    assert torch.equal(load_resplit(reader, "train", 0, dp_rank=1, dp_size=2)["input_ids"],
                       whole["input_ids"][8:])
    DirectoryStore(tmp_path).delete(StreamId("train", None, 0), 0)
    with pytest.raises(IncompleteDumpError, match=r"recorded ranks are \[1\]"):
        load_resplit(DirectoryStore(tmp_path), "train", 0, dp_rank=0, dp_size=4)

"""Rank options under a real torch.distributed process group: 2 processes, gloo, 127.0.0.1.

One launch (both ranks in parallel, bounded by a timeout) runs every scenario; the tests check
its report and the files it left:

* ``ranks: one`` (default): rank 1 dumps first, while rank 0 waits at a barrier, so anything it
  touched would be visible; then rank 0 (``dump_rank``) dumps. In mock mode both ranks replay
  rank 0's files.
* ``ranks: all``: each rank (a data-parallel head with its own batches) dumps and replays
  ``step_NNNNNN_rankR.pkl`` at the same time as the other.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from conftest import HANG_S

from rollout_mock import load_step

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

WORLD = 2
STEPS = 3
TIMEOUT_S = HANG_S

WORKER = textwrap.dedent(
    '''
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist
    from rollout_mock import MockScheduler

    rank, world, out, one_dir, all_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    STEPS = range(int(os.environ["TEST_STEPS"]))
    dist.init_process_group(
        "gloo", init_method="tcp://127.0.0.1:" + os.environ["MASTER_PORT"], rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=float(os.environ["TEST_HANG_S"])),
    )

    class Head:
        """One data-parallel head's scheduler (RLVR shape): its batches depend on the rank."""
        def __init__(self):
            self.calls = 0
        def get_batch(self, data, global_step, batch_size):
            self.calls += 1
            generator = torch.Generator().manual_seed(1000 * rank + global_step)
            return {"rank": rank, "step": global_step,
                    "input_ids": torch.randint(0, 50000, (batch_size, 8), generator=generator)}

    def cfg(dump_dir, mode, **extra):
        return {"enable": True, "mode": mode, "dump_dir": dump_dir, **extra}

    def summary(batch):
        return {"rank": batch["rank"], "step": batch["step"], "ids": batch["input_ids"].tolist()}

    result = {"rank": rank, "dist_rank": dist.get_rank()}
    # ranks: one -- rank 1 first (rank 0 waits), so whatever rank 1 touched is visible to it.
    for turn in (1, 0):
        if rank == turn:
            head = Head()
            with MockScheduler(head, cfg(one_dir, "dump")) as scheduler:
                result["one_writes"] = scheduler.interceptor.writes
                result["one_dumped"] = [summary(scheduler.get_batch(None, s, 2)) for s in STEPS]
            result["one_calls"] = head.calls
            result["one_dir_after_own_dump"] = sorted(os.listdir(one_dir)) if os.path.exists(one_dir) else None
        dist.barrier()
    with MockScheduler(None, cfg(one_dir, "mock"), spec=Head) as scheduler:
        result["one_replayed"] = [summary(scheduler.get_batch(None, s, 2)) for s in STEPS]
    dist.barrier()
    # ranks: all -- both ranks record their own batches at the same time.
    with MockScheduler(Head(), cfg(all_dir, "dump", ranks="all")) as scheduler:
        result["all_writes"] = scheduler.interceptor.writes
        result["all_stream"] = scheduler.interceptor.stream.key
        result["all_dumped"] = [summary(scheduler.get_batch(None, s, 2)) for s in STEPS]
    dist.barrier()
    with MockScheduler(None, cfg(all_dir, "mock", ranks="all"), spec=Head) as scheduler:
        result["all_replayed"] = [summary(scheduler.get_batch(None, s, 2)) for s in STEPS]
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w") as file:
        json.dump(result, file)
    '''
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ranks")
    script = root / "worker.py"
    script.write_text(WORKER)
    one_dir, all_dir = root / "one", root / "all"
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "TEST_STEPS": str(STEPS),
        "TEST_HANG_S": str(HANG_S),
    }
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(WORLD), str(root / f"rank{rank}.json"), str(one_dir), str(all_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(WORLD)
    ]
    logs = []
    try:
        for process in processes:
            output, _ = process.communicate(timeout=TIMEOUT_S)
            logs.append(output)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for rank, process in enumerate(processes):
        assert process.returncode == 0, f"rank {rank} failed:\n{logs[rank][-4000:] if rank < len(logs) else ''}"
    results = [json.loads((root / f"rank{rank}.json").read_text()) for rank in range(WORLD)]
    return {"results": results, "one_dir": one_dir, "all_dir": all_dir}


def as_tensor(summary: dict[str, Any]) -> torch.Tensor:
    return torch.tensor(summary["ids"])


def test_ranks_one_only_dump_rank_writes(launch: dict[str, Any]) -> None:
    rank0, rank1 = launch["results"]
    assert (rank0["dist_rank"], rank1["dist_rank"]) == (0, 1)
    assert rank0["one_writes"] is True and rank1["one_writes"] is False
    assert rank0["one_calls"] == rank1["one_calls"] == STEPS  # every rank still runs its scheduler
    # Rank 1 dumped first: it left no directory, lock, manifest or step file behind.
    assert rank1["one_dir_after_own_dump"] is None
    assert ".manifest.lock" in rank0["one_dir_after_own_dump"] and "manifest.json" in rank0["one_dir_after_own_dump"]
    one_dir: Path = launch["one_dir"]
    assert sorted(p.name for p in (one_dir / "train").iterdir()) == [
        ".health", ".writer.lock", *[f"step_{s:06d}.pkl" for s in range(STEPS)]
    ]
    manifest = json.loads((one_dir / "manifest.json").read_text())
    assert list(manifest["streams"]) == ["train"]
    for step in range(STEPS):
        recorded = load_step(one_dir / "train" / f"step_{step:06d}.pkl")
        assert recorded["rank"] == 0 and torch.equal(recorded["input_ids"], as_tensor(rank0["one_dumped"][step]))
        assert not torch.equal(recorded["input_ids"], as_tensor(rank1["one_dumped"][step]))


def test_ranks_one_every_rank_replays_the_same_file(launch: dict[str, Any]) -> None:
    rank0, rank1 = launch["results"]
    for step in range(STEPS):
        assert rank0["one_replayed"][step] == rank1["one_replayed"][step] == rank0["one_dumped"][step]


def test_ranks_all_each_rank_writes_and_replays_its_own_file(launch: dict[str, Any]) -> None:
    all_dir: Path = launch["all_dir"]
    results = launch["results"]
    assert [r["all_writes"] for r in results] == [True, True]
    assert [r["all_stream"] for r in results] == ["train@rank0", "train@rank1"]
    assert sorted(p.name for p in (all_dir / "train").glob("step_*.pkl")) == sorted(
        f"step_{s:06d}_rank{r}.pkl" for s in range(STEPS) for r in range(WORLD)
    )
    for rank, result in enumerate(results):
        for step in range(STEPS):
            recorded = load_step(all_dir / "train" / f"step_{step:06d}_rank{rank}.pkl")
            assert recorded["rank"] == rank and recorded["step"] == step
            assert torch.equal(recorded["input_ids"], as_tensor(result["all_dumped"][step]))
            assert result["all_replayed"][step] == result["all_dumped"][step]
    assert results[0]["all_replayed"][0] != results[1]["all_replayed"][0]

"""``rollout-mock cut`` keeps the batch class, and its output replays with the class's methods.

The cut runs in a fresh process (the CLI), where verl and the user's module are not imported:
that is where the class used to be lost (a verl ``DataProto`` became a ``codec.Batch``, and
verl then failed with ``'Batch' object has no attribute 'union'``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rollout_mock import MockScheduler

REPO = Path(__file__).resolve().parents[2]


class Source:
    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def get_batch(self, global_step: int) -> Any:
        return self.batch


def record(dump_dir: Path, batch: Any) -> None:
    scheduler = MockScheduler(Source(batch), {"enable": True, "mode": "dump", "dump_dir": str(dump_dir)})
    scheduler.get_batch(global_step=0)
    scheduler.close()


def cut(src: Path, dst: Path, *extra: str, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(REPO), pythonpath] if p))
    return subprocess.run([sys.executable, "-m", "rollout_mock", "cut", str(src), str(dst), "--steps", "0",
                           "--samples", "0-1", *extra], capture_output=True, text=True, env=env, check=False)


def replay(dump_dir: Path) -> Any:
    scheduler = MockScheduler(None, {"enable": True, "mode": "mock", "dump_dir": str(dump_dir)}, spec=Source)
    try:
        return scheduler.get_batch(global_step=0)
    finally:
        scheduler.close()


def test_verl_dataproto_stays_a_dataproto(tmp_path: Path) -> None:
    protocol = pytest.importorskip("verl.protocol", reason="verl is not installed")
    data = protocol.DataProto.from_dict(
        tensors={"input_ids": torch.arange(12).reshape(4, 3), "mask": torch.ones(4, 3)},
        non_tensors={"uid": np.array(["a", "b", "c", "d"], dtype=object)},
        meta_info={"global_step": 0},
    )
    record(tmp_path / "src", data)
    proc = cut(tmp_path / "src", tmp_path / "dst")
    assert proc.returncode == 0, proc.stderr
    batch = replay(tmp_path / "dst")
    assert type(batch) is protocol.DataProto
    assert len(batch) == 2 and batch.batch["input_ids"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert list(batch.non_tensor_batch["uid"]) == ["a", "b"]
    # verl's own methods work on the replayed batch
    extra = protocol.DataProto.from_dict(tensors={"values": torch.zeros(2, 3)})
    joined = batch.union(extra)
    assert sorted(joined.batch.keys()) == ["input_ids", "mask", "values"]
    assert [len(c) for c in batch.chunk(2)] == [1, 1]


def test_demo_batch_stays_itself(tmp_path: Path) -> None:
    from rollout_mock.demo import RolloutBatch

    record(tmp_path / "src", RolloutBatch({"x": torch.arange(4)}, {"y": np.array(list("abcd"), dtype=object)}, {"k": 1}))
    proc = cut(tmp_path / "src", tmp_path / "dst")
    assert proc.returncode == 0, proc.stderr
    batch = replay(tmp_path / "dst")
    assert type(batch) is RolloutBatch and len(batch) == 2 and batch.meta_info == {"k": 1}


def test_registered_class_needs_and_gets_its_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "my_batches.py").write_text(textwrap.dedent("""
        from rollout_mock import register_batch_class

        @register_batch_class
        class Trajectories:
            def __init__(self, items):
                self.items = items

            def __len__(self):
                return len(self.items)

            def first(self):
                return self.items[0]
    """))
    monkeypatch.syspath_prepend(str(tmp_path / "mod"))
    import my_batches  # type: ignore[import-not-found]

    record(tmp_path / "src", [my_batches.Trajectories([i, i + 1]) for i in range(3)])
    refused = cut(tmp_path / "src", tmp_path / "no")
    assert refused.returncode != 0 and "--import" in refused.stderr + refused.stdout
    proc = cut(tmp_path / "src", tmp_path / "dst", "--import", "my_batches", pythonpath=str(tmp_path / "mod"))
    assert proc.returncode == 0, proc.stderr
    batch = replay(tmp_path / "dst")
    assert [type(t) for t in batch] == [my_batches.Trajectories] * 2
    assert [t.first() for t in batch] == [0, 1]

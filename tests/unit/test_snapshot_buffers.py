"""Snapshot buffers are reused across steps, and a reused buffer never changes a written step."""

from __future__ import annotations

from pathlib import Path

import torch

from rollout_mock import MockScheduler, load_step, open_dump
from rollout_mock.codec import BufferPool, capture


def test_pool_reuses_released_buffers_and_stays_bounded() -> None:
    pool = BufferPool(keep=1)
    batch = {"x": torch.randn(256, 1024), "y": torch.arange(100_000)}
    first = capture(batch, pool=pool)
    assert torch.equal(first.materialize()["x"], batch["x"])
    first.release()
    held = pool.free_bytes
    assert held >= batch["x"].numel() * 4
    second = capture(batch, pool=pool)
    assert pool.free_bytes == 0  # the released buffers were taken again
    batch["x"].add_(1)  # mutating the batch after capture does not change the snapshot
    assert not torch.equal(second.materialize()["x"], batch["x"])
    second.release()
    third = capture({"x": torch.randn(256, 1024), "y": torch.arange(100_000)}, pool=pool)
    third.release()
    assert pool.free_bytes <= held  # keep=1: one snapshot's worth


def test_background_dump_with_reused_buffers_writes_every_step_exactly(tmp_path: Path) -> None:
    """Steps are written from pooled buffers while the caller mutates its batch in place."""
    shared = {"x": torch.zeros(64, 4096), "step": 0}

    class Scheduler:
        def get_batch(self, data: object, global_step: int) -> dict:
            shared["x"].fill_(float(global_step))  # the same tensor, new values, every step
            shared["step"] = global_step
            return shared

    config = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path), "background": True, "max_pending": 2}
    with MockScheduler(Scheduler(), config) as sched:
        for step in range(12):
            sched.get_batch(None, global_step=step)
        pool = sched.interceptor._buffers
    assert pool.free_bytes > 0  # buffers came back to the pool
    dump = open_dump(tmp_path)
    assert dump.steps(dump.stream("train")) == list(range(12))
    for step in range(12):
        batch = load_step(tmp_path / "train" / f"step_{step:06d}.pkl")
        assert batch["step"] == step and torch.all(batch["x"] == float(step))


def _inside(tensor: torch.Tensor, buffers: list[torch.Tensor]) -> bool:
    start = tensor.untyped_storage().data_ptr()
    return any(b.data_ptr() <= start < b.data_ptr() + b.numel() for b in buffers)


def test_small_tensors_are_copied_into_the_reused_buffers_not_cloned() -> None:
    """AReaL-like trajectories (many small tensors in a list) and small tensors at the top level
    are copied into pooled memory, side by side, and stay independent of the caller's tensors."""
    pool = BufferPool(keep=1)
    trajectories = [{"ids": torch.arange(100) + i, "mask": torch.ones(100, dtype=torch.bool)} for i in range(300)]
    batch = {"small": torch.arange(50), "trajectories": trajectories}
    for _ in range(2):  # the second capture reuses the first one's buffers
        snapshot = capture(batch, pool=pool)
        assert 0 < len(snapshot.pooled) <= 3  # a few 4 MiB slabs, not one buffer per tensor
        loaded = snapshot.materialize()
        assert torch.equal(loaded["small"], batch["small"]) and _inside(loaded["small"], snapshot.pooled)
        for got, want in zip(loaded["trajectories"], trajectories):
            assert torch.equal(got["ids"], want["ids"]) and got["mask"].dtype == torch.bool
            assert _inside(got["ids"], snapshot.pooled)
        trajectories[0]["ids"].add_(1000)  # the caller mutates: the snapshot does not change
        assert int(snapshot.materialize()["trajectories"][0]["ids"][0]) < 1000
        trajectories[0]["ids"].sub_(1000)
        snapshot.release()
    assert pool.free_bytes > 0

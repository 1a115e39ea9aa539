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

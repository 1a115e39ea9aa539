"""Capture buffers are reused across steps, and a reused buffer never changes a written step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollout_mock import MockScheduler, load_step, open_dump
from rollout_mock.codec import BufferPool, Capture, capture, decode, encode_bytes


def written(cap: Capture) -> Any:
    """What the writer thread writes of a capture, loaded back."""
    return decode(encode_bytes(cap))


def test_pool_reuses_released_buffers_and_stays_bounded() -> None:
    pool = BufferPool(keep=1)
    batch = {"x": torch.randn(256, 1024), "y": torch.arange(100_000)}
    first = capture(batch, pool=pool)
    assert torch.equal(written(first)["x"], batch["x"])
    first.release()
    held = pool.free_bytes
    assert held >= batch["x"].numel() * 4
    second = capture(batch, pool=pool)
    assert pool.free_bytes == 0  # the released buffers were taken again
    batch["x"].add_(1)  # mutating the batch after capture does not change the capture
    assert not torch.equal(written(second)["x"], batch["x"])
    second.release()
    third = capture({"x": torch.randn(256, 1024), "y": torch.arange(100_000)}, pool=pool)
    third.release()
    assert pool.free_bytes <= held  # keep=1: one capture's worth


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


def _inside(view: memoryview, buffers: list[torch.Tensor]) -> bool:
    start = np.frombuffer(view, np.uint8).ctypes.data
    return any(b.data_ptr() <= start < b.data_ptr() + b.numel() for b in buffers)


def test_small_tensors_are_copied_into_the_reused_buffers_not_cloned() -> None:
    """AReaL-like trajectories (many small tensors in a list) and small tensors at the top level
    are copied into pooled memory, side by side, and stay independent of the caller's tensors."""
    pool = BufferPool(keep=1)
    trajectories = [{"ids": torch.arange(100) + i, "mask": torch.ones(100, dtype=torch.bool)} for i in range(300)]
    batch = {"small": torch.arange(50), "trajectories": trajectories}
    for _ in range(2):  # the second capture reuses the first one's buffers
        cap = capture(batch, pool=pool)
        assert 0 < len(cap.pooled) <= 3  # a few 4 MiB slabs, not one buffer per tensor
        assert cap.body is not None
        data_chunks = [view for i, (view, _) in enumerate(cap.chunks) if not cap.body[0] <= i < sum(cap.body)]
        assert data_chunks and all(_inside(view, cap.pooled) for view in data_chunks)
        loaded = written(cap)
        assert torch.equal(loaded["small"], batch["small"])
        for got, want in zip(loaded["trajectories"], trajectories):
            assert torch.equal(got["ids"], want["ids"]) and got["mask"].dtype == torch.bool
        trajectories[0]["ids"].add_(1000)  # the caller mutates: the capture does not change
        assert int(written(cap)["trajectories"][0]["ids"][0]) < 1000
        trajectories[0]["ids"].sub_(1000)
        cap.release()
    assert pool.free_bytes > 0

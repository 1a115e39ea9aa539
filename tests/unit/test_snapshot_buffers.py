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


def test_a_capture_shows_its_tensors_over_its_own_memory() -> None:
    """Capture.tensors (issue 36): every tensor and numeric array, by path, over the capture's
    buffers: no encode, no decode; independent of the batch once captured."""
    big = torch.arange(300_000, dtype=torch.float32)  # over 1 MiB: chunks of its own in the body
    batch = {"logits": torch.tensor([[1.0, float("nan")], [3.0, 4.0]]), "ids": np.arange(6, dtype=np.int16).reshape(2, 3),
             "parts": [torch.tensor([float("inf")]), torch.ones(3, dtype=torch.bool), big], "n": 3}
    expected = {"logits": batch["logits"].clone(), "ids": batch["ids"].copy()}
    pool = BufferPool(keep=1)
    captured = capture(batch, pool=pool)
    batch["logits"].zero_()
    batch["ids"][:] = 0
    big.zero_()
    shown = list(captured.tensors())
    paths = [path for path, _ in shown]
    assert paths == ["logits", "ids", "parts[*]", "parts[*]", "parts[*]"]
    values = dict(shown[:2])
    assert values["logits"].view(torch.int32).tolist() == expected["logits"].view(torch.int32).tolist()
    assert isinstance(values["ids"], np.ndarray) and values["ids"].dtype == np.int16
    assert values["ids"].tolist() == expected["ids"].tolist()
    assert shown[2][1].tolist() == [float("inf")] and shown[3][1].dtype == torch.bool
    assert torch.equal(shown[4][1], torch.arange(300_000, dtype=torch.float32))
    held = list(captured.pooled)
    for _, value in shown:
        tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(value)
        start = tensor.data_ptr()
        assert any(b.data_ptr() <= start < b.data_ptr() + b.numel() for b in held), "not in the capture's buffers"
    captured.release()
    assert list(captured.tensors()) == []

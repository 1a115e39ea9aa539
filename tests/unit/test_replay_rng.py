"""``replay_rng``: generator states recorded after a rollout call and restored after replaying it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rollout_mock import MockScheduler, open_dump
from rollout_mock.errors import CorruptStepError
from rollout_mock.storage.manifest import StreamId
from rollout_mock.wrap.rng import capture_rng, changed, restore_rng


@pytest.fixture(autouse=True)
def keep_global_generators() -> Any:
    """These tests reseed the global generators: give later tests the state they had."""
    saved = capture_rng()
    yield
    restore_rng(saved)


class Sampling:
    """An in-process rollout that draws from every global generator."""

    def get_batch(self, global_step: int) -> dict[str, Any]:
        return {"x": torch.rand(3), "n": float(np.random.rand()), "p": random.random()}


class Pure:
    def get_batch(self, global_step: int) -> dict[str, Any]:
        return {"x": torch.arange(3)}


def training_side() -> tuple[list[float], float, float]:
    return torch.rand(4).tolist(), float(np.random.rand()), random.random()


def seed(value: int) -> None:
    torch.manual_seed(value)
    np.random.seed(value)
    random.seed(value)


def test_capture_restore_round_trip() -> None:
    seed(1)
    state = capture_rng()
    first = training_side()
    assert changed(state, capture_rng())
    restore_rng(state)
    assert training_side() == first
    assert not changed(capture_rng(), capture_rng())
    with pytest.raises(CorruptStepError, match="format is 'other'"):
        restore_rng({"format": "other"})


@pytest.mark.parametrize("replay_rng", [True, False])
def test_training_side_sees_the_dump_runs_stream(tmp_path: Path, replay_rng: bool) -> None:
    config = {"enable": True, "dump_dir": str(tmp_path / "d"), "replay_rng": replay_rng}
    seed(0)
    dump = MockScheduler(Sampling(), {**config, "mode": "dump"})
    recorded = []
    for step in range(2):
        dump.get_batch(global_step=step)
        recorded.append(training_side())
    dump.close()

    seed(12345)  # another seed: only the restored state can give the dump run's stream
    mock = MockScheduler(None, {**config, "mode": "mock"}, spec=Sampling)
    replayed = []
    for step in range(2):
        mock.get_batch(global_step=step)
        replayed.append(training_side())
    mock.close()
    assert (replayed == recorded) is replay_rng
    streams = {s.key for s in open_dump(tmp_path / "d").streams()}
    assert ("train/rng" in streams) is replay_rng


def test_default_leaves_other_schedulers_dumps_unchanged(tmp_path: Path) -> None:
    """``replay_rng: null`` (auto) is on for wrap_trl only: a scheduler's dump keeps its streams."""
    dump = MockScheduler(Sampling(), {"enable": True, "dump_dir": str(tmp_path / "d"), "mode": "dump"})
    dump.get_batch(global_step=0)
    dump.close()
    assert [s.key for s in open_dump(tmp_path / "d").streams()] == ["train"]


def test_rollouts_that_draw_nothing_record_no_state(tmp_path: Path) -> None:
    config = {"enable": True, "dump_dir": str(tmp_path / "d"), "replay_rng": True}
    dump = MockScheduler(Pure(), {**config, "mode": "dump"})
    dump.get_batch(global_step=0)
    dump.close()
    assert open_dump(tmp_path / "d").steps(StreamId("train", "rng")) == []

"""Replay policies: on_missing_step (error / repeat_nearest / record), subsample, step_offset/step_map."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rollout_mock import ConfigError, MockScheduler, StepNotFoundError, mock_class
from rollout_mock.wrap.replay import keep_rows, subsample_batch


class Sched:
    built = 0

    def __init__(self) -> None:
        Sched.built += 1
        self.calls: list[int] = []

    def get_batch(self, data: Any, global_step: int) -> Any:
        self.calls.append(global_step)
        return {"x": torch.arange(6) + 100 * global_step}


class AsyncSched:
    def __init__(self) -> None:
        self.calls: list[int] = []

    async def get_batch(self, data: Any, global_step: int) -> Any:
        self.calls.append(global_step)
        return {"x": torch.arange(6) + 100 * global_step}


def cfg(d: Path, mode: str = "mock", **extra: Any) -> dict[str, Any]:
    return {"enable": True, "mode": mode, "dump_dir": str(d), **extra}


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    d = tmp_path / "d"
    with MockScheduler(Sched(), cfg(d, "dump")) as s:
        for step in (0, 1, 2, 5):
            s.get_batch(None, step)
    return d


def value(batch: Any) -> int:
    return int(batch["x"][0]) // 100


def test_error_is_default_and_names_the_way_out(dump: Path) -> None:
    with MockScheduler(None, cfg(dump), spec=Sched) as s:
        with pytest.raises(StepNotFoundError) as info:
            s.get_batch(None, 3)
    assert "0-2, 5" in str(info.value) and "on_missing_step: repeat_nearest" in str(info.value)
    assert info.value.step == 3


def test_repeat_nearest_prefers_earlier(dump: Path, caplog: pytest.LogCaptureFixture) -> None:
    with MockScheduler(None, cfg(dump, on_missing_step="repeat_nearest"), spec=Sched) as s:
        assert [value(s.get_batch(None, step)) for step in (3, 4, 5, 9)] == [2, 2, 5, 5]
    assert "serves recorded step 2 instead" in caplog.text


def test_record_runs_the_factory_only_for_missing_steps(dump: Path) -> None:
    Sched.built = 0
    with MockScheduler(None, cfg(dump, on_missing_step="record"), factory=Sched, spec=Sched) as s:
        assert [value(s.get_batch(None, step)) for step in (0, 3, 4, 5)] == [0, 3, 4, 5]
        assert Sched.built == 1 and s.scheduler.calls == [3, 4]
    with MockScheduler(None, cfg(dump), spec=Sched) as s:  # now recorded for good
        assert value(s.get_batch(None, 3)) == 3


def test_record_without_scheduler_says_what_is_missing(dump: Path) -> None:
    with MockScheduler(None, cfg(dump, on_missing_step="record"), spec=Sched) as s:
        with pytest.raises(ConfigError, match="factory="):
            s.get_batch(None, 3)


def test_record_async_and_inside_mock_class(dump: Path, tmp_path: Path) -> None:
    adump = tmp_path / "async"
    with MockScheduler(AsyncSched(), cfg(adump, "dump")) as s:
        asyncio.run(s.get_batch(None, 0))
    with MockScheduler(None, cfg(adump, on_missing_step="record"), factory=AsyncSched, spec=AsyncSched) as s:
        assert value(asyncio.run(s.get_batch(None, 6))) == 6
        assert s.scheduler.calls == [6]
    Cls = mock_class(Sched, cfg(dump, on_missing_step="record"))
    Sched.built = 0
    inst = Cls()
    assert Sched.built == 0  # mock mode: __init__ not run ...
    assert value(inst.get_batch(None, 1)) == 1
    assert value(inst.get_batch(None, 7)) == 7 and Sched.built == 1  # ... until a step is missing
    assert inst.calls == [7]
    inst.rollout_mock_close()


def test_step_offset_and_map(dump: Path) -> None:
    with MockScheduler(None, cfg(dump, step_offset=-100, step_map={0: 5}), spec=Sched) as s:
        assert [value(s.get_batch(None, step)) for step in (0, 101, 102)] == [5, 1, 2]
        with pytest.raises(StepNotFoundError, match="run step 103 maps to dump step 3"):
            s.get_batch(None, 103)


def test_max_steps_preflight_follows_offset_and_policy(dump: Path) -> None:
    from rollout_mock.errors import IncompleteDumpError

    with pytest.raises(IncompleteDumpError):
        MockScheduler(None, cfg(dump, max_steps=4), spec=Sched)
    MockScheduler(None, cfg(dump, max_steps=3), spec=Sched).close()
    MockScheduler(None, cfg(dump, max_steps=4, on_missing_step="repeat_nearest"), spec=Sched).close()


def test_subsample_is_deterministic_like_slime(dump: Path) -> None:
    assert keep_rows(10, 0.5) == [0, 1, 7, 8, 9]  # first k//2, last k - k//2 (slime)
    assert keep_rows(3, 0.01) == [2] and keep_rows(4, 1.0) == [0, 1, 2, 3]
    with MockScheduler(None, cfg(dump, subsample=0.5), spec=Sched) as s:
        got = s.get_batch(None, 2)["x"].tolist()
    assert got == [200, 204, 205]  # 6 rows -> k=3: the first 1 and the last 2
    assert subsample_batch([1, None, 3, 4], 0.5) == [1, 4]


def test_subsample_roll_and_verl_shapes() -> None:
    from tensordict import TensorDict

    class RollLike:  # private storage, like ROLL's DataProto (its proxies are never touched)
        def __init__(self) -> None:
            self._batch = TensorDict({"a": torch.arange(4)}, batch_size=[4])
            self._non_tensor_batch = {"t": np.array(list("wxyz"), dtype=object)}
            self._remote_batch = None
            self.meta_info = {"k": 1}

        batch = property(lambda self: object())
        non_tensor_batch = property(lambda self: object())

        def __len__(self) -> int:
            return 4

    out = subsample_batch(RollLike(), 0.5)
    assert out._batch["a"].tolist() == [0, 3] and out._non_tensor_batch["t"].tolist() == ["w", "z"]
    verl = pytest.importorskip("verl.protocol")
    dp = verl.DataProto.from_dict({"a": torch.arange(4)}, {"t": np.array(list("wxyz"), dtype=object)})
    half = subsample_batch(dp, 0.5)
    assert half.batch["a"].tolist() == [0, 3] and half.non_tensor_batch["t"].tolist() == ["w", "z"]

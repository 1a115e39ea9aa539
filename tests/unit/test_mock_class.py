"""mock_class(): the class-level wrapper that runs the interception inside each instance.

These tests drive the wrapped class directly (no Ray cluster); tests/integration/
test_ray_scheduler.py runs the same classes as real Ray actors.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import HANG_S

from rollout_mock import ConfigError, LockedError, SchedulerUnavailableError, mock_class

DataProto = pytest.importorskip("verl.protocol").DataProto


def cfg(dump_dir: Path, mode: str, **extra: Any) -> dict[str, Any]:
    return {"enable": True, "mode": mode, "dump_dir": str(dump_dir), **extra}


def make_batch(step: int, batch_size: int, domain: str = "agentic") -> Any:
    generator = torch.Generator().manual_seed(step * 7919 + batch_size + len(domain))
    return DataProto.from_dict(
        tensors={"input_ids": torch.randint(0, 1000, (batch_size, 5), generator=generator)},
        non_tensors={"uid": np.array([f"{domain}-{step}-{i}" for i in range(batch_size)], dtype=object)},
        meta_info={"global_step": step},
    )


def assert_same_batch(actual: Any, expected: Any) -> None:
    assert torch.equal(actual.batch["input_ids"], expected.batch["input_ids"])
    assert actual.non_tensor_batch["uid"].tolist() == expected.non_tensor_batch["uid"].tolist()
    assert actual.meta_info == expected.meta_info


def data(step: int | None = None, **meta: Any) -> Any:
    return DataProto(meta_info=({} if step is None else {"global_step": step}) | meta)


class RolloutScheduler:
    """ROLL's agentic shape."""

    inits = 0

    def __init__(self, engines: int = 2) -> None:
        RolloutScheduler.inits += 1
        self.engines = [f"vllm-{i}" for i in range(engines)]
        self.calls = 0

    async def get_batch(self, data: Any, batch_size: int) -> Any:
        self.calls += 1
        return make_batch(data.meta_info["global_step"], batch_size)

    async def engine_count(self) -> int:
        return len(self.engines)

    async def shutdown(self) -> str:
        return "no engines to stop"


class DynamicSamplingScheduler:
    """ROLL's RLVR shape: the step is a positional parameter."""

    def __init__(self, domain: str) -> None:
        self.domain = domain

    async def get_batch(self, data: Any, global_step: int, batch_size: int) -> Any:
        return make_batch(global_step, batch_size, self.domain)


class SyncScheduler:
    def __init__(self) -> None:
        self.calls = 0

    def get_batch(self, data: Any, batch_size: int) -> Any:
        self.calls += 1
        return make_batch(data.meta_info["global_step"], batch_size)


@pytest.fixture(autouse=True)
def _reset_counter() -> None:
    RolloutScheduler.inits = 0


def test_agentic_dump_runs_init_and_mock_skips_it_with_exact_replay(tmp_path: Path) -> None:
    async def run() -> None:
        Dumping = mock_class(RolloutScheduler, cfg(tmp_path, "dump"))
        assert issubclass(Dumping, RolloutScheduler) and Dumping.__name__ == "RolloutScheduler"
        scheduler = Dumping(engines=3)
        recorded = [await scheduler.get_batch(data(step), 4) for step in range(3)]
        assert scheduler.calls == 3 and await scheduler.engine_count() == 3
        await scheduler.rollout_mock_close()
        assert RolloutScheduler.inits == 1

        Replaying = mock_class(RolloutScheduler, cfg(tmp_path, "mock"))
        mock = Replaying(engines=3)
        assert RolloutScheduler.inits == 1, "mock mode must not run __init__"
        for step in (2, 0, 1):
            assert_same_batch(await mock.get_batch(data(step), 4), recorded[step])
        assert (await mock.rollout_mock_info())["mode"] == "mock"
        # Methods that do not need __init__'s attributes still work...
        assert await mock.shutdown() == "no engines to stop"
        # ...those that do fail with an error that says why.
        with pytest.raises(SchedulerUnavailableError, match=r"RolloutScheduler\.engines .*__init__ is not run in mock mode"):
            await mock.engine_count()
        assert getattr(mock, "calls", "absent") == "absent"  # still an AttributeError
        assert not hasattr(mock, "__some_dunder__")
        await mock.rollout_mock_close()

    asyncio.run(run())


def test_rlvr_positional_and_keyword_global_step(tmp_path: Path) -> None:
    async def run() -> None:
        Dumping = mock_class(DynamicSamplingScheduler, cfg(tmp_path, "dump"), name="math")
        scheduler = Dumping("math")
        first = await scheduler.get_batch(data(), 3, 2)
        second = await scheduler.get_batch(data(), global_step=8, batch_size=2)
        await scheduler.rollout_mock_close()
        assert sorted(p.name for p in (tmp_path / "train" / "math").glob("step_*.pkl")) == [
            "step_000003.pkl",
            "step_000008.pkl",
        ]
        mock = mock_class(DynamicSamplingScheduler, cfg(tmp_path, "mock"), name="math")("ignored")
        assert_same_batch(await mock.get_batch(data(), 8, 2), second)
        assert_same_batch(await mock.get_batch(data(), global_step=3, batch_size=2), first)
        await mock.rollout_mock_close()

    asyncio.run(run())


class Gate:
    """Pickling blocks until released (stands for a huge batch) and notes the thread it ran on."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.released_in_time: bool | None = None
        self.thread: str | None = None

    def __reduce__(self) -> Any:
        if self.released_in_time is None:
            self.thread = threading.current_thread().name
            self.entered.set()
            self.released_in_time = self.release.wait(HANG_S)  # only a failing run waits this long
        return (str, ("gate",))


class GatedScheduler:
    def __init__(self) -> None:
        self.gate = Gate()

    async def get_batch(self, data: Any, batch_size: int) -> Any:
        batch = make_batch(data.meta_info["global_step"], batch_size)
        batch.meta_info["gate"] = self.gate
        return batch


@pytest.mark.parametrize("background", [True, False])
def test_async_recording_runs_off_the_event_loop(tmp_path: Path, background: bool) -> None:
    async def run() -> None:
        scheduler = mock_class(GatedScheduler, cfg(tmp_path, "dump", background=background))()
        gate = scheduler.gate
        call = asyncio.ensure_future(scheduler.get_batch(data(0), 16))
        # This coroutine only gets to run if the capture does not hold the event loop.
        while not gate.entered.is_set():
            await asyncio.sleep(0.005)
        assert gate.released_in_time is None and not call.done()
        gate.release.set()
        batch = await call
        assert gate.released_in_time is True
        assert gate.thread != threading.current_thread().name
        await scheduler.rollout_mock_close()
        assert batch.meta_info["gate"] is gate  # the caller keeps its own object

    asyncio.run(run())
    from rollout_mock.storage import load_step

    assert load_step(tmp_path / "train" / "step_000000.pkl").meta_info == {"global_step": 0, "gate": "gate"}


def test_close_flushes_pending_steps_and_releases_the_lock(tmp_path: Path) -> None:
    async def run() -> None:
        scheduler = mock_class(RolloutScheduler, cfg(tmp_path, "dump", max_pending=8))()
        for step in range(5):
            await scheduler.get_batch(data(step), 64)
        with pytest.raises(LockedError):
            mock_class(RolloutScheduler, cfg(tmp_path, "dump"))()
        await scheduler.rollout_mock_flush()
        assert len(list((tmp_path / "train").glob("step_*.pkl"))) == 5
        state = await scheduler.rollout_mock_state_dict()
        assert state["next_step"] == 5
        await scheduler.rollout_mock_close()
        await scheduler.rollout_mock_close()  # idempotent
        again = mock_class(RolloutScheduler, cfg(tmp_path, "dump", overwrite=True))()  # lock released
        await again.rollout_mock_load_state_dict(state)
        assert (await again.rollout_mock_info())["next_step"] == 5
        await again.rollout_mock_close()

    asyncio.run(run())


def test_sync_class_gets_sync_lifecycle_methods(tmp_path: Path) -> None:
    Dumping = mock_class(SyncScheduler, cfg(tmp_path, "dump"))
    assert not inspect.iscoroutinefunction(Dumping.rollout_mock_close)
    assert inspect.iscoroutinefunction(mock_class(RolloutScheduler, cfg(tmp_path / "b", "dump")).rollout_mock_close)
    scheduler = Dumping()
    batch = scheduler.get_batch(data(0), 3)
    scheduler.rollout_mock_close()
    mock = mock_class(SyncScheduler, cfg(tmp_path, "mock"))()
    assert_same_batch(mock.get_batch(data(0), 3), batch)
    assert mock.rollout_mock_info()["writes"] is False
    mock.rollout_mock_close()


def test_disabled_returns_the_class_itself_and_errors_are_clear(tmp_path: Path) -> None:
    assert mock_class(RolloutScheduler, {"enable": False}) is RolloutScheduler
    assert mock_class(RolloutScheduler, {"rollout_mock": {"enable": False}}) is RolloutScheduler
    with pytest.raises(ConfigError, match="has no method 'generate'"):
        mock_class(RolloutScheduler, cfg(tmp_path, "dump"), methods=("generate",))
    with pytest.raises(ConfigError, match="needs a class"):
        mock_class(RolloutScheduler(), cfg(tmp_path, "dump"))  # type: ignore[arg-type]


def test_non_writing_rank_does_not_touch_the_dump(tmp_path: Path) -> None:
    async def run() -> None:
        scheduler = mock_class(RolloutScheduler, cfg(tmp_path / "d", "dump"), rank=1)()
        await scheduler.get_batch(data(0), 2)
        info = await scheduler.rollout_mock_info()
        await scheduler.rollout_mock_close()
        assert info["writes"] is False and scheduler.calls == 1

    asyncio.run(run())
    assert not (tmp_path / "d").exists()


def test_mock_class_of_a_ray_actor_class_keeps_it_an_actor_class(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    RemoteScheduler = ray.remote(num_cpus=0, max_restarts=1)(RolloutScheduler)
    wrapped = mock_class(RemoteScheduler, cfg(tmp_path, "mock"))  # no cluster needed to build it
    assert type(wrapped).__name__.startswith("ActorClass")
    inner = wrapped.__ray_actor_class__
    assert inner.__rollout_mock_wrapped__ is RolloutScheduler and issubclass(inner, RolloutScheduler)
    assert wrapped._default_options["num_cpus"] == 0 and wrapped._default_options["max_restarts"] == 1

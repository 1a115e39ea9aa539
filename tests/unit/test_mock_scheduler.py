"""MockScheduler behaviour on sync and async schedulers, against real files in tmp_path."""

from __future__ import annotations

import asyncio
import logging
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cfg

from rollout_mock import (
    ConfigError,
    DumpNotFoundError,
    IncompleteDumpError,
    MockScheduler,
    ReplayMismatchError,
    SchedulerUnavailableError,
    StepExistsError,
    StepNotFoundError,
    load_step,
)


class RlvrScheduler:
    """RLVR shape: the step is an explicit argument."""

    def __init__(self) -> None:
        self.calls = 0
        self.generator = torch.Generator().manual_seed(torch.seed())

    def get_batch(self, data: Any, global_step: int, batch_size: int) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"x": torch.randn(batch_size, 3, generator=self.generator), "step": torch.tensor(global_step)}

    def describe(self) -> str:
        return "real scheduler"


class Request:
    def __init__(self, step: int) -> None:
        self.meta_info = {"global_step": step}


class AgenticScheduler:
    """ROLL agentic shape: async, the step in data.meta_info."""

    async def get_batch(self, data: Request, batch_size: int) -> dict[str, torch.Tensor]:
        await asyncio.sleep(0)
        return {"y": torch.rand(batch_size), "step": torch.tensor(data.meta_info["global_step"])}


class CounterScheduler:
    """AReaL shape: no step in the call at all."""

    def __init__(self) -> None:
        self.n = 0

    def rollout_batch(self, data: Any) -> list[dict[str, torch.Tensor] | None]:
        self.n += 1
        return [{"n": torch.tensor(self.n)}, None]


def test_dump_then_mock_sync_roundtrip(dump_dir: Path) -> None:
    real = RlvrScheduler()
    with MockScheduler(real, cfg(dump_dir)) as mock:
        recorded = [mock.get_batch(None, step, 4) for step in range(3)]
        assert mock.describe() == "real scheduler"  # pass-through
    assert real.calls == 3
    assert sorted(p.name for p in (dump_dir / "train").glob("step_*.pkl")) == [
        "step_000000.pkl", "step_000001.pkl", "step_000002.pkl"]
    with MockScheduler(None, cfg(dump_dir, "mock"), spec=RlvrScheduler) as mock:
        for step in (0, 1, 2):
            batch = mock.get_batch(None, step, 4)
            assert torch.equal(batch["x"], recorded[step]["x"])
    # positional and keyword step both work
    with MockScheduler(None, cfg(dump_dir, "mock")) as mock:
        assert int(mock.get_batch(None, global_step=2, batch_size=4)["step"]) == 2
        assert int(mock.get_batch(None, 1, 4)["step"]) == 1


def test_step_files_are_standard_pickles(dump_dir: Path) -> None:
    with MockScheduler(RlvrScheduler(), cfg(dump_dir)) as mock:
        batch = mock.get_batch(None, 0, 2)
    with open(dump_dir / "train" / "step_000000.pkl", "rb") as file:
        loaded = pickle.load(file)
    assert torch.equal(loaded["x"], batch["x"])
    assert torch.equal(load_step(dump_dir / "train" / "step_000000.pkl")["x"], batch["x"])


def test_async_scheduler_roundtrip(dump_dir: Path) -> None:
    async def scenario() -> None:
        with MockScheduler(AgenticScheduler(), cfg(dump_dir), split="val") as mock:
            call = mock.get_batch(Request(5), 3)
            assert asyncio.iscoroutine(call)
            recorded = await call
        with MockScheduler(None, cfg(dump_dir, "mock"), split="val") as mock:
            call = mock.get_batch(Request(5), 3)
            assert asyncio.iscoroutine(call)  # the convention recorded in the manifest
            replayed = await call
        assert torch.equal(replayed["y"], recorded["y"])

    asyncio.run(scenario())
    assert (dump_dir / "val" / "step_000005.pkl").is_file()


def test_counter_and_state_dict_resume(dump_dir: Path) -> None:
    with MockScheduler(CounterScheduler(), cfg(dump_dir), methods=("rollout_batch",)) as mock:
        for _ in range(4):
            mock.rollout_batch(None)
        assert mock.step == 4
    with MockScheduler(None, cfg(dump_dir, "mock"), methods=("rollout_batch",)) as mock:
        assert int(mock.rollout_batch(None)[0]["n"]) == 1
        state = mock.state_dict()
    # a run resumed from a checkpoint replays the next step, not step 0
    with MockScheduler(None, cfg(dump_dir, "mock"), methods=("rollout_batch",)) as mock:
        mock.load_state_dict(state)
        assert int(mock.rollout_batch(None)[0]["n"]) == 2
        mock.step = 3
        batch = mock.rollout_batch(None)
        assert int(batch[0]["n"]) == 4 and batch[1] is None


def test_disabled_is_pure_pass_through(dump_dir: Path) -> None:
    real = RlvrScheduler()
    mock = MockScheduler(real, {"enable": False, "dump_dir": str(dump_dir)})
    assert mock.get_batch == real.get_batch  # the real bound method, not a wrapper
    mock.get_batch(None, 0, 2)
    assert not dump_dir.exists()
    built: list[int] = []
    MockScheduler(None, {"enable": False}, factory=lambda: built.append(1) or RlvrScheduler())
    assert built == [1]


def test_factory_never_called_in_mock_mode(dump_dir: Path) -> None:
    built: list[int] = []

    def factory() -> RlvrScheduler:
        built.append(1)
        return RlvrScheduler()

    with MockScheduler(None, cfg(dump_dir), factory=factory) as mock:
        mock.get_batch(None, 0, 2)
    assert built == [1]
    with MockScheduler(None, cfg(dump_dir, "mock"), factory=factory, spec=RlvrScheduler) as mock:
        mock.get_batch(None, 0, 2)
        with pytest.raises(SchedulerUnavailableError, match="'describe' is not available in mock mode"):
            mock.describe()
    assert built == [1]


def test_dump_without_scheduler_is_an_error(dump_dir: Path) -> None:
    with pytest.raises(ConfigError, match="needs the real scheduler"):
        MockScheduler(None, cfg(dump_dir))


def test_missing_step_error_lists_ranges_and_reasons(dump_dir: Path) -> None:
    with MockScheduler(RlvrScheduler(), cfg(dump_dir)) as mock:
        for step in (0, 1, 2, 5, 7, 8):
            mock.get_batch(None, step, 1)
    with MockScheduler(None, cfg(dump_dir, "mock", prefetch=False)) as mock, \
            pytest.raises(StepNotFoundError) as info:
        mock.get_batch(None, 4, 1)
    error = info.value
    assert isinstance(error, FileNotFoundError)
    message = str(error)
    assert "Mock file not found" in message and "step_000004.pkl" in message
    assert "Recorded steps for train: 0-2, 5, 7-8" in message
    assert "dump_dir is incorrect" in message and "mode mismatch (current: train)" in message
    assert (error.mode, error.split, error.step) == ("mock", "train", 4)


def test_preflight_checks_before_the_run(dump_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(DumpNotFoundError, match="dump directory not found"):
        MockScheduler(None, cfg(tmp_path / "nowhere", "mock"), spec=RlvrScheduler)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DumpNotFoundError, match="no manifest.json"):
        MockScheduler(None, cfg(tmp_path / "empty", "mock"), spec=RlvrScheduler)
    with MockScheduler(RlvrScheduler(), cfg(dump_dir)) as mock:
        for step in (0, 1, 3):
            mock.get_batch(None, step, 1)
    with pytest.raises(IncompleteDumpError) as info:
        MockScheduler(None, cfg(dump_dir, "mock", max_steps=5), spec=RlvrScheduler)
    assert "lacks steps 2, 4" in str(info.value) and "recorded: 0-1, 3" in str(info.value)
    MockScheduler(None, cfg(dump_dir, "mock", max_steps=2), spec=RlvrScheduler).close()


def test_overwrite_refused_before_the_rollout_runs(dump_dir: Path) -> None:
    with MockScheduler(RlvrScheduler(), cfg(dump_dir)) as mock:
        mock.get_batch(None, 0, 1)
    real = RlvrScheduler()
    with MockScheduler(real, cfg(dump_dir)) as mock, pytest.raises(StepExistsError) as info:
        mock.get_batch(None, 0, 1)
    assert real.calls == 0  # no expensive rollout was wasted
    message = str(info.value)
    assert "step_000000.pkl" in message and "overwrite: true" in message and "new directory" in message
    with MockScheduler(real, cfg(dump_dir, overwrite=True)) as mock:
        new = mock.get_batch(None, 0, 1)
    assert torch.equal(load_step(dump_dir / "train" / "step_000000.pkl")["x"], new["x"])


def test_corrupted_file_is_detected(dump_dir: Path) -> None:
    with MockScheduler(RlvrScheduler(), cfg(dump_dir)) as mock:
        mock.get_batch(None, 0, 64)
    path = dump_dir / "train" / "step_000000.pkl"
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF  # inside the tensor payload: still unpickles, silently wrong values
    path.write_bytes(bytes(data))
    from rollout_mock.errors import CorruptStepError

    with MockScheduler(None, cfg(dump_dir, "mock"), spec=RlvrScheduler) as mock, \
            pytest.raises(CorruptStepError) as info:
        mock.get_batch(None, 0, 64)
    assert str(path) in str(info.value) and "step 0" in str(info.value) and "checksum" in str(info.value)
    with pytest.raises(CorruptStepError):
        load_step(path)


def test_dump_steps_records_only_those(dump_dir: Path) -> None:
    with MockScheduler(RlvrScheduler(), cfg(dump_dir, dump_steps=[1, 3])) as mock:
        for step in range(5):
            mock.get_batch(None, step, 1)
    assert sorted(p.name for p in (dump_dir / "train").glob("step_*.pkl")) == ["step_000001.pkl", "step_000003.pkl"]


def test_roll_log_lines(dump_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rollout_mock")
    with MockScheduler(RlvrScheduler(), cfg(dump_dir, background=False)) as mock:
        mock.get_batch(None, 0, 8)
    with MockScheduler(None, cfg(dump_dir, "mock"), spec=RlvrScheduler) as mock:
        mock.get_batch(None, 0, 8)
    text = caplog.text
    assert f"[RolloutMock] Rollout Mock enabled: mode=dump, dir={dump_dir}" in text
    assert f"[RolloutMock] Dumped step 0: {dump_dir}/train/step_000000.pkl (samples=8, size=0.00MB)" in text
    assert f"[RolloutMock] Loaded step 0: {dump_dir}/train/step_000000.pkl (samples=8)" in text


def test_mutating_the_batch_after_the_call_does_not_change_the_recording(dump_dir: Path) -> None:
    with MockScheduler(RlvrScheduler(), cfg(dump_dir, background=True)) as mock:
        batch = mock.get_batch(None, 0, 16)
        original = batch["x"].clone()
        batch["x"].zero_()  # the pipeline reuses the buffer right away
    assert torch.equal(load_step(dump_dir / "train" / "step_000000.pkl")["x"], original)


def test_unknown_method_is_a_config_error(dump_dir: Path) -> None:
    with pytest.raises(ConfigError, match="has no method 'generate_sequences'"):
        MockScheduler(RlvrScheduler(), cfg(dump_dir), methods=("generate_sequences",))


def test_mock_refuses_a_call_that_differs_from_the_recorded_one(dump_dir: Path) -> None:
    with MockScheduler(RlvrScheduler(), cfg(dump_dir)) as mock:
        for step in range(3):
            mock.get_batch(None, step, batch_size=4)
    with MockScheduler(None, cfg(dump_dir, "mock"), spec=RlvrScheduler) as mock:
        mock.get_batch(None, 0, batch_size=4)
        with pytest.raises(ReplayMismatchError) as info:
            mock.get_batch(None, 1, batch_size=8)
    assert info.value.step == 1 and info.value.argument == "batch_size"
    assert "batch_size: 4 in the dump run, 8 now" in str(info.value)
    import json

    entry = json.loads((dump_dir / "manifest.json").read_text())["streams"]["train"]["steps"]["2"]
    assert entry["call"]["args"] == [None, 2] and entry["call"]["kwargs"] == {"batch_size": 4}
    assert entry["call"]["request"]["a"] == ["batch_size", "data"]  # the step is not part of the request


def test_mock_warns_once_per_method_with_on_mismatch_warn(dump_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with MockScheduler(RlvrScheduler(), cfg(dump_dir)) as mock:
        for step in range(3):
            mock.get_batch(None, step, batch_size=4)
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    with MockScheduler(None, cfg(dump_dir, "mock", on_mismatch="warn"), spec=RlvrScheduler) as mock:
        mock.get_batch(None, 0, batch_size=4)
        assert "asks for other data" not in caplog.text
        for step in (1, 2):
            assert mock.get_batch(None, step, batch_size=8)["x"].shape[0] == 4
    warnings = [r.getMessage() for r in caplog.records if "asks for other data" in r.getMessage()]
    assert len(warnings) == 1  # once per method, not once per step
    assert "batch_size: 4 in the dump run, 8 now" in warnings[0] and "step 1" in warnings[0]


def test_a_dump_that_records_nothing_is_reported(dump_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    real = RlvrScheduler()
    with MockScheduler(real, cfg(dump_dir)):
        real.get_batch(None, 0, 2)  # the pipeline bypassed the wrapper
    assert "closed without recording any step of train" in caplog.text
    caplog.clear()
    with MockScheduler(RlvrScheduler(), cfg(dump_dir, dump_steps=[5])) as mock:
        mock.get_batch(None, 0, 2)
    assert "closed without recording any step" in caplog.text and "get_batch" in caplog.text
    caplog.clear()
    with MockScheduler(RlvrScheduler(), cfg(dump_dir, overwrite=True)) as mock:
        mock.get_batch(None, 0, 2)
    assert "closed without recording" not in caplog.text


def test_slime_rollout_function_in_a_module(dump_dir: Path) -> None:
    """slime's rollout is a module-level function ``generate_rollout(args, rollout_id, data_source)``:
    wrapping the module intercepts it, with the step taken from ``rollout_id``."""
    import types

    def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> list[dict[str, Any]]:
        return [{"tokens": torch.randint(0, 50, (6,)), "rollout_id": rollout_id}]

    module = types.ModuleType("my_rollout")
    module.generate_rollout = generate_rollout  # type: ignore[attr-defined]
    with MockScheduler(module, cfg(dump_dir), methods=("generate_rollout",)) as rollout:
        recorded = [rollout.generate_rollout(None, rid, None) for rid in (4, 5)]
    assert sorted(p.name for p in (dump_dir / "train").glob("step_*.pkl")) == ["step_000004.pkl", "step_000005.pkl"]
    with MockScheduler(None, cfg(dump_dir, "mock"), methods=("generate_rollout",)) as rollout:
        replayed = rollout.generate_rollout(None, 5, None)
    assert torch.equal(replayed[0]["tokens"], recorded[1][0]["tokens"]) and replayed[0]["rollout_id"] == 5


def test_retention_keeps_newest_and_pinned_steps(dump_dir: Path) -> None:
    with MockScheduler(RlvrScheduler(), cfg(dump_dir, max_keep=2, pin_steps=[0])) as mock:
        for step in range(6):
            mock.get_batch(None, step, 1)
    files = sorted(p.name for p in (dump_dir / "train").glob("step_*.pkl"))
    assert files == ["step_000000.pkl", "step_000004.pkl", "step_000005.pkl"]
    from rollout_mock.storage import open_dump

    dump = open_dump(dump_dir)
    assert dump.steps(dump.streams()[0]) == [0, 4, 5]  # the manifest agrees with the files
    with MockScheduler(None, cfg(dump_dir, "mock"), spec=RlvrScheduler) as mock:
        assert int(mock.get_batch(None, 4, 1)["step"]) == 4
        with pytest.raises(StepNotFoundError, match="Recorded steps for train: 0, 4-5"):
            mock.get_batch(None, 2, 1)


def test_mock_mode_on_a_missing_split_names_it_and_the_splits_present(dump_dir: Path) -> None:
    with MockScheduler(RlvrScheduler(), cfg(dump_dir)) as mock:
        mock.get_batch(None, 0, 2)
    with pytest.raises(StepNotFoundError) as caught:  # also a ConfigError (the wrong split)
        MockScheduler(None, cfg(dump_dir, "mock"), split="val")
    assert isinstance(caught.value, ConfigError)
    message = str(caught.value)
    assert "has no 'val' split (splits recorded: train;" in message
    assert "call" not in message.split("(splits")[0]  # not the old "does not record how ... is called"
    assert caught.value.split == "val"


def test_an_exception_in_the_with_block_is_not_hidden_by_the_nothing_recorded_warning(
    dump_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    with pytest.raises(RuntimeError, match="the real scheduler crashed"), MockScheduler(RlvrScheduler(), cfg(dump_dir)):
        raise RuntimeError("the real scheduler crashed")
    assert not any("without recording any step" in r.getMessage() for r in caplog.records)
    # the warning itself still exists for a block that ends normally having recorded nothing
    with MockScheduler(RlvrScheduler(), cfg(dump_dir, overwrite=True)):
        pass
    assert any("without recording any step" in r.getMessage() for r in caplog.records)


def test_registered_scheduler_hooks_see_the_real_scheduler_in_dump_mode_only(dump_dir: Path) -> None:
    from rollout_mock.adapters.frameworks import prepare_roll_scheduler
    from rollout_mock.wrap import hooks

    seen: list[Any] = []
    hooks.register_scheduler_hook(seen.append)
    try:
        assert prepare_roll_scheduler in hooks.scheduler_hooks()  # registered by `import rollout_mock`
        real = RlvrScheduler()
        with MockScheduler(real, cfg(dump_dir)) as mock:
            mock.get_batch(None, 0, 2)
        assert seen == [real]
        with MockScheduler(None, cfg(dump_dir, "mock")) as mock:
            mock.get_batch(None, 0, 2)
        assert seen == [real]
    finally:
        hooks._HOOKS.remove(seen.append)

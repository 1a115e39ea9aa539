"""The config is resolved once, at the edge: each component behind a wrapped scheduler holds its
part (a frozen dataclass), never the whole ``rollout_mock:`` block."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import cfg
from pydantic import BaseModel

from rollout_mock import MockScheduler, RolloutMockConfig, load_config
from rollout_mock.config import (
    KeepConfig,
    StreamSettings,
    VerdictAction,
    VerdictConfig,
    WatchdogConfig,
    WatchdogSettings,
    config_parts,
)


class Source:
    def get_batch(self, global_step: int) -> dict[str, Any]:
        return {"step": global_step, "values": [global_step] * 3}


def _held(root: Any, name: str) -> Iterator[tuple[str, Any]]:
    """Every value reachable from ``root`` through the attributes of rollout_mock objects (and
    the lists, tuples, sets and dicts they hold), with its attribute path."""
    seen: set[int] = set()
    todo = [(name, root)]
    while todo:
        path, value = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        yield path, value
        if isinstance(value, dict):
            todo += [(f"{path}[{key!r}]", item) for key, item in value.items()]
        elif isinstance(value, list | tuple | set | frozenset):
            todo += [(f"{path}[{i}]", item) for i, item in enumerate(value)]
        elif type(value).__module__.startswith("rollout_mock.") and hasattr(value, "__dict__"):
            todo += [(f"{path}.{key}", item) for key, item in vars(value).items()]


def _blocks(config: RolloutMockConfig) -> set[type]:
    """The types of the config's nested blocks (pydantic models held by its fields)."""
    values = [getattr(config, name) for name in type(config).model_fields]
    return {type(v) for v in values if isinstance(v, BaseModel)} | {WatchdogConfig, KeepConfig, VerdictConfig}


@pytest.mark.parametrize("mode", ["dump", "mock", "check"])
def test_no_component_behind_a_scheduler_holds_the_whole_config(tmp_path: Path, mode: str) -> None:
    if mode != "dump":
        with MockScheduler(Source(), cfg(tmp_path)) as recording:
            recording.get_batch(global_step=0)
    with MockScheduler(Source(), cfg(tmp_path, mode)) as wrapped:
        assert wrapped.get_batch(global_step=0)["values"] == [0, 0, 0]
        assert isinstance(wrapped.config, RolloutMockConfig)  # the edge keeps it (``expected=`` reads it)
        holders = [path for path, value in _held(wrapped.interceptor, "interceptor")
                   if isinstance(value, RolloutMockConfig)]
        assert holders == []
        # nor a block of it (``watchdog``, ``keep``, ``verdict``, ...): each gets its own dataclass
        blocks = _blocks(wrapped.config)
        holders = [f"{path}: {type(value).__name__}" for path, value in _held(wrapped.interceptor, "interceptor")
                   if type(value) in blocks]
        assert holders == []
        # and each part is there, in its component
        assert wrapped.interceptor.recorder is not None or wrapped.interceptor.replayer is not None


def test_the_stream_part_says_which_rank_writes() -> None:
    one = config_parts(load_config({"enable": True, "dump_dir": "/x", "name": "actor", "dump_rank": 2}))
    assert one.stream == StreamSettings(name="actor", per_rank=False, dump_rank=2)
    assert [one.stream.writes(rank) for rank in (None, 0, 2)] == [True, False, True]
    every = config_parts(load_config({"enable": True, "dump_dir": "/x", "ranks": "all"})).stream
    assert every.per_rank and every.writes(0) and every.writes(5)


def test_the_verdict_part_is_the_verdict_action() -> None:
    parts = config_parts(load_config({"enable": True, "dump_dir": "/x", "verdict": {"action": "off"}}))
    assert parts.verdict is VerdictAction.OFF


def test_an_intercepted_method_is_made_once(tmp_path: Path) -> None:
    with MockScheduler(Source(), cfg(tmp_path)) as wrapped:
        method = wrapped.get_batch
        assert wrapped.get_batch is method and method.__name__ == "get_batch"


def test_the_watchdog_part_is_its_limits_and_none_when_disabled() -> None:
    parts = config_parts(load_config({"enable": True, "dump_dir": "/x", "watchdog": {"factor": 5, "history": 3}}))
    assert parts.watchdog == WatchdogSettings(factor=5.0, min_seconds=60.0, absolute_seconds=3600.0, history=3)
    assert config_parts(load_config({"enable": True, "dump_dir": "/x", "watchdog": False})).watchdog is None


def test_the_pre_flight_check_takes_its_parts_not_the_config(tmp_path: Path) -> None:
    """ROLL's pre-flight check (``check_dump_settings``) is handed the store and matching parts."""
    from rollout_mock import RolloutSettingsMismatchError
    from rollout_mock.wrap.mismatch import check_dump_settings

    with MockScheduler(Source(), cfg(tmp_path), rollout_settings={"temperature": 1.0}) as recording:
        recording.get_batch(global_step=0)
    parts = config_parts(load_config(cfg(tmp_path, "mock")))
    check_dump_settings(parts.store, parts.match, {"temperature": 1.0}, mode=parts.mode)  # the same: passes
    with pytest.raises(RolloutSettingsMismatchError, match="temperature: 1.0 in the dump run, 0.5 now") as info:
        check_dump_settings(parts.store, parts.match, {"temperature": 0.5}, mode=parts.mode)
    assert info.value.mode == "mock" and info.value.path == str(tmp_path)
    dumping = config_parts(load_config(cfg(tmp_path)))
    check_dump_settings(dumping.store, dumping.match, {"temperature": 0.5}, mode=dumping.mode)  # dump mode: nothing


def test_a_replay_announces_the_dump_runs_metrics_from_its_store(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """``describe_expected(store, verdict)``: the store says where the metrics are, the verdict part
    whether they are compared; no line without them."""
    import logging

    with MockScheduler(Source(), cfg(tmp_path)) as recording:
        recording.get_batch(global_step=0)

    def notes(**extra: Any) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="rollout_mock"):
            MockScheduler(None, cfg(tmp_path, "mock", **extra), spec=Source).close()
        return [r.getMessage() for r in caplog.records if "the dump run's metrics" in r.getMessage()]

    assert notes() == []
    metrics = tmp_path / "expected" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text('{"step": 0, "loss": 1.0}\n')
    assert notes() == [f"[RolloutMock] {metrics} holds the dump run's metrics; verdict=warn: metrics logged "
                       f"through MetricsWriter(..., expected=<scheduler>) are compared as they are logged"]
    assert notes(verdict={"action": "off"}) == [
        f"[RolloutMock] {metrics} holds the dump run's metrics (verdict: off, not compared)"]

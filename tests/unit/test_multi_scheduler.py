"""Several schedulers on one dump directory (ROLL's per-domain RLVR schedulers), and the rank
options, in one process. Ray and torch.distributed versions: tests/integration/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rollout_mock import LockedError, MockScheduler, StepNotFoundError, load_step
from rollout_mock.wrap.calls import step_arg_position
from rollout_mock.wrap.scheduler import _spec_methods


def cfg(dump_dir: Path, mode: str, **extra: Any) -> dict[str, Any]:
    return {"enable": True, "mode": mode, "dump_dir": str(dump_dir), **extra}


class DomainScheduler:
    """RLVR shape (sync here): the batch depends on the domain."""

    def __init__(self, domain: str) -> None:
        self.domain = domain
        self.calls = 0

    def get_batch(self, data: Any, global_step: int, batch_size: int) -> dict[str, Any]:
        self.calls += 1
        offset = 1000 if self.domain == "code" else 0
        return {
            "domain": self.domain,
            "input_ids": torch.arange(batch_size * 4).reshape(batch_size, 4) + offset + global_step,
        }


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["domain"] == b["domain"] and torch.equal(a["input_ids"], b["input_ids"])


def test_two_named_schedulers_share_dump_dir_and_split_without_overwriting(tmp_path: Path) -> None:
    # One named by the config block, one by the constructor argument.
    math = MockScheduler(DomainScheduler("math"), cfg(tmp_path, "dump", name="math"))
    code = MockScheduler(DomainScheduler("code"), cfg(tmp_path, "dump"), name="code")
    recorded = {"math": [], "code": []}
    for step in range(3):
        recorded["math"].append(math.get_batch(None, step, 2))
        recorded["code"].append(code.get_batch(None, step, 2))
    math.close()
    code.close()

    for domain in ("math", "code"):
        names = sorted(p.name for p in (tmp_path / "train" / domain).glob("step_*.pkl"))
        assert names == ["step_000000.pkl", "step_000001.pkl", "step_000002.pkl"]
        for step in range(3):
            assert same(load_step(tmp_path / "train" / domain / f"step_{step:06d}.pkl"), recorded[domain][step])
    assert not list((tmp_path / "train").glob("step_*.pkl"))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert sorted(manifest["streams"]) == ["train/code", "train/math"]
    assert manifest["streams"]["train/math"]["name"] == "math"

    # Replay: each gets its own batches, in any order, without the real schedulers.
    replay = {d: MockScheduler(None, cfg(tmp_path, "mock"), name=d) for d in ("code", "math")}
    for step in (2, 0, 1):
        for domain, scheduler in replay.items():
            batch = scheduler.get_batch(None, step, 2)
            assert same(batch, recorded[domain][step])
    assert not same(replay["math"].get_batch(None, 0, 2), recorded["code"][0])
    for scheduler in replay.values():
        scheduler.close()


def test_second_unnamed_writer_is_refused_with_a_hint_to_set_name(tmp_path: Path) -> None:
    first = MockScheduler(DomainScheduler("math"), cfg(tmp_path, "dump"))
    with pytest.raises(LockedError, match=r"distinct `name`") as caught:
        MockScheduler(DomainScheduler("code"), cfg(tmp_path, "dump"))
    assert caught.value.mode == "dump" and caught.value.split == "train"
    assert str(tmp_path) in str(caught.value)
    # The same name twice is the same collision.
    named = MockScheduler(DomainScheduler("math"), cfg(tmp_path, "dump"), name="math")
    with pytest.raises(LockedError):
        MockScheduler(DomainScheduler("math"), cfg(tmp_path, "dump"), name="math")
    # Other splits and names are independent; a closed writer releases its stream.
    MockScheduler(DomainScheduler("code"), cfg(tmp_path, "dump"), split="val").close()
    first.get_batch(None, 0, 1)
    first.close()
    MockScheduler(DomainScheduler("code"), cfg(tmp_path, "dump", overwrite=True)).close()
    named.close()


def test_mock_mode_with_a_wrong_name_says_so(tmp_path: Path) -> None:
    with MockScheduler(DomainScheduler("math"), cfg(tmp_path, "dump"), name="math") as math:
        math.get_batch(None, 0, 1)
    with MockScheduler(None, cfg(tmp_path, "mock"), name="maths", spec=DomainScheduler) as wrong:
        with pytest.raises(StepNotFoundError, match=r"named 'maths'"):
            wrong.get_batch(None, 0, 1)


def test_non_writing_rank_in_dump_mode_touches_nothing(tmp_path: Path) -> None:
    dump_dir = tmp_path / "dumps"
    inner = DomainScheduler("math")
    with MockScheduler(inner, cfg(dump_dir, "dump"), rank=1) as scheduler:
        assert scheduler.interceptor is not None and not scheduler.interceptor.writes
        batch = scheduler.get_batch(None, 0, 2)
    assert inner.calls == 1 and batch["domain"] == "math"
    assert not dump_dir.exists()  # no lock file, no manifest, no directory
    with MockScheduler(inner, cfg(dump_dir, "dump", dump_rank=1), rank=1) as writer:
        assert writer.interceptor is not None and writer.interceptor.writes
        writer.get_batch(None, 0, 2)
    assert (dump_dir / "train" / "step_000000.pkl").exists()
    # Every rank replays the one file.
    for rank in (0, 1, 3):
        with MockScheduler(None, cfg(dump_dir, "mock"), rank=rank, spec=DomainScheduler) as mock:
            assert same(mock.get_batch(None, 0, 2), batch)


def test_ranks_all_writes_and_replays_one_file_per_rank(tmp_path: Path) -> None:
    recorded = {}
    for rank in (0, 1):
        inner = DomainScheduler("math" if rank == 0 else "code")  # per-DP-head batches differ
        with MockScheduler(inner, cfg(tmp_path, "dump", ranks="all"), rank=rank) as scheduler:
            recorded[rank] = scheduler.get_batch(None, 4, 2)
    assert sorted(p.name for p in (tmp_path / "train").glob("step_*.pkl")) == [
        "step_000004_rank0.pkl",
        "step_000004_rank1.pkl",
    ]
    for rank in (1, 0):
        with MockScheduler(None, cfg(tmp_path, "mock", ranks="all"), rank=rank, spec=DomainScheduler) as mock:
            assert same(mock.get_batch(None, 4, 2), recorded[rank])
    with MockScheduler(None, cfg(tmp_path, "mock", ranks="all"), rank=2, spec=DomainScheduler) as extra:
        with pytest.raises(StepNotFoundError, match=r"rank2"):
            extra.get_batch(None, 4, 2)


class FakeActorMethod:
    """What a Ray 2.x ActorMethod exposes: ``remote`` and ``_signature`` (no function)."""

    def __init__(self, parameters: list[Any]) -> None:
        self._signature = parameters

    def remote(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - never called
        raise AssertionError


FakeActorMethod.__name__ = "ActorMethod"


def test_step_position_of_ray_actor_methods_and_specs(tmp_path: Path) -> None:
    import inspect

    P = inspect.Parameter
    rlvr = FakeActorMethod([P("data", P.POSITIONAL_OR_KEYWORD), P("global_step", P.POSITIONAL_OR_KEYWORD),
                            P("batch_size", P.POSITIONAL_OR_KEYWORD), P("_ray_trace_ctx", P.KEYWORD_ONLY, default=None)])
    agentic = FakeActorMethod([P("data", P.POSITIONAL_OR_KEYWORD), P("batch_size", P.POSITIONAL_OR_KEYWORD)])
    assert step_arg_position(rlvr, bound=True) == 1
    assert step_arg_position(agentic, bound=True) is None
    # A plain class as spec: its global_step position; the convention the dump recorded wins.
    info = _spec_methods(DomainScheduler, ["get_batch"], {"get_batch": {"convention": "ray", "step_arg": 1}})
    assert info == {"get_batch": {"convention": "ray", "step_arg": 1, "params": ["data", "global_step", "batch_size"]}}
    assert _spec_methods(DomainScheduler, ["get_batch"])["get_batch"]["convention"] == "sync"
    ray = pytest.importorskip("ray")
    remote_info = _spec_methods(ray.remote(DomainScheduler), ["get_batch"], {"get_batch": {"convention": "sync"}})
    assert remote_info == {"get_batch": {"convention": "ray", "step_arg": 1,
                                         "params": ["data", "global_step", "batch_size"]}}

"""ROLL-shaped schedulers as Ray actors, on a real local Ray cluster (one per module).

Both ways of putting rollout_mock around a Ray scheduler:

* inside the actor: ``ray.remote(mock_class(RolloutScheduler, cfg))``;
* around the handle, on the driver: ``MockScheduler(handle_or_factory, cfg)``.

For ROLL's agentic shape (``async def get_batch(self, data, batch_size)``, the step in
``data.meta_info["global_step"]``) and its RLVR shape (``async def get_batch(self, data,
global_step, batch_size)``, one scheduler per domain, results joined with ``DataProto.concat``),
with real verl ``DataProto`` batches.
"""

from __future__ import annotations

import asyncio
import glob
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import HANG_S, local_ray_cluster, wait_until

ray = pytest.importorskip("ray")
verl_protocol = pytest.importorskip("verl.protocol")
DataProto = verl_protocol.DataProto

from rollout_mock import LockedError, MockScheduler, load_step, mock_class, open_dump
from rollout_mock.determinism import (
    FINGERPRINT_ENV_VARS,
    PROFILE_VAR,
    PROFILES,
    SEED_VAR,
    ray_runtime_env,
)

pytestmark = pytest.mark.ray



# ---------------------------------------------------------------------------------------------
# ROLL-shaped fakes (shipped to the workers by value: they cannot import this module by name)
# ---------------------------------------------------------------------------------------------


def make_batch(step: int, batch_size: int, domain: str = "agentic") -> Any:
    """A deterministic DataProto that depends on step, size and domain."""
    seed = step * 1000 + batch_size + sum(map(ord, domain))
    generator = torch.Generator().manual_seed(seed)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.randint(0, 32000, (batch_size, 16), generator=generator),
            "scores": torch.rand(batch_size, generator=generator),
        },
        non_tensors={"uid": np.array([f"{domain}-{step}-{i}" for i in range(batch_size)], dtype=object)},
        meta_info={"global_step": step},
    )


def assert_same_batch(actual: Any, expected: Any) -> None:
    assert type(actual) is type(expected)
    assert sorted(actual.batch.keys()) == sorted(expected.batch.keys())
    for key in expected.batch.keys():  # noqa: SIM118 - a TensorDict
        assert actual.batch[key].dtype == expected.batch[key].dtype, key
        assert torch.equal(actual.batch[key], expected.batch[key]), key
    assert sorted(actual.non_tensor_batch) == sorted(expected.non_tensor_batch)
    for key, value in expected.non_tensor_batch.items():
        assert actual.non_tensor_batch[key].tolist() == value.tolist(), key
    assert actual.meta_info == expected.meta_info


class RolloutScheduler:
    """ROLL's agentic scheduler: expensive __init__ (inference engines), async get_batch."""

    def __init__(self, init_log: str) -> None:
        with open(init_log, "a") as file:  # proves whether __init__ ran, and where
            file.write(f"{os.getpid()}\n")
        self.engines = ["vllm-0", "vllm-1"]
        self.calls = 0

    async def get_batch(self, data: Any, batch_size: int) -> Any:
        self.calls += 1
        await asyncio.sleep(0)
        return make_batch(data.meta_info["global_step"], batch_size)

    async def engine_count(self) -> int:
        return len(self.engines)

    async def probe(self) -> dict[str, Any]:
        """What this worker process sees (touches no instance attribute)."""
        import torch  # a local import: cloudpickle cannot ship torch.backends.cudnn by value

        return {
            "pid": os.getpid(),
            "env": {name: os.environ.get(name) for name in (*PROFILES["roll"].env, SEED_VAR)},
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "first_random": torch.rand(1).item(),
        }


class DynamicSamplingScheduler:
    """ROLL's RLVR scheduler: one per domain, ``get_batch(data, global_step, batch_size)``."""

    def __init__(self, domain: str, init_log: str) -> None:
        with open(init_log, "a") as file:
            file.write(f"{domain} {os.getpid()}\n")
        self.domain = domain

    async def get_batch(self, data: Any, global_step: int, batch_size: int) -> Any:
        await asyncio.sleep(0.01)
        if batch_size < 1:
            raise ValueError(f"rollout of step {global_step} failed")
        return make_batch(global_step, batch_size, self.domain)


class Gate:
    """Pickling it blocks until released: a batch whose capture takes as long as we want."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.released_in_time: bool | None = None
        self.capture_thread: str | None = None

    def __reduce__(self) -> Any:
        if self.released_in_time is None:  # the first pickling is rollout_mock's capture
            self.capture_thread = threading.current_thread().name
            self.entered.set()
            # On the event loop's thread, waiting would block the loop that must release it: that
            # is the failure, told by the thread, not by a timer. Elsewhere HANG_S bounds a hang
            # only (a loop blocked some other way: only a failing run waits that long).
            self.released_in_time = False if _on_event_loop() else self.release.wait(HANG_S)
        return (str, ("gate",))


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class SlowRecordScheduler:
    """get_batch returns a batch whose recording blocks until ``ping`` (on the loop) runs."""

    def __init__(self) -> None:
        self.gate: Gate | None = None

    async def get_batch(self, data: Any, batch_size: int) -> Any:
        batch = make_batch(data.meta_info["global_step"], batch_size)
        if data.meta_info.get("gated"):
            self.gate = Gate()
            batch.meta_info["gate"] = self.gate
        return batch

    async def ping(self) -> dict[str, Any]:
        # Waits without blocking the loop until the capture is in progress, then releases it.
        # If the capture ran on the event loop, this method could not run until it gave up.
        for _ in range(int(HANG_S * 100)):
            if self.gate is not None and self.gate.entered.is_set():
                break
            await asyncio.sleep(0.01)
        assert self.gate is not None and self.gate.entered.is_set()
        capture_still_waiting = self.gate.released_in_time is None
        self.gate.release.set()
        return {"loop_thread": threading.current_thread().name, "capture_still_waiting": capture_still_waiting}

    async def gate_report(self) -> dict[str, Any]:
        assert self.gate is not None
        return {"released_in_time": self.gate.released_in_time, "capture_thread": self.gate.capture_thread}


class SlowRolloutScheduler:
    """get_batch of step 1 hangs for 1 s at least and until the watchdog has reported it (a file in
    ``stalls``): a stall the watchdog must see on the Ray handle path, whatever the load."""

    def __init__(self, stalls: str) -> None:
        self.stalls = stalls

    def get_batch(self, data: Any, batch_size: int) -> Any:
        step = data.meta_info["global_step"]
        if step == 1:
            started = time.monotonic()
            while not glob.glob(os.path.join(self.stalls, "stall-*.txt")) and time.monotonic() < started + HANG_S:
                time.sleep(0.02)
            time.sleep(max(0.0, started + 1.0 - time.monotonic()))
        return make_batch(step, batch_size)


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ---------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    """One local cluster for the module; determinism variables of this shell are hidden from it."""
    with local_ray_cluster(2, hide=(*FINGERPRINT_ENV_VARS, SEED_VAR, PROFILE_VAR)):
        yield


def cfg(dump_dir: Path, mode: str, **extra: Any) -> dict[str, Any]:
    return {"enable": True, "mode": mode, "dump_dir": str(dump_dir), **extra}


def step_data(step: int | None) -> Any:
    return DataProto(meta_info={} if step is None else {"global_step": step})


def load_file(dump_dir: Path, step: int, *, split: str = "train", name: str | None = None) -> Any:
    """A recorded step, read from its file (verified against the manifest)."""
    directory = dump_dir / split if name is None else dump_dir / split / name
    return load_step(directory / f"step_{step:06d}.pkl")


def init_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# ---------------------------------------------------------------------------------------------
# inside the actor: ray.remote(mock_class(...))
# ---------------------------------------------------------------------------------------------


def assert_deterministic_worker(seen: dict[str, Any], seed: int) -> None:
    assert seen["pid"] != os.getpid()
    assert {k: seen["env"][k] for k in PROFILES["roll"].env} == PROFILES["roll"].env
    assert seen["env"][SEED_VAR] == str(seed)
    assert seen["deterministic_algorithms"] is True
    assert seen["warn_only"] is False
    assert seen["cudnn_deterministic"] is True
    assert seen["cudnn_benchmark"] is False


def test_inside_actor_agentic_dump_then_mock_replays_exactly_with_determinism(tmp_path: Path) -> None:
    """ROLL's agentic shape inside the actor, both actors launched with ray_runtime_env()."""
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
    dump_dir, init_log = tmp_path / "dumps", tmp_path / "init.log"
    runtime_env = ray_runtime_env(profile="roll", seed=5)
    Dumping = ray.remote(mock_class(RolloutScheduler, cfg(dump_dir, "dump"), split="train"))
    actor = Dumping.options(name="train_scheduler", runtime_env=runtime_env).remote(str(init_log))
    recorded = [ray.get(actor.get_batch.remote(step_data(step), 4)) for step in range(3)]
    assert ray.get(actor.engine_count.remote()) == 2  # the real __init__ ran in dump mode
    assert ray.get(actor.rollout_mock_info.remote())["writes"] is True
    seen_dump = ray.get(actor.probe.remote())
    ray.get(actor.rollout_mock_close.remote())  # everything is on disk when this returns...
    ray.kill(actor)  # ...so killing the actor loses nothing
    assert len(init_lines(init_log)) == 1
    for step in range(3):
        assert_same_batch(recorded[step], make_batch(step, 4))
        assert_same_batch(load_file(dump_dir, step), recorded[step])

    Replaying = ray.remote(mock_class(RolloutScheduler, cfg(dump_dir, "mock"), split="train"))
    mock = Replaying.options(name="train_scheduler_mock", runtime_env=runtime_env).remote(str(init_log))
    for step in (0, 1, 2, 1):
        assert_same_batch(ray.get(mock.get_batch.remote(step_data(step), 4)), recorded[step])
    assert len(init_lines(init_log)) == 1, "mock mode must not run RolloutScheduler.__init__"
    with pytest.raises(ray.exceptions.RayTaskError, match=r"engines is not available in mock mode"):
        ray.get(mock.engine_count.remote())
    with pytest.raises(ray.exceptions.RayTaskError, match=r"Mock file not found.*step_000007"):
        ray.get(mock.get_batch.remote(step_data(7), 4))
    # __init__ did not run, so the determinism settings come from mock_class's own __init__.
    seen_mock = ray.get(mock.probe.remote())
    ray.get(mock.rollout_mock_close.remote())
    ray.kill(mock)

    for seen in (seen_dump, seen_mock):
        assert_deterministic_worker(seen, seed=5)
    torch.manual_seed(5)
    expected_first = torch.rand(1).item()
    assert seen_dump["first_random"] == seen_mock["first_random"] == expected_first


def test_recording_does_not_block_the_actor_event_loop_and_exit_flushes(tmp_path: Path) -> None:
    dump_dir = tmp_path / "dumps"
    Remote = ray.remote(mock_class(SlowRecordScheduler, cfg(dump_dir, "dump", max_pending=4)))
    actor = Remote.remote()
    gated = DataProto(meta_info={"global_step": 0, "gated": True})
    ref = actor.get_batch.remote(gated, 64)
    # The capture of step 0 waits for `ping`; ping can only run if the event loop is free.
    pong = ray.get(actor.ping.remote(), timeout=HANG_S)  # a hang bound: starting the actor counts
    assert pong["capture_still_waiting"] is True
    batch = ray.get(ref, timeout=HANG_S)
    report = ray.get(actor.gate_report.remote())
    assert report["released_in_time"] is True, "the capture ran on the event loop and blocked it"
    assert report["capture_thread"] != pong["loop_thread"]
    assert batch.meta_info["gate"] == "gate"
    more = [ray.get(actor.get_batch.remote(step_data(step), 8)) for step in (1, 2)]
    # No rollout_mock_close: a graceful exit (here Ray's own) flushes through the atexit hooks.
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.__ray_terminate__.remote(), timeout=HANG_S)
    files = [dump_dir / "train" / f"step_{step:06d}.pkl" for step in range(3)]
    # the process may still be exiting when the driver hears of it; a step file exists only once complete
    wait_until(lambda: all(file.exists() for file in files), "the actor's exit did not write every step")
    for step, expected in enumerate([batch, *more]):
        assert_same_batch(load_file(dump_dir, step), expected)


def test_rlvr_named_domains_in_concurrent_actors_joined_with_concat(tmp_path: Path) -> None:
    dump_dir, init_log = tmp_path / "dumps", tmp_path / "init.log"
    domains = ("math", "code")

    actors = {
        domain: ray.remote(mock_class(DynamicSamplingScheduler, cfg(dump_dir, "dump"), name=domain))
        .options(name=f"rlvr-{domain}")
        .remote(domain, str(init_log))
        for domain in domains
    }
    recorded = []
    for step in range(2):
        refs = [actors[d].get_batch.remote(step_data(None), step, 3) for d in domains]
        recorded.append(DataProto.concat(ray.get(refs)))  # both domains record at once
    ray.get([a.rollout_mock_close.remote() for a in actors.values()])
    for actor in actors.values():
        ray.kill(actor)
    assert len(init_lines(init_log)) == 2
    for domain in domains:
        assert sorted(p.name for p in (dump_dir / "train" / domain).glob("step_*.pkl")) == [
            "step_000000.pkl",
            "step_000001.pkl",
        ]
        for step in range(2):
            assert_same_batch(load_file(dump_dir, step, name=domain), make_batch(step, 3, domain))
    assert not list((dump_dir / "train").glob("step_*.pkl"))  # nothing unnamed, nothing overwritten

    # Replay on the driver (no actor at all), one named MockScheduler per domain; mock mode
    # inside actors is covered by the agentic test above and, for this shape, by the unit tests.
    mocked = {
        domain: MockScheduler(None, cfg(dump_dir, "mock"), name=domain, spec=ray.remote(DynamicSamplingScheduler))
        for domain in domains
    }
    replayed = []
    for step in range(2):
        refs = [mocked[d].get_batch.remote(step_data(None), step, 3) for d in domains]
        replayed.append(DataProto.concat(ray.get(refs)))
    for scheduler in mocked.values():
        scheduler.close()
    assert len(init_lines(init_log)) == 2
    for step in range(2):
        assert_same_batch(replayed[step], recorded[step])
        assert replayed[step].non_tensor_batch["uid"][0].startswith("math-")
        assert replayed[step].non_tensor_batch["uid"][-1].startswith("code-")


# ---------------------------------------------------------------------------------------------
# around the handle: MockScheduler(actor_handle) on the driver
# ---------------------------------------------------------------------------------------------


def test_around_handle_agentic_dump_returns_refs_then_mock_creates_no_actor(tmp_path: Path) -> None:
    dump_dir, init_log = tmp_path / "dumps", tmp_path / "init.log"
    RemoteScheduler = ray.remote(RolloutScheduler)
    made: list[Any] = []

    def factory() -> Any:
        made.append(RemoteScheduler.options(name="handle_scheduler").remote(str(init_log)))
        return made[-1]

    dumping = MockScheduler(None, cfg(dump_dir, "dump"), methods=("get_batch",), factory=factory)
    refs = [dumping.get_batch.remote(step_data(step), 4) for step in range(3)]
    assert all(isinstance(ref, ray.ObjectRef) for ref in refs)
    recorded = ray.get(refs)
    assert ray.get(dumping.engine_count.remote()) == 2  # other methods pass through to the handle
    with pytest.raises(LockedError, match=r"distinct `name`"):  # a second unnamed writer
        MockScheduler(made[0], cfg(dump_dir, "dump"))
    dumping.close()  # ray.get of each step happened on the writer thread; close waits for it
    ray.kill(made[0])
    assert len(made) == 1 and len(init_lines(init_log)) == 1
    for step in range(3):
        assert_same_batch(load_file(dump_dir, step), recorded[step])

    def must_not_build() -> Any:
        raise AssertionError("the factory was called in mock mode")

    for spec in (RemoteScheduler, RolloutScheduler, None):  # actor class, plain class, manifest
        mocked = MockScheduler(None, cfg(dump_dir, "mock"), methods=("get_batch",), factory=must_not_build, spec=spec)
        for step in (0, 1, 2):
            ref = mocked.get_batch.remote(step_data(step), 4)
            assert isinstance(ref, ray.ObjectRef)
            assert_same_batch(ray.get(ref), recorded[step])
        mocked.close()
    assert len(init_lines(init_log)) == 1

    # The two ways share the on-disk layout: recorded around the handle, replayed inside an actor.
    mock = ray.remote(mock_class(RolloutScheduler, cfg(dump_dir, "mock"))).remote(str(init_log))
    for step in range(3):
        assert_same_batch(ray.get(mock.get_batch.remote(step_data(step), 4)), recorded[step])
    # Control for the determinism test: without ray_runtime_env() nothing is switched on.
    control = ray.get(mock.probe.remote())
    ray.kill(mock)
    assert len(init_lines(init_log)) == 1
    assert control["deterministic_algorithms"] is False
    assert all(value is None for value in control["env"].values())


def test_around_handle_rlvr_positional_global_step(tmp_path: Path) -> None:
    dump_dir, init_log = tmp_path / "dumps", tmp_path / "init.log"
    RemoteRLVR = ray.remote(DynamicSamplingScheduler)
    handle = RemoteRLVR.remote("math", str(init_log))
    dumping = MockScheduler(handle, cfg(dump_dir, "dump"), name="math")
    # No meta_info step: the step is the positional `global_step` found in the ActorMethod's signature.
    recorded = {step: ray.get(dumping.get_batch.remote(step_data(None), step, 2)) for step in (5, 6)}
    # A failed rollout: the caller gets the error from ray.get, nothing is recorded for step 7
    # (free for a retry), and recording goes on.
    with pytest.raises(ray.exceptions.RayTaskError, match="rollout of step 7 failed"):
        ray.get(dumping.get_batch.remote(step_data(None), 7, 0))
    recorded[9] = ray.get(dumping.get_batch.options(num_returns=1).remote(step_data(None), global_step=9, batch_size=2))
    dumping.close()
    ray.kill(handle)
    assert sorted(p.name for p in (dump_dir / "train" / "math").glob("step_*.pkl")) == [
        "step_000005.pkl",
        "step_000006.pkl",
        "step_000009.pkl",
    ]
    mocked = MockScheduler(None, cfg(dump_dir, "mock"), name="math", spec=RemoteRLVR)
    for step, batch in recorded.items():
        assert_same_batch(ray.get(mocked.get_batch.remote(step_data(None), step, 2)), batch)
        assert_same_batch(batch, make_batch(step, 2, "math"))
    mocked.close()


def test_around_handle_the_watchdog_and_timing_apply_to_ray_calls(tmp_path: Path) -> None:
    """The Ray handle path goes through the same dispatch as plain calls: the stall watchdog
    watches each call until its batch arrives, and the manifest records the rollout's seconds."""
    dump_dir = tmp_path / "dumps"
    handle = ray.remote(SlowRolloutScheduler).remote(str(dump_dir / "stalls"))
    ray.get(handle.get_batch.remote(step_data(0), 2))  # the actor is up: its start is not a stall
    watchdog = {"absolute_seconds": 1.0, "min_seconds": 0.0}
    took: dict[int, float] = {}
    with MockScheduler(handle, cfg(dump_dir, "dump", watchdog=watchdog)) as dumping:
        for step in range(3):  # a training loop: one rollout at a time
            started = time.monotonic()
            ray.get(dumping.get_batch.remote(step_data(step), 2))
            took[step] = time.monotonic() - started
            dumping.flush()
    ray.kill(handle)
    stalls = sorted((dump_dir / "stalls").glob("stall-*.txt"))
    reports = [path.read_text() for path in stalls]
    assert sum("get_batch(step 1)" in text for text in reports) == 1, stalls  # one report per stalled call
    # a fast step is never reported; one that took about the threshold on a loaded machine may be
    for step in (0, 2):
        if took[step] < 0.8:
            assert not any(f"get_batch(step {step})" in text for text in reports), (step, took, stalls)
    dump = open_dump(dump_dir)
    seconds = {step: dump.entry(dump.stream("train"), step).rollout_seconds for step in range(3)}
    assert all(value is not None for value in seconds.values()), seconds
    assert seconds[1] >= 1.0, seconds  # it ran for 1 s at least

    mocked = MockScheduler(None, cfg(dump_dir, "mock", watchdog=watchdog), spec=ray.remote(SlowRolloutScheduler))
    assert mocked.interceptor is not None and mocked.interceptor.watchdog is not None
    entered: list[str] = []
    original = mocked.interceptor.watchdog.enter
    mocked.interceptor.watchdog.enter = lambda what: (entered.append(what), original(what))[1]  # type: ignore[method-assign]
    for step in range(3):
        assert_same_batch(ray.get(mocked.get_batch.remote(step_data(step), 2)), make_batch(step, 2))
    mocked.close()
    assert entered == [f"get_batch(step {step})" for step in range(3)]

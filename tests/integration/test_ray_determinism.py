"""ray_runtime_env() against a real local Ray cluster: do the settings reach the worker processes?

Two small clusters (about 3 s each), one per test class:

* job level, ``ray.init(runtime_env=ray_runtime_env(...))``: Ray runs the setup hook in every
  worker, so an actor sees the env vars *and* torch's deterministic switches without doing anything;
* actor level, ``Actor.options(runtime_env=ray_runtime_env(...))``: Ray (2.x) passes the env vars
  but ignores a per-actor ``worker_process_setup_hook``, so the actor calls ``apply_from_env()``
  itself; a control actor without the runtime_env shows that none of it is there by default.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from rollout_mock.determinism import (  # noqa: E402
    FINGERPRINT_ENV_VARS,
    PROFILE_VAR,
    PROFILES,
    SEED_VAR,
    TF32_VAR,
    ray_runtime_env,
)

pytestmark = pytest.mark.ray

STRICT_ENV = PROFILES["strict"].env


class Probe:
    """Reports what a Ray worker process sees."""

    def __init__(self, call_apply_from_env: bool = False) -> None:
        if call_apply_from_env:
            from rollout_mock.determinism import apply_from_env

            apply_from_env()

    def report(self) -> dict[str, Any]:
        import torch

        return {
            "pid": os.getpid(),
            "env": {
                name: os.environ.get(name)
                for name in (*STRICT_ENV, "ROLLOUT_MOCK_SEED", "NVIDIA_TF32_OVERRIDE")
            },
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "first_random": random.random(),
        }


# Workers cannot import this test module by name: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
RemoteProbe = ray.remote(num_cpus=0)(Probe)


def _start_ray(runtime_env: dict[str, Any] | None) -> Iterator[None]:
    """A fresh local cluster whose processes do not inherit determinism variables from this one.

    A local raylet inherits the driver's environment, so the variables are removed while the
    cluster lives; ``RAY_ADDRESS`` too, so that the test never attaches to someone else's cluster.
    """
    hidden = (*FINGERPRINT_ENV_VARS, SEED_VAR, PROFILE_VAR, TF32_VAR, "RAY_ADDRESS")
    saved = {name: os.environ.pop(name) for name in hidden if name in os.environ}
    try:
        ray.init(num_cpus=2, include_dashboard=False, runtime_env=runtime_env, log_to_driver=False)
        yield
    finally:
        ray.shutdown()
        os.environ.update(saved)


def _assert_deterministic(seen: dict[str, Any], *, tf32_off: bool) -> None:
    assert seen["deterministic_algorithms"] is True
    assert seen["warn_only"] is False
    assert seen["cudnn_deterministic"] is True
    assert seen["cudnn_benchmark"] is False
    assert seen["cudnn_allow_tf32"] is not tf32_off  # torch's default (True) unless tf32="off"
    assert seen["env"]["NVIDIA_TF32_OVERRIDE"] == ("0" if tf32_off else None)


class TestJobLevelRuntimeEnv:
    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def cluster(cls) -> Iterator[None]:
        yield from _start_ray(ray_runtime_env(profile="strict", seed=11, tf32="off"))

    def test_every_worker_gets_env_and_torch_switches(self) -> None:
        first, second = RemoteProbe.remote(), RemoteProbe.remote()
        seen = ray.get([first.report.remote(), second.report.remote()])
        assert seen[0]["pid"] != seen[1]["pid"] != os.getpid()
        for worker in seen:
            assert {k: worker["env"][k] for k in STRICT_ENV} == STRICT_ENV
            assert worker["env"]["ROLLOUT_MOCK_SEED"] == "11"
            _assert_deterministic(worker, tf32_off=True)
        random.seed(11)
        assert seen[0]["first_random"] == seen[1]["first_random"] == random.random()


class TestActorLevelRuntimeEnv:
    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def cluster(cls) -> Iterator[None]:
        yield from _start_ray(None)

    def test_env_vars_reach_the_actor_and_apply_from_env_sets_torch(self) -> None:
        actor = RemoteProbe.options(runtime_env=ray_runtime_env(profile="roll")).remote(
            call_apply_from_env=True
        )
        seen = ray.get(actor.report.remote())
        roll = PROFILES["roll"].env
        assert {k: seen["env"][k] for k in roll} == roll
        assert seen["env"]["NCCL_PROTO"] is None  # not in the roll profile
        _assert_deterministic(seen, tf32_off=False)

    def test_control_actor_has_none_of_it(self) -> None:
        actor = RemoteProbe.remote(call_apply_from_env=True)  # DETERMINISTIC_MODE unset: a no-op
        seen = ray.get(actor.report.remote())
        assert all(value is None for value in seen["env"].values()), seen["env"]
        assert seen["deterministic_algorithms"] is False
        assert seen["cudnn_deterministic"] is False

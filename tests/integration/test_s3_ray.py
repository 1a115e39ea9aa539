"""Many Ray actors dumping into one object-store dump at once (moto S3 on 127.0.0.1), then a
replay that verifies every step of every actor."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import HANG_S, local_ray_cluster
from storage_conformance import s3_server  # noqa: F401

from rollout_mock import open_dump
from rollout_mock.storage.manifest import StreamId

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ACTORS = 4
STEPS = 5


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    with local_ray_cluster(2):
        yield


def test_many_actors_dump_into_one_s3_dump(ray_cluster: None, s3_server: dict[str, Any]) -> None:
    # defined here, not at module level: cloudpickle ships them by value to the workers
    def batch_for(actor: int, step: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(1000 * actor + step)
        return {"input_ids": torch.randint(0, 50_000, (16, 128), generator=gen), "actor": actor, "step": step}

    @ray.remote(num_cpus=0)
    class Rollout:
        """One rollout worker; its MockScheduler dumps into the shared S3 dump as rank ``index``."""

        def __init__(self, index: int, config: dict[str, Any]) -> None:
            from rollout_mock import MockScheduler

            class Scheduler:
                def get_batch(self, data: Any, global_step: int) -> dict[str, Any]:
                    return batch_for(index, global_step)

            self.sched = MockScheduler(Scheduler(), config, rank=index)

        def run(self, steps: int) -> int:
            for step in range(steps):
                self.sched.get_batch(None, global_step=step)
            self.sched.close()
            return steps

    options = s3_server["storage_options"]
    url = f"s3://{s3_server['bucket']}/ray-{os.getpid()}"
    config = {"enable": True, "mode": "dump", "dump_dir": url, "storage_options": options, "ranks": "all"}
    actors = [Rollout.remote(i, config) for i in range(ACTORS)]
    assert ray.get([a.run.remote(STEPS) for a in actors], timeout=HANG_S) == [STEPS] * ACTORS
    dump = open_dump(url, storage_options=options)
    assert sorted(s.key for s in dump.streams()) == [f"train@rank{i}" for i in range(ACTORS)]
    for i in range(ACTORS):
        stream = StreamId("train", None, i)
        assert dump.steps(stream) == list(range(STEPS))
        for step in range(STEPS):
            got = dump.load(step, stream)
            assert got["actor"] == i and got["step"] == step
            assert torch.equal(got["input_ids"], batch_for(i, step)["input_ids"])
    # every writer compacted into the one manifest and released its lease
    store = dump.store
    assert not store.backend.listdir(".streams") and not [n for n in store.backend.listdir("train") if n.endswith(".lock")]

"""The stall watchdog inside a real Ray actor (``mock_class``): an async actor's hang is reported
with its pending asyncio task, from the actor's own process."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import local_ray_cluster

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# the actor's process cannot import this test module: ship its classes by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])



@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    with local_ray_cluster(1):
        yield


class AsyncScheduler:
    async def get_batch(self, data: object, global_step: int) -> dict[str, list[int]]:
        if global_step == 1:
            await engine_never_answers_in_time()
        return {"input_ids": [global_step]}


async def engine_never_answers_in_time() -> None:
    await asyncio.sleep(2.0)


def test_stall_inside_a_ray_actor(tmp_path: Path) -> None:
    from rollout_mock.wrap import mock_class

    dump_dir = tmp_path / "dump"
    config = {"enable": True, "mode": "dump", "dump_dir": str(dump_dir), "watchdog": {"absolute_seconds": 0.5}}
    actor = ray.remote(mock_class(AsyncScheduler, config)).remote()
    try:
        for step in range(2):
            ray.get(actor.get_batch.remote(None, step), timeout=60)
        ray.get(actor.rollout_mock_close.remote(), timeout=60)
        pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60)
    finally:
        ray.kill(actor)
    files = sorted((dump_dir / "stalls").glob("stall-*.txt"))
    assert len(files) == 1 and files[0].name.endswith(f"-{pid}.txt")  # written by the actor process
    text = files[0].read_text()
    assert "get_batch(step 1)" in text
    assert "engine_never_answers_in_time" in text  # the pending task's coroutine stack

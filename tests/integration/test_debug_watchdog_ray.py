"""The stall watchdog inside a real Ray actor (``mock_class``): an async actor's hang is reported
with its pending asyncio task, from the actor's own process."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# the actor's process cannot import this test module: ship its classes by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in ("RAY_ADDRESS", LOOPBACK_ENV) if name in os.environ}
    os.environ[LOOPBACK_ENV] = "0"
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    saved_flag = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if saved_flag is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
        yield
    finally:
        ray.shutdown()
        if saved_flag is not None:
            constants.ENABLE_RAY_CLUSTER = saved_flag
        os.environ.pop(LOOPBACK_ENV, None)
        os.environ.update(saved)


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

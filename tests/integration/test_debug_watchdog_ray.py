"""The stall watchdog inside a real Ray actor (``mock_class``): an async actor's hang is reported
with its pending asyncio task, from the actor's own process."""

from __future__ import annotations

import asyncio
import glob
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import HANG_S, local_ray_cluster

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# the actor's process cannot import this test module: ship its classes by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])



@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    with local_ray_cluster(1):
        yield


class AsyncScheduler:
    stalls = ""  # set by the test before the class is shipped to the actor

    async def get_batch(self, data: object, global_step: int) -> dict[str, list[int]]:
        if global_step == 1:
            await engine_never_answers_in_time(self.stalls)
        return {"input_ids": [global_step]}


async def engine_never_answers_in_time(stalls: str) -> None:
    """Pending until the watchdog has reported it (an event: a busy machine only makes it later)."""
    deadline = time.monotonic() + HANG_S
    while not glob.glob(os.path.join(stalls, "stall-*.txt")) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def test_stall_inside_a_ray_actor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_mock.wrap import mock_class

    dump_dir = tmp_path / "dump"
    monkeypatch.setattr(AsyncScheduler, "stalls", str(dump_dir / "stalls"))
    config = {"enable": True, "mode": "dump", "dump_dir": str(dump_dir), "watchdog": {"absolute_seconds": 0.5}}
    actor = ray.remote(mock_class(AsyncScheduler, config)).remote()
    try:
        for step in range(2):
            ray.get(actor.get_batch.remote(None, step), timeout=HANG_S)
        ray.get(actor.rollout_mock_close.remote(), timeout=HANG_S)
        pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=HANG_S)
    finally:
        ray.kill(actor)
    files = sorted((dump_dir / "stalls").glob("stall-*.txt"))
    assert len(files) == 1 and files[0].name.endswith(f"-{pid}.txt")  # written by the actor process
    text = files[0].read_text()
    assert "get_batch(step 1)" in text
    assert "engine_never_answers_in_time" in text  # the pending task's coroutine stack

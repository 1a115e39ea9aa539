"""Replayed batches behave like the batches they replace (issue 26, item 5): ``torch.save``,
``pickle`` and a Ray transfer of a replayed batch work, at the size of its own data, whichever
way it was loaded (a verified full load, a mapped lazy load, a partial load)."""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import local_ray_cluster

from rollout_mock import MockScheduler, open_dump


def areal(n: int = 64) -> list[dict[str, torch.Tensor]]:
    """AReaL trajectories: every tensor under 1 MiB, so all of them share the step's chunks."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        length = int(torch.randint(1000, 3000, (1,), generator=gen))
        out.append({"input_ids": torch.randint(0, 150_000, (1, length), generator=gen, dtype=torch.int32),
                    "logprobs": torch.randn(1, length, generator=gen),
                    "attention_mask": torch.ones(1, length, dtype=torch.bool),
                    "versions": torch.randint(-1, 4, (1, length), generator=gen, dtype=torch.int32),
                    "rewards": torch.randn(1, generator=gen)})
    return out


def mixed() -> dict[str, Any]:
    """Tensors of several dtypes at the top level, in lists, a numpy array and plain values."""
    return {"ids": torch.arange(4096).reshape(64, 64), "mask": torch.ones(64, 64, dtype=torch.bool),
            "lp": torch.randn(64, 64, dtype=torch.bfloat16), "small": [torch.arange(i + 1) for i in range(50)],
            "np": np.arange(100, dtype=np.float32), "meta": {"step": 3, "name": "x"}}


BATCHES: dict[str, Callable[[], Any]] = {"areal": areal, "mixed": mixed}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


class Rollout:
    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def get_batch(self, data: object, global_step: int) -> Any:
        return self.batch


@pytest.fixture(scope="module", params=list(BATCHES))
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    batch = BATCHES[request.param]()
    dump = tmp_path_factory.mktemp(f"replayed-{request.param}")
    with MockScheduler(Rollout(batch), {"enable": True, "mode": "dump", "dump_dir": str(dump)}) as mock:
        mock.get_batch(None, 0)
    return batch, dump


LOADS: dict[str, Callable[[Path], Any]] = {
    "replay": lambda dump: MockScheduler(None, {"enable": True, "mode": "mock", "dump_dir": str(dump),
                                                "prefetch": False}).get_batch(None, 0),
    "mapped": lambda dump: open_dump(dump).open(0).load(),
    "rows": lambda dump: open_dump(dump).open(0).load(rows=slice(0, 10**6)),
}


@pytest.mark.parametrize("load", list(LOADS))
def test_torch_save_and_pickle_of_a_replayed_batch(recorded: tuple[Any, Path], load: str) -> None:
    batch, dump = recorded
    replayed = LOADS[load](dump)
    assert same(batch, replayed)
    buffer = io.BytesIO()
    torch.save(replayed, buffer)  # used to fail: all tensors viewed one buffer as different dtypes
    assert same(batch, torch.load(io.BytesIO(buffer.getvalue()), weights_only=False))
    live, again = len(pickle.dumps(batch, protocol=5)), pickle.dumps(replayed, protocol=5)
    assert len(again) < 1.1 * live + 4096, f"replayed batch pickles to {len(again)} bytes, live to {live}"
    assert same(batch, pickle.loads(again))
    live_pt = io.BytesIO()
    torch.save(batch, live_pt)
    assert len(buffer.getvalue()) < 1.1 * len(live_pt.getvalue()) + 4096


def test_each_replayed_tensor_owns_a_storage_of_its_own_size(recorded: tuple[Any, Path]) -> None:
    _, dump = recorded
    replayed = LOADS["replay"](dump)
    tensors = [t for t in _leaves(replayed) if isinstance(t, torch.Tensor) and t.numel()]
    assert tensors
    assert all(t.untyped_storage().nbytes() == t.nbytes for t in tensors)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaves(v)]
    return [value]


@pytest.mark.ray
def test_a_replayed_batch_crosses_ray_at_its_own_size(recorded: tuple[Any, Path]) -> None:
    ray = pytest.importorskip("ray")
    batch, dump = recorded
    replayed = LOADS["replay"](dump)
    serialized = len(ray.cloudpickle.dumps(replayed, protocol=5))
    assert serialized < 1.1 * len(ray.cloudpickle.dumps(batch, protocol=5)) + 4096
    with local_ray_cluster(num_cpus=2):
        @ray.remote
        def echo(value: Any) -> Any:
            return value

        assert same(batch, ray.get(echo.remote(replayed)))
        assert same(batch, ray.get(ray.put(replayed)))

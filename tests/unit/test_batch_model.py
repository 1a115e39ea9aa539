"""The batch model (rollout_mock.batch): rows, keys, take, concat for every supported type,
nested tensors (strided and jagged) through dump and replay, and registered types."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cfg

from rollout_mock import MockScheduler
from rollout_mock.batch import (
    BatchType,
    batch_type_of,
    concat,
    count_samples,
    describe_keys,
    is_dataproto,
    register_batch_type,
    rejected_count,
    take_rows,
)
from rollout_mock.errors import RolloutMockError

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")


def nested(layout: torch.layout, step: int = 0) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.arange(2.0) + step, torch.arange(3.0) + step], layout=layout)


class Proto:
    """A DataProto-like object without select_idxs/concat (like the demo's batch)."""

    def __init__(self, batch: Any, non_tensor_batch: dict[str, Any], meta_info: dict[str, Any]) -> None:
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info


class PropertyOnly:
    """Attributes behind properties only: not a DataProto (detection never runs properties)."""

    @property
    def batch(self) -> Any:
        raise AssertionError("detection ran a property")

    non_tensor_batch = meta_info = batch


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
def test_nested_tensors_dump_and_replay(tmp_path: Path, layout: torch.layout) -> None:
    class Scheduler:
        def get_batch(self, global_step: int) -> dict[str, torch.Tensor]:
            return {"ragged": nested(layout, global_step), "ids": torch.arange(2)}

    with MockScheduler(Scheduler(), cfg(tmp_path)) as mock:
        recorded = [mock.get_batch(step) for step in range(2)]
    assert count_samples(recorded[0]) == 2
    assert describe_keys(recorded[0])["ragged"]["shape"] == [2, None]
    with MockScheduler(None, cfg(tmp_path, "mock")) as mock:
        for step in range(2):
            replayed = mock.get_batch(step)
            assert replayed["ragged"].is_nested and replayed["ragged"].layout == layout
            for got, want in zip(replayed["ragged"].unbind(), recorded[step]["ragged"].unbind(), strict=True):
                assert torch.equal(got, want)
    with MockScheduler(None, cfg(tmp_path, "mock", subsample=0.5)) as mock:
        half = mock.get_batch(1)
    assert half["ragged"].size(0) == 1 and torch.equal(half["ragged"].unbind()[0], torch.arange(3.0) + 1)
    assert half["ids"].tolist() == [1]


def test_rows_take_and_concat_of_each_type() -> None:
    column = torch.arange(4)
    cases: list[tuple[Any, int]] = [
        ({"x": column, "meta": "same"}, 4),
        ([{"x": 1}, None, {"x": 3}], 3),
        (np.arange(5), 5),
        (column, 4),
        (Proto({"x": column}, {"uid": np.array(list("abcd"), dtype=object)}, {"global_step": 1}), 4),
        ({"format": "rollout_mock.slime", "samples": [{"a": 1}, {"a": 2}]}, 2),
        ((column, {"y": torch.ones(4)}), 4),
    ]
    for batch, rows in cases:
        assert count_samples(batch) == rows, batch
        taken = take_rows(batch, [rows - 1, 0])
        assert type(taken) is type(batch)
        assert count_samples(taken) == 2, batch
    proto = take_rows(cases[4][0], [3, 1])
    assert proto.batch["x"].tolist() == [3, 1] and proto.non_tensor_batch["uid"].tolist() == ["d", "b"]
    assert proto.meta_info == {"global_step": 1}
    assert rejected_count(cases[1][0]) == 1
    joined = concat([{"x": column, "meta": "same"}, {"x": column, "meta": "same"}])
    assert joined["x"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3] and joined["meta"] == "same"
    assert concat([[1], [None, 2]]) == [1, None, 2]
    with pytest.raises(RolloutMockError, match="'meta'"):
        concat([{"x": column, "meta": "a"}, {"x": column, "meta": "b"}])
    with pytest.raises(RolloutMockError, match="no batch dimension"):
        take_rows(object(), [0])


def test_dataproto_detection_reads_instance_state_only() -> None:
    assert is_dataproto(Proto(None, {}, {}))
    assert not is_dataproto(PropertyOnly())
    assert not is_dataproto(Proto)  # a class is not a batch


def test_adapters_register_their_batch_types() -> None:
    class Rollout:
        def __init__(self, samples: list[str]) -> None:
            self.samples = samples

    kind = register_batch_type(BatchType(
        "test-rollout", lambda b: isinstance(b, Rollout), lambda b: len(b.samples),
        lambda b, index: Rollout([b.samples[i] for i in index]),
        lambda parts: Rollout([s for p in parts for s in p.samples]),
    ))
    batch = Rollout(["a", "b", "c"])
    assert batch_type_of(batch) is kind and count_samples(batch) == 3
    assert take_rows(batch, [2]).samples == ["c"]
    assert concat([batch, batch]).samples == ["a", "b", "c"] * 2

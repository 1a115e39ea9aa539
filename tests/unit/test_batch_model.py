"""The batch model (rollout_mock.batch): rows, keys, take, concat for every supported type,
nested tensors (strided and jagged) through dump and replay, and registered types."""

from __future__ import annotations

import importlib
import inspect
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cfg

import rollout_mock.batch as batch_module
from rollout_mock import MockScheduler
from rollout_mock.batch import (
    BatchType,
    batch_class_names,
    batch_columns,
    batch_keys,
    batch_meta,
    batch_type_of,
    column_name,
    concat,
    count_samples,
    dataproto_fields,
    describe_keys,
    rebuild,
    register_batch_class,
    register_batch_type,
    register_step_name,
    rejected_count,
    select_keys,
    step_names,
    subset,
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
    assert dataproto_fields(Proto(None, {}, {})) is not None
    assert batch_type_of(Proto(None, {}, {})).name == "dataproto"  # type: ignore[union-attr]
    assert dataproto_fields(PropertyOnly()) is None
    assert dataproto_fields(Proto) is None  # a class is not a batch


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


def test_keys_columns_selection_parts_and_subset_of_each_type() -> None:
    column = torch.arange(4)
    proto = Proto({"x": column}, {"uid": np.array(list("abcd"), dtype=object)}, {"global_step": 1})
    assert batch_keys(proto) == ["x", "uid"] and set(batch_columns(proto) or {}) == {"x", "uid"}
    assert batch_meta(proto) == {"global_step": 1}
    assert set(describe_keys(proto)) == {"batch.x", "non_tensor_batch.uid"}  # metadata left out
    assert column_name("batch.x", proto) == "x" and column_name("non_tensor_batch.uid", proto) == "uid"
    only = select_keys(proto, ["uid"])
    assert only.batch == {} and list(only.non_tensor_batch) == ["uid"] and only.meta_info == {"global_step": 1}
    cut = subset(proto, ["x"], slice(1, 3))
    assert cut.batch["x"].tolist() == [1, 2] and cut.non_tensor_batch == {} and type(cut) is Proto
    assert proto.batch["x"].tolist() == [0, 1, 2, 3]  # the input is not changed
    rebuilt = rebuild(proto, {"meta_info": {"global_step": 2}})
    assert rebuilt.meta_info == {"global_step": 2} and proto.meta_info == {"global_step": 1}
    trajectories = [{"ids": column, "r": 1.0}, None, {"ids": column, "mask": column}]
    assert batch_keys(trajectories) == ["ids", "r", "mask"] and column_name("[*].ids", trajectories) == "ids"
    assert select_keys(trajectories, ["ids"]) == [{"ids": column}, None, {"ids": column}]
    assert subset(trajectories, None, range(1, 3))[0] is None
    slime = {"format": "rollout_mock.slime", "samples": [[{"a": 1, "b": 2}], [{"a": 3, "b": 4}]]}
    assert batch_keys(slime) == ["a", "b"] and select_keys(slime, ["b"])["samples"] == [[{"b": 2}], [{"b": 4}]]
    assert subset(torch.arange(5), ["ignored"], slice(3, None)).tolist() == [3, 4]
    assert subset("a value without rows", None, slice(0, 1)) == "a value without rows"
    with pytest.raises(RolloutMockError, match="cannot select keys"):
        select_keys(torch.arange(3), ["x"])


def test_one_registry_of_batch_classes() -> None:
    """The safe loader's classes are the batch model's: a type's ``classes`` and
    ``register_batch_class`` feed the one registry the codec asks."""
    from rollout_mock.codec import is_batch_class as codec_is_batch_class

    class Registered:
        pass

    assert ("verl.protocol", "DataProto") in batch_class_names()  # the adapters' DataProto type
    assert not codec_is_batch_class(Registered)
    register_batch_class(Registered)
    assert codec_is_batch_class(Registered) and (Registered.__module__, Registered.__qualname__) in batch_class_names()


def test_step_names_are_registered_by_the_adapters_and_looked_up_by_wrap() -> None:
    from rollout_mock.wrap.calls import step_from_call, step_position_in

    assert step_names()[:3] == ("global_step", "global_steps", "rollout_id")
    assert step_from_call((Proto(None, {}, {"global_steps": 7}),), {}, None) == 7
    parameters = [inspect.Parameter("args", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                  inspect.Parameter("episode", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    assert step_from_call((), {"episode": 3}, None) is None and step_position_in(parameters) is None
    register_step_name("episode")
    try:
        assert step_from_call((), {"episode": 3}, None) == 3
        assert step_position_in(parameters) == 1
    finally:
        batch_module._STEP_NAMES.remove("episode")
    with pytest.raises(RolloutMockError, match="not a parameter name"):
        register_step_name("not a name")


# --------------------------------------------------------------------------- a type from the docs
DOCS = Path(__file__).resolve().parents[2] / "docs" / "contributing.md"


@pytest.fixture(scope="module")
def episodes() -> Any:
    """The module of docs/contributing.md's "Adding a batch type", written as one file and imported."""
    section = DOCS.read_text().split("## Adding a batch type\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    folder = Path(tempfile.mkdtemp(prefix="batch_type_"))
    (folder / "episodes_batch.py").write_text(code)
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("episodes_batch")  # stays in sys.modules: the loader finds the class
    finally:
        sys.path.remove(str(folder))


def test_a_batch_type_added_as_the_docs_say_works_everywhere(episodes: Any, tmp_path: Path) -> None:
    from rollout_mock import compare_batches, open_dump
    from rollout_mock.compare.traces import batch_traces
    from rollout_mock.debug import cut_dump, redact_batch

    episodes_cls = episodes.Episodes

    def make(step: int) -> Any:
        return episodes_cls({"input_ids": torch.arange(8).reshape(4, 2) + step, "reward": [0.5 * i for i in range(4)],
                             "prompt": np.array([f"p{i}" for i in range(4)], dtype=object)},
                            {"global_step": step, "temperature": 1.0})

    class Scheduler:
        def get_batch(self, request: Any) -> Any:
            return make(request.info["global_step"])

    dump = tmp_path / "dump"
    with MockScheduler(Scheduler(), cfg(dump)) as mock:
        for step in range(3):
            mock.get_batch(make(step))  # the step is found in the request's metadata part
    recorded = open_dump(dump)
    stream = recorded.streams()[0]
    assert recorded.steps(stream) == [0, 1, 2]
    entry = recorded.entry(stream, 1)
    assert entry is not None and entry.samples == 4 and "columns.input_ids" in entry.keys
    with MockScheduler(None, cfg(dump, "mock")) as mock:
        replayed = mock.get_batch(make(1))
    assert type(replayed) is episodes_cls and replayed.info == {"global_step": 1, "temperature": 1.0}
    assert torch.equal(replayed.columns["input_ids"], make(1).columns["input_ids"])
    with MockScheduler(None, cfg(dump, "mock", subsample=0.5)) as mock:
        half = mock.get_batch(make(2))
    assert half.columns["input_ids"][:, 0].tolist() == [2, 8] and half.columns["reward"] == [0.0, 1.5]

    joined = concat([make(0), make(1)])
    assert count_samples(joined) == 8 and take_rows(joined, [7]).columns["prompt"].tolist() == ["p3"]
    diffs, _ = compare_batches(make(0), make(1))
    assert {d.key for d in diffs} == {"columns.input_ids", "info.global_step"}
    redacted, hits = redact_batch(make(0))
    assert hits == ["prompt"] and set(redacted.columns["prompt"]) == {"<redacted>"}
    assert redacted.columns["input_ids"] is not None and make(0).columns["prompt"][0] == "p0"
    assert len(batch_traces(make(0))) == 4

    cut = cut_dump(dump, tmp_path / "cut", steps=[1], samples=[3, 0], keys=["input_ids"])
    assert cut.rows[stream.key] == {1: 2}
    small = open_dump(tmp_path / "cut").load(1, stream)
    assert type(small) is episodes_cls and list(small.columns) == ["input_ids"]
    assert small.columns["input_ids"][:, 0].tolist() == [7, 1] and small.info["global_step"] == 1


class Table:
    """A batch class with keyed parts that is not a TensorDict: the codec writes and rebuilds it
    from the description its batch type registers, knowing no such class by name."""

    def __init__(self, columns: dict[str, Any], title: str) -> None:
        self.columns, self.title = columns, title


def _table_check(node: Any) -> None:
    if type(node.get("title")) is not str or type(node.get("rows")) is not int:
        raise ValueError("bad table")


def _table_rows(node: Any, rows: slice) -> tuple[dict[str, Any], slice] | None:
    return {**node, "rows": len(range(node["rows"])[rows])}, rows


TABLE = batch_module.BatchType(
    "test-table", lambda b: isinstance(b, Table), lambda b: len(next(iter(b.columns.values()))),
    lambda b, index: Table({k: v[index] for k, v in b.columns.items()}, b.title),
    codec=batch_module.KeyedCodec(
        "x-table", (f"{__name__}:Table",),
        lambda t, path: ({"title": t.title, "rows": len(next(iter(t.columns.values())))}, t.columns.items(), {}),
        _table_check, lambda node, items, flush: Table(items, node["title"]), _table_rows),
)


def test_the_codec_writes_a_registered_batch_class_with_keyed_parts() -> None:
    """A registered :class:`KeyedCodec` is how the codec writes a class with keyed parts (a
    ``{"$": tag, ..., "items": [[key, NODE]]}`` node) and rebuilds it in a safe load, rows and
    keys included; its ``check`` guards the header; an unregistered tag is refused."""
    from rollout_mock.codec import decode, encode_bytes
    from rollout_mock.codec.format import check_tree

    table = Table({"x": torch.arange(8).reshape(4, 2), "y": np.arange(4.0), "nested": Table({"z": torch.ones(4)}, "in")},
                  "t")
    register_batch_type(TABLE)
    data = encode_bytes({"t": table})
    start = data.index(b'{"format"')
    assert b'"$":"x-table","title":"t","rows":4,"items":[["x",' in data[start:].replace(b" ", b"")
    back = decode(data)["t"]
    assert type(back) is Table and back.title == "t" and torch.equal(back.columns["x"], table.columns["x"])
    assert type(back.columns["nested"]) is Table and torch.equal(back.columns["nested"].columns["z"], torch.ones(4))
    rows = decode(encode_bytes(table), rows=slice(1, 3), keys=["y"])
    assert type(rows) is Table and list(rows.columns) == ["y"] and rows.columns["y"].tolist() == [1.0, 2.0]
    node = {"$": "x-table", "title": "t", "rows": 2, "items": [["x", None]]}
    check_tree(node, [])
    with pytest.raises(ValueError, match="bad table"):
        check_tree({**node, "title": 7}, [])
    with pytest.raises(ValueError, match="unknown node tag 'y-table'"):
        check_tree({**node, "$": "y-table"}, [])


def test_a_type_that_never_matches_a_dict_is_not_asked_about_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``BatchType.dicts=False``: the walks over sample dicts skip its ``matches`` for plain dicts
    (a describe of 512 slime samples asks every registered type about ~1,500 dicts); it is still
    asked about other objects, and a type without the declaration still matches a dict."""
    monkeypatch.setattr(batch_module, "_REGISTERED", list(batch_module._REGISTERED))
    monkeypatch.setattr(batch_module, "_FOR_DICTS", list(batch_module._FOR_DICTS))
    asked: list[type] = []

    class Box:
        def __init__(self, value: Any) -> None:
            self.value = value

    def never_a_dict(obj: Any) -> bool:
        asked.append(type(obj))
        return isinstance(obj, Box)

    register_batch_type(BatchType("test-box", never_a_dict, lambda b: None, lambda b, i: b,
                                  parts=lambda b: {"value": b.value}, dicts=False))
    register_batch_type(BatchType("test-tagged", lambda b: isinstance(b, dict) and b.get("kind") == "tagged",
                                  lambda b: None, lambda b, i: b, parts=lambda b: {"hidden": torch.zeros(2)}))
    samples = [{"x": torch.ones(3), "meta": {"kind": "tagged"}, "box": Box(torch.ones(1))} for _ in range(4)]
    keys = describe_keys(samples)
    assert set(keys) == {"[*].x", "[*].meta.hidden", "[*].box.value"}  # the dict type still matched
    assert dict not in asked and Box in asked
    assert batch_type_of({"kind": "tagged"}).name == "test-tagged" and batch_type_of({"a": 1}).name == "mapping"


def test_the_types_that_declare_they_never_match_a_dict_do_not() -> None:
    """The adapters' types that declare ``dicts=False`` (DataProto-like objects, requests,
    TensorDicts) refuse dicts whatever their keys, so skipping them changes no answer."""
    declared = [t for t in batch_module._REGISTERED if not t.dicts]
    assert {t.name for t in declared} >= {"dataproto", "request", "tensordict"}
    shaped = [{}, {"batch": {"x": torch.ones(2)}, "non_tensor_batch": {}, "meta_info": {}},
              {"_batch": None, "_non_tensor_batch": None, "meta_info": {"global_step": 1}},
              {"meta_info": {"global_step": 1}}, {"batch_size": [2], "items": 1, "keys": 2}]
    assert not [(t.name, d) for t in declared for d in shaped if t.matches(d)]

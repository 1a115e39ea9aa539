"""Request matching: a mock run that asks for other data stops before it is served the recording.

The five ways of asking for other data of issue 26 (another batch size, prompts from a reseeded
loader, a loader shifted by one step, another sampling keyword, verl DataProto prompts that differ
at step 2), each against a dump recorded with ``get_batch(data, 8, global_step=s)``: the mock run
raises ReplayMismatchError before handing back the first mismatched step's batch, naming that
step. The control (same inputs) replays bit-identically with no error.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import json
import logging
import types
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cfg

from rollout_mock import MockScheduler, ReplayMismatchError, RolloutSettingsMismatchError
from rollout_mock.codec.structure import differing_keys, flatten_settings
from rollout_mock.config import MismatchPolicy
from rollout_mock.errors import FormatVersionError
from rollout_mock.wrap import matching, mismatch
from rollout_mock.wrap.matching import digest_request
from rollout_mock.wrap.mismatch import check_settings, differences

STEPS = 4


class Scheduler:
    """Generates from the prompts it is given: a batch the size of ``batch_size``."""

    def __init__(self) -> None:
        self.calls = 0

    def get_batch(self, data: Any, batch_size: int, global_step: int | None = None, **sampling: Any) -> dict[str, Any]:
        self.calls += 1
        prompts = data.batch["input_ids"] if hasattr(data, "batch") else data["input_ids"]
        gen = torch.Generator().manual_seed(1000 + self.calls)
        return {"prompts": prompts[:batch_size].clone(), "responses": torch.randint(0, 100, (batch_size, 6), generator=gen),
                "logprobs": torch.randn(batch_size, 6, generator=gen)}


def loader(seed: int = 0, skip: int = 0) -> Iterator[dict[str, torch.Tensor]]:
    """A seeded data loader of prompt batches (``skip``: start that many batches later)."""
    gen = torch.Generator().manual_seed(seed)
    batches = [{"input_ids": torch.randint(0, 50, (8, 5), generator=gen)} for _ in range(STEPS + 1)]
    yield from batches[skip:skip + STEPS]


def dataproto(step: int, *, changed: bool = False) -> Any:
    pytest.importorskip("verl", reason="verl is not installed (pip install --no-deps verl && pip install -e '.[verl]')")
    from tensordict import TensorDict
    from verl.protocol import DataProto

    gen = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 50, (8, 5), generator=gen)
    if changed:
        ids[3, 2] += 1
    uid = np.array([str(uuid.uuid4()) for _ in range(8)], dtype=object)  # verl's: random per run
    raw = np.array([f"prompt {step}-{i}" for i in range(8)], dtype=object)
    return DataProto(batch=TensorDict({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, batch_size=[8]),
                     non_tensor_batch={"uid": uid, "raw_prompt": raw},
                     meta_info={"global_steps": step, "temperature": 1.0})


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    dump = tmp_path / "dump"
    batches = []
    with MockScheduler(Scheduler(), cfg(dump)) as mock:
        for step, data in zip(range(STEPS), loader()):
            batches.append(mock.get_batch(data, 8, global_step=step, temperature=1.0))
    return dump, batches


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def replay(dump: Path, calls: Iterator[tuple[Any, int, dict[str, Any]]], **extra: Any) -> list[Any]:
    served: list[Any] = []
    with MockScheduler(None, cfg(dump, "mock", **extra), spec=Scheduler) as mock:
        for step, (data, size, kwargs) in enumerate(calls):
            served.append(mock.get_batch(data, size, global_step=step, **kwargs))
    return served


# ------------------------------------------------------------------------------ the control
def test_the_same_inputs_replay_bit_identically(recorded: tuple[Path, list[Any]],
                                                caplog: pytest.LogCaptureFixture) -> None:
    dump, batches = recorded
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    served = replay(dump, ((d, 8, {"temperature": 1.0}) for d in loader()))
    assert len(served) == STEPS and all(same(a, b) for a, b in zip(served, batches))
    assert "asks for other data" not in caplog.text and "cannot be matched" not in caplog.text


# ------------------------------------------------------------------------------ the five ways
def _served_before_error(dump: Path, calls: list[tuple[Any, int, dict[str, Any]]]) -> tuple[list[Any], Any]:
    served: list[Any] = []
    with MockScheduler(None, cfg(dump, "mock"), spec=Scheduler) as mock:
        with pytest.raises(ReplayMismatchError) as info:
            for step, (data, size, kwargs) in enumerate(calls):
                served.append(mock.get_batch(data, size, global_step=step, **kwargs))
    return served, info.value


def test_another_batch_size_stops_at_the_first_step(recorded: tuple[Path, list[Any]]) -> None:
    served, error = _served_before_error(recorded[0], [(d, 4, {"temperature": 1.0}) for d in loader()])
    assert served == [] and error.step == 0 and error.argument == "batch_size"
    assert "train step 0" in str(error) and "batch_size: 8 in the dump run, 4 now" in str(error)
    assert (error.recorded, error.live) == ("8", "4")


def test_prompts_of_a_reseeded_loader_stop_at_the_first_step(recorded: tuple[Path, list[Any]]) -> None:
    served, error = _served_before_error(recorded[0], [(d, 8, {"temperature": 1.0}) for d in loader(seed=1)])
    assert served == [] and error.step == 0 and error.argument == "data.input_ids"
    assert "first difference at [0, 0]" in str(error)  # the index and both values
    assert error.recorded != error.live and error.nearest is None


def test_a_loader_shifted_by_one_step_is_named_with_the_offset_that_fixes_it(recorded: tuple[Path, list[Any]]) -> None:
    dump, batches = recorded
    served, error = _served_before_error(dump, [(d, 8, {"temperature": 1.0}) for d in loader(skip=1)])
    assert served == [] and error.step == 0 and error.nearest == 1
    assert "step_offset: 1 maps it" in str(error)
    # the fix it names works: the shifted run replays the dump's steps 1.. bit for bit
    fixed = replay(dump, ((d, 8, {"temperature": 1.0}) for d in list(loader(skip=1))[: STEPS - 1]), step_offset=1)
    assert all(same(a, b) for a, b in zip(fixed, batches[1:]))


def test_another_sampling_keyword_stops_at_the_first_step(recorded: tuple[Path, list[Any]]) -> None:
    served, error = _served_before_error(recorded[0], [(d, 8, {"temperature": 0.7}) for d in loader()])
    assert served == [] and error.step == 0 and error.argument == "temperature"
    assert "temperature: 1.0 in the dump run, 0.7 now" in str(error)


def test_verl_dataproto_prompts_that_differ_at_step_2(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    # the step comes from meta_info["global_steps"]; verl's volatile fields (the uid) are not compared
    with MockScheduler(Scheduler(), cfg(dump), framework="verl") as mock:
        recorded = [mock.get_batch(dataproto(step), 8) for step in range(STEPS)]
    served: list[Any] = []
    with MockScheduler(None, cfg(dump, "mock"), spec=Scheduler, framework="verl") as mock:
        with pytest.raises(ReplayMismatchError) as info:
            for step in range(STEPS):
                served.append(mock.get_batch(dataproto(step, changed=step == 2), 8))
    assert len(served) == 2 and all(same(a, b) for a, b in zip(served, recorded))  # uid (random) not compared
    error = info.value
    assert error.step == 2 and error.argument == "data.batch.input_ids" and "train step 2" in str(error)
    assert "first difference at [3, 2]" in str(error) and int(error.live) == int(error.recorded) + 1
    # the control of this shape: every step of the same prompts, fresh uids, replays
    with MockScheduler(None, cfg(dump, "mock"), spec=Scheduler, framework="verl") as mock:
        again = [mock.get_batch(dataproto(step), 8) for step in range(STEPS)]
    assert all(same(a, b) for a, b in zip(again, recorded))


# ------------------------------------------------------------------------------ options
def test_on_mismatch_warn_serves_and_says_so(recorded: tuple[Path, list[Any]], caplog: pytest.LogCaptureFixture) -> None:
    dump, batches = recorded
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    served = replay(dump, ((d, 4, {"temperature": 1.0}) for d in loader()), on_mismatch="warn")
    assert all(same(a, b) for a, b in zip(served, batches))
    assert caplog.text.count("asks for other data") == 1


def test_match_on_names_what_is_compared(recorded: tuple[Path, list[Any]]) -> None:
    dump, batches = recorded
    # only the prompts: another sampling keyword is accepted
    served = replay(dump, ((d, 8, {"temperature": 0.7}) for d in loader()), match_on=["data.input_ids"])
    assert all(same(a, b) for a, b in zip(served, batches))
    # the step alone: as before request matching
    served = replay(dump, ((d, 4, {}) for d in loader(seed=3)), match_on=["step"])
    assert all(same(a, b) for a, b in zip(served, batches))
    with pytest.raises(ReplayMismatchError, match="batch_size"):
        replay(dump, ((d, 4, {"temperature": 1.0}) for d in loader()), match_on=["batch_size"])


def test_a_match_key_per_method(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    key = {"get_batch": lambda arguments: {"prompts": arguments["data"]["input_ids"]}}
    with MockScheduler(Scheduler(), cfg(dump), match_keys=key) as mock:
        recorded = [mock.get_batch(d, 8, global_step=s, temperature=1.0) for s, d in zip(range(2), loader())]
    with MockScheduler(None, cfg(dump, "mock"), spec=Scheduler) as mock:
        mock.match_key("get_batch", key["get_batch"])
        served = [mock.get_batch(d, 8, global_step=s, temperature=0.5) for s, d in zip(range(2), loader())]
        assert all(same(a, b) for a, b in zip(served, recorded))
        with pytest.raises(ReplayMismatchError, match="prompts"):
            mock.get_batch(next(loader(seed=9)), 8, global_step=0)


def test_a_dump_without_request_digests_replays_with_one_warning(recorded: tuple[Path, list[Any]], tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    old = tmp_path / "old"
    with MockScheduler(Scheduler(), cfg(old, match_on=["step"])) as mock:  # records no digest, as before
        batches = [mock.get_batch(d, 8, global_step=s) for s, d in zip(range(STEPS), loader())]
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    served = replay(old, ((d, 4, {}) for d in loader(seed=5)))
    assert all(same(a, b) for a, b in zip(served, batches))
    lines = [r for r in caplog.records if "cannot be matched" in r.getMessage()]
    assert len(lines) == 1


def test_rollout_settings_are_checked_before_the_first_call(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    settings = {"n": 4, "sampling": {"temperature": 1.0, "top_p": 0.9}, "max_tokens": 16}
    with MockScheduler(Scheduler(), cfg(dump), rollout_settings=settings) as mock:
        mock.get_batch(next(loader()), 8, global_step=0)
    MockScheduler(None, cfg(dump, "mock"), spec=Scheduler, rollout_settings=settings).close()
    other = {"n": 2, "sampling": {"temperature": 0.7, "top_p": 0.9}, "seed": 1}
    with pytest.raises(RolloutSettingsMismatchError) as info:
        MockScheduler(None, cfg(dump, "mock"), spec=Scheduler, rollout_settings=other)
    assert [d[0] for d in info.value.differences] == ["max_tokens", "n", "sampling.temperature", "seed"]
    assert "n: 4 in the dump run, 2 now" in str(info.value) and "max_tokens: 16 in the dump run, '<absent>'" \
        in str(info.value)



def test_rollout_settings_are_compared_by_the_engines_equality() -> None:
    """The pre-flight check flattens the live settings as the dump run's were recorded and compares
    them with the structural engine's equality (codec.structure.differing_keys, same_value): a
    NaN setting (recorded as JSON text) equals itself, ``[1, 2]`` recorded equals ``(1, 2)`` now,
    numbers are equal by value however the config spells them (``1`` -> ``1.0``, ``True`` -> ``1``),
    and a change of value or of kind (a number -> its text) is a difference, named with both values."""
    recorded = flatten_settings({"s": {"eps": float("nan"), "stop": (1, 2), "n": 1, "greedy": True, "t": 0.5}})
    recorded = json.loads(json.dumps(recorded))  # as the dump holds it
    context = {"mode": "mock", "path": "/d", "stream": "train"}
    check_settings(recorded, {"s": {"eps": float("nan"), "stop": (1, 2), "n": 1, "greedy": True, "t": 0.5}},
                   policy=MismatchPolicy.ERROR, context=context)
    check_settings(recorded, {"s": {"eps": float("nan"), "stop": [1, 2], "n": 1.0, "greedy": 1, "t": 0.5}},
                   policy=MismatchPolicy.ERROR, context=context)
    with pytest.raises(RolloutSettingsMismatchError) as info:
        check_settings(recorded, {"s": {"eps": 0.0, "stop": [1, 2], "n": "1", "greedy": True, "t": 0.7}},
                       policy=MismatchPolicy.ERROR, context=context)
    assert list(info.value.differences) == [("s.eps", "NaN", 0.0), ("s.n", 1, "1"), ("s.t", 0.5, 0.7)]
    assert "s.t: 0.5 in the dump run, 0.7 now" in str(info.value)
    assert differing_keys({"a": 1, "b": float("nan")}, {"b": float("nan"), "c": 2}) == ["a", "c"]

# ------------------------------------------------------------------------------ digests
def test_digest_is_by_content_and_ignores_dict_order_and_volatile_fields() -> None:
    a = {"x": torch.arange(6).reshape(2, 3), "meta": {"b": 1, "a": [1.0, float("nan")]}, "uid": "1"}
    b = {"meta": {"a": [1.0, float("nan")], "b": 1}, "uid": "2", "x": torch.arange(6).reshape(2, 3).clone()}
    assert digest_request({"d": a}, volatile=["d.uid"]).digest == digest_request({"d": b}, volatile=["d.uid"]).digest
    assert digest_request({"d": a}, volatile=[]).digest != digest_request({"d": b}, volatile=[]).digest
    c = {**a, "x": a["x"].to(torch.int32)}
    found = differences(digest_request({"d": a}, volatile=["uid"]), digest_request({"d": c}, volatile=["uid"]))
    assert found[0].path == "d.x" and "dtype int64 in the dump run, int32 now" in found[0].what
    long_a, long_b = torch.zeros(1000), torch.zeros(1000)
    long_b[700] = 1.0
    found = differences(digest_request({"t": long_a}), digest_request({"t": long_b}))
    assert found[0].what.startswith("first difference in rows 625-749 of 1000")
    for value in (torch.zeros(3, dtype=torch.bfloat16), np.array(["a", "b"], dtype=object), [1, 2**70, "x"],
                  {3: None}, (1, 2.5), b"bytes", {1, 2}, torch.zeros(2, 2).t()):
        assert digest_request({"v": value}).digest == digest_request({"v": value}).digest


def test_a_digest_does_not_depend_on_which_nodes_are_kept(tmp_path: Path) -> None:
    """match_on keeps extra nodes; it must not change a digest (dump and mock may differ in it)."""
    value = {"a": torch.arange(100).reshape(20, 5), "b": [f"s{i}" for i in range(40)],
             "c": [{"x": i, "y": "s"} for i in range(40)], "d": np.array([{"k": 1}] * 20, dtype=object),
             "e": {"f": list(range(30)), "g": {"h": [0.5] * 50}}}
    value["t"] = [torch.full((3, i + 1), float(i)) for i in range(20)]  # digested by blocks, kept or not
    value["n"] = [0.5 * i for i in range(40)]
    plain = digest_request({"v": value})
    forced = digest_request({"v": value}, forced=["v.e.g.h", "v.c", "v.t", "v.n"])
    nested = digest_request({"v": [value]})  # inside a list: nothing kept below
    assert plain.digest == forced.digest
    assert {n.path for n in forced.nodes} >= {"v.e.g.h", "v.c", "v.t", "v.n"}
    assert nested.nodes[0].info["len"] == 1 and len(nested.nodes) == 1
    dump = tmp_path / "dump"
    with MockScheduler(Scheduler(), cfg(dump, match_on=["data.input_ids"])) as mock:
        recorded = [mock.get_batch(d, 8, global_step=s) for s, d in zip(range(2), loader())]
    served = replay(dump, ((d, 8, {}) for d in list(loader())[:2]))  # match_on unset here
    assert all(same(a, b) for a, b in zip(served, recorded))


class Sampler:
    """A rollout without a step argument (the counter numbers its calls) that draws from torch's RNG."""

    def get_batch(self, data: Any) -> dict[str, Any]:
        return {"x": data["input_ids"].float() + torch.rand(8, 5)}


def test_the_generic_wrapper_resumes_from_its_state_dict(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    torch.manual_seed(0)
    with MockScheduler(Sampler(), cfg(dump, replay_rng=True)) as mock:
        recorded = []
        for i, data in enumerate(loader()):
            recorded.append(mock.get_batch(data))
            if i == 1:  # a checkpoint: the wrapper's position and the trainer's RNG
                state, rng = mock.state_dict(), torch.get_rng_state()
        after = torch.rand(3)  # what the training side draws next
    torch.set_rng_state(rng)
    with MockScheduler(None, cfg(dump, "mock", replay_rng=True), spec=Sampler) as mock:
        mock.load_state_dict(state)
        served = [mock.get_batch(data) for data in list(loader())[2:]]
        assert torch.equal(torch.rand(3), after)
    assert all(same(a, b) for a, b in zip(served, recorded[2:])) and len(served) == STEPS - 2
    # a resume that forgot the wrapper's state: its counter says 0, its data is the third batch
    with MockScheduler(None, cfg(dump, "mock"), spec=Sampler) as mock:
        with pytest.raises(ReplayMismatchError) as info:
            mock.get_batch(list(loader())[2])
        assert info.value.step == 0 and info.value.nearest == 2 and "step_offset: 2 maps it" in str(info.value)
        with pytest.raises(Exception, match="state is of stream 'val'"):
            mock.load_state_dict({"rollout_mock": {**state["rollout_mock"], "stream": "val"}})


def test_what_differs_between_faithful_runs_is_not_compared() -> None:
    """The adapters' volatile fields (registered when rollout_mock is imported), each of its own
    framework's calls: verl's uid and timing, ROLL's trace context."""
    def request(stamp: float, ident: str, temperature: float = 1.0) -> dict[str, Any]:
        return {"data": {"meta_info": {"timing": stamp, "temperature": temperature,
                                       "_otel_ctx": {"traceparent": ident}},
                         "non_tensor_batch": {"uid": np.array([ident], dtype=object)}}}

    verl = [digest_request(request(1.0, "a"), framework="verl"), digest_request(request(2.0, "a"), framework="verl")]
    assert verl[0].digest == verl[1].digest
    assert digest_request(request(1.0, "b"), framework="verl").digest != verl[0].digest  # the trace id: ROLL's
    roll = [digest_request(request(1.0, "a"), framework="roll"), digest_request(request(1.0, "b"), framework="roll")]
    assert roll[0].digest != roll[1].digest  # the uid: verl's
    assert digest_request(request(2.0, "b", 0.7), framework="verl").digest != verl[0].digest


def test_volatile_fields_are_per_framework_and_the_generic_wrapper_compares_every_field() -> None:
    """Issue 35: every adapter's patterns applied to every call, the generic wrapper's too, so a
    changed session_id, spec_info, non_generation_time, any *uuid* field or a meta_info timeout
    replayed silently everywhere."""
    base = {"meta_info": {"timeout": 30, "max_time": 5.0}, "rows": [{"session_id": "s", "sample_uuid": "u",
                                                                     "spec_info": 1, "non_generation_time": 0.5}]}
    for path, other in (("meta_info.timeout", 60), ("meta_info.max_time", 9.0), ("rows.session_id", "t"),
                        ("rows.sample_uuid", "v"), ("rows.spec_info", 2), ("rows.non_generation_time", 0.7)):
        changed = copy.deepcopy(base)
        part, key = path.split(".")
        (changed[part][0] if part == "rows" else changed[part])[key] = other
        for framework in (None, "verl", "roll", "areal", "trl"):
            assert digest_request({"data": base}, framework=framework).digest != \
                digest_request({"data": changed}, framework=framework).digest, (path, framework)
    slime = [copy.deepcopy(base) for _ in range(2)]
    slime[1]["rows"][0].update(session_id="t", spec_info=2, non_generation_time=0.7)
    assert digest_request({"data": slime[0]}, framework="slime").digest == \
        digest_request({"data": slime[1]}, framework="slime").digest


def test_a_generic_wrapper_refuses_a_changed_session_id(tmp_path: Path) -> None:
    class Rollout:
        def get_batch(self, data: Any, global_step: int) -> dict[str, Any]:
            return {"x": torch.ones(2)}

    cfg = {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}
    with MockScheduler(Rollout(), cfg) as rollout:
        rollout.get_batch({"session_id": "a", "meta_info": {"timeout": 10}}, 0)
    with MockScheduler(None, {**cfg, "mode": "mock"}, spec=Rollout) as replay, \
            pytest.raises(ReplayMismatchError, match="session_id"):
        replay.get_batch({"session_id": "b", "meta_info": {"timeout": 10}}, 0)
    with MockScheduler(None, {**cfg, "mode": "mock"}, spec=Rollout) as replay, \
            pytest.raises(ReplayMismatchError, match="timeout"):
        replay.get_batch({"session_id": "a", "meta_info": {"timeout": 20}}, 0)


# ------------------------------------------------------------------------------ fast paths
def _d(value: Any) -> int:
    return digest_request({"v": value}, volatile=["rows.[].sample_uuid"]).digest


def _samples(n: int = 40) -> list[dict[str, Any]]:
    """slime-like samples: token and log-prob lists, strings, a nested dict, a volatile id."""
    return [{"tokens": list(range(i, i + 300)), "logprobs": [-0.25 * j for j in range(300)], "prompt": f"p{i}",
             "reward": float(i), "meta": {"source": "math", "tags": ["a", "b"]}, "sample_uuid": str(uuid.uuid4())}
            for i in range(n)]


def test_equal_values_digest_alike_whichever_path_they_take() -> None:
    """Lists are digested by blocks, dicts in lists by column, tensors in lists by their bytes in
    place: a value built otherwise (dict order, a tensor that is not contiguous, requires grad,
    is bfloat16, a random id) digests alike."""
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    samples = _samples()
    reordered = [dict(reversed(list(s.items())), sample_uuid="other") for s in samples]
    for one, other in [
        ({"rows": samples}, {"rows": reordered}),
        ([t, t.clone()], [t.clone().requires_grad_(), t.t().contiguous().t()]),
        ([t.t()] * 20, [t.t().contiguous()] * 20),
        ([t.to(torch.bfloat16)] * 3, [t.to(torch.bfloat16).clone() for _ in range(3)]),
        ([{"a": 1, "b": [1, 2]}] * 20, [{"b": [1, 2], "a": 1}] * 20),
        ([[{"role": "user", "content": "x"}]] * 30, [[{"content": "x", "role": "user"}]] * 30),
        (np.array([{"k": 1, "j": "s"}] * 20, dtype=object), np.array([{"j": "s", "k": 1}] * 20, dtype=object)),
    ]:
        assert _d(one) == _d(other)
    loop: list[Any] = []
    loop.append(loop)  # a list holding itself terminates
    assert _d(loop) == _d(loop)


def test_every_difference_changes_the_digest() -> None:
    """The paths that digest many items in one call see every item: one changed value, dtype,
    shape or key anywhere changes the digest."""
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    base = _samples()
    changes = []
    for key, index, value in [("tokens", 150, -1), ("logprobs", 299, 0.5), ("prompt", None, "q"), ("reward", None, 7.5)]:
        other = [dict(s) for s in base]
        row = other[33]
        row[key] = value if index is None else [*row[key][:index], value, *row[key][index + 1:]]
        changes.append(({"rows": base}, {"rows": other}))
    extra_key = [dict(s) for s in base]
    extra_key[5]["extra"] = 1
    changes += [
        ({"rows": base}, {"rows": extra_key}),
        ([t] * 20, [t] * 19 + [t.reshape(6, 4)]),  # same bytes, other shape
        ([t] * 3, [t, t, t.view(torch.int32)]),  # same bytes, other dtype
        ([t] * 3, [t, t, t + 1e-6]),
        ([np.arange(3)] * 20, [np.arange(3)] * 19 + [np.arange(3, dtype=np.int32)]),
        ([2**70], [2**70 + 1]),  # beyond int64: exact
        ([1.5, 2.0, -3], [1.5, 2.0, -4]),
        (["\ud800", "x"], ["\ud801", "x"]),
        ([[1, 2]] * 10, [[1, 2]] * 9 + [[1, 3]]),
        ([list(range(100))] * 10, [list(range(100))] * 9 + [[*range(99), -1]]),
    ]
    for one, other in changes:
        assert _d(one) != _d(other), (one, other)


def test_a_list_mixing_scalars_and_dicts_ignores_dict_order() -> None:
    """Fails on the first digest, which packed a list whose first item is a scalar in one
    msgpack call, dicts inside in insertion order: a dict built in another order was another
    request."""
    assert _d(["a", {"x": 1, "y": 2}]) == _d(["a", {"y": 2, "x": 1}])
    assert _d([1, {"x": [1, {"p": 0, "q": 1}]}]) == _d([1, {"x": [1, {"q": 1, "p": 0}]}])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_tensors_digest_as_their_host_copies() -> None:
    t = torch.randn(64, 32)
    for value in (t, [t] * 20, [{"x": t, "y": t[:, 0]}] * 20):
        on_gpu = value.cuda() if isinstance(value, torch.Tensor) else \
            [v.cuda() if isinstance(v, torch.Tensor) else {k: x.cuda() for k, x in v.items()} for v in value]
        assert _d(value) == _d(on_gpu)


def test_a_difference_deep_in_a_list_of_samples_names_its_block() -> None:
    samples = _samples(64)
    other = [dict(s) for s in samples]
    other[50] = {**other[50], "tokens": [*other[50]["tokens"][:-1], -1]}
    found = differences(digest_request({"data": samples}), digest_request({"data": other}))
    assert found[0].path == "data" and "first difference in items 48-55 of 64" in found[0].what  # past the row CRCs
    samples = _samples(80)
    other = [dict(s) for s in samples]
    other[70] = {**other[70], "tokens": [*other[70]["tokens"][:-1], -1]}
    found = differences(digest_request({"data": samples}), digest_request({"data": other}))
    assert found[0].path == "data" and "first difference in items 70-79 of 80" in found[0].what
    trajectories = [{"input_ids": torch.arange(i, i + 50).reshape(1, 50), "rewards": torch.ones(1)} for i in range(32)]
    changed = [dict(t) for t in trajectories]
    changed[3] = {**changed[3], "rewards": torch.zeros(1)}
    found = differences(digest_request({"data": trajectories}), digest_request({"data": changed}))
    assert found[0].what == "first difference in row 3 (only the first 2 rows' values are kept)"


def test_the_recorded_request_stays_small() -> None:
    """At most MAX_NODES nodes and MAX_STRUCTURE_BYTES of them, whatever the request holds; what
    the bound left out is counted."""
    big = {f"column_{i}": torch.randn(256, 64) for i in range(200)}
    request = digest_request({"data": {"batch": big, "rows": _samples(512), "meta": {"temperature": 1.0}}})
    assert len(json.dumps(request.to_json(), separators=(",", ":"))) < matching.MAX_STRUCTURE_BYTES + 500
    assert len(request.nodes) <= matching.MAX_NODES and request.dropped > 0


def test_a_call_recorded_with_another_digest_format_is_not_compared(
        recorded: tuple[Path, list[Any]], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Fails on the first digest, which took another format's call for one recorded without
    digests: it served the batches with a warning that did not say why."""
    dump, batches = recorded
    monkeypatch.setattr(matching, "REQUEST_FORMAT", matching.REQUEST_FORMAT + 1)
    monkeypatch.setattr(mismatch, "REQUEST_FORMAT", matching.REQUEST_FORMAT, raising=False)
    with pytest.raises(FormatVersionError) as info:
        replay(dump, ((d, 8, {"temperature": 1.0}) for d in loader()))
    assert "recorded with another digest format" in str(info.value) and "match_on: [step]" in str(info.value)
    assert info.value.step == 0
    # the fixes it names: the step alone picks the batches; warn serves them, said once
    served = replay(dump, ((d, 8, {"temperature": 1.0}) for d in loader()), match_on=["step"])
    assert all(same(a, b) for a, b in zip(served, batches))
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    served = replay(dump, ((d, 8, {"temperature": 1.0}) for d in loader()), on_mismatch="warn")
    assert all(same(a, b) for a, b in zip(served, batches)) and len(served) == STEPS
    assert caplog.text.count("recorded with another digest format") == 1


# ------------------------------------------------------------------------------ object columns (issue 35)
def _verl_request(seed: int) -> dict[str, Any]:
    """verl's gen_batch after a data-seed change: raw_prompt and extra_info's index both differ."""
    order = np.random.default_rng(seed).permutation(20)[:8]
    raw_prompt = np.empty(8, dtype=object)
    raw_prompt[:] = [[{"role": "user", "content": f"What is {i} + {3 * i}? Think step by step."}] for i in order]
    return {"prompts": {"non_tensor_batch": {
        "raw_prompt": raw_prompt,
        "extra_info": np.array([{"index": int(i), "split": "train"} for i in order], dtype=object),
        "uid": np.array([str(uuid.uuid4()) for _ in range(8)], dtype=object)}}}


def test_an_object_column_names_the_prompts_the_first_row_and_both_values() -> None:
    """It said "prompts.non_tensor_batch.extra_info: same array object [8], other contents"."""
    found = differences(digest_request(_verl_request(1), framework="verl"),
                        digest_request(_verl_request(2), framework="verl"))
    assert found[0].path == "prompts.non_tensor_batch.raw_prompt"
    assert found[0].what.startswith("row 0: [{'content': 'What is 1 + 3? Think step by step.'")
    assert "in the dump run, [{'content': 'What is 6 + 18? Think step by step.'" in found[0].what
    assert "What is 1 + 3" in found[0].recorded and "What is 6 + 18" in found[0].live


def test_a_list_of_prompt_dicts_names_the_row_and_key() -> None:
    """AReaL's rollout_batch(data): it said "data: same list of 4, other contents"."""
    def data(changed_row: int | None) -> dict[str, Any]:
        rows = [{"messages": [{"role": "user", "content": f"question {i}"}], "answer": str(i)} for i in range(40)]
        if changed_row is not None:
            rows[changed_row]["messages"][0]["content"] = "another question"
        return {"data": rows}

    found = differences(digest_request(data(None)), digest_request(data(1)))
    assert found[0].what == ("row 1, key 'messages': [{'content': 'question 1', 'role': 'user'}] in the dump run, "
                             "[{'content': 'another question', 'role': 'user'}] now"), found[0].what
    far = differences(digest_request(data(None)), digest_request(data(12)))
    assert far[0].path == "data" and far[0].what.startswith("first difference in row 12 (only the first 2 rows'")
    farther = differences(digest_request(data(None)), digest_request(data(30)))  # past the row CRCs: its block
    assert farther[0].what.startswith("first difference in items 30-34 of 40"), farther[0].what
    long_text = differences(digest_request({"p": [["x" * 150 + "a"], ["y"]]}), digest_request({"p": [["x" * 150 + "b"],
                                                                                                   ["y"]]}))
    assert "xa']" in long_text[0].recorded and "xb']" in long_text[0].live  # a window around the difference


def test_a_dump_of_another_method_names_both_methods_before_any_other_check(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """slime's adapter on a verl dump raised a mismatch about data_source/prompts with generic
    fixes, after a false "recorded without rollout settings" warning."""
    import logging

    from rollout_mock import MockScheduler, ReplayMismatchError

    class Verl:
        def generate_sequences(self, prompts: Any) -> dict[str, Any]:
            return {"responses": [1, 2, 3], "global_steps": 0}

    dump = tmp_path / "verl"
    with MockScheduler(Verl(), {"enable": True, "mode": "dump", "dump_dir": str(dump)},
                       methods=("generate_sequences",)) as mock:
        mock.generate_sequences({"global_steps": 0})
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    with pytest.raises(ReplayMismatchError) as info:
        MockScheduler(None, {"enable": True, "mode": "mock", "dump_dir": str(dump)}, methods=("generate_rollout",),
                      rollout_settings={"rollout_batch_size": 4})
    message = str(info.value)
    assert "recorded `generate_sequences`; this run calls `generate_rollout`" in message, message
    assert str(dump) in message and "mode=mock" in message
    assert "without rollout settings" not in caplog.text


def test_the_first_differing_row_leaves_volatile_fields_out() -> None:
    def rows(changed: int | None) -> dict[str, Any]:
        return {"data": [{"uid": str(uuid.uuid4()), "prompt": "changed" if i == changed else f"p{i}"}
                         for i in range(8)]}

    same_rows = differences(digest_request(rows(None), volatile=["uid"]), digest_request(rows(None), volatile=["uid"]))
    assert same_rows == []
    found = differences(digest_request(rows(None), volatile=["uid"]), digest_request(rows(3), volatile=["uid"]))
    assert found[0].what.startswith("first difference in row 3 ("), found[0].what
    found = differences(digest_request(rows(None), volatile=["uid"]), digest_request(rows(1), volatile=["uid"]))
    assert found[0].what == "row 1, key 'prompt': p1 in the dump run, changed now", found[0].what


# ----------------------------------------------------------------------------- the v2 digests stay
class PinColor(enum.Enum):
    RED = 1


@dataclasses.dataclass
class PinSampling:
    temperature: float
    stop: list[str]
    extra: dict[str, float]


class PinKeyProxy:
    """keys() and [key], not a Mapping: digested by its type's name."""

    def keys(self) -> set[str]:
        return {"a"}

    def __getitem__(self, key: str) -> int:
        return 1


class PinRecord:
    """to_dict(): digested by its type's name."""

    def to_dict(self) -> dict[str, int]:
        return {"x": 1}


class PinWithMeta:
    """An object carrying only ``meta_info``: a registered batch type (``request``)."""

    def __init__(self) -> None:
        self.meta_info = {"temperature": 0.5, "n": 2}


#: Each kind of value's request digest as rollout_mock d84ad52 recorded it (format 2): a dump of
#: that version replays only while an equal call digests to the same CRC.
PINNED_DIGESTS = {
    "enum": 2572969259, "dataclass": 1770739433, "namespace": 1099539091, "set": 851985003, "callable": 648377189,
    "partial": 3257631452, "proxy": 3839682046, "record": 532275689, "meta": 2872994719, "numpy_scalar": 2453687546,
    "tensor": 658484244, "array": 2133130050, "rows": 4212859171, "slime": 726086869,
}


def test_digests_of_every_kind_are_the_ones_older_dumps_recorded() -> None:
    """The request digest classifies values with the structure engine's dispatch
    (rollout_mock.codec.structure.kind_of); every kind still digests to the CRC d84ad52 recorded."""
    values = {
        "enum": PinColor.RED, "dataclass": PinSampling(0.7, ["</s>"], {"top_p": 1.0}),
        "namespace": types.SimpleNamespace(n=4, mode="greedy"), "set": {3, 1, 2}, "callable": len,
        "partial": functools.partial(max, 1), "proxy": PinKeyProxy(), "record": PinRecord(), "meta": PinWithMeta(),
        "numpy_scalar": np.float32(1.5), "tensor": torch.arange(6).reshape(2, 3),
        "array": np.arange(4, dtype=np.int32), "rows": [{"role": "user", "content": "hi"}] * 3,
        "slime": {"samples": [{"tokens": [1, 2], "reward": 1.0}]},
    }
    assert {name: digest_request({name: value}).digest for name, value in values.items()} == PINNED_DIGESTS
    assert digest_request(values).digest == 2886966620


def _fast_paths() -> dict[str, Any]:
    """One argument per fast path of the digest encoding (format 2)."""
    gen = torch.Generator().manual_seed(3)
    deep: Any = 0
    for i in range(18):
        deep = {f"k{i}": deep, "side": i}
    return {
        "ids": list(range(40)), "neg": [-3, 5] * 10, "floats": [0.5, 1, float("nan"), -0.0] * 5,
        "huge": [2**70, 1], "texts": ["a", "b\ud800", None] * 6,
        "rows": [{"role": "user", "content": f"m{i}", "uid": i} for i in range(20)],
        "tokens": [[i, i + 1] for i in range(20)], "long_tokens": [list(range(100 + i)) for i in range(3)],
        "tensors": [torch.arange(4) * i for i in range(18)], "arrays": [np.arange(3.0) + i for i in range(3)],
        "t": torch.randint(0, 100, (32, 4), generator=gen), "bf": torch.ones(3, dtype=torch.bfloat16),
        "flat": {f"k{i:03d}": i for i in range(200)}, "deep": deep,
        "meta_info": {"global_steps": 3, "temperature": 1.0}, "non_tensor_batch": {"uid": ["x"], "a": [1]},
    }


def test_the_fast_paths_digest_as_older_dumps_recorded_them() -> None:
    """Each fast path of the encoding (a list of uint64, int64 or float64 numbers with its block
    prefix CRCs, one msgpack call of plain scalars, dict rows by column with a volatile key left
    out, token lists one level flatter or one array each, tensor and array blocks, a flat dict, a
    tree past the node depth, step keys of a metadata part) digests to the CRC, and the whole
    record (every kept node's CRC and summary) to the JSON, that 5118bf4 recorded, when the walk
    was in wrap/matching.py: the walk's move to codec/structure.py changed no bit."""
    request = digest_request(_fast_paths(), framework="verl")
    assert {n.path: n.digest for n in request.nodes if "." not in n.path} == {
        "arrays": 687594240, "bf": 546956728, "deep": 3440167301, "flat": 1645454202, "floats": 908704526,
        "huge": 2086604809, "ids": 1281125646, "long_tokens": 1778635613, "meta_info": 383822156,
        "neg": 1944035173, "non_tensor_batch": 2914849214, "rows": 3110763007, "t": 2168428702,
        "tensors": 3607950015, "texts": 3582400095, "tokens": 949869289}
    assert (request.digest, len(request.nodes), request.dropped) == (1179633952, 128, 122)
    assert zlib.crc32(json.dumps(request.to_json(), sort_keys=True).encode()) == 554587010


def test_a_dataproto_digests_as_older_dumps_recorded_it() -> None:
    pytest.importorskip("verl", reason="verl is not installed (pip install rollout_mock[verl])")
    from tensordict import TensorDict
    from verl.protocol import DataProto

    data = DataProto(batch=TensorDict({"input_ids": torch.arange(6).reshape(2, 3)}, batch_size=[2]),
                     non_tensor_batch={"raw_prompt": np.array(["a", "b"], dtype=object)},
                     meta_info={"temperature": 1.0})
    request = digest_request({"data": data})
    assert request.digest == 2070909719
    assert request.get("data") is not None and request.get("data").info["k"] == "dataproto"  # type: ignore[union-attr]

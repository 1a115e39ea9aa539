"""Named matchers and the recorded request's structure (issue 36, item 2).

``match_on`` names matchers (``register_matcher``, as vcrpy's) or dotted paths; a path is
matched against the structure the dump run recorded, which goes deep (``data.a.b.c.d.e``), so a
difference is explained at its real path with both values. Before, the dump kept 24 nodes to
depth 4: ``match_on: [data.a.b.c.d.e]`` was refused and a deep difference read "same dict of 1,
other contents".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cfg

import rollout_mock
from rollout_mock import ConfigError, MockScheduler, ReplayMismatchError
from rollout_mock.wrap import matching, mismatch
from rollout_mock.wrap.matching import Request, digest_request
from rollout_mock.wrap.mismatch import differences

STEPS = 3


class Scheduler:
    def get_batch(self, data: Any, batch_size: int, global_step: int | None = None) -> dict[str, Any]:
        return {"responses": data["input_ids"][:batch_size] + 1}


def deep(value: Any) -> dict[str, Any]:
    return {"a": {"b": {"c": {"d": {"e": value, "f": "same"}}}}}


def data(step: int, *, e: Any = None, seed: int = 0, rows: int = 8) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed * 100 + step)
    return {"input_ids": torch.randint(0, 50, (rows, 5), generator=gen), **deep(step if e is None else e)}


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    """A dump recorded without match_on: nothing tells the dump run which paths matter."""
    path = tmp_path / "dump"
    with MockScheduler(Scheduler(), cfg(path)) as mock:
        for step in range(STEPS):
            mock.get_batch(data(step), 8, global_step=step)
    return path


def replay(path: Path, calls: Iterator[dict[str, Any]], **extra: Any) -> list[Any]:
    served = []
    with MockScheduler(None, cfg(path, "mock", **extra), spec=Scheduler) as mock:
        for step, value in enumerate(calls):
            served.append(mock.get_batch(value, 8, global_step=step))
    return served


@pytest.fixture
def matchers(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The matcher registry, put back after the test."""
    monkeypatch.setattr(mismatch, "_MATCHERS", {})
    return mismatch._MATCHERS


def test_a_deep_match_on_path_matches_what_it_names(dump: Path) -> None:
    """Other prompts, the same ``data.a.b.c.d.e``: served. Before: ConfigError, the path was
    past the 24 nodes to depth 4 the dump kept."""
    served = replay(dump, (data(s, seed=7) for s in range(STEPS)), match_on=["data.a.b.c.d.e"])
    assert len(served) == STEPS


def test_a_deep_match_on_path_that_differs_is_explained_at_that_path(dump: Path) -> None:
    with pytest.raises(ReplayMismatchError) as info:
        replay(dump, (data(s, e=s + 40) for s in range(STEPS)), match_on=["data.a.b.c.d.e"])
    error = info.value
    assert error.step == 0 and error.argument == "data.a.b.c.d.e"
    assert (error.recorded, error.live) == ("0", "40")
    assert "data.a.b.c.d.e: 0 in the dump run, 40 now" in str(error)


def test_the_explanation_names_the_deep_path_with_both_values() -> None:
    """Before: ``data.a.b.c: same dict of 1, other contents``."""
    (found,) = differences(digest_request({"data": deep("lefty")}), digest_request({"data": deep("right")}))
    assert found.path == "data.a.b.c.d.e"
    assert "'lefty' in the dump run, 'right' now" in found.what
    assert "other contents" not in found.what


def test_a_registered_matcher_decides_what_matches(dump: Path, matchers: dict[str, Any]) -> None:
    """A matcher over the recorded structure: the prompt batch's shape only."""

    def prompt_shape(recorded: Request, live: Request) -> bool:
        a, b = recorded.get("data.input_ids"), live.get("data.input_ids")
        assert a is not None and b is not None, "no prompts recorded"
        assert a.info["shape"] == b.info["shape"], f"prompt shape {a.info['shape']} recorded, {b.info['shape']} now"
        return True

    rollout_mock.register_matcher("prompt_shape", prompt_shape)
    assert "prompt_shape" in mismatch.matcher_names()
    served = replay(dump, (data(s, seed=3, e="other") for s in range(STEPS)), match_on=["prompt_shape"])
    assert len(served) == STEPS  # other values, same shape: a match for this matcher
    with pytest.raises(ReplayMismatchError) as info:
        replay(dump, (data(s, rows=9) for s in range(STEPS)), match_on=["prompt_shape"])
    assert info.value.argument == "prompt_shape"
    assert "matcher 'prompt_shape': prompt shape [8, 5] recorded, [9, 5] now" in str(info.value)


def test_a_matcher_and_a_path_together(dump: Path, matchers: dict[str, Any]) -> None:
    rollout_mock.register_matcher("never", lambda recorded, live: False)
    with pytest.raises(ReplayMismatchError) as info:
        replay(dump, (data(s) for s in range(STEPS)), match_on=["data.a.b.c.d.e", "never"])
    assert info.value.argument == "never" and "matcher 'never' says the calls differ" in str(info.value)
    rollout_mock.register_matcher("always", lambda recorded, live: None)
    served = replay(dump, (data(s, seed=5) for s in range(STEPS)), match_on=["data.a.b.c.d.f", "always"])
    assert len(served) == STEPS


def test_the_built_in_request_matcher_compares_the_whole_call(dump: Path) -> None:
    with pytest.raises(ReplayMismatchError) as info:
        replay(dump, (data(s, seed=2) for s in range(STEPS)), match_on=["request"])
    assert info.value.argument == "data.input_ids"
    assert len(replay(dump, (data(s) for s in range(STEPS)), match_on=["request"])) == STEPS


def test_a_matcher_name_is_a_plain_word(matchers: dict[str, Any]) -> None:
    for name in ("data.a", "x[0]", "", "step", "request"):
        with pytest.raises(ConfigError):
            rollout_mock.register_matcher(name, lambda recorded, live: True)
    with pytest.raises(ConfigError, match="expected a callable"):
        rollout_mock.register_matcher("fine", "not callable")  # type: ignore[arg-type]


def test_a_matcher_that_returns_something_else_is_a_config_error(dump: Path, matchers: dict[str, Any]) -> None:
    rollout_mock.register_matcher("odd", lambda recorded, live: "yes")  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError, match="returned 'yes'"):
        replay(dump, (data(s) for s in range(STEPS)), match_on=["odd"])


def test_an_old_dump_replays_and_a_path_it_did_not_keep_names_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dump of an older version (24 nodes to depth 4, no structure mark) still replays; a
    match_on path it did not keep is refused with the fix: re-dump."""
    monkeypatch.setattr(matching, "NODE_DEPTH", 4)
    monkeypatch.setattr(matching, "MAX_NODES", 24)
    real = Request.to_json

    def old_json(self: Request) -> dict[str, Any]:
        out = real(self)
        del out["s"]
        return out

    monkeypatch.setattr(Request, "to_json", old_json)
    path = tmp_path / "old"
    with MockScheduler(Scheduler(), cfg(path)) as mock:
        for step in range(STEPS):
            mock.get_batch(data(step), 8, global_step=step)
    monkeypatch.undo()
    assert len(replay(path, (data(s) for s in range(STEPS)))) == STEPS
    with pytest.raises(ReplayMismatchError) as info:  # a deep difference: the explanation says why it stops
        replay(path, (data(s, e=99) for s in range(STEPS)))
    assert "re-dump" in str(info.value) and "24 fields to depth 4" in str(info.value)
    with pytest.raises(ConfigError) as refused:
        replay(path, (data(s) for s in range(STEPS)), match_on=["data.a.b.c.d.e"])
    assert "older rollout_mock" in str(refused.value) and "re-dump" in str(refused.value)


def test_the_recorded_structure_is_bounded_and_says_what_it_left_out() -> None:
    wide = {f"k{i}": {"inner": {"x": i, "t": torch.full((4,), float(i))}} for i in range(400)}
    request = digest_request({"data": wide})
    assert len(request.nodes) <= matching.MAX_NODES and request.dropped > 0
    assert sum(map(matching._node_bytes, request.nodes)) <= matching.MAX_STRUCTURE_BYTES
    again = Request.from_json(request.to_json())
    assert again is not None and again.deep and again.dropped == request.dropped
    other = {**wide, "k399": {"inner": {"x": -1, "t": torch.full((4,), 399.0)}}}
    (found,) = differences(request, digest_request({"data": other}))
    assert "name the path in match_on when dumping" in found.what


def test_a_deep_tensor_difference_names_its_path_and_both_summaries() -> None:
    recorded = {"a": {"b": {"c": {"d": {"t": torch.arange(4), "u": 1}}}}, "x": [1, 2]}
    live = {"a": {"b": {"c": {"d": {"t": torch.arange(4, dtype=torch.int32), "u": 1}}}}, "x": [1, 2]}
    (found,) = differences(digest_request({"data": recorded}), digest_request({"data": live}))
    assert found.path == "data.a.b.c.d.t" and found.what == "dtype int64 in the dump run, int32 now"

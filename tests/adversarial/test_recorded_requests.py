"""Recorded request digests that are damaged or hostile (issue 37, round 5 items 6, 11 and 13).

Before: a recorded digest that was a string (a float, a bool, an int past 32 bits) replayed
*unmatched* with ``on_mismatch: error``, behind the warning meant for dumps recorded before
matching; a kept node whose ``head`` was not a list raised ``TypeError`` at mismatch.py:131; a
mismatch echoed a recorded value whole (a 1 MB shape string gave a 1 MB message) with its raw
terminal escapes. Now a malformed digest is a :class:`CorruptStepError` naming the step, malformed
summary fields are ignored, and the message is bounded and escaped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout_mock import MockScheduler
from rollout_mock.errors import CorruptStepError, ReplayMismatchError


class Source:
    def get_batch(self, data: Any, global_step: int) -> Any:
        return {"x": [global_step]}


DATA = {"prompts": ["a", "b", "c"], "n": 3}


def forged_dump(path: Path, forge: Callable[[dict[str, Any]], None]) -> Path:
    with MockScheduler(Source(), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as mock:
        mock.get_batch(DATA, global_step=0)
    manifest = json.loads((path / "manifest.json").read_text())
    forge(manifest["streams"]["train"]["steps"]["0"]["call"]["request"])
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def replay(path: Path, data: Any) -> Any:
    config = {"enable": True, "mode": "mock", "dump_dir": str(path), "on_mismatch": "error"}
    with MockScheduler(None, config, spec=Source) as mock:
        return mock.get_batch(data, global_step=0)


def setter(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda request: request.__setitem__(field, value)


DIGESTS: dict[str, Callable[[dict[str, Any]], None]] = {
    "digest_string": setter("d", "2236524745"),
    "digest_float": setter("d", 1.5),
    "digest_bool": setter("d", True),
    "digest_huge": setter("d", 10**30),
    "digest_negative": setter("d", -1),
    "digest_null": setter("d", None),
    "digest_missing": lambda request: request.pop("d"),
    "nodes_a_dict": setter("n", {"data": 1}),
    "names_a_string": setter("a", "data"),
}


@pytest.mark.parametrize("case", sorted(DIGESTS))
@pytest.mark.parametrize("same", [True, False])
def test_malformed_digest_is_corrupt_never_unmatched(tmp_path: Path, case: str, same: bool) -> None:
    dump = forged_dump(tmp_path / "d", DIGESTS[case])
    with pytest.raises(CorruptStepError, match=r"train step 0: the recorded call of get_batch is damaged") as caught:
        replay(dump, DATA if same else {"prompts": ["z"], "n": 1})
    assert "\n" not in str(caught.value) and caught.value.step == 0


def node_info(path: str, update: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def forge(request: dict[str, Any]) -> None:
        for node in request["n"]:
            if node[0] == path:
                node[2].update(update)
    return forge


NODES: dict[str, Callable[[dict[str, Any]], None]] = {
    "head_an_int": node_info("data.prompts", {"head": 5}),
    "head_a_string": node_info("data.prompts", {"head": "abc"}),
    "head_a_dict": node_info("data.prompts", {"head": {"a": 1}}),
    "blocks_an_int": node_info("data.prompts", {"b": 7, "len": 1000}),
    "keys_an_int": node_info("data", {"keys": 3}),
    "shape_a_string": node_info("data.prompts", {"k": "tensor", "shape": "x" * 100}),
    "len_a_dict": node_info("data.prompts", {"len": {"a": 1}}),
}


@pytest.mark.parametrize("case", sorted(NODES))
def test_malformed_node_summary_never_crashes(tmp_path: Path, case: str) -> None:
    dump = forged_dump(tmp_path / "d", NODES[case])
    with pytest.raises(ReplayMismatchError) as caught:
        replay(dump, {"prompts": ["a", "b", "z"], "n": 3})
    assert "data" in str(caught.value)


ESCAPE = "\x1b]0;pwned\x07\x1b[2J\u202e"
HUGE = "s" * 1_000_000


def extra_node(request: dict[str, Any]) -> None:
    request["n"].insert(1, [f"data.{ESCAPE}", 1, {"k": "str", "len": 1, "v": "x"}])


MESSAGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "len_huge": node_info("data.prompts", {"len": HUGE}),
    "len_escape": node_info("data.prompts", {"len": ESCAPE}),
    "len_list_of_huge": node_info("data.prompts", {"len": [HUGE] * 3}),
    "dict_len_escape": node_info("data", {"len": ESCAPE + HUGE}),
    "node_path_escape": extra_node,
    "keys_many": node_info("data", {"keys": [ESCAPE + str(i) for i in range(5000)]}),
}


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_mismatch_message_is_bounded_and_escaped(tmp_path: Path, case: str) -> None:
    dump = forged_dump(tmp_path / "d", MESSAGES[case])
    with pytest.raises(ReplayMismatchError) as caught:
        replay(dump, {"prompts": ["a", "b", "z"], "n": 3})
    message = str(caught.value)
    assert len(message) < 6000, len(message)
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in message
    assert len(str(caught.value.recorded)) < 2000

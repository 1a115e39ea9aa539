"""``cut --redact`` leaks (issue 28): one redaction walk with no depth escape.

Before: a ``prompt`` held as tensordict ``NonTensorData`` (or ``NonTensorStack``) survived, and
the cut failed on the TensorDict the walk rebuilt without its batch size; a prompt nested 70
levels deep survived (the walk stopped at 64 and kept the rest); a prompt nested 1,000 deep
raised ``RecursionError``; text used as a mapping key inside ``prompt`` survived; the attributes of
a registered batch class were never looked at. Each case greps every file of the cut dump for
the secret, and the decoded batch too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_hostile_dumps import cli
from test_numbers import make_dump, run

from rollout_mock import open_dump, register_batch_class
from rollout_mock.batch import count_samples
from rollout_mock.debug.redact import PLACEHOLDER, redact

SECRET = "SECRET-PROMPT-91c2"


def ids() -> torch.Tensor:
    return torch.ones(2, 3, dtype=torch.long)


def nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def _tensordict(prompt: Any) -> Any:
    tensordict = pytest.importorskip("tensordict")
    td = tensordict.TensorDict({"input_ids": ids()}, batch_size=[2])
    td["prompt"] = prompt(tensordict)
    return td


def _verl(s: int) -> Any:
    tensordict = pytest.importorskip("tensordict")
    protocol = pytest.importorskip("verl.protocol")
    batch = protocol.DataProto.from_dict(tensors={"input_ids": ids()},
                                         non_tensors={"raw_prompt": np.array([SECRET, SECRET], dtype=object)},
                                         meta_info={"prompt": SECRET})
    batch.batch["prompt"] = tensordict.NonTensorData(SECRET)
    return batch


@register_batch_class
class Episode:
    """A registered class: stored by its attribute dict, rebuilt field by field."""

    def __init__(self, prompt: str, reward: float) -> None:
        self.prompt = prompt
        self.reward = reward


CASES: dict[str, Callable[[int], Any]] = {
    "nontensordata": lambda s: _tensordict(lambda t: t.NonTensorData(SECRET)),
    "nontensorstack": lambda s: _tensordict(lambda t: t.NonTensorStack(t.NonTensorData(SECRET), t.NonTensorData("x"))),
    "nested_70": lambda s: {"input_ids": ids(), "prompt": nested(70, SECRET)},
    "nested_1000": lambda s: {"input_ids": ids(), "prompt": nested(1000, SECRET)},
    "text_key_70_deep": lambda s: {"input_ids": ids(), "extra": nested(70, {"prompt": SECRET})},
    "text_as_key": lambda s: {"input_ids": ids(), "prompt": [{SECRET: 1}, {"a": {SECRET: [2]}}]},
    "text_as_tuple_key": lambda s: {"input_ids": ids(), "prompt": [{(SECRET, 1): 1}, {}]},
    "messages_role_text": lambda s: {"input_ids": ids(), "messages": [[{"role": SECRET, "content": "x"}],
                                                                      [{"role": "user", SECRET: "y"}]]},
    "registered_class": lambda s: {"input_ids": ids(), "episodes": [Episode(SECRET, 1.0), Episode("x", 0.0)]},
    "verl_nontensordata": _verl,
}


def _all_bytes(directory: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file())


@pytest.mark.parametrize("case", sorted(CASES))
def test_cut_redact_leaves_the_secret_nowhere(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_dump(tmp_path / "src", CASES[case], steps=1)
    assert SECRET.encode() in _all_bytes(src)  # there to leak
    argv = ["cut", src, tmp_path / "dst", "--steps", "0", "--redact"]
    code, out, err = run(*argv, *(["--import", "verl.protocol"] if case.startswith("verl") else []), capsys=capsys)
    assert code == 0, err
    data = _all_bytes(tmp_path / "dst")
    for encoding in ("utf-8", "utf-16-le", "utf-32-le"):
        assert SECRET.encode(encoding) not in data, encoding
    batch = open_dump(tmp_path / "dst").load(0)
    assert SECRET not in repr(batch) and count_samples(batch) == 2
    if hasattr(batch, "batch"):  # a DataProto: every part
        assert SECRET not in repr((batch.batch, batch.non_tensor_batch, batch.meta_info))
        assert batch.batch["prompt"] == PLACEHOLDER and len(batch) == 2


def test_the_cli_in_a_fresh_process(tmp_path: Path) -> None:
    """Where the writer's classes are not imported (the usual ``cut`` run)."""
    src = make_dump(tmp_path / "src", CASES["nontensordata"], steps=1)
    code, out, err = cli("cut", src, tmp_path / "dst", "--steps", "0", "--redact", cwd=tmp_path)
    assert code == 0, err
    assert "redacted fields: prompt" in out and SECRET.encode() not in _all_bytes(tmp_path / "dst")


def test_deeper_than_the_limit_goes_whole_and_is_named() -> None:
    batch = {"input_ids": ids(), "extra": nested(70, {"prompt": SECRET, "n": 1}), "kept": nested(10, 5)}
    redacted, hits = redact(batch)
    assert SECRET not in repr(redacted) and "(nested deeper than 64 levels)" in hits
    assert redacted["kept"] is batch["kept"] and redacted["input_ids"] is batch["input_ids"]  # shared, not copied


def test_shared_references_are_walked_once() -> None:
    """A value reached by 2**60 paths (a pickled dump can share references) is redacted once,
    never once per path; a cycle is cut."""
    node: Any = [SECRET]
    for _ in range(60):
        node = [node, node]
    cycle: list[Any] = [SECRET]
    cycle.append(cycle)
    redacted, hits = redact({"prompt": node, "messages": cycle})
    assert hits == ["messages", "prompt"]
    seen: set[int] = set()
    todo = [redacted]
    while todo:  # every distinct object once (repr would walk every path)
        value = todo.pop()
        assert value != SECRET
        if isinstance(value, (list, dict)) and id(value) not in seen:
            seen.add(id(value))
            todo.extend(value.values() if isinstance(value, dict) else value)
    assert len(seen) < 200

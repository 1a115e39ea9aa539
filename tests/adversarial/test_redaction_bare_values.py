"""``cut --redact`` / ``pack --redact`` and text held outside a TensorDict (issue 37, round 4's leftover 1).

Before: a bare ``NonTensorData`` (or ``NonTensorStack``) in a plain dict, a set of strings and an
object keeping its text in ``__slots__`` kept the secret, while the command printed "redacted
fields: prompt". The report now lists only the fields whose value was changed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_numbers import make_dump, run

from rollout_mock import open_dump
from rollout_mock.debug.redact import PLACEHOLDER, redact

SECRET = "SECRET-PROMPT-5e1a"


def ids() -> torch.Tensor:
    return torch.ones(2, 3, dtype=torch.long)


class Slotted:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Slotted({self.text!r})"


def _nontensor(kind: str) -> Callable[[int], Any]:
    def build(step: int) -> Any:
        tensordict = pytest.importorskip("tensordict")
        if kind == "data":
            prompt = tensordict.NonTensorData(SECRET)
        else:
            prompt = tensordict.NonTensorStack.from_list([SECRET, "x"])
        return {"input_ids": ids(), "prompt": prompt}
    return build


CASES: dict[str, Callable[[int], Any]] = {
    "bare_nontensordata": _nontensor("data"),
    "bare_nontensorstack": _nontensor("stack"),
    "set_of_prompts": lambda s: {"input_ids": ids(), "prompt": [{SECRET}, frozenset({"x"})]},
}


def _all_bytes(directory: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file())


@pytest.mark.parametrize("case", sorted(CASES))
def test_cut_redact_scrubs_bare_values(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_dump(tmp_path / "src", CASES[case], steps=1)
    assert SECRET.encode() in _all_bytes(src)
    code, out, err = run("cut", src, tmp_path / "dst", "--steps", "0", "--redact", capsys=capsys)
    assert code == 0, err
    assert "redacted fields: prompt" in out
    assert SECRET.encode() not in _all_bytes(tmp_path / "dst")
    batch = open_dump(tmp_path / "dst").load(0)
    assert SECRET not in repr(batch)


@pytest.mark.parametrize("case", sorted(CASES))
def test_pack_redact_scrubs_bare_values(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_dump(tmp_path / "src", CASES[case], steps=1)
    code, out, err = run("pack", src, "-o", tmp_path / "b.rmb", "--steps", "0", "--redact", capsys=capsys)
    assert code == 0, err
    assert SECRET.encode() not in (tmp_path / "b.rmb").read_bytes()
    assert SECRET not in repr(open_dump(tmp_path / "b.rmb").load(0))


def test_slots_object_under_a_text_key_goes_whole() -> None:
    redacted, hits = redact({"prompt": Slotted(SECRET), "n": 1})
    assert redacted["prompt"] == PLACEHOLDER and hits == ["prompt"]


def test_report_lists_only_what_changed() -> None:
    """A text key holding no text (a number, token ids) is not reported as redacted."""
    batch = {"prompt": 3, "text": ids(), "response": ["r"]}
    redacted, hits = redact(batch)
    assert hits == ["response"] and redacted["prompt"] == 3 and redacted["text"] is batch["text"]


def test_cut_says_nothing_was_redacted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_dump(tmp_path / "src", lambda s: {"input_ids": ids(), "prompt": [1, 2]}, steps=1)
    code, out, err = run("cut", src, tmp_path / "dst", "--steps", "0", "--redact", capsys=capsys)
    assert code == 0, err
    assert "redacted fields: prompt" not in out

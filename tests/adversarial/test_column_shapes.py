"""Columns of the wrong shape or type in a step (issue 28, siblings of "DataProto fields that are
not mappings"): the traces that ``show`` and ``report`` build, and the sequences ``logprobs``
extracts, read token columns, masks, rewards and messages whatever shape they have. Before, a
reward column shorter than the batch raised ``IndexError``, a 1-D ``response_mask`` ``TypeError``,
3-D or NaN token ids ``TypeError``/``ValueError``, a message row that is not a list ``TypeError``,
token ids outside the model's vocabulary a torch ``RuntimeError``, and a slime sample with text
or 2**70 where ids belong a ``ValueError``. Every command must succeed or end with exit 2 and one
line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_numbers import bounded, make_dump, run


def ids(rows: int = 2, width: int = 4) -> torch.Tensor:
    return torch.ones(rows, width, dtype=torch.long)


SLIME = "rollout_mock.slime"

BATCHES: dict[str, Callable[[int], Any]] = {
    "rewards_shorter_than_the_batch": lambda s: {"input_ids": ids(3), "rewards": [[[1.0]]]},
    "response_mask_1d": lambda s: {"prompts": ids(), "responses": ids(), "response_mask": torch.ones(2)},
    "input_ids_3d": lambda s: {"input_ids": torch.ones(2, 3, 4, dtype=torch.long)},
    "input_ids_nan": lambda s: {"input_ids": torch.full((2, 3), float("nan"))},
    "input_ids_complex": lambda s: {"input_ids": torch.ones(2, 3, dtype=torch.complex64)},
    "messages_rows_not_lists": lambda s: {"input_ids": ids(), "messages": ["x", 5]},
}


@pytest.mark.parametrize("case", sorted(BATCHES))
def test_show_and_report(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", BATCHES[case])
    code, out, err = run("show", dump, capsys=capsys)
    bounded(code, out, err)
    assert code == 0, err
    bounded(*run("report", dump, "-o", tmp_path / "r.html", capsys=capsys))
    bounded(*run("report", dump, "--against", dump, "-o", tmp_path / "a.html", capsys=capsys))


#: name -> (a step's batch, what the error must say)
LOGPROBS: dict[str, tuple[Callable[[int], Any], str]] = {
    "ids_past_the_vocabulary": (lambda s: {"input_ids": torch.full((2, 4), 2**40, dtype=torch.long),
                                           "infer_logprobs": torch.zeros(2, 3), "response_mask": ids()},
                                "outside the model's vocabulary"),
    "negative_ids": (lambda s: {"input_ids": torch.full((2, 4), -3, dtype=torch.long),
                                "infer_logprobs": torch.zeros(2, 3), "response_mask": ids()},
                     "outside the model's vocabulary"),
    "slime_text_tokens": (lambda s: {"format": SLIME, "kind": "train", "metrics": None, "samples": [[
        {"tokens": "abc", "response_length": 2, "rollout_log_probs": "x", "prompt": "p"}]]}, "slime sample 0"),
    "slime_tokens_past_int64": (lambda s: {"format": SLIME, "kind": "train", "metrics": None, "samples": [[
        {"tokens": [1, 2**70, 3], "response_length": 2, "rollout_log_probs": [0.0, 0.5], "prompt": "p"}]]},
        "slime sample 0"),
    "slime_response_length_past_the_tokens": (lambda s: {"format": SLIME, "kind": "train", "metrics": None,
                                                         "samples": [[{"tokens": [1, 2], "response_length": 10**6,
                                                                       "rollout_log_probs": [0.0], "prompt": "p"}]]},
                                              "response_length"),
}


def _model_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "tiny_lm.py").write_text(
        "import torch\n\ndef make():\n    return lambda ids, mask: torch.zeros(ids.shape[0], ids.shape[1], 16)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tiny_lm", raising=False)
    return "tiny_lm:make"


@pytest.mark.parametrize("case", sorted(LOGPROBS))
def test_logprobs(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch,
                  capsys: pytest.CaptureFixture[str]) -> None:
    build, why = LOGPROBS[case]
    dump = make_dump(tmp_path / "d", build)
    model = _model_module(tmp_path, monkeypatch)
    for json_flag in ([], ["--json"]):
        code, out, err = run("logprobs", dump, "--model", model, "--no-progress", *json_flag, capsys=capsys)
        bounded(code, out, err)
        assert code == 2 and why in err, err

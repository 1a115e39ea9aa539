"""Suggested commands and a bundle's recorded tolerances (issue 37, round 5 items 5 and 15).

Before: ``unpack`` printed ``rollout-mock verify ... --rtol loss; touch HINT_MARKER #=0.001`` for a
metric named ``loss; touch HINT_MARKER #`` in the bundle: pasted into a shell, it ran the command.
A bundle whose description held ``tolerances: {"rtol": [1, 2]}`` made ``unpack`` raise a bare
``AttributeError``. Every suggested command is now built with ``shlex.quote``; forged tolerances
are one ``BundleError`` line, and nothing is written.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HANG_S
from test_numbers import make_dump, run

from rollout_mock.cli.bundle import pack_store
from rollout_mock.storage.store import open_store

HOSTILE = "loss; touch HINT_MARKER #"
ROWS = ['{"step": 0, "loss": 1.0}', '{"step": 1, "loss": 2.0}']


def ids(step: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.full((2, 3), step)}


def test_unpack_hint_is_shell_quoted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", ids, steps=2, metrics=ROWS)
    code, _, err = run("pack", dump, "--steps", "0-1", "-o", tmp_path / "b.rmb", "--rtol", f"{HOSTILE}=0.001",
                       "--atol", "$(touch HINT_MARKER)=1e-9", capsys=capsys)
    assert code == 0, err
    code, out, err = run("unpack", tmp_path / "b.rmb", "-o", tmp_path / "out dir", capsys=capsys)
    assert code == 0, err
    line = next(line for line in out.splitlines() if "rollout-mock verify" in line)
    command = line[line.index("rollout-mock verify"):]
    words = shlex.split(command)
    assert f"{HOSTILE}=0.001" in words and "$(touch HINT_MARKER)=1e-09" in words
    assert str(tmp_path / "out dir" / "expected" / "metrics.jsonl") in words
    # pasted into a shell (the program replaced by ':'), nothing runs
    subprocess.run(["sh", "-c", ": " + command.removeprefix("rollout-mock")], cwd=tmp_path, check=True, timeout=HANG_S)
    assert not (tmp_path / "HINT_MARKER").exists()


def test_missing_dump_hint_is_shell_quoted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``resolve_dump``'s "dumps are inside it" suggestion, with a hostile output name."""
    make_dump(tmp_path / "runs" / "a dump", ids, steps=1)
    code, _, err = run("pack", tmp_path / "runs", "--steps", "0", "-o", "x; touch HINT_MARKER", capsys=capsys)
    assert code == 2
    command = err[err.rindex("rollout-mock pack"):].strip()
    subprocess.run(["sh", "-c", ": " + command.removeprefix("rollout-mock")], cwd=tmp_path, check=True, timeout=HANG_S)
    assert not (tmp_path / "HINT_MARKER").exists()
    assert "'x; touch HINT_MARKER'" in err


FORGED: dict[str, Any] = {
    "list": {"rtol": [1, 2]},
    "string": "1e-3",
    "negative": {"atol": {"loss": -1.0}},
    "huge": {"rtol": {"default": 1e305}},
    "bool": {"rtol": {"default": True}},
    "unknown_kind": {"rtol": {}, "exec": {"x": 1}},
    "nested": {"rtol": {"loss": {"a": 1}}},
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_tolerances_are_one_line(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", ids, steps=1, metrics=ROWS)
    pack_store(open_store(dump), tmp_path / "b.rmb", steps=[0], meta={"tolerances": FORGED[case], "redacted": None})
    code, out, err = run("unpack", tmp_path / "b.rmb", "-o", tmp_path / "out", capsys=capsys)
    assert code == 2, out
    assert len(err.strip().splitlines()) == 1 and "tolerances" in err and "pack it again" in err, err
    assert not (tmp_path / "out").exists()

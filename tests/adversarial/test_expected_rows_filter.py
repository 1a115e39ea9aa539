"""``pack``/``pull`` and a dump's ``expected/*.jsonl`` (issue 37, round 5 item 10).

Before: every line of every expected-metrics file (up to 256 MB each) was parsed to find the rows
of the wanted steps: 8 MB of ``1\\n`` lines ran past 20 s, 32 MB past 120 s at 1.16 GB. Now the
file is read in pieces and a line is parsed only when a ``"step"`` field of a wanted step appears
in it. The tests count parses (no clock).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_numbers import make_dump, run

import rollout_mock.storage.bundle as bundle_module
from rollout_mock import open_dump


def ids(step: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.full((1, 2), step)}


@pytest.fixture()
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count: list[int] = []
    real = bundle_module.loads_bounded

    def counted(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("what") == "metrics line":  # (not the table of contents of a bundle opened)
            count.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(bundle_module, "loads_bounded", counted)
    return count


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "expected" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("filler", [b"1\n", b'{"loss": 1}\n', b"\n", b'{"step": 7, "loss": 1}\n'])
def test_lines_of_other_steps_are_never_parsed(tmp_path: Path, filler: bytes, parses: list[int],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", ids, steps=2)
    body = filler * (4_000_000 // len(filler)) + b'{"step": 1, "loss": 2.5}\n' + filler * 1000
    (dump / "expected").mkdir()
    (dump / "expected" / "metrics.jsonl").write_bytes(body)
    code, _, err = run("pull", dump, "--steps", "1", "-o", tmp_path / "out", capsys=capsys)
    assert code == 0, err
    assert rows_of(tmp_path / "out") == [{"step": 1, "loss": 2.5}]
    assert len(parses) == 1


def test_the_rows_kept_are_those_of_the_old_filter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", ids, steps=3)
    lines = [
        '{"step": 0, "loss": 1.0}',
        '{"meta": {"step": 9}, "step": 1, "loss": 2.0}',  # a nested "step" before the row's own
        '{"step": 1 , "kl": NaN}',
        '{"step": 2.0, "loss": 3.0}',  # a float step: not a row of step 2
        '{"step": 10, "loss": 4.0}',  # 10 is not 1
        '{"step": true, "loss": 5.0}',
        '{"loss": 6.0, "step": 2}',
        '{"step": 2, "loss": 7.0',  # torn
        '{"step": 2, "loss": 8.0}',  # the last line, without its newline
    ]
    (dump / "expected").mkdir()
    (dump / "expected" / "metrics.jsonl").write_text("\n".join(lines))
    code, _, err = run("pull", dump, "--steps", "1-2", "-o", tmp_path / "out", capsys=capsys)
    assert code == 0, err
    text = (tmp_path / "out" / "expected" / "metrics.jsonl").read_text()
    assert text.splitlines() == [lines[1], lines[2], lines[6], lines[8]] and text.endswith("\n")


def test_an_over_long_line_is_skipped_in_bounded_memory(tmp_path: Path, parses: list[int],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", ids, steps=2)
    huge = b'{"step": 1, "x": "' + b"a" * (20 << 20) + b'"}\n'
    (dump / "expected").mkdir()
    (dump / "expected" / "metrics.jsonl").write_bytes(huge + b'{"step": 1, "loss": 1.0}\n' + huge[:-1])
    code, _, err = run("pack", dump, "--steps", "1", "-o", tmp_path / "b.rmb", capsys=capsys)
    assert code == 0, err
    bundled = open_dump(tmp_path / "b.rmb")
    assert bundled is not None and len(parses) == 1
    code, _, err = run("unpack", tmp_path / "b.rmb", "-o", tmp_path / "out", capsys=capsys)
    assert code == 0, err
    assert rows_of(tmp_path / "out") == [{"step": 1, "loss": 1.0}]

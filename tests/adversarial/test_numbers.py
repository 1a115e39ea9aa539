"""Issue 28, "one numeric formatter for CLI and report that never overflows": hostile numbers in a
step body or a metrics file, through every command that prints or draws them.

Each case is a dump or a metrics file holding a number no float can hold (``10**400``, a
20,000-digit int, a 5,000-digit int, ``±1e308`` whose difference overflows, a numpy ``longdouble``
beyond float64, a step ``10**400``) and the commands that read it. Every command must succeed and
print a bounded value, or end with exit 2 and one line; never a traceback. All of them raised
OverflowError or ValueError before (``int too large to convert to float``, the int-string limit,
an axis computation that overflowed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rollout_mock import MockScheduler
from rollout_mock.cli import main

HUGE = 10**400
GIANT = -(10**20000)


class Source:
    def __init__(self, build: Callable[[int], Any]) -> None:
        self.build = build

    def get_batch(self, data: Any, global_step: int) -> Any:
        return self.build(global_step)


def make_dump(path: Path, build: Callable[[int], Any], steps: int = 2, metrics: list[str] | None = None) -> Path:
    with MockScheduler(Source(build), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as mock:
        for step in range(steps):
            mock.get_batch(None, step)
    if metrics is not None:
        (path / "expected").mkdir(exist_ok=True)
        (path / "expected" / "metrics.jsonl").write_text("".join(line + "\n" for line in metrics))
    return path


def ids() -> torch.Tensor:
    return torch.ones(2, 3, dtype=torch.long)


#: name -> a step's batch: the numbers a hostile (or broken) writer can put in a step body
BATCHES: dict[str, Callable[[int], Any]] = {
    # AReaL's trajectory with a reward of 10**400 (show: "int too large to convert to float")
    "reward_10e400": lambda s: [{"input_ids": ids(), "loss_mask": ids(), "rewards": HUGE}],
    # a column of 20,001-digit ints (report: the int-string limit in the page's JSON)
    "column_20000_digits": lambda s: {"input_ids": ids(), "score": [GIANT, 1], "extra": [GIANT, 5]},
    # slime samples whose token ids and reward are past every limit
    "slime_tokens_huge": lambda s: {"format": "rollout_mock.slime", "kind": "train", "metrics": None, "samples": [[
        {"tokens": [1, GIANT, 3], "response_length": 2, "prompt": "p", "reward": HUGE, "rollout_log_probs": [HUGE, 0.5],
         "status": "completed"}]]},
    # a float column beyond float64 (numpy longdouble)
    "longdouble_1e4000": lambda s: {"input_ids": ids(), "rewards": np.array(["1e4000", "1"], dtype=np.longdouble)},
    # ±1e308 rewards: their spread, mean and histogram range overflow
    "rewards_1e308": lambda s: {"input_ids": ids(), "rewards": torch.tensor([1e308, -1e308], dtype=torch.float64)},
}


def run(*argv: str | Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def bounded(code: int, out: str, err: str) -> None:
    """Succeeded (0, or 1: a divergence found) with a bounded output, or exit 2 and one line."""
    assert code in (0, 1, 2), code
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
    assert max((len(line) for line in (out + err).splitlines()), default=0) < 2000


@pytest.mark.parametrize("case", sorted(BATCHES))
def test_show_ls_cut_and_report_on_hostile_numbers(tmp_path: Path, case: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    if case == "longdouble_1e4000" and not np.isfinite(np.longdouble("1e4000")):
        pytest.skip("this platform's longdouble is float64")
    dump = make_dump(tmp_path / "d", BATCHES[case])
    code, out, err = run("show", dump, capsys=capsys)
    assert code == 0
    bounded(code, out, err)
    bounded(*run("ls", dump, "--keys", capsys=capsys))
    bounded(*run("cut", dump, tmp_path / "cut", "--steps", "0", capsys=capsys))
    code, out, err = run("report", dump, "-o", tmp_path / "r.html", capsys=capsys)
    assert code == 0, err
    html = (tmp_path / "r.html").read_text()
    assert len(html) < 1_000_000 and "e20000" not in html
    data = json.loads(re.search(r'id="rm-data">(.*?)</script>', html, re.S).group(1))
    for chart in data["charts"]:  # nothing a plotting library would overflow on
        assert all(v is None or abs(v) <= 1e300 for s in chart["series"] for v in s["values"])


def test_show_prints_a_bounded_reward_and_the_size_of_a_giant_int(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run("show", make_dump(tmp_path / "a", BATCHES["reward_10e400"]), capsys=capsys)
    assert code == 0 and "reward inf" in out  # as float as it gets: never a traceback
    code, out, _ = run("show", make_dump(tmp_path / "b", BATCHES["column_20000_digits"]), capsys=capsys)
    assert code == 0 and "extra: <negative int of 20001 digits>" in out


def test_diff_of_giant_ints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_dump(tmp_path / "a", BATCHES["column_20000_digits"])
    b = make_dump(tmp_path / "b", lambda s: {"input_ids": ids(), "score": [GIANT - 1, 1], "extra": [GIANT, 5]})
    code, out, err = run("diff", a, b, "--no-progress", capsys=capsys)
    assert code == 1
    bounded(code, out, err)
    code, out, err = run("report", a, "--against", b, "-o", tmp_path / "c.html", capsys=capsys)
    assert code == 0, err


# ------------------------------------------------------------------------------ metrics files
def lines(*records: str) -> list[str]:
    return list(records)


METRICS: dict[str, list[str]] = {
    "step_10e400": lines('{"step": 0, "pg_loss": 1.0}', '{"step": 1, "pg_loss": 0.5}', f'{{"step": {HUGE}, "pg_loss": 1.0}}'),
    "value_1e308": lines('{"step": 0, "pg_loss": 1e308}', '{"step": 1, "pg_loss": -1e308}', '{"step": 2, "pg_loss": 1.0}'),
    "value_huge_int": lines('{"step": 0, "pg_loss": 1.0}', f'{{"step": 1, "pg_loss": {HUGE}}}'),
}


def _small(s: int) -> Any:
    return {"input_ids": ids(), "rewards": torch.tensor([1.0, 0.5])}


@pytest.mark.parametrize("case", sorted(METRICS))
def test_report_verify_and_cut_on_hostile_metrics(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The dump run's metrics (``expected/``) and a run's metrics file with the same numbers."""
    dump = make_dump(tmp_path / "d", _small, 3, metrics=METRICS[case])
    run_file = tmp_path / "run.jsonl"
    run_file.write_text('{"step": 0, "pg_loss": -1e308}\n{"step": 1, "pg_loss": 1e308}\n{"step": 2, "pg_loss": 2.0}\n')
    code, out, err = run("report", dump, "-o", tmp_path / "r.html", capsys=capsys)
    bounded(code, out, err)
    # an int past 2**53, and a step of 401 digits, are refused by the metrics reader (exit 2, one
    # line naming the file and the line); the others are drawn
    assert code == (2 if case in ("value_huge_int", "step_10e400") else 0), err
    code, out, err = run("report", dump, "--against", run_file, "-o", tmp_path / "m.html", capsys=capsys)
    bounded(code, out, err)
    if code == 0:  # |1e308 - (-1e308)| is inf: counted as not drawn, never an OverflowError
        html = (tmp_path / "m.html").read_text()
        assert "not drawn" in html and "First divergence" in html
    bounded(*run("verify", dump, run_file, capsys=capsys))
    bounded(*run("verify", dump, run_file, "--json", capsys=capsys))
    bounded(*run("cut", dump, tmp_path / "cut", "--steps", "0", capsys=capsys))


def test_a_5000_digit_int_in_expected_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Past Python's int-string limit (4,300 digits) the JSON line cannot be read: exit 2, one line
    naming the file and the line, for every command that reads it (cut used to raise ValueError)."""
    digits = "9" * 5000
    dump = make_dump(tmp_path / "d", _small, 2, metrics=['{"step": 0, "pg_loss": 1.0}',
                                                          f'{{"step": 1, "pg_loss": {digits}}}'])
    for argv in (["cut", dump, tmp_path / "cut", "--steps", "0"], ["report", dump, "-o", tmp_path / "r.html"],
                 ["verify", dump, dump]):
        code, out, err = run(*argv, capsys=capsys)
        assert code == 2 and "metrics.jsonl:2: malformed metrics line" in err, (argv, err)
        bounded(code, out, err)
    assert not (tmp_path / "cut").exists()  # no half-made dump left


def test_logprobs_json_with_numbers_past_float(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", _small, 2)
    lp = tmp_path / "lp.json"
    lp.write_text(f'{{"steps": [{{"step": 0, "token_mult_prob_error": {HUGE}}}, '
                  f'{{"step": 1, "token_mult_prob_error": 1e999}}]}}')
    code, out, err = run("report", dump, "-o", tmp_path / "r.html", "--logprobs-json", lp, capsys=capsys)
    assert code == 0, err

"""Hostile metrics files (issue 28): a run's metrics, a dump's expected metrics, a bisect reference
and a ``--logprobs-json`` file, read by ``verify``, ``report``, ``report --against``, ``cut`` and
``bisect``.

Every JSON line is read through the bounded JSON reader (``rollout_mock.jsonio.parse_bounded``),
so nesting 100,000 deep (a ``RecursionError`` traceback before), numbers past every limit and
oversized lines end with exit 2 and one line naming the file and the line, in every command.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from test_numbers import _small, bounded, make_dump, run

DEEP = "[" * 100_000 + "]" * 100_000
GOOD = '{"step": 0, "pg_loss": 1.0}\n{"step": 1, "pg_loss": 0.5}\n'

#: name -> the text of line 2 of a metrics file (line 1 is good)
LINES: dict[str, str] = {
    "nested_100000": f'{{"step": 1, "pg_loss": {DEEP}}}',
    "nested_key_object": '{"step": 1, "pg_loss": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}",
    "step_10e400": f'{{"step": 1{"0" * 400}, "pg_loss": 1.0}}',
    "value_5000_digits": f'{{"step": 1, "pg_loss": {"9" * 5000}}}',
    "step_5000_digits": f'{{"step": {"9" * 5000}, "pg_loss": 1.0}}',
    "line_of_2MiB": f'{{"step": 1, "pg_loss": 1.0, "note": "{"x" * (2 << 20)}"}}',
}


def _metrics(case: str) -> str:
    return '{"step": 0, "pg_loss": 1.0}\n' + LINES[case] + "\n"


def _refused(code: int, out: str, err: str, where: str) -> None:
    bounded(code, out, err)
    assert code == 2, (code, err[-500:])
    assert f"{where}:2: malformed metrics line" in err, err[-500:]


@pytest.mark.parametrize("case", sorted(LINES))
def test_a_run_metrics_file(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", _small, 2, metrics=GOOD.splitlines())
    hostile = tmp_path / "run.jsonl"
    hostile.write_text(_metrics(case))
    good = tmp_path / "good.jsonl"
    good.write_text(GOOD)
    for argv in (["verify", good, hostile], ["verify", hostile, good], ["verify", dump, hostile, "--json"],
                 ["report", dump, "--against", hostile, "-o", tmp_path / "r.html"]):
        _refused(*run(*argv, capsys=capsys), where="run.jsonl")


@pytest.mark.parametrize("case", sorted(LINES))
def test_a_dumps_expected_metrics(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", _small, 2, metrics=_metrics(case).splitlines())
    good = tmp_path / "good.jsonl"
    good.write_text(GOOD)
    for argv in (["report", dump, "-o", tmp_path / "r.html"], ["verify", dump, good],
                 ["report", dump, "--against", good, "-o", tmp_path / "a.html"],
                 ["cut", dump, tmp_path / "cut", "--steps", "0"]):
        _refused(*run(*argv, capsys=capsys), where="expected/metrics.jsonl")
    assert not (tmp_path / "cut").exists()  # no half-made dump left


def test_cut_copies_the_kept_lines_of_good_expected_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", _small, 3, metrics=[
        '{"step": 0, "pg_loss": 1.0}', '{"step": 1, "pg_loss": 0.5}', '{"step": 2, "pg_loss": 0.25}'])
    code, _, err = run("cut", dump, tmp_path / "cut", "--steps", "0,2", capsys=capsys)
    assert code == 0, err
    assert (tmp_path / "cut" / "expected" / "metrics.jsonl").read_text() == (
        '{"step": 0, "pg_loss": 1.0}\n{"step": 2, "pg_loss": 0.25}\n')


def test_a_logprobs_json_nested_deep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", _small, 2)
    lp = tmp_path / "lp.json"
    lp.write_text(f'{{"steps": [{{"step": 0, "token_mult_prob_error": {DEEP}}}]}}')
    code, out, err = run("report", dump, "-o", tmp_path / "r.html", "--logprobs-json", lp, capsys=capsys)
    bounded(code, out, err)
    assert code == 2 and "--logprobs-json" in err and "nested more than" in err, err


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_bisect_reference_file_nested_deep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    for n in range(2):
        (repo / "f.txt").write_text(str(n))
        subprocess.run([*git, "add", "f.txt"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", f"c{n}"], check=True)
    dump = make_dump(tmp_path / "d", _small, 2)
    reference = tmp_path / "ref.jsonl"
    reference.write_text(_metrics("nested_100000"))
    code, out, err = run("bisect", "--good", "HEAD~1", "--bad", "HEAD", "--dump", dump, "--repo", repo,
                         "--reference", reference, "--", "true", capsys=capsys)
    _refused(code, out, err, where="ref.jsonl")


def test_a_csv_cell_past_csvs_field_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """csv raised its own ``_csv.Error`` (not a ValueError) through ``verify``: a traceback."""
    hostile = tmp_path / "run.csv"
    hostile.write_text("step,pg_loss\n0,1.0\n1," + "x" * 200_000 + "\n")
    good = tmp_path / "good.jsonl"
    good.write_text(GOOD)
    for argv in (["verify", good, hostile], ["verify", hostile, good]):
        code, out, err = run(*argv, capsys=capsys)
        bounded(code, out, err)
        assert code == 2 and "run.csv:3: malformed CSV" in err, err

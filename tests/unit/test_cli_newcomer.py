"""The CLI as a newcomer meets it: no arguments, --version, parent folders, read-only wording,
grouped keys, errors whose fix is a command the CLI accepts."""

from __future__ import annotations

import builtins
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

from rollout_mock import MockScheduler
from rollout_mock.cli import build_parser, main


class Returns:
    def get_batch(self, data: Any, global_step: int) -> Any:
        return {"x": torch.full((2, 3), float(global_step)), "y": torch.arange(2)}


def make_dump(path: Path, steps: int = 3) -> Path:
    with MockScheduler(Returns(), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as s:
        for step in range(steps):
            s.get_batch(None, step)
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def accepted(command_line: str) -> None:
    """The suggested command parses (the fix is one the CLI accepts)."""
    build_parser().parse_args(shlex.split(command_line)[1:])


def test_no_arguments_prints_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([], capsys)
    assert code == 0 and "usage: rollout-mock" in out and "demo" in out
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and "rollout-mock 0." in capsys.readouterr().out


@pytest.mark.parametrize("command", ["ls", "show", "diff"])
def test_parent_folder_says_where_the_dump_is(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_dump(tmp_path / "runs" / "baseline" / "dump")
    argv = [command, str(tmp_path / "runs")] + ([str(tmp_path / "runs")] if command == "diff" else [])
    code, _, err = run(argv, capsys)
    assert code == 2 and str(tmp_path / "runs" / "baseline" / "dump") in err
    assert "Mock file not found" not in err and "mode=" not in err
    accepted(err.split("inside it: ")[1].split(";")[0].strip())


def test_missing_step_uses_read_only_wording(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d")
    code, _, err = run(["show", str(dump), "--step", "9"], capsys)
    assert code == 2 and "step 9 is not in" in err and "0-2" in err
    assert "Mock file not found" not in err and "mode mismatch" not in err
    code, _, err = run(["ls", str(tmp_path / "nope")], capsys)
    assert code == 2 and "no such folder" in err


def test_ls_keys_lists_each_key_set_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = make_dump(tmp_path / "d", steps=4)
    code, out, _ = run(["ls", str(dump), "--keys"], capsys)
    assert code == 0 and out.count("x: float32 [2, 3]") == 1 and "keys (all steps): 2" in out


def test_import_errors_give_accepted_fixes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["import", str(tmp_path / "missing"), str(tmp_path / "out")], capsys)
    assert code == 2 and "no such folder" in err
    src = tmp_path / "roll"
    (src / "train").mkdir(parents=True)
    torch.save({"x": 1}, src / "train" / "step_000000.pkl")
    code, _, err = run(["import", str(src), str(tmp_path / "out")], capsys)
    assert code == 2 and "roll dump" in err
    accepted(err.split("run: ")[1].strip())
    code, _, err = run(["import", str(make_dump(tmp_path / "ours")), str(tmp_path / "o2"), "--trust"], capsys)
    assert code == 2 and "already a rollout_mock dump" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(["import", str(empty), str(tmp_path / "o3"), "--trust"], capsys)
    assert code == 2 and "--format roll|verl|areal|slime" in err


def test_demo_workdir_errors_give_accepted_fixes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "something").write_text("x")
    code, _, err = run(["demo", "--workdir", str(busy)], capsys)
    assert code == 2 and "not empty" in err
    accepted(err.split("use a new folder: ")[1].split("  ")[0])
    afile = tmp_path / "f"
    afile.write_text("x")
    code, _, err = run(["demo", "--workdir", str(afile)], capsys)
    assert code == 2 and "is a file" in err
    accepted(err.split("e.g. ")[1].strip())


def test_verify_plot_without_matplotlib_still_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.5}\n')
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    code, out, err = run(["verify", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"),
                          "--plot", str(tmp_path / "p.png")], capsys)
    assert code == 0 and "loss" in out and "rollout_mock[plot]" in err
    assert not (tmp_path / "p.png").exists()


def test_env_after_demo_explains_differences(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rollout_mock.cli.env import explain
    from rollout_mock.determinism import compare_fingerprints

    recorded = {"env": {"NCCL_ALGO": "Ring"}, "torch_flags": {"deterministic_algorithms": True}, "platform": "x"}
    current = {"env": {"NCCL_ALGO": None}, "torch_flags": {"deterministic_algorithms": False}, "platform": "y"}
    lines = explain(compare_fingerprints(recorded, current))
    assert any("NCCL_ALGO" in line and "determinism.apply()" in line for line in lines)
    assert any("deterministic_algorithms" in line for line in lines)
    assert any("platform" in line and "informational" in line for line in lines)


@pytest.mark.parametrize(("argv", "meant"), [
    (["report", "DUMP", "--agianst", "OTHER"], "--against"),
    (["ls", "DUMP", "--verfy"], "--verify"),
    (["diff", "DUMP", "OTHER", "--stpes=3"], "--steps"),
])
def test_a_misspelt_flag_is_named_by_the_command_with_the_flag_meant(
        argv: list[str], meant: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    wrong = next(arg for arg in argv if arg.startswith("--")).partition("=")[0]
    assert err.startswith(f"usage: rollout-mock {argv[0]} "), err  # the command's usage, not the top level's
    assert f"rollout-mock {argv[0]}: error: unrecognized arguments: " in err
    assert f"; did you mean {meant} (not {wrong})?" in err, err

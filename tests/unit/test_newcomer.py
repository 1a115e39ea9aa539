"""A newcomer's day (issue 21, "Errors and CLI"): every friction reproduced, then checked gone."""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import HANG_S

from rollout_mock import ConfigError, MockScheduler, load_config
from rollout_mock.cli import build_parser, main
from rollout_mock.demo import RolloutBatch
from rollout_mock.errors import DumpNotFoundError

ROOT = Path(__file__).resolve().parents[2]


class Proto:
    """Returns a DataProto-like batch (keys listed as batch.rewards, non_tensor_batch.uid)."""

    def get_batch(self, data: Any, global_step: int) -> RolloutBatch:
        return RolloutBatch(
            batch={"rewards": torch.full((4,), float(global_step)), "input_ids": torch.arange(8).reshape(4, 2)},
            non_tensor_batch={"uid": np.array([f"u{i // 2}" for i in range(4)], dtype=object)},
        )


def make_dump(path: Path, steps: int = 3) -> Path:
    with MockScheduler(Proto(), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as s:
        for step in range(steps):
            s.get_batch(None, step)
    return path


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dump(tmp_path_factory.mktemp("newcomer") / "dump")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def accepted(command_line: str) -> None:
    build_parser().parse_args(shlex.split(command_line)[1:])


# ------------------------------------------------------------------ 1. a config without the block
def test_training_config_without_the_block_says_so(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("exp_name: grpo\nmax_steps: 50\nseed: 1\nactor_train:\n  lr: 1.0e-6\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path} has no `rollout_mock:` block")
    assert "unknown key" not in str(info.value)


def test_misspelt_block_name_is_suggested(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("exp_name: grpo\nrollout_mok:\n  enable: true\n  mode: dump\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path} has no `rollout_mock:` block (did you mean `rollout_mok`?)")


def test_the_block_alone_still_loads_and_still_names_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "block.yaml"
    path.write_text("enable: true\nmode: dump\ndump_dir: ./d\n")
    assert load_config(path).dump_dir == "./d"
    with pytest.raises(ConfigError, match=r"rollout_mock\.dump_dri: unknown key"):
        load_config({"enable": True, "dump_dri": "./d"})


# ------------------------------------------------------------------ 14. dump_dir missing
def test_mock_mode_without_dump_dir_is_an_error_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"rollout_mock\.dump_dir: missing in mock mode; set it"):
        load_config({"enable": True, "mode": "mock"})
    assert load_config({"enable": False, "mode": "mock"}).mode.value == "mock"  # not enabled: nothing used


def test_dump_mode_without_dump_dir_warns_once(caplog: pytest.LogCaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import rollout_mock.config.model as model

    monkeypatch.setattr(model, "_warned_default_dump_dir", False)
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    for _ in range(3):
        assert load_config({"enable": True, "mode": "dump"}).dump_dir == "./rollout_mock_dumps"
    warnings = [r for r in caplog.records if "dump_dir is not set" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


# ------------------------------------------------------------------ 2. a file instead of the dump folder
@pytest.mark.parametrize("command", ["ls", "show", "diff", "env", "cut", "logprobs"])
def test_a_step_file_gets_one_message_in_every_command(command: str, dump: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    step_file = dump / "train" / "step_000001.pkl"
    argv = {
        "ls": ["ls", str(step_file)], "show": ["show", str(step_file)], "diff": ["diff", str(step_file), str(dump)],
        "env": ["env", "--dump-dir", str(step_file)],
        "cut": ["cut", str(step_file), str(tmp_path / "out"), "--steps", "1"],
        "logprobs": ["logprobs", str(step_file), "--model", "x.y:z"],
    }[command]
    code, _, err = run(argv, capsys)
    assert code == 2, err
    assert f"{step_file} is a file; pass the dump folder: {dump}" in err
    assert "Run the same steps in dump mode" not in err


def test_mock_scheduler_on_a_step_file_says_the_same(dump: Path) -> None:
    step_file = dump / "train" / "step_000001.pkl"
    with pytest.raises(DumpNotFoundError, match=rf"is a file; pass the dump folder: {dump}$"):
        MockScheduler(None, {"enable": True, "mode": "mock", "dump_dir": str(step_file)}, spec=Proto)


# ------------------------------------------------------------------ 5. demo sizes validated up front
@pytest.mark.parametrize(("argv", "says"), [
    (["--batch-size", "3"], "--batch-size 3: must be a positive multiple of 4"),
    (["--batch-size", "0"], "--batch-size 0: must be a positive multiple of 4"),
    (["--steps", "0"], "--steps 0: must be at least 1"),
])
def test_demo_refuses_bad_sizes_before_running(argv: list[str], says: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["demo", "--workdir", str(tmp_path / "w"), *argv], capsys)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists() and out == ""
    accepted(err.split("e.g. ")[1].strip())


# ------------------------------------------------------------------ 6. quiet, per-step lines, order
def test_quiet_and_verbose_are_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["-q", "ls", "d"]).quiet
    with pytest.raises(SystemExit):
        build_parser().parse_args(["-q", "-v", "ls", "d"])


def test_per_step_lines_do_not_flood(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rollout_mock")
    make_dump(tmp_path / "d", steps=250)
    with MockScheduler(None, {"enable": True, "mode": "mock", "dump_dir": str(tmp_path / "d")}, spec=Proto) as m:
        for step in range(250):
            m.get_batch(None, step)
    dumped = [r for r in caplog.records if "Dumped step" in r.getMessage() and r.levelno >= logging.INFO]
    loaded = [r for r in caplog.records if "Loaded step" in r.getMessage() and r.levelno >= logging.INFO]
    # the first 10 steps of each (as ROLL logs them), then every 100th; the others at DEBUG
    assert len(dumped) == 12 and len(loaded) == 12
    assert any("format=data-only" in r.getMessage() for r in caplog.records)
    assert not any("format=pickle" in r.getMessage() for r in caplog.records)


def test_demo_piped_keeps_its_order_and_suggests_next_commands(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "rollout_mock", "demo", "--steps", "2", "--batch-size", "4", "--negative-control",
         "--workdir", str(tmp_path / "w")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=HANG_S, check=False)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout[-3000:]
    header = next(i for i, line in enumerate(lines) if line.startswith("4. negative control"))
    divergence = next(i for i, line in enumerate(lines) if "verdict: first divergence" in line)
    assert header < divergence
    assert sum("Loaded step" in line for line in lines) <= 2 * 10  # two 2-step replays (first 10 at INFO)
    tail = "\n".join(lines[-5:])
    for command in ("rollout-mock ls", "rollout-mock show", "rollout-mock report", "rollout-mock logprobs"):
        assert command in tail
    for line in lines[-4:]:
        accepted(line.removeprefix("next:").strip().split("   ")[0])


# ------------------------------------------------------------------ 7. import twice
def test_import_twice_names_the_cli_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pickle

    src = tmp_path / "roll"
    (src / "train").mkdir(parents=True)
    (src / "train" / "step_000000.pkl").write_bytes(pickle.dumps({"x": torch.ones(2, 3)}))
    dst = tmp_path / "imported"
    assert run(["import", str(src), str(dst), "--trust", "--no-progress"], capsys)[0] == 0
    code, _, err = run(["import", str(src), str(dst), "--trust", "--no-progress"], capsys)
    assert code == 2 and "--overwrite" in err and "overwrite: true" not in err
    fix = err.split("with: ")[1].split("  ")[0]
    accepted(fix)
    assert run(shlex.split(fix)[1:], capsys)[0] == 0


def test_import_of_a_file_in_another_format_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "roll"
    (src / "train").mkdir(parents=True)
    torch.save({"x": torch.ones(2)}, src / "train" / "step_000000.pkl")  # not a pickle: a torch.save zip
    code, out, err = run(["import", str(src), str(tmp_path / "imported"), "--trust", "--no-progress"], capsys)
    assert code == 2 and "Traceback" not in out + err and len(err.strip().splitlines()) == 1
    assert "cannot read it as a roll dump file" in err and "torch.save" in err


# ------------------------------------------------------------------ 8, 9. keys and splits in cut
def test_ls_keys_syntax_is_accepted_by_cut(dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["ls", str(dump), "--keys"], capsys)
    assert code == 0 and "batch.rewards" in out and "non_tensor_batch.uid" in out
    for i, keys in enumerate(["batch.rewards,non_tensor_batch.uid", "rewards,uid"]):
        code, _, err = run(["cut", str(dump), str(tmp_path / f"c{i}"), "--steps", "1", "--keys", keys], capsys)
        assert code == 0, err
        code, out, _ = run(["ls", str(tmp_path / f"c{i}"), "--keys"], capsys)
        assert "batch.rewards" in out and "non_tensor_batch.uid" in out and "input_ids" not in out
    code, _, err = run(["cut", str(dump), str(tmp_path / "bad"), "--steps", "1", "--keys", "batch.nope"], capsys)
    assert code == 2 and "batch.nope not in the batch" in err


def test_cut_missing_split_lists_the_splits(dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["cut", str(dump), str(tmp_path / "c"), "--steps", "1", "--split", "val"], capsys)
    assert code == 2 and "splits present: train" in err and "(recorded: [])" not in err


# ------------------------------------------------------------------ 10. progress and the demo model
def test_long_commands_have_a_progress_switch_and_logprobs_names_the_demo_model(
        capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for argv in (["logprobs", "d", "--model", "m"], ["cut", "a", "b", "--steps", "0"], ["import", "a", "b"],
                 ["diff", "a", "b"], ["ls", "d", "--verify"], ["show", "d", "--steps", "0-"]):
        assert parser.parse_args([*argv, "--no-progress"]).no_progress
    with pytest.raises(SystemExit):
        main(["logprobs", "--help"])
    assert "rollout_mock.demo:initial_policy" in capsys.readouterr().out


# ------------------------------------------------------------------ 11. Ctrl-C during a dump
def test_interrupted_dump_says_what_was_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rollout_mock")
    with pytest.raises(KeyboardInterrupt), MockScheduler(
            Proto(), {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}) as s:
        s.get_batch(None, 0)
        s.get_batch(None, 1)
        raise KeyboardInterrupt
    assert f"interrupted; 2 step(s) kept in {tmp_path / 'd'}" in caplog.text
    assert "without recording any step" not in caplog.text


# ------------------------------------------------------------------ 12. help in plain text
@pytest.mark.parametrize("command", ["demo", "ls", "env", "verify", "diff", "import", "show", "logprobs", "cut"])
def test_help_has_no_restructuredtext_markup(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":func:" not in out and ":class:" not in out and ":mod:" not in out


def test_plain_text() -> None:
    from rollout_mock.cli import plain_text

    assert plain_text("run ``rollout-mock demo`` via :func:`~rollout_mock.cli.main` or :class:`a.B`::") == \
        "run rollout-mock demo via main or a.B:"


# ------------------------------------------------------------------ 13. ls --json
def test_ls_json_prints_the_streams_and_all_the_manifest(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["ls", str(dump), "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and "streams" in data and "fingerprint" not in data
    code, out, _ = run(["ls", str(dump), "--json", "--all"], capsys)
    assert code == 0 and "fingerprint" in json.loads(out)
    code, _, err = run(["ls", str(dump), "--all"], capsys)
    assert code == 2 and "--all goes with --json" in err

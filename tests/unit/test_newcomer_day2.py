"""A newcomer's second day (issue 30): each friction reproduced, then checked gone."""

from __future__ import annotations

import logging
import pydoc
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

import rollout_mock
from rollout_mock import ConfigError, MockScheduler, StepNotFoundError, StreamNotFoundError, load_config
from rollout_mock.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ help() shows plain text
@pytest.mark.parametrize("name", ["MockScheduler", "wrap_scheduler", "mock_class", "open_dump", "Dump", "load_step",
                                  "load_config", "wrap_trl", "MetricsWriter", "verify", "diff_dumps"])
def test_help_on_the_public_api_is_plain_text(name: str) -> None:
    text = pydoc.render_doc(getattr(rollout_mock, name), renderer=pydoc.plaintext)
    assert re.findall(r"``|:[a-z]+:`", text) == []
    assert [line for line in text.splitlines() if line.strip(" |").startswith("# ")] == []


def test_help_on_mock_scheduler_names_the_typed_entry_point() -> None:
    text = pydoc.render_doc(rollout_mock.MockScheduler, renderer=pydoc.plaintext)
    assert "wrap_scheduler is the typed entry point" in text
    assert "load_config takes" in text  # ":func:`~rollout_mock.load_config` takes", rendered


# ------------------------------------------------------------------ keys beside the block
def test_an_ill_typed_top_level_max_steps_is_named(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("exp_name: grpo\nmax_steps: ten\nrollout_mock:\n  enable: true\n  mode: mock\n  dump_dir: d\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: max_steps: 'ten' at the top level is not an integer")
    assert "e.g. `max_steps: 10`" in str(info.value)
    with pytest.raises(ConfigError, match="max_steps: True at the top level"):
        load_config({"max_steps": True, "rollout_mock": {"enable": True, "dump_dir": "d"}})


def test_the_top_level_max_steps_is_still_read_and_the_blocks_wins() -> None:
    block = {"enable": True, "mode": "mock", "dump_dir": "d"}
    assert load_config({"max_steps": 50, "rollout_mock": block}).max_steps == 50
    assert load_config({"max_steps": -1, "rollout_mock": block}).max_steps is None  # "no limit": no check
    # the block's own max_steps is used; the framework's top-level value is not ours to judge then
    assert load_config({"max_steps": "ten", "rollout_mock": {**block, "max_steps": 3}}).max_steps == 3


def test_rollout_mock_options_beside_the_block_are_named_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("exp_name: grpo\nseed: 1\nsave_steps: 5\nmode: mock\ndump_dir: /runs/d\n"
                    "rollout_mock:\n  enable: true\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: mode, dump_dir are rollout_mock options written beside the `rollout_mock:` block, where they "
        f"are not read: move mode, dump_dir under rollout_mock:")
    # the framework's own keys beside the block (ROLL's, verl's) are left alone, as in configs/
    assert load_config(ROOT / "configs" / "roll_mock.yaml").max_steps == 50
    assert load_config({"trainer": {"total_epochs": 1}, "data": {}, "seed": 1, "save_steps": 5,
                        "rollout_mock": {"enable": True, "mode": "dump", "dump_dir": "d"}}).dump_dir == "d"


def test_a_block_file_with_unknown_keys_names_them(tmp_path: Path) -> None:
    path = tmp_path / "block.yaml"
    path.write_text("enable: true\nmode: dump\ndump_dir: d\nmax_stepz: 10\n")
    with pytest.raises(ConfigError, match=r"rollout_mock\.max_stepz: unknown key .*did you mean 'max_steps'"):
        load_config(path)
    path.write_text("enable: true\nfoo: 1\n")
    with pytest.raises(ConfigError, match=r"\(read as the block itself, foo would be an unknown key\)"):
        load_config(path)


# ------------------------------------------------------------------ getting-started
def test_getting_started_lists_every_extra_and_every_framework() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    text = (ROOT / "docs" / "getting-started.md").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert sorted(e for e in extras if f"| `{e}` |" not in text) == []
    following = text[text.index("## Next"):]
    pages = sorted(p.name for p in (ROOT / "docs" / "frameworks").glob("*.md"))
    assert [p for p in pages if f"(frameworks/{p})" not in following] == []


# ------------------------------------------------------------------ README's ROLL snippet
def test_readme_roll_snippet_is_roll_pages_one_line() -> None:
    readme = (ROOT / "README.md").read_text()
    roll_section = readme[readme.index("### ROLL"):readme.index("### verl")]
    snippet = re.findall(r"```python\n(.*?)```", roll_section, flags=re.S)
    page = (ROOT / "docs" / "frameworks" / "roll.md").read_text()
    one_line = re.findall(r"```python\n(.*?)```", page[page.index("## The one line"):], flags=re.S)[0]
    assert len(snippet) == 1 and one_line.startswith(snippet[0])


# ------------------------------------------------------------------ replay: interrupted, empty streams
class _Rollout:
    def get_batch(self, global_step: int) -> dict[str, Any]:
        return {"reward": torch.full((2,), float(global_step))}


def _dump(path: Path, steps: int = 3, *, empty_val: bool = False) -> Path:
    config = {"enable": True, "mode": "dump", "dump_dir": str(path)}
    with MockScheduler(_Rollout(), config) as train:
        for step in range(steps):
            train.get_batch(global_step=step)
    if empty_val:  # verl's validation scheduler, wrapped, never called (the run did no validation)
        MockScheduler(_Rollout(), config, split="val").close()
    return path


def test_ctrl_c_during_replay_says_where_it_stopped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dump = _dump(tmp_path / "d")
    caplog.set_level(logging.INFO, logger="rollout_mock")
    with pytest.raises(KeyboardInterrupt), MockScheduler(
            None, {"enable": True, "mode": "mock", "dump_dir": str(dump)}, spec=_Rollout) as replay:
        replay.get_batch(global_step=0)
        replay.get_batch(global_step=1)
        raise KeyboardInterrupt
    assert f"[RolloutMock] interrupted at step 1 of train (mode=mock); 2 step(s) replayed from {dump}" in caplog.text


def test_an_unused_empty_stream_does_not_warn_and_a_call_of_it_fails_clearly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dump = _dump(tmp_path / "d", empty_val=True)
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    config = {"enable": True, "mode": "mock", "dump_dir": str(dump)}
    with MockScheduler(None, config, spec=_Rollout) as train, \
            MockScheduler(None, config, split="val", spec=_Rollout) as val:
        train.get_batch(global_step=0)
        assert caplog.records == []  # no "every call will fail" for a stream the run never calls
        with pytest.raises(StepNotFoundError, match=r"(?s)Mock file not found: .*Recorded steps for val: none"):
            val.get_batch(global_step=0)


def test_a_missing_split_is_one_error_with_no_warning_before_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dump = _dump(tmp_path / "d")
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    with pytest.raises(StreamNotFoundError, match="has no 'val' split"):
        MockScheduler(None, {"enable": True, "mode": "mock", "dump_dir": str(dump)}, split="val")
    assert caplog.records == []


# ------------------------------------------------------------------ -q after the command
def test_quiet_and_verbose_work_after_the_command_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for argv in (["-q", "ls", "d"], ["ls", "-q", "d"], ["ls", "d", "--quiet"]):
        args = parser.parse_args(argv)
        assert args.quiet and not args.verbose, argv
    assert parser.parse_args(["ls", "-v", "d"]).verbose and not parser.parse_args(["ls", "d"]).quiet
    with pytest.raises(SystemExit):
        main(["-q", "ls", "-v", str(tmp_path)])
    assert "exclude each other" in capsys.readouterr().err


def test_ctrl_c_in_a_command_says_interrupted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    import rollout_mock.cli.ls as ls

    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(ls, "run", interrupted)
    assert main(["ls", str(tmp_path)]) == 130
    assert capsys.readouterr().err == "rollout-mock ls: interrupted\n"


# ------------------------------------------------------------------ ls notices a damaged step
def test_plain_ls_notices_a_truncated_step_from_its_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = _dump(tmp_path / "my dumps")
    step = dump / "train" / "step_000001.pkl"
    size = step.stat().st_size
    with open(step, "r+b") as file:
        file.truncate(size // 2)
    assert main(["ls", str(dump)]) == 1
    out, err = capsys.readouterr()
    marked = [line for line in out.splitlines() if "DAMAGED" in line]
    assert len(marked) == 1 and "step      1" in marked[0]
    assert f"DAMAGED: size is {size // 2} bytes, the index says {size} (truncated?)" in marked[0]
    assert err.startswith("rollout-mock ls: 1 damaged step file (train step 1): replaying it fails with CorruptStepError")
    assert err.rstrip().endswith(f"rollout-mock ls '{dump}' --verify checks every checksum")
    step.unlink()
    assert main(["ls", str(dump), "--json"]) == 1
    assert "(train step 1)" in capsys.readouterr().err


def test_ls_verify_checks_every_checksum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = _dump(tmp_path / "d")
    assert main(["ls", str(dump), "--verify"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("verified: every step file's size and checksum match the index")
    step = dump / "train" / "step_000002.pkl"
    data = bytearray(step.read_bytes())
    data[-3] ^= 0xFF  # same size, one byte changed: only reading the bytes finds it
    step.write_bytes(bytes(data))
    assert main(["ls", str(dump)]) == 0
    capsys.readouterr()
    assert main(["ls", "-q", str(dump), "--verify"]) == 1
    out, err = capsys.readouterr()
    assert [line.split("DAMAGED: ")[1] for line in out.splitlines() if "DAMAGED" in line][0].startswith(
        "checksum crc32:")
    assert "(train step 2)" in err and "--verify checks" not in err


def test_ls_verify_has_a_progress_bar_over_the_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import rollout_mock.text as progress

    dump = _dump(tmp_path / "d")
    bars: list[dict[str, Any]] = []
    real = progress.progress_bar

    def recording(total: float, **options: Any) -> Any:
        bar = real(total, **{**options, "enabled": False})
        bars.append({"total": total, "enabled": options.get("enabled"), "done": 0})
        update = bar.update
        bar.update = lambda n=1: (bars[-1].__setitem__("done", bars[-1]["done"] + n), update(n))[1]
        return bar

    monkeypatch.setattr(progress, "progress_bar", recording)
    assert main(["ls", str(dump), "--verify"]) == 0
    total = sum(p.stat().st_size for p in (dump / "train").glob("step_*.pkl"))
    assert bars == [{"total": total, "enabled": None, "done": total}]  # None: shown on a terminal only
    assert main(["ls", str(dump), "--verify", "--no-progress"]) == 0
    assert bars[-1]["enabled"] is False


# ------------------------------------------------------------------ suggested commands, shell-quoted
def test_the_demos_suggested_commands_are_shell_quoted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workdir = tmp_path / "my runs" / "demo"
    assert main(["demo", "--steps", "1", "--batch-size", "4", "--workdir", str(workdir)]) == 0
    lines = capsys.readouterr().out.splitlines()[-4:]
    for line in lines:
        argv = shlex.split(line.removeprefix("next:").strip().split("   ")[0])
        assert argv[2] == str(workdir / "dump"), line
        build_parser().parse_args(argv[1:])
    assert shlex.split(lines[2].strip().split("   ")[0])[4] == str(workdir / "report.html")


def test_a_parent_folder_suggests_quoted_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = _dump(tmp_path / "my dumps")
    assert main(["show", str(tmp_path)]) == 2
    suggested = capsys.readouterr().err.split("are inside it: ")[1].strip()
    assert shlex.split(suggested) == ["rollout-mock", "show", str(dump)]


# ------------------------------------------------------------------ show
def test_show_on_a_batch_without_sequences_says_why_and_what_to_do(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    dump = _dump(tmp_path / "d")  # {"reward": tensor}: no token ids, no text
    assert main(["show", str(dump), "--steps", "0-1"]) == 0
    out = capsys.readouterr().out
    assert "=== train step 0: 0 of 0 traces shown (0 rejected)\n  no sequences to show: show reads token ids" in out
    assert "this step holds none of them (its keys: reward)" in out
    assert f"rollout-mock ls {dump} --keys" in out and "rollout-mock report" in out
    assert "=== train step 1: 0 of 0 traces shown (0 rejected)\n  no sequences (see step 0)" in out
    assert main(["show", str(dump), "--jsonl"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "train step 0: no sequences to show" in captured.err


def test_show_over_many_steps_has_a_progress_bar_when_its_output_is_not_a_terminal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import rollout_mock.text as progress

    dump = _dump(tmp_path / "d", steps=4)
    calls: list[tuple[float, Any]] = []
    real = progress.progress_bar

    def recording(total: float, **options: Any) -> Any:
        calls.append((total, options.get("enabled")))
        return real(total, **{**options, "enabled": False})

    monkeypatch.setattr(progress, "progress_bar", recording)
    assert main(["show", str(dump), "--steps", "0-", "--jsonl"]) == 0  # captured: stdout is not a terminal
    assert main(["show", str(dump), "--steps", "0-", "--no-progress"]) == 0
    assert calls == [(4, None), (4, False)]


# ------------------------------------------------------------------ one order for both verdicts
def test_the_online_verdict_and_verify_name_the_same_metric_first(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    from rollout_mock import MetricsWriter, verify

    dump = tmp_path / "d"
    for mode in ("dump", "mock"):
        config = {"enable": True, "mode": mode, "dump_dir": str(dump)}
        with MockScheduler(_Rollout(), config) as rollout, \
                MetricsWriter(tmp_path / f"{mode}.jsonl", expected=rollout) as log:
            for step in range(3):
                rollout.get_batch(global_step=step)
                changed = mode == "mock" and step == 1  # both metrics diverge at the same step
                log.log(step, {"pg_loss": 0.5 + step + changed * 1e-9, "approx_kl": 0.1 * step + changed * 1e-9})
    online = re.search(r"first divergence from the dump run at step (\d+): (\w+)", caplog.text)
    assert online is not None and online.groups() == ("1", "pg_loss")
    report = verify(tmp_path / "dump.jsonl", tmp_path / "mock.jsonl")
    assert report.first_divergence is not None
    assert (report.first_divergence.first_divergent_step, report.first_divergence.name) == (1, "pg_loss")
    assert [c.name for c in report.comparisons] == ["pg_loss", "approx_kl"]  # as logged, not alphabetical


# ------------------------------------------------------------------ diff on metrics files
def test_diff_on_metrics_points_to_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run b"
    run.mkdir()
    for path in (tmp_path / "a.jsonl", run / "metrics.jsonl"):
        path.write_text('{"step": 0, "loss": 1.0}\n')
    assert main(["diff", str(tmp_path / "a.jsonl"), str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rollout-mock diff: error: {tmp_path / 'a.jsonl'} holds a run's metrics, not a dump")
    suggested = err.split("compare two runs' metrics with: ")[1].strip()
    assert shlex.split(suggested) == ["rollout-mock", "verify", str(tmp_path / "a.jsonl"), str(run)]
    assert main(shlex.split(suggested)[1:]) == 0

"""A real Hugging Face TRL GRPO run, recorded and replayed bit for bit (``rollout_mock.wrap_trl``).

The training runs (``trl_run.py``) build a tiny ``LlamaForCausalLM`` and a word-level tokenizer
locally (nothing is downloaded), train GRPO on the CPU for 3 optimizer steps with gradient
accumulation 2 and ``steps_per_generation`` 2, and write ``trainer.state.log_history``. The dump
runs once per module; each replay runs in a fresh process with ``model.generate`` and the reward
function raising if called.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import HANG_S

pytest.importorskip("trl", reason="TRL is not installed (pip install 'rollout_mock[test]')")
pytest.importorskip("datasets", reason="datasets is not installed (pip install 'rollout_mock[test]')")

RUN = Path(__file__).with_name("trl_run.py")
REPO = Path(__file__).resolve().parents[2]
#: wall-clock keys: the only ones allowed to differ between the dump run and its replay
TIMINGS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}
STEPS = 3


def run(tmp: Path, mode: str, *extra: str, check: bool = True) -> tuple[subprocess.CompletedProcess[str], Any]:
    out = tmp / f"{mode}-{len(list(tmp.glob('*.json')))}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(RUN), str(out), mode, str(tmp / "dump"), *extra],
        capture_output=True, text=True, timeout=HANG_S, env=env, cwd=tmp, check=False,
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc, json.loads(out.read_text())["log_history"]
    return proc, json.loads(out.read_text()) if out.exists() else None  # {"error": ..., "message": ...}


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    tmp = tmp_path_factory.mktemp("trl")
    _, history = run(tmp, "dump", "--max-steps", str(STEPS), "--metrics", str(tmp / "dump.jsonl"))
    return tmp, history


def numeric(history: list[dict[str, Any]]) -> list[dict[str, float]]:
    return [{k: v for k, v in entry.items() if isinstance(v, (int, float)) and k not in TIMINGS}
            for entry in history]


def test_replay_is_bit_identical_without_generation_or_rewards(dumped: tuple[Path, Any]) -> None:
    tmp, recorded = dumped
    _, replayed = run(tmp, "mock", "--max-steps", str(STEPS), "--forbid", "--metrics", str(tmp / "mock.jsonl"))
    expected, actual = numeric(recorded), numeric(replayed)
    assert len(expected) == STEPS + 1  # one entry per optimizer step, then the train summary
    # the completion metrics come from generation: they are replayed, not lost
    for key in ("num_tokens", "completions/mean_length", "completions/clipped_ratio", "reward", "loss", "kl"):
        assert key in expected[0] and key in actual[0], key
    for step, (a, b) in enumerate(zip(expected, actual, strict=True)):
        assert a.keys() == b.keys(), step
        for key in a:
            same = a[key] == b[key] or (math.isnan(a[key]) and math.isnan(b[key]))
            assert same, f"log entry {step}, {key}: dump {a[key]!r} != mock {b[key]!r}"
    verify = subprocess.run([sys.executable, "-m", "rollout_mock", "verify", str(tmp / "dump.jsonl"),
                             str(tmp / "mock.jsonl")], capture_output=True, text=True, cwd=REPO, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_changed_learning_rate_is_caught_by_verify(dumped: tuple[Path, Any]) -> None:
    tmp, _ = dumped
    run(tmp, "mock", "--max-steps", str(STEPS), "--forbid", "--lr", "2e-2", "--metrics", str(tmp / "lr.jsonl"))
    verify = subprocess.run([sys.executable, "-m", "rollout_mock", "verify", str(tmp / "dump.jsonl"),
                             str(tmp / "lr.jsonl")], capture_output=True, text=True, cwd=REPO, check=False)
    assert verify.returncode != 0, verify.stdout
    assert "learning_rate" in verify.stdout + verify.stderr or "loss" in verify.stdout + verify.stderr


def test_more_steps_than_recorded_fail_with_missing_step(dumped: tuple[Path, Any]) -> None:
    tmp, _ = dumped
    proc, _ = run(tmp, "mock", "--max-steps", str(STEPS + 2), "--forbid", check=False)
    assert proc.returncode != 0
    assert "StepNotFoundError" in proc.stderr, proc.stderr[-3000:]
    assert "model.generate called" not in proc.stderr and "reward function called" not in proc.stderr


def test_record_is_plain_data(dumped: tuple[Path, Any]) -> None:
    """Each generation call is one step, loadable with the safe (data-only) loader."""
    import torch

    from rollout_mock import open_dump
    from rollout_mock.storage.manifest import StreamId

    tmp, _ = dumped
    dump = open_dump(tmp / "dump")
    steps = dump.steps(StreamId("train"))
    assert steps == [0, 1, 2]  # one generation per optimizer step (steps_per_generation == GA == 2)
    record = dump.load(0, "train")
    assert record["format"] == "rollout_mock.trl/1"
    output = record["generate"]["output"]
    assert len(output[1]) == 8  # completion ids: 2 micro-batches x 4 completions
    assert isinstance(record["rewards"]["rewards_per_func"], torch.Tensor)
    assert record["rewards"]["rewards_per_func"].shape == (8, 1)
    assert record["generate"]["rng"]["torch"].dtype == torch.uint8
    assert "num_tokens" in record["generate"]["metrics"]


# ------------------------------------------------------------------------------ faithful replay (issue 26)
def _failure(proc: subprocess.CompletedProcess[str], result: Any) -> dict[str, Any]:
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "model.generate called" not in proc.stderr and "reward function called" not in proc.stderr
    assert isinstance(result, dict)
    return result


@pytest.mark.parametrize(("option", "value", "setting"), [("--num-generations", "2", "num_generations: 4 in the "
                                                                                         "dump run, 2 now"),
                                                          ("--batch-size", "8", "per_device_train_batch_size: 4")])
def test_other_rollout_settings_stop_before_generating_or_training(dumped: tuple[Path, Any], option: str, value: str,
                                                                   setting: str) -> None:
    tmp, _ = dumped
    proc, output = run(tmp, "mock", "--max-steps", str(STEPS), "--forbid", option, value, check=False)
    result = _failure(proc, output)
    assert result["error"] == "RolloutSettingsMismatchError" and setting in result["message"]


def test_a_run_resumed_from_a_checkpoint_replays_the_remaining_steps_and_evaluations(tmp_path: Path) -> None:
    _, recorded = run(tmp_path, "dump", "--max-steps", "4", "--save-steps", "2", "--eval-steps", "2",
                      "--output-dir", str(tmp_path / "out"))
    _, resumed = run(tmp_path, "mock", "--max-steps", "4", "--eval-steps", "2", "--forbid",
                     "--resume", str(tmp_path / "out" / "checkpoint-2"), "--output-dir", str(tmp_path / "out-mock"))

    def by_step(history: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, float]]:
        out = {}
        for entry in numeric(history):
            kind = "eval" if any(k.startswith("eval_") for k in entry) else "train" if "loss" in entry else "end"
            out[(int(entry["step"]), kind)] = {k: v for k, v in entry.items() if not k.endswith(("_runtime", "per_second"))}
        return out

    expected, actual = by_step(recorded), by_step(resumed)
    remaining = [k for k in expected if k[0] > 2 and k[1] != "end"]
    assert remaining == [(3, "train"), (4, "train"), (4, "eval")]
    for key in remaining:  # steps 3-4 and the evaluation at 4: the records the dump run made there
        assert expected[key] == actual[key], key
    # the token counter is the dump run's (advanced by the recorded calls, not overwritten)
    assert expected[(4, "train")]["num_tokens"] == actual[(4, "train")]["num_tokens"]


def test_check_mode_generates_compares_and_trains_on_the_recording(dumped: tuple[Path, Any]) -> None:
    from rollout_mock import read_check_verdicts

    tmp, recorded = dumped
    _, checked = run(tmp, "check", "--max-steps", str(STEPS))
    assert numeric(checked)[:STEPS] == numeric(recorded)[:STEPS]
    verdicts = read_check_verdicts(tmp / "dump", split="train")
    assert [v.step for v in verdicts] == list(range(STEPS))
    assert all(v.equal and v.match == 1.0 and v.tokens > 0 for v in verdicts)  # same weights: same tokens


def test_another_seed_is_refused_before_training(dumped: tuple[Path, Any]) -> None:
    """Issue 35 item 2: another ``seed`` with ``shuffle_dataset=False`` replayed bit for bit (RNG
    replay restores the dump run's generator states after each generation, which hides the
    seed), while two live runs with these seeds differ: the seed is a compared setting."""
    tmp, _ = dumped
    proc, result = run(tmp, "mock", "--max-steps", str(STEPS), "--forbid", "--seed", "7", "--no-shuffle", check=False)
    assert proc.returncode == 3 and result["error"] == "RolloutSettingsMismatchError", proc.stderr[-2000:]
    assert "  seed: 0 in the dump run, 7 now" in result["message"]


def test_another_chat_template_is_refused_naming_it(tmp_path: Path) -> None:
    """Issue 34 item 4 / 35: the tokenizer and its chat template are fingerprinted by content
    (not by path: each run saves it to its own directory) and a changed template is refused."""
    run(tmp_path, "dump", "--max-steps", "1", "--conversational")
    _, replayed = run(tmp_path, "mock", "--max-steps", "1", "--conversational", "--forbid")
    assert replayed
    proc, result = run(tmp_path, "mock", "--max-steps", "1", "--conversational", "--forbid",
                       "--chat-template", "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}",
                       check=False)
    assert proc.returncode == 3 and result["error"] == "RolloutSettingsMismatchError", proc.stderr[-2000:]
    assert "tokenizer.chat_template:" in result["message"]
    assert "vocab" not in result["message"]

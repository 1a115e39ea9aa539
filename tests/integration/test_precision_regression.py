"""This project's own precision-regression CI job, on the demo GRPO pipeline.

The same job a user wires into their CI (README, "Precision verification"): record a baseline in dump mode,
replay it in mock mode, check that the metrics are bit-identical with the pytest plugin; and a
negative control: a deliberately changed training computation (4 micro-batches instead of 2: the
same maths in another summation order) must be caught, naming the first divergent step and metric.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import HANG_S, restored_process_state

from rollout_mock import diff_dumps, verify
from rollout_mock.compare.pytest_plugin import assert_metrics_match
from rollout_mock.demo import run_pipeline

pytest_plugins = ["pytester"]

STEPS = 4
BATCH = 32


@pytest.fixture(scope="module", autouse=True)
def _restore_process_state() -> Iterator[None]:
    """run_pipeline() makes the process deterministic: undo that after this module."""
    with restored_process_state():
        yield


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded baseline: ``dumps/`` plus ``metrics.jsonl`` (what CI caches on main)."""
    root = tmp_path_factory.mktemp("baseline")
    result = run_pipeline("dump", root / "dumps", root / "metrics.jsonl", steps=STEPS, batch_size=BATCH)
    assert result.scheduler_constructed == 1
    return root


def test_replay_is_bit_identical(baseline: Path, tmp_path: Path) -> None:
    run = run_pipeline("mock", baseline / "dumps", tmp_path / "metrics.jsonl", steps=STEPS, batch_size=BATCH)
    assert run.scheduler_constructed == 0  # no rollout engine in mock mode
    report = assert_metrics_match(baseline / "metrics.jsonl", tmp_path / "metrics.jsonl")
    assert report.ok and report.comparisons
    for comparison in report.comparisons:
        assert comparison.bitwise and comparison.identical_steps == STEPS, comparison
    # a run directory works as well as a file
    assert_metrics_match(baseline, tmp_path)


def test_negative_control_is_caught_and_named(baseline: Path, tmp_path: Path) -> None:
    run_pipeline("mock", baseline / "dumps", tmp_path / "metrics.jsonl", steps=STEPS, batch_size=BATCH, micro_batches=4)
    report = verify(baseline / "metrics.jsonl", tmp_path / "metrics.jsonl")
    first = report.first_divergence
    assert not report.ok and first is not None
    assert first.name in {"pg_loss", "approx_kl", "clip_frac", "entropy", "grad_norm"}
    assert first.first_divergent_step is not None and first.first_divergent_step < STEPS
    with pytest.raises(AssertionError) as info:
        assert_metrics_match(baseline / "metrics.jsonl", tmp_path / "metrics.jsonl")
    message = str(info.value)
    assert message.startswith("metrics diverge from the baseline")
    assert (
        f"first divergence: step {first.first_divergent_step}, metric {first.name} "
        f"(baseline={first.baseline_value!r} candidate={first.candidate_value!r})"
    ) in message
    # reward_mean depends on the rollouts only: the replayed data are the recorded data
    assert report.comparison("reward_mean").ok


def test_replayed_rollouts_are_the_recorded_ones(baseline: Path, tmp_path: Path) -> None:
    """``rollout-mock diff`` on a copy of the baseline: identical from the manifests alone."""
    import shutil

    copy = tmp_path / "restored"
    shutil.copytree(baseline / "dumps", copy)
    report = diff_dumps(baseline / "dumps", copy)
    assert report.identical and report.loaded_steps == 0


USER_TEST = """
from pathlib import Path

from rollout_mock.demo import run_pipeline

DUMPS = Path({dumps!r})


def test_refactor_keeps_numerics(assert_matches_baseline, tmp_path):
    run_pipeline("mock", DUMPS, tmp_path / "metrics.jsonl", steps={steps}, batch_size={batch})
    assert_matches_baseline(tmp_path / "metrics.jsonl")


def test_changed_summation_order(assert_matches_baseline, tmp_path):
    run_pipeline("mock", DUMPS, tmp_path / "metrics.jsonl", steps={steps}, batch_size={batch}, micro_batches=4)
    assert_matches_baseline(tmp_path / "metrics.jsonl")
"""


def test_pytest_plugin_end_to_end(baseline: Path, pytester: pytest.Pytester) -> None:
    """A user's test file with the fixture, against a recorded baseline: pass and fail cases."""
    pytester.makepyfile(test_user=USER_TEST.format(dumps=str(baseline / "dumps"), steps=STEPS, batch=BATCH))
    result = pytester.runpytest(f"--rollout-mock-baseline={baseline / 'metrics.jsonl'}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_changed_summation_order*",
        "*metrics diverge from the baseline*",
        "*first divergence: step *, metric *",
    ])
    assert "test_refactor_keeps_numerics FAILED" not in result.stdout.str()
    # without the option the precision tests are skipped, not failed
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(skipped=2)


def test_demo_negative_control_cli(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "rollout_mock", "demo", "--negative-control", "--workdir", str(tmp_path), "--steps", "3"],
        capture_output=True, text=True, timeout=HANG_S, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BIT-IDENTICAL" in result.stdout
    assert "Caught: first divergence at step" in result.stdout
    assert "Traceback" not in result.stderr


def _workflow_commands(path: Path) -> list[list[str]]:
    """Every ``rollout-mock ...`` invocation in the ``run:`` blocks of a workflow file."""
    import re
    import shlex

    import yaml

    workflow = yaml.safe_load(path.read_text())
    commands = []
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            script = step.get("run", "").replace("\\\n", " ")
            for line in script.splitlines():
                line = line.split("#", 1)[0]
                for part in re.split(r"\|\||\||>|&&", line):
                    words = shlex.split(part)
                    if words and words[0] == "rollout-mock":
                        commands.append(words[1:])
    return commands


def test_github_actions_example_uses_real_commands() -> None:
    from rollout_mock import cli

    path = Path(__file__).resolve().parents[2] / "configs" / "github-actions-precision.yml"
    commands = _workflow_commands(path)
    assert {c[0] for c in commands} >= {"verify", "diff", "ls"}
    parser = cli.build_parser()
    for words in commands:
        parser.parse_args(words)  # SystemExit (test error) on an unknown option
    text = path.read_text()
    assert "--rollout-mock-enable" not in text  # no made-up training flags
    assert "rollout_mock.mode=mock" in text

"""verl's V1 trainer (``trainer.use_v1: true``, verl 0.9's default), its real code on a CPU.

Each run is ``verl_v1_run.py`` in its own process: verl's real ``PPOTrainerSync`` /
``PPOTrainerColocateAsync`` / ``PPOTrainerSeparateAsync`` (``fit``, ``step``, the real
``ReplayBuffer``/``ReplayBufferAsync`` sampling with staleness eviction and refills, balancing,
advantages, metrics) over the TransferQueue double, with an agent loop whose asynchronous
timing differs in every process and a tiny torch actor. Dump, then mock with another
``PYTHONHASHSEED``: the parameters and the logged metrics are bit-identical and nothing is
generated in mock mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verl.protocol")
pytestmark = [pytest.mark.verl, pytest.mark.slow]

from conftest import HANG_S

from rollout_mock import open_dump  # noqa: E402

RUN = Path(__file__).with_name("verl_v1_run.py")
ROOT = Path(__file__).resolve().parents[2]


def run(mode: str, trainer_mode: str, dump: Path, out: Path, *, seed: str, batch: int = 4,
        val_batch: int = 0, sync_steps: int = 1, threshold: int = 2, expect: int = 0) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed}
    proc = subprocess.run([sys.executable, str(RUN), mode, trainer_mode, str(dump), str(out), "4", str(batch),
                           str(val_batch), str(sync_steps), str(threshold)],
                          env=env, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == expect, proc.stderr[-4000:]
    result: dict[str, Any] = torch.load(out, weights_only=False)
    return result


def same_run(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["params"].keys() == b["params"].keys()
    for name in a["params"]:
        assert torch.equal(a["params"][name], b["params"][name]), name
    assert [step for step, _ in a["metrics"] if step > 0] == [1, 2, 3, 4]
    assert a["metrics"] == b["metrics"]
    assert a["versions"] == b["versions"]
    assert a["prompts_left"] == b["prompts_left"]  # the same prompts cleared (selected or evicted)


@pytest.mark.parametrize("trainer_mode", ["sync", "separate_async", "colocate_async"])
def test_v1_dump_then_mock_in_separate_processes_is_bit_identical(trainer_mode: str, tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    recorded = run("dump", trainer_mode, dump, tmp_path / "dump.pt", seed="1")
    assert recorded["generated"] > 0
    replayed = run("mock", trainer_mode, dump, tmp_path / "mock.pt", seed="2")
    assert replayed["generated"] == 0  # AgentLoopManagerTQ.generate_sequences never ran
    same_run(recorded, replayed)

    listing = open_dump(dump)
    assert {s.key: list(listing.steps(s)) for s in listing.streams()} == {"train": [1, 2, 3, 4]}
    record = listing.load(2)
    assert record["partition"] == "train" and record["batch_size"] == 4
    assert len(record["keys"]) == 8 and all(rest.endswith("_0") for _, rest in record["keys"])  # rollout.n = 2
    assert {"prompts", "responses", "rm_scores", "uid"} <= set(record["fields"])
    versions = [(t["min_global_steps"], t["max_global_steps"]) for t in record["tags"]]
    assert versions == recorded["versions"][1]
    from rollout_mock.adapters.verl import weight_versions

    assert [c.provenance for c in listing.calls(2)] == [weight_versions(record)]  # in the index
    if trainer_mode == "sync":
        assert recorded["versions"] == [[(s, s)] * 8 for s in range(4)]  # on-policy
    else:
        # one warm-up batch: step 2 trains on prompts submitted at step 1, or at step 2 when the producer
        # was ahead (which, depends on the machine's timing; the replay is bit-identical either way)
        assert {t["global_steps"] for t in record["tags"]} <= {1, 2}
        assert all(hi <= 2 for _, hi in versions)


def test_v1_separate_async_evictions_and_refills_replay(tmp_path: Path) -> None:
    """max_off_policy_threshold=1: at every step the sampler evicts the prompts submitted the step
    before (staleness metrics logged) and refills as many; which groups a step trains on depends
    on what finished first. The mock run makes the same refills (the data loader advances alike),
    clears the same prompts and trains on the same groups, bit-identically."""
    dump = tmp_path / "dump"
    recorded = run("dump", "separate_async", dump, tmp_path / "dump.pt", seed="1", threshold=1)
    replayed = run("mock", "separate_async", dump, tmp_path / "mock.pt", seed="2", threshold=1)
    assert replayed["generated"] == 0
    same_run(recorded, replayed)
    evicted = [m.get("training/off_policy/evicted_samples", 0) for _, m in recorded["metrics"]]
    assert sum(evicted) > 0
    listing = open_dump(dump)
    records = [listing.load(step) for step in (1, 2, 3, 4)]
    for r in records:  # every evicted group was refilled, and cleared with the selected ones
        assert sum(r["refills"]) == r["metrics"].get("training/off_policy/evicted_samples", 0)
        assert len(r["cleared"]) == 4 + sum(r["refills"])
    assert sum(sum(r["refills"]) for r in records) == sum(evicted)


def test_v1_another_batch_size_is_an_error_naming_step_and_counts(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    run("dump", "sync", dump, tmp_path / "dump.pt", seed="1")
    error = run("mock", "sync", dump, tmp_path / "mock.pt", seed="3", batch=8, expect=3)
    assert error["error"] == "ReplayMismatchError"
    assert error["step"] == 1
    assert "step=1" in error["message"] and "asks for 8 prompt groups" in error["message"]
    assert "consumed 4" in error["message"] and "nothing is cycled" in error["message"]


def test_v1_validation_in_three_batches_dump_then_mock(tmp_path: Path) -> None:
    """V1's real _validate with data.val_batch_size=2 over 6 prompts: three ReplayBuffer.sample
    calls of the val partition per validation (global_steps 0, 2, 4), each recorded as one call of
    its step and replayed in recorded order; training steps in between."""
    dump = tmp_path / "dump"
    recorded = run("dump", "sync", dump, tmp_path / "dump.pt", seed="1", val_batch=2)
    replayed = run("mock", "sync", dump, tmp_path / "mock.pt", seed="2", val_batch=2)
    assert replayed["generated"] == 0
    same_run(recorded, replayed)
    val = [(step, m) for step, m in recorded["metrics"] if any(k.startswith("val-") for k in m)]
    assert [step for step, _ in val] == [0, 2, 4]
    listing = open_dump(dump)
    assert list(listing.steps(listing.stream("val"))) == [0, 2, 4]


def test_v1_separate_async_with_two_mini_batches_per_step_dump_then_mock(tmp_path: Path) -> None:
    """parameter_sync_step=2: ReplayBuffer.sample is called twice per global step (verl's own
    separate-async dumps key these {global_step}/{param_sync_step}); each is one recorded call of
    its step, replayed in recorded order."""
    dump = tmp_path / "dump"
    recorded = run("dump", "separate_async", dump, tmp_path / "dump.pt", seed="1", sync_steps=2)
    replayed = run("mock", "separate_async", dump, tmp_path / "mock.pt", seed="2", sync_steps=2)
    assert replayed["generated"] == 0
    same_run(recorded, replayed)
    assert len(recorded["versions"]) == 8  # two actor updates per step

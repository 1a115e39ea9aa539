"""Two writers of one split are refused; the lock dies with its owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import HANG_S

from rollout_mock import LockedError, MockScheduler

OWNER = textwrap.dedent(
    """
    import sys, torch
    from rollout_mock import MockScheduler

    class Scheduler:
        def get_batch(self, data, global_step):
            return {"x": torch.zeros(3)}

    sched = MockScheduler(Scheduler(), {"enable": True, "mode": "dump", "dump_dir": sys.argv[1]})
    sched.get_batch(None, global_step=0)
    sched.flush()
    print("READY", flush=True)
    sys.stdin.read()  # holds the lock until the test kills it (or closes stdin): no time limit
    """
)


class Scheduler:
    def get_batch(self, data: object, global_step: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((3,), float(global_step))}


def dump_config(dump_dir: Path) -> dict[str, object]:
    return {"enable": True, "mode": "dump", "dump_dir": str(dump_dir)}


def start_owner(dump_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(dump_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", line
    return proc


def test_second_process_is_refused_naming_the_owner_and_lock_survives_sigkill(tmp_path: Path) -> None:
    owner = start_owner(tmp_path)
    try:
        with pytest.raises(LockedError) as info:
            MockScheduler(Scheduler(), dump_config(tmp_path))
        message = str(info.value)
        assert f"pid {owner.pid}" in message
        assert str(tmp_path) in message and "train" in message
        assert "distinct `name`" in message
        assert info.value.split == "train" and info.value.mode == "dump"
        # a differently named scheduler may share the dump_dir and split
        with MockScheduler(Scheduler(), {**dump_config(tmp_path), "name": "other"}) as named:
            named.get_batch(None, global_step=0)
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=HANG_S)
    assert owner.returncode == -signal.SIGKILL
    # the owner died holding the lock: a new writer takes it at once (no stale lock)
    with MockScheduler(Scheduler(), {**dump_config(tmp_path)}) as sched:
        sched.get_batch(None, global_step=1)
    assert sorted(p.name for p in (tmp_path / "train").glob("step_*.pkl")) == [
        "step_000000.pkl", "step_000001.pkl"
    ]


def test_two_unnamed_schedulers_in_one_process_are_refused(tmp_path: Path) -> None:
    first = MockScheduler(Scheduler(), dump_config(tmp_path))
    try:
        with pytest.raises(LockedError, match=rf"pid {os.getpid()}"):
            MockScheduler(Scheduler(), dump_config(tmp_path))
        # other split, or a name: fine
        MockScheduler(Scheduler(), dump_config(tmp_path), split="val").close()
        MockScheduler(Scheduler(), dump_config(tmp_path), name="math").close()
    finally:
        first.close()
    # closing releases the lock
    MockScheduler(Scheduler(), dump_config(tmp_path)).close()


def test_mock_mode_readers_do_not_take_the_lock(tmp_path: Path) -> None:
    with MockScheduler(Scheduler(), dump_config(tmp_path)) as sched:
        sched.get_batch(None, global_step=0)
        sched.flush()
        reader = MockScheduler(None, {**dump_config(tmp_path), "mode": "mock"})
        assert torch.equal(reader.get_batch(None, global_step=0)["x"], torch.zeros(3))
        reader.close()

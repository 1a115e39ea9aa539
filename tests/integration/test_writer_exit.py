"""A process that dumps with the background writer and exits without close() loses nothing.

The child process records steps through MockScheduler(background=True), with a store whose
writes are slowed down so that steps are still queued when the script ends, and never calls
close(): the interpreter-exit hook must flush them. The parent then checks every step file
through rollout_mock.load_step (checksums verified against the manifest).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import HANG_S

from rollout_mock import load_step

STEPS = 6

CHILD = textwrap.dedent(
    """
    import atexit, json, sys, threading
    import torch
    from rollout_mock import MockScheduler
    from rollout_mock.storage import Store

    dump_dir, fail_step = sys.argv[1], int(sys.argv[2])
    original_save = Store.save
    script_ended = threading.Event()

    def slow_save(self, stream, step, batch, info, **kwargs):
        script_ended.wait()  # every step is still queued when the script ends
        if step == fail_step:
            raise OSError(f"injected failure on step {step}")
        return original_save(self, stream, step, batch, info, **kwargs)

    Store.save = slow_save

    class Scheduler:
        def get_batch(self, data, global_step):
            return {"x": torch.arange(1000, dtype=torch.float32) + global_step,
                    "h": torch.full((3,), global_step, dtype=torch.bfloat16)}

    mock = MockScheduler(Scheduler(), {"enable": True, "mode": "dump", "dump_dir": dump_dir,
                                       "background": True, "max_pending": %(steps)d})
    for step in range(%(steps)d):
        batch = mock.get_batch(None, step)
        batch["x"].zero_()  # the pipeline mutates the batch right after the call returns
    print(json.dumps({"pending": mock.interceptor._writer.pending}), flush=True)
    atexit.register(script_ended.set)  # runs first at exit (atexit is last-in, first-out)
    # no mock.close(): the atexit hook must write everything
    """
) % {"steps": STEPS}


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """Both child runs, started together (each pays torch's import time)."""
    root = tmp_path_factory.mktemp("writer_exit")
    runs = {"clean": (root / "clean", -1), "failing": (root / "failing", 3)}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", CHILD, str(dump_dir), str(fail_step)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (dump_dir, fail_step) in runs.items()
    }
    results = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        results[name] = (runs[name][0], subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def test_steps_queued_at_exit_are_all_written(children: dict[str, tuple[Path, subprocess.CompletedProcess[str]]]) -> None:
    dump_dir, result = children["clean"]
    assert result.returncode == 0, result.stderr
    pending = json.loads(result.stdout.strip().splitlines()[-1])["pending"]
    assert pending > 0, "the test did not exercise the exit hook: nothing was pending at exit"
    files = sorted(p.name for p in (dump_dir / "train").glob("step_*.pkl"))
    assert files == [f"step_{step:06d}.pkl" for step in range(STEPS)]
    for step in range(STEPS):
        batch = load_step(dump_dir / "train" / f"step_{step:06d}.pkl")
        assert torch.equal(batch["x"], torch.arange(1000, dtype=torch.float32) + step)
        assert batch["h"].dtype == torch.bfloat16 and batch["h"].tolist() == [step] * 3
    assert not [p for p in (dump_dir / "train").iterdir() if ".tmp-" in p.name]


def test_a_failure_at_exit_is_reported_and_later_steps_are_not_written(
    children: dict[str, tuple[Path, subprocess.CompletedProcess[str]]],
) -> None:
    dump_dir, result = children["failing"]
    assert "writing recorded steps failed at exit" in result.stderr
    assert "injected failure on step 3" in result.stderr
    files = sorted(p.name for p in (dump_dir / "train").glob("step_*.pkl"))
    assert files == [f"step_{step:06d}.pkl" for step in range(3)]

"""SIGTERM (what SLURM/Kubernetes send before SIGKILL) writes the queued steps, then kills.

The child records steps through MockScheduler(background=True) with a store whose writes wait
until SIGTERM arrives (an event, not a delay: a busy machine cannot let the writer catch up), so
that the steps are still queued when the parent sends SIGTERM. Without the
writer's SIGTERM handler the default action kills the child at once and the queued steps are
lost; with it they are all written, checksums verify, and the child still dies by SIGTERM.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from conftest import HANG_S

from rollout_mock import load_step, open_dump

STEPS = 6

CHILD = textwrap.dedent(
    """
    import json, signal, sys, threading, time
    import torch
    from rollout_mock import MockScheduler
    from rollout_mock.storage import Store

    dump_dir = sys.argv[1]
    original_save = Store.save
    sigterm = threading.Event()

    def slow_save(self, stream, step, batch, info, **kwargs):
        sigterm.wait()  # nothing is written before SIGTERM
        return original_save(self, stream, step, batch, info, **kwargs)

    Store.save = slow_save

    class Scheduler:
        def get_batch(self, data, global_step):
            return {"x": torch.arange(1000, dtype=torch.float32) + global_step}

    mock = MockScheduler(Scheduler(), {"enable": True, "mode": "dump", "dump_dir": dump_dir,
                                       "background": True, "max_pending": %(steps)d})
    for step in range(%(steps)d):
        mock.get_batch(None, step)
    flush_and_die = signal.getsignal(signal.SIGTERM)  # the writer's handler, installed with the first step

    def release_then_flush(signum, frame):
        sigterm.set()
        flush_and_die(signum, frame)

    signal.signal(signal.SIGTERM, release_then_flush)
    print(json.dumps({"pending": mock.interceptor._writer.pending}), flush=True)
    time.sleep(24 * 3600)  # "training" goes on until the scheduler sends SIGTERM
    print("not killed", flush=True)
    """
) % {"steps": STEPS}


def test_sigterm_writes_every_queued_step_and_still_terminates(tmp_path: Path) -> None:
    dump_dir = tmp_path / "dump"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(dump_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], HANG_S)
        assert ready, f"the child printed nothing within {HANG_S:g} s"
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=HANG_S)[1]
        pending = json.loads(line)["pending"]
        assert pending >= 3, "the test did not exercise SIGTERM: the steps were already written"
        proc.send_signal(signal.SIGTERM)
        # the child would sleep for a day: ending at all is the verdict (HANG_S only bounds a hang)
        out, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, err)  # exit status 143 in a shell
    assert "not killed" not in out
    assert f"SIGTERM: writing {pending} queued step(s)" in err and "all" in err
    files = sorted(p.name for p in (dump_dir / "train").glob("step_*.pkl"))
    assert files == [f"step_{step:06d}.pkl" for step in range(STEPS)]
    dump = open_dump(dump_dir)
    stream = dump.stream("train")
    assert dump.steps(stream) == list(range(STEPS))
    for step in range(STEPS):
        batch = load_step(dump_dir / "train" / f"step_{step:06d}.pkl")  # checksum-verified
        assert torch.equal(batch["x"], torch.arange(1000, dtype=torch.float32) + step)
    assert not [p for p in (dump_dir / "train").iterdir() if ".tmp-" in p.name]

"""Crash safety: SIGKILL a dumping process at random moments, then check what is left.

One helper process imports torch and rollout_mock once, then forks short-lived children; each
child runs a :class:`~rollout_mock.MockScheduler` in dump mode (background writer on, overwrite
off) that resumes after the last complete step and dumps small steps until it is SIGKILL-ed
after a random 3-100 ms. After every kill the helper checks the invariants of
``rollout_mock.storage``:

* the index (``manifest.json`` plus entry files) is always readable (never half-written);
* every indexed step has its ``step_*.pkl``, verifies against its entry, and holds exactly the
  batch that was dumped for that step (never a silently wrong batch);
* the indexed steps are contiguous from 0; at most the next step has a data file without an
  entry (a kill between the data rename and the entry commit), and readers ignore it and temp
  files;

and at the end a clean dump run resumes after the last complete step, cleans every leftover
temporary file and leaves a fully verifiable dump.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import HANG_S

KILLS = 60

HELPER = textwrap.dedent(
    r'''
    import json, os, random, signal, sys, time, traceback
    from pathlib import Path

    import torch

    from rollout_mock import MockScheduler, load_step, open_dump
    from rollout_mock.determinism import fingerprint
    from rollout_mock.errors import StepExistsError
    from rollout_mock.storage.directory import is_temp_name
    from rollout_mock.storage.manifest import StreamId, read_manifest
    from rollout_mock.storage import DirectoryStore

    dump_dir = Path(sys.argv[1])
    kills = int(sys.argv[2])
    seed = int(sys.argv[3])
    fingerprint()  # cached: children do not pay for it
    from rollout_mock.config import load_config
    load_config({"enable": False})  # imports omegaconf once, here, not in every child
    stream = StreamId("train")
    torch.set_num_threads(1)


    def batch_for(step):
        n = 2048 + (step * 7919) % 30000
        gen = torch.Generator().manual_seed(step)
        return {"step": step, "x": torch.randn(n, generator=gen),
                "ids": torch.arange(step, step + n // 4, dtype=torch.int64),
                "meta": {"global_step": step, "tag": "s%d" % step}}


    class Scheduler:
        def get_batch(self, data, global_step):
            return batch_for(global_step)


    CONFIG = {"enable": True, "mode": "dump", "dump_dir": str(dump_dir), "background": True,
              "max_pending": 2, "overwrite": False}


    def child():
        sched = MockScheduler(Scheduler(), CONFIG)
        steps = sched.interceptor.store.steps(sched.interceptor.stream)
        start = steps[-1] + 1 if steps else 0
        for step in range(start, start + 100000):
            sched.get_batch(None, global_step=step)
        sched.close()


    def same(a, b):
        return (a["step"] == b["step"] and a["meta"] == b["meta"] and torch.equal(a["x"], b["x"])
                and torch.equal(a["ids"], b["ids"]) and a["x"].dtype == b["x"].dtype)


    verified = {}
    stats = {"kills": 0, "temp_files_seen": 0, "manifest_temps_seen": 0, "dangling_entries": 0,
             "no_manifest_yet": 0, "max_step": -1, "exit_codes": []}


    def check(final=False):
        store = DirectoryStore(dump_dir)
        indexed = set(store.steps(stream))  # manifest + entry files: must never raise
        files = sorted(int(p.name[5:11]) for p in dump_dir.glob("train/step_*.pkl"))
        if read_manifest(dump_dir) is None and not indexed:
            stats["no_manifest_yet"] += 1
        assert sorted(indexed) == list(range(len(indexed))), f"indexed steps not contiguous: {sorted(indexed)}"
        dangling = sorted(indexed - set(files))
        assert not dangling, f"indexed steps without data (the entry is committed last): {dangling}"
        orphans = sorted(set(files) - indexed)
        if final:
            assert not orphans, orphans
        else:  # a kill between the data rename and the entry link: invisible to readers
            assert orphans in ([], [len(indexed)]), f"unexpected unindexed step files: {orphans}"
        stats["dangling_entries"] += len(orphans)
        names = [p.name for p in dump_dir.rglob("*")]
        stats["temp_files_seen"] += sum(1 for n in names if is_temp_name(n) and n.startswith(".step_"))
        stats["manifest_temps_seen"] += sum(1 for n in names if is_temp_name(n) and n.startswith(".manifest"))
        # readers ignore temp files and unindexed data: load every indexed step
        for step in sorted(indexed):
            entry = store.entry(stream, step)
            key = (entry.size, entry.checksum)
            if verified.get(step) == key and not final:
                continue
            batch = store.load(stream, step)
            assert same(batch, batch_for(step)), f"step {step} holds the wrong batch"
            if final:
                assert same(load_step(dump_dir / entry.file), batch_for(step))
            verified[step] = key
        stats["max_step"] = max(indexed, default=-1)
        return sorted(indexed)


    # Warm up in the parent: the children are forked from it, so lazy imports (codec, fingerprint,
    # watchdog) are not paid again by every child before its first write.
    warm = MockScheduler(Scheduler(), dict(CONFIG, dump_dir=str(dump_dir) + "-warmup"))
    warm.get_batch(None, global_step=0)
    warm.close()

    rng = random.Random(seed)
    for i in range(kills):
        pid = os.fork()
        if pid == 0:
            try:
                child()
                os._exit(0)
            except BaseException:
                traceback.print_exc()
                os._exit(3)
        # progress first (an event, however busy the machine: the step after the next one is on
        # disk), then a random moment of the writes that follow
        progress = dump_dir / "train" / ("step_%06d.pkl" % (stats["max_step"] + 2))
        deadline = time.monotonic() + float(sys.argv[4])  # HANG_S
        while not progress.exists() and time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                raise SystemExit("child %d ended before it was killed" % i)
            time.sleep(0.001)
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        stats["exit_codes"].append(code)
        assert code == -signal.SIGKILL, f"child {i} ended with {code} before it was killed"
        stats["kills"] += 1
        check()

    # A clean run resumes after the last complete step, and repairs what the kills left.
    before = check()
    last = before[-1] if before else -1
    sched = MockScheduler(Scheduler(), CONFIG)
    if before:  # (on a loaded machine the kills can all land before step 0 is complete)
        try:
            sched.get_batch(None, global_step=0)
            raise AssertionError("re-dumping step 0 with overwrite off was not refused")
        except StepExistsError:
            pass
    for step in range(last + 1, last + 6):
        sched.get_batch(None, global_step=step)
    sched.close()
    left = [p.name for p in dump_dir.rglob("*") if is_temp_name(p.name)]
    assert not left, f"temporary files left after a clean writer ran: {left}"
    after = check(final=True)
    assert after == list(range(last + 6)), (last, after)
    assert open_dump(dump_dir).steps(stream) == after
    stats["resumed_from"] = last + 1
    print("RESULT " + json.dumps(stats))
    '''
)


def test_sigkill_during_dump_never_leaves_a_wrong_or_unreadable_step(tmp_path: Path) -> None:
    script = tmp_path / "crash_helper.py"
    script.write_text(HELPER)
    dump_dir = tmp_path / "dump"
    proc = subprocess.run(
        [sys.executable, str(script), str(dump_dir), str(KILLS), "1234", str(HANG_S)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    line = next(out for out in proc.stdout.splitlines() if out.startswith("RESULT "))
    stats = json.loads(line.removeprefix("RESULT "))
    assert stats["kills"] == KILLS
    # the kills really interrupted dumping: steps were written across many children (how many
    # depends on the machine's load and fsync speed) ...
    assert stats["max_step"] >= 5, stats
    # ... and some landed mid-write, leaving temporary files for the next writer to clean
    assert stats["temp_files_seen"] + stats["dangling_entries"] + stats["manifest_temps_seen"] > 0, stats

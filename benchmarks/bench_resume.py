"""Crash recovery and opening at scale: a dump of N steps whose writer was SIGKILLed, then resumed.

    python benchmarks/bench_resume.py [--sizes 10000,100000] [--tail 700] [--dir DIR] [--update-readme]

For each N, the dump a long run leaves is built: N - tail steps folded into index segments by the
real code path (``StreamIndex.fold``, the same files and manifest a writer writes, with empty
step files so that the data directory holds N files), then a real writer *process* records
``tail`` more steps and is killed with SIGKILL (its lock, stream record and unfolded entry files
stay behind). Each figure below is then timed in a fresh process:

* ``open_dump + steps()`` of the crashed dump (a reader during or after the crash);
* resuming: ``open_writer`` (claim the stream, fold the dead writer's entry files) + one save;
* ``close`` of the resumed writer, then ``open_dump + steps()`` + loading one step's entry of
  the clean dump;
* the folder listing: files in the stream's ``.index/`` after the crash and after the close.

Recording 100,000 real steps would take the benchmark most of an hour of fsyncs, which is why the
folded part is built directly; the crash, the resume and every timed open are the real thing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import update_readme  # noqa: E402

from rollout_mock.storage import DirectoryStore
from rollout_mock.storage.index import SEGMENT_STEPS, StreamIndex, index_dir
from rollout_mock.storage.manifest import StepEntry, StreamId, utc_now

STREAM = StreamId("train")
KEYS = {f"batch.k{i}": {"shape": [256, 1024], "dtype": "int64"} for i in range(8)}  # a realistic entry


def populate(root: Path, folded: int) -> None:
    """``folded`` steps as a writer folds them (segments + manifest references), with empty data files."""
    store = DirectoryStore(root)
    index = StreamIndex.open(store.backend, STREAM)
    directory = root / STREAM.directory
    for first in range(0, folded, SEGMENT_STEPS):
        for step in range(first, min(first + SEGMENT_STEPS, folded)):
            (directory / STREAM.file_name(step)).touch()
            index.pending[step] = StepEntry(file=STREAM.relpath(step), size=0, checksum="crc32:00000000",
                                            samples=256, type="verl.protocol.DataProto", keys=KEYS,
                                            written_at=utc_now(), method="generate_sequences").to_json()
            index.live.add(step)
        index.fold(final=False)
    index.release()


CRASHING_WRITER = textwrap.dedent(
    """
    import os, signal, sys, torch
    from rollout_mock.storage import BatchInfo, DirectoryStore
    from rollout_mock.storage.manifest import StreamId
    root, first, tail = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store, stream, batch = DirectoryStore(root), StreamId("train"), {"x": torch.zeros(4)}
    for step in range(first, first + tail):
        store.save(stream, step, batch, BatchInfo.of(batch))
    print("RECORDED", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)

TIMED = textwrap.dedent(
    """
    import json, sys, time, torch
    from rollout_mock.storage import BatchInfo, DirectoryStore, open_dump
    from rollout_mock.storage.manifest import StreamId
    root, what, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    stream, out = StreamId("train"), {}
    if what == "open":
        t = time.perf_counter(); dump = open_dump(root); steps = dump.steps(stream)
        out["open_s"] = time.perf_counter() - t; out["steps"] = len(steps)
        t = time.perf_counter(); dump.entry(stream, steps[len(steps) // 2]); out["entry_s"] = time.perf_counter() - t
    else:
        store = DirectoryStore(root)
        t = time.perf_counter(); store.open_writer(stream); out["resume_s"] = time.perf_counter() - t
        batch = {"x": torch.zeros(4)}
        t = time.perf_counter(); store.save(stream, n, batch, BatchInfo.of(batch))
        out["save_s"] = time.perf_counter() - t
        t = time.perf_counter(); store.close(); out["close_s"] = time.perf_counter() - t
    print(json.dumps(out))
    """
)


def _run(script: str, *args: Any) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def index_files(root: Path) -> int:
    path = root / index_dir(STREAM)
    return len(os.listdir(path)) if path.is_dir() else 0


def one(base: Path, n: int, tail: int) -> dict[str, Any]:
    root = base / f"dump_{n}"
    shutil.rmtree(root, ignore_errors=True)
    t = time.perf_counter()
    populate(root, n - tail)
    built = time.perf_counter() - t
    proc = subprocess.run([sys.executable, "-c", CRASHING_WRITER, str(root), str(n - tail), str(tail)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == -signal.SIGKILL and "RECORDED" in proc.stdout, proc.stderr[-2000:]
    after_crash = index_files(root)
    crashed_open = _run(TIMED, root, "open", n)
    resumed = _run(TIMED, root, "resume", n)
    clean_open = _run(TIMED, root, "open", n)
    assert clean_open["steps"] == n + 1 == crashed_open["steps"] + 1, (crashed_open, clean_open)
    result = {"n": n, "tail": tail, "build_s": built, "index_files_after_crash": after_crash,
              "index_files_after_close": index_files(root), "crashed_open_s": crashed_open["open_s"],
              "resume_s": resumed["resume_s"], "first_save_s": resumed["save_s"], "close_s": resumed["close_s"],
              "clean_open_s": clean_open["open_s"], "entry_s": clean_open["entry_s"],
              "manifest_bytes": (root / "manifest.json").stat().st_size}
    shutil.rmtree(root, ignore_errors=True)
    return result


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| steps | `.index/` files after SIGKILL → after close | open a crashed dump | resume (`open_writer`) "
        "| first save | close | open a clean dump | first entry lookup (fresh process) | manifest.json |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']:,} | {r['index_files_after_crash']} → {r['index_files_after_close']} "
            f"| {r['crashed_open_s']:.3f} s | {r['resume_s']:.3f} s | {1e3 * r['first_save_s']:.1f} ms "
            f"| {r['close_s']:.3f} s | {r['clean_open_s']:.3f} s | {1e3 * r['entry_s']:.1f} ms "
            f"| {r['manifest_bytes'] / 1e3:.0f} kB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--tail", type=int, default=700, help="steps the killed writer records itself")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--update-readme", action="store_true")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench_resume_", dir=args.dir))
    try:
        rows = [one(base, int(n), min(args.tail, int(n))) for n in args.sizes.split(",")]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    text = table(rows)
    print(text)
    print(json.dumps(rows))
    if args.update_readme:
        update_readme("bench_resume", "## Crash recovery and opening at scale (bench_resume.py)\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

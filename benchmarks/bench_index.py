"""Cost of the step index (format 2: one entry file per step, compacted on close) as a dump grows.

    python benchmarks/bench_index.py [--sizes 10,1000,100000] [--steps 50] [--writers 1,8,32]
                                     [--dir DIR] [--update-readme]

1. Per-step cost at N recorded steps. Recording 100,000 real steps would take the benchmark
   hours of fsyncs, so the index is **pre-populated** to N steps and then K more tiny steps are
   recorded through ``DirectoryStore.save`` and timed (mean and p95 per step). Two states:
   ``compacted`` (N entries in manifest.json: a resumed long run) and ``live`` (N entry files
   in ``.index/``: deep inside one long run). Also timed: opening the dump for replay
   (``open_dump`` + ``steps()``), and the compaction on close.
2. R writer processes at once (``ranks: all``: one stream per rank, one dump directory), each
   recording K tiny steps: wall time, aggregate steps/s and mean per-step latency.

Tiny steps (a 4-element tensor) make the index the dominant cost; every save still does two
fsync-ed writes (data, then entry). ``--update-readme`` writes the table into benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rollout_mock.storage import BatchInfo, DirectoryStore, open_dump
from rollout_mock.storage.index import encode_entry, entry_relpath
from rollout_mock.storage.manifest import Manifest, StepEntry, StreamId, dumps_manifest, utc_now

BATCH = {"x": torch.zeros(4)}
INFO = BatchInfo.of(BATCH)
STREAM = StreamId("train")
README = Path(__file__).with_name("README.md")
START, END = "<!-- bench_index:start -->", "<!-- bench_index:end -->"


def _fake_entry(step: int) -> StepEntry:
    return StepEntry(file=STREAM.relpath(step), size=0, checksum="crc32:00000000", samples=4, type="dict",
                     keys=INFO.keys, written_at=utc_now(), method="get_batch")


def populate(root: Path, n: int, state: str) -> None:
    """An index of ``n`` steps (entries only: the benchmark never loads them)."""
    if state == "compacted":
        manifest = Manifest()
        data = manifest.stream(STREAM, create=True)
        assert data is not None
        data["steps"] = {str(s): _fake_entry(s).to_json() for s in range(n)}
        root.mkdir(parents=True, exist_ok=True)
        (root / "manifest.json").write_text(dumps_manifest(manifest))
    else:
        index = root / "train" / ".index"
        index.mkdir(parents=True, exist_ok=True)
        for s in range(n):
            (root / entry_relpath(STREAM, s)).write_bytes(encode_entry(STREAM, s, _fake_entry(s)))
        (root / ".streams").mkdir(exist_ok=True)
        from rollout_mock.storage.index import encode_stream_record, stream_record_name

        (root / ".streams" / stream_record_name(STREAM)).write_bytes(encode_stream_record(STREAM, {}))


def per_step(root: Path, n: int, k: int, state: str) -> dict[str, Any]:
    populate(root, n, state)
    t0 = time.perf_counter()
    store = DirectoryStore(root)
    store.open_writer(STREAM)  # a live index is compacted here (a writer resuming after a crash)
    opened = time.perf_counter() - t0
    times = []
    for step in range(n, n + k):
        t = time.perf_counter()
        store.save(STREAM, step, BATCH, INFO)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    store.close()
    closed = time.perf_counter() - t
    t = time.perf_counter()
    dump = open_dump(root)
    steps = dump.steps(STREAM)
    open_s = time.perf_counter() - t
    assert len(steps) == n + k
    times.sort()
    return {"n": n, "state": state, "k": k, "mean_ms": 1e3 * statistics.fmean(times),
            "p95_ms": 1e3 * times[int(0.95 * (len(times) - 1))], "writer_open_s": opened,
            "close_s": closed, "replay_open_s": open_s}


def _writer(root: str, rank: int, k: int, out: Any) -> None:
    store = DirectoryStore(root)
    stream = StreamId("train", None, rank)
    store.open_writer(stream)
    times = []
    for step in range(k):
        t = time.perf_counter()
        store.save(stream, step, BATCH, INFO)
        times.append(time.perf_counter() - t)
    store.close()
    out.put(times)


def concurrent(root: Path, r: int, k: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(root), rank, k, queue)) for rank in range(r)]
    t = time.perf_counter()
    for p in procs:
        p.start()
    times = [x for _ in procs for x in queue.get(timeout=600)]
    for p in procs:
        p.join(timeout=600)
    wall = time.perf_counter() - t
    dump = open_dump(root)
    assert all(dump.steps(StreamId("train", None, rank)) == list(range(k)) for rank in range(r))
    return {"writers": r, "k": k, "wall_s": wall, "steps_per_s": r * k / wall,
            "mean_ms": 1e3 * statistics.fmean(times)}


def table(results: dict[str, Any]) -> str:
    lines = ["| N steps already indexed | index state | per-step save, mean (p95) | writer open "
             "| close (compaction) | open_dump + steps() |",
             "|---:|---|---:|---:|---:|---:|"]
    for row in results["per_step"]:
        lines.append(f"| {row['n']:,} | {row['state']} | {row['mean_ms']:.2f} ms ({row['p95_ms']:.2f}) | "
                     f"{row['writer_open_s']:.3f} s | {row['close_s']:.3f} s | {row['replay_open_s']:.3f} s |")
    lines += ["", "| writer processes | steps each | wall | aggregate steps/s | mean per-step save |",
              "|---:|---:|---:|---:|---:|"]
    for row in results["writers"]:
        lines.append(f"| {row['writers']} | {row['k']} | {row['wall_s']:.2f} s | {row['steps_per_s']:.0f} | "
                     f"{row['mean_ms']:.2f} ms |")
    env = results["env"]
    lines += ["", f"{env['cpus']} CPUs, Python {env['python']}, {env['fs']}; K={results['k']} timed tiny steps "
              f"after pre-populating the index to N (see the script's docstring). Both states are what "
              f"earlier versions left: 'compacted' is N entries inline in manifest.json, 'live' N unfolded "
              f"entry files (the first writer folds them into one segment). The current index never leaves "
              f"more than 1,024 entry files and keeps long streams in segments: see bench_resume.py."]
    return "\n".join(lines)


def update_readme(text: str) -> None:
    body = README.read_text() if README.exists() else "# Benchmarks\n"
    section = f"{START}\n## Step index (bench_index.py)\n\n{text}\n{END}"
    if START in body:
        body = body[: body.index(START)] + section + body[body.index(END) + len(END):]
    else:
        body = body.rstrip() + "\n\n" + section + "\n"
    README.write_text(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,1000,100000")
    parser.add_argument("--steps", type=int, default=50, help="K: timed steps per measurement")
    parser.add_argument("--writers", default="1,8,32")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--update-readme", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench_index-", dir=args.dir))
    try:
        results: dict[str, Any] = {"k": args.steps, "per_step": [], "writers": [], "env": {
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "fs": os.popen(f"df -T {scratch} | tail -1 | awk '{{print $2}}'").read().strip() or "?"}}
        for n in [int(x) for x in args.sizes.split(",")]:
            for state in ("compacted", "live"):
                row = per_step(scratch / f"{state}-{n}", n, args.steps, state)
                print(json.dumps(row), file=sys.stderr)
                results["per_step"].append(row)
                shutil.rmtree(scratch / f"{state}-{n}")
        for r in [int(x) for x in args.writers.split(",")]:
            row = concurrent(scratch / f"writers-{r}", r, args.steps)
            print(json.dumps(row), file=sys.stderr)
            results["writers"].append(row)
            shutil.rmtree(scratch / f"writers-{r}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = table(results)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.update_readme:
        update_readme(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

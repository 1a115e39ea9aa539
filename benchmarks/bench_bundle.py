"""One-file bundles (issue 31): ``pack``/``unpack`` against ``tar``, and a step loaded in place from
the ``.rmb`` against the same step loaded from a dump directory.

    python benchmarks/bench_bundle.py [--steps 6] [--mb 64] [--pack 2] [--repeat 5] [--update-readme]

Two dumps: the ``rollout-mock demo`` dump (8 steps of ~20 KB each) and a synthetic one of
``--steps`` steps of about ``--mb`` MB each (1,024 rows: int64 ids and mask, float32 log-probs,
a prompt string per row). For each, ``--pack`` steps are bundled:

* **pack**: ``rollout_mock.cli.bundle.pack`` (reads the index and those steps, checks each step's
  CRC-32, SHA-256 of every member, fsync, rename) against ``tar -cf`` of the same files (manifest,
  step files, expected metrics) followed by an fsync of the archive;
* **unpack**: ``unpack`` (every member's SHA-256 and the padding checked, every file fsync-ed,
  one rename) against ``tar -xf`` (no check, no fsync);
* **size** of the bundle, the tar archive and the files themselves;
* **load**: ``open_dump(path)`` once, then ``Dump.load(step)`` (verified: CRC-32, and the
  member's SHA-256 for the bundle) from the ``.rmb`` in place, from the unpacked directory and
  from the original dump; and ``open_dump`` itself.

Medians of ``--repeat`` runs, page cache warm (what a second look at a bundle costs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import RESULTS, clock, describe_machine, human, machine, summary, update_readme

from rollout_mock import MockScheduler, open_dump
from rollout_mock.cli.bundle import pack, unpack


def synthetic_dump(path: Path, steps: int, mb: int) -> None:
    rows = 1024
    length = max(8, (mb << 20) // (rows * (8 + 8 + 4)))

    class Scheduler:
        def get_batch(self, data: Any, global_step: int) -> dict[str, Any]:
            g = torch.Generator().manual_seed(global_step)
            ids = torch.randint(0, 150_000, (rows, length), generator=g)
            prompts = np.empty(rows, dtype=object)
            prompts[:] = [f"prompt {global_step}.{i}: " + "lorem ipsum " * 20 for i in range(rows)]
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                    "old_log_probs": torch.randn(rows, length, generator=g), "raw_prompt": prompts}

    with MockScheduler(Scheduler(), {"enable": True, "mode": "dump", "dump_dir": str(path)}) as scheduler:
        for step in range(steps):
            scheduler.get_batch(None, step)


def demo_dump(work: Path) -> Path:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-m", "rollout_mock", "demo", "--workdir", str(work / "demo"), "-q"], check=True,
                   env=env, capture_output=True, timeout=600)
    return work / "demo" / "dump"


def members(dump: Path, steps: list[int]) -> list[str]:
    names = ["manifest.json", *(f"train/step_{s:06d}.pkl" for s in steps)]
    return names + (["expected/metrics.jsonl"] if (dump / "expected" / "metrics.jsonl").exists() else [])


def median(samples: list[float]) -> float:
    return summary(samples)["median"]


def measure(name: str, dump: Path, steps: list[int], work: Path, repeat: int) -> dict[str, Any]:
    out = work / f"{name}.rmb"
    tar = work / f"{name}.tar"
    t_pack, t_tar, t_unpack, t_untar = [], [], [], []
    for i in range(repeat):
        out.unlink(missing_ok=True)
        t_pack.append(clock(lambda: pack(dump, out, steps=steps)))
        tar.unlink(missing_ok=True)

        def tar_c() -> None:
            subprocess.run(["tar", "-cf", str(tar), "-C", str(dump), *members(dump, steps)], check=True)
            fd = os.open(tar, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)

        t_tar.append(clock(tar_c))
        target, untarred = work / f"{name}-unpacked-{i}", work / f"{name}-untarred-{i}"
        t_unpack.append(clock(lambda target=target: unpack(out, target)))
        untarred.mkdir()
        t_untar.append(clock(lambda untarred=untarred: subprocess.run(
            ["tar", "-xf", str(tar), "-C", str(untarred)], check=True)))
        if i < repeat - 1:
            shutil.rmtree(target)
            shutil.rmtree(untarred)
    files = sum((dump / m).stat().st_size for m in members(dump, steps))
    loads: dict[str, float] = {}
    opens: dict[str, float] = {}
    for label, where in (("bundle in place", out), ("unpacked directory", target), ("original dump", dump)):
        opens[label] = median([clock(lambda where=where: open_dump(where)) for _ in range(repeat)])
        opened = open_dump(where)
        opened.load(steps[-1])  # page cache warm
        loads[label] = median([clock(lambda opened=opened: opened.load(steps[-1]))
                               for _ in range(repeat)])
    return {"name": name, "steps": steps, "files_bytes": files, "bundle_bytes": out.stat().st_size,
            "tar_bytes": tar.stat().st_size, "pack_s": median(t_pack), "tar_c_s": median(t_tar),
            "unpack_s": median(t_unpack), "tar_x_s": median(t_untar), "open_s": opens, "load_s": loads}


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| dump | steps bundled | files | .rmb | .tar | pack | tar -cf + fsync | unpack | tar -xf |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['name']} | {', '.join(map(str, r['steps']))} | {human(r['files_bytes'])} | "
                     f"{human(r['bundle_bytes'])} | {human(r['tar_bytes'])} | {r['pack_s'] * 1e3:.1f} ms | "
                     f"{r['tar_c_s'] * 1e3:.1f} ms | {r['unpack_s'] * 1e3:.1f} ms | {r['tar_x_s'] * 1e3:.1f} ms |")
    lines += ["", "| dump | load one step from | open_dump | Dump.load(step) |", "|---|---|---:|---:|"]
    for r in results:
        for label, seconds in r["load_s"].items():
            lines.append(f"| {r['name']} | {label} | {r['open_s'][label] * 1e3:.2f} ms | {seconds * 1e3:.2f} ms |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="steps of the synthetic dump")
    parser.add_argument("--mb", type=int, default=64, help="MB per step of the synthetic dump (0: skip it)")
    parser.add_argument("--pack", type=int, default=2, help="how many steps are bundled")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: benchmarks/results/tmp)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--update-readme", action="store_true")
    args = parser.parse_args(argv)
    base = args.dir or RESULTS / "tmp"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_bundle_", dir=base))
    started = time.time()
    try:
        results = []
        if not args.skip_demo:
            results.append(measure("demo", demo_dump(work), list(range(8 - args.pack, 8)), work, args.repeat))
        if args.mb:
            synthetic_dump(work / "synthetic", args.steps, args.mb)
            chosen = list(range(args.steps - args.pack, args.steps))
            results.append(measure(f"synthetic {args.mb} MB/step", work / "synthetic", chosen, work, args.repeat))
        info = machine(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    body = (f"`python benchmarks/bench_bundle.py {' '.join(argv if argv is not None else sys.argv[1:])}`, run on "
            f"{time.strftime('%Y-%m-%d')} in {time.time() - started:.0f} s, medians of {args.repeat}, page cache "
            f"warm.\n\nMachine: {describe_machine(info)}\n\n{table(results)}")
    print(body)
    payload = {"machine": info, "results": results, "table": table(results)}
    target = args.json or RESULTS / f"bench_bundle_{time.strftime('%Y%m%dT%H%M%S')}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(payload, indent=1))
    if args.update_readme:
        update_readme("bench_bundle", "## Bundles (bench_bundle.py)\n\n" + body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

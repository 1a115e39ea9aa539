"""Many small calls in one step: the blocking time per call in dump and in mock mode, and the
index size per call (issue 34).

    python benchmarks/bench_calls.py [--calls 1000] [--elements 16] [--repeat 5] [--dir DIR]
                                     [--json OUT] [--update-readme]

An agent loop's engine (or a validation in many small batches) is called ``--calls`` times inside
one training step (``MockScheduler.at_step``), each call returning a dict with one int64 tensor of
``--elements`` elements and a short string. Timed on the calling thread, in the same run:

* ``plain``: the same calls to the engine without rollout_mock (the floor);
* ``dump``: each call through a dump-mode ``MockScheduler``: the first call of the step becomes its
  step file, every later one is captured on the calling thread and written with the others in
  packs by the writer thread (the close, which waits for the writer, is timed apart);
* ``mock``: each call replayed by its request from the dump.

Index size per call: the bytes of the packs' records (``train/.calls/pack_*.json``, what a replay
reads to find the calls) divided by the calls they describe, for ``--calls`` and 10x as many
calls: it stays flat. Per-call blocking time is the median over ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import describe_machine, machine, update_readme, work_dir  # noqa: E402

from rollout_mock import MockScheduler  # noqa: E402


class Engine:
    def __init__(self, elements: int) -> None:
        self.elements = elements

    def generate(self, prompt: str) -> dict[str, Any]:
        return {"ids": torch.full((self.elements,), len(prompt), dtype=torch.int64), "text": prompt[::-1]}


def _config(directory: Path, mode: str) -> dict[str, Any]:
    return {"enable": True, "mode": mode, "dump_dir": str(directory)}


def _prompts(calls: int) -> list[str]:
    return [f"episode {i} turn {i % 3}" for i in range(calls)]


def _timed(run: Any) -> tuple[float, float]:
    """Wall time and the calling thread's CPU time of ``run()``."""
    wall, cpu = time.perf_counter(), time.thread_time()
    run()
    return time.perf_counter() - wall, time.thread_time() - cpu


def run_once(directory: Path, calls: int, elements: int) -> dict[str, float]:
    engine, prompts = Engine(elements), _prompts(calls)

    def plain_calls() -> None:
        for prompt in prompts:
            engine.generate(prompt)

    def through(scheduler: Any) -> Any:
        def run() -> None:
            with scheduler.at_step(0):
                for prompt in prompts:
                    scheduler.generate(prompt)
        return run

    plain, plain_cpu = _timed(plain_calls)
    scheduler = MockScheduler(engine, _config(directory, "dump"), methods=["generate"])
    dump, dump_cpu = _timed(through(scheduler))
    start = time.perf_counter()
    scheduler.close()
    dump_close = time.perf_counter() - start
    scheduler = MockScheduler(None, _config(directory, "mock"), methods=["generate"], spec=Engine)
    mock, mock_cpu = _timed(through(scheduler))
    scheduler.close()
    return {"plain": plain / calls, "dump": dump / calls, "dump_close": dump_close, "mock": mock / calls,
            "plain_cpu": plain_cpu / calls, "dump_cpu": dump_cpu / calls, "mock_cpu": mock_cpu / calls}


def index_bytes_per_call(directory: Path, calls: int, elements: int) -> float:
    scheduler = MockScheduler(Engine(elements), _config(directory, "dump"), methods=["generate"])
    with scheduler.at_step(0):
        for prompt in _prompts(calls):
            scheduler.generate(prompt)
    scheduler.close()
    records = list((directory / "train" / ".calls").glob("pack_*.json"))
    return sum(p.stat().st_size for p in records) / max(calls - 1, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--elements", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--update-readme", action="store_true")
    args = parser.parse_args(argv)
    scratch = work_dir(args.dir, "bench_calls_")
    where = describe_machine(machine(scratch))
    try:
        runs = []
        for i in range(args.repeat):
            runs.append(run_once(scratch / f"run{i}", args.calls, args.elements))
        result: dict[str, Any] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        result["index_bytes_per_call"] = index_bytes_per_call(scratch / "index1", args.calls, args.elements)
        result["index_bytes_per_call_10x"] = index_bytes_per_call(scratch / "index10", 10 * args.calls,
                                                                  args.elements)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    us = {k: v * 1e6 for k, v in result.items() if k.startswith(("plain", "dump", "mock")) and k != "dump_close"}
    table = (
        f"{args.calls:,} calls of one step, {args.elements} int64 elements and a short string each "
        f"(median of {args.repeat} runs; {where}):\n\n"
        "| | blocking time per call | its CPU time on the calling thread |\n|---|---:|---:|\n"
        f"| plain call (no rollout_mock) | {us['plain']:.1f} µs | {us['plain_cpu']:.1f} µs |\n"
        f"| dump mode | {us['dump']:.1f} µs | {us['dump_cpu']:.1f} µs |\n"
        f"| mock mode | {us['mock']:.1f} µs | {us['mock_cpu']:.1f} µs |\n\n"
        f"The dump's close (waiting for the writer to finish the packs): {result['dump_close'] * 1e3:.0f} ms. "
        f"Index size per call: {result['index_bytes_per_call']:.0f} bytes at {args.calls:,} calls, "
        f"{result['index_bytes_per_call_10x']:.0f} bytes at {10 * args.calls:,} calls."
    )
    print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    if args.update_readme:
        update_readme("bench_calls", table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

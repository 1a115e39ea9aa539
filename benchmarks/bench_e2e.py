"""What a user sees: the demo's training loop with dumping off vs on, and live vs mock.

    python benchmarks/bench_e2e.py [--steps 12] [--batch-size 256] [--payload-mb 0,32]
                                   [--dir DIR] [--json OUT] [--update-readme]

The loop is the one of ``rollout-mock demo`` (``rollout_mock/demo.py``): a toy GRU policy, a
live rollout that really samples from it (:class:`ToyRolloutScheduler`), and a GRPO update
(:func:`train_step`), one torch thread. The demo's batches are tiny, so each payload in
``--payload-mb`` adds realistic unused fields to every batch (an int64 attention mask and float32
reference log-probs, as verl/ROLL batches carry) to reach that many MB per step; ``0`` is the
demo's own batch. For each payload the same loop runs in five ways:

* ``live``: no rollout_mock (the baseline);
* ``dump``: MockScheduler in dump mode, background writer (the default): per-step overhead =
  median step time minus live's;
* ``dump sync``: ``background: false`` (the call writes and fsyncs before returning);
* ``mock``: replaying the dump, prefetch on (the default): the call only waits for the
  prefetched step (the *prefetch stall*);
* ``mock no prefetch``: the call loads and verifies the step (the *replay load* time).

Per-step figures are medians over steps 1..N-1 (step 0 includes warm-up). Every run writes
``benchmarks/results/bench_e2e-<time>.json`` (git-ignored) and prints Markdown tables;
``--update-readme`` rewrites the section between the ``bench_e2e`` markers of
``benchmarks/README.md``.
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
from _common import RESULTS, describe_machine, human, machine, update_readme, work_dir  # noqa: E402

from rollout_mock.demo import (  # noqa: E402
    Policy,
    RolloutBatch,
    StepRequest,
    ToyRolloutScheduler,
    train_step,
)
from rollout_mock.wrap import MockScheduler  # noqa: E402

TAG = "bench_e2e"
MODES = ["live", "dump", "dump_sync", "mock", "mock_no_prefetch"]
LABELS = {
    "live": "live rollout, no rollout_mock",
    "dump": "live rollout + dump (background writer)",
    "dump_sync": "live rollout + dump (`background: false`)",
    "mock": "mock: replay (prefetch on)",
    "mock_no_prefetch": "mock: replay (`prefetch: false`)",
}


class PaddedRollout(ToyRolloutScheduler):
    """The demo's live rollout, plus ``payload`` bytes of realistic unused fields per batch."""

    def __init__(self, policy: Policy, payload: int) -> None:
        super().__init__(policy)
        self.payload = payload

    def get_batch(self, data: StepRequest, batch_size: int) -> RolloutBatch:
        batch = super().get_batch(data, batch_size)
        if self.payload:
            length = max(1, self.payload // (batch_size * 12))  # int64 mask + float32 log-probs
            batch.batch["attention_mask"] = torch.ones(batch_size, length, dtype=torch.int64)
            batch.batch["ref_log_prob"] = torch.randn(batch_size, length, generator=self.generator)
        return batch


def run_loop(mode: str, dump_dir: Path, steps: int, batch_size: int, payload: int) -> dict[str, Any]:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # as the demo
    policy = Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    rollout = PaddedRollout(policy, payload)
    if mode == "live":
        scheduler: Any = rollout
        context: Any = None
    else:
        config: dict[str, Any] = {"enable": True, "dump_dir": str(dump_dir), "fingerprint": "off"}
        if mode.startswith("dump"):
            config.update(mode="dump", background=mode == "dump", overwrite=True)
            scheduler = context = MockScheduler(rollout, config)
        else:
            config.update(mode="mock", prefetch=mode == "mock", max_steps=steps)
            # the scheduler is never constructed in mock mode
            scheduler = context = MockScheduler(None, config, spec=ToyRolloutScheduler)
    calls, trains, totals = [], [], []
    batch_bytes = 0
    start_all = time.perf_counter()
    try:
        for step in range(steps):
            start = time.perf_counter()
            batch = scheduler.get_batch(StepRequest({"global_step": step}), batch_size)
            called = time.perf_counter()
            train_step(policy, optimizer, batch)
            end = time.perf_counter()
            calls.append(called - start)
            trains.append(end - called)
            totals.append(end - start)
            batch_bytes = sum(t.numel() * t.element_size() for t in batch.batch.values())
            del batch
        flush_start = time.perf_counter()
        if context is not None:
            context.close()
        flush = time.perf_counter() - flush_start
    finally:
        if context is not None:
            context.close()
    wall = time.perf_counter() - start_all

    def med(values: list[float]) -> float:
        return statistics.median(values[1:] if len(values) > 1 else values)

    return {"mode": mode, "steps": steps, "batch_bytes": batch_bytes, "step_s": med(totals), "call_s": med(calls),
            "train_s": med(trains), "wall_s": wall, "close_s": flush, "calls": calls, "totals": totals}


def bench_payload(payload: int, steps: int, batch_size: int, work: Path) -> dict[str, Any]:
    dump_dir = work / f"dump_{payload}"
    rows = {}
    for mode in MODES:
        print(f"== payload {human(payload)}: {mode}", flush=True)
        rows[mode] = run_loop(mode, dump_dir, steps, batch_size, payload)
    shutil.rmtree(dump_dir, ignore_errors=True)
    return {"payload": payload, "batch_size": batch_size, "steps": steps, "modes": rows}


def report(result: dict[str, Any]) -> str:
    modes = result["modes"]
    live = modes["live"]
    lines = [
        f"#### Demo loop, batch size {result['batch_size']}, {human(live['batch_bytes'])} of tensors per step"
        f"{' (the demo as shipped)' if not result['payload'] else ' (demo + padding fields)'}, "
        f"{result['steps']} steps, medians over steps 1..{result['steps'] - 1}",
        "",
        "| run | step ms | get_batch ms | train ms | overhead vs live / step | whole run s (incl. close) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        row = modes[mode]
        over = row["step_s"] - live["step_s"]
        over_text = "" if mode == "live" else f"{over * 1e3:+.1f} ms ({over / live['step_s'] * 100:+.0f}%)"
        lines.append(f"| {LABELS[mode]} | {row['step_s'] * 1e3:.1f} | {row['call_s'] * 1e3:.1f} | "
                     f"{row['train_s'] * 1e3:.1f} | {over_text} | {row['wall_s']:.2f} |")
    mock, no_pf = modes["mock"], modes["mock_no_prefetch"]
    lines += [
        "",
        f"Live rollout {live['call_s'] * 1e3:.1f} ms/step against replay load "
        f"{no_pf['call_s'] * 1e3:.1f} ms/step (verified, no prefetch) and prefetch stall "
        f"{mock['call_s'] * 1e3:.2f} ms/step; mock step = {mock['step_s'] / live['step_s']:.2f}x a live step.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--payload-mb", default="0,32", help="comma list of MB of padding fields per batch")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--update-readme", action="store_true", help="rewrite the bench_e2e README section")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 0 is warm-up)")
    payloads = [int(float(x) * 1e6) for x in args.payload_mb.split(",") if x.strip()]
    work = work_dir(args.dir, "bench_e2e_")
    info = {"machine": machine(work), "argv": argv}
    print(json.dumps(info), flush=True)
    started = time.perf_counter()
    results = []
    try:
        for payload in payloads:
            results.append(bench_payload(payload, args.steps, args.batch_size, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - started
    text = "\n\n".join(report(r) for r in results)
    print("\n" + text)
    path = args.json or RESULTS / f"bench_e2e-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**info, "results": results, "seconds": seconds, "table": text}, indent=1))
    print(f"\nwrote {path} ({seconds:.0f} s)")
    if args.update_readme:
        command = " ".join(["python benchmarks/bench_e2e.py", *argv])
        update_readme(TAG, f"`{command}`, run on {time.strftime('%Y-%m-%d')} in {seconds:.0f} s.\n\n"
                           f"Machine: {describe_machine(info['machine'])}\n\n{text}")
        print("updated benchmarks/README.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

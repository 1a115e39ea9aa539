"""What the health summary of every step costs (issue 39): against the dump-mode call and a memcpy.

Dump mode takes a health line of every step (:func:`rollout_mock.codec.scan.health_summary`:
one ``aminmax`` per tensor, one sum per floating tensor and per 2-D mask, over at most 65,536 values
per tensor) just before the copy of the batch, and the writer thread appends it to the side file.
For a verl-like batch of
``--size`` bytes (int64 ``input_ids``/``attention_mask``/``responses``, float32
``old_log_probs``/``ref_log_prob``/``values``/``advantages``, bfloat16 ``token_level_rewards``;
350 MB by default), medians of ``--repeat``, all in the same run:

* ``dump-mode call``: ``MockScheduler.get_batch`` blocking time in dump mode (background writer),
  the health summary included;
* ``memcpy``: a copy of the batch's tensors into preallocated tensors;
* ``health``: ``health_summary(batch)`` alone, once per round right after the copy (cold caches:
  what the call spends on it); ``health, warm``: the median of 10 calls in a row;
* ``rebuild of the capture``: ``codec.view_capture`` of the batch's capture, what taking the
  summary on the writer thread instead would have cost first (not what dump mode does);
* ``bytes per step``: the health line written.

Run: ``python benchmarks/bench_health.py [--size 350M] [--repeat 5]``; ``--update-readme``
rewrites the ``bench_health`` section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, clock, describe_machine, machine, on_worker, parse_size, update_readme

import rollout_mock.codec as codec
from rollout_mock import MockScheduler
from rollout_mock.codec.scan import health_summary

TAG = "bench_health"


def make_batch(size: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    rows = 256
    length = max(size // (rows * 42), 1)
    batch: dict[str, torch.Tensor] = {}
    for name in ("input_ids", "responses"):
        batch[name] = torch.randint(0, 150_000, (rows, length), generator=generator)
    batch["attention_mask"] = (torch.rand(rows, length, generator=generator) > 0.2).long()
    for name in ("old_log_probs", "ref_log_prob", "values", "advantages"):
        batch[name] = torch.randn(rows, length, generator=generator)
    batch["token_level_rewards"] = torch.randn(rows, length, generator=generator).bfloat16()
    return batch


class Source:
    def __init__(self, batch: dict[str, torch.Tensor]) -> None:
        self.batch = batch

    def get_batch(self, step: int) -> dict[str, torch.Tensor]:
        return self.batch


def measure(batch: dict[str, torch.Tensor], repeat: int) -> dict[str, float]:
    targets = {k: torch.empty_like(t) for k, t in batch.items()}

    def memcpy() -> None:
        for key, tensor in batch.items():
            targets[key].copy_(tensor)

    captured = codec.capture(batch)
    samples: dict[str, list[float]] = {"memcpy": [], "health": [], "health, warm": [], "rebuild of the capture": [],
                                       "dump-mode call": []}
    with tempfile.TemporaryDirectory() as tmp:
        config = {"enable": True, "mode": "dump", "dump_dir": f"{tmp}/d", "keep": {"last": 1}}
        with MockScheduler(Source(batch), config, methods=["get_batch"]) as sched:
            for i in range(repeat + 1):
                calls = clock(lambda i=i: sched.get_batch(i))
                sched.flush()
                runs = {"memcpy": lambda: clock(memcpy), "health": lambda: clock(lambda: health_summary(batch)),
                        "health, warm": lambda: statistics.median(clock(lambda: health_summary(batch))
                                                                  for _ in range(10)),
                        "rebuild of the capture": lambda: on_worker(lambda: codec.view_capture(captured))}
                measured = {name: run() for name, run in runs.items()}
                if i:  # the first round warms up
                    samples["dump-mode call"].append(calls)
                    for name, value in measured.items():
                        samples[name].append(value)
        line = (Path(tmp) / "d" / "train" / ".health" / "segment_000000.jsonl").read_bytes().splitlines()[-1]
    captured.release()
    out = {name: statistics.median(times) * 1000 for name, times in samples.items()}
    out["bytes per step"] = float(len(line) + 1)
    return out


def table(result: dict[str, Any]) -> str:
    call = result["dump-mode call"]
    return "\n".join([
        "| batch | bytes | dump-mode call (ms) | memcpy (ms) | health (ms) | health, warm (ms) "
        "| rebuild of the capture (ms) | health / call | health / memcpy | bytes per step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| verl rollout (int64 + float32 + bf16) | {result['bytes'] / 1e6:.0f} MB | {call:.1f} | "
        f"{result['memcpy']:.1f} | {result['health']:.2f} | {result['health, warm']:.2f} | "
        f"{result['rebuild of the capture']:.1f} | "
        f"{result['health'] / call:.3f} | {result['health'] / result['memcpy']:.3f} | "
        f"{result['bytes per step']:.0f} |",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="350M", help="bytes of the batch (default 350M)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--update-readme", action="store_true", help="rewrite the bench_health section of README.md")
    args = parser.parse_args(argv)
    info = machine(RESULTS)
    batch = make_batch(parse_size(args.size))
    result: dict[str, Any] = {"bytes": sum(t.numel() * t.element_size() for t in batch.values()),
                              **measure(batch, args.repeat)}
    text = table(result)
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": info, "result": result, "table": text}, indent=1))
    if args.update_readme:
        update_readme(TAG, f"{text}\n\nMachine: {describe_machine(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

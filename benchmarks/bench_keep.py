"""What the flight recorder's NaN/inf scan costs (issue 31): ms per GB of batch, on the writer thread.

With ``keep:`` (or ``max_keep``) every recorded batch is scanned for NaN and ±inf after it is
written, on the background writer's thread, on the copy the recorder took
(:func:`rollout_mock.codec.scan.nonfinite_values`: one ``torch.aminmax`` per floating-point
tensor). For three batches of ``--size`` bytes each, timed interleaved on a worker thread (medians
of ``--repeat``; ms per GB of the whole batch, integer tensors included):

* ``scan``: ``nonfinite_values(batch)`` on a clean batch (the common case: nothing found);
* ``memcpy``: a copy of the same tensors into preallocated tensors (``Tensor.copy_``), the floor of
  the snapshot the recorder already takes of every step;
* ``isfinite().all()``: the plain check per floating-point tensor, for comparison;
* ``scan of the capture``: what the writer thread does in background mode, where it holds the
  codec's capture of the batch rather than the batch: ``nonfinite_values(capture)``, which reads
  the capture's tensors in place (:meth:`rollout_mock.codec.Capture.tensors`: no second encode,
  no decode, no copy) and its Python floats by a byte search of its body;
* ``rebuild + scan``: what the writer did before (issue 36), for comparison: the batch rebuilt
  over the capture's memory (:func:`rollout_mock.codec.view_capture`: the container written to
  memory once more and opened by the safe decoder), then the scan.

The batches: a verl-like rollout (int64 ``input_ids``/``attention_mask``/``responses``, float32
``old_log_probs``/``ref_log_prob``/``values``/``advantages``, bfloat16 ``rewards`` per token), all
float32, all bfloat16. torch uses its default intra-op threads (``--threads`` to change), which a
real writer thread shares with the training thread.

Run: ``python benchmarks/bench_keep.py [--size 1G] [--repeat 5]``; ``--update-readme`` rewrites
the ``bench_keep`` section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, describe_machine, machine, on_worker, parse_size, update_readme

import rollout_mock.codec as codec
from rollout_mock.codec.scan import nonfinite_values

TAG = "bench_keep"


def make_batches(size: int) -> dict[str, dict[str, torch.Tensor]]:
    """Three batches of about ``size`` bytes each (see the module docstring)."""
    generator = torch.Generator().manual_seed(0)
    rows = 256
    # verl: 3 int64 + 4 float32 + 1 bfloat16 [rows, length] tensors: 42 bytes per token position
    length = max(size // (rows * 42), 1)
    verl: dict[str, torch.Tensor] = {}
    for name in ("input_ids", "attention_mask", "responses"):
        verl[name] = torch.randint(0, 150_000, (rows, length), generator=generator)
    for name in ("old_log_probs", "ref_log_prob", "values", "advantages"):
        verl[name] = torch.randn(rows, length, generator=generator)
    verl["token_level_rewards"] = torch.randn(rows, length, generator=generator).bfloat16()
    f32 = {f"t{i}": torch.randn(size // 16 // 4, generator=generator) for i in range(16)}
    bf16 = {f"t{i}": torch.randn(size // 16 // 2, generator=generator).bfloat16() for i in range(16)}
    return {"verl rollout (int64 + float32 + bf16)": verl, "float32 only": f32, "bfloat16 only": bf16}


def nbytes(batch: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values())


def measure(batch: dict[str, torch.Tensor], repeat: int) -> dict[str, float]:
    targets = {k: torch.empty_like(t) for k, t in batch.items()}
    floats = [t for t in batch.values() if t.is_floating_point()]

    def memcpy() -> None:
        for key, tensor in batch.items():
            targets[key].copy_(tensor)

    def scan() -> None:
        assert nonfinite_values(batch) == []

    def isfinite_all() -> None:
        assert all(bool(torch.isfinite(t).all()) for t in floats)

    captured = codec.capture(batch)

    def scan_capture() -> None:
        assert nonfinite_values(captured) == []

    def rebuild_scan() -> None:
        assert nonfinite_values(codec.view_capture(captured)) == []

    runs: dict[str, Callable[[], None]] = {"scan": scan, "memcpy": memcpy, "isfinite().all()": isfinite_all,
                                           "scan of the capture": scan_capture, "rebuild + scan": rebuild_scan}
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm-up (page faults of the targets, kernels)
        on_worker(run)
    for _ in range(repeat):  # interleaved
        for name, run in runs.items():
            samples[name].append(on_worker(run))
    captured.release()
    gigabytes = nbytes(batch) / 1e9
    return {name: statistics.median(times) * 1000 / gigabytes for name, times in samples.items()}


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| batch | bytes | scan (ms/GB) | memcpy (ms/GB) | scan / memcpy | isfinite().all() (ms/GB) "
             "| scan of the capture (ms/GB) | rebuild + scan (ms/GB) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['batch']} | {r['bytes'] / 1e9:.2f} GB | {r['scan']:.0f} | {r['memcpy']:.0f} | "
                     f"{r['scan'] / r['memcpy']:.2f} | {r['isfinite().all()']:.0f} | {r['scan of the capture']:.0f} | "
                     f"{r['rebuild + scan']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G", help="bytes of each batch (default 1G)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--update-readme", action="store_true", help="rewrite the bench_keep section of README.md")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    info = machine(RESULTS)
    results = []
    for name, batch in make_batches(parse_size(args.size)).items():
        results.append({"batch": name, "bytes": nbytes(batch), **measure(batch, args.repeat)})
        print(f"{name}: " + ", ".join(f"{k} {v:.0f} ms/GB" for k, v in results[-1].items() if isinstance(v, float)),
              flush=True)
    text = table(results)
    print(text)
    body = f"{text}\n\nMachine: {describe_machine(info)}"
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": info, "results": results, "table": text}, indent=1))
    if args.update_readme:
        update_readme(TAG, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

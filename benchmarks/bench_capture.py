"""The dump-mode capture and what becomes of it (issues 26 and 27): the writer thread's time per
step against a direct encode of the same capture, and what it costs that replayed tensors own
their memory.

Part 1, per batch shape (interleaved, medians of ``--repeat``):

* ``blocking``: ``codec.capture(batch, pool=...)``, what the dump-mode call blocks on (pooled
  buffers, warmed by a first untimed capture);
* ``writer``: what the writer thread does with the capture, ``DirectoryStore.save(stream, step,
  capture, info)`` (file, CRC-32, fsync, index entry). rollout_mock before the one write path ran
  ``save(capture.materialize())`` there: rebuild the batch, encode it again;
* ``direct``: a direct encode of the same capture into a step file, through the same atomic byte
  write a store makes (``backend.write_step``: temporary file, the checksumming sink, fsync,
  rename, directory fsync), without the index entry: what any writer of that step must do.

Shapes: 9 MB of tensors (the issue's measurement), and bench_shapes' slime (512 sample dicts),
verl (4,096 rows of 1-8 KB strings) and AReaL (1,024 trajectories, 6,144 small tensors).

Part 2, replayed batches: a verified ``DirectoryStore.load`` of AReaL trajectories whose small
tensors share chunks (this version: a storage of its own per tensor, made over the chunk's
memory; before: views of one chunk tensor), against ``torch.load`` of the same batch
(``weights_only=True``); and the pickle size of the replayed batch against the live one (64
trajectories, as in the issue).

Run it on this version, and once on the previous one for the "before" columns::

    PYTHONPATH=/path/to/old/checkout python benchmarks/bench_capture.py --json before.json
    python benchmarks/bench_capture.py --before before.json --update-readme
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, clock, describe_machine, human, machine, summary, update_readme, work_dir
from bench_shapes import make_areal, make_slime, make_verl

from rollout_mock import codec
from rollout_mock.storage import BatchInfo, DirectoryStore
from rollout_mock.storage.manifest import StreamId

STREAM = StreamId("train")
TAG = "bench_capture"


def make_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """8.5 MB of tensors in a verl-like dict: ids, log-probs, masks, rewards."""
    gen = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, 150_000, (320, 2048), generator=gen, dtype=torch.int64),
            "old_log_probs": torch.randn(320, 2048, generator=gen),
            "attention_mask": torch.ones(320, 2048, dtype=torch.bool), "rewards": torch.randn(320, generator=gen)}


SHAPES: dict[str, Callable[[], Any]] = {"tensors": make_tensors, "slime": make_slime, "verl": make_verl,
                                        "areal": make_areal}
#: rollout_mock before the one write path: the capture had to be rebuilt and encoded again
BEFORE = hasattr(codec, "Snapshot") and hasattr(codec.Snapshot, "materialize")


# --------------------------------------------------------------------------- part 1: the writer thread
def writer_thread(shape: str, repeat: int, work: Path) -> dict[str, Any]:
    batch = SHAPES[shape]()
    info = BatchInfo.of(batch)
    pool = codec.BufferPool(keep=2)
    store = DirectoryStore(work / f"dump-{shape}")
    store.open_writer(STREAM)
    direct_path = work / f"direct-{shape}.bin"

    def save(cap: Any, step: int) -> None:
        store.save(STREAM, step, cap.materialize() if BEFORE else cap, info)

    def direct(cap: Any) -> None:
        write_step = getattr(store.backend, "write_step", None)
        if write_step is not None:
            write_step("direct/step.bin", lambda sink: codec.encode(cap, sink), hmac_key=None, context=b"")
            return
        with open(direct_path, "wb", buffering=0) as file:  # a backend without write_step: a plain file
            codec.encode(cap, file)
            os.fsync(file.fileno())

    codec.capture(batch, pool=pool).release()  # warm the pool
    times: dict[str, list[float]] = {"blocking": [], "writer": [], "direct": []}
    for step in range(repeat):
        for job in ("writer", "direct") if not BEFORE else ("writer",):  # a fresh capture each
            holder: list[Any] = []
            times["blocking"].append(clock(lambda: holder.append(codec.capture(batch, pool=pool))))  # noqa: B023
            cap = holder.pop()
            times[job].append(clock(lambda: save(cap, step) if job == "writer" else direct(cap)))  # noqa: B023
            cap.release()
    store.close()
    out = {"shape": shape, "bytes": store.entry(STREAM, 0).size,
           "times": {k: summary(v) for k, v in times.items() if v}}
    shutil.rmtree(work / f"dump-{shape}", ignore_errors=True)
    direct_path.unlink(missing_ok=True)
    return out


# --------------------------------------------------------------------------- part 2: replayed batches
def _pickled_size(value: Any) -> int:
    return len(pickle.dumps(value, protocol=5))


def replayed(repeat: int, work: Path, trajectories: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    batch = make_areal()[:trajectories]
    store = DirectoryStore(work / "replay")
    store.save(STREAM, 0, batch, BatchInfo.of(batch))
    store.close()
    store = DirectoryStore(work / "replay")
    pt = work / "areal.pt"
    torch.save(batch, pt)
    times: dict[str, list[float]] = {"load": [], "torch_load": []}
    for _ in range(repeat):
        times["load"].append(clock(lambda: store.load(STREAM, 0)))
        times["torch_load"].append(clock(lambda: torch.load(pt, weights_only=True)))
    out["load"] = {k: summary(v) for k, v in times.items()}
    loaded = store.load(STREAM, 0)
    try:
        torch.save(loaded, io.BytesIO())
        out["torch_save"] = "works"
    except RuntimeError as exc:
        out["torch_save"] = f"fails: {str(exc).splitlines()[0]}"
    small = batch[:64]
    store = DirectoryStore(work / "replay64")
    store.save(STREAM, 0, small, BatchInfo.of(small))
    out["pickle_bytes"] = {"live": _pickled_size(small), "replayed": _pickled_size(store.load(STREAM, 0))}
    store.close()
    out["step_bytes"] = (work / "replay" / "train" / "step_000000.pkl").stat().st_size
    out["tensors"] = sum(len(item) for item in batch)
    shutil.rmtree(work / "replay", ignore_errors=True)
    shutil.rmtree(work / "replay64", ignore_errors=True)
    pt.unlink(missing_ok=True)
    return out


# --------------------------------------------------------------------------- report
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def report(after: dict[str, Any], before: dict[str, Any] | None) -> str:
    old = {r["shape"]: r for r in before["writer"]} if before else {}
    lines = ["| batch | step file | blocking call | writer thread | direct encode of the capture | "
             "writer / direct (median; best) | before: blocking call | before: writer thread | "
             "before: writer / direct (median; best) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in after["writer"]:
        t, b = ({k: v[stat] for k, v in r["times"].items()} for stat in ("median", "best"))
        o, ob = ({k: v[stat] for k, v in old[r["shape"]]["times"].items()} if r["shape"] in old else {}
                 for stat in ("median", "best"))
        lines.append(f"| {r['shape']} | {human(r['bytes'])} | {_ms(t['blocking'])} | {_ms(t['writer'])} | "
                     f"{_ms(t['direct'])} | {t['writer'] / t['direct']:.2f}x; {b['writer'] / b['direct']:.2f}x | "
                     + (f"{_ms(o['blocking'])} | {_ms(o['writer'])} | {o['writer'] / t['direct']:.2f}x; "
                        f"{ob['writer'] / b['direct']:.2f}x |" if o else "| | |"))
    r2, o2 = after["replayed"], (before or {}).get("replayed")
    load, tl = r2["load"]["load"]["median"], r2["load"]["torch_load"]["median"]
    lines += ["", f"Replayed AReaL step ({human(r2['step_bytes'])}, {r2['tensors']:,} small tensors in shared "
              "chunks):", "",
              "| | load (verified) | vs torch.load(weights_only=True) | torch.save of the replayed batch | "
              "pickle of 64 replayed trajectories (live) |", "|---|---:|---:|---|---:|",
              f"| this version (a storage per tensor) | {_ms(load)} | {load / tl:.2f}x | {r2['torch_save']} | "
              f"{human(r2['pickle_bytes']['replayed'])} ({human(r2['pickle_bytes']['live'])}) |"]
    if o2:
        old_load = o2["load"]["load"]["median"]
        lines.append(f"| before (views of one chunk) | {_ms(old_load)} | {old_load / tl:.2f}x | {o2['torch_save']} | "
                     f"{human(o2['pickle_bytes']['replayed'])} ({human(o2['pickle_bytes']['live'])}) |")
    lines.append(f"| torch.load(weights_only=True) of the same batch | {_ms(tl)} | 1.00x | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--trajectories", type=int, default=1024, help="AReaL trajectories of part 2")
    parser.add_argument("--work", type=Path, default=None, help="directory for the files (default: results/tmp)")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results")
    parser.add_argument("--before", type=Path, default=None, help="results of a run on the previous version")
    parser.add_argument("--update-readme", action="store_true", help="rewrite the bench_capture README section")
    args = parser.parse_args(argv)
    work = work_dir(args.work, "capture-")
    try:
        info = machine(work)
        results: dict[str, Any] = {"machine": info, "before_one_write_path": BEFORE, "writer": []}
        for shape in args.shapes.split(","):
            started = time.perf_counter()
            results["writer"].append(writer_thread(shape, args.repeat, work))
            print(f"{shape}: measured in {time.perf_counter() - started:.0f} s", flush=True)
        results["replayed"] = replayed(args.repeat, work, args.trajectories)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = args.json or RESULTS / "bench_capture.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    if BEFORE:
        print(json.dumps(results["writer"], indent=1))
        return 0
    before = json.loads(args.before.read_text()) if args.before else None
    table = report(results, before)
    print(table)
    if args.update_readme:
        update_readme(TAG, f"{describe_machine(info)}\n\n{table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

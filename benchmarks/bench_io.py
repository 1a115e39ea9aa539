"""Dump/load throughput of rollout_mock against the physical limit and the peers, on one batch.

    python benchmarks/bench_io.py [--size small|medium|large|both] [--repeat N] [--json out.json]
                                  [--dir DIR] [--cold] [--update-readme]

For each size, on the same realistic verl DataProto (see _data.py) and in one run:

* raw write+fsync and raw read (into fresh numpy memory) of as many bytes as rollout_mock's file;
* torch.save (+fsync) / torch.load(weights_only=True) of the tensors dict;
* ROLL's path: pickle.dump(DataProto, protocol=HIGHEST) + fsync / pickle.load;
* rollout_mock: DirectoryStore.save (checksum, fsync, manifest) and DirectoryStore.load
  (checksum verified); "dump" also adds codec.capture, the copy the dump-mode call makes;
* the time the dump-mode call blocks (codec.capture) vs one in-memory copy (clone of every tensor);
* the replay stall per step with and without prefetch (MockScheduler, mock mode, a simulated
  train step 1.5x longer than a load);
* peak extra memory of a dump and of a load, each in a fresh subprocess (VmHWM after
  resetting it through /proc/self/clear_refs).

Reads come from the page cache (the file was just written) unless --cold, which drops the page
cache before every read (needs root; said in the output whether it worked). At most one
benchmark file (~ the batch size, plus hard links) exists at a time; everything is deleted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _data import SIZES, clone_all, make_dataproto, object_bytes, tensor_bytes  # noqa: E402

import rollout_mock.codec as codec
from rollout_mock.storage import BatchInfo, DirectoryStore, Store  # noqa: E402
from rollout_mock.storage.manifest import StreamId  # noqa: E402
from rollout_mock.wrap import MockScheduler

RESULTS = Path(__file__).resolve().parent / "results"
README = Path(__file__).resolve().parent / "README.md"
RESULTS_START, RESULTS_END = "<!-- results:start -->", "<!-- results:end -->"
STREAM = StreamId("train")


# --------------------------------------------------------------------------- helpers
drop_caches = _common.drop_caches


def timed(run: Callable[[], Any], repeat: int, *, before: Callable[[], Any] | None = None,
          after: Callable[[], Any] | None = None) -> float:
    """Median wall time of ``run`` over ``repeat`` runs; ``before``/``after`` are not timed."""
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        gc.collect()
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
        del result
        if after is not None:
            after()
    return statistics.median(times)


def fsync_write(path: Path, write: Callable[[Any], None]) -> None:
    with open(path, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())


def raw_write(path: Path, payload: np.ndarray) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(payload).cast("B")
        done = 0
        while done < view.nbytes:
            done += os.write(fd, view[done:])
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path: Path, nbytes: int) -> np.ndarray:
    """The whole file into fresh memory (the shared baseline of benchmarks/_common.py)."""
    return _common.raw_read(path)


def unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- peak memory
PEAK_CHILD = r"""
import gc, json, os, sys, time
sys.path.insert(0, sys.argv[1])
import verl.protocol, tensordict  # imported before the baseline: not part of the peak
from _data import make_dataproto
import rollout_mock.codec as codec
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage import BatchInfo, DirectoryStore

def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])

def reset_hwm():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

what, size, dump_dir = sys.argv[2], sys.argv[3], sys.argv[4]
store = DirectoryStore(dump_dir)
stream = StreamId("train")
if what == "dump":
    batch = make_dataproto(size)
    info = BatchInfo.of(batch)
    gc.collect(); reset_hwm(); base = rss_kb("VmRSS")
    store.save(stream, 0, batch, info, overwrite=True)
elif what == "capture":
    batch = make_dataproto(size)
    gc.collect(); reset_hwm(); base = rss_kb("VmRSS")
    snap = codec.capture(batch)
else:
    gc.collect(); reset_hwm(); base = rss_kb("VmRSS")
    batch = store.load(stream, 0)
peak = rss_kb("VmHWM")
print(json.dumps({"extra_bytes": (peak - base) * 1024}))
"""


def peak_extra(what: str, size: str, dump_dir: Path) -> int | None:
    result = subprocess.run(
        [sys.executable, "-c", PEAK_CHILD, str(Path(__file__).resolve().parent), what, size, str(dump_dir)],
        capture_output=True, text=True, timeout=600,
    )
    if result.returncode != 0:
        print(f"peak-memory child ({what}) failed:\n{result.stderr[-2000:]}", file=sys.stderr)
        return None
    return int(json.loads(result.stdout.strip().splitlines()[-1])["extra_bytes"])


# --------------------------------------------------------------------------- replay stall
class _Spec:
    def get_batch(self, data: Any, global_step: int) -> Any:  # pragma: no cover - never called
        raise AssertionError


def replay_stalls(dump_dir: Path, steps: int, train_seconds: float, prefetch: bool) -> list[float]:
    config = {"enable": True, "mode": "mock", "dump_dir": str(dump_dir), "prefetch": prefetch,
              "fingerprint": "off"}
    stalls = []
    with MockScheduler(None, config, spec=_Spec) as mock:
        for step in range(steps):
            start = time.perf_counter()
            batch = mock.get_batch(None, step)
            stalls.append(time.perf_counter() - start)
            del batch
            time.sleep(train_seconds)  # the train step (GIL released, like a GPU step)
    return stalls


def record_steps(store: Store, batch: Any, info: Any, steps: int) -> None:
    """Steps 1..steps-1 written through the store's public API (step 0 is already there)."""
    for step in range(1, steps):
        store.save(STREAM, step, batch, info)
    store.close()


# --------------------------------------------------------------------------- one size
def bench_size(size: str, repeat: int, work: Path, cold: bool) -> dict[str, Any]:
    print(f"\n== {size}: building the batch", flush=True)
    batch = make_dataproto(size)
    tensors = dict(batch.batch.items())
    nbatch = tensor_bytes(batch) + object_bytes(batch)
    info = BatchInfo.of(batch)
    r: dict[str, Any] = {"size": size, "batch_bytes": nbatch, "tensor_bytes": tensor_bytes(batch),
                         "object_bytes": object_bytes(batch), "repeat": repeat}
    reading = drop_caches if cold else None

    # every write (and then every read) method once per round, round-robin, so that they all
    # see the same page-cache and writeback conditions on a shared machine
    dump_dir = work / f"rm_{size}"
    store = DirectoryStore(dump_dir)
    unverified = DirectoryStore(dump_dir, verify=False)
    raw_path, pt_path, roll_path = work / "raw.bin", work / "tensors.pt", work / "roll.pkl"
    store.save(STREAM, 0, batch, info)
    nbytes = store.path_of(STREAM, 0).stat().st_size
    r["file_bytes"] = nbytes
    payload = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    counter = iter(range(1, 1_000_000))

    saved: list[int] = []

    def rm_save() -> None:  # a new step each time, as in a run (no overwrite)
        saved.append(next(counter))
        store.save(STREAM, saved[-1], batch, info)

    def roll_load() -> Any:
        with open(roll_path, "rb") as file:
            return pickle.load(file)

    writes: dict[str, Callable[[], Any]] = {
        "raw_write_s": lambda: raw_write(raw_path, payload),
        "rm_save_s": rm_save,
        "torch_save_s": lambda: fsync_write(pt_path, lambda f: torch.save(tensors, f)),
        "roll_dump_s": lambda: fsync_write(
            roll_path, lambda f: pickle.dump(batch, f, protocol=pickle.HIGHEST_PROTOCOL)),
        "capture_s": lambda: codec.capture(batch),
        "clone_s": lambda: clone_all(batch),
    }
    reads: dict[str, Callable[[], Any]] = {
        "raw_read_s": lambda: raw_read(raw_path, nbytes),
        "rm_load_s": lambda: store.load(STREAM, 0),
        "rm_load_noverify_s": lambda: unverified.load(STREAM, 0),
        "torch_load_s": lambda: torch.load(pt_path, weights_only=True),
        "roll_load_s": roll_load,
    }
    targets = {"raw_write_s": raw_path, "torch_save_s": pt_path, "roll_dump_s": roll_path}
    samples: dict[str, list[float]] = {key: [] for key in [*writes, *reads]}
    for _ in range(repeat):
        for key, run in writes.items():
            # untimed: remove what the previous round wrote (unlink is slow on this disk)
            if targets.get(key) is not None:
                unlink(targets[key])
            for step in saved:
                store.delete(STREAM, step)  # the file and its index entry
            saved.clear()
            gc.collect()
            os.sync()  # untimed: every method starts with no dirty pages of earlier rounds
            start = time.perf_counter()
            result = run()
            samples[key].append(time.perf_counter() - start)
            del result
    for step in saved:
        store.delete(STREAM, step)
    saved.clear()
    for _ in range(repeat):
        for key, run in reads.items():
            if reading is not None:
                reading()
            gc.collect()
            start = time.perf_counter()
            result = run()
            samples[key].append(time.perf_counter() - start)
            del result
    for key, values in samples.items():
        r[key] = statistics.median(values)
    r["rm_dump_s"] = r["capture_s"] + r["rm_save_s"]
    r["torch_file_bytes"] = pt_path.stat().st_size
    r["roll_file_bytes"] = roll_path.stat().st_size
    for path in (raw_path, pt_path, roll_path):
        unlink(path)
    loaded = store.load(STREAM, 0)
    assert all(torch.equal(loaded.batch[k], v) for k, v in tensors.items())
    assert list(loaded.non_tensor_batch["raw_prompt"]) == list(batch.non_tensor_batch["raw_prompt"])
    del loaded

    # peak memory, each in a fresh process ----------------------------------------------
    print(f"== {size}: peak memory", flush=True)
    for what in ("dump", "capture", "load"):
        extra = peak_extra(what, size, dump_dir)
        r[f"peak_{what}_bytes"] = extra

    # replay stall with and without prefetch ---------------------------------------------
    print(f"== {size}: replay stall", flush=True)
    steps = 5
    record_steps(store, batch, info, steps)
    train = 1.5 * r["rm_load_s"]
    without = replay_stalls(dump_dir, steps, train, prefetch=False)
    with_pf = replay_stalls(dump_dir, steps, train, prefetch=True)
    r["train_step_s"] = train
    r["stall_no_prefetch_s"] = statistics.median(without[1:])
    r["stall_prefetch_s"] = statistics.median(with_pf[1:])
    r["prefetch_hidden"] = 1 - r["stall_prefetch_s"] / r["stall_no_prefetch_s"]
    shutil.rmtree(dump_dir)

    return r


# --------------------------------------------------------------------------- report
def ratios(r: dict[str, Any]) -> list[tuple[str, float, str, bool]]:
    """(label, value, target, met) — throughput ratios are time ratios inverted."""
    gb = r["file_bytes"] / r["batch_bytes"]
    rows = [
        ("dump (capture+save) vs raw write+fsync", r["raw_write_s"] / r["rm_dump_s"], ">= 0.9", 0.9),
        ("dump (save only) vs raw write+fsync", r["raw_write_s"] / r["rm_save_s"], "(info)", None),
        ("dump vs torch.save", r["torch_save_s"] / r["rm_dump_s"], ">= ~1.3", 1.3),
        ("dump vs ROLL pickle", r["roll_dump_s"] / r["rm_dump_s"], ">= 3", 3.0),
        ("load vs raw read (fresh memory)", r["raw_read_s"] / r["rm_load_s"], ">= 0.9", 0.9),
        ("load (no checksum) vs raw read", r["raw_read_s"] / r["rm_load_noverify_s"], "(info)", None),
        ("load vs torch.load(weights_only)", r["torch_load_s"] / r["rm_load_s"], ">= 1.0", 1.0),
        ("load vs ROLL unpickle", r["roll_load_s"] / r["rm_load_s"], ">= 4", 4.0),
        ("dump-mode call / one in-memory copy", r["capture_s"] / r["clone_s"], "<= 1.5", -1.5),
        ("prefetch hidden fraction of load", r["prefetch_hidden"], ">= 0.95", 0.95),
    ]
    for what in ("dump", "load"):
        peak = r.get(f"peak_{what}_bytes")
        if peak is not None:
            rows.append((f"peak extra memory during {what} / batch", peak / r["batch_bytes"], "<= 1.3", -1.3))
    peak = r.get("peak_capture_bytes")
    if peak is not None:
        rows.append(("peak extra memory of capture / batch", peak / r["batch_bytes"], "(info)", None))
    out = []
    for label, value, target, bound in rows:
        met = True if bound is None else (value >= bound if bound > 0 else value <= -bound)
        out.append((label, value, target, met))
    del gb
    return out


def print_report(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        mb = r["batch_bytes"] / 1e6
        lines.append(f"\n### {r['size']}: batch {mb:.1f} MB ({r['tensor_bytes'] / 1e6:.1f} MB tensors, "
                     f"{r['object_bytes'] / 1e6:.2f} MB strings), rollout_mock file {r['file_bytes'] / 1e6:.1f} MB, "
                     f"median of {r['repeat']}\n")
        lines.append("| operation | median s | GB/s |")
        lines.append("|---|---:|---:|")
        for key, label, nbytes in [
            ("raw_write_s", "raw write+fsync", r["file_bytes"]),
            ("rm_save_s", "rollout_mock save (serialise+crc+fsync+manifest)", r["file_bytes"]),
            ("rm_dump_s", "rollout_mock dump (capture + save)", r["file_bytes"]),
            ("torch_save_s", "torch.save + fsync", r["torch_file_bytes"]),
            ("roll_dump_s", "ROLL pickle.dump(DataProto) + fsync", r["roll_file_bytes"]),
            ("raw_read_s", "raw read into fresh memory", r["file_bytes"]),
            ("rm_load_s", "rollout_mock load (crc verified)", r["file_bytes"]),
            ("rm_load_noverify_s", "rollout_mock load (verify_checksum: false)", r["file_bytes"]),
            ("torch_load_s", "torch.load(weights_only=True)", r["torch_file_bytes"]),
            ("roll_load_s", "ROLL pickle.load(DataProto)", r["roll_file_bytes"]),
            ("clone_s", "one in-memory copy (clone every tensor)", r["tensor_bytes"]),
            ("capture_s", "dump-mode call blocks (codec.capture)", r["tensor_bytes"]),
        ]:
            lines.append(f"| {label} | {r[key]:.4f} | {nbytes / r[key] / 1e9:.2f} |")
        lines.append(f"| replay stall/step without prefetch (train step {r['train_step_s']:.3f} s) | "
                     f"{r['stall_no_prefetch_s']:.4f} | |")
        lines.append(f"| replay stall/step with prefetch | {r['stall_prefetch_s']:.4f} | |")
        lines.append("")
        lines.append("| ratio | value | target | met |")
        lines.append("|---|---:|---|---|")
        for label, value, target, met in ratios(r):
            lines.append(f"| {label} | {value:.2f} | {target} | {'yes' if met else 'NO'} |")
    text = "\n".join(lines)
    print(text)
    return text


def machine() -> dict[str, Any]:
    mem = next((line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")), "0")
    return {"cpus": os.cpu_count(), "mem_gib": round(int(mem) / 2**20, 1), "kernel": platform.release(),
            "python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=[*SIZES, "both"], default="both")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="default: benchmarks/results/bench_io-<time>.json")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: benchmarks/results/tmp)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before every read")
    parser.add_argument("--update-readme", action="store_true",
                        help="replace the Results section of benchmarks/README.md with this run")
    args = parser.parse_args(argv)
    sizes = ["small", "large"] if args.size == "both" else [args.size]
    work = Path(tempfile.mkdtemp(prefix="bench_io_", dir=args.dir or _default_dir()))
    cold = args.cold and drop_caches()
    if args.cold and not cold:
        print("could not drop the page cache: reads come from the page cache", file=sys.stderr)
    info = {"machine": machine(), "disk_dir": str(work), "cold_reads": cold,
            "torch_threads": torch.get_num_threads()}
    print(json.dumps(info))
    results = []
    try:
        for size in sizes:
            repeat = args.repeat * 5 if size == "small" else args.repeat  # small: noisier
            results.append(bench_size(size, repeat, work, cold))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = print_report(results)
    out = args.json or RESULTS / f"bench_io-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**info, "results": results, "table": table}, indent=1))
    print(f"\nwrote {out}")
    if args.update_readme:
        update_readme(info, table, argv if argv is not None else sys.argv[1:])
        print(f"updated {README}")
    return 0


def update_readme(info: dict[str, Any], table: str, argv: list[str]) -> None:
    """Replace what lies between the results markers of benchmarks/README.md with this run."""
    text = README.read_text()
    start, end = text.find(RESULTS_START), text.find(RESULTS_END)
    if start < 0 or end < start:
        raise SystemExit(f"{README}: no {RESULTS_START} ... {RESULTS_END} section to update")
    m = info["machine"]
    body = (
        f"`{' '.join(['python benchmarks/bench_io.py', *argv])}`, run on "
        f"{time.strftime('%Y-%m-%d')}: {m['cpus']} CPUs, {m['mem_gib']} GiB RAM, Linux {m['kernel']}, "
        f"Python {m['python']}, torch {m['torch']}, numpy {m['numpy']}, "
        f"{'cold' if info['cold_reads'] else 'page-cache'} reads.\n\n{table.strip()}\n"
    )
    README.write_text(text[: start + len(RESULTS_START)] + "\n\n" + body + "\n" + text[end:])


def _default_dir() -> Path:
    path = RESULTS / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


if __name__ == "__main__":
    raise SystemExit(main())

"""Python objects and many small tensors (issue 19): the three batch shapes of slime, verl and
AReaL, against the formats their users have today, in one run.

For each shape, timed interleaved (format A, B, C, A, B, C, ...; medians of ``--repeat``):

* write: rollout_mock ``DirectoryStore.save`` (CRC-32, fsync, manifest, atomic rename) against
  ``pickle.dump`` protocol 5 + fsync (ROLL), ``torch.save`` + fsync (AReaL, slime) and a raw write
  of as many bytes + fsync (the disk's limit);
* load: ``DirectoryStore.load`` (every chunk CRC-checked, no pickle) against ``pickle.load``,
  ``torch.load(weights_only=False)`` and ``(weights_only=True)``, and a raw read of the file into
  ``torch.empty`` memory;
* blocking call: what the dump-mode call blocks with the background writer (``MockScheduler``
  ``get_batch``: the snapshot) against ``pickle.dumps`` of the batch and against copying the
  batch's bytes into preallocated memory (the physical floor of any snapshot);
* file size, and an exact round trip (types included) of every format that can hold the batch.

Then the targets of issue 36 for Python objects (slime's sample dicts, verl's object columns), each
the best (minimum) of ``--repeat`` runs over the best of the peer's in the same run: the blocking
call against ``pickle.dumps``, the write against ``pickle.dump`` + fsync, the load against
``pickle.load``; each at most 1.00x.

Run: ``python benchmarks/bench_shapes.py [--shapes slime,verl,areal] [--repeat 5]``. It prints a
table; ``--update-readme`` rewrites the ``bench_shapes`` section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    RESULTS,
    clock,
    describe_machine,
    fsync_path,
    human,
    machine,
    raw_write,
    summary,
    update_readme,
    work_dir,
)

from rollout_mock.storage import BatchInfo, DirectoryStore
from rollout_mock.storage.manifest import StreamId

STREAM = StreamId("train")
TAG = "bench_shapes"
_WORDS = ["the", "a", "solve", "for", "x", "prove", "that", "integer", "sum", "of", "let", "be", "real"]


# --------------------------------------------------------------------------- the shapes
def _text(rng: np.random.Generator, nbytes: int) -> str:
    words = rng.choice(_WORDS, max(1, nbytes // 4))
    return " ".join(words)[:nbytes]


def make_slime(seed: int = 0) -> list[dict[str, Any]]:
    """512 slime ``Sample`` dicts: token lists, log-prob lists, prompt/response strings, nested metadata."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(512):
        prompt_len, response_len = int(rng.integers(256, 1024)), int(rng.integers(256, 2048))
        tokens = rng.integers(0, 150_000, prompt_len + response_len).tolist()
        samples.append({
            "index": i, "group_index": i // 8, "prompt": _text(rng, 4 * prompt_len),
            "response": _text(rng, 4 * response_len), "tokens": tokens, "response_length": response_len,
            "label": str(int(rng.integers(0, 1000))), "reward": float(rng.standard_normal()),
            "loss_mask": [1] * response_len, "rollout_log_probs": (-rng.random(response_len)).tolist(),
            "status": "completed", "aborted": False, "weight_versions": ["v3"],
            "metadata": {"source": "dapo-math", "difficulty": int(rng.integers(1, 6)), "tags": ["math", "int"],
                         "extra": {"turns": 1, "truncated": bool(rng.integers(0, 2)), "score": None}},
        })
    return samples


def make_verl(seed: int = 0) -> Any:
    """A verl ``DataProto`` of 4,096 rows: prompt/response strings of 1-8 KB, a uid and a dict per row."""
    from verl.protocol import DataProto

    rng = np.random.default_rng(seed)
    rows = 4096
    prompts = np.array([_text(rng, int(rng.integers(1 << 10, 8 << 10))) for _ in range(rows)], dtype=object)
    responses = np.array([_text(rng, int(rng.integers(1 << 10, 8 << 10))) for _ in range(rows)], dtype=object)
    uid = np.array([f"{i // 8:08x}-4c1d-uid" for i in range(rows)], dtype=object)
    extra = np.array([{"index": i, "split": "train", "answer": str(i % 97)} for i in range(rows)], dtype=object)
    return DataProto(batch=None, non_tensor_batch={"raw_prompt": prompts, "response": responses, "uid": uid,
                                                   "extra_info": extra}, meta_info={"global_step": 1})


def make_areal(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """1,024 AReaL trajectory dicts of 6 tensors each (6,144 small tensors, ~94 MB)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(1024):
        n = int(torch.randint(3500, 5500, (1,), generator=gen))
        out.append({
            "input_ids": torch.randint(0, 150_000, (1, n), generator=gen),
            "logprobs": torch.randn(1, n, generator=gen),
            "loss_mask": torch.randint(0, 2, (1, n), generator=gen, dtype=torch.int32),
            "versions": torch.randint(0, 4, (1, n), generator=gen, dtype=torch.int32),
            "attention_mask": torch.ones(1, n, dtype=torch.bool),
            "rewards": torch.randn(1, generator=gen),
        })
    return out


SHAPES: dict[str, Callable[[], Any]] = {"slime": make_slime, "verl": make_verl, "areal": make_areal}
#: the peer each shape is judged against (issue 19)
PEER = {"slime": "pickle", "verl": "pickle", "areal": "torch"}


# --------------------------------------------------------------------------- exactness
def same(a: Any, b: Any) -> bool:
    """Equal values of the same types (NaN equal to NaN, -0.0 distinct from 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape \
            and all(same(x, y) for x, y in zip(a.reshape(-1), b.reshape(-1)))
    if hasattr(a, "non_tensor_batch"):
        return same(a.non_tensor_batch, b.non_tensor_batch) and same(a.meta_info, b.meta_info) \
            and (a.batch is None) == (b.batch is None)
    return bool(a == b)


# --------------------------------------------------------------------------- the formats
def _fsynced(path: Path, dump: Callable[[Any], None]) -> None:
    with open(path, "wb") as file:
        dump(file)
        file.flush()
        os.fsync(file.fileno())


def read_into_empty(path: Path) -> torch.Tensor:
    """The file's bytes into ``torch.empty`` memory (what a loader's tensors live in)."""
    nbytes = path.stat().st_size
    out = torch.empty(nbytes, dtype=torch.uint8)
    view = memoryview(out.numpy())
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < nbytes:
            got = os.preadv(fd, [view[done:]], done)
            if got <= 0:
                break
            done += got
    finally:
        os.close(fd)
    return out


def formats(work: Path, nbytes: int) -> dict[str, dict[str, Callable[..., Any]]]:
    pkl, pt, raw = work / "batch.pkl", work / "batch.pt", work / "raw.bin"
    store = DirectoryStore(work / "rm")
    state = {"step": 0}
    blob = np.ones(max(nbytes, 1), np.uint8)

    def rm_write(batch: Any) -> None:
        state["step"] += 1
        store.save(STREAM, state["step"], batch, BatchInfo.of(batch))

    def rm_clear() -> None:
        if state["step"]:
            store.delete(STREAM, state["step"])

    return {
        "rm": {"write": rm_write, "load": lambda: store.load(STREAM, state["step"]), "clear": rm_clear,
               "path": lambda: store.path_of(STREAM, state["step"])},
        "pickle": {"write": lambda b: _fsynced(pkl, lambda f: pickle.dump(b, f, protocol=5)),
                   "load": lambda: pickle.load(open(pkl, "rb")), "path": lambda: pkl},
        "torch": {"write": lambda b: (torch.save(b, pt), fsync_path(pt)),
                  "load": lambda: torch.load(pt, weights_only=False), "path": lambda: pt,
                  "load_weights_only": lambda: torch.load(pt, weights_only=True)},
        "raw": {"write": lambda b: raw_write(raw, [blob]), "load": lambda: read_into_empty(raw), "path": lambda: raw},
    }


def measure(shape: str, repeat: int, work: Path) -> dict[str, Any]:
    batch = SHAPES[shape]()
    BatchInfo.of(batch)
    nbytes = len(pickle.dumps(batch, protocol=5))
    fmts = formats(work, nbytes)
    times: dict[str, list[float]] = {}
    for _ in range(repeat):
        for key, fmt in fmts.items():
            if "clear" in fmt:
                fmt["clear"]()
            times.setdefault(f"{key}.write", []).append(clock(lambda: fmt["write"](batch)))  # noqa: B023
        for key, fmt in fmts.items():
            times.setdefault(f"{key}.load", []).append(clock(fmt["load"]))
            if "load_weights_only" in fmt:
                try:
                    times.setdefault("torch.load_weights_only", []).append(clock(fmt["load_weights_only"]))
                except Exception:  # noqa: BLE001 - weights_only refuses Python objects it does not allow
                    times.pop("torch.load_weights_only", None)
                    del fmt["load_weights_only"]
    out: dict[str, Any] = {"shape": shape, "repeat": repeat, "pickle_bytes": nbytes,
                           "times": {k: summary(v) for k, v in times.items()}}
    out["file_bytes"] = {k: f["path"]().stat().st_size for k, f in fmts.items() if k != "raw"}
    out["exact"] = {k: same(batch, fmts[k]["load"]()) for k in ("rm", "pickle", "torch")}
    out["blocking"] = blocking(batch, repeat, work)
    shutil.rmtree(work / "rm", ignore_errors=True)
    return out


def _floor_copy(batch: Any) -> Callable[[], Any]:
    """A copy of the batch's bytes into preallocated memory: tensors' data, or its pickle's size."""
    tensors = [t for item in batch for t in item.values()] if isinstance(batch, list) and batch \
        and isinstance(batch[0], dict) and all(isinstance(v, torch.Tensor) for v in batch[0].values()) else None
    if tensors is not None:
        targets = [torch.empty_like(t) for t in tensors]
        return lambda: [d.copy_(s) for d, s in zip(targets, tensors)]
    source = np.frombuffer(pickle.dumps(batch, protocol=5), np.uint8)
    target = np.empty_like(source)
    target[:] = source
    return lambda: np.copyto(target, source)


def blocking(batch: Any, repeat: int, work: Path) -> dict[str, Any]:
    from rollout_mock.wrap import MockScheduler

    class Source:
        def get_batch(self, data: Any, global_step: int) -> Any:
            return batch

    floor = _floor_copy(batch)
    samples: dict[str, list[float]] = {"call": [], "pickle_dumps": [], "copy_floor": []}
    config = {"enable": True, "mode": "dump", "dump_dir": str(work / "bg"), "background": True,
              "fingerprint": "off"}
    with MockScheduler(Source(), config) as mock:
        for step in range(repeat + 1):
            call = clock(lambda: mock.get_batch(None, step))  # noqa: B023
            mock.flush()  # untimed: the writer finishes before the next call
            if step:  # the first call warms the snapshot buffers
                samples["call"].append(call)
                samples["pickle_dumps"].append(clock(lambda: pickle.dumps(batch, protocol=5)))
                samples["copy_floor"].append(clock(floor))
    shutil.rmtree(work / "bg", ignore_errors=True)
    return {key: summary(values) for key, values in samples.items()}


# --------------------------------------------------------------------------- report
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def report(results: list[dict[str, Any]]) -> str:
    lines = [("| batch | op | rollout_mock | pickle 5 (+fsync) | torch.save / torch.load(wo=False) "
              "| torch.load(weights_only=True) | raw bytes | rollout_mock / peer |"),
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        t = {k: v["median"] for k, v in r["times"].items()}
        peer = PEER[r["shape"]]
        for op in ("write", "load"):
            wo = t.get("torch.load_weights_only") if op == "load" else None
            lines.append(f"| {r['shape']} | {op} | {_ms(t['rm.' + op])} | {_ms(t['pickle.' + op])} | "
                         f"{_ms(t['torch.' + op])} | "
                         f"{'refused' if op == 'load' and wo is None else _ms(wo) if wo else ''} | "
                         f"{_ms(t['raw.' + op])} | {t['rm.' + op] / t[peer + '.' + op]:.2f}x {peer} |")
        b = {k: v["median"] for k, v in r["blocking"].items()}
        lines.append(f"| {r['shape']} | blocking call | {_ms(b['call'])} | {_ms(b['pickle_dumps'])} (dumps) | | | "
                     f"{_ms(b['copy_floor'])} (copy) | {b['call'] / b['pickle_dumps']:.2f}x dumps, "
                     f"{b['call'] / b['copy_floor']:.2f}x copy |")
        sizes = r["file_bytes"]
        lines.append(f"| {r['shape']} | file size | {human(sizes['rm'])} | {human(sizes['pickle'])} | "
                     f"{human(sizes['torch'])} | | | {sizes['rm'] / sizes[peer]:.2f}x {peer} |")
        lines.append(f"| {r['shape']} | exact round trip | {r['exact']['rm']} | {r['exact']['pickle']} | "
                     f"{r['exact']['torch']} | | | |")
    return "\n".join(lines)


#: (row, rollout_mock's time, pickle's time) of each issue 36 target, for the Python-object shapes
TARGETS = (("blocking call / pickle.dumps", ("blocking", "call"), ("blocking", "pickle_dumps")),
           ("write / pickle.dump + fsync", ("times", "rm.write"), ("times", "pickle.write")),
           ("load / pickle.load", ("times", "rm.load"), ("times", "pickle.load")))
TARGET_SHAPES = ("slime", "verl")


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 36's six ratios (best of the repeats over best): at most 1.00x each."""
    rows = []
    for r in results:
        if r["shape"] not in TARGET_SHAPES:
            continue
        for name, (part, mine), (_, peer) in TARGETS:
            ratio = r[part][mine]["best"] / r[part][peer]["best"]
            rows.append({"shape": r["shape"], "ratio": name, "value": ratio, "n": r[part][mine]["n"],
                         "met": ratio <= 1.0})
    return rows


def report_targets(rows: list[dict[str, Any]]) -> str:
    lines = ["| batch | issue 36 target | best of n / best of n | target | met |", "|---|---|---:|---|---|"]
    lines += [f"| {row['shape']} | {row['ratio']} | {row['value']:.2f}x (n={row['n']}) | <= 1.00x | "
              f"{'yes' if row['met'] else 'no'} |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="slime,verl,areal")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--work", type=Path, default=None, help="directory for the files (default: results/tmp)")
    parser.add_argument("--update-readme", action="store_true", help="rewrite the bench_shapes section of README.md")
    args = parser.parse_args(argv)
    work = work_dir(args.work, "shapes-")
    try:
        info = machine(work)
        results = []
        for shape in args.shapes.split(","):
            started = time.perf_counter()
            results.append(measure(shape, args.repeat, work))
            print(f"{shape}: measured in {time.perf_counter() - started:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = report(results)
    goals = targets(results)
    if goals:
        table += "\n\n" + report_targets(goals)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_shapes.json").write_text(json.dumps({"machine": info, "results": results, "targets": goals},
                                                          indent=1))
    if args.update_readme:
        update_readme(TAG, f"{describe_machine(info)}\n\n{table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

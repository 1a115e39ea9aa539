"""What request matching costs per call (issue 26): the request digest in dump and mock mode.

For four requests — verl prompts (a ``DataProto`` of 8,192 rows: three int64 [8192, 512]
tensors and five object columns), a slime sample list (512 sample dicts), an AReaL trajectory
list (1,024 dicts of 6 tensors) and a flat dict of 300,000 str -> int items (issue 37: one
msgpack call, not a walk key by key) — timed interleaved (medians of ``--repeat``):

* dump mode: the digest of the call (``RequestMatcher.request``) and its JSON, what is recorded;
* mock mode: the digest, the recorded request read back and the comparison (``differences``);
* a plain copy of the same arguments (``copy.deepcopy``), a copy of their tensor bytes into
  preallocated memory (the floor of any copy: what the digest of verl and AReaL requests is
  measured against) and, for slime (no tensors), ``pickle.dumps`` of the list (the floor of any
  pass that turns its Python objects into bytes);
* the dump-mode call: ``MockScheduler.get_batch`` of a scheduler that returns at once (so the
  call is all rollout_mock: digest, batch summary, snapshot for the background writer), with
  request matching on and off (``match_on: [step]``); the difference is what the digest adds.
  A real call also waits for the rollout (seconds to minutes), which this leaves out: the table
  says from which rollout time on the digest adds under 5% to the call. The writer is flushed
  after each timed call, outside the timing, and given 0.1 s for what it releases after its last
  job, so that it does not compete with the next timing; the two dump calls alternate which of
  them goes first.

Every timing starts after a ``gc.collect()``. "recorded per step" is the request's JSON as the
store writes it (compact), and the whole step entry it is part of.

Run: ``python benchmarks/bench_digest.py [--repeat 5]``; ``--update-readme`` rewrites the
``bench_digest`` section of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import pickle
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, clock, describe_machine, machine, update_readme, work_dir
from bench_shapes import make_areal, make_slime

from rollout_mock import MockScheduler
from rollout_mock.config import MatchSettings, MismatchPolicy
from rollout_mock.storage.manifest import StreamId
from rollout_mock.storage.store import MemoryStore
from rollout_mock.wrap.matching import Request
from rollout_mock.wrap.mismatch import RequestMatcher, differences

TAG = "bench_digest"
_WORDS = np.array(["the", "a", "solve", "for", "x", "prove", "that", "integer", "sum", "of"])


def make_verl_prompts(rows: int = 8192, length: int = 512, seed: int = 0) -> Any:
    """verl's ``gen_batch``: tokenised prompts and the dataset's columns (a uid per prompt)."""
    from tensordict import TensorDict
    from verl.protocol import DataProto

    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    tensors = {"input_ids": torch.randint(0, 150_000, (rows, length), generator=gen),
               "attention_mask": torch.ones(rows, length, dtype=torch.int64),
               "position_ids": torch.arange(length).expand(rows, length).contiguous()}
    columns = {
        "raw_prompt": np.array([" ".join(rng.choice(_WORDS, 80)) for _ in range(rows)], dtype=object),
        "data_source": np.array(["openai/gsm8k"] * rows, dtype=object),
        "reward_model": np.array([{"ground_truth": str(i % 97), "style": "rule"} for i in range(rows)], dtype=object),
        "extra_info": np.array([{"index": i, "split": "train"} for i in range(rows)], dtype=object),
        "index": np.arange(rows).astype(object),
        "uid": np.array([f"{i:08x}-uid" for i in range(rows)], dtype=object),
    }
    return DataProto(batch=TensorDict(tensors, batch_size=[rows]), non_tensor_batch=columns,
                     meta_info={"global_steps": 1, "temperature": 1.0})


def tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors_of(v)]
    batch = getattr(value, "batch", None)
    return [] if batch is None else list(batch.values())


def floor_copy(value: Any) -> Callable[[], None]:
    """Copy the tensor bytes of ``value`` into memory allocated once (the floor of any copy)."""
    sources = tensors_of(value)
    targets = [torch.empty_like(t) for t in sources]

    def run() -> None:
        for target, source in zip(targets, sources):
            target.copy_(source)

    return run


class Echo:
    """A rollout that returns at once: the dump-mode call is rollout_mock's work alone."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def get_batch(self, data: Any, global_step: int) -> Any:
        return self.batch


def dump_call(request: Any, output: Any, work: Path, *, matching: bool, calls: int) -> Callable[[], None]:
    """One ``get_batch`` call in dump mode (background writer), a new step each time."""
    block = {"enable": True, "mode": "dump", "dump_dir": str(work), "max_pending": calls + 2, "overwrite": True}
    if not matching:
        block["match_on"] = ["step"]
    store = MemoryStore()
    mock = MockScheduler(Echo(output), block, store=store)
    counter = iter(range(10**9))

    def run() -> None:
        mock.get_batch(request, global_step=next(counter))

    def entry_bytes() -> int:
        """The compact JSON of the first recorded step's entry."""
        entry = store.entry(StreamId("train"), 0)
        return 0 if entry is None else len(json.dumps(entry.to_json(), separators=(",", ":")))

    run.close = mock.close  # type: ignore[attr-defined]
    run.flush = mock.flush  # type: ignore[attr-defined]
    run.entry_bytes = entry_bytes  # type: ignore[attr-defined]
    return run


def measure(name: str, request: Any, output: Any, repeat: int, work: Path) -> dict[str, Any]:
    matcher = RequestMatcher(MatchSettings(None, MismatchPolicy.ERROR), MemoryStore(), StreamId("train"))
    first = matcher.request("get_batch", (request,), {}, ["data"], None)
    assert first is not None
    recorded = json.dumps(first.to_json(), separators=(",", ":"))

    def dump_digest() -> None:
        json.dumps(matcher.request("get_batch", (request,), {}, ["data"], None).to_json(), separators=(",", ":"))

    def mock_digest() -> None:
        live = matcher.request("get_batch", (request,), {}, ["data"], None)
        saved = Request.from_json(json.loads(recorded))
        assert live is not None and saved is not None and not differences(saved, live)

    on = dump_call(request, output, work / f"{name}-on", matching=True, calls=repeat + 1)
    off = dump_call(request, output, work / f"{name}-off", matching=False, calls=repeat + 1)
    runs: dict[str, Callable[[], Any]] = {
        "dump digest": dump_digest, "mock digest + compare": mock_digest,
        "copy.deepcopy": lambda: copy.deepcopy(request), "tensor bytes copy": floor_copy(request),
    }
    if not tensors_of(request):  # a list of Python objects: its floor is pickle's pass over them
        runs["pickle.dumps"] = lambda: pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    runs.update({"dump call, matching on": on, "dump call, matching off": off})  # last: they alternate
    times: dict[str, list[float]] = {key: [] for key in runs}
    for key, run in runs.items():  # warm up
        if key != "copy.deepcopy":
            run()
            if hasattr(run, "flush"):
                run.flush()
    keys = list(runs)
    for index in range(repeat):
        # the two dump calls alternate which goes first (neither always follows the same run)
        order = keys if index % 2 == 0 else [*keys[:-2], keys[-1], keys[-2]]
        for key in order:
            run = runs[key]
            if key == "copy.deepcopy" and len(times[key]) >= 2:
                continue  # seconds each for Python objects: two are enough
            times[key].append(clock(run))  # after a gc.collect(): no other run's garbage is timed
            flush = getattr(run, "flush", None)
            if flush is not None:  # the background writer must not compete with the next timing:
                flush()  # its queue drained, then a pause for what it releases after the last job
                time.sleep(0.1)
    entry_on, entry_off = on.entry_bytes(), off.entry_bytes()  # type: ignore[attr-defined]
    on.close()  # type: ignore[attr-defined]
    off.close()  # type: ignore[attr-defined]
    return {"shape": name, "bytes": sum(t.numel() * t.element_size() for t in tensors_of(request)),
            "request_json_bytes": len(recorded), "entry_bytes": entry_on, "entry_bytes_unmatched": entry_off,
            **{k: statistics.median(v) for k, v in times.items()}}


def report(results: list[dict[str, Any]]) -> str:
    lines = ["| request | tensor bytes | dump: digest | mock: digest + compare | floor: copy of the tensor bytes "
             "(pickle.dumps) | digest / floor | copy.deepcopy | dump call, off → on (instant rollout) | digest adds "
             "| adds < 5% once the rollout takes | recorded per step (step entry) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        ms = {k: r[k] * 1e3 for k in r if isinstance(r[k], float)}
        floor_key = "pickle.dumps" if "pickle.dumps" in r else "tensor bytes copy"
        floor = f"{ms[floor_key]:.1f} ms" + (" (pickle)" if floor_key == "pickle.dumps" else "")
        added_s = r["dump call, matching on"] - r["dump call, matching off"]
        added = added_s / r["dump call, matching off"]
        rollout = max(20 * added_s - r["dump call, matching off"], 0.0)  # added / (off + rollout) < 5%
        lines.append(
            f"| {r['shape']} | {r['bytes'] / 1e6:.0f} MB | {ms['dump digest']:.1f} ms "
            f"| {ms['mock digest + compare']:.1f} ms | {floor} | {r['dump digest'] / r[floor_key]:.2f}x "
            f"| {ms['copy.deepcopy']:.0f} ms | {ms['dump call, matching off']:.1f} → "
            f"{ms['dump call, matching on']:.1f} ms | {added_s * 1e3:+.1f} ms ({added:+.0%}) | {rollout:.2f} s "
            f"| {r['request_json_bytes'] / 1e3:.1f} KB ({r['entry_bytes'] / 1e3:.1f} KB) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="verl,slime,areal,flat")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="tiny shapes (a smoke test)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--dir", type=Path, default=None, help="parent of the scratch directory")
    parser.add_argument("--update-readme", action="store_true", help="rewrite the bench_digest section of README.md")
    args = parser.parse_args(argv)
    work = work_dir(args.dir, "bench_digest_")
    info = machine(work)
    builders: dict[str, Callable[[], tuple[Any, Any]]] = {
        "verl prompts (DataProto, 8,192 rows)": lambda: (make_verl_prompts(64 if args.small else 8192),) * 2,
        "slime samples (512 dicts)": lambda: (make_slime()[: 8 if args.small else 512],) * 2,
        "AReaL trajectories (1,024 dicts)": lambda: (make_areal()[: 8 if args.small else 1024],) * 2,
        # issue 37: a big plain mapping is digested in a few C calls, not key by key
        "flat dict (300,000 str -> int)": lambda: ({f"key_{i:07d}": i for i in range(1000 if args.small else 300_000)},
                                                   {"x": [1]}),
    }
    wanted = args.shapes.split(",")
    results = []
    try:
        for name, build in builders.items():
            if not any(name.lower().startswith(w.strip().lower()) for w in wanted):
                continue
            request, output = build()
            results.append(measure(name.split(" ")[0].lower(), request, output, args.repeat, work))
            print(f"done: {name}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = report(results)
    print(table)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": info, "results": results, "table": table}, indent=1))
    else:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "bench_digest.json").write_text(json.dumps({"machine": info, "results": results}, indent=1))
    if args.update_readme:
        update_readme(TAG, f"{describe_machine(info)}\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

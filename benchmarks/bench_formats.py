"""rollout_mock against the peers' ways of storing a rollout batch, and how costs scale.

    python benchmarks/bench_formats.py [--size small|medium|large] [--repeat N] [--cold]
                                       [--max-size 1G] [--steps 500] [--skip peers,peak,scaling,steps]
                                       [--dir DIR] [--json OUT] [--update-readme]

One run produces, on the realistic verl DataProto of ``_data.py`` (default ``medium``, ~0.35 GB):

1. **The peer table**: for each format, the write time (everything a caller waits for, fsync
   included), the load time (into fresh memory; from the page cache, or from disk with
   ``--cold``), bytes on disk, and peak extra memory of a write and of a load (each in a fresh
   subprocess: VmHWM after resetting it through ``/proc/self/clear_refs``), with ratios to the
   raw bytes measured in the same run. Formats:

   * raw bytes: the batch's tensor bytes plus as many more bytes as rollout_mock's file has,
     ``os.write`` + fsync; read back into one fresh buffer — the physical limit;
   * ``torch.save`` (AReaL/slime) of the batch as plain containers (tensors dict, strings as
     lists, meta dict) + fsync / ``torch.load(weights_only=True)``;
   * ROLL: ``pickle.dump(DataProto, protocol=HIGHEST)`` + fsync / ``pickle.load`` (DataProto's
     own ``__getstate__`` torch.saves the TensorDict into a bytes object);
   * verl: ``DataProto.save_to_disk`` + fsync / ``DataProto.load_from_disk`` (the same pickling,
     default protocol);
   * safetensors: ``save_file`` + fsync / ``load_file`` of the **tensors only** (it cannot store
     the strings or meta_info); ``load_file`` maps the file lazily, so its load time includes
     reading one byte of every 4 KiB page (the lazy call alone is listed for information);
   * rollout_mock: ``DirectoryStore.save`` (CRC-32, fsync, manifest, atomic rename) /
     ``DirectoryStore.load`` (CRC-32 verified); also the unverified load, for information;
   * the dump-mode call (background writer): ``codec.capture`` and the real blocking
     ``MockScheduler.get_batch`` against one in-memory copy (``clone`` of every tensor).

2. **Scaling over batch size**, 1 MiB to ``--max-size`` (x4 steps; default 1G so that a run
   takes a few minutes; ``--max-size 4G`` adds 4 GiB; sizes that do not fit in the available
   memory are skipped with a note): rollout_mock save/load against raw and torch.save/torch.load.

3. **Scaling over steps recorded**: the cost of dumping (synchronous writer) and replaying step N
   of a run of ``--steps`` tiny steps through MockScheduler.

Writes rotate round-robin over the formats within each repeat, each after ``os.sync()`` (no dirty
pages of an earlier write), so all see the same machine state; the same for reads. Medians are
reported, and the best time in the JSON. Every run writes ``benchmarks/results/bench_formats-<time>.json``
(git-ignored) and prints Markdown tables; ``--update-readme`` rewrites the section between the
``bench_formats`` markers of ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    available_bytes,
    clock,
    describe_machine,
    disk_bytes,
    drop_caches,
    fsync_path,
    human,
    machine,
    parse_size,
    peak_since,
    raw_read,
    raw_write,
    reset_peak,
    run_child,
    summary,
    update_readme,
    work_dir,
)
from _data import SIZES, clone_all, make_dataproto, object_bytes, samples_for, tensor_bytes  # noqa: E402

from rollout_mock import codec  # noqa: E402
from rollout_mock.storage import BatchInfo, DirectoryStore  # noqa: E402
from rollout_mock.storage.manifest import StreamId  # noqa: E402

STREAM = StreamId("train")
_T0 = time.perf_counter()
SCRIPT = Path(__file__).resolve()
TAG = "bench_formats"


# --------------------------------------------------------------------------- the formats
@dataclass
class Format:
    """One way of storing a batch: ``write(batch)`` stores it at ``target``, ``load()`` reads it back."""

    key: str
    label: str
    target: Path
    write: Callable[[Any], None]
    load: Callable[[], Any]
    prepare: Callable[[], None] = lambda: None  # untimed, before each write: remove the last one
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _unlinker(path: Path) -> Callable[[], None]:
    return lambda: path.unlink(missing_ok=True)


def _as_containers(batch: Any) -> dict[str, Any]:
    """What an AReaL/slime-style ``torch.save`` stores: tensors, strings as lists, meta dict."""
    return {
        "batch": dict(batch.batch.items()),
        "non_tensor_batch": {key: value.tolist() for key, value in batch.non_tensor_batch.items()},
        "meta_info": dict(batch.meta_info),
    }


def _touch(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Read one byte of every 4 KiB page: safetensors' load_file maps the file and reads lazily."""
    for tensor in tensors.values():
        if tensor.numel():
            tensor.reshape(-1).view(torch.uint8)[::4096].sum()
    return tensors


def make_formats(work: Path, keys: list[str] | None = None, *, pad_to: int | None = None) -> dict[str, Format]:
    """The formats, writing under ``work``. ``pad_to``: the raw write's total size (default:
    the tensor bytes only)."""
    from safetensors.torch import load_file, save_file
    from verl.protocol import DataProto

    formats: dict[str, Format] = {}
    raw_path = work / "raw.bin"

    def write_raw(batch: Any) -> None:
        buffers: list[Any] = [t.reshape(-1).view(torch.uint8).numpy() for t in batch.batch.values()]
        have = sum(b.nbytes for b in buffers)
        if pad_to is not None and pad_to > have:
            buffers.append(bytes(pad_to - have))
        raw_write(raw_path, buffers)

    formats["raw"] = Format("raw", "raw bytes (write+fsync / read into fresh memory)", raw_path,
                            write_raw, lambda: raw_read(raw_path), _unlinker(raw_path))

    pt_path = work / "batch.pt"

    def write_torch(batch: Any) -> None:
        with open(pt_path, "wb") as file:
            torch.save(_as_containers(batch), file)
            file.flush()
            os.fsync(file.fileno())

    formats["torch"] = Format("torch", "torch.save (AReaL/slime) / torch.load(weights_only=True)", pt_path,
                              write_torch, lambda: torch.load(pt_path, weights_only=True), _unlinker(pt_path),
                              "tensors dict + strings as lists + meta dict")

    roll_path = work / "roll.pkl"

    def write_roll(batch: Any) -> None:
        with open(roll_path, "wb") as file:
            pickle.dump(batch, file, protocol=pickle.HIGHEST_PROTOCOL)
            file.flush()
            os.fsync(file.fileno())

    def load_roll() -> Any:
        with open(roll_path, "rb") as file:
            return pickle.load(file)

    formats["roll"] = Format("roll", "ROLL pickle.dump(DataProto) / pickle.load", roll_path, write_roll,
                             load_roll, _unlinker(roll_path))

    verl_path = work / "verl.pkl"

    def write_verl(batch: Any) -> None:
        batch.save_to_disk(verl_path)
        fsync_path(verl_path)

    formats["verl"] = Format("verl", "verl DataProto.save_to_disk / load_from_disk", verl_path, write_verl,
                             lambda: DataProto.load_from_disk(verl_path), _unlinker(verl_path),
                             "+ fsync (save_to_disk has none)")

    st_path = work / "tensors.safetensors"

    def write_st(batch: Any) -> None:
        save_file(dict(batch.batch.items()), st_path)
        fsync_path(st_path)

    formats["safetensors"] = Format("safetensors", "safetensors save_file / load_file", st_path, write_st,
                                    lambda: _touch(load_file(st_path)), _unlinker(st_path),
                                    "tensors only: no strings, no meta_info",
                                    {"lazy": lambda: load_file(st_path)})

    rm_dir = work / "rm"
    store = DirectoryStore(rm_dir)
    unverified = DirectoryStore(rm_dir, verify=False)
    state = {"step": 0}

    def prepare_rm() -> None:
        if store.entry(STREAM, state["step"]) is not None:
            store.delete(STREAM, state["step"])

    def write_rm(batch: Any) -> None:
        state["step"] += 1
        store.save(STREAM, state["step"], batch, BatchInfo.of(batch))

    def lazy_rm(verify: bool, keys: list[str] | None, rows: range | None) -> Callable[[], Any]:
        def run() -> Any:
            from rollout_mock.storage.reader import open_view

            view = open_view(store, STREAM, state["step"], mapped=True, verify=verify)
            return view.load(keys=keys, rows=rows) if keys is not None or rows is not None else view.keys()
        return run

    formats["rm"] = Format("rm", "rollout_mock DirectoryStore.save / load (CRC-32 verified)", rm_dir, write_rm,
                           lambda: store.load(STREAM, state["step"]), prepare_rm,
                           "CRC-32, fsync, manifest, atomic rename; verified load",
                           {"unverified": lambda: unverified.load(STREAM, state["step"]), "state": state,
                            "lazy": {"rm_open": lazy_rm(True, None, None),
                                     "rm_key": lazy_rm(True, ["input_ids"], None),
                                     "rm_rows": lazy_rm(True, None, range(8)),
                                     "rm_key_unchecked": lazy_rm(False, ["input_ids"], None)}})
    if keys is not None:
        formats = {key: formats[key] for key in keys}
    return formats


# --------------------------------------------------------------------------- one table
def time_formats(batch: Any, formats: dict[str, Format], repeat: int, cold: bool,
                 extra_reads: dict[str, Callable[[], Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Write and load times of every format, round-robin, ``repeat`` times."""
    writes: dict[str, list[float]] = {key: [] for key in formats}
    loads: dict[str, list[float]] = {key: [] for key in formats}
    for key in extra_reads or {}:
        loads[key] = []
    for _ in range(repeat):
        for key, fmt in formats.items():
            fmt.prepare()
            os.sync()  # untimed: no dirty pages of earlier writes
            writes[key].append(clock(lambda: fmt.write(batch)))  # noqa: B023 - called at once
    for _ in range(repeat):
        for key, run in [*((k, f.load) for k, f in formats.items()), *(extra_reads or {}).items()]:
            if cold:
                drop_caches()
            loads[key].append(clock(run))
    out: dict[str, dict[str, Any]] = {}
    for key in loads:
        row: dict[str, Any] = {"load": summary(loads[key])}
        if key in formats:
            row["write"] = summary(writes[key])
            row["bytes"] = disk_bytes(formats[key].target)
        out[key] = row
    return out


def blocking_call(batch: Any, repeat: int, work: Path) -> dict[str, Any]:
    """The dump-mode call with the background writer: what it blocks, against one copy."""
    from rollout_mock.wrap import MockScheduler

    class Source:
        def get_batch(self, data: Any, global_step: int) -> Any:
            return batch

    samples: dict[str, list[float]] = {"clone": [], "capture": [], "call": []}
    config = {"enable": True, "mode": "dump", "dump_dir": str(work / "bg"), "background": True,
              "fingerprint": "off"}
    with MockScheduler(Source(), config) as mock:
        for step in range(repeat):
            samples["clone"].append(clock(lambda: clone_all(batch)))
            samples["capture"].append(clock(lambda: codec.capture(batch)))
            samples["call"].append(clock(lambda: mock.get_batch(None, step)))  # noqa: B023
            mock.flush()  # untimed: the writer finishes before the next call
    shutil.rmtree(work / "bg", ignore_errors=True)
    return {key: summary(values) for key, values in samples.items()}


def peer_table(size: str, repeat: int, cold: bool, work: Path, peak: bool) -> dict[str, Any]:
    print(f"[{time.perf_counter() - _T0:5.0f} s] == peers: building the {size} batch", flush=True)
    batch = make_dataproto(size)
    r: dict[str, Any] = {"size": size, "repeat": repeat, "tensor_bytes": tensor_bytes(batch),
                         "object_bytes": object_bytes(batch)}
    r["batch_bytes"] = r["tensor_bytes"] + r["object_bytes"]
    probe = DirectoryStore(work / "probe")
    probe.save(STREAM, 0, batch, BatchInfo.of(batch))
    rm_file = probe.path_of(STREAM, 0).stat().st_size
    shutil.rmtree(work / "probe")
    formats = make_formats(work, pad_to=rm_file)
    print(f"[{time.perf_counter() - _T0:5.0f} s] == peers: timing writes and loads", flush=True)
    r["formats"] = time_formats(batch, formats, repeat, cold, {
        "rm_unverified": formats["rm"].extra["unverified"], "safetensors_lazy": formats["safetensors"].extra["lazy"],
        **formats["rm"].extra["lazy"]})
    loaded = formats["rm"].load()
    assert all(torch.equal(loaded.batch[k], v) for k, v in batch.batch.items())
    assert list(loaded.non_tensor_batch["raw_prompt"]) == list(batch.non_tensor_batch["raw_prompt"])
    del loaded
    print(f"[{time.perf_counter() - _T0:5.0f} s] == peers: the dump-mode call", flush=True)
    r["blocking"] = blocking_call(batch, repeat, work)
    del batch
    if peak:
        print(f"[{time.perf_counter() - _T0:5.0f} s] == peers: peak memory (fresh process per measurement)", flush=True)
        for key, fmt in formats.items():
            for op in ("write", "load"):
                step = fmt.extra["state"]["step"] if key == "rm" else 0
                result = run_child(SCRIPT, ["peak", key, op, size, str(work), str(rm_file), str(step)])
                r["formats"][key][f"peak_{op}"] = None if result is None else result["extra_bytes"]
    for fmt in formats.values():
        fmt.prepare()
    return r


def child_peak(key: str, op: str, size: str, work: str, pad_to: str, step: str) -> dict[str, Any]:
    """In a fresh process: peak extra memory of one write or one load of one format."""
    import safetensors.torch  # noqa: F401  (imported before the baseline: not part of the peak)
    import tensordict  # noqa: F401
    import verl.protocol  # noqa: F401

    if op == "write":
        # a directory of its own: the parent still holds the writer lease of work/rm (a write
        # there failed with LockedError, and the write peak read "n/a")
        own = Path(work) / f"peak-{key}"
        own.mkdir(parents=True, exist_ok=True)
        fmt = make_formats(own, [key], pad_to=int(pad_to))[key]
        batch = make_dataproto(size)
        BatchInfo.of(batch)
        base = reset_peak()
        fmt.write(batch)
        extra = peak_since(base)
        del fmt
        shutil.rmtree(own, ignore_errors=True)
        return {"extra_bytes": extra}
    fmt = make_formats(Path(work), [key], pad_to=int(pad_to))[key]
    if key == "rm":
        fmt.extra["state"]["step"] = int(step)
    base = reset_peak()
    loaded = fmt.load()
    extra = peak_since(base)
    del loaded
    return {"extra_bytes": extra}


# --------------------------------------------------------------------------- scaling: size
def scaling_sizes(max_size: int) -> list[int]:
    sizes, size = [], 1 << 20
    while size <= max_size:
        sizes.append(size)
        size *= 4
    return sizes


def size_curve(max_size: int, cold: bool, work: Path) -> list[dict[str, Any]]:
    rows = []
    for target in scaling_sizes(max_size):
        need = int(3.5 * target) + (1 << 30)  # the batch, a load, torch.load's copy, and slack
        if available_bytes() < need:
            rows.append({"target": target, "skipped": f"needs ~{human(need)} of memory, "
                         f"{human(available_bytes())} available"})
            print(f"[{time.perf_counter() - _T0:5.0f} s] == sizes: {human(target)} skipped (memory)", flush=True)
            continue
        print(f"[{time.perf_counter() - _T0:5.0f} s] == sizes: {human(target)}", flush=True)
        batch = make_dataproto(samples_for(target))
        sub = work / f"size_{target}"
        sub.mkdir()
        formats = make_formats(sub, ["raw", "torch", "rm"])
        repeat = 11 if target <= 16 << 20 else 5 if target <= 256 << 20 else 3
        times = time_formats(batch, formats, repeat, cold, {"rm_key": formats["rm"].extra["lazy"]["rm_key"]})
        rows.append({"target": target, "batch_bytes": tensor_bytes(batch) + object_bytes(batch),
                     "repeat": repeat, "formats": times})
        del batch
        shutil.rmtree(sub)
    return rows


# --------------------------------------------------------------------------- scaling: steps
CHECKPOINTS = (1, 10, 100, 250, 500, 1000, 2000, 5000)


def steps_curve(steps: int, work: Path) -> dict[str, Any]:
    """Per-call time of step N, dumping (synchronous writer) then replaying tiny batches."""
    from rollout_mock.wrap import MockScheduler

    gen = torch.Generator().manual_seed(0)
    tiny = {"input_ids": torch.randint(0, 1000, (8, 64), generator=gen),
            "rewards": torch.rand(8, generator=gen), "uid": [f"u{i}" for i in range(8)]}

    class Source:
        def get_batch(self, data: Any, global_step: int) -> Any:
            return tiny

    class Spec:
        def get_batch(self, data: Any, global_step: int) -> Any:  # pragma: no cover - never called
            raise AssertionError

    dump_dir = work / "steps"
    base = {"enable": True, "dump_dir": str(dump_dir), "fingerprint": "off"}
    dump, replay = [], []
    print(f"[{time.perf_counter() - _T0:5.0f} s] == steps: dumping {steps} tiny steps", flush=True)
    with MockScheduler(Source(), {**base, "mode": "dump", "background": False}) as mock:
        for step in range(steps):
            dump.append(clock(lambda: mock.get_batch(None, step)))  # noqa: B023
    manifest_bytes = (dump_dir / "manifest.json").stat().st_size
    print(f"[{time.perf_counter() - _T0:5.0f} s] == steps: replaying {steps} tiny steps", flush=True)
    with MockScheduler(None, {**base, "mode": "mock", "prefetch": False}, spec=Spec) as mock:
        for step in range(steps):
            replay.append(clock(lambda: mock.get_batch(None, step)))  # noqa: B023
    shutil.rmtree(dump_dir)

    def around(values: list[float], n: int) -> float:
        lo, hi = max(0, n - 1 - 10), min(len(values), n - 1 + 10)  # step N is index N-1
        return statistics.median(values[lo:hi])

    points = [n for n in CHECKPOINTS if n <= steps]
    return {"steps": steps, "manifest_bytes": manifest_bytes,
            "points": [{"n": n, "dump": around(dump, n), "replay": around(replay, n)} for n in points]}


# --------------------------------------------------------------------------- report
ROW_ORDER = ["raw", "rm", "torch", "roll", "verl", "safetensors"]
LABELS = {
    "raw": "raw bytes (write+fsync / read)",
    "rm": "**rollout_mock** (save / verified load)",
    "torch": "AReaL/slime `torch.save` / `torch.load(weights_only=True)`",
    "roll": "ROLL `pickle.dump(DataProto)` / `pickle.load`",
    "verl": "verl `DataProto.save_to_disk` / `load_from_disk`",
    "safetensors": "safetensors `save_file` / `load_file` + touch every page (tensors only)",
}


def _mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:.0f} MB"


def report_peers(r: dict[str, Any]) -> str:
    f = r["formats"]
    raw_w, raw_l = f["raw"]["write"]["median"], f["raw"]["load"]["median"]
    lines = [
        f"#### Peers: {r['size']} batch, {human(r['batch_bytes'])} ({human(r['tensor_bytes'])} in 10 tensors, "
        f"{human(r['object_bytes'])} of strings), median of {r['repeat']}",
        "",
        "| format | write s | write GB/s | vs raw | load s | load GB/s | vs raw | on disk "
        "| peak extra mem write / load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key in ROW_ORDER:
        row = f[key]
        w, ld, nbytes = row["write"]["median"], row["load"]["median"], row["bytes"]
        peak = f"{_mb(row.get('peak_write'))} / {_mb(row.get('peak_load'))}"
        lines.append(f"| {LABELS[key]} | {w:.3f} | {r['batch_bytes'] / w / 1e9:.2f} | {raw_w / w:.2f}x | "
                     f"{ld:.3f} | {r['batch_bytes'] / ld / 1e9:.2f} | {raw_l / ld:.2f}x | {_mb(nbytes)} | {peak} |")
    unv = f["rm_unverified"]["load"]["median"]
    lines.append(f"| rollout_mock load without checksum (info) | | | | {unv:.3f} | "
                 f"{r['batch_bytes'] / unv / 1e9:.2f} | {raw_l / unv:.2f}x | | |")
    lazy = f["safetensors_lazy"]["load"]["median"]
    lines.append(f"| safetensors `load_file` alone (lazy mmap, info) | | | | {lazy:.3f} | | | | |")
    lazy_rows = [("rm_open", "rollout_mock `Dump.open(step)` + `keys()` (mapped, size+CRC checked from the table)"),
                 ("rm_key", "rollout_mock mapped `load(keys=['input_ids'])`, CRC-checked"),
                 ("rm_rows", "rollout_mock mapped `load(rows=range(8))`, every key, CRC-checked"),
                 ("rm_key_unchecked", "rollout_mock mapped `load(keys=['input_ids'])`, `verify=False` (unchecked)")]
    for key, label in lazy_rows:
        if key in f:
            lines.append(f"| {label} (lazy, info) | | | | {f[key]['load']['median']:.4f} | | | | |")
    b = r["blocking"]
    lines += [
        "",
        "GB/s are batch bytes per second (the same numerator for every format); \"vs raw\" is the raw "
        "time over the format's time (1.00x = as fast as the raw bytes).",
        "",
        "| dump-mode call (background writer) | median s | / one copy |",
        "|---|---:|---:|",
        f"| one in-memory copy (`clone` of every tensor) | {b['clone']['median']:.4f} | 1.00x |",
        f"| `codec.capture(batch)` | {b['capture']['median']:.4f} "
        f"| {b['capture']['median'] / b['clone']['median']:.2f}x |",
        f"| `MockScheduler.get_batch` blocking time | {b['call']['median']:.4f} | "
        f"{b['call']['median'] / b['clone']['median']:.2f}x |",
        "",
        "| issue 14 target | measured | target | met |",
        "|---|---:|---|---|",
    ]
    rm = f["rm"]
    checks = [
        ("write path (save) vs raw write+fsync", raw_w / rm["write"]["median"], ">= 0.9x", 0.9),
        ("verified load vs raw read", raw_l / rm["load"]["median"], ">= 0.9x", 0.9),
        ("verified load vs torch.load(weights_only=True)", f["torch"]["load"]["median"] / rm["load"]["median"],
         ">= 1.0x", 1.0),
        ("save vs torch.save (info)", f["torch"]["write"]["median"] / rm["write"]["median"], "", None),
        ("blocking call / one copy", b["call"]["median"] / b["clone"]["median"], "<= 1.0x", -1.0),
    ]
    for label, value, target, bound in checks:
        met = "" if bound is None else ("yes" if (value >= bound if bound > 0 else value <= -bound) else "NO")
        lines.append(f"| {label} | {value:.2f}x | {target} | {met} |")
    return "\n".join(lines)


def report_sizes(rows: list[dict[str, Any]], cold: bool) -> str:
    lines = [
        f"#### Scaling over batch size ({'cold' if cold else 'page-cache'} reads), medians",
        "",
        "| batch | raw write s | rm save s | save vs raw | torch.save s | raw read s | rm load s | "
        "load vs raw | torch.load s | load vs torch.load | rm mapped open + 1 key (checked) s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if "skipped" in row:
            lines.append(f"| {human(row['target'])} | skipped: {row['skipped']} |||||||||| ")
            continue
        f = row["formats"]
        rw, rs, ts = (f[k]["write"]["median"] for k in ("raw", "rm", "torch"))
        rr, rl, tl = (f[k]["load"]["median"] for k in ("raw", "rm", "torch"))
        lazy = f"{f['rm_key']['load']['median']:.4f}" if "rm_key" in f else ""
        lines.append(f"| {human(row['batch_bytes'])} | {rw:.4f} | {rs:.4f} | {rw / rs:.2f}x | {ts:.4f} | "
                     f"{rr:.4f} | {rl:.4f} | {rr / rl:.2f}x | {tl:.4f} | {tl / rl:.2f}x | {lazy} |")
    return "\n".join(lines)


def report_steps(s: dict[str, Any]) -> str:
    lines = [
        f"#### Scaling over steps recorded: {s['steps']} tiny steps (two 8-row tensors and 8 strings) "
        f"through MockScheduler; manifest at the end {human(s['manifest_bytes'])}",
        "",
        "| step N | dump call (synchronous writer) ms | replay call (no prefetch) ms |",
        "|---:|---:|---:|",
    ]
    for p in s["points"]:
        lines.append(f"| {p['n']} | {p['dump'] * 1e3:.2f} | {p['replay'] * 1e3:.2f} |")
    lines += ["", "Each value is the median of the 20 calls around step N."]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        print(json.dumps(child_peak(*argv[2:]) if argv[1] == "peak" else {}))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(SIZES), default="medium", help="the peer table's batch")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="drop the page cache before every load (root)")
    parser.add_argument("--max-size", default="1G", help="largest batch of the size curve (1M..4G)")
    parser.add_argument("--steps", type=int, default=500, help="steps of the steps-recorded curve")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: peers,peak,scaling,steps")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default benchmarks/results/tmp)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--update-readme", action="store_true", help="rewrite the bench_formats README section")
    args = parser.parse_args(argv)
    skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    work = work_dir(args.dir, "bench_formats_")
    cold = args.cold and drop_caches()
    if args.cold and not cold:
        print("could not drop the page cache (needs root): loads come from the page cache", file=sys.stderr)
    info = {"machine": machine(work), "cold": cold, "argv": argv}
    print(json.dumps(info), flush=True)
    started = time.perf_counter()
    out: dict[str, Any] = {**info}
    tables = []
    try:
        if "peers" not in skip:
            out["peers"] = peer_table(args.size, args.repeat, cold, work, "peak" not in skip)
            tables.append(report_peers(out["peers"]))
        if "scaling" not in skip:
            out["sizes"] = size_curve(parse_size(args.max_size), cold, work)
            tables.append(report_sizes(out["sizes"], cold))
        if "steps" not in skip:
            out["steps"] = steps_curve(args.steps, work)
            tables.append(report_steps(out["steps"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["seconds"] = time.perf_counter() - started
    text = "\n\n".join(tables)
    print("\n" + text)
    path = args.json or RESULTS / f"bench_formats-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**out, "table": text}, indent=1, default=str))
    print(f"\nwrote {path} ({out['seconds']:.0f} s)")
    if args.update_readme:
        command = " ".join(["python benchmarks/bench_formats.py", *argv])
        body = (f"`{command}`, run on {time.strftime('%Y-%m-%d')} in {out['seconds']:.0f} s, "
                f"{'cold (page cache dropped before every load)' if cold else 'page-cache'} loads.\n\n"
                f"Machine: {describe_machine(info['machine'])}\n\n{text}")
        update_readme(TAG, body)
        print("updated benchmarks/README.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

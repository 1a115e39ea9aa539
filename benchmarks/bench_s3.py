"""Object storage: a dump on S3 against the plain fsspec calls a user would write, same server, same run.

    python benchmarks/bench_s3.py [--size-mb 256] [--small-steps 40] [--update-readme]

The S3 server is moto's ``ThreadedMotoServer`` on 127.0.0.1 (in this process); every operation
runs in a fresh client process, which reports its wall time and its *extra* peak memory: the peak RSS during
the operation (sampled every 2 ms) minus the RSS just before it (the batch, or the bytes, already built).

* large step (``--size-mb`` of float32 tensors, 8 keys): ``Store.save`` (streamed: parts of 16 MiB
  as a multipart upload) and ``Store.load`` (ranged GETs of 16-64 MiB into the tensors) against
  of the same bytes (already in memory) and ``fs.cat_file``, and against ``torch.save`` /
  ``torch.load`` through ``fs.open`` (streamed by s3fs);
* small step (4 KiB): mean ``Store.save`` time per step against ``fs.pipe_file`` of the step's bytes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import update_readme  # noqa: E402

CHILD = textwrap.dedent(
    """
    import json, os, sys, time, torch, fsspec
    from rollout_mock.storage import BatchInfo, FsspecStore
    from rollout_mock.storage.manifest import StreamId
    op, url, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    size_mb, n_small = int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(1)
    stream = StreamId("train")
    fs, root = fsspec.core.url_to_fs(url, **options)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    import threading
    peak = [0]
    def sample():  # the peak RSS during the operation (ru_maxrss would include the imports' peak)
        while True:
            peak[0] = max(peak[0], rss())
            time.sleep(0.002)
    threading.Thread(target=sample, daemon=True).start()

    def batch(mb):
        per = mb * (1 << 20) // 8 // 4
        out = {}
        for i in range(8):
            t = torch.empty(per, dtype=torch.float32)
            t.fill_(float(i))
            out[f"k{i}"] = t
        return out

    result = {}
    if op in ("save", "torch_save"):
        b = batch(size_mb)
        before = rss(); peak[0] = 0; t = time.perf_counter()
        if op == "save":
            store = FsspecStore(url, storage_options=options)
            store.open_writer(stream)  # the lease and stream record: once per run, not per step
            before = rss(); peak[0] = 0; t = time.perf_counter()
            store.save(stream, 0, b, BatchInfo.of(b))
            seconds = time.perf_counter() - t
            store.close()
        else:
            with fs.open(f"{root}/torch/step.pt", "wb") as f:
                torch.save(b, f)
    elif op == "pipe":
        data = bytes(bytearray(os.urandom(1 << 20)) * size_mb)
        before = rss(); peak[0] = 0; t = time.perf_counter()
        fs.pipe_file(f"{root}/raw/step.bin", data)
    elif op == "load":
        store = FsspecStore(url, storage_options=options)
        before = rss(); peak[0] = 0; t = time.perf_counter()
        loaded = store.load(stream, 0)
        assert float(loaded["k3"][0]) == 3.0
    elif op == "torch_load":
        before = rss(); peak[0] = 0; t = time.perf_counter()
        with fs.open(f"{root}/torch/step.pt", "rb") as f:
            loaded = torch.load(f, weights_only=True)
    elif op == "cat":
        before = rss(); peak[0] = 0; t = time.perf_counter()
        data = fs.cat_file(f"{root}/raw/step.bin")
    elif op == "small":
        store, stream = FsspecStore(url, storage_options=options), StreamId("small")
        b = {"x": torch.arange(1024, dtype=torch.int32)}
        store.save(stream, 1000, b, BatchInfo.of(b))  # claim the stream first (lease, stream record)
        blob = bytes(fs.cat_file(f"{root}/small/step_001000.pkl"))
        times_save, times_put = [], []
        for i in range(n_small):
            t0 = time.perf_counter(); store.save(stream, 1001 + i, b, BatchInfo.of(b))
            times_save.append(time.perf_counter() - t0)
            t0 = time.perf_counter(); fs.pipe_file(f"{root}/raw/small_{i}.bin", blob)
            times_put.append(time.perf_counter() - t0)
        store.close()
        times_save.sort(); times_put.sort()
        median = lambda xs: 1e3 * xs[len(xs) // 2]
        print(json.dumps({"save_ms": median(times_save), "put_ms": median(times_put), "bytes": len(blob)}))
        sys.exit(0)
    if op != "save":
        seconds = time.perf_counter() - t
    time.sleep(0.01)
    print(json.dumps({"s": seconds, "extra_mb": max(0, peak[0] - before) / 1e6}))
    """
)


def run(op: str, url: str, options: dict[str, Any], size_mb: int, n_small: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", CHILD, op, url, json.dumps(options), str(size_mb), str(n_small)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{op}: {proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def measure(size_mb: int, n_small: int) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import boto3
    from moto.server import ThreadedMotoServer
    from storage_conformance import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
                   "client_kwargs": {"region_name": "us-east-1"}, "skip_instance_cache": True}
        url = f"s3://{bucket}/dump"
        out = {op: run(op, url, options, size_mb, n_small)
               for op in ("pipe", "save", "torch_save", "cat", "load", "torch_load")}
        out["small"] = run("small", url, options, size_mb, n_small)
        out["size_mb"] = size_mb
        return out
    finally:
        server.stop()


def table(r: dict[str, Any]) -> str:
    size = r["size_mb"]

    def row(name: str, key: str, base: str) -> str:
        return (f"| {name} | {r[key]['s']:.2f} s | {r[key]['s'] / r[base]['s']:.2f}x | "
                f"{r[key]['extra_mb']:.0f} MB | {r[key]['extra_mb'] / size:.2f}x the step |")

    small = r["small"]
    return "\n".join([
        f"Large step: {size} MB of float32 tensors (8 keys). Extra memory: peak RSS during the call (sampled "
        f"every 2 ms) minus RSS before it; a load's extra memory includes the batch it returns.",
        "",
        "| operation | time | vs plain fsspec | extra memory | |",
        "|---|---:|---:|---:|---|",
        row("`fs.pipe_file` of the bytes (baseline)", "pipe", "pipe"),
        row("rollout_mock `Store.save` (streamed parts)", "save", "pipe"),
        row("`torch.save` into `fs.open(..., 'wb')`", "torch_save", "pipe"),
        row("`fs.cat_file` (baseline)", "cat", "cat"),
        row("rollout_mock `Store.load` (ranged GETs into the tensors, verified)", "load", "cat"),
        row("`torch.load` from `fs.open(..., 'rb')`", "torch_load", "cat"),
        "",
        f"Small step ({small['bytes']:,} bytes on S3), median of the saves: rollout_mock "
        f"`Store.save` {small['save_ms']:.1f} ms, `fs.pipe_file` of the same bytes {small['put_ms']:.1f} ms "
        f"({small['save_ms'] / small['put_ms']:.2f}x: the data object, then the conditional put of its entry file, "
        f"which is the step's commit point).",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--small-steps", type=int, default=40)
    parser.add_argument("--update-readme", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.size_mb, args.small_steps)
    text = table(result)
    print(text)
    print(json.dumps(result))
    if args.update_readme:
        update_readme("bench_s3", "## Object storage (bench_s3.py)\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Partial replay: one data-parallel rank's rows (1/8 of the batch) against a full load.

    python benchmarks/bench_partial.py [--mb 128] [--repeat 5] [--update-readme]

One format-2 step (``input_ids``/``attention_mask``/``position_ids`` int64 of shape [rows, L],
``rewards``) is recorded into a local DirectoryStore and an fsspec ``memory://`` store; then each
is loaded whole (``Dump.load``: verified against the checksum) and as rank 0 of 8 (``Dump.load(...,
rows=rank_rows(n, 0, 8))``: the header plus the chunks holding those rows, each chunk's CRC
checked). Median of ``--repeat`` runs, page cache warm. Bytes read are counted for the fsspec
store (what an object store would transfer).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from rollout_mock.storage import BatchInfo, DirectoryStore, FsspecBackend, FsspecStore, open_dump, rank_rows
from rollout_mock.storage.manifest import StreamId

STREAM = StreamId("train")
README = Path(__file__).with_name("README.md")
START, END = "<!-- bench_partial:start -->", "<!-- bench_partial:end -->"


def make_batch(mb: int) -> dict[str, Any]:
    rows, length = 1024, max(1, (mb << 20) // (1024 * 8 * 3))
    ids = torch.randint(0, 150_000, (rows, length))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": ids.clone(),
            "rewards": torch.randn(rows)}


def timed(call: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--update-readme", action="store_true")
    args = parser.parse_args()
    batch = make_batch(args.mb)
    n = int(batch["input_ids"].shape[0])
    rows = rank_rows(n, 0, 8)
    scratch = Path(tempfile.mkdtemp(prefix="bench_partial-"))
    url = f"memory://bench-partial-{uuid.uuid4().hex}"
    lines = ["| store | step size | full load | rank 0 of 8 (1/8 rows) | speed-up | bytes read (1/8) |",
             "|---|---:|---:|---:|---:|---:|"]
    try:
        for label, store, where in (("local directory", DirectoryStore(scratch), str(scratch)),
                                    ("fsspec memory://", FsspecStore(url), url)):
            store.save(STREAM, 0, batch, BatchInfo.of(batch))
            store.close()
            dump = open_dump(where)
            size = dump.entry(STREAM, 0).size
            full = timed(lambda dump=dump: dump.load(0, "train"), args.repeat)
            part = timed(lambda dump=dump: dump.load(0, "train", rows=rows), args.repeat)
            got = dump.load(0, "train", rows=rows)
            assert torch.equal(got["input_ids"], batch["input_ids"][rows.start:rows.stop])
            read = "-"
            if isinstance(dump.store.backend, FsspecBackend):
                source = dump.store.open_source("train/step_000000.pkl")
                dump.store.open_source = lambda rel, s=source: s  # type: ignore[method-assign]
                dump.load(0, "train", rows=rows)
                read = f"{source.bytes_read / 1e6:.1f} MB of {size / 1e6:.1f} MB"
            lines.append(f"| {label} | {size / 1e6:.0f} MB | {full * 1e3:.0f} ms | {part * 1e3:.0f} ms | "
                         f"{full / part:.1f}x | {read} |")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines += ["", f"Median of {args.repeat}; torch {torch.__version__}; warm page cache."]
    text = "\n".join(lines)
    print(text)
    if args.update_readme:
        body = README.read_text() if README.exists() else "# Benchmarks\n"
        section = f"{START}\n## Partial replay (bench_partial.py)\n\n{text}\n{END}"
        if START in body:
            body = body[: body.index(START)] + section + body[body.index(END) + len(END):]
        else:
            body = body.rstrip() + "\n\n" + section + "\n"
        README.write_text(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Helpers shared by bench_formats.py and bench_e2e.py: timing, raw I/O, peak memory, the machine,
and rewriting one marked section of benchmarks/README.md."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"


# --------------------------------------------------------------------------- timing
def drop_caches() -> bool:
    """Write back dirty pages and drop the page cache (root only); False when not permitted."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as file:
            file.write("1\n")
        return True
    except OSError:
        return False


def clock(run: Callable[[], Any]) -> float:
    """Wall time of one call of ``run`` (its result is dropped after the clock stops)."""
    gc.collect()
    start = time.perf_counter()
    result = run()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def on_worker(run: Callable[[], Any]) -> float:
    """Seconds of one ``run()`` on another thread (as on the recorder's writer thread)."""
    result: list[float] = []
    thread = threading.Thread(target=lambda: result.append(clock(run)))
    thread.start()
    thread.join()
    return result[0]


def summary(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "best": min(samples), "n": len(samples)}


def parse_size(text: str) -> int:
    """``"4G"`` -> 4 GiB, ``"512M"`` -> 512 MiB, ``"1000"`` -> 1000 bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def human(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}" if nbytes < 10 * scale else f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def available_bytes() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable"):
            return int(line.split()[1]) * 1024
    return 0


# --------------------------------------------------------------------------- raw I/O
def write_all(fd: int, data: Any) -> None:
    view = memoryview(data).cast("B")
    done = 0
    while done < view.nbytes:
        done += os.write(fd, view[done:])


def raw_write(path: Path, buffers: list[Any]) -> None:
    """The physical limit of a write: the bytes, straight from memory, then fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for buffer in buffers:
            write_all(fd, buffer)
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path: Path) -> np.ndarray:
    """The physical limit of a load: the file's bytes into fresh memory (numpy advises huge pages)."""
    nbytes = path.stat().st_size
    out = np.empty(nbytes, dtype=np.uint8)
    view = memoryview(out)
    with open(path, "rb", buffering=0) as file:
        done = 0
        while done < nbytes:
            count = file.readinto(view[done:])
            if not count:
                break
            done += count
    return out


def fsync_path(path: Path) -> None:
    """fsync a file some library wrote and closed (its own write path has no fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def disk_bytes(path: Path) -> int:
    """Bytes of a file, or of every file under a directory."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


# --------------------------------------------------------------------------- peak memory
def rss_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> int:
    """Reset VmHWM to the current RSS (``clear_refs`` 5) and return the current RSS in bytes."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as file:
        file.write("5")
    return rss_kb("VmRSS") * 1024


def peak_since(base: int) -> int:
    return rss_kb("VmHWM") * 1024 - base


def run_child(script: Path, args: list[str], timeout: float = 900,
              env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Run ``script --child ARGS`` in a fresh interpreter (environment ``env``, default this one's);
    its last stdout line is JSON."""
    import json

    result = subprocess.run([sys.executable, str(script), "--child", *args],
                            capture_output=True, text=True, timeout=timeout, env=env)
    if result.returncode != 0:
        print(f"child {args} failed:\n{result.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- the machine
def _cpu_model() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _mount_of(path: Path) -> dict[str, str]:
    path = path.resolve()
    best: dict[str, str] = {}
    for line in open("/proc/mounts"):
        device, point, fstype, options = line.split()[:4]
        if (str(path) == point or str(path).startswith(point.rstrip("/") + "/")) and len(point) >= len(
            best.get("point", "")
        ):
            best = {"device": device, "point": point, "fstype": fstype, "options": options}
    return best


def machine(work: Path) -> dict[str, Any]:
    import torch

    import rollout_mock.crc as _crc

    try:
        import isal

        isal_version = isal.__version__
    except ImportError:
        isal_version = None
    mem = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        thp = "unknown"
    mount = _mount_of(work)
    return {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "mem_gib": round(mem / 2**20, 1),
        "filesystem": f"{mount.get('fstype', '?')} on {mount.get('device', '?')} ({mount.get('options', '')})",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "isal": isal_version,
        "crc32": _crc.IMPLEMENTATION,
        "thp": thp,
        "loadavg_at_start": os.getloadavg()[0],
        "torch_threads": torch.get_num_threads(),
    }


def describe_machine(m: dict[str, Any]) -> str:
    isal = f"isal {m['isal']} present (CRC-32: {m['crc32']})" if m["isal"] else "isal absent (CRC-32: zlib)"
    return (
        f"{m['cpu']}, {m['cpus']} CPUs, {m['mem_gib']} GiB RAM, {m['filesystem']}, Linux {m['kernel']}, "
        f"transparent huge pages `{m['thp']}`, Python {m['python']}, torch {m['torch']} "
        f"({m['torch_threads']} threads), numpy {m['numpy']}, {isal}; 1-minute load average at the "
        f"start {m['loadavg_at_start']:.2f} (a shared machine: other jobs were running)."
    )


# --------------------------------------------------------------------------- README section
def update_readme(tag: str, body: str, path: Path | None = None) -> None:
    """Replace what lies between ``<!-- tag:start -->`` and ``<!-- tag:end -->`` in README.md
    (or in ``path``, another Markdown file with such a section)."""
    target = README if path is None else path
    start_marker, end_marker = f"<!-- {tag}:start -->", f"<!-- {tag}:end -->"
    text = target.read_text()
    start, end = text.find(start_marker), text.find(end_marker)
    if start < 0 or end < start:
        raise SystemExit(f"{target}: no {start_marker} ... {end_marker} section to update")
    target.write_text(text[: start + len(start_marker)] + "\n\n" + body.strip() + "\n\n" + text[end:])


def work_dir(parent: Path | None, prefix: str) -> Path:
    import tempfile

    base = parent or RESULTS / "tmp"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))

"""The benchmark scripts' helpers, and a quick smoke run of each script's cheapest parts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402


def test_parse_size_and_scaling_sizes() -> None:
    bench_formats = pytest.importorskip("bench_formats")
    assert _common.parse_size("4G") == 4 << 30
    assert _common.parse_size("512MiB") == 512 << 20
    assert _common.parse_size("1000") == 1000
    assert bench_formats.scaling_sizes(1 << 30) == [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
    assert bench_formats.scaling_sizes(4 << 30)[-1] == 4 << 30


def test_update_readme_replaces_only_its_own_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("head\n<!-- a:start -->\nold a\n<!-- a:end -->\nmid\n<!-- b:start -->\nold b\n<!-- b:end -->\n")
    monkeypatch.setattr(_common, "README", readme)
    _common.update_readme("a", "new a")
    assert readme.read_text() == (
        "head\n<!-- a:start -->\n\nnew a\n\n<!-- a:end -->\nmid\n<!-- b:start -->\nold b\n<!-- b:end -->\n"
    )
    with pytest.raises(SystemExit, match="no <!-- c:start -->"):
        _common.update_readme("c", "x")


def test_raw_write_and_read_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "raw.bin"
    _common.raw_write(path, [b"abc", memoryview(b"defg"), bytes(5)])
    assert bytes(_common.raw_read(path)) == b"abcdefg" + bytes(5)


def test_bench_formats_steps_part_runs(tmp_path: Path) -> None:
    bench_formats = pytest.importorskip("bench_formats")
    out = tmp_path / "out.json"
    assert bench_formats.main(["--skip", "peers,scaling", "--steps", "12", "--dir", str(tmp_path),
                               "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [p["n"] for p in result["steps"]["points"]] == [1, 10]
    assert all(p["dump"] > 0 and p["replay"] > 0 for p in result["steps"]["points"])
    assert "| 10 |" in result["table"]
    assert not any(tmp_path.glob("bench_formats_*"))  # scratch removed


def test_bench_e2e_runs_every_mode(tmp_path: Path) -> None:
    bench_e2e = pytest.importorskip("bench_e2e")
    out = tmp_path / "out.json"
    assert bench_e2e.main(["--steps", "2", "--batch-size", "16", "--payload-mb", "0,1", "--dir", str(tmp_path),
                           "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["payload"] for r in result["results"]] == [0, 1_000_000]
    padded = result["results"][1]["modes"]
    assert set(padded) == {"live", "dump", "dump_sync", "mock", "mock_no_prefetch"}
    assert padded["mock"]["batch_bytes"] == padded["live"]["batch_bytes"] >= 1_000_000


def test_bench_capture_runs(tmp_path: Path) -> None:
    bench_capture = pytest.importorskip("bench_capture")
    out = tmp_path / "out.json"
    assert bench_capture.main(["--shapes", "tensors", "--repeat", "1", "--trajectories", "8", "--work", str(tmp_path),
                               "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    times = result["writer"][0]["times"]
    assert set(times) == {"blocking", "writer", "direct"} and all(t["median"] > 0 for t in times.values())
    assert result["replayed"]["torch_save"] == "works"
    sizes = result["replayed"]["pickle_bytes"]
    assert sizes["replayed"] < 1.1 * sizes["live"] + 4096

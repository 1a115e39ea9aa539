"""The benchmark scripts' helpers, and a quick smoke run of each script's cheapest parts."""

from __future__ import annotations

import json
import os
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


# --------------------------------------------------------------------------- bench_gpu.py (issue 29)
def _gpu_run(digest: str, losses: list[str], agreed: bool | None = True, **extra: object) -> dict[str, object]:
    check = {"ran": agreed is not None, "agreed": agreed, "skipped": None if agreed is not None else "no CUDA device",
             "devices": [] if agreed is None else [{"device": "cuda:0", "agreed": agreed, "error": None,
                                                    "differing": [] if agreed else ["index_add_"]}]}
    return {"step_s": 0.01, "digest": digest, "losses": losses, "check": check, **extra}


def test_bench_gpu_cpu_mode_runs_and_reports_nothing_to_check(tmp_path: Path) -> None:
    bench_gpu = pytest.importorskip("bench_gpu")
    out = tmp_path / "out.json"
    assert bench_gpu.main(["--device", "cpu", "--tiny", "--repeat", "1", "--steps", "2", "--warmup", "0",
                           "--configs", "none,roll+tf32_off", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert set(rows) == {"none", "roll+tf32_off"}
    assert all(rows[name]["step_s"] > 0 and "error" not in rows[name] for name in rows)
    (roll,) = result["runs"]["roll+tf32_off"]
    assert roll["too_late"] == []  # the variables were exported before the child started
    if not roll["check"]["ran"]:  # a CPU-only machine: the check says so instead of pretending
        assert "no CUDA device is visible" in roll["check"]["skipped"]
    assert "| `roll+tf32_off` | profile `roll`, `tf32: off` |" in result["table"]


def test_bench_gpu_transfers_without_cuda_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench_gpu = pytest.importorskip("bench_gpu")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks a machine without CUDA (tests/gpu runs the measurement)")
    out = tmp_path / "out.json"
    assert bench_gpu.main(["--transfers", "--device", "cuda", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "no CUDA device" in printed and bench_gpu.render_transfers(None) in printed
    assert json.loads(out.read_text()) == {"transfers": None, "skipped": "no CUDA device"}


def test_bench_gpu_transfer_table_ratios_and_its_placeholders() -> None:
    bench_gpu = pytest.importorskip("bench_gpu")
    result = {"bytes": 1_000_000_000, "floor_ms": 20.0, "cpu_ms": 760.0, "dump_call_ms": 2.0,
              "dump_landed_ms": 30.0, "read_ms": 150.0, "h2d_ms": 50.0, "mock_ms": 230.0,
              "mock_prefetched_ms": 1.0, "mock_bitwise_equal": True, "repeat": 3}
    table = bench_gpu.render_transfers(result)
    assert "| dump: `.cpu()` (fresh pageable memory: what the peers do) | 760.0 | 38.00× |" in table
    assert "| dump: the dump-mode call + `synchronize()` (the copies landed) | 30.0 | 1.50× |" in table
    assert "| mock: read + copy (the reference) | 200.0 | 1.00× |" in table
    assert "prefetch off (synchronized) | 230.0 | 1.15× |" in table
    assert "on the device: yes" in table
    empty = bench_gpu.render_transfers(None)
    assert bench_gpu.NOT_MEASURED in empty
    for page in (BENCH / "README.md", bench_gpu.PERFORMANCE_DOCS):  # what --update-readme replaces
        text = page.read_text()
        assert empty in text[text.index("<!-- bench_gpu_transfers:start -->"):]


def test_bench_gpu_children_start_from_a_clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    bench_gpu = pytest.importorskip("bench_gpu")
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.setenv("ROLLOUT_MOCK_TF32", "off")
    env = bench_gpu.child_env(bench_gpu.CONFIGS["none"])
    assert "NCCL_ALGO" not in env and "ROLLOUT_MOCK_TF32" not in env and env["PATH"] == os.environ["PATH"]
    strict = bench_gpu.child_env(bench_gpu.CONFIGS["strict+tf32_off"])
    assert strict["NCCL_PROTO"] == "Simple" and strict["NVIDIA_TF32_OVERRIDE"] == "0"


def test_bench_gpu_has_a_row_per_switch_env_var_and_profile() -> None:
    bench_gpu = pytest.importorskip("bench_gpu")
    from rollout_mock.determinism import PROFILES, TF32

    names = set(bench_gpu.CONFIGS)
    variables = {s.name for p in PROFILES.values() for s in p.settings} | {s.name for s in TF32.OFF.settings}
    assert variables <= names
    assert {"none", "deterministic_algorithms", "cudnn", "tf32_off"} <= names
    assert {f"{p}{suffix}" for p in PROFILES for suffix in ("", "+tf32_off")} <= names
    assert all("no-op on one GPU" in bench_gpu.CONFIGS[n].note for n in names if n.startswith("NCCL_"))


def test_bench_gpu_summary_and_failures() -> None:
    bench_gpu = pytest.importorskip("bench_gpu")
    same = bench_gpu.summarise("roll", [_gpu_run("a", ["1", "2"]), _gpu_run("a", ["1", "2"])])
    assert same["bitwise_equal"] is True and same["first_differing_step"] is None
    differ = bench_gpu.summarise("roll", [_gpu_run("a", ["1", "2"]), _gpu_run("b", ["1", "3"], agreed=False)])
    assert differ["bitwise_equal"] is False and differ["first_differing_step"] == 1
    assert differ["check_consistent"] is False
    raised = bench_gpu.summarise("deterministic_algorithms", [{"check": _gpu_run("", [])["check"],
                                                               "error": "RuntimeError: Deterministic behavior"}])
    assert "step_s" not in raised and raised["error"].startswith("RuntimeError")
    crashed = bench_gpu.summarise("strict", [None])
    rows = {"roll": differ, "deterministic_algorithms": raised, "strict": crashed,
            "none": bench_gpu.summarise("none", [_gpu_run("x", ["1"]), _gpu_run("y", ["2"], agreed=False)])}
    problems = bench_gpu.failures(rows)
    assert [p.split(":")[0] for p in problems] == ["roll", "roll", "strict"]  # only profile rows count
    assert "(loss from step 1)" in problems[1]
    table = bench_gpu.render(rows, steps=2, runs=2)
    assert "| `roll` |" in table and "**no** (loss from step 1)" in table and "**disagreed** (index_add_)" in table
    assert "raises: RuntimeError: Deterministic behavior" in table


def test_bench_gpu_tables_in_the_docs_list_every_configuration() -> None:
    """The committed tables (README and docs/determinism.md) come from this script's configurations."""
    bench_gpu = pytest.importorskip("bench_gpu")
    for path in (_common.README, bench_gpu.DOCS):
        text = path.read_text()
        section = text[text.index("<!-- bench_gpu:start -->"):text.index("<!-- bench_gpu:end -->")]
        listed = [line.split("|")[1].strip().strip("`") for line in section.splitlines() if line.startswith("| `")]
        assert listed == list(bench_gpu.CONFIGS), path
        if bench_gpu.NOT_MEASURED in section:  # the placeholder, until someone runs it on a GPU
            assert section.count(bench_gpu.NOT_MEASURED) == len(bench_gpu.CONFIGS)


def test_bench_gpu_refuses_to_write_cpu_figures_into_the_gpu_tables() -> None:
    bench_gpu = pytest.importorskip("bench_gpu")
    with pytest.raises(SystemExit) as info:
        bench_gpu.main(["--device", "cpu", "--update-readme"])
    assert info.value.code == 2


def test_bench_digest_small_shapes_run(tmp_path: Path) -> None:
    pytest.importorskip("verl", reason="verl is not installed")
    bench_digest = pytest.importorskip("bench_digest")
    out = tmp_path / "out.json"
    assert bench_digest.main(["--small", "--repeat", "1", "--dir", str(tmp_path), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["shape"] for r in result["results"]] == ["verl", "slime", "areal", "flat"]
    assert all(r["dump digest"] > 0 and r["mock digest + compare"] > 0 for r in result["results"])
    assert "| verl |" in result["table"]
    assert not any(tmp_path.glob("bench_digest_*"))  # scratch removed


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


def test_bench_bundle_runs(tmp_path: Path) -> None:
    bench_bundle = pytest.importorskip("bench_bundle")
    out = tmp_path / "out.json"
    assert bench_bundle.main(["--skip-demo", "--mb", "1", "--steps", "2", "--pack", "1", "--repeat", "1",
                              "--dir", str(tmp_path), "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["steps"] == [1] and result["bundle_bytes"] > result["files_bytes"] > 1 << 20
    assert set(result["load_s"]) == {"bundle in place", "unpacked directory", "original dump"}
    assert all(result[k] > 0 for k in ("pack_s", "unpack_s", "tar_c_s", "tar_x_s"))
    assert not any(tmp_path.glob("bench_bundle_*"))  # scratch removed


def test_bench_keep_small_batches_run(tmp_path: Path) -> None:
    bench_keep = pytest.importorskip("bench_keep")
    out = tmp_path / "out.json"
    assert bench_keep.main(["--size", "4M", "--repeat", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["batch"] for r in result["results"]] == ["verl rollout (int64 + float32 + bf16)", "float32 only",
                                                       "bfloat16 only"]
    assert all(r["scan"] > 0 and r["memcpy"] > 0 for r in result["results"])
    assert "| float32 only |" in result["table"]


def test_bench_health_small_batch_runs(tmp_path: Path) -> None:
    bench_health = pytest.importorskip("bench_health")
    out = tmp_path / "health.json"
    assert bench_health.main(["--size", "4M", "--repeat", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["result"]
    assert result["health"] > 0 and 100 < result["bytes per step"] < 1000


def test_bench_shapes_reports_the_six_python_object_targets_as_best_over_best() -> None:
    bench_shapes = pytest.importorskip("bench_shapes")

    def part(mine: float, peer: float, names: tuple[str, str]) -> dict[str, dict[str, float]]:
        return {names[0]: {"best": mine, "median": 9.0, "n": 5}, names[1]: {"best": peer, "median": 1.0, "n": 5}}

    results = [{"shape": shape, "blocking": part(0.5, 1.0, ("call", "pickle_dumps")),
                "times": {**part(2.0, 1.0, ("rm.write", "pickle.write")), **part(1.0, 1.0, ("rm.load", "pickle.load"))}}
               for shape in ("slime", "verl", "areal")]
    rows = bench_shapes.targets(results)
    assert [(r["shape"], r["value"], r["met"]) for r in rows] == [
        ("slime", 0.5, True), ("slime", 2.0, False), ("slime", 1.0, True),
        ("verl", 0.5, True), ("verl", 2.0, False), ("verl", 1.0, True)]
    table = bench_shapes.report_targets(rows)
    assert "| slime | write / pickle.dump + fsync | 2.00x (n=5) | <= 1.00x | no |" in table

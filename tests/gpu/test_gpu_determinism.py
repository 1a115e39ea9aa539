"""On a real GPU: apply() makes atomics-based kernels bit-reproducible across processes, its
self-check agrees, and benchmarks/bench_gpu.py runs.

Each replay runs in a fresh interpreter, because apply() must run before CUDA starts (cuBLAS reads
CUBLAS_WORKSPACE_CONFIG once). The workload uses kernels that accumulate with atomics by
default (``index_add_``, ``scatter_add_``, the backward of ``embedding`` with repeated indices) in
float32 on tensors large enough for the order of additions to change low bits, plus a cuBLAS
matmul.

Only the deterministic case is asserted: default kernels *usually* differ between runs, but that is
not guaranteed, so the default runs (and the self-check without switches) are only reported
(``pytest -s`` shows it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HANG_S

from rollout_mock.determinism import FINGERPRINT_ENV_VARS, PROFILE_VAR, SEED_VAR, TF32_VAR

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
HIDDEN = {*FINGERPRINT_ENV_VARS, SEED_VAR, PROFILE_VAR, TF32_VAR}

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

WORKLOAD = textwrap.dedent(
    """
    import hashlib, json, sys
    mode = sys.argv[1]
    report = None
    if mode.startswith("deterministic"):
        from rollout_mock.determinism import apply
        report = apply(seed=0, tf32="off" if mode.endswith("tf32_off") else "keep").to_dict()
    import torch

    torch.manual_seed(0)
    dev = torch.device("cuda")
    rows, dim, n = 1024, 256, 400_000
    emb = torch.nn.Embedding(rows, dim).to(dev)
    proj = torch.nn.Linear(dim, dim).to(dev)
    idx = torch.randint(0, rows, (n,), device=dev)      # ~400 repeats per row
    weight = torch.randn(n, dim, device=dev)

    def digest(t: torch.Tensor) -> str:
        return hashlib.sha256(t.detach().float().cpu().numpy().tobytes()).hexdigest()

    x = emb(idx)                                          # backward: atomics over repeated rows
    y = proj(x * weight)                                  # cuBLAS
    pooled = torch.zeros(rows, dim, device=dev).index_add_(0, idx, y)
    flat = torch.zeros(rows, device=dev).scatter_add_(0, idx, y.sum(dim=1))
    loss = pooled.pow(2).mean() + flat.pow(2).mean()
    loss.backward()
    print(json.dumps({
        "report": report,
        "loss": loss.item().hex(),
        "index_add": digest(pooled),
        "scatter_add": digest(flat),
        "grad_embedding": digest(emb.weight.grad),
        "grad_linear": digest(proj.weight.grad),
    }))
    """
)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in HIDDEN}


def _python(code: str) -> Any:
    """Run ``code`` in a fresh interpreter without determinism variables; its last line is JSON."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(), timeout=HANG_S
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run(script: Path, mode: str) -> dict[str, Any]:
    env = _clean_env()
    done = subprocess.run(
        [sys.executable, str(script), mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_S,
        check=False,
    )
    assert done.returncode == 0, f"{mode} run failed:\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gpu_determinism") / "workload.py"
    path.write_text(WORKLOAD, encoding="utf-8")
    return path


@pytest.mark.parametrize("mode", ["deterministic", "deterministic_tf32_off"])
def test_two_replays_with_apply_are_bit_identical(script: Path, mode: str) -> None:
    """With TF32 kept too: TF32 is deterministic run to run; turning it off changes precision only."""
    first, second = _run(script, mode), _run(script, mode)
    assert first["report"]["too_late"] == []
    assert first["report"]["torch_flags"]["deterministic_algorithms"] is True
    assert first["report"]["tf32"] == ("off" if mode.endswith("tf32_off") else "keep")
    first.pop("report"), second.pop("report")
    assert first == second


def test_default_kernels_reported(script: Path) -> None:
    first, second = _run(script, "default"), _run(script, "default")
    differing = sorted(k for k in first if k != "report" and first[k] != second[k])
    print(f"\nwithout apply(), fields that differ between two runs: {differing or 'none'}")
    assert first["report"] is None  # the control really ran without apply()


def test_apply_after_cuda_init_reports_cublas_too_late(tmp_path: Path) -> None:
    code = (
        "import json, torch\n"
        "torch.zeros(1, device='cuda')\n"
        "from rollout_mock.determinism import apply\n"
        "print(json.dumps([late.variable for late in apply().too_late]))\n"
    )
    assert _python(code) == ["CUBLAS_WORKSPACE_CONFIG"]


# ---------------------------------------------------------------------------- the self-check


def test_apply_check_agrees_on_every_visible_gpu() -> None:
    code = (
        "import json\n"
        "from rollout_mock.determinism import apply\n"
        "print(json.dumps(apply(seed=0, check=True, strict=True).to_dict()['check']))\n"
    )
    check = _python(code)
    assert check["ran"] and check["agreed"] is True, check
    assert check["deterministic_algorithms"] is True
    assert [d["device"] for d in check["devices"]] == [
        f"cuda:{i}" for i in range(torch.cuda.device_count())
    ]
    assert all(d["differing"] == [] and d["error"] is None for d in check["devices"])


def test_self_check_without_switches_is_reported() -> None:
    code = (
        "import json\n"
        "from rollout_mock.determinism import self_check\n"
        "print(json.dumps(self_check([0]).to_dict()))\n"
    )
    check = _python(code)
    assert check["ran"] and check["deterministic_algorithms"] is False
    assert [d["device"] for d in check["devices"]] == ["cuda:0"]
    print(f"\nwithout the switches, the self-check on cuda:0: {check['devices'][0]}")


def test_self_check_catches_deterministic_algorithms_without_the_cublas_workspace() -> None:
    """A switch that did not take: torch refuses cuBLAS, and the check says so for that GPU."""
    code = (
        "import json, torch\n"
        "torch.use_deterministic_algorithms(True)\n"  # CUBLAS_WORKSPACE_CONFIG unset
        "from rollout_mock.determinism import self_check\n"
        "print(json.dumps(self_check([0]).to_dict()))\n"
    )
    check = _python(code)
    (device,) = check["devices"]
    assert check["agreed"] is False and device["agreed"] is False
    assert device["error"] is not None and "CUBLAS_WORKSPACE_CONFIG" in device["error"], device


# ---------------------------------------------------------------------------- the benchmark


def test_bench_gpu_runs_on_cuda_and_the_roll_profile_repeats(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH))
    import bench_gpu

    out = tmp_path / "bench_gpu.json"
    args = ["--device", "cuda", "--tiny", "--repeat", "2", "--steps", "3", "--configs", "none,roll"]
    assert bench_gpu.main([*args, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows["roll"]["bitwise_equal"] is True and rows["roll"]["check"]["agreed"] is True
    assert rows["none"]["step_s"] > 0
    print(f"\nbench_gpu --tiny on {torch.cuda.get_device_name(0)}: none {rows['none']}")

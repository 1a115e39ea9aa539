"""On a real GPU: apply() makes atomics-based kernels bit-reproducible across processes.

Each replay runs in a fresh interpreter, because apply() must run before CUDA starts (cuBLAS reads
CUBLAS_WORKSPACE_CONFIG once). The workload uses kernels that accumulate with atomics by
default (``index_add_``, ``scatter_add_``, the backward of ``embedding`` with repeated indices) in
float32 on tensors large enough for the order of additions to change low bits, plus a cuBLAS
matmul.

Only the deterministic case is asserted: default kernels *usually* differ between runs, but that is
not guaranteed, so the default runs are only reported (``pytest -s`` shows it).
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

from rollout_mock.determinism import FINGERPRINT_ENV_VARS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

WORKLOAD = textwrap.dedent(
    """
    import hashlib, json, sys
    mode = sys.argv[1]
    report = None
    if mode == "deterministic":
        from rollout_mock.determinism import apply
        report = apply(seed=0).to_dict()
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


def _run(script: Path, mode: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in FINGERPRINT_ENV_VARS}
    done = subprocess.run(
        [sys.executable, str(script), mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"{mode} run failed:\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gpu_determinism") / "workload.py"
    path.write_text(WORKLOAD, encoding="utf-8")
    return path


def test_two_replays_with_apply_are_bit_identical(script: Path) -> None:
    first, second = _run(script, "deterministic"), _run(script, "deterministic")
    assert first["report"]["too_late"] == []
    assert first["report"]["torch_flags"]["deterministic_algorithms"] is True
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
    env = {k: v for k, v in os.environ.items() if k not in FINGERPRINT_ENV_VARS}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["CUBLAS_WORKSPACE_CONFIG"]

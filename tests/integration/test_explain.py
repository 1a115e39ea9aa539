"""``rollout-mock explain DUMP --step N -- CMD`` end to end: a plain PyTorch loop with three faults
planted in its rollouts, and a real TRL GRPOTrainer (wrap_trl) on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_S

REPO = Path(__file__).resolve().parents[2]
PLAIN = Path(__file__).with_name("explain_run.py")
TRL = Path(__file__).with_name("trl_run.py")
FAULTS = {"log0": 2, "fp16": 4, "zerovar": 6}


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def _explain(tmp: Path, dump: Path, step: int, *cmd: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp / f"explain-{step}.json"
    proc = subprocess.run([sys.executable, "-m", "rollout_mock", "explain", str(dump), "--step", str(step),
                           "--out", str(out), "--", *cmd], capture_output=True, text=True, timeout=HANG_S,
                          env=_env(), cwd=tmp, check=False)
    return proc, json.loads(out.read_text()) if out.exists() else {}


@pytest.fixture(scope="module")
def plain_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("plain")
    faults = [arg for name, step in FAULTS.items() for arg in (f"--{name}", str(step))]
    subprocess.run([sys.executable, str(PLAIN), "dump", str(tmp / "dump"), *faults], check=True,
                   capture_output=True, timeout=HANG_S, env=_env(), cwd=tmp)
    return tmp / "dump"


@pytest.mark.parametrize(("fault", "op", "module"), [
    ("log0", "aten.log", None), ("fp16", "aten.addmm", "Policy.head16"), ("zerovar", "aten.div", None),
])
def test_plain_loop_each_planted_fault_is_named(plain_dump: Path, tmp_path: Path, fault: str, op: str,
                                                module: str | None) -> None:
    step = FAULTS[fault]
    proc, report = _explain(tmp_path, plain_dump, step, sys.executable, str(PLAIN), "mock", "{dump}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    first = report["first"]
    assert (report["step"], first["kind"], first["op"], first["module"]) == (step, "nonfinite", op, module)
    assert f"op: {op}" in proc.stdout and "explain_run.py" in first["where"]
    assert f"step {step + 1} " not in proc.stdout  # CMD stopped once step N was done


def test_plain_loop_clean_step_and_a_step_never_reached(plain_dump: Path, tmp_path: Path) -> None:
    proc, report = _explain(tmp_path, plain_dump, 0, sys.executable, str(PLAIN), "mock", "{dump}")
    assert proc.returncode == 0 and report["verdict"] == "clean", proc.stderr[-3000:]
    proc, report = _explain(tmp_path, plain_dump, 99, sys.executable, str(PLAIN), "mock", "{dump}")
    assert proc.returncode == 3 and report == {}
    assert "never called step 99 of train" in proc.stderr


def test_html_report_shows_the_explain_report(plain_dump: Path, tmp_path: Path) -> None:
    _, report = _explain(tmp_path, plain_dump, 6, sys.executable, str(PLAIN), "mock", "{dump}")
    assert report["first"]["op"] == "aten.div"
    subprocess.run([sys.executable, "-m", "rollout_mock", "report", str(plain_dump), "-o", str(tmp_path / "r.html"),
                    "--explain", str(tmp_path / "explain-6.json")], check=True, env=_env(), capture_output=True)
    page = (tmp_path / "r.html").read_text()
    assert "Trigger-step forensics" in page and "aten.div" in page


def test_wrap_trl_overflow_in_attention_is_named(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    subprocess.run([sys.executable, str(TRL), str(tmp_path / "dump.json"), "dump", str(tmp_path / "dump"),
                    "--max-steps", "2"], check=True, capture_output=True, timeout=HANG_S, env=_env(), cwd=tmp_path)
    proc, report = _explain(tmp_path, tmp_path / "dump", 0, sys.executable, str(TRL), str(tmp_path / "mock.json"),
                            "mock", "{dump}", "--max-steps", "2", "--plant-overflow")
    assert proc.returncode == 1, proc.stderr[-3000:]
    first = report["first"]
    assert first["kind"] == "nonfinite" and first["phase"] == "forward"
    assert first["module"] == "LlamaForCausalLM.model.layers.0.self_attn" and first["op"] in ("aten.bmm", "aten.mm")
    assert not (tmp_path / "mock.json").exists()  # trl_run stopped after step 0, before writing its history

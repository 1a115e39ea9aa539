"""The package type-checks and lints clean under the project's own configuration (pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[lint]')")
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_ruff_is_clean() -> None:
    if shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists():
        pytest.importorskip("ruff", reason="ruff is not installed (pip install -e '.[lint]')")
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]

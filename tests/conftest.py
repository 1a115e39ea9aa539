"""Shared test helpers: small scheduler fakes in the shapes of ROLL, verl and AReaL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# Keep torch's CPU results independent of the number of cores the CI machine has.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def dump_dir(tmp_path: Path) -> Path:
    return tmp_path / "dumps"


def cfg(dump_dir: Path, mode: str = "dump", **extra: Any) -> dict[str, Any]:
    """A ``rollout_mock:`` block for tests."""
    return {"enable": True, "mode": mode, "dump_dir": str(dump_dir), **extra}

"""`rollout-mock diff A COPY` is never IDENTICAL when COPY lost, truncated or changed a step file."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from rollout_mock import MockScheduler, diff_dumps
from rollout_mock.cli import main


class Returns:
    def get_batch(self, data: Any, global_step: int) -> Any:
        return {"x": torch.arange(1000, dtype=torch.float32) + global_step,
                "meta_info": {"get_batch_return_start_time": float(global_step)}}


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    a = tmp_path / "a"
    with MockScheduler(Returns(), {"enable": True, "mode": "dump", "dump_dir": str(a)}) as s:
        for step in range(3):
            s.get_batch(None, step)
    b = tmp_path / "copy"
    shutil.copytree(a, b)
    return a, b


def damage(path: Path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:-10])
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["deleted", "truncated", "flipped"])
@pytest.mark.parametrize("quick", [False, True])
def test_damaged_copy_is_never_identical(pair: tuple[Path, Path], how: str, quick: bool,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    a, b = pair
    assert main(["diff", str(a), str(b)]) == 0 and "IDENTICAL" in capsys.readouterr().out
    damage(b / "train" / "step_000001.pkl", how)
    code = main(["diff", str(a), str(b)] + (["--quick"] if quick else []))
    out, err = capsys.readouterr()
    assert code == 2 and "IDENTICAL" not in out and "UNREADABLE" in out and "step 1" in err
    report = diff_dumps(a, b, quick=quick)
    assert not report.ok
    statuses = {s.step: s.status for st in report.streams for s in st.steps}
    assert statuses == {0: "identical", 1: "unreadable", 2: "identical"}


def test_damage_on_side_a_too(pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = pair
    damage(a / "train" / "step_000000.pkl", "flipped")
    assert main(["diff", str(a), str(b)]) == 2
    assert "A: " in capsys.readouterr().out


def test_timing_only_meta_differences_can_be_ignored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class Timed:
        def __init__(self, offset: float) -> None:
            self.offset = offset

        def get_batch(self, data: Any, global_step: int) -> Any:
            return {"x": torch.ones(3), "meta_info": {"get_batch_return_start_time": self.offset, "seed": 1}}

    for name, offset in (("a", 1.0), ("b", 2.0)):
        with MockScheduler(Timed(offset), {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / name)}) as s:
            s.get_batch(None, 0)
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    assert "meta_info.get_batch_return_start_time" in capsys.readouterr().out
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--ignore-timing"]) == 0
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--ignore-meta", "get_batch_return_start_time"]) == 0

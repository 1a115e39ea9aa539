"""The ls and import subcommands, through the real console entry point."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import HANG_S, cfg

from rollout_mock import MockScheduler
from rollout_mock.cli import main


class Returns:
    def get_batch(self, data: object, global_step: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.full((3, 4), global_step)}


def test_ls_lists_without_unpickling(dump_dir: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with MockScheduler(Returns(), cfg(dump_dir)) as mock:
        for step in (0, 1, 2, 4):
            mock.get_batch(None, step)
    monkeypatch.setattr(pickle, "load", lambda *a, **k: (_ for _ in ()).throw(AssertionError("unpickled")))
    monkeypatch.setattr(pickle, "Unpickler", None)
    assert main(["ls", str(dump_dir), "--keys"]) == 0
    out = capsys.readouterr().out
    assert "train: steps 0-2, 4 (4 files" in out
    assert "get_batch (sync)" in out
    assert "input_ids: int64 [3, 4]" in out


def test_ls_on_a_missing_dump_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rollout_mock", "ls", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=HANG_S,
    )
    assert result.returncode == 2
    assert "dump directory not found" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.verl
def test_import_roll_dump(tmp_path: Path) -> None:
    from verl.protocol import DataProto

    roll_dir = tmp_path / "roll"
    (roll_dir / "train").mkdir(parents=True)
    protos = []
    for step in range(2):  # exactly how ROLL's mixin writes
        proto = DataProto.from_dict(
            tensors={"responses": torch.randint(0, 9, (4, 5))},
            non_tensors={"uid": np.array(list("abcd"), dtype=object)},
            meta_info={"global_step": step},
        )
        protos.append(proto)
        with open(roll_dir / "train" / f"step_{step:06d}.pkl", "wb") as file:
            pickle.dump(proto, file, protocol=pickle.HIGHEST_PROTOCOL)
    assert main(["import", str(roll_dir), str(tmp_path / "ours")]) == 2  # --trust is required
    assert main(["import", str(roll_dir), str(tmp_path / "ours"), "--trust"]) == 0
    with MockScheduler(None, cfg(tmp_path / "ours", "mock"), spec=Returns) as mock:
        for step in range(2):
            replayed = mock.get_batch(None, step)  # safe loader: our format needs no trust
            assert torch.equal(replayed.batch["responses"], protos[step].batch["responses"])
            assert replayed.meta_info == {"global_step": step}


def test_console_script_runs_demo(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("rollout-mock")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "rollout_mock"]
    result = subprocess.run(
        command + ["demo", "--steps", "3", "--workdir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=HANG_S, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BIT-IDENTICAL" in result.stdout and "scheduler built 0x" in result.stdout
    assert (tmp_path / "demo" / "dump" / "manifest.json").is_file()

"""Dump mode records the environment fingerprint; mock mode compares it with its own."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from conftest import cfg

from rollout_mock import FingerprintMismatchError, MockScheduler
from rollout_mock.determinism import fingerprint


class Scheduler:
    def get_batch(self, data: object, global_step: int) -> dict[str, torch.Tensor]:
        return {"x": torch.ones(2)}


@pytest.fixture
def recorded(dump_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    with MockScheduler(Scheduler(), cfg(dump_dir)) as mock:
        mock.get_batch(None, 0)
    return dump_dir


def _edit_fingerprint(dump_dir: Path, **changes: object) -> None:
    path = dump_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["fingerprint"].update(changes)
    path.write_text(json.dumps(manifest))


def test_manifest_holds_the_dump_environment(recorded: Path) -> None:
    stored = json.loads((recorded / "manifest.json").read_text())["fingerprint"]
    assert stored["env"]["NCCL_ALGO"] == "Ring"
    assert stored["torch"] == torch.__version__
    assert stored["torch_flags"] == fingerprint()["torch_flags"]


def test_same_environment_is_silent(recorded: Path, monkeypatch: pytest.MonkeyPatch,
                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    with MockScheduler(None, cfg(recorded, "mock", fingerprint="error"), spec=Scheduler) as mock:
        mock.get_batch(None, 0)
    assert "environment differs" not in caplog.text


def test_changed_variable_warns_with_a_table(recorded: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    MockScheduler(None, cfg(recorded, "mock"), spec=Scheduler).close()
    text = caplog.text
    assert "environment differs from the one that recorded" in text
    assert "env.NCCL_ALGO" in text and "Ring" in text and "Tree" in text


def test_strict_policy_fails_before_the_run(recorded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    with pytest.raises(FingerprintMismatchError) as info:
        MockScheduler(None, cfg(recorded, "mock", fingerprint="error"), spec=Scheduler)
    assert "env.NCCL_ALGO" in str(info.value) and "fingerprint: warn" in str(info.value)
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    _edit_fingerprint(recorded, torch="0.0.1")
    with pytest.raises(FingerprintMismatchError, match="torch"):
        MockScheduler(None, cfg(recorded, "mock", fingerprint="error"), spec=Scheduler)


def test_informational_difference_only_warns_even_when_strict(
    recorded: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    _edit_fingerprint(recorded, platform="Linux-5.4-other-kernel")
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    with MockScheduler(None, cfg(recorded, "mock", fingerprint="error"), spec=Scheduler) as mock:
        mock.get_batch(None, 0)
    assert "platform" in caplog.text


def test_off_policy_skips_the_check(recorded: Path, monkeypatch: pytest.MonkeyPatch,
                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    MockScheduler(None, cfg(recorded, "mock", fingerprint="off"), spec=Scheduler).close()
    assert "environment differs" not in caplog.text

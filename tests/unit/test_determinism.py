"""Unit tests of rollout_mock.determinism and the ``env`` command (CPU only, no Ray)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rollout_mock.determinism as det
import rollout_mock.determinism.check as det_check
import rollout_mock.determinism.process as det_apply
from rollout_mock import ConfigError, DumpNotFoundError, ManifestError, RolloutMockError
from rollout_mock.cli import env as env_cmd
from rollout_mock.storage.manifest import Manifest

ROLL_ENV = {
    "NCCL_ALGO": "Ring",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "DETERMINISTIC_MODE": "1",
}
ALL_VARS = (*det.FINGERPRINT_ENV_VARS, det.SEED_VAR, det.PROFILE_VAR, det.TF32_VAR)


def _torch_state() -> dict[str, Any]:
    return {
        "det": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_det": torch.backends.cudnn.deterministic,
        "bench": torch.backends.cudnn.benchmark,
        "mm_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "precision": torch.get_float32_matmul_precision(),
    }


@pytest.fixture(autouse=True)
def clean_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Unset every determinism variable; restore os.environ, torch switches and RNG states."""
    saved_env = dict(os.environ)  # apply() sets variables monkeypatch does not know about
    for name in ALL_VARS:
        monkeypatch.delenv(name, raising=False)
    saved = _torch_state()
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    yield
    torch.use_deterministic_algorithms(saved["det"], warn_only=saved["warn_only"])
    torch.backends.cudnn.deterministic = saved["cudnn_det"]
    torch.backends.cudnn.benchmark = saved["bench"]
    torch.backends.cuda.matmul.allow_tf32 = saved["mm_tf32"]
    torch.backends.cudnn.allow_tf32 = saved["cudnn_tf32"]
    torch.set_float32_matmul_precision(saved["precision"])
    random.setstate(rng[0])
    np.random.set_state(rng[1])
    torch.set_rng_state(rng[2])
    os.environ.clear()
    os.environ.update(saved_env)


@pytest.fixture
def cuda_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)


# ---------------------------------------------------------------------------- profiles


def test_roll_profile_is_exactly_rolls_system_envs() -> None:
    assert det.PROFILES["roll"].env == ROLL_ENV


def test_strict_profile_extends_roll() -> None:
    strict = det.PROFILES["strict"].env
    assert strict.items() >= ROLL_ENV.items()
    assert strict["NCCL_PROTO"] == "Simple"
    assert strict["NCCL_NVLS_ENABLE"] == "0"
    assert strict["NCCL_COLLNET_ENABLE"] == "0"
    assert strict["FLASH_ATTENTION_DETERMINISTIC"] == "1"


def test_no_profile_touches_tf32() -> None:
    """TF32 changes precision, not determinism: it is the tf32 choice, never a profile's."""
    for profile in det.PROFILES.values():
        assert "NVIDIA_TF32_OVERRIDE" not in profile.env, profile.name
    assert [s.name for s in det.TF32.OFF.settings] == ["NVIDIA_TF32_OVERRIDE"]
    assert det.TF32.KEEP.settings == ()
    assert "NVIDIA_TF32_OVERRIDE" in det.FINGERPRINT_ENV_VARS  # still recorded


@pytest.mark.parametrize(
    ("value", "expected"),
    [("keep", det.TF32.KEEP), ("off", det.TF32.OFF), (" OFF ", det.TF32.OFF), (det.TF32.OFF, det.TF32.OFF)],
)
def test_tf32_choice_parses(value: Any, expected: det.TF32) -> None:
    assert det.TF32.parse(value) is expected


@pytest.mark.parametrize("value", ["on", "", False, None, 0])
def test_tf32_choice_rejects_other_values(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        det.TF32.parse(value)
    assert str(info.value) == f"tf32 must be one of keep, off; got {value!r}"


def test_every_setting_has_a_reason_and_a_string_value() -> None:
    for profile in det.PROFILES.values():
        for setting in profile.settings:
            assert isinstance(setting.value, str) and setting.reason.strip(), setting


def test_profiles_are_read_only() -> None:
    with pytest.raises(TypeError):
        det.PROFILES["mine"] = det.PROFILES["roll"]  # type: ignore[index]


def test_unknown_profile_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        det.get_profile("Roll")
    assert str(info.value) == "unknown determinism profile 'Roll'; valid profiles: roll, strict"


# ---------------------------------------------------------------------------- apply


def test_apply_sets_env_and_torch_flags() -> None:
    torch.backends.cudnn.benchmark = True
    report = det.apply()
    assert {k: os.environ[k] for k in ROLL_ENV} == ROLL_ENV
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic is True
    assert torch.backends.cudnn.benchmark is False
    assert report.profile == "roll" and report.seed is None
    assert report.changed == dict.fromkeys(ROLL_ENV)
    assert report.torch_flags["deterministic_algorithms"] is True
    assert report.fully_applied and report.too_late == ()
    assert report.tf32 == "keep" and report.check is None
    assert report.to_dict()["tf32"] == "keep" and report.to_dict()["check"] is None
    json.dumps(report.to_dict())


def test_apply_keeps_tf32_by_default() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    report = det.apply()
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert torch.backends.cudnn.allow_tf32 is True
    assert torch.get_float32_matmul_precision() == "high"
    assert "NVIDIA_TF32_OVERRIDE" not in os.environ and "NVIDIA_TF32_OVERRIDE" not in report.env


def test_apply_tf32_off_turns_every_tf32_switch_off() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    report = det.apply(tf32="off")
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is False
    assert torch.get_float32_matmul_precision() == "highest"
    assert os.environ["NVIDIA_TF32_OVERRIDE"] == "0"
    assert report.env == ROLL_ENV | {"NVIDIA_TF32_OVERRIDE": "0"}
    assert report.tf32 == "off" and report.torch_flags["cudnn_allow_tf32"] is False


def test_apply_bad_tf32_changes_nothing() -> None:
    with pytest.raises(ConfigError, match="tf32 must be one of keep, off; got 'of'"):
        det.apply(tf32="of")
    assert "NCCL_ALGO" not in os.environ
    assert not torch.are_deterministic_algorithms_enabled()


def test_apply_records_previous_values_it_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.setenv("DETERMINISTIC_MODE", "1")
    report = det.apply()
    assert report.changed["NCCL_ALGO"] == "Tree"
    assert "DETERMINISTIC_MODE" not in report.changed


def test_apply_strict_profile_sets_extra_vars() -> None:
    det.apply(profile="strict")
    assert os.environ["NCCL_PROTO"] == "Simple"
    assert os.environ["FLASH_ATTENTION_DETERMINISTIC"] == "1"


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_apply_same_seed_gives_same_random_numbers() -> None:
    det.apply(seed=1234)
    first = _draws()
    det.apply(seed=1234)
    assert _draws() == first
    det.apply(seed=1235)
    assert _draws() != first


def test_apply_without_seed_leaves_generators_alone() -> None:
    random.seed(7)
    expected = random.random()
    random.seed(7)
    det.apply(seed=None)
    assert random.random() == expected


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True, "3"])
def test_apply_rejects_bad_seed_before_changing_anything(seed: Any) -> None:
    with pytest.raises(ConfigError, match="seed must be an integer"):
        det.apply(seed=seed)
    assert "NCCL_ALGO" not in os.environ
    assert not torch.are_deterministic_algorithms_enabled()


def test_unknown_profile_changes_nothing() -> None:
    with pytest.raises(ConfigError):
        det.apply(profile="nope")
    assert "DETERMINISTIC_MODE" not in os.environ


# ---------------------------------------------------------------------------- too late


def test_cublas_too_late_after_cuda_init(
    cuda_started: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="rollout_mock"):
        report = det.apply()
    assert [late.variable for late in report.too_late] == ["CUBLAS_WORKSPACE_CONFIG"]
    late = report.too_late[0]
    assert (late.wanted, late.previous) == (":4096:8", None)
    assert "CUDA is already initialised" in late.reason
    assert not report.fully_applied
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # still set for child processes
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and r.name == "rollout_mock"
    ]
    assert len(warnings) == 1 and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in warnings[0].getMessage()


def test_cublas_already_set_is_not_too_late(
    cuda_started: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert det.apply().too_late == ()


def test_tf32_override_too_late_after_cuda_init(cuda_started: None) -> None:
    report = det.apply(tf32="off")
    assert [late.variable for late in report.too_late] == [
        "CUBLAS_WORKSPACE_CONFIG",
        "NVIDIA_TF32_OVERRIDE",
    ]
    assert torch.backends.cudnn.allow_tf32 is False  # torch's own switches still took


def test_strict_raises_and_changes_nothing(cuda_started: None) -> None:
    with pytest.raises(det.DeterminismError) as info:
        det.apply(strict=True)
    assert isinstance(info.value, RolloutMockError)
    assert [late.variable for late in info.value.too_late] == ["CUBLAS_WORKSPACE_CONFIG"]
    assert "CUBLAS_WORKSPACE_CONFIG" in str(info.value)
    assert "NCCL_ALGO" not in os.environ
    assert not torch.are_deterministic_algorithms_enabled()


def test_nccl_vars_too_late_with_nccl_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(det_apply, "_nccl_process_group_exists", lambda: True)
    report = det.apply(profile="strict")
    late = {entry.variable for entry in report.too_late}
    assert {"NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE"} <= late
    assert "CUBLAS_WORKSPACE_CONFIG" not in late


def test_pythonhashseed_is_too_late_unless_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    report = det.apply(profile="strict")
    assert [late.variable for late in report.too_late] == ["PYTHONHASHSEED"]
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert det.apply(profile="strict").too_late == ()


def test_nccl_process_group_check_is_false_without_distributed() -> None:
    assert det_apply._nccl_process_group_exists() is False


# ---------------------------------------------------------------------------- self-check


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_self_check_without_gpu_says_there_is_nothing_to_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="rollout_mock"):
        report = det.apply(check=True, strict=True)
    result = report.check
    assert result is not None and not result.ran and result.agreed is None
    assert result.devices == () and result.deterministic_algorithms is True
    assert result.skipped is not None and "no CUDA device is visible" in result.skipped
    assert report.to_dict()["check"]["agreed"] is None
    messages = [r.getMessage() for r in caplog.records if r.name == "rollout_mock"]
    assert any("determinism self-check: nothing to check: no CUDA device" in m for m in messages)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_workload_runs_and_agrees_on_the_cpu() -> None:
    """The real kernels, on the CPU (serial adds): every output is compared, all agree."""
    differing, error = det_check._run_twice(torch.device("cpu"))
    assert (differing, error) == ((), None)
    outputs = det_check._outputs(*det_check._inputs(torch.device("cpu")))
    assert set(outputs) == {"index_add_", "scatter_add_", "matmul"}
    assert outputs["index_add_"].shape == (512, 64) and outputs["index_add_"].abs().sum() > 0


def test_the_check_leaves_the_users_random_streams_alone() -> None:
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    det_check._run_twice(torch.device("cpu"))
    assert torch.equal(torch.rand(2), expected)


class FakeGpus:
    """Two fake CUDA devices whose kernels run on the CPU; chosen runs give other bits."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.perturb: set[int] = set()  # 1-based calls of _outputs whose index_add_ is changed
        self.error: RuntimeError | None = None
        real_inputs, real_outputs = det_check._inputs, det_check._outputs

        def outputs(*inputs: torch.Tensor) -> dict[str, torch.Tensor]:
            self.calls += 1
            if self.error is not None:
                raise self.error
            result = real_outputs(*inputs)
            if self.calls in self.perturb:
                first = result["index_add_"][0, 0]  # one ulp away: the difference atomics give
                result["index_add_"][0, 0] = torch.nextafter(first, first + 1)
            return result

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: f"Fake GPU {index}")
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(det_check, "_inputs", lambda device: real_inputs(torch.device("cpu")))
        monkeypatch.setattr(det_check, "_outputs", outputs)


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> FakeGpus:
    return FakeGpus(monkeypatch)


def test_self_check_runs_twice_on_every_visible_gpu(fake_gpus: FakeGpus) -> None:
    result = det.self_check()
    assert fake_gpus.calls == 4
    assert [(d.device, d.name, d.agreed) for d in result.devices] == [
        ("cuda:0", "Fake GPU 0", True),
        ("cuda:1", "Fake GPU 1", True),
    ]
    assert result.ran and result.agreed is True and result.skipped is None
    assert result.deterministic_algorithms is False  # the switch as it was: off here
    assert "cuda:0 (Fake GPU 0) agreed; cuda:1 (Fake GPU 1) agreed" in result.summary()
    json.dumps(result.to_dict())


def test_self_check_names_the_gpu_and_output_that_disagreed(fake_gpus: FakeGpus) -> None:
    fake_gpus.perturb = {4}  # device 1's second run
    result = det.self_check()
    assert [d.agreed for d in result.devices] == [True, False]
    assert result.devices[1].differing == ("index_add_",) and result.agreed is False
    assert "cuda:1 (Fake GPU 1) DISAGREED on index_add_" in result.summary()
    assert result.to_dict()["devices"][1]["differing"] == ["index_add_"]


def test_self_check_reports_a_refused_kernel_as_a_failure(fake_gpus: FakeGpus) -> None:
    fake_gpus.error = RuntimeError(
        "Deterministic behavior was enabled but this operation is not deterministic because it "
        "uses CuBLAS and you have set CUBLAS_WORKSPACE_CONFIG wrongly\nsee the docs"
    )
    result = det.self_check(devices=[1])
    (only,) = result.devices
    assert only.device == "cuda:1" and only.agreed is False and only.differing == ()
    assert only.error is not None and only.error.startswith("RuntimeError: Deterministic behavior")
    assert "see the docs" not in only.error  # first line only
    assert "cuda:1 (Fake GPU 1) could not run it: RuntimeError" in result.summary()


@pytest.mark.parametrize("devices", [[2], [-1], [True], [0, "1"]])
def test_self_check_rejects_devices_that_are_not_visible(fake_gpus: FakeGpus, devices: Any) -> None:
    with pytest.raises(ConfigError, match="are not visible CUDA devices; this process sees 2"):
        det.self_check(devices=devices)
    assert fake_gpus.calls == 0


def test_self_check_of_no_device(fake_gpus: FakeGpus) -> None:
    result = det.self_check(devices=[])
    assert not result.ran and result.skipped == "no device was asked for (devices=[])"


def test_apply_check_logs_agreement_at_info(
    fake_gpus: FakeGpus, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="rollout_mock"):
        report = det.apply(check=True)
    assert report.check is not None and report.check.agreed is True
    assert report.check.deterministic_algorithms is True  # checked after the switches
    records = [r for r in caplog.records if "self-check" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.INFO]


def test_apply_check_warns_when_a_gpu_disagrees(
    fake_gpus: FakeGpus, caplog: pytest.LogCaptureFixture
) -> None:
    fake_gpus.perturb = {2}
    with caplog.at_level(logging.INFO, logger="rollout_mock"):
        report = det.apply(check=True)
    assert report.check is not None and report.check.agreed is False
    (record,) = [r for r in caplog.records if "self-check" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "cuda:0 (Fake GPU 0) DISAGREED on index_add_" in record.getMessage()
    assert "A switch did not take" in record.getMessage()


def test_apply_check_strict_raises_with_the_result(fake_gpus: FakeGpus) -> None:
    fake_gpus.perturb = {4}
    with pytest.raises(det.DeterminismError) as info:
        det.apply(check=True, strict=True)
    assert info.value.check is not None and info.value.check.agreed is False
    assert info.value.too_late == ()
    assert "cuda:1 (Fake GPU 1) DISAGREED" in str(info.value)
    assert torch.are_deterministic_algorithms_enabled()  # the settings stay applied


def test_apply_without_check_runs_nothing(fake_gpus: FakeGpus) -> None:
    assert det.apply().check is None
    assert fake_gpus.calls == 0


# ---------------------------------------------------------------------------- apply_from_env


def test_apply_from_env_does_nothing_without_deterministic_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert det.apply_from_env() is None
    monkeypatch.setenv("DETERMINISTIC_MODE", "0")
    assert det.apply_from_env() is None
    assert not torch.are_deterministic_algorithms_enabled()


def test_apply_from_env_applies_profile_and_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETERMINISTIC_MODE", "1")
    monkeypatch.setenv(det.SEED_VAR, "99")
    monkeypatch.setenv(det.PROFILE_VAR, "strict")
    report = det.apply_from_env()
    assert report is not None and (report.profile, report.seed) == ("strict", 99)
    assert torch.are_deterministic_algorithms_enabled()
    first = _draws()
    det.seed_everything(99)
    assert _draws() == first


def test_apply_from_env_defaults_to_roll_without_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETERMINISTIC_MODE", "1")
    monkeypatch.setenv(det.TF32_VAR, "")
    torch.backends.cudnn.allow_tf32 = True
    report = det.apply_from_env()
    assert report is not None and (report.profile, report.seed, report.tf32) == ("roll", None, "keep")
    assert torch.backends.cudnn.allow_tf32 is True


def test_apply_from_env_tf32_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETERMINISTIC_MODE", "1")
    monkeypatch.setenv(det.TF32_VAR, "off")
    report = det.apply_from_env()
    assert report is not None and report.tf32 == "off"
    assert torch.backends.cudnn.allow_tf32 is False and os.environ["NVIDIA_TF32_OVERRIDE"] == "0"


def test_apply_from_env_rejects_malformed_tf32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETERMINISTIC_MODE", "1")
    monkeypatch.setenv(det.TF32_VAR, "maybe")
    with pytest.raises(ConfigError, match="ROLLOUT_MOCK_TF32 must be one of keep, off; got 'maybe'"):
        det.apply_from_env()
    assert not torch.are_deterministic_algorithms_enabled()


def test_apply_from_env_rejects_malformed_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETERMINISTIC_MODE", "1")
    monkeypatch.setenv(det.SEED_VAR, "seven")
    with pytest.raises(ConfigError, match="ROLLOUT_MOCK_SEED must be an integer, got 'seven'"):
        det.apply_from_env()


# ---------------------------------------------------------------------------- ray_runtime_env


def test_ray_runtime_env_from_nothing() -> None:
    env = det.ray_runtime_env(seed=5)
    assert env["worker_process_setup_hook"] == "rollout_mock.determinism.apply_from_env"
    assert env["env_vars"] == ROLL_ENV | {
        det.PROFILE_VAR: "roll",
        det.SEED_VAR: "5",
        det.TF32_VAR: "keep",
    }


def test_ray_runtime_env_tf32_off_carries_the_override() -> None:
    env = det.ray_runtime_env(tf32="off")["env_vars"]
    assert env["NVIDIA_TF32_OVERRIDE"] == "0" and env[det.TF32_VAR] == "off"
    with pytest.raises(ConfigError, match="ROLLOUT_MOCK_TF32='off' but the determinism profile"):
        det.ray_runtime_env({"env_vars": env})  # tf32 keep: a mismatch, not a silent downgrade


def test_ray_runtime_env_merges_without_mutating_base() -> None:
    base = {"env_vars": {"FOO": "1", "NCCL_ALGO": "Ring"}, "pip": ["x"]}
    snapshot = json.loads(json.dumps(base))
    env = det.ray_runtime_env(base, profile="strict")
    assert base == snapshot
    assert env["pip"] == ["x"]
    assert env["env_vars"]["FOO"] == "1"
    assert env["env_vars"]["NCCL_PROTO"] == "Simple"
    assert det.SEED_VAR not in env["env_vars"]


def test_ray_runtime_env_conflicting_value_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        det.ray_runtime_env({"env_vars": {"NCCL_ALGO": "Tree"}})
    assert "NCCL_ALGO='Tree'" in str(info.value) and "NCCL_ALGO='Ring'" in str(info.value)


def test_ray_runtime_env_foreign_hook_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"already has worker_process_setup_hook='my\.hook'"):
        det.ray_runtime_env({"worker_process_setup_hook": "my.hook"})


def test_ray_runtime_env_is_idempotent() -> None:
    once = det.ray_runtime_env(seed=3)
    assert det.ray_runtime_env(once, seed=3) == once


# ---------------------------------------------------------------------------- fingerprint


def test_fingerprint_keys_and_json_round_trip() -> None:
    fp = det.fingerprint()
    assert set(fp) == {
        "fingerprint_version",
        "python",
        "platform",
        "machine",
        "numpy",
        "torch",
        "torch_cuda",
        "cudnn",
        "nccl",
        "gpu",
        "env",
        "torch_flags",
    }
    assert fp["torch"] == torch.__version__
    assert set(fp["env"]) == set(det.FINGERPRINT_ENV_VARS)
    assert set(ROLL_ENV) <= set(fp["env"])
    assert det.compare_fingerprints(json.loads(json.dumps(fp)), fp) == []


def test_fingerprint_reflects_apply() -> None:
    before = det.fingerprint()
    det.apply(tf32="off")
    after = det.fingerprint()
    assert before["env"]["NCCL_ALGO"] is None and after["env"]["NCCL_ALGO"] == "Ring"
    assert after["torch_flags"]["deterministic_algorithms"] is True
    assert after["torch_flags"]["cudnn_allow_tf32"] is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_fingerprint_without_cuda() -> None:
    fp = det.fingerprint()
    assert fp["gpu"] is None and fp["nccl"] is None


def test_compare_reports_changed_and_one_sided_fields() -> None:
    recorded = {"torch": "2.5", "platform": "a", "env": {"NCCL_ALGO": "Ring"}, "gpu": None}
    current = {"torch": "2.6", "platform": "b", "env": {"NCCL_ALGO": None}, "extra": [1, 2]}
    diffs = det.compare_fingerprints(recorded, current)
    as_tuples = [(d.field, d.recorded, d.current, d.numerics_relevant) for d in diffs]
    assert as_tuples == [
        ("env.NCCL_ALGO", "Ring", None, True),
        ("extra", det.MISSING, [1, 2], True),
        ("gpu", None, det.MISSING, True),
        ("torch", "2.5", "2.6", True),
        ("platform", "a", "b", False),
    ]
    assert diffs[1].to_dict()["recorded"] == "<missing>"


def test_compare_treats_tuples_like_lists() -> None:
    assert (
        det.compare_fingerprints({"gpu": {"models": ["H100"]}}, {"gpu": {"models": ("H100",)}})
        == []
    )


def test_format_differences_table() -> None:
    diffs = det.compare_fingerprints(
        {"env": {"NCCL_ALGO": "Ring"}, "platform": "a"},
        {"env": {"NCCL_ALGO": None}, "platform": "bb"},
    )
    assert det.format_differences(diffs).splitlines() == [
        "field           | recorded (dump) | current (this run)",
        "----------------+-----------------+-------------------",
        "env.NCCL_ALGO   | Ring            | <unset>",
        "platform [info] | a               | bb",
    ]
    assert det.format_differences([]) == "(no differences)"


def test_format_fingerprint_aligns_values() -> None:
    text = det.format_fingerprint(
        {"torch": "2.6", "env": {"NCCL_ALGO": None}, "gpu": {"models": ["A"]}}
    )
    assert text.splitlines() == [
        "torch          2.6",
        "env.NCCL_ALGO  <unset>",
        'gpu.models     ["A"]',
    ]


# ---------------------------------------------------------------------------- env command


def _run_env(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rollout-mock")
    sub = parser.add_subparsers(dest="command", required=True)
    env_cmd.add_parser(sub).set_defaults(_run=env_cmd.run)
    args = parser.parse_args(argv)
    return int(args._run(args))


def _write_manifest(dump_dir: Path, fingerprint: dict[str, Any] | None) -> None:
    """A real (empty) manifest.json as the store writes it, holding ``fingerprint``."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    data = Manifest(fingerprint=fingerprint).to_json()
    (dump_dir / "manifest.json").write_text(json.dumps(data), encoding="utf-8")


def test_env_command_prints_fingerprint(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run_env(["env"]) == 0
    out = capsys.readouterr().out
    assert "torch " in out and torch.__version__ in out and "env.CUBLAS_WORKSPACE_CONFIG" in out


def test_env_command_json_without_dump(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run_env(["env", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fingerprint"]["torch"] == torch.__version__ and "differences" not in out


def test_env_command_equal_dump_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_manifest(tmp_path, det.fingerprint())
    assert _run_env(["env", "--dump-dir", str(tmp_path)]) == 0
    assert "(no differences)" in capsys.readouterr().out


def test_env_command_relevant_difference_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = det.fingerprint()
    recorded["env"]["NCCL_ALGO"] = "Tree"
    _write_manifest(tmp_path, recorded)
    assert _run_env(["env", "--dump-dir", str(tmp_path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["differences"] == [
        {"field": "env.NCCL_ALGO", "recorded": "Tree", "current": None, "numerics_relevant": True}
    ]


def test_env_command_informational_difference_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = det.fingerprint() | {"platform": "elsewhere"}
    _write_manifest(tmp_path, recorded)
    assert _run_env(["env", "--dump-dir", str(tmp_path)]) == 0
    assert "platform [info] | elsewhere" in capsys.readouterr().out


def test_env_command_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(DumpNotFoundError) as info:
        _run_env(["env", "--dump-dir", str(tmp_path / "nope")])
    assert info.value.path == str(tmp_path / "nope" / "manifest.json")
    assert "rollout_mock.dump_dir" in str(info.value)


def test_env_command_manifest_without_fingerprint(tmp_path: Path) -> None:
    _write_manifest(tmp_path, None)
    with pytest.raises(ManifestError, match="the dump has no recorded fingerprint"):
        _run_env(["env", "--dump-dir", str(tmp_path)])


def test_env_command_through_cli_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rollout_mock import cli

    assert cli.main(["env", "--dump-dir", str(tmp_path / "missing")]) == 2
    assert "manifest.json does not exist" in capsys.readouterr().err

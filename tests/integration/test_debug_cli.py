"""The logprobs and cut commands end to end on real dumps; verify and the verdict on a dump dir."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cfg, restored_process_state

pytest.importorskip("transformers")

from debug_helpers import FORWARD_NOISE, make_samples, save_tiny_model, tiny_model, verl_batch  # noqa: E402

from rollout_mock import MetricsWriter, MockScheduler, open_dump, read_metrics
from rollout_mock.cli import main  # noqa: E402
from rollout_mock.errors import MetricsDivergenceError  # noqa: E402


class Recorded:
    def __init__(self, batches: dict[int, Any]) -> None:
        self.batches = batches

    def get_batch(self, data: object, global_step: int) -> Any:
        return self.batches[global_step]


@pytest.fixture(scope="module")
def verl_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dump_dir = tmp_path_factory.mktemp("verl") / "dump"
    model = tiny_model()
    batches = {step: verl_batch(model, make_samples(seed=step)) for step in range(3)}
    with MockScheduler(Recorded(batches), cfg(dump_dir)) as mock:
        for step in range(3):
            mock.get_batch(None, step)
    return dump_dir


def test_logprobs_cli_zero_then_perturbed(verl_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    same = save_tiny_model(tmp_path / "same")
    assert main(["logprobs", str(verl_dump), "--model", str(same), "--json", "--threshold", str(1 + FORWARD_NOISE)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["max_abs_diff"] <= FORWARD_NOISE
    assert data["token_mult_prob_error"] == pytest.approx(1.0, abs=FORWARD_NOISE)
    assert data["layout"] == "verl" and [s["step"] for s in data["steps"]] == [0, 1, 2]

    slightly = save_tiny_model(tmp_path / "slightly", perturb=1e-3)
    assert main(["logprobs", str(verl_dump), "--model", str(slightly), "--threshold", "1.000001"]) == 1
    out = capsys.readouterr().out
    assert "OVER THRESHOLD" in out and "worst tokens" in out

    changed = save_tiny_model(tmp_path / "changed", perturb=0.5)
    assert main(["logprobs", str(verl_dump), "--model", str(changed), "--steps", "1"]) == 1  # NeMo-RL's 1.05
    assert "step" in capsys.readouterr().out
    assert main(["logprobs", str(verl_dump), "--model", str(tmp_path / "nope")]) == 2


def test_cut_replays_on_its_own(verl_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dst = tmp_path / "repro"
    assert main(["cut", str(verl_dump), str(dst), "--steps", "0,2", "--groups", "1", "--group-size", "2"]) == 0
    assert "step 0: 2 rows" in capsys.readouterr().out
    original = open_dump(verl_dump).load(2, "train")
    provenance = json.loads((dst / "provenance.json").read_text())
    assert provenance["steps"] == {"train": [0, 2]} and provenance["groups"] == [1]
    with MockScheduler(None, cfg(dst, mode="mock")) as mock:
        for step in (0, 2):
            batch = mock.get_batch(None, step)
            assert batch["input_ids"].shape[0] == 2
        assert torch.equal(batch["input_ids"], original["input_ids"][2:4])
    assert main(["cut", str(verl_dump), str(dst), "--steps", "0"]) == 2  # not empty
    assert main(["cut", str(verl_dump), str(tmp_path / "x"), "--steps", "7"]) == 2  # not recorded


def test_demo_dump_verdict_and_verify(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from rollout_mock.demo import run_pipeline

    dump_dir = tmp_path / "dump"
    with restored_process_state():
        run_pipeline("dump", dump_dir, tmp_path / "dump.jsonl", steps=3, batch_size=16)
        caplog.set_level(logging.INFO, logger="rollout_mock")
        run_pipeline("mock", dump_dir, tmp_path / "mock.jsonl", steps=3, batch_size=16)
        assert any("values over steps 0-2 match the dump run" in r.getMessage() for r in caplog.records)
        caplog.clear()
        run_pipeline("mock", dump_dir, tmp_path / "changed.jsonl", steps=3, batch_size=16, micro_batches=4)
    first = [r.getMessage() for r in caplog.records if "first divergence" in r.getMessage()]
    assert len(first) == 1 and "at step 0" in first[0]
    assert read_metrics(dump_dir).steps == [0, 1, 2]
    assert main(["verify", str(dump_dir), str(tmp_path / "mock.jsonl")]) == 0
    assert main(["verify", str(dump_dir), str(tmp_path / "changed.jsonl")]) == 1
    capsys.readouterr()


def test_verdict_fail_raises_at_the_diverging_step(dump_dir: Path, tmp_path: Path) -> None:
    batches = {s: {"x": torch.tensor([float(s)])} for s in range(4)}
    with MockScheduler(Recorded(batches), cfg(dump_dir)) as mock, \
            MetricsWriter(tmp_path / "a.jsonl", expected=mock) as log:
        for s in range(4):
            log.log(s, {"loss": float(mock.get_batch(None, s)["x"]) * 2, "lr": 0.1})
    config = cfg(dump_dir, mode="mock", verdict={"action": "fail", "rtol": {"loss": 1e-3}})
    with MockScheduler(None, config, spec=Recorded) as mock, \
            MetricsWriter(tmp_path / "b.jsonl", expected=mock) as log:
        log.log(0, {"loss": 0.0, "lr": 0.1})
        log.log(1, {"loss": 2.001, "lr": 0.1})  # within rtol 1e-3 of 2.0
        with pytest.raises(MetricsDivergenceError) as caught:
            log.log(2, {"loss": 4.1, "lr": 0.1})
    assert (caught.value.step, caught.value.metric, caught.value.expected) == (2, "loss", 4.0)
    assert read_metrics(tmp_path / "b.jsonl")["loss"][2] == 4.1  # the line was written first

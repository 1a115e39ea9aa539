"""Issue 31's flight recorder scenario: record every step of a long run, keep exactly the ring plus
the windows around a NaN in a batch and a spike in a logged metric, each with its reason in the
index; the kept steps replay bit for bit. On a local directory (2,000 steps) and on S3 (moto,
fewer steps), where the ring's deletions go out in batches."""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from storage_conformance import s3_server  # noqa: F401

from rollout_mock import MetricsWriter, MockScheduler, StepNotFoundError, open_dump
from rollout_mock.cli import main as cli_main
from rollout_mock.storage import Store
from rollout_mock.storage.manifest import StreamId
from rollout_mock.wrap.recording import DELETE_BATCH

TRAIN = StreamId("train")


class Rollouts:
    """A rollout scheduler whose batch of each step is random but a pure function of the step:
    token ids, float32 log-probs, bfloat16 rewards. Step ``nan_at`` gets a NaN log-prob."""

    def __init__(self, nan_at: int) -> None:
        self.nan_at = nan_at

    def get_batch(self, data: Any, global_step: int) -> dict[str, torch.Tensor]:
        return batch_of(global_step, self.nan_at)


def batch_of(step: int, nan_at: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    logprobs = -torch.rand(4, 16, generator=generator)
    if step == nan_at:
        logprobs[2, 5] = math.nan
    return {"input_ids": torch.randint(0, 32_000, (4, 16), generator=generator), "logprobs": logprobs,
            "rewards": torch.rand(4, generator=generator).bfloat16()}


def train_step(batch: dict[str, torch.Tensor], step: int, spike_at: int) -> dict[str, float]:
    """The metrics a training step logs: a loss from the batch (NaN where the batch is), times 40
    at ``spike_at``."""
    loss = float(-batch["logprobs"].mean()) * (40.0 if step == spike_at else 1.0)
    return {"loss": loss, "reward": float(batch["rewards"].float().mean())}


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and a[k].contiguous().view(torch.uint8).equal(b[k].contiguous().view(torch.uint8)) for k in a)


def run(config: dict[str, Any], steps: int, nan_at: int, spike_at: int, metrics: Path) -> None:
    with MockScheduler(Rollouts(nan_at), config) as rollout, MetricsWriter(metrics, expected=rollout) as log:
        for step in range(steps):
            batch = rollout.get_batch(None, global_step=step)
            log.log(step, train_step(batch, step, spike_at))


def expected_kept(steps: int, last: int, before: int, after: int, anomalies: tuple[int, ...]) -> list[int]:
    windows = {s for a in anomalies for s in range(a - before, a + after + 1)}
    return sorted(windows | set(range(steps - last, steps)))


def check_reasons(pins: dict[int, list[str] | None], nan_at: int, spike_at: int, before: int, after: int) -> None:
    nan_reasons = ["NaN/inf in the batch: logprobs (1 NaN)", "metric loss = nan"]  # the scan and the logged loss
    assert sorted(pins[nan_at] or []) == nan_reasons  # in the order they arrived (the writer thread's is first or not)
    spike = pins[spike_at] or []
    assert len(spike) == 1 and spike[0].startswith("metric loss = ") and "robust deviations from the median" in spike[0]
    for anomaly in (nan_at, spike_at):
        for step in [*range(anomaly - before, anomaly), *range(anomaly + 1, anomaly + after + 1)]:
            assert pins[step] == [f"window of step {anomaly}"], step


def check_replay(config: dict[str, Any], kept: list[int], nan_at: int, missing: int) -> None:
    with MockScheduler(None, {**config, "mode": "mock"}, spec=Rollouts) as mock:
        for step in kept:
            assert bitwise_equal(mock.get_batch(None, global_step=step), batch_of(step, nan_at)), step
        with pytest.raises(StepNotFoundError):
            mock.get_batch(None, global_step=missing)


def test_two_thousand_steps_keep_the_ring_and_both_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # Durability is not what is tested here: without fsync a step costs ~1 ms instead of ~8 on a
    # shared CI disk, and the 2,000 steps take a few seconds.
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    steps, nan_at, spike_at, last, before, after = 2000, 1234, 1700, 50, 5, 5
    dump = tmp_path / "dump"
    config = {"enable": True, "mode": "dump", "dump_dir": str(dump),
              "keep": {"last": last, "before": before, "after": after, "metrics": {"loss": {"z": 8}}}}
    run(config, steps, nan_at, spike_at, tmp_path / "metrics.jsonl")

    reader = open_dump(dump)
    kept = list(reader.steps(TRAIN))
    assert kept == expected_kept(steps, last, before, after, (nan_at, spike_at))
    assert len(kept) == last + 2 * (before + after + 1)
    pins = {step: reader.entry(TRAIN, step).pin for step in kept}  # type: ignore[union-attr]
    check_reasons(pins, nan_at, spike_at, before, after)
    assert all(pins[s] is None for s in range(steps - last, steps))  # the ring itself is not pinned
    assert sorted(p.name for p in (dump / "train").glob("step_*.pkl")) == [f"step_{s:06d}.pkl" for s in kept]

    check_replay(config, kept, nan_at, missing=1000)

    assert cli_main(["ls", str(dump)]) == 0
    out = capsys.readouterr().out
    assert f"pinned: {nan_at - before}-{nan_at + after}, {spike_at - before}-{spike_at + after}" in out
    assert f"step   {nan_at}  train/step_00{nan_at}.pkl" in out
    assert any(line.startswith(f"  step   {nan_at}") and "PINNED: " in line and "NaN/inf in the batch: logprobs (1 NaN)"
               in line and "metric loss = nan" in line for line in out.splitlines())
    assert cli_main(["ls", str(dump), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["pinned"]["train"]
    assert sorted(map(int, listed)) == [s for s in kept if s < steps - last]


def test_on_s3_the_same_with_batched_deletions(s3_server: dict[str, Any], tmp_path: Path,  # noqa: F811
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    steps, nan_at, spike_at, last, before, after = 120, 61, 90, 10, 2, 3
    url = f"s3://{s3_server['bucket']}/{uuid.uuid4().hex[:10]}"
    config = {"enable": True, "mode": "dump", "dump_dir": url, "storage_options": s3_server["storage_options"],
              "keep": {"last": last, "before": before, "after": after, "metrics": {"loss": {"z": 8}}}}
    batches: list[list[int]] = []
    real = Store.delete_many

    def spy(self: Store, stream: StreamId, doomed: Any) -> None:
        batches.append(list(doomed))
        real(self, stream, doomed)

    monkeypatch.setattr(Store, "delete_many", spy)
    run(config, steps, nan_at, spike_at, tmp_path / "metrics.jsonl")

    kept = expected_kept(steps, last, before, after, (nan_at, spike_at))
    reader = open_dump(url, storage_options=s3_server["storage_options"])
    assert list(reader.steps(TRAIN)) == kept
    check_reasons({s: reader.entry(TRAIN, s).pin for s in kept}, nan_at, spike_at, before, after)  # type: ignore[union-attr]
    deleted = [s for batch in batches for s in batch]
    assert sorted(deleted) == sorted(set(range(steps)) - set(kept))
    assert all(len(batch) >= DELETE_BATCH for batch in batches[:-1]), [len(b) for b in batches]  # the last: at close
    check_replay(config, kept, nan_at, missing=30)

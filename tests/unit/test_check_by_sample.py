"""Check mode pairs samples by key, not position: a shuffled batch with one changed token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cfg

from rollout_mock import CheckFailedError, MockScheduler, read_check_verdicts
from rollout_mock.wrap.check import pair_samples


class Engine:
    """8 samples, one prompt each (two GRPO groups of 4 when ``groups``), returned in ``order``."""

    def __init__(self, order: list[int] | None = None, change: tuple[int, int] | None = None,
                 drop: int | None = None, groups: bool = False) -> None:
        self.order, self.change, self.drop, self.groups = order, change, drop, groups

    def get_batch(self, global_step: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(global_step)
        prompts = torch.arange(8).repeat_interleave(4 if self.groups else 1)[:8, None].repeat(1, 3) if self.groups \
            else torch.arange(24).reshape(8, 3)
        responses = torch.randint(0, 100, (8, 6), generator=gen)
        logprobs = -torch.rand(8, 6, generator=gen)
        if self.change is not None:
            row, col = self.change
            responses[row, col] += 1
            logprobs[row, col:] -= 0.5
        batch = {"prompts": prompts, "responses": responses, "rollout_log_probs": logprobs,
                 "rewards": responses.float().mean(-1), "request_id": torch.arange(8) + 100}
        index = list(range(8)) if self.order is None else self.order
        if self.drop is not None:
            index = [i for i in index if i != self.drop]
        return {k: v[index] for k, v in batch.items()}


SHUFFLED = [5, 2, 7, 0, 3, 6, 1, 4]


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    with MockScheduler(Engine(), cfg(tmp_path / "dump")) as mock:
        mock.get_batch(0)
    return tmp_path / "dump"


def test_shuffled_samples_check_equal(dump: Path) -> None:
    with MockScheduler(Engine(order=SHUFFLED), cfg(dump, "check")) as mock:
        mock.get_batch(0)
    verdict = read_check_verdicts(dump)[0]
    assert verdict.equal and verdict.match == 1.0  # positional comparison would see 7 of 8 rows differ
    assert verdict.samples is not None and verdict.samples["paired_by"] == "prompt hash of prompts"
    assert (verdict.samples["paired"], verdict.samples["identical"], verdict.samples["missing"]) == (8, 8, 0)


def test_shuffled_with_one_changed_token_names_the_sample_and_token(dump: Path) -> None:
    with MockScheduler(Engine(order=SHUFFLED, change=(6, 3)), cfg(dump, "check")) as mock:
        mock.get_batch(0)
    verdict = read_check_verdicts(dump)[0]
    assert not verdict.equal and verdict.match == pytest.approx(47 / 48)
    samples = verdict.samples
    assert samples is not None and samples["differs"] == 1 and samples["identical"] == 7
    first = samples["samples"][0]
    assert (first["status"], first["recorded_index"], first["live_index"], first["first_diff"]) == \
        ("differs", 6, SHUFFLED.index(6), 3)
    assert first["live_token"] == first["recorded_token"] + 1
    assert first["logprob_diff_before"] == 0.0  # the tokens before the divergence: identical log-probs
    assert [k["key"] for k in verdict.keys] == ["responses", "rewards", "rollout_log_probs"]  # by sample


def test_by_request_key_and_by_group_prefix(dump: Path) -> None:
    with MockScheduler(Engine(order=SHUFFLED), cfg(dump, "check", check_sample_key="request_id")) as mock:
        mock.get_batch(0)
    verdict = read_check_verdicts(dump)[0]
    assert verdict.equal and verdict.samples is not None and verdict.samples["paired_by"] == "request key request_id"
    live = Engine(order=SHUFFLED, groups=True).get_batch(1)
    recorded = Engine(groups=True).get_batch(1)
    pairing = pair_samples(live, recorded)
    assert pairing is not None and pairing["identical"] == 8  # 2 prompts x 4 samples: by response prefix


def test_an_empty_or_partial_comparison_fails(dump: Path) -> None:
    with MockScheduler(Engine(drop=3), cfg(dump, "check")) as mock:
        with pytest.raises(CheckFailedError, match="partial comparison: 1 recorded sample"):
            mock.get_batch(0)
    verdict = read_check_verdicts(dump)[0]
    assert not verdict.passed and verdict.samples is not None and verdict.samples["missing"] == 1

    class Empty:
        def get_batch(self, global_step: int) -> dict[str, Any]:
            return {k: v[:0] for k, v in Engine().get_batch(global_step).items()}

    with MockScheduler(Empty(), cfg(dump, "check")) as mock:
        with pytest.raises(CheckFailedError, match="empty comparison: 8 recorded and 0 live"):
            mock.get_batch(0)


def test_report_shows_the_samples(dump: Path, tmp_path: Path) -> None:
    from rollout_mock.debug.report import write_report

    with MockScheduler(Engine(order=SHUFFLED, change=(6, 3)), cfg(dump, "check")) as mock:
        mock.get_batch(0)
    page = write_report(dump, tmp_path / "r.html").read_text()
    assert "Check mode, by sample" in page and "prompt hash of prompts" in page and "first diverging token" in page

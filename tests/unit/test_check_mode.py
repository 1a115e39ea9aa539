"""Check mode (``mode: check``): the real rollout runs, its batch is compared with the recording."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cfg

from rollout_mock import CheckFailedError, MockScheduler, Mode, ReplayMismatchError, read_check_verdicts
from rollout_mock.storage.manifest import StreamId
from rollout_mock.wrap.check import verdict_relpath

STEPS = 3


class Engine:
    """A rollout whose responses go stale (other tokens) from ``stale_from`` on, in ``stale_rows`` rows."""

    def __init__(self, stale_from: int | None = None, stale_rows: int = 1, noise: float = 0.0) -> None:
        self.stale_from, self.stale_rows, self.noise = stale_from, stale_rows, noise

    def get_batch(self, prompts: torch.Tensor, global_step: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(global_step)
        responses = torch.randint(0, 100, (4, 8), generator=gen)
        logprobs = -torch.rand(4, 8, generator=gen)
        if self.stale_from is not None and global_step >= self.stale_from:
            responses[: self.stale_rows, 4:] += 1  # half of those rows' tokens differ
        return {"prompts": prompts.clone(), "responses": responses, "logprobs": logprobs + self.noise,
                "meta_info": {"timing": float(global_step) + 0.5}}


def prompts(step: int) -> torch.Tensor:
    return torch.full((4, 3), step)


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, list[Any]]:
    dump = tmp_path / "dump"
    with MockScheduler(Engine(), cfg(dump)) as mock:
        batches = [mock.get_batch(prompts(s), s) for s in range(STEPS)]
    return dump, batches


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in ("prompts", "responses", "logprobs"))


def test_check_mode_properties() -> None:
    assert (Mode.CHECK.records, Mode.CHECK.replays, Mode.CHECK.runs_scheduler) == (False, True, True)
    assert (Mode.MOCK.records, Mode.MOCK.replays, Mode.MOCK.runs_scheduler) == (False, True, False)
    assert (Mode.DUMP.records, Mode.DUMP.replays, Mode.DUMP.runs_scheduler) == (True, False, True)


def test_an_unchanged_engine_checks_equal_and_writes_no_step(recorded: tuple[Path, list[Any]]) -> None:
    dump, batches = recorded
    manifest = (dump / "manifest.json").read_bytes()
    with MockScheduler(Engine(), cfg(dump, "check")) as mock:
        served = [mock.get_batch(prompts(s), s) for s in range(STEPS)]
    assert all(same(a, b) for a, b in zip(served, batches))
    assert (dump / "manifest.json").read_bytes() == manifest
    verdicts = read_check_verdicts(dump)
    assert [(v.stream, v.step, v.equal, v.match, v.passed) for v in verdicts] == [("train", s, True, 1.0, True)
                                                                              for s in range(STEPS)]
    assert verdicts[0].token_match == 1.0 and verdicts[0].tokens == 32 and verdicts[0].served == "recorded"


def test_stale_tokens_are_measured_the_recording_is_served(recorded: tuple[Path, list[Any]],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    dump, batches = recorded
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    with MockScheduler(Engine(stale_from=1), cfg(dump, "check")) as mock:
        served = [mock.get_batch(prompts(s), s) for s in range(STEPS)]
    assert all(same(a, b) for a, b in zip(served, batches))  # training stays on the recorded data
    verdicts = read_check_verdicts(dump, split="train")
    assert [v.equal for v in verdicts] == [True, False, False]
    assert verdicts[1].token_match == pytest.approx(28 / 32)  # 4 of 32 response tokens differ
    assert verdicts[1].keys[0]["key"] == "responses" and verdicts[1].keys[0]["status"] == "differs"
    assert "Checked step 1 of train: DIFFERS from the recording (match 0.8750 of 32 tokens)" in caplog.text
    stored = json.loads((dump / verdict_relpath(StreamId("train"), 1)).read_text())
    assert stored["format"] == "rollout_mock.check/1" and stored["run_step"] == 1


def test_check_min_match_fails_the_run_and_live_can_be_served(recorded: tuple[Path, list[Any]]) -> None:
    dump, _ = recorded
    with MockScheduler(Engine(stale_from=1, stale_rows=4), cfg(dump, "check", check_min_match=0.9)) as mock:
        mock.get_batch(prompts(0), 0)
        with pytest.raises(CheckFailedError) as info:
            mock.get_batch(prompts(1), 1)
    assert info.value.step == 1 and info.value.match == pytest.approx(0.5) and info.value.threshold == 0.9
    live = Engine(stale_from=1).get_batch(prompts(1), 1)
    with MockScheduler(Engine(stale_from=1), cfg(dump, "check", check_serves="live")) as mock:
        mock.get_batch(prompts(0), 0)
        assert same(mock.get_batch(prompts(1), 1), live)


def test_tolerances_per_key_and_volatile_fields(recorded: tuple[Path, list[Any]]) -> None:
    dump, _ = recorded
    with MockScheduler(Engine(noise=1e-6), cfg(dump, "check")) as mock:
        mock.get_batch(prompts(0), 0)
    verdict = read_check_verdicts(dump)[0]
    assert not verdict.equal and verdict.keys[0]["key"] == "logprobs"
    assert verdict.keys[0]["max_abs_diff"] == pytest.approx(1e-6, rel=0.1)  # float32 rounding
    assert verdict.match == 1.0  # the tokens all match: the step's match is the token fraction
    with MockScheduler(Engine(noise=1e-6), cfg(dump, "check", check_tolerances={"logprobs": {"atol": 1e-5}})) as mock:
        mock.get_batch(prompts(0), 0)
    assert read_check_verdicts(dump)[0].equal  # meta_info.timing (verl's, volatile) is not compared


def test_check_mode_matches_requests_first(recorded: tuple[Path, list[Any]]) -> None:
    dump, _ = recorded
    with MockScheduler(Engine(), cfg(dump, "check")) as mock:
        with pytest.raises(ReplayMismatchError):
            mock.get_batch(prompts(5), 0)


def test_hostile_verdict_files_are_skipped(recorded: tuple[Path, list[Any]]) -> None:
    dump, _ = recorded
    with MockScheduler(Engine(), cfg(dump, "check")) as mock:
        mock.get_batch(prompts(0), 0)
    folder = dump / "checks" / "train"
    (folder / "step_000009.json").write_bytes(b"{" * 10)
    (folder / "step_000010.json").write_bytes(b" " * (300 << 10))
    (folder / "step_000011.json").write_text(json.dumps({"format": "rollout_mock.check/1", "stream": "../x"}))
    assert [v.step for v in read_check_verdicts(dump)] == [0]
    assert read_check_verdicts(dump.parent / "nothing-here") == []


def test_the_log_line_says_how_the_first_key_differs(recorded: tuple[Path, list[Any]],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The line named the key with an empty detail ("(differs: )") although the verdict holds
    the match and max_abs_diff."""
    dump, _ = recorded
    caplog.set_level(logging.WARNING, logger="rollout_mock")
    with MockScheduler(Engine(noise=0.73), cfg(dump, "check")) as mock:
        mock.get_batch(prompts(0), 0)
    key = read_check_verdicts(dump)[0].keys[0]
    assert key["key"] == "logprobs" and key["max_abs_diff"] == pytest.approx(0.73, abs=1e-5)
    assert "; first: logprobs (differs: match 0.0000, max_abs_diff 0.73)" in caplog.text, caplog.text
    assert "(differs: )" not in caplog.text


def test_the_report_shows_the_check_verdicts_per_step(recorded: tuple[Path, list[Any]], tmp_path: Path) -> None:
    """The docs said `report` shows check mode's verdicts; nothing in debug/ read checks/."""
    import re

    from rollout_mock.debug import write_report

    dump, _ = recorded
    with MockScheduler(Engine(stale_from=1, noise=0.25), cfg(dump, "check")) as mock:
        for s in range(STEPS):
            mock.get_batch(prompts(s), s)
    html = write_report(dump, tmp_path / "report.html").read_text()
    assert '<h2 id="checks">Check mode</h2>' in html and f"{STEPS} step(s) checked" in html
    rows = re.findall(r"<tr class=\"(bad)?\"><td>(\d+)</td>", html.split('id="checktable"')[1])
    assert [int(step) for _, step in rows] == list(range(STEPS)) and all(bad for bad, _ in rows)
    assert "<code>logprobs</code> (differs: match 0.0000, max_abs_diff 0.25)" in html
    data = json.loads(re.search(r'id="rm-data">(.*?)</script>', html, re.S).group(1))
    chart = next(c for c in data["charts"] if c["title"] == "check mode: match with the recording")
    assert chart is not None


def test_a_report_of_an_unchecked_dump_has_no_check_section(recorded: tuple[Path, list[Any]], tmp_path: Path) -> None:
    from rollout_mock.debug import write_report

    dump, _ = recorded
    assert 'id="checks"' not in write_report(dump, tmp_path / "report.html").read_text()

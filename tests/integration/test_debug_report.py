"""The HTML report: self-contained, escaped, and working in a real headless browser."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import HANG_S, cfg
from report_cases import browser, open_page

from rollout_mock import MockScheduler
from rollout_mock.cli import main
from rollout_mock.debug import write_report
from rollout_mock.errors import DebugInputError

EVIL = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"


class VerlLike:
    """verl-shaped batches: a plain dict of tensors plus an untrusted text column."""

    def get_batch(self, data: object, global_step: int) -> dict[str, object]:
        n = 4
        prompt = np.empty(n, dtype=object)
        prompt[:] = [EVIL if i == 1 else f"prompt {i}" for i in range(n)]
        responses = torch.arange(n * 3).view(n, 3) % 7 + 1
        return {
            "input_ids": torch.cat([torch.full((n, 2), 9), responses], 1),
            "prompts": torch.full((n, 2), 9),
            "responses": responses,
            "attention_mask": torch.ones(n, 5, dtype=torch.long),
            "rewards": torch.tensor([0.0, 0.5, 1.0, 0.25]) + global_step,
            "raw_prompt": prompt,
        }


@pytest.fixture
def dump(dump_dir: Path) -> Path:
    with MockScheduler(VerlLike(), cfg(dump_dir)) as mock:
        for step in range(3):
            mock.get_batch(None, step)
    return dump_dir


def test_report_is_self_contained_and_escaped(dump: Path, tmp_path: Path) -> None:
    from rollout_mock.debug.report import asset

    out = write_report(dump, tmp_path / "r.html")
    html = out.read_text()
    assert "alert(1)</script>" not in html and "<img src=x" not in html
    # our own three script elements (data, uPlot, the page's script), nothing else closes a script
    assert html.count("</script>") == 3
    assert asset("uPlot.iife.min.js") in html and "(v1.6.32)" in html  # vendored uPlot, inline
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched
    assert "default-src 'none'" in html
    data = _data(html)
    assert sorted(data["steps"]) == ["0", "1", "2"]
    assert data["steps"]["2"]["traces"][1]["messages"][0]["content"] == EVIL  # kept as data, intact
    assert data["steps"]["0"]["traces"][2]["reward"] == 1.0
    drawn = [c["title"] for c in data["charts"] if not c["title"].startswith("health:")]
    assert drawn == ["reward"]  # the lengths (3 every step) are named, not drawn


def test_report_cli_with_logprobs_json(dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lp = tmp_path / "lp.json"
    lp.write_text(json.dumps({"steps": [{"step": s, "token_mult_prob_error": 1.0 + s / 10} for s in range(3)]}))
    assert main(["report", str(dump), "-o", str(tmp_path / "r.html"), "--logprobs-json", str(lp)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert "token_mult_prob_error" in (tmp_path / "r.html").read_text()
    assert main(["report", str(tmp_path / "missing"), "-o", str(tmp_path / "x.html")]) == 2


@pytest.mark.slow
def test_report_renders_in_a_headless_browser(dump: Path, tmp_path: Path) -> None:
    sync_playwright, chromium = browser()
    deep = tmp_path / ("a_directory_name_without_any_break_" * 6) / "dumps"  # the header has no place to break
    deep.parent.mkdir()
    dump.rename(deep)
    out = write_report(deep, tmp_path / "r.html")
    errors: list[str] = []
    dialogs: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:  # type: ignore[operator]
        b, page = open_page(p, chromium, out.as_uri(), errors, requests, dialogs)
        try:
            page.select_option("#step", "2")
            items = page.locator("#samples li")
            assert items.count() == 4
            items.nth(1).click()
            detail = page.locator("#detail").inner_text(timeout=HANG_S * 1000)
            assert "step 2, sample 1" in detail
            assert EVIL in detail  # shown as text
            # the reward (lengths, rejected: one line); the health section's charts come after
            assert page.locator(".chart canvas").count() - page.locator("#health .chart canvas").count() == 1
            # nothing runs off the right edge (the header line with the dump's path was cut off)
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
            info = page.locator("#info").bounding_box()
            assert info["x"] + info["width"] <= 1400
        finally:
            b.close()
    assert errors == [] and dialogs == [] and requests == []


def _scale(page: Any, index: int = 0) -> tuple[float, float]:
    chart = page.locator(".chart[data-chart]").nth(index)
    return float(chart.get_attribute("data-xmin")), float(chart.get_attribute("data-xmax"))


@pytest.mark.slow
def test_report_charts_zoom_smooth_and_search_every_sample_in_a_browser(tmp_path: Path) -> None:
    """Charts: a tooltip on hover, zoom by dragging (every chart follows), a typed step range,
    smoothing; samples: sorted, searched over every sample of the step (not only the previews),
    the detail pane following the search. Screenshots go to ``$ROLLOUT_MOCK_REPORT_SHOTS`` when set."""
    sync_playwright, chromium = browser()
    a = grpo_dump(tmp_path / "run a", 12)  # a space: the suggested command quotes the path
    single = write_report(a, tmp_path / "r.html")
    shots = os.environ.get("ROLLOUT_MOCK_REPORT_SHOTS")
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:  # type: ignore[operator]
        b, page = open_page(p, chromium, single.as_uri(), errors, requests)
        try:
            charts = page.locator(".chart[data-chart]")  # reward, log-probs, GRPO groups without signal
            assert charts.count() - page.locator("#health .chart[data-chart]").count() == 3  # (health: last)
            assert "Not drawn (nothing to see): response length (tokens): 6 at every step" in page.inner_text("body")
            assert page.locator("#keystats table tr").count() >= 5
            assert page.locator("#hists svg rect").count() >= 3  # this step's histograms
            assert _scale(page) == (0, 11)
            # hover: a tooltip with every value of the step under the pointer
            over = page.locator(".chart .u-over").first
            box = over.bounding_box()
            page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
            tip = page.locator(".chart .tip").first
            assert re.match(r"step \d+\nmin–max: .+ \.\. .+\np25–p75: .+\nmean: .+\nmedian: .+", tip.inner_text())
            # drag across the reward chart: every chart shows the selected steps
            page.mouse.move(box["x"] + box["width"] * 0.25, box["y"] + 20)
            page.mouse.down()
            page.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + 40, steps=6)
            page.mouse.up()
            lo, hi = int(page.input_value("#xmin")), int(page.input_value("#xmax"))
            assert 0 < lo < hi < 11
            assert all(_scale(page, i) == (lo, hi) for i in range(3))
            page.locator(".chart .u-over").nth(1).dblclick()  # back to every step
            assert _scale(page, 2) == (0, 11) and page.input_value("#xmin") == ""
            page.fill("#xmax", "7")  # a typed step range (leaving a box applies it)
            page.fill("#xmin", "3")
            page.locator("#xmin").dispatch_event("change")
            assert _scale(page, 1) == (3, 7)
            page.locator("#smooth").fill("0.9")
            page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] * 0.5)
            assert "(smoothed " in tip.inner_text()
            page.click("#resetzoom")
            assert _scale(page) == (0, 11)
            # samples: every sample of the step is listed and searched, 12 of 32 in full
            page.select_option("#step", "3")
            items = page.locator("#samples li")
            assert items.count() == 32
            page.locator(".shead button", has_text="reward").click()  # ascending reward
            rewards = [float(x) for x in page.locator("#samples li > span:nth-child(2)").all_inner_texts()]
            assert rewards == sorted(rewards)
            previewed = {t["index"] for t in _data(single.read_text())["steps"]["3"]["traces"]}
            hidden = next(f"q{g}" for g in range(8) if not {4 * g + i for i in range(4)} & previewed)
            page.fill("#filter", f"uid:{hidden}")  # a group none of whose members is previewed
            assert items.count() == 4
            assert set(page.locator("#samples li > span:nth-child(4)").all_inner_texts()) == {hidden}
            assert "4 of 32 samples match" in page.inner_text("#stepinfo")
            detail = page.inner_text("#detail")
            assert f"uid: {hidden}" in detail and "Not previewed in this page" in detail
            assert f"rollout-mock show '{a}' --step 3 --max " in detail
            page.fill("#filter", "prompt 27")  # text of a sample that is not previewed
            assert items.count() == 1 and "sample 27" in page.inner_text("#detail")
            page.fill("#filter", "no such text")
            assert items.count() == 0 and "No sample of this step matches" in page.inner_text("#detail")
            page.fill("#filter", "")
            page.locator("#groups a", has_text="q1").first.click()  # a GRPO group: its members only
            assert page.input_value("#filter") == "uid:q1" and items.count() == 4
            if shots:
                page.fill("#filter", "")
                page.screenshot(path=f"{shots}/report.png", full_page=True)
        finally:
            b.close()
    assert errors == [] and requests == []


# ------------------------------------------------------------------ readable numbers, bounded size
class Grpo:
    """GRPO-shaped batches: groups of 4 per uid, float32 rewards like 0.1, long texts, log-probs.

    ``diverge_at``: from that step on, log-probs move by a growing amount (a precision drift)."""

    def __init__(self, rows: int = 32, diverge_at: int | None = None) -> None:
        self.rows, self.diverge_at = rows, diverge_at

    def get_batch(self, data: object, global_step: int) -> dict[str, object]:
        g = torch.Generator().manual_seed(global_step)
        n = self.rows
        responses = torch.randint(1, 50, (n, 6), generator=g)
        logp = -torch.rand(n, 6, generator=g) * 3
        if self.diverge_at is not None and global_step >= self.diverge_at:
            logp = logp + 1e-6 * 10 ** (global_step - self.diverge_at)
        uid = np.empty(n, dtype=object)
        uid[:] = [f"q{i // 4}" for i in range(n)]
        text = np.empty(n, dtype=object)
        text[:] = [("word " * 2000) if i == 0 else f"prompt {i}" for i in range(n)]
        rewards = (torch.arange(n) % 4).float() * 0.1 + global_step * 0.01
        rewards[4:8] = 0.5  # one group without signal
        if global_step % 2:
            rewards[8:12] = 0.25  # two on odd steps
        return {"input_ids": torch.cat([torch.full((n, 3), 7), responses], 1), "prompts": torch.full((n, 3), 7),
                "responses": responses, "attention_mask": torch.ones(n, 9, dtype=torch.long),
                "old_log_probs": logp, "rewards": rewards.to(torch.float32), "uid": uid, "raw_prompt": text}


def grpo_dump(path: Path, steps: int, *, loss: float | None = None, **kwargs: object) -> Path:
    """A GRPO-shaped dump; with ``loss``, the run's metrics are recorded too (``expected/``)."""
    from rollout_mock.compare.expected import MetricsWriter

    with MockScheduler(Grpo(**kwargs), cfg(path)) as mock:  # type: ignore[arg-type]
        if loss is None:
            for step in range(steps):
                mock.get_batch(None, step)
        else:
            with MetricsWriter(path.parent / f"{path.name}-metrics.jsonl", expected=mock) as log:
                for step in range(steps):
                    mock.get_batch(None, step)
                    log.log(step, {"pg_loss": loss / (step + 1)})
    return path


def _data(html: str) -> dict:
    return json.loads(re.search(r'id="rm-data">(.*?)</script>', html, re.S).group(1))


def test_report_numbers_ticks_previews_and_stats(tmp_path: Path) -> None:
    dump = grpo_dump(tmp_path / "d", 6)
    html = write_report(dump, tmp_path / "r.html", max_samples=8).read_text()
    assert "0.10000000149" not in html and "0.3000000119" not in html  # no float32 noise anywhere
    data = _data(html)
    reward = data["charts"][0]
    assert reward["title"] == "reward" and [b["name"] for b in reward["bands"]] == ["min–max", "p25–p75"]
    assert [s["name"] for s in reward["series"]] == ["mean", "median"] and reward["x"] == [0, 1, 2, 3, 4, 5]
    step = data["steps"]["2"]
    assert step["total"] == 32 and len(step["traces"]) == 8
    picked = {t["index"]: t["why"] for t in step["traces"]}
    assert any("highest reward" in w for w in picked.values()) and any("lowest reward" in w for w in picked.values())
    first = next(t for t in step["traces"] if t["index"] == 0)
    assert len(first["messages"][0]["content"]) < 1400 and "[cut:" in first["messages"][0]["content"]
    assert first["uid"] == "q0"
    keys = {k["key"]: k for k in step["keys"]}
    assert keys["old_log_probs"]["nan"] == 0 and keys["rewards"]["std"] > 0
    assert step["groups"]["groups"] == 8 and step["groups"]["flat"] == 1
    assert sum(step["hist"]["reward"]["counts"]) == 32 and sum(step["hist"]["logprob"]["counts"]) == 32 * 6
    assert "response token log-prob" in html and "GRPO groups" in html
    rows = step["rows"]  # the search index: every sample read
    assert rows["n"] == 32 and len(rows["r"]) == len(rows["len"]) == len(rows["u"]) == len(rows["t"]) == 32
    assert [rows["uids"][u] for u in rows["u"]][:5] == ["q0", "q0", "q0", "q0", "q1"] and rows["st"] == "o" * 32
    assert rows["t"][27].endswith("prompt 27") and all(len(t) <= 160 for t in rows["t"])


def test_charts_that_say_nothing_are_named_in_one_line(tmp_path: Path) -> None:
    html = write_report(grpo_dump(tmp_path / "d", 4), tmp_path / "r.html").read_text()
    titles = [c["title"] for c in _data(html)["charts"]]
    assert "rejected samples" not in titles and "response length (tokens)" not in titles
    assert ("Not drawn (nothing to see): response length (tokens): 6 at every step; rejected samples: 0 at "
            "every step.") in html
    assert "GRPO groups with one reward for all members (%)" in titles  # 12.5 or 25: drawn


def test_report_size_grows_linearly_with_steps(tmp_path: Path) -> None:
    small = write_report(grpo_dump(tmp_path / "a", 4, rows=64), tmp_path / "a.html").stat().st_size
    large = write_report(grpo_dump(tmp_path / "b", 16, rows=64), tmp_path / "b.html").stat().st_size
    per_step = (large - small) / 12
    # previews, not whole batches (64 samples, one ~10 KB text), and a search index of ~60 B a sample
    assert per_step < 18_000, per_step


def test_report_against_shows_the_first_divergence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = grpo_dump(tmp_path / "a", 6)
    b = grpo_dump(tmp_path / "b", 6, diverge_at=3)
    assert main(["report", str(a), "--against", str(b), "-o", str(tmp_path / "c.html")]) == 0
    html = (tmp_path / "c.html").read_text()
    assert "First differing step: <b>3</b>" in html
    divergence = _data(html)["charts"][0]
    assert divergence["title"].startswith("divergence: max |A − B| per key") and divergence["log"]
    assert divergence["series"][0]["name"] == "old_log_probs" and divergence["marks"][0]["x"] == 3
    drawn = [v for v in divergence["series"][0]["values"] if v is not None]
    lo, hi = divergence["yrange"]  # the axis reaches half a decade beyond the data: no line on an edge
    assert lo * 10**0.5 <= min(drawn) and max(drawn) * 10**0.5 <= hi
    assert "The two runs' metrics" not in html  # these dumps record no run metrics
    c = grpo_dump(tmp_path / "c", 3, loss=1.0)
    d = grpo_dump(tmp_path / "d", 3, loss=1.5)
    metrics = write_report(c, tmp_path / "m.html", against=d).read_text()
    assert "The two runs' metrics" in metrics and 'aria-label="pg_loss"' in metrics
    assert 'aria-label="pg_loss: |A − B|"' in metrics
    same = write_report(a, tmp_path / "same.html", against=a).read_text()
    assert "Identical" in same
    assert main(["report", str(a), "--against", str(tmp_path / "missing"), "-o", str(tmp_path / "x.html")]) == 2


def test_report_of_a_batch_traces_cannot_read_still_shows_its_steps(tmp_path: Path) -> None:
    class Pairs:
        def get_batch(self, data: object, global_step: int) -> object:
            return (torch.ones(3, 2), torch.zeros(3))

    with MockScheduler(Pairs(), cfg(tmp_path / "d")) as mock:
        mock.get_batch(None, 0)
    step = _data(write_report(tmp_path / "d", tmp_path / "r.html").read_text())["steps"]["0"]
    assert step["traces"] == [] and step["note"].startswith("no sample previews: ")


def test_browser_offers_a_bounded_spread_of_steps() -> None:
    from rollout_mock.debug.report import MAX_BROWSER_STEPS, browsable

    steps = list(range(0, 5000, 2))
    shown = browsable(steps)
    assert len(shown) == MAX_BROWSER_STEPS and {0, 4998} <= shown and shown <= set(steps)
    assert browsable(steps[:10]) == set(steps[:10])


def test_report_against_a_mock_runs_metrics_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`report DUMP --against METRICS`: the dump run's recorded metrics against another run's file
    (the picture of a failed precision check), bitwise."""
    from rollout_mock.compare.expected import MetricsWriter

    dump = grpo_dump(tmp_path / "d", 4, loss=1.0)
    same, drifted = tmp_path / "same.jsonl", tmp_path / "drifted.jsonl"
    for path, eps in ((same, 0.0), (drifted, 1e-9)):
        with MetricsWriter(path) as log:
            for step in range(4):
                log.log(step, {"pg_loss": 1.0 / (step + 1) + (eps if step >= 2 else 0.0)})
    html = write_report(dump, tmp_path / "same.html", against=same).read_text()
    assert "Identical: every metric at every step is bit-identical" in html and 'aria-label="pg_loss"' in html
    assert main(["report", str(dump), "--against", str(drifted), "-o", str(tmp_path / "drift.html")]) == 0
    html = (tmp_path / "drift.html").read_text()
    assert f"First divergence: step <b>2</b>, <b>pg_loss</b>: A = {1 / 3!r}, B = {1 / 3 + 1e-9!r}" in html
    gap = next(c for c in _data(html)["charts"] if c["title"] == "pg_loss: |A − B|")  # the drift, visible
    assert gap["log"] and gap["marks"] == [{"x": 2, "label": "first divergence: step 2"}]
    assert gap["series"][0]["values"][:2] == [None, None] and 1e-10 < gap["series"][0]["values"][2] < 1e-8
    assert gap["yrange"][0] <= 1e-10 and gap["yrange"][1] >= 1e-8
    bare = grpo_dump(tmp_path / "bare", 2)  # a dump without its run's metrics: nothing to compare
    assert main(["report", str(bare), "--against", str(same), "-o", str(tmp_path / "x.html")]) == 2
    assert "holds no metrics of its dump run" in capsys.readouterr().err


# ------------------------------------------------------------------ empty splits, bad steps, progress
class ValOnly:
    """verl's trainer with validation only (``val_only`` / ``val_before_train`` then a crash)."""

    def get_batch(self, data: object, global_step: int) -> dict[str, object]:
        return {"input_ids": torch.ones(4, 3, dtype=torch.long), "rewards": torch.tensor([0.0, 1.0, 1.0, 0.5])}


def test_a_split_with_no_step_is_said_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = MockScheduler(VerlLike(), cfg(tmp_path / "d"), split="train")
    val = MockScheduler(ValOnly(), cfg(tmp_path / "d"), split="val")
    with train, val:  # verl's wrapper: one scheduler per split, the train one never called
        for step in range(2):
            val.get_batch(None, step)
    out = tmp_path / "r.html"
    # the default split: train has no step, val has: the val report (was an empty page)
    assert main(["report", str(tmp_path / "d"), "-o", str(out)]) == 0
    data = _data(out.read_text())
    assert sorted(data["steps"]) == ["0", "1"] and data["split"] == "val" and "stream val" in out.read_text()
    out.unlink()
    assert main(["report", str(tmp_path / "d"), "--split", "train", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "stream train has no recorded steps: nothing to report; pick one with --split (val (2 steps))" in err
    assert "nothing written" in err and not out.exists()
    with pytest.raises(DebugInputError, match="has no recorded steps"):
        write_report(tmp_path / "d", out, split="train")


def test_a_truncated_step_is_marked_and_the_others_shown(dump: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    step_file = next((dump / "train").glob("step_000001.*"))
    step_file.write_bytes(step_file.read_bytes()[: step_file.stat().st_size // 2])
    out = tmp_path / "r.html"
    assert main(["report", str(dump), "-o", str(out)]) == 1  # was 2, and no report
    err = capsys.readouterr().err
    assert "1 step could not be read (1; first: step 1: CorruptStepError" in err and "marked in the page" in err
    html = out.read_text()
    data = _data(html)
    assert data["steps"]["1"]["error"].startswith("CorruptStepError") and data["steps"]["1"]["traces"] == []
    assert len(data["steps"]["0"]["traces"]) == 4 and len(data["steps"]["2"]["traces"]) == 4
    assert data["charts"][0]["series"][0]["values"] == [0.4375, None, 2.4375]  # a gap at the bad step
    assert "1 step could not be read</b>" in html and '<tr class="bad"><td>1</td><td>unreadable</td>' in html


def test_report_has_a_progress_bar_over_the_steps(dump: Path, tmp_path: Path,
                                                 progress_spy: list[dict[str, object]]) -> None:
    assert main(["report", str(dump), "-o", str(tmp_path / "r.html")]) == 0
    assert progress_spy == [{"total": 3, "updates": 3, "enabled": None, "unit": "step", "unit_scale": False,
                             "desc": "report"}]  # on a terminal only (None), one tick per step
    progress_spy.clear()
    assert main(["report", str(dump), "-o", str(tmp_path / "r.html"), "--no-progress"]) == 0
    assert progress_spy[0]["enabled"] is False

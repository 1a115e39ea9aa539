"""The HTML report: self-contained, escaped, and working in a real headless browser."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cfg

from rollout_mock import MockScheduler
from rollout_mock.cli import main
from rollout_mock.debug import write_report

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
    out = write_report(dump, tmp_path / "r.html")
    html = out.read_text()
    assert "alert(1)</script>" not in html and "<img src=x" not in html
    # our own two script elements, nothing else closes a script
    assert html.count("</script>") == 2
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched
    assert "<svg" in html and "reward" in html
    data = json.loads(re.search(r'id="rm-data">(.*?)</script>', html, re.S).group(1))
    assert sorted(data["steps"]) == ["0", "1", "2"]
    assert data["steps"]["2"]["traces"][1]["messages"][0]["content"] == EVIL  # kept as data, intact
    assert data["steps"]["0"]["traces"][2]["reward"] == 1.0


def test_report_cli_with_logprobs_json(dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lp = tmp_path / "lp.json"
    lp.write_text(json.dumps({"steps": [{"step": s, "token_mult_prob_error": 1.0 + s / 10} for s in range(3)]}))
    assert main(["report", str(dump), "-o", str(tmp_path / "r.html"), "--logprobs-json", str(lp)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert "token_mult_prob_error" in (tmp_path / "r.html").read_text()
    assert main(["report", str(tmp_path / "missing"), "-o", str(tmp_path / "x.html")]) == 2


def _browser() -> tuple[object, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium); Playwright's own download does not work here")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install rollout_mock[report])")
    return sync_playwright, chromium


def _open(p: object, chromium: str, url: str, errors: list[str], requests: list[str],
          dialogs: list[str] | None = None) -> tuple[object, object]:
    browser = p.chromium.launch(executable_path=chromium,  # type: ignore[attr-defined]
                                args=["--headless", "--no-sandbox", "--disable-background-networking"])
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    if dialogs is not None:
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: requests.append(r.url) if not r.url.startswith("file:") else None)
    page.goto(url, timeout=30_000)
    return browser, page


@pytest.mark.slow
def test_report_renders_in_a_headless_browser(dump: Path, tmp_path: Path) -> None:
    sync_playwright, chromium = _browser()
    out = write_report(dump, tmp_path / "r.html")
    errors: list[str] = []
    dialogs: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:  # type: ignore[operator]
        browser, page = _open(p, chromium, out.as_uri(), errors, requests, dialogs)
        try:
            page.select_option("#step", "2")
            items = page.locator("#samples li")
            assert items.count() == 4
            items.nth(1).click()
            detail = page.locator("#detail").inner_text(timeout=5_000)
            assert "step 2, sample 1" in detail
            assert EVIL in detail  # shown as text
            assert page.locator("svg.chart").count() >= 3
        finally:
            browser.close()
    assert errors == [] and dialogs == [] and requests == []


@pytest.mark.slow
def test_report_sorts_searches_and_compares_in_a_browser(tmp_path: Path) -> None:
    """Charts and tables render, the samples sort and filter, the comparison shows; screenshots
    go to ``$ROLLOUT_MOCK_REPORT_SHOTS`` when set (to look at them)."""
    sync_playwright, chromium = _browser()
    a = grpo_dump(tmp_path / "a", 12)
    b = grpo_dump(tmp_path / "b", 12, diverge_at=5)
    single = write_report(a, tmp_path / "r.html")
    compared = write_report(a, tmp_path / "c.html", against=b)
    shots = os.environ.get("ROLLOUT_MOCK_REPORT_SHOTS")
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:  # type: ignore[operator]
        browser, page = _open(p, chromium, single.as_uri(), errors, requests)
        try:
            assert page.locator("svg.chart").count() >= 5
            assert page.locator("svg.chart polygon").count() >= 4  # distribution bands drawn
            assert page.locator("#keystats table tr").count() >= 5
            assert page.locator("#hists svg.chart rect").count() >= 3  # this step's histograms
            page.select_option("#step", "3")
            items = page.locator("#samples li")
            assert items.count() == 12
            page.locator(".shead button", has_text="reward").click()  # ascending reward
            rewards = [float(x) for x in page.locator("#samples li > span:nth-child(2)").all_inner_texts()]
            assert rewards == sorted(rewards)
            page.fill("#filter", "prompt 1")
            assert 0 < items.count() < 12
            page.locator("#groups a", has_text="q1").first.click()  # a GRPO group: its members only
            assert page.input_value("#filter") == "uid:q1"
            assert items.count() >= 1 and all(u == "q1" for u in page.locator("#samples li > span:nth-child(4)")
                                              .all_inner_texts())
            page.fill("#filter", "")
            if shots:
                page.screenshot(path=f"{shots}/report.png", full_page=True)
            page.goto(compared.as_uri(), timeout=30_000)
            assert "First differing step: 5" in page.locator("body").inner_text()
            assert page.locator("svg.chart").count() >= 7
            if shots:
                page.screenshot(path=f"{shots}/report-against.png", full_page=True)
        finally:
            browser.close()
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
    ticks = re.findall(r'class="tick" text-anchor="end">([^<]*)<', html)
    assert ticks and all(len(t.replace("-", "").replace(".", "").lstrip("0")) <= 3 for t in ticks), ticks
    assert 'class="legend">min–max<' in html and 'class="legend">mean<' in html
    data = _data(html)
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


def test_report_size_grows_linearly_with_steps(tmp_path: Path) -> None:
    small = write_report(grpo_dump(tmp_path / "a", 4, rows=64), tmp_path / "a.html").stat().st_size
    large = write_report(grpo_dump(tmp_path / "b", 16, rows=64), tmp_path / "b.html").stat().st_size
    per_step = (large - small) / 12
    assert per_step < 12_000, per_step  # previews, not whole batches (64 samples, one ~10 KB text)


def test_report_against_shows_the_first_divergence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = grpo_dump(tmp_path / "a", 6)
    b = grpo_dump(tmp_path / "b", 6, diverge_at=3)
    assert main(["report", str(a), "--against", str(b), "-o", str(tmp_path / "c.html")]) == 0
    html = (tmp_path / "c.html").read_text()
    assert "First differing step: <b>3</b>" in html
    assert "old_log_probs" in html and "divergence: max |A − B| per key" in html
    assert "The two runs' metrics" not in html  # these dumps record no run metrics
    c = grpo_dump(tmp_path / "c", 3, loss=1.0)
    d = grpo_dump(tmp_path / "d", 3, loss=1.5)
    metrics = write_report(c, tmp_path / "m.html", against=d).read_text()
    assert "The two runs' metrics" in metrics and 'aria-label="pg_loss"' in metrics
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
    bare = grpo_dump(tmp_path / "bare", 2)  # a dump without its run's metrics: nothing to compare
    assert main(["report", str(bare), "--against", str(same), "-o", str(tmp_path / "x.html")]) == 2
    assert "holds no metrics of its dump run" in capsys.readouterr().err

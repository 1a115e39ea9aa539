"""`rollout-mock report` gives a full report for every framework's real batch shape: verl, ROLL,
AReaL, slime and TRL (reward, response-length and token log-prob charts, tensor statistics, GRPO
groups, a search index over every sample, previews with readable messages), and each page works
in a real browser with no script error and no request. ``$ROLLOUT_MOCK_REPORT_SHOTS``: a folder
the browser test saves its screenshots to (one per framework, and a comparison)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HANG_S
from report_cases import GROUP, framework_dump, install_roll, open_page, run_metrics, trl_batch
from report_cases import browser as get_browser

from rollout_mock import open_dump
from rollout_mock.adapters.trl import RECORD_FORMAT as TRL_FORMAT
from rollout_mock.debug import write_report

FRAMEWORKS = ["verl", "roll", "areal", "slime", "trl"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def roll_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """ROLL's DataProto (the double) importable at ROLL's module path, as on a ROLL machine."""
    install_roll(tmp_path / "rollpkg")
    monkeypatch.syspath_prepend(str(tmp_path / "rollpkg"))
    yield
    for name in [m for m in sys.modules if m == "roll" or m.startswith("roll.")]:
        del sys.modules[name]


def _data(html: str) -> dict[str, Any]:
    return json.loads(re.search(r'id="rm-data">(.*?)</script>', html, re.S).group(1))


def _report(tmp_path: Path, framework: str, steps: int = 6) -> dict[str, Any]:
    dump = framework_dump(tmp_path / framework, framework, steps)
    return _data(write_report(dump, tmp_path / f"{framework}.html").read_text())


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_framework_gets_a_full_report(tmp_path: Path, framework: str, roll_on_path: None) -> None:
    data = _report(tmp_path, framework)
    titles = [c["title"] for c in data["charts"]]
    assert titles[:3] == ["reward", "response length (tokens)", "response token log-prob"], titles
    assert "GRPO groups with one reward for all members (%)" in titles
    step = data["steps"]["3"]
    rows = 17 if framework == "areal" else 16  # AReaL: 16 trajectories' rows and one rejected trajectory
    assert step["total"] == step["read"] == step["rows"]["n"] == rows
    assert step["rejected"] == (1 if framework in ("areal", "slime") else 0)
    assert all(step["hist"][name] for name in ("reward", "length", "logprob")), step["hist"]
    keys = {k["key"] for k in step["keys"]}
    assert keys & {"rollout_log_probs", "infer_logprobs", "logprobs"}, keys  # was "no numeric tensors" for AReaL
    assert step["groups"]["groups"] == 4 and step["groups"]["flat"] >= 1
    assert sorted(step["rows"]["uids"]) == sorted({str(u) for u in step["rows"]["uids"]}) and step["rows"]["u"]
    preview = next(t for t in step["traces"] if t["status"] == "ok")
    roles = [m["role"] for m in preview["messages"]]
    assert roles == ["user", "assistant"], roles  # ROLL: its [B, L] response_mask read over the response
    assert preview["length"] == preview["messages"][-1]["tokens"] or framework == "slime"


def test_log_probs_are_the_generated_tokens_only(tmp_path: Path, roll_on_path: None) -> None:
    """Each framework's own mask: verl's response_mask, ROLL's token-aligned [:, 1:] against its
    [B, L] mask, AReaL's loss_mask per trajectory, slime's per-sample lists, TRL's lists."""
    from report_cases import _pairs

    generated = sum(len(r) for _, r, _ in _pairs(3, 16))
    for framework in FRAMEWORKS:
        counts = _report(tmp_path, framework)["steps"]["3"]["hist"]["logprob"]["counts"]
        assert sum(counts) == generated, framework


def test_trl_records_read_as_trl_sums_them(tmp_path: Path) -> None:
    record = trl_batch(3)
    record["rewards"]["rewards_per_func"] = torch.tensor([[1.0, float("nan")], [0.5, 0.25]] * 8)
    record["generate"]["output"][3][0] = [{"role": "assistant", "content": "a chat completion"}]
    dump = tmp_path / "d"
    framework_dump(dump, "trl", 1)
    from rollout_mock import MockScheduler

    class One:
        def get_batch(self, data: object, global_step: int) -> Any:
            return record

    with MockScheduler(One(), {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "e")}) as mock:
        mock.get_batch(None, 0)
    assert open_dump(tmp_path / "e").load(0, "train")["format"] == TRL_FORMAT
    step = _data(write_report(tmp_path / "e", tmp_path / "r.html").read_text())["steps"]["0"]
    assert step["rows"]["r"][:2] == [1.0, 0.75]  # nansum over the reward functions, as TRL sums them
    assert step["traces"][0]["messages"][-1]["content"] == "a chat completion"  # the text, not its ids
    assert step["traces"][1]["messages"][-1]["content"] == "completion 1 of step 3"
    assert [step["rows"]["uids"][u] for u in step["rows"]["u"]] == [f"p{i // GROUP}" for i in range(16)]


def test_slime_eval_records_are_their_samples(tmp_path: Path) -> None:
    """slime's evaluation output (``{"kind": "eval", "data": {dataset: {"samples": [...]}}}``,
    recorded in the val split): its samples, grouped by ``group_index``."""
    from report_cases import slime_batch

    from rollout_mock import MockScheduler

    def evaluation(step: int) -> Any:
        samples = [s for group in slime_batch(step)["samples"] for s in group]
        return {"format": "rollout_mock.slime", "kind": "eval", "metrics": None,
                "data": {"math": {"samples": samples[:8]}, "code": {"samples": samples[8:]}}}

    class Eval:
        def get_batch(self, data: object, global_step: int) -> Any:
            return evaluation(global_step)

    with MockScheduler(Eval(), {"enable": True, "mode": "dump", "dump_dir": str(tmp_path / "d")}, split="val") as mock:
        for step in range(3):
            mock.get_batch(None, step)
    data = _data(write_report(tmp_path / "d", tmp_path / "r.html").read_text())  # val: the only split with steps
    step = data["steps"]["1"]
    assert data["split"] == "val" and step["read"] == step["rows"]["n"] == 16 and step["rejected"] == 1
    assert step["groups"]["groups"] == 4 and step["hist"]["logprob"] and step["traces"][0]["messages"]


@pytest.mark.slow
def test_a_real_trl_run_gets_a_full_report(tmp_path: Path) -> None:
    """A real TRL GRPO run (tests/integration/trl_run.py: a tiny local model, 3 steps on the CPU)."""
    pytest.importorskip("trl", reason="TRL is not installed (pip install 'rollout_mock[test]')")
    pytest.importorskip("datasets", reason="datasets is not installed (pip install 'rollout_mock[test]')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(REPO / "tests" / "integration" / "trl_run.py"), str(tmp_path / "o.json"),
                          "dump", str(tmp_path / "dump"), "--max-steps", "3"],
                         capture_output=True, text=True, timeout=HANG_S, env=env, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    data = _data(write_report(tmp_path / "dump", tmp_path / "r.html").read_text())
    step = data["steps"]["0"]
    assert step["read"] == step["rows"]["n"] == 8 and step["groups"]["groups"] == 2
    assert step["dist"] if "dist" in step else step["hist"]["reward"] and step["hist"]["length"]
    assert all(t["messages"][-1]["role"] == "assistant" and not t["messages"][-1]["content"].startswith("[")
               for t in step["traces"])  # the completion texts
    assert {"prompts", "responses", "rewards"} <= {k["key"] for k in step["keys"]}


@pytest.mark.slow
def test_framework_reports_and_a_comparison_in_a_real_browser(tmp_path: Path, roll_on_path: None) -> None:
    sync_playwright, chromium = get_browser()
    pages = {fw: write_report(framework_dump(tmp_path / fw, fw, 12), tmp_path / f"{fw}.html") for fw in FRAMEWORKS}
    # a precision divergence: B's log-probs and pg_loss drift by 1e-8 from step 5 on
    a = framework_dump(tmp_path / "verl-a", "verl", 12, metrics=run_metrics)
    b = framework_dump(tmp_path / "verl-b", "verl-drifted", 12, metrics=lambda s: run_metrics(s, 1e-8))
    pages["comparison"] = write_report(a, tmp_path / "comparison.html", against=b)
    shots = os.environ.get("ROLLOUT_MOCK_REPORT_SHOTS")
    with sync_playwright() as p:  # type: ignore[operator]
        for name, path in pages.items():
            errors: list[str] = []
            requests: list[str] = []
            b, page = open_page(p, chromium, path.as_uri(), errors, requests)
            try:
                assert page.locator(".chart canvas").count() >= 4, name
                if name == "comparison":
                    text = page.inner_text("body")
                    assert "First differing step: 5" in text and "rollout_log_probs" in text
                    assert page.locator('.chart[aria-label="pg_loss: |A − B|"] canvas').count() == 1
                assert page.locator("#samples li").count() == (17 if name == "areal" else 16), name
                # the third GRPO group: verl's and TRL's uid strings, ROLL's prompt_id, AReaL's
                # trajectory, slime's group
                page.fill("#filter", "uid:p2" if name in ("verl", "trl", "comparison") else "uid:2")
                assert page.locator("#samples li").count() == 4, name
                assert "no numeric tensors" not in page.inner_text("#keystats")
                page.fill("#filter", "")
                if shots:
                    page.screenshot(path=f"{shots}/report-{name}.png", full_page=True)
            finally:
                b.close()
            assert errors == [] and requests == [], (name, errors, requests)


def test_a_long_text_field_wraps_in_the_detail_pane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's ``response_text`` (one long line) in the selected sample's JSON made the page 2,669 px
    wide in a 1,400 px window: it wraps, the page never scrolls sideways."""
    import numpy as np
    from report_cases import BUILDERS, verl_fields

    def with_text(step: int) -> Any:
        tensors, others = verl_fields(step)
        n = len(others["uid"])
        others["response_text"] = np.array(["x" * 3000 + f" row {i}" for i in range(n)] + [None], dtype=object)[:n]
        return {**tensors, **others}

    monkeypatch.setitem(BUILDERS, "verl-text", with_text)
    page_file = write_report(framework_dump(tmp_path / "d", "verl-text", 3), tmp_path / "text.html")
    sync_playwright, chromium = get_browser()
    with sync_playwright() as p:  # type: ignore[operator]
        errors: list[str] = []
        requests: list[str] = []
        b, page = open_page(p, chromium, page_file.as_uri(), errors, requests)
        try:
            page.locator("#samples li").nth(1).click()
            detail = page.locator("#detail").inner_text(timeout=HANG_S * 1000)
            assert "xxxxxxxx" in detail
            shots = os.environ.get("ROLLOUT_MOCK_REPORT_SHOTS")
            if shots:
                page.screenshot(path=f"{shots}/report-long-text.png", full_page=True)
            width, window = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            assert width <= window, (width, window)
        finally:
            b.close()
        assert errors == [] and requests == [], (errors, requests)


def test_a_comparison_of_four_runs_overlays_them_in_a_real_browser(tmp_path: Path) -> None:
    """`report A --against B C D`: every run in its own colour, |X − A| per metric, and where each
    run first differs from A; two dumps, a dump and a metrics file (a mock run's) against A."""
    a = framework_dump(tmp_path / "a", "verl", 8, metrics=run_metrics)
    b = framework_dump(tmp_path / "b", "verl", 8, metrics=run_metrics)  # identical to A
    c = framework_dump(tmp_path / "c", "verl-drifted", 8, metrics=lambda s: run_metrics(s, 1e-8))
    d = tmp_path / "d-metrics.jsonl"
    d.write_text("".join(json.dumps({"step": s, **run_metrics(s, 1e-3 if s >= 6 else 0.0)}) + "\n" for s in range(8)))
    out = tmp_path / "four.html"
    from rollout_mock.cli import main

    assert main(["report", str(a), "--against", str(b), str(c), str(d), "-o", str(out), "--no-progress"]) == 0
    html = out.read_text()
    data = _data(html)
    gaps = next(chart for chart in data["charts"] if chart["title"] == "pg_loss: |X − A|")
    assert [s["name"] for s in gaps["series"]] == ["|B − A|", "|C − A|", "|D − A|"], gaps["series"]
    overlay = next(chart for chart in data["charts"] if chart["title"] == "pg_loss")
    assert [s["name"] for s in overlay["series"]] == ["A", "B", "C", "D"]
    assert len({s["color"] for s in overlay["series"]}) == 4  # one colour each
    verdicts = re.search(r'<ul id="overlay">(.*?)</ul>', html, re.S).group(1)
    assert "<b>B</b>" in verdicts and "identical to A" in verdicts.split("<b>C</b>")[0]
    assert "first differing step 5" in verdicts and "first divergence at step 6, pg_loss" in verdicts

    sync_playwright, chromium = get_browser()
    with sync_playwright() as p:  # type: ignore[operator]
        errors: list[str] = []
        requests: list[str] = []
        browser, page = open_page(p, chromium, out.as_uri(), errors, requests)
        try:
            assert page.locator('.chart[aria-label="pg_loss: |X − A|"] canvas').count() == 1
            assert "Comparison of 4 runs" in page.inner_text("body")
            shots = os.environ.get("ROLLOUT_MOCK_REPORT_SHOTS")
            if shots:
                page.screenshot(path=f"{shots}/report-four-runs.png", full_page=True)
        finally:
            browser.close()
        assert errors == [] and requests == [], (errors, requests)


def test_a_check_mode_run_shows_its_verdicts_in_a_real_browser(tmp_path: Path) -> None:
    """A dump, then a check-mode run whose engine drifted from step 2 on: the report's "Check
    mode" section (a chart of the match, a row per step) renders with no script error."""
    from report_cases import BUILDERS

    from rollout_mock import MockScheduler

    dump = framework_dump(tmp_path / "d", "verl", 4)

    class Drifted:
        def get_batch(self, data: Any, global_step: int) -> Any:  # the dump run's signature: same call
            return BUILDERS["verl"](global_step) if global_step < 2 else BUILDERS["verl-drifted"](global_step + 3)

    with MockScheduler(Drifted(), {"enable": True, "mode": "check", "dump_dir": str(dump)}) as mock:
        for step in range(4):
            mock.get_batch(None, step)
    page_file = write_report(dump, tmp_path / "check.html")
    sync_playwright, chromium = get_browser()
    with sync_playwright() as p:  # type: ignore[operator]
        errors: list[str] = []
        requests: list[str] = []
        b, page = open_page(p, chromium, page_file.as_uri(), errors, requests)
        try:
            assert page.locator('.chart[aria-label="check mode: match with the recording"] canvas').count() == 1
            rows = page.locator("#checktable tr").all_inner_texts()[1:]
            assert [r.split("\t")[0] for r in rows] == ["0", "1", "2", "3"], rows
            assert rows[0].split("\t")[4] == "equal" and rows[2].split("\t")[4] == "differs", rows
            assert "(differs: match " in rows[2] and " more" in rows[2], rows
            shots = os.environ.get("ROLLOUT_MOCK_REPORT_SHOTS")
            if shots:
                page.screenshot(path=f"{shots}/report-check-mode.png", full_page=True)
        finally:
            b.close()
        assert errors == [] and requests == [], (errors, requests)

"""``rollout-mock verify`` end to end on real files, and the PNG plot."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_S

from rollout_mock import MetricsWriter, MissingExtraError, cli, read_metrics, verify

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    # Only the verify command is loaded, so these tests do not depend on the other subcommands.
    monkeypatch.setattr(cli, "COMMANDS", {"verify": "verify"})
    code = cli.main(["verify", *args])
    out, err = capsys.readouterr()
    return code, out, err


def write_run(path: Path, loss: dict[int, float], kl: dict[int, float] | None = None) -> Path:
    with MetricsWriter(path / "metrics.jsonl") as w:
        for step, value in loss.items():
            metrics = {"loss": value}
            if kl is not None and step in kl:
                metrics["kl"] = kl[step]
            w.log(step, metrics)
    return path / "metrics.jsonl"


LOSS = {s: 1.0 / (s + 1) for s in range(10)}
KL = {s: s * 0.001 for s in range(10)}


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    diverged = dict(LOSS)
    diverged[6] = math.nextafter(LOSS[6], 1.0)
    diverged[8] = LOSS[8] + 1e-3
    return {
        "base": write_run(tmp_path / "base", LOSS, KL),
        "same": write_run(tmp_path / "same", LOSS, KL),
        "diverged": write_run(tmp_path / "diverged", diverged, KL),
    }


def test_identical_runs_exit_0(runs: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run_cli([str(runs["base"]), str(runs["same"].parent)], capsys, monkeypatch)
    assert code == 0, err
    assert out.startswith("rollout-mock verify: OK\n")
    assert err == ""


def test_divergence_exit_1_names_step_and_values(runs: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_cli([str(runs["base"]), str(runs["diverged"])], capsys, monkeypatch)
    assert code == 1
    assert "FAIL (1 of 2 metrics differ)" in out
    assert f"step 6: baseline={LOSS[6]!r} candidate={math.nextafter(LOSS[6], 1.0)!r}" in out


def test_tolerances(runs: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    base, div = str(runs["base"]), str(runs["diverged"])
    code, out, _ = run_cli([base, div, "--rtol", "1e-12"], capsys, monkeypatch)
    assert code == 1 and "step 8:" in out  # the 1-ulp change passes, the 1e-3 one does not
    assert run_cli([base, div, "--atol", "1e-2"], capsys, monkeypatch)[0] == 0
    assert run_cli([base, div, "--atol", "loss=1e-2"], capsys, monkeypatch)[0] == 0
    assert run_cli([base, div, "--atol", "kl=1e-2"], capsys, monkeypatch)[0] == 1
    code, out, _ = run_cli([base, div, "--atol", "1e-2", "--atol", "loss=0"], capsys, monkeypatch)
    assert code == 1 and "step 6:" in out  # the per-metric value overrides the default


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rtol", "abc"], "--rtol 'abc': expected FLOAT or METRIC=FLOAT"),
        (["--atol", "-1"], "--atol '-1': tolerance must be a finite number >= 0"),
        (["--atol", "1", "--atol", "2"], "--atol given twice without a metric name"),
        (["--atol", "=1"], "--atol '=1': empty metric name"),
        (["--atol", "nope=1"], "atol given for unknown metric(s) 'nope'; compared metrics: kl, loss"),
        (["--metrics", "loss,nope"], "metric(s) 'nope' not logged by either run; available: kl, loss"),
        (["--metrics", ","], "--metrics ',': no metric names given"),
    ],
)
def test_bad_options_exit_2(runs: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, extra: list[str], message: str) -> None:
    code, out, err = run_cli([str(runs["base"]), str(runs["same"]), *extra], capsys, monkeypatch)
    assert code == 2 and out == ""
    assert err.startswith(f"rollout-mock verify: error: {message}")
    assert err.count("\n") == 1


def test_metrics_selection(runs: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_cli([str(runs["base"]), str(runs["diverged"]), "--metrics", "kl"], capsys, monkeypatch)
    assert code == 0 and "loss" not in out


def test_json_output(runs: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_cli([str(runs["base"]), str(runs["diverged"]), "--json"], capsys, monkeypatch)
    assert code == 1
    data = json.loads(out)
    assert data["ok"] is False and data["plot"] is None
    loss = data["metrics"]["loss"]
    assert loss["first_divergent_step"] == 6 and loss["divergent_steps"] == 2 and loss["ok"] is False
    assert loss["baseline_value"] == LOSS[6]
    assert data["metrics"]["kl"]["ok"] is True
    assert data["baseline"] == str(runs["base"])


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.jsonl", None, "no such metrics file or run directory"),
        ("garbage.jsonl", '{"step": 0, "loss": 1}\nnot json\n{"step": 1, "loss": 1}\n', ":2: malformed metrics line"),
        ("nostep.csv", "loss,kl\n1,2\n", ":1: CSV header has no 'step' column"),
        ("odd.txt", "x", "unknown metrics file type"),
    ],
)
def test_bad_input_exit_2_without_traceback(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    name: str, content: str | None, message: str,
) -> None:
    bad = tmp_path / name
    if content is not None:
        bad.write_text(content)
    for args in ([str(runs["base"]), str(bad)], [str(bad), str(runs["base"])]):
        code, out, err = run_cli(args, capsys, monkeypatch)
        assert code == 2 and out == ""
        assert err.startswith(f"rollout-mock verify: error: {bad}") and message in err
        assert "Traceback" not in err and err.count("\n") == 1


def test_torn_last_line_warns_and_passes(runs: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    torn = runs["same"]
    with torn.open("a") as f:
        f.write('{"step": 10, "loss": 0.0')
    code, out, err = run_cli([str(runs["base"]), str(torn)], capsys, monkeypatch)
    assert code == 0
    assert err.startswith(f"rollout-mock verify: warning: {torn}:11: skipping incomplete last line")


def test_plot_written(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "out" / "verify.png"
    code, out, _ = run_cli([str(runs["base"]), str(runs["diverged"]), "--plot", str(png)], capsys, monkeypatch)
    assert code == 1
    assert f"plot: {png}" in out
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert [p.name for p in png.parent.iterdir()] == ["verify.png"]  # no temporary file left behind


def test_plot_report_with_one_sided_steps_and_no_common_metric(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from rollout_mock.compare.plot import plot_report

    base = read_metrics(write_run(tmp_path / "b", LOSS, KL))
    cand = read_metrics(write_run(tmp_path / "c", {s: v for s, v in LOSS.items() if s < 7}, KL))
    report = verify(base, cand)
    assert plot_report(base, cand, report, tmp_path / "p.png", max_metrics=1).read_bytes().startswith(PNG_MAGIC)
    other = read_metrics(tmp_path / "c")
    lone = verify(base, other, metrics=["kl"])
    assert plot_report(base, other, lone, tmp_path / "q.png").stat().st_size > 0


def test_plot_without_matplotlib(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    code, out, err = run_cli([str(runs["base"]), str(runs["same"]), "--plot", str(tmp_path / "x.png")], capsys, monkeypatch)
    assert code == 0 and out  # the report still prints; the plot is skipped with the install hint
    assert "matplotlib is not installed" in err and "pip install 'rollout_mock[plot]'" in err
    assert not (tmp_path / "x.png").exists()
    from rollout_mock.compare.plot import plot_report

    table = read_metrics(runs["base"])
    with pytest.raises(MissingExtraError, match=r"pip install rollout_mock\[plot\]"):
        plot_report(table, table, verify(table, table), tmp_path / "x.png")


def test_console_script(runs: dict[str, Path]) -> None:
    """The installed ``rollout-mock`` entry point, in a real process."""
    script = Path(sys.executable).parent / "rollout-mock"
    if not script.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    ok = subprocess.run([str(script), "verify", str(runs["base"]), str(runs["same"])], capture_output=True, text=True, timeout=HANG_S)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([str(script), "verify", str(runs["base"]), str(runs["diverged"]), "--json"], capture_output=True, text=True, timeout=HANG_S)
    assert bad.returncode == 1, bad.stderr
    assert json.loads(bad.stdout)["metrics"]["loss"]["first_divergent_step"] == 6


def test_verify_has_a_progress_bar_over_the_bytes_read(runs: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       progress_spy: list[dict[str, object]]) -> None:
    size = runs["base"].stat().st_size + runs["diverged"].stat().st_size
    code, _, _ = run_cli([str(runs["base"]), str(runs["diverged"])], capsys, monkeypatch)
    assert code == 1
    assert progress_spy == [{"total": size, "updates": size, "enabled": None, "desc": "verify"}]
    progress_spy.clear()
    run_cli([str(runs["base"].parent), str(runs["same"]), "--no-progress"], capsys, monkeypatch)  # a run directory
    assert progress_spy[0]["enabled"] is False and progress_spy[0]["total"] == 2 * runs["base"].stat().st_size


def test_print_id_then_expected_id(runs: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_cli(["--print-id", str(runs["base"])], capsys, monkeypatch)
    pinned = out.split()[0]
    assert code == 0 and pinned.startswith("sha256:") and out.strip().endswith(str(runs["base"]))
    code, out, _ = run_cli([str(runs["base"]), str(runs["same"]), "--expected-id", pinned], capsys, monkeypatch)
    assert code == 0 and f"[{pinned}]" in out
    code, out, err = run_cli([str(runs["diverged"]), str(runs["same"]), "--expected-id", pinned], capsys, monkeypatch)
    assert code == 2 and out == "" and "changed: its content id is sha256:" in err and err.count("\n") == 1


def test_inconclusive_exits_3(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for args in ([str(runs["base"]), str(empty)], [str(empty), str(runs["base"])]):  # an empty run: 3, not 2
        code, out, _ = run_cli(args, capsys, monkeypatch)
        assert code == 3 and out.startswith("rollout-mock verify: INCONCLUSIVE (the ")
        assert " run is empty (no metric logged at any step)" in out
    code, out, _ = run_cli([str(runs["base"]), str(runs["same"]), "--min-steps", "11"], capsys, monkeypatch)
    assert code == 3 and "10 step(s) compared, fewer than the 11 required" in out
    no_kl = write_run(tmp_path / "nokl", LOSS)
    code, out, _ = run_cli([str(runs["base"]), str(no_kl), "--json"], capsys, monkeypatch)
    assert code == 3 and json.loads(out)["verdict"] == "inconclusive"


def test_verify_resume_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = write_run(tmp_path / "full", LOSS, KL)
    resumed_loss = {s: v for s, v in LOSS.items() if s >= 4}
    resumed_loss[6] = math.nextafter(resumed_loss[6], 2.0)
    good = write_run(tmp_path / "good", {s: v for s, v in LOSS.items() if s >= 4}, KL)
    bad = write_run(tmp_path / "bad", resumed_loss, KL)
    assert cli.main(["verify-resume", str(full), str(good), "--resume-step", "4"]) == 0
    assert capsys.readouterr().out.startswith("rollout-mock verify-resume: OK")
    assert cli.main(["verify-resume", str(full), str(bad), "--resume-step", "4"]) == 1
    out = capsys.readouterr().out
    assert "the resumed run differs: step 6, loss: uninterrupted run" in out
    assert "(2 step(s) after the resume at 4)" in out
    assert cli.main(["verify-resume", str(full), str(good), "--resume-step", "40"]) == 3
    assert "no step at or after the resume step 40 is in both runs" in capsys.readouterr().out

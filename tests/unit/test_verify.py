"""verify(), the report, and the pytest plugin."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_S

from rollout_mock import MetricsWriter, VerifyInputError, verify
from rollout_mock.compare.metrics import MetricsTable
from rollout_mock.compare.pytest_plugin import assert_metrics_match
from rollout_mock.compare.verify import format_report

pytest_plugins = ["pytester"]

NAN, INF = math.nan, math.inf


def table(**series: dict[int, float]) -> MetricsTable:
    return MetricsTable(series, source="mem", format="jsonl")


BASE = table(loss={0: 1.0, 1: 0.5, 2: 0.25, 3: 0.125}, kl={0: 0.0, 1: 0.01, 2: 0.02, 3: 0.03})


def test_identical_runs_pass() -> None:
    report = verify(BASE, table(**{k: dict(v) for k, v in BASE.items()}))
    assert report.ok
    loss = report.comparison("loss")
    assert (loss.steps_compared, loss.identical_steps, loss.matching_steps) == (4, 4, 4)
    assert loss.first_divergent_step is None and loss.max_abs_diff == 0.0
    assert "rollout-mock verify: OK" in format_report(report)


def test_divergence_names_first_step_and_both_values() -> None:
    cand = table(loss={0: 1.0, 1: 0.5, 2: 0.25000000000000006, 3: 0.2}, kl=dict(BASE["kl"]))
    report = verify(BASE, cand)
    assert not report.ok
    loss = report.comparison("loss")
    assert loss.first_divergent_step == 2
    assert (loss.baseline_value, loss.candidate_value) == (0.25, 0.25000000000000006)
    assert (loss.identical_steps, loss.divergent_steps) == (2, 2)
    assert loss.max_abs_diff == pytest.approx(0.075)
    assert loss.max_rel_diff == pytest.approx(0.6)
    assert report.comparison("kl").ok
    assert [c.name for c in report.failed] == ["loss"]
    text = format_report(report)
    assert "rollout-mock verify: FAIL (1 of 2 metrics differ)" in text
    assert "step 2: baseline=0.25 candidate=0.25000000000000006" in text


def test_report_table_is_aligned() -> None:
    report = verify(BASE, table(loss={0: 2.0, 1: 0.5, 2: 0.25, 3: 0.125}, kl=dict(BASE["kl"])))
    lines = format_report(report).splitlines()
    header = next(line for line in lines if line.lstrip().startswith("metric"))
    rows = [line for line in lines if line.startswith(("  kl ", "  loss "))]
    assert len(rows) == 2
    for column in ("mode", "steps", "identical", "status"):
        assert {r[header.index(column) - 1] for r in rows} == {" "}
    assert {r.split()[0]: r.split()[6] for r in rows} == {"loss": "FAIL", "kl": "ok"}


def test_missing_steps_fail_on_either_side() -> None:
    cand = table(loss={0: 1.0, 1: 0.5, 2: 0.25, 7: 9.0}, kl=dict(BASE["kl"]))
    report = verify(BASE, cand)
    loss = report.comparison("loss")
    assert not report.ok and not loss.ok
    assert loss.first_divergent_step is None
    assert loss.missing_in_candidate == (3,) and loss.missing_in_baseline == (7,)
    text = format_report(report)
    assert "loss: steps missing in candidate: 3" in text
    assert "loss: steps missing in baseline: 7" in text
    assert "steps differ (below)" in text


def test_many_missing_steps_are_elided() -> None:
    report = verify(table(a=dict.fromkeys(range(30), 1.0)), table(a={0: 1.0}))
    assert "a: steps missing in candidate: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ... (19 more)" in format_report(report)


@pytest.mark.parametrize(
    ("b", "c", "same"),
    [
        (NAN, NAN, True),
        (NAN, float("-nan"), True),
        (NAN, 1.0, False),
        (1.0, NAN, False),
        (INF, INF, True),
        (-INF, -INF, True),
        (INF, -INF, False),
        (INF, 1e308, False),
        (0.0, -0.0, False),  # bitwise: the sign of zero is a real difference
        (-0.0, -0.0, True),
        (5e-324, 0.0, False),
    ],
)
def test_bitwise_special_values(b: float, c: float, same: bool) -> None:
    report = verify(table(x={0: b}), table(x={0: c}))
    assert report.ok is same
    x = report.comparison("x")
    assert x.identical_steps == int(same)
    if not same:
        assert x.first_divergent_step == 0
        assert repr(x.baseline_value) == repr(b) and repr(x.candidate_value) == repr(c)


@pytest.mark.parametrize(
    ("b", "c", "rtol", "atol", "ok"),
    [
        (1.0, 1.0 + 1e-9, 1e-8, 0.0, True),
        (1.0, 1.0 + 1e-7, 1e-8, 0.0, False),
        (0.0, 1e-9, 1e-3, 0.0, False),  # rtol alone never forgives a zero baseline
        (0.0, 1e-9, 0.0, 1e-8, True),
        (100.0, 101.0, 0.01, 0.0, True),  # relative to the baseline: 1 <= 0.01 * 100
        (101.0, 100.0, 0.0, 0.99, False),
        (0.0, -0.0, 0.0, 1e-12, True),  # any tolerance: only the magnitude matters
        (NAN, NAN, 1.0, 1.0, True),
        (NAN, 1.0, 1.0, 1.0, False),
        (INF, INF, 1.0, 1.0, True),
        (INF, 1e308, 1.0, 1.0, False),
        (-INF, INF, 1.0, 1.0, False),
    ],
)
def test_tolerance(b: float, c: float, rtol: float, atol: float, ok: bool) -> None:
    report = verify(table(x={0: b}), table(x={0: c}), rtol=rtol, atol=atol)
    assert report.ok is ok
    x = report.comparison("x")
    assert x.matching_steps == int(ok)


def test_stats_with_infinities_and_nan() -> None:
    report = verify(table(x={0: 1.0, 1: NAN, 2: 0.0, 3: INF}), table(x={0: 1.5, 1: 2.0, 2: 0.0, 3: INF}))
    x = report.comparison("x")
    assert x.max_abs_diff == 0.5 and x.max_rel_diff == 0.5  # NaN pairs are left out of the stats
    assert x.first_divergent_step == 0 and x.divergent_steps == 2
    report = verify(table(x={0: 0.0, 1: 1.0}), table(x={0: 1e-3, 1: INF}))
    assert report.comparison("x").max_abs_diff == INF and report.comparison("x").max_rel_diff == INF


def test_per_metric_tolerance() -> None:
    cand = table(loss={0: 1.0, 1: 0.5, 2: 0.25 + 1e-12, 3: 0.125}, kl={0: 0.0, 1: 0.01, 2: 0.02, 3: 0.03 + 1e-12})
    assert not verify(BASE, cand).ok
    assert not verify(BASE, cand, atol={"loss": 1e-9}).ok  # kl stays bitwise
    report = verify(BASE, cand, atol={"loss": 1e-9, "kl": 1e-9})
    assert report.ok and report.comparison("kl").atol == 1e-9 and report.comparison("kl").identical_steps == 3
    with pytest.raises(VerifyInputError, match="atol given for unknown metric\\(s\\) 'los'; compared metrics: kl, loss"):
        verify(BASE, cand, atol={"los": 1.0})
    with pytest.raises(VerifyInputError, match="^rtol must be a finite number >= 0, got -1.0$"):
        verify(BASE, cand, rtol=-1.0)
    with pytest.raises(VerifyInputError, match="^atol for 'kl' must be a finite number >= 0, got inf$"):
        verify(BASE, cand, atol={"kl": INF})
    with pytest.raises(VerifyInputError, match="must be a finite number"):
        verify(BASE, cand, atol=NAN)


def test_mismatched_metric_sets_are_inconclusive() -> None:
    cand = table(loss=dict(BASE["loss"]), entropy={0: 1.0})
    report = verify(BASE, cand)
    assert not report.ok and report.verdict == "inconclusive" and report.exit_code == 3
    assert report.only_in_baseline == ("kl",) and report.only_in_candidate == ("entropy",)
    assert all(c.ok for c in report.comparisons)
    text = format_report(report)
    assert "metrics only in baseline : kl" in text and "metrics only in candidate: entropy" in text
    assert text.startswith("rollout-mock verify: INCONCLUSIVE (metric(s) absent from the candidate: kl; "
                           "metric(s) absent from the baseline: entropy)")


def test_metric_selection() -> None:
    cand = table(loss=dict(BASE["loss"]), entropy={0: 1.0})
    assert verify(BASE, cand, metrics=["loss"]).ok  # one-sided metrics outside the selection are ignored
    report = verify(BASE, cand, metrics=["loss", "kl"])
    assert not report.ok and report.only_in_baseline == ("kl",)
    with pytest.raises(VerifyInputError, match="metric\\(s\\) 'lsos' not logged by either run; available: entropy, kl, loss"):
        verify(BASE, cand, metrics=["lsos"])


def test_no_common_metric() -> None:
    report = verify(table(a={0: 1.0}), table(b={0: 1.0}))
    assert not report.ok
    assert "(no metric logged by both runs)" in format_report(report)


def test_to_json_is_strict_json() -> None:
    report = verify(table(x={0: NAN, 1: 1.0}), table(x={0: NAN, 1: INF}))
    data = json.loads(json.dumps(report.to_json(), allow_nan=False))
    x = data["metrics"]["x"]
    assert data["ok"] is False
    assert x["first_divergent_step"] == 1 and x["candidate_value"] == "Infinity" and x["baseline_value"] == 1.0
    assert x["max_abs_diff"] == "Infinity" and x["mode"] == "bitwise" and x["divergent_steps"] == 1


def test_verify_reads_paths(tmp_path: Path) -> None:
    for name, value in (("a", 1.0), ("b", 1.0000000000000002)):
        with MetricsWriter(tmp_path / name / "metrics.jsonl") as w:
            w.log(0, {"loss": value})
    report = verify(tmp_path / "a", tmp_path / "b")
    assert not report.ok and report.baseline == str(tmp_path / "a" / "metrics.jsonl")


# ------------------------------------------------------------------------------------------
# pytest plugin
# ------------------------------------------------------------------------------------------


def test_assert_metrics_match() -> None:
    assert assert_metrics_match(BASE, BASE).ok
    with pytest.raises(AssertionError) as info:
        assert_metrics_match(BASE, table(loss={0: 1.0, 1: 0.6, 2: 0.25, 3: 0.125}, kl=dict(BASE["kl"])))
    assert str(info.value).startswith("metrics diverge from the baseline\nrollout-mock verify: FAIL")
    assert "step 1: baseline=0.5 candidate=0.6" in str(info.value)
    assert assert_metrics_match(BASE, table(loss={0: 1.0, 1: 0.6, 2: 0.25, 3: 0.125}, kl=dict(BASE["kl"])), atol=0.2).ok


def test_plugin_import_is_light() -> None:
    code = (
        "import sys; import rollout_mock.compare.pytest_plugin; "
        "heavy = sorted(m for m in ('torch', 'numpy', 'matplotlib', 'tensorboard') if m in sys.modules); "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, f"plugin import pulled in {proc.stdout.strip()} {proc.stderr[-500:]}"


def _write(path: Path, values: dict[int, float]) -> None:
    with MetricsWriter(path) as w:
        for step, value in values.items():
            w.log(step, {"loss": value})


PLUGIN_TEST = """
def test_same(assert_matches_baseline, tmp_path):
    assert assert_matches_baseline(r"{same}").ok

def test_diverged(assert_matches_baseline):
    assert_matches_baseline(r"{other}")

def test_path(precision_baseline):
    assert precision_baseline.name == "metrics.jsonl"
"""


def test_plugin_fixtures(pytester: pytest.Pytester, tmp_path: Path) -> None:
    base, same, other = tmp_path / "metrics.jsonl", tmp_path / "same.jsonl", tmp_path / "other.jsonl"
    _write(base, {0: 1.0, 1: 0.5})
    _write(same, {0: 1.0, 1: 0.5})
    _write(other, {0: 1.0, 1: 0.5000001})
    pytester.makepyfile(PLUGIN_TEST.format(same=same, other=other))

    result = pytester.runpytest(f"--rollout-mock-baseline={base}")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*rollout_mock baseline: *metrics.jsonl*", "*step 1: baseline=0.5 candidate=0.5000001*"])

    result = pytester.runpytest(f"--rollout-mock-baseline={base}", "--rollout-mock-atol=1e-3")
    result.assert_outcomes(passed=3)

    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["*no baseline: pass --rollout-mock-baseline=PATH*"])

    result = pytester.runpytest(f"--rollout-mock-baseline={tmp_path / 'typo'}")
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(["*--rollout-mock-baseline=*typo: no such file or directory*"])

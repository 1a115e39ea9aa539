"""Verdicts you can trust: content ids, the inconclusive verdict, the restart-replay gate."""

from __future__ import annotations

import math

import pytest

from rollout_mock import VerifyInputError, verify
from rollout_mock.compare.metrics import MetricsTable
from rollout_mock.compare.pytest_plugin import assert_metrics_match, assert_resume_matches
from rollout_mock.compare.verify import format_report, verify_resume


def table(**series: dict[int, float]) -> MetricsTable:
    return MetricsTable(series, source="mem", format="jsonl")


FULL = table(loss={s: 1.0 / (s + 1) for s in range(10)}, kl={s: s * 1e-3 for s in range(10)})


def test_content_id_is_the_values_not_the_file() -> None:
    same = MetricsTable({"kl": dict(FULL["kl"]), "loss": dict(FULL["loss"])}, source="other.csv", format="csv")
    assert FULL.content_id() == same.content_id() and FULL.content_id().startswith("sha256:")
    assert len(FULL.content_id()) == 71
    nudged = table(loss={**FULL["loss"], 3: math.nextafter(FULL["loss"][3], 1.0)}, kl=dict(FULL["kl"]))
    assert nudged.content_id() != FULL.content_id()  # one ulp at one step changes it
    renamed = table(loss=dict(FULL["loss"]), kl2=dict(FULL["kl"]))
    assert renamed.content_id() != FULL.content_id()
    assert table(x={0: math.nan}).content_id() == table(x={0: -math.nan}).content_id()  # no NaN payloads


def test_expected_id_refuses_a_changed_baseline() -> None:
    pinned = FULL.content_id()
    assert verify(FULL, FULL, expected_id=pinned).ok
    changed = table(loss={**FULL["loss"], 9: 0.0}, kl=dict(FULL["kl"]))
    with pytest.raises(VerifyInputError, match=r"baseline mem changed: its content id is sha256:[0-9a-f]{64}, "
                                               r"not the pinned sha256:"):
        verify(changed, changed, expected_id=pinned)
    with pytest.raises(VerifyInputError, match="expected sha256: and 64 hex digits"):
        verify(FULL, FULL, expected_id="abc")


@pytest.mark.parametrize("baseline, candidate, reason", [
    (FULL, table(), "the candidate run is empty"),
    (table(), FULL, "the baseline run is empty"),
    (table(), table(), "the baseline run is empty"),
])
def test_an_empty_run_is_inconclusive_not_a_pass(baseline: MetricsTable, candidate: MetricsTable,
                                                 reason: str) -> None:
    report = verify(baseline, candidate)
    assert report.verdict == "inconclusive" and report.exit_code == 3 and not report.ok
    assert reason in report.inconclusive_reasons[0]
    with pytest.raises(AssertionError, match="cannot be compared with the baseline"):
        assert_metrics_match(baseline, candidate)


def test_too_few_steps_is_inconclusive() -> None:
    short = table(loss={0: 1.0, 1: 0.5})
    assert verify(short, short).verdict == "pass"
    report = verify(short, short, min_steps=3)
    assert report.verdict == "inconclusive"
    assert report.inconclusive_reasons == ("2 step(s) compared, fewer than the 3 required (--min-steps)",)
    assert report.to_json()["verdict"] == "inconclusive"


def test_a_divergence_fails_even_when_a_metric_is_one_sided() -> None:
    cand = table(loss={**FULL["loss"], 4: 0.0})
    report = verify(FULL, cand)
    assert report.verdict == "fail" and report.exit_code == 1
    assert "FAIL" in format_report(report).splitlines()[0]


def _resumed(k: int, changed: int | None = None) -> MetricsTable:
    loss = {s: v for s, v in FULL["loss"].items() if s >= k}
    if changed is not None:
        loss[changed] = math.nextafter(loss[changed], 2.0)
    return table(loss=loss, kl={s: v for s, v in FULL["kl"].items() if s >= k})


def test_verify_resume_passes_a_bit_exact_resume_and_names_the_step_that_differs() -> None:
    assert verify_resume(FULL, _resumed(5), resume_step=5).verdict == "pass"
    assert assert_resume_matches(FULL, _resumed(5), resume_step=5).ok
    report = verify_resume(FULL, _resumed(5, changed=7), resume_step=5)
    assert report.verdict == "fail"
    first = report.first_divergence
    assert first is not None and first.first_divergent_step == 7 and first.name == "loss"
    with pytest.raises(AssertionError, match="the run resumed at step 5 differs from the uninterrupted run"):
        assert_resume_matches(FULL, _resumed(5, changed=7), resume_step=5)


def test_verify_resume_fails_a_missing_step_and_is_inconclusive_without_any_step_after() -> None:
    gap = _resumed(5)
    cut = table(loss={s: v for s, v in gap["loss"].items() if s != 8}, kl=dict(gap["kl"]))
    report = verify_resume(FULL, cut, resume_step=5)
    assert report.verdict == "fail" and report.comparison("loss").missing_in_candidate == (8,)
    early = table(loss={s: v for s, v in FULL["loss"].items() if s < 5}, kl={s: v for s, v in FULL["kl"].items() if s < 5})
    report = verify_resume(FULL, early, resume_step=5)
    assert report.verdict == "fail"  # steps 5..9 of the uninterrupted run are missing
    only_first_leg = table(loss={0: 1.0}, kl={0: 0.0})
    report = verify_resume(table(loss={0: 1.0}, kl={0: 0.0}), only_first_leg, resume_step=5)
    assert report.verdict == "inconclusive"
    assert report.inconclusive_reasons == ("no step at or after the resume step 5 is in both runs",)

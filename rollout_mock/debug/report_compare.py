"""``rollout-mock report A --against B``: where and how two dumps diverge, as a report section.

The key-by-key comparison is :func:`rollout_mock.compare.diff.diff_dumps` (the ``diff`` command's
batch diff). The section shows the verdict and the first differing step (its keys, first
differing sample and values), a chart of the largest absolute difference per key and step
(log scale), the two dumps' reward means side by side, a per-key table (first differing step,
steps that differ, largest difference) and the non-identical steps.
"""

from __future__ import annotations

import math
import os
from html import escape
from pathlib import Path
from typing import Any

from rollout_mock.debug.report_data import StepSummary, summarize_step
from rollout_mock.debug.svg import COLORS, fmt, line_chart

__all__ = ["comparison_section"]

_MAX_KEYS_CHARTED = 8
_MAX_STEP_ROWS = 200


def _log10(x: float | None) -> float | None:
    return math.log10(x) if x is not None and math.isfinite(x) and x > 0 else None


def _pow10(v: float | None) -> str:
    """A log10 value read back: decades as ``1e-6`` ... ``1000`` ... ``1e5``, others with 4 digits."""
    if v is not None and math.isfinite(v) and v == int(v) and not -3 <= v <= 3:
        return f"1e{int(v)}"
    return fmt(None if v is None else 10.0 ** v)


def _divergence_chart(steps: list[int], by_step: dict[int, Any]) -> str:
    """log10 of the largest |a - b| per key and step (identical steps: gaps)."""
    worst: dict[str, float] = {}
    for diff in by_step.values():
        for k in diff.keys:
            if k.max_abs_diff is not None and math.isfinite(k.max_abs_diff):
                worst[k.key] = max(worst.get(k.key, 0.0), k.max_abs_diff)
    keys = sorted(worst, key=lambda k: -worst[k])[:_MAX_KEYS_CHARTED]
    if not keys:
        return ""
    series: dict[str, list[float | None]] = {}
    for key in keys:
        values: list[float | None] = []
        for s in steps:
            diff = by_step.get(s)
            found = None if diff is None else next((k for k in diff.keys if k.key == key), None)
            values.append(None if found is None else _log10(found.max_abs_diff))
        series[key] = values
    return line_chart("divergence: max |A − B| per key (log scale; no point: identical)", steps, series,
                      width=620, height=260, yfmt=_pow10, yinteger=True)


def _reward_chart(steps: list[int], a: dict[int, StepSummary], b: dict[int, StepSummary]) -> str:
    def mean(s: StepSummary | None) -> float | None:
        q = None if s is None else s.dist.get("reward")
        return None if q is None else q["mean"]

    series = {"A": [mean(a.get(s)) for s in steps], "B": [mean(b.get(s)) for s in steps]}
    return line_chart("reward mean: A and B", steps, series, dashed=("B",), colors={"A": COLORS[0], "B": COLORS[1]},
                      width=460, height=260)


def _key_table(diffs: list[Any]) -> str:
    rows: dict[str, dict[str, Any]] = {}
    for d in diffs:
        for k in d.keys:
            r = rows.setdefault(k.key, {"first": d.step, "steps": 0, "max": None, "status": set(), "example": ""})
            r["steps"] += 1
            r["status"].add(k.status)
            if k.max_abs_diff is not None and math.isfinite(k.max_abs_diff):
                r["max"] = max(r["max"] or 0.0, k.max_abs_diff)
            if not r["example"] and k.first_a is not None:
                where = "" if k.first_element is None else f"[{', '.join(map(str, k.first_element))}] "
                r["example"] = f"step {d.step} {where}{k.first_a} vs {k.first_b}"
            elif not r["example"] and k.shape_a != k.shape_b and k.shape_a is not None and k.shape_b is not None:
                r["example"] = f"step {d.step}: shape {list(k.shape_a)} vs {list(k.shape_b)}"
            elif not r["example"] and (k.note or k.a is not None):
                r["example"] = f"step {d.step}: {k.note or f'{k.a} vs {k.b}'}"
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("key", "first differing step", "steps differing", "max |A − B|",
                                              "status", "first difference"))
    body = "".join(
        f"<tr><td>{escape(key)}</td><td class=\"num\">{r['first']}</td><td class=\"num\">{r['steps']}</td>"
        f"<td class=\"num\">{fmt(r['max'])}</td><td>{escape(', '.join(sorted(r['status'])))}</td>"
        f"<td>{escape(r['example'][:160])}</td></tr>"
        for key, r in sorted(rows.items(), key=lambda kv: (kv[1]["first"], kv[0])))
    return f"<h3>Keys that differ</h3><div class=\"scroll\"><table><tr>{head}</tr>{body}</table></div>"


def _step_table(diffs: list[Any]) -> str:
    shown = diffs[:_MAX_STEP_ROWS]
    if not shown:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("step", "status", "keys differing", "max |A − B|", "first sample",
                                              "note"))
    body = "".join(
        f"<tr><td>{d.step}</td><td class=\"{'good' if d.ok else 'bad'}\">{escape(d.status)}</td>"
        f"<td class=\"num\">{len(d.keys)}</td>"
        f"<td class=\"num\">{fmt(max((k.max_abs_diff for k in d.keys if k.max_abs_diff is not None), default=None))}"
        f"</td><td class=\"num\">{fmt(d.first_differing_sample)}</td><td>{escape((d.note or '')[:200])}</td></tr>"
        for d in shown)
    more = f"<p class=\"muted\">{len(diffs) - len(shown)} more steps not listed.</p>" if len(diffs) > len(shown) else ""
    return (f"<details open><summary>Steps that are not identical ({len(diffs)})</summary><div class=\"scroll\">"
            f"<table><tr>{head}</tr>{body}</table></div>{more}</details>")


def comparison_section(dump_a: str | os.PathLike[str], dump_b: str | os.PathLike[str], summaries: list[StepSummary],
                       *, split: str = "train", trusted: bool = False) -> str:
    """The HTML section comparing ``dump_a`` (already summarized: ``summaries``) with ``dump_b``."""
    from rollout_mock.compare.diff import diff_dumps
    from rollout_mock.storage import open_dump

    report = diff_dumps(dump_a, dump_b, split=split, trusted=trusted)
    stream = next((s for s in report.streams if s.stream == split), None) or \
        next((s for s in report.streams if s.stream.split("/")[0].split("@")[0] == split), None)
    other = open_dump(dump_b)
    b_stream = other.stream(split)
    b_summaries = {step: summarize_step(other, b_stream, step, max_samples=0, trusted=trusted)
                   for step in other.steps(b_stream)}
    steps = sorted({s.step for s in summaries} | set(b_summaries))
    diffs = [] if stream is None else [d for d in stream.steps if d.status not in ("identical", "equal")]
    by_step = {d.step: d for d in diffs}
    first = next((d for d in diffs if not d.ok), None)
    a_name, b_name = escape(str(Path(dump_a).resolve())), escape(str(Path(dump_b).resolve()))
    if report.identical:
        verdict = "<p class=\"good\">Identical: every step and every key is the same in both dumps.</p>"
    elif first is None:
        verdict = "<p class=\"good\">Equal within tolerance (some steps are close, none differ).</p>"
    else:
        keys = ", ".join(escape(k.key) for k in first.keys[:8]) + (" ..." if len(first.keys) > 8 else "")
        sample = "" if first.first_differing_sample is None else f", first at sample {first.first_differing_sample}"
        verdict = (f"<p class=\"bad\">The dumps diverge. First differing step: <b>{first.step}</b> "
                   f"({escape(first.status)}{sample}); keys: {keys or escape(first.note or '-')}. "
                   f"{len([d for d in diffs if not d.ok])} of {len(steps)} steps differ.</p>")
    if report.fingerprint_differs:
        verdict += (f"<p class=\"muted\">The recording environments differ in: "
                    f"{escape(', '.join(report.fingerprint_differs))}.</p>")
    charts = _divergence_chart(steps, by_step) + _reward_chart(steps, {s.step: s for s in summaries}, b_summaries)
    return (f"<h2>Comparison</h2><p class=\"muted\">A: {a_name}<br>B: {b_name}</p>{verdict}"
            f"<div class=\"charts\">{charts}</div>{_key_table(diffs)}{_step_table(diffs)}"
            f"{_metrics_section(dump_a, dump_b)}")


def _metrics_section(dump_a: str | os.PathLike[str], dump_b: str | os.PathLike[str]) -> str:
    """The two dump runs' recorded metrics (``expected/``), one chart per metric both have."""
    from rollout_mock.compare.expected import read_expected

    a, b = read_expected(dump_a), read_expected(dump_b)  # contained reads (no links, FIFOs, devices)
    if a is None or b is None:
        return ""
    charts = _metric_charts(a, b)
    if not charts:
        return ""
    return f"<h3>The two runs' metrics (A solid, B dashed)</h3><div class=\"charts\">{''.join(charts)}</div>"


def _metric_charts(a: Any, b: Any) -> list[str]:
    """One chart per metric both tables hold: A solid, B dashed."""
    charts = []
    for name in sorted(set(a) & set(b)):
        steps = sorted(set(a.steps) | set(b.steps))
        series = {"A": [a[name].get(s) for s in steps], "B": [b[name].get(s) for s in steps]}
        charts.append(line_chart(name, steps, series, dashed=("B",), colors={"A": COLORS[0], "B": COLORS[1]},
                                 width=360, height=200))
    return charts



def metrics_comparison_section(dump: str | os.PathLike[str], metrics_file: str | os.PathLike[str]) -> str:
    """The dump run's recorded metrics (``expected/``, A) against another run's metrics file (B,
    e.g. the mock run's ``MetricsWriter`` output): the verdict of ``rollout-mock verify`` (bitwise)
    and one chart per metric both logged."""
    from rollout_mock.compare.expected import read_expected
    from rollout_mock.compare.metrics import read_metrics
    from rollout_mock.compare.verify import verify
    from rollout_mock.errors import DebugInputError

    a = read_expected(dump)
    if a is None:
        raise DebugInputError(f"{dump} holds no metrics of its dump run (expected/metrics.jsonl): nothing to "
                              f"compare {metrics_file} with; log them with MetricsWriter(..., expected=...) "
                              f"when dumping, or pass a second dump to --against")
    b = read_metrics(Path(metrics_file))
    result = verify(a, b)
    first = result.first_divergence
    if result.ok:
        verdict = "<p class=\"good\">Identical: every metric at every step is bit-identical to the dump run's.</p>"
    elif first is not None:
        verdict = (f"<p class=\"bad\">The runs diverge. First divergence: step <b>{first.first_divergent_step}</b>, "
                   f"<b>{escape(first.name)}</b>: A = {first.baseline_value!r}, B = {first.candidate_value!r}. "
                   f"{len(result.failed)} of {len(result.comparisons)} metrics differ.</p>")
    else:
        verdict = "<p class=\"bad\">The runs do not cover the same steps or metrics.</p>"
    if result.only_in_baseline or result.only_in_candidate:
        verdict += (f"<p class=\"muted\">Only in A: {escape(', '.join(result.only_in_baseline) or '-')}; "
                    f"only in B: {escape(', '.join(result.only_in_candidate) or '-')}.</p>")
    charts = _metric_charts(a, b)
    names = (escape(str(Path(dump).resolve())), escape(str(Path(metrics_file).resolve())))
    return (f"<h2>Comparison of metrics</h2><p class=\"muted\">A: the dump run's metrics ({names[0]})<br>"
            f"B: {names[1]}</p>{verdict}<div class=\"charts\">{''.join(charts)}</div>")

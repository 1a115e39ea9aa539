"""``rollout-mock report A --against B``: where and how two dumps diverge, as a report section.

The key-by-key comparison is :func:`rollout_mock.compare.diff.diff_dumps` (the ``diff`` command's
batch diff). The section shows the verdict and the first differing step (its keys, first
differing sample and values), a chart of the largest absolute difference per key and step
(log axis, the first divergence marked), the two dumps' reward means side by side, a per-key
table (first differing step, steps that differ, largest difference) and the non-identical steps.

Metrics (a second dump's recorded ones, or a run's metrics file against the dump run's): per
metric both runs (A solid, B dashed) and ``|A − B|`` on a log axis with the first divergence
marked, so that a 1e-8 drift is seen, not hidden under two overlapping lines. Log axes reach at
least half a decade beyond the data (no line on an edge); NaN, ±inf and values beyond ±1e300
(``|1e308 − (−1e308)|`` is inf) are counted in a chart's note, never drawn or raised on.
"""

from __future__ import annotations

import math
import numbers
import os
from html import escape
from pathlib import Path
from typing import Any

from rollout_mock.debug.charts import COLORS, Chart, charts_html
from rollout_mock.debug.report_data import StepSummary, summarize_step
from rollout_mock.text import fmt_number, int_digits, short_repr, to_float

__all__ = ["comparison_section", "metric_charts", "metrics_comparison_section", "overlay_section"]

_MAX_KEYS_CHARTED = 8
_MAX_STEP_ROWS = 200


def _divergence_chart(steps: list[int], by_step: dict[int, Any], first: int | None) -> Chart | None:
    """The largest |a - b| per key and step, on a log axis (identical steps: gaps), the first
    differing step marked."""
    worst: dict[str, float] = {}
    for diff in by_step.values():
        for k in diff.keys:
            v = to_float(k.max_abs_diff)
            if v is not None and math.isfinite(v):
                worst[k.key] = max(worst.get(k.key, 0.0), v)
    keys = sorted(worst, key=lambda k: -worst[k])[:_MAX_KEYS_CHARTED]
    if not keys:
        return None
    series: dict[str, list[Any]] = {}
    for key in keys:
        values: list[Any] = []
        for s in steps:
            diff = by_step.get(s)
            found = None if diff is None else next((k for k in diff.keys if k.key == key), None)
            values.append(None if found is None else found.max_abs_diff)
        series[key] = values
    marks = [] if first is None else [(first, f"first divergence: step {first}")]
    return Chart("divergence: max |A − B| per key (log scale; no point: identical)", steps, series, log=True,
                 marks=marks, width=620, height=280, empty="no numeric difference")


def _reward_chart(steps: list[int], a: dict[int, StepSummary], b: dict[int, StepSummary]) -> Chart:
    def mean(s: StepSummary | None) -> float | None:
        q = None if s is None else s.dist.get("reward")
        return None if q is None else q["mean"]

    series = {"A": [mean(a.get(s)) for s in steps], "B": [mean(b.get(s)) for s in steps]}
    return Chart("reward mean: A and B", steps, series, dashed=("B",), colors={"A": COLORS[0], "B": COLORS[1]},
                 width=460, height=280)


def _key_table(diffs: list[Any]) -> str:
    rows: dict[str, dict[str, Any]] = {}
    for d in diffs:
        for k in d.keys:
            r = rows.setdefault(k.key, {"first": d.step, "steps": 0, "max": None, "status": set(), "example": ""})
            r["steps"] += 1
            r["status"].add(k.status)
            v = to_float(k.max_abs_diff)
            if v is not None and math.isfinite(v):
                r["max"] = max(r["max"] or 0.0, v)
            if not r["example"] and k.first_a is not None:
                where = "" if k.first_element is None else f"[{', '.join(map(_show, k.first_element))}] "
                r["example"] = f"step {d.step} {where}{_show(k.first_a)} vs {_show(k.first_b)}"
            elif not r["example"] and k.shape_a != k.shape_b and k.shape_a is not None and k.shape_b is not None:
                r["example"] = f"step {d.step}: shape {list(k.shape_a)} vs {list(k.shape_b)}"
            elif not r["example"] and (k.note or k.a is not None):
                r["example"] = f"step {d.step}: {k.note or f'{_show(k.a)} vs {_show(k.b)}'}"
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("key", "first differing step", "steps differing", "max |A − B|",
                                              "status", "first difference"))
    body = "".join(
        f"<tr><td>{escape(key)}</td><td class=\"num\">{r['first']}</td><td class=\"num\">{r['steps']}</td>"
        f"<td class=\"num\">{fmt_number(r['max'])}</td><td>{escape(', '.join(sorted(r['status'])))}</td>"
        f"<td>{escape(r['example'][:160])}</td></tr>"
        for key, r in sorted(rows.items(), key=lambda kv: (kv[1]["first"], kv[0])))
    return f"<h3>Keys that differ</h3><div class=\"scroll\"><table><tr>{head}</tr>{body}</table></div>"


def _largest(d: Any) -> float | None:
    values = [v for k in d.keys if (v := to_float(k.max_abs_diff)) is not None]
    return max(values, default=None)


def _show(value: Any) -> str:
    """A value of a diff in full precision (its first differing digits matter), bounded: text as
    the diff wrote it, a float's repr, an int (past 40 digits its size), any other cell's repr."""
    if isinstance(value, str):
        return value[:80]
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value) if int_digits(value) <= 40 else fmt_number(value)
    return fmt_number(value) if isinstance(value, numbers.Number) else short_repr(value, 60)


def _step_table(diffs: list[Any]) -> str:
    shown = diffs[:_MAX_STEP_ROWS]
    if not shown:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("step", "status", "keys differing", "max |A − B|", "first sample",
                                              "note"))
    body = "".join(
        f"<tr><td>{d.step}</td><td class=\"{'good' if d.ok else 'bad'}\">{escape(d.status)}</td>"
        f"<td class=\"num\">{len(d.keys)}</td>"
        f"<td class=\"num\">{fmt_number(_largest(d))}</td><td class=\"num\">{fmt_number(d.first_differing_sample)}"
        f"</td><td>{escape((d.note or '')[:200])}</td></tr>"
        for d in shown)
    more = f"<p class=\"muted\">{len(diffs) - len(shown)} more steps not listed.</p>" if len(diffs) > len(shown) else ""
    return (f"<details open><summary>Steps that are not identical ({len(diffs)})</summary><div class=\"scroll\">"
            f"<table><tr>{head}</tr>{body}</table></div>{more}</details>")


def comparison_section(dump_a: str | os.PathLike[str], dump_b: str | os.PathLike[str], summaries: list[StepSummary],
                       specs: list[dict[str, Any]], *, split: str = "train", trusted: bool = False) -> str:
    """The HTML section comparing ``dump_a`` (already summarized: ``summaries``) with ``dump_b``;
    its charts' specs are appended to ``specs`` (the page's list)."""
    from rollout_mock.compare.diff import diff_dumps
    from rollout_mock.errors import CorruptStepError, StepNotFoundError
    from rollout_mock.storage import open_dump

    report = diff_dumps(dump_a, dump_b, split=split, trusted=trusted)
    stream = next((s for s in report.streams if s.stream == split), None) or \
        next((s for s in report.streams if s.stream.split("/")[0].split("@")[0] == split), None)
    other = open_dump(dump_b)
    b_stream = other.stream(split)
    b_summaries: dict[int, StepSummary] = {}
    for step in other.steps(b_stream):
        try:
            b_summaries[step] = summarize_step(other, b_stream, step, max_samples=0, trusted=trusted)
        except (CorruptStepError, StepNotFoundError):  # the diff names it (an "unreadable" step)
            continue
    steps = sorted({s.step for s in summaries} | set(other.steps(b_stream)))
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
    divergence = _divergence_chart(steps, by_step, None if first is None else first.step)
    charts = [c for c in (divergence, _reward_chart(steps, {s.step: s for s in summaries}, b_summaries)) if c]
    return (f"<h2>Comparison</h2><p class=\"muted\">A: {a_name}<br>B: {b_name}</p>{verdict}"
            f"{charts_html(charts, specs)}{_key_table(diffs)}{_step_table(diffs)}"
            f"{_metrics_section(dump_a, dump_b, specs)}")


def _metrics_section(dump_a: str | os.PathLike[str], dump_b: str | os.PathLike[str],
                     specs: list[dict[str, Any]]) -> str:
    """The two dump runs' recorded metrics (``expected/``): per metric both runs and |A − B|."""
    from rollout_mock.compare.expected import read_expected

    a, b = read_expected(dump_a), read_expected(dump_b)  # contained reads (no links, FIFOs, devices)
    if a is None or b is None:
        return ""
    charts = metric_charts(a, b)
    if not charts:
        return ""
    return f"<h3>The two runs' metrics (A solid, B dashed; |A − B| on a log axis)</h3>{charts_html(charts, specs)}"


def _first_difference(a: dict[Any, Any], b: dict[Any, Any], steps: list[Any]) -> Any:
    from rollout_mock.compare.verify import identical  # verify imports the metrics readers: kept local

    for s in steps:
        x, y = to_float(a.get(s)), to_float(b.get(s))
        if x is not None and y is not None and not identical(x, y):
            return s
    return None


def metric_charts(a: Any, b: Any) -> list[Chart]:
    """Per metric both tables hold: A solid and B dashed, then ``|A − B|`` on a log axis with the
    first differing step marked (a chart with no difference is left out, named in one line)."""
    charts = []
    steps = sorted(set(a.steps) | set(b.steps))
    for name in sorted(set(a) & set(b)):
        va, vb = a[name], b[name]
        series = {"A": [va.get(s) for s in steps], "B": [vb.get(s) for s in steps]}
        charts.append(Chart(name, steps, series, dashed=("B",), colors={"A": COLORS[0], "B": COLORS[1]},
                            width=360, height=220))
        gaps = []
        for s in steps:
            x, y = to_float(va.get(s)), to_float(vb.get(s))
            gaps.append(abs(x - y) if x is not None and y is not None else None)
        first = _first_difference(va, vb, steps)
        marks = [] if first is None else [(first, f"first divergence: step {fmt_number(first)}")]
        charts.append(Chart(f"{name}: |A − B|", steps, {"|A − B|": gaps},
                            colors={"|A − B|": COLORS[3]}, log=True,
                            marks=marks, width=360, height=220, empty="A and B identical at every step"))
    return charts


def metrics_comparison_section(dump: str | os.PathLike[str], metrics_file: str | os.PathLike[str],
                               specs: list[dict[str, Any]]) -> str:
    """The dump run's recorded metrics (``expected/``, A) against another run's metrics file (B,
    e.g. the mock run's ``MetricsWriter`` output): the verdict of ``rollout-mock verify`` (bitwise)
    and, per metric both logged, both runs and ``|A − B|`` (charts' specs appended to ``specs``)."""
    from rollout_mock.compare.expected import read_expected
    from rollout_mock.compare.metrics import read_metrics
    from rollout_mock.compare.verify import verify
    from rollout_mock.errors import DebugInputError
    from rollout_mock.storage.store import expected_relpath

    a = read_expected(dump)
    if a is None:
        raise DebugInputError(f"{dump} holds no metrics of its dump run ({expected_relpath()}): nothing to "
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
    names = (escape(str(Path(dump).resolve())), escape(str(Path(metrics_file).resolve())))
    return (f"<h2>Comparison of metrics</h2><p class=\"muted\">A: the dump run's metrics ({names[0]})<br>"
            f"B: {names[1]}</p>{verdict}<p class=\"muted\">Per metric: both runs (A solid, B dashed) and "
            f"|A − B| on a log axis (no point: identical at that step).</p>{charts_html(metric_charts(a, b), specs)}")


# --------------------------------------------------------------------------- several runs
#: Runs overlaid beyond A (one colour each: the palette less A's).
_MAX_OVERLAID = len(COLORS) - 1


def _run_metrics(path: Path) -> Any:
    """A run's metrics: a dump's recorded ones (``expected/``), or a metrics file; ``None`` when
    a dump holds none."""
    from rollout_mock.compare.expected import read_expected
    from rollout_mock.compare.metrics import read_metrics

    return read_metrics(path) if path.is_file() else read_expected(path)


def _run_verdict(dump_a: str | os.PathLike[str], label: str, other: Path, *, split: str, trusted: bool) -> str:
    """One line: where run ``other`` first differs from A (a dump: step and keys; a metrics file:
    step and metric)."""
    from rollout_mock.compare.diff import diff_dumps
    from rollout_mock.compare.verify import verify

    name = f"<b>{escape(label)}</b> ({escape(str(other.resolve()))})"
    if other.is_file():
        a = _run_metrics(Path(dump_a))
        if a is None:
            return f"<li>{name}: A holds no metrics of its run to compare with.</li>"
        result = verify(a, _run_metrics(other))
        first = result.first_divergence
        if result.ok:
            return f"<li class=\"good\">{name}: every metric identical to A's.</li>"
        if first is None:
            return f"<li class=\"bad\">{name}: not the same steps or metrics as A.</li>"
        return (f"<li class=\"bad\">{name}: first divergence at step {first.first_divergent_step}, "
                f"{escape(first.name)}.</li>")
    report = diff_dumps(dump_a, other, split=split, trusted=trusted)
    stream = next((s for s in report.streams if s.stream == split), None)
    bad = [] if stream is None else [d for d in stream.steps if not d.ok]
    if report.identical:
        return f"<li class=\"good\">{name}: identical to A.</li>"
    if not bad:
        return f"<li class=\"good\">{name}: equal to A within tolerance.</li>"
    keys = ", ".join(escape(k.key) for k in bad[0].keys[:6])
    return f"<li class=\"bad\">{name}: first differing step {bad[0].step} ({keys or escape(bad[0].status)}).</li>"


def overlay_charts(runs: dict[str, Any]) -> list[Chart]:
    """Per metric of the first run (A): every run's values (one colour each), then ``|X − A|``
    for every other run on a log axis, each run's first divergence marked."""
    labels = list(runs)
    base = runs[labels[0]]
    colors = {label: COLORS[i % len(COLORS)] for i, label in enumerate(labels)}
    steps = sorted({s for table in runs.values() for s in table.steps})
    charts = []
    for name in sorted(base):
        present = {label: table[name] for label, table in runs.items() if name in table}
        if len(present) < 2:
            continue
        charts.append(Chart(name, steps, {label: [v.get(s) for s in steps] for label, v in present.items()},
                            colors={label: colors[label] for label in present}, width=360, height=220))
        gaps: dict[str, list[Any]] = {}
        marks = []
        for label, values in present.items():
            if label == labels[0]:
                continue
            column = []
            for s in steps:
                x, y = to_float(values.get(s)), to_float(base[name].get(s))
                column.append(abs(x - y) if x is not None and y is not None else None)
            gaps[f"|{label} − A|"] = column
            first = _first_difference(base[name], values, steps)
            if first is not None:
                marks.append((first, f"{label} first differs from A: step {fmt_number(first)}"))
        charts.append(Chart(f"{name}: |X − A|", steps, gaps, log=True, marks=marks,
                            colors={f"|{label} − A|": colors[label] for label in present if label != labels[0]},
                            width=360, height=220, empty="every run identical to A at every step"))
    return charts


def overlay_section(dump_a: str | os.PathLike[str], others: list[str | os.PathLike[str]],
                    summaries: list[StepSummary], specs: list[dict[str, Any]], *, split: str = "train",
                    trusted: bool = False) -> str:
    """``report A --against B C D``: each run's first difference from A, the dumps' reward means
    overlaid, and per metric every run (one colour each) with ``|X − A|`` on a log axis."""
    from rollout_mock.errors import CorruptStepError, DebugInputError, StepNotFoundError
    from rollout_mock.storage import open_dump

    if len(others) > _MAX_OVERLAID:
        raise DebugInputError(f"--against: {len(others)} runs; at most {_MAX_OVERLAID} can be overlaid (one colour "
                              f"each); compare the others in a second report")
    paths = [Path(p) for p in others]
    labels = [chr(ord("B") + i) for i in range(len(paths))]
    lines = [_run_verdict(dump_a, label, path, split=split, trusted=trusted) for label, path in zip(labels, paths)]
    charts: list[Chart] = []
    rewards: dict[str, list[Any]] = {}
    steps = sorted({s.step for s in summaries})
    by_run: dict[str, dict[int, StepSummary]] = {"A": {s.step: s for s in summaries}}
    for label, path in zip(labels, paths):
        if path.is_file():
            continue
        dump = open_dump(path)
        stream = dump.stream(split)
        run: dict[int, StepSummary] = {}
        for step in dump.steps(stream):
            try:
                run[step] = summarize_step(dump, stream, step, max_samples=0, trusted=trusted)
            except (CorruptStepError, StepNotFoundError):
                continue
        by_run[label] = run
        steps = sorted(set(steps) | set(run))
    if len(by_run) > 1:
        for label, run in by_run.items():
            rewards[label] = [None if (s := run.get(step)) is None or (q := s.dist.get("reward")) is None
                              else q["mean"] for step in steps]
        charts.append(Chart("reward mean: every run", steps, rewards, width=460, height=280,
                            colors={label: COLORS[i % len(COLORS)] for i, label in enumerate(["A", *labels])
                                    if label in rewards}))
    tables = {"A": _run_metrics(Path(dump_a))}
    tables.update({label: _run_metrics(path) for label, path in zip(labels, paths)})
    present = {label: table for label, table in tables.items() if table is not None}
    if "A" in present and len(present) > 1:
        charts += overlay_charts(present)
    names = "".join(f"<br>{label}: {escape(str(path.resolve()))}" for label, path in zip(labels, paths))
    return (f"<h2>Comparison of {len(paths) + 1} runs</h2><p class=\"muted\">A: {escape(str(Path(dump_a).resolve()))}"
            f"{names}</p><ul id=\"overlay\">{''.join(lines)}</ul><p class=\"muted\">One colour per run; per "
            f"metric every run, then |X − A| on a log axis (no point: identical to A at that step).</p>"
            f"{charts_html(charts, specs)}")

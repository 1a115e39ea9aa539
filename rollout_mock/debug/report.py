"""``rollout-mock report``: one self-contained HTML file to look at a dump (or compare two).

No server and nothing fetched: the page's CSS and JavaScript and the vendored uPlot that draws
its charts (``assets/``; MIT, version and licence there) are inline, and a Content-Security-Policy
forbids any network access, so the file works opened from disk, offline. Charts per step (a
tooltip, zoom, smoothing, one step range for all): the reward, response-length and token log-prob
distributions (min-max and p25-p75 bands, mean and median lines), rejected samples, GRPO groups
whose members all got one reward, the log-prob mismatch when a ``rollout-mock logprobs --json``
result is given, and the dump run's metrics when the dump stores them; a chart that says nothing
(no data, or one value at every step) is named in one line instead. Below them: a per-step table
and a sample browser (step -> every sample read, sortable and searchable -> its messages;
per-key tensor statistics of the step), decoded with a local tokenizer, else token ids.

Size and work are bounded: each step is read with at most
:data:`~rollout_mock.debug.report_data.STATS_ROWS` rows; the browser offers at most
:data:`MAX_BROWSER_STEPS` steps, each with a compact index of its samples (at most
:data:`PAGE_TEXT_CHARS` characters of text in the whole page) and a few full previews (the first
samples, the lowest and the highest rewards; long texts cut). A step that cannot be read (a
truncated file) is marked, the others are shown. ``against=``: a second dump, compared step by
step and key by key, or a metrics file (:mod:`~rollout_mock.debug.report_compare`).

Everything read from the dump is untrusted: HTML through :func:`html.escape`, the page's data as
JSON in ``<script type="application/json">`` (:func:`script_json`), and the scripts only ever set
``textContent``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from rollout_mock.debug.charts import COLORS, Band, Chart, charts_html
from rollout_mock.debug.report_data import DEFAULT_MAX_SAMPLES, STATS_ROWS, StepSummary, summarize_step
from rollout_mock.errors import CorruptStepError, DebugInputError, StepNotFoundError
from rollout_mock.jsonio import parse_bounded
from rollout_mock.storage import Dump, StreamId, format_ranges
from rollout_mock.text import fmt_number, jsonable, to_float

__all__ = ["DEFAULT_MAX_SAMPLES", "MAX_BROWSER_STEPS", "PAGE_TEXT_CHARS", "STEP_TEXT_CHARS", "RenderedReport",
           "browsable", "distribution_chart", "nothing_to_report", "page", "render_report", "report_stream",
           "script_json", "summarize_dump", "write_report"]

#: Steps offered by the sample browser (sample index, previews, tensor statistics, histograms,
#: groups): a page stays a few MB however long the run; charts and the per-step table cover every step.
MAX_BROWSER_STEPS = 300
#: Characters of sample text in the page's search index, shared among the browser's steps
#: (at most :data:`STEP_TEXT_CHARS` a step, at most 160 a sample).
PAGE_TEXT_CHARS = 2_000_000
STEP_TEXT_CHARS = 64_000

CONTROLS_HTML = (
    "<div id=\"controls\"><label>Steps <input id=\"xmin\" type=\"number\" placeholder=\"first\"> to "
    "<input id=\"xmax\" type=\"number\" placeholder=\"last\"></label><button id=\"resetzoom\">All steps</button>"
    "<label>Smoothing <input id=\"smooth\" type=\"range\" min=\"0\" max=\"0.99\" step=\"0.01\" value=\"0\"> "
    "<output id=\"smoothval\">0.00</output></label><span class=\"muted\">Drag across a chart to zoom "
    "(double-click: all steps); hover for values; click a legend entry to hide it.</span></div>"
)
SAMPLES_HTML = (
    "<h2>Samples</h2><div class=\"toolbar\"><label>Step <select id=\"step\"></select></label>"
    "<label>Search <input id=\"filter\" type=\"search\" placeholder=\"text, index, or uid:ID\" size=\"28\"></label>"
    "<span id=\"stepinfo\" class=\"muted\"></span></div><div id=\"hists\" class=\"charts\"></div>"
    "<div id=\"browser\"><div id=\"samplebox\"><div id=\"samples\"></div></div><div id=\"detail\"></div></div>"
    "<div class=\"pair\"><div><h3>Tensor statistics of this step</h3><div id=\"keystats\"></div></div>"
    "<div id=\"groups\"></div></div>"
)


# ------------------------------------------------------------------------------ the page
@cache
def asset(name: str) -> str:
    """The text of ``rollout_mock/debug/assets/NAME`` (package data)."""
    return (resources.files("rollout_mock.debug") / "assets" / name).read_text(encoding="utf-8")


def script_json(value: Any) -> str:
    """JSON that cannot end a ``<script>`` element (``<``, ``>``, ``&`` and U+2028/9 escaped)."""
    text = json.dumps(jsonable(value), allow_nan=False, separators=(",", ":"))
    escapes = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))
    for raw, esc in escapes:
        text = text.replace(raw, esc)
    return text


def page(title: str, info: str, body: str, data: Any, *, samples: bool = True) -> str:
    """The whole page: ``info`` and ``body`` are HTML already escaped; ``data`` becomes ``rm-data``
    (its ``charts`` drawn into the body's chart placeholders, its ``steps`` in the sample browser,
    shown with ``samples``)."""
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{escape(title)}</title><style>{asset('uPlot.min.css')}\n{asset('report.css')}</style></head><body>"
        f"<h1>{escape(title)}</h1><p id=\"info\" class=\"muted\">{info}</p>{CONTROLS_HTML}{body}"
        f"{SAMPLES_HTML if samples else ''}"
        f"<script type=\"application/json\" id=\"rm-data\">{script_json(data)}</script>"
        f"<script>{asset('uPlot.iife.min.js')}</script><script>{asset('report.js')}</script></body></html>\n"
    )


# ------------------------------------------------------------------------------ what is read
def _load_logprobs(path: str | os.PathLike[str] | None) -> dict[int, float | None]:
    if path is None:
        return {}
    try:
        data = parse_bounded(Path(path).read_bytes(), allow_nan=True, max_digits=1000)
        return {int(s["step"]): to_float(s["token_mult_prob_error"]) for s in data.get("steps", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        raise DebugInputError(f"--logprobs-json {path}: not the output of `rollout-mock logprobs --json` "
                              f"({type(exc).__name__}: {str(exc)[:200]})") from None


def report_stream(dump: Dump, split: str | None = None) -> StreamId:
    """The stream a report shows: ``split`` (an unknown one is
    :class:`~rollout_mock.errors.ManifestError`, naming those recorded); ``None``: ``train`` when it
    has steps, else the first split that has (a verl dump with validation steps only)."""
    if split is not None:
        return dump.stream(split)
    plain = [s for s in dump.streams() if s.name is None and s.rank is None]
    for stream in sorted(plain, key=lambda s: (s.split != "train", s.split)):
        if dump.steps(stream):
            return stream
    return dump.stream("train")


def nothing_to_report(dump: Dump, stream: StreamId) -> str | None:
    """Why there is nothing to report on ``stream`` (no step recorded), naming the streams that
    have steps; ``None`` when it has steps."""
    if dump.steps(stream):
        return None
    others = [f"{s.key} ({len(dump.steps(s))} steps)" for s in dump.streams() if s != stream and dump.steps(s)]
    fix = f"; pick one with --split ({', '.join(others)})" if others else ""
    return f"{dump.dump_dir}: stream {stream.key} has no recorded steps: nothing to report{fix}"


def browsable(steps: Sequence[int], limit: int = MAX_BROWSER_STEPS) -> set[int]:
    """The steps the sample browser offers: all of them up to ``limit``, else ``limit`` evenly
    spaced ones (the first and the last included)."""
    if len(steps) <= limit:
        return set(steps)
    return {steps[round(i * (len(steps) - 1) / (limit - 1))] for i in range(limit)}


def summarize_dump(dump: Dump, stream: StreamId, *, tokenizer: Any = None, max_samples: int = DEFAULT_MAX_SAMPLES,
                   trusted: bool = False, progress: bool | None = False) -> tuple[list[StepSummary], set[int]]:
    """Every step of ``stream``, each read with bounded work (:func:`summarize_step`), and the
    steps the browser offers (:func:`browsable`: only those keep previews and a sample index).
    A step that cannot be read (missing, truncated, corrupt) is a summary with ``error`` set.
    ``progress``: a bar over the steps on stderr (``None``: on a terminal outside CI only)."""
    from rollout_mock.text import progress_bar

    steps = dump.steps(stream)
    shown = browsable(steps)
    text_chars = min(STEP_TEXT_CHARS, PAGE_TEXT_CHARS // max(1, len(shown)))
    out = []
    with progress_bar(len(steps), enabled=progress, unit="step", unit_scale=False, desc="report") as bar:
        for step in steps:
            browse = step in shown
            try:
                out.append(summarize_step(dump, stream, step, tokenizer=tokenizer, trusted=trusted,
                                          max_samples=max_samples if browse else 0,
                                          text_chars=text_chars if browse else 0))
            except (CorruptStepError, StepNotFoundError) as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                out.append(StepSummary(step, 0, 0, error=f"{type(exc).__name__}: {first[:300]}"))
            bar.update(1)
    return out, shown


# ------------------------------------------------------------------------------ charts and tables
def _q(summaries: list[StepSummary], dist: str, name: str) -> list[float | None]:
    out: list[float | None] = []
    for s in summaries:
        q = s.dist.get(dist)
        out.append(None if q is None else q[name])
    return out


def distribution_chart(title: str, summaries: list[StepSummary], dist: str, color: str = COLORS[0], *,
                       empty: str = "no data") -> Chart:
    """Per step: the min-max and p25-p75 bands, the mean line and the median (dashed)."""
    bands = [Band("min–max", _q(summaries, dist, "min"), _q(summaries, dist, "max"), color, 0.12),
             Band("p25–p75", _q(summaries, dist, "p25"), _q(summaries, dist, "p75"), color, 0.28)]
    series = {"mean": _q(summaries, dist, "mean"), "median": _q(summaries, dist, "median")}
    return Chart(title, [s.step for s in summaries], series, bands=bands, dashed=("median",),
                 colors={"mean": color, "median": "#333"}, empty=empty)


def step_charts(summaries: list[StepSummary]) -> list[Chart]:
    """The distribution charts, rejected samples and GRPO groups."""
    steps = [s.step for s in summaries]
    readable = [s.error is None for s in summaries]
    charts = [distribution_chart("reward", summaries, "reward", COLORS[0]),
              distribution_chart("response length (tokens)", summaries, "length", COLORS[2]),
              distribution_chart("response token log-prob", summaries, "logprob", COLORS[3],
                                 empty="no log-probs recorded"),
              Chart("rejected samples", steps, {"rejected": [float(s.rejected) if ok else None
                                                             for s, ok in zip(summaries, readable, strict=True)]},
                    colors={"rejected": COLORS[1]}, zero=True)]
    if any(s.groups for s in summaries):
        flat = [None if s.groups is None else 100 * s.groups["flat_fraction"] for s in summaries]
        charts.append(Chart("GRPO groups with one reward for all members (%)", steps,
                            {"groups without signal (%)": flat}, colors={"groups without signal (%)": COLORS[4]},
                            zero=True))
    return charts


def _cells(s: StepSummary) -> list[str]:
    r, n = s.dist.get("reward") or {}, s.dist.get("length") or {}
    groups = "-" if s.groups is None else f"{int(s.groups['flat'])}/{int(s.groups['groups'])}"
    return [str(s.step), str(s.total), str(s.rejected), *(fmt_number(d.get(k)) for d in (r, n)
                                                           for k in ("mean", "min", "max")), groups]


def step_table(summaries: list[StepSummary]) -> str:
    head = ["step", "samples", "rejected", "reward mean", "min", "max", "length mean", "min", "max",
            "flat groups"]
    rows = "".join(
        f"<tr class=\"bad\"><td>{s.step}</td><td>unreadable</td><td colspan=\"8\" style=\"text-align:left\">"
        f"{escape(s.error)}</td></tr>" if s.error is not None else
        "<tr>" + "".join(f"<td class=\"num\">{escape(c)}</td>" for c in _cells(s)) + "</tr>" for s in summaries)
    opened = " open" if len(summaries) <= 40 else ""
    return (f"<details{opened}><summary>Per-step table ({len(summaries)} steps)</summary><div class=\"scroll\">"
            "<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + f"</tr>{rows}</table></div></details>")


def dump_info(dump: Dump, dump_dir: str | os.PathLike[str], stream: StreamId, steps: int) -> str:
    manifest = dump.manifest
    return (f"{escape(str(Path(dump_dir).resolve()))} &middot; stream {escape(str(stream))} &middot; "
            f"{steps} step{'' if steps == 1 else 's'} &middot; "
            f"written by rollout_mock {escape(str(manifest.writer.get('rollout_mock')))} "
            f"on Python {escape(str(manifest.writer.get('python')))} at {escape(str(manifest.created_at))}")


def _unreadable_banner(summaries: list[StepSummary]) -> str:
    bad = [s for s in summaries if s.error is not None]
    if not bad:
        return ""
    items = "".join(f"<li>step {s.step}: {escape(str(s.error))}</li>" for s in bad[:20])
    more = f"<li>{len(bad) - 20} more</li>" if len(bad) > 20 else ""
    return (f"<div class=\"banner\"><b class=\"bad\">{len(bad)} step{'s' if len(bad) != 1 else ''} could not be "
            f"read</b> ({escape(format_ranges([s.step for s in bad]))}): shown as gaps in the charts and marked "
            f"in the table; the other steps are complete. <code>rollout-mock ls DUMP --verify</code> checks every "
            f"file.<ul>{items}{more}</ul></div>")


@dataclass
class RenderedReport:
    """A report's page and the summaries of its steps (``error`` set: a step that could not be read)."""

    html: str
    summaries: list[StepSummary]

    @property
    def unreadable(self) -> list[StepSummary]:
        return [s for s in self.summaries if s.error is not None]

    def write(self, output: str | os.PathLike[str]) -> Path:
        """Write the page to ``output``, atomically; returns its path."""
        from rollout_mock.storage.directory import atomic_write

        # lone surrogates (from a hostile dump) are written as visible \udXXX escapes, never a crash
        return atomic_write(output, self.html.encode("utf-8", "backslashreplace"))


def pinned_steps(dump: Dump, stream: StreamId) -> dict[int, str]:
    """The steps the flight recorder kept for a reason (``keep``: a metric anomaly, an explicit
    ``pin``, their windows), with the reasons of each, from the index entries."""
    out: dict[int, str] = {}
    for step in dump.steps(stream):
        entry = dump.entry(stream, step)
        reasons = None if entry is None else entry.pin
        if reasons:
            out[step] = "kept: " + "; ".join(str(r) for r in reasons)
    return out


def mark_pins(specs: list[dict[str, Any]], pins: dict[int, str]) -> None:
    """Every chart of the page marks the pinned steps in its range: a thin line, its reasons in the
    chart's tooltip on hover (``quiet``: no label drawn over the chart)."""
    if not pins:
        return
    for spec in specs:
        xs = [x for x in spec.get("x", []) if isinstance(x, int | float)]
        if not xs:
            continue
        low, high = min(xs), max(xs)
        spec["marks"] = [*spec.get("marks", []),
                         *({"x": step, "label": label, "quiet": True} for step, label in sorted(pins.items())
                           if low <= step <= high)]


def check_section(dump_dir: str | os.PathLike[str], stream: StreamId, specs: list[dict[str, Any]]) -> str:
    """Check mode's verdicts of ``stream`` (``checks/{split}/step_N.json``): the match with the
    recording per step (a chart) and a row per checked step naming its first differing key; ``""``
    when the stream was never checked."""
    from rollout_mock.wrap.check import key_summary, read_check_verdicts

    verdicts = [v for v in read_check_verdicts(dump_dir) if v.stream == stream.key]
    if not verdicts:
        return ""
    steps = [v.step for v in verdicts]
    series: dict[str, list[Any]] = {"match": [v.match for v in verdicts]}
    if any(v.token_match is not None for v in verdicts):
        series["token match"] = [v.token_match for v in verdicts]
    differs = [(v.step, "differs from the recording") for v in verdicts if not v.equal]
    chart = Chart("check mode: match with the recording", steps, series, zero=True, marks=differs)
    rows = []
    for v in verdicts:
        first = v.keys[0] if v.keys else None
        where = "—" if first is None else f"<code>{escape(str(first.get('key')))}</code> ({escape(key_summary(first))})"
        more = f" and {len(v.keys) - 1 + v.omitted} more" if len(v.keys) + v.omitted > 1 else ""
        verdict = "equal" if v.equal else "differs" if v.passed else "FAILED (below check_min_match)"
        rows.append(f"<tr class=\"{'' if v.equal else 'bad'}\"><td>{v.step}</td><td>{v.run_step}</td>"
                    f"<td>{escape(v.method)}</td><td class=\"num\">{fmt_number(v.match)}</td>"
                    f"<td>{escape(verdict)}</td><td>{where}{escape(more)}</td></tr>")
    failed = sum(not v.equal for v in verdicts)
    return (f"<h2 id=\"checks\">Check mode</h2><p>{len(verdicts)} step(s) checked against the recording "
            f"(<code>mode: check</code>): {failed} differ.</p>{charts_html([chart], specs)}"
            "<div class=\"scroll\"><table id=\"checktable\"><tr><th>step</th><th>run step</th><th>method</th>"
            "<th>match</th><th>verdict</th><th>first differing key</th></tr>" + "".join(rows) + "</table></div>")


def render_report(
    dump_dir: str | os.PathLike[str],
    *,
    split: str | None = None,
    tokenizer: Any = None,
    logprobs_json: str | os.PathLike[str] | None = None,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    trusted: bool = False,
    against: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    progress: bool | None = False,
    explain: Sequence[str | os.PathLike[str]] = (),
) -> RenderedReport:
    """The report's page and the summaries of its steps (see :func:`write_report`)."""
    from rollout_mock.compare.expected import read_expected
    from rollout_mock.storage import open_dump

    if max_samples < 0:
        raise DebugInputError(f"max_samples {max_samples}: must be >= 0")
    mismatch = _load_logprobs(logprobs_json)
    dump = open_dump(dump_dir)
    stream = report_stream(dump, split)
    empty = nothing_to_report(dump, stream)
    if empty is not None:
        raise DebugInputError(empty)
    summaries, shown = summarize_dump(dump, stream, tokenizer=tokenizer, max_samples=max_samples, trusted=trusted,
                                      progress=progress)
    steps = [s.step for s in summaries]
    specs: list[dict[str, Any]] = []
    body = _unreadable_banner(summaries)
    if isinstance(against, Sequence) and not isinstance(against, str):  # several runs: overlaid
        from rollout_mock.debug.report_compare import overlay_section

        body += overlay_section(dump_dir, list(against), summaries, specs, split=stream.split, trusted=trusted)
    elif against is not None and Path(against).is_file():  # a run's metrics file, against the dump run's
        from rollout_mock.debug.report_compare import metrics_comparison_section

        body += metrics_comparison_section(dump_dir, against, specs)
    elif against is not None:
        from rollout_mock.debug.report_compare import comparison_section

        body += comparison_section(dump_dir, against, summaries, specs, split=stream.split, trusted=trusted)
    body += check_section(dump_dir, stream, specs)
    charts = step_charts(summaries)
    if mismatch:
        charts.append(Chart("log-prob mismatch (token_mult_prob_error)", steps,
                            {"mult_prob_err": [mismatch.get(s) for s in steps]}))
    capped = [s.step for s in summaries if s.capped]
    note = (f"<p class=\"muted\">Steps with {STATS_ROWS} samples or more: statistics over their first "
            f"{STATS_ROWS} ({len(capped)} steps: {escape(format_ranges(capped))}).</p>" if capped else "")
    body += _check_section(dump_dir, stream.key)
    if explain:
        from rollout_mock.debug.forensics import explain_html, read_explain

        body += explain_html([read_explain(path) for path in explain])
    body += f"<h2>Per step</h2>{note}{charts_html(charts, specs)}{step_table(summaries)}"
    table = read_expected(dump_dir)  # contained: never a link out of the dump, a FIFO or a device
    if table is not None:
        metric_charts = [Chart(name, table.steps, {name: [table[name].get(s) for s in table.steps]},
                               colors={name: COLORS[i % len(COLORS)]}, width=360, height=220)
                         for i, name in enumerate(sorted(table))]
        body += f"<h2>Dump run metrics</h2>{charts_html(metric_charts, specs)}"
    body += _health_section(dump, stream, specs)  # after the batches' own charts
    info = (dump_info(dump, dump_dir, stream, len(steps)) + " &middot; " +
            ("decoded with a tokenizer" if tokenizer is not None else "token ids (no tokenizer)"))
    if len(shown) < len(summaries):
        body += (f"<p class=\"muted\">The sample browser offers {len(shown)} of the {len(summaries)} steps "
                 "(evenly spaced, the first and the last included); the charts and the table cover all.</p>")
    mark_pins(specs, pinned_steps(dump, stream))
    data = {"charts": specs, "dump": str(dump_dir), "split": stream.key,
            "steps": {str(s.step): s.to_json() for s in summaries if s.step in shown}}
    return RenderedReport(page(f"rollout-mock report: {Path(dump_dir).name}", info, body, data), summaries)


def _health_section(dump: Any, stream: Any, specs: list[dict[str, Any]]) -> str:
    """The health of every step the run wrote (kept when its batch was dropped): a chart of the
    NaN/inf count and of each floating key's mean, with the steps that stand out marked and listed."""
    lines = dump.health(stream)
    if not lines:
        return ""
    steps = [line["step"] for line in lines]
    marks = [(line["step"], ", ".join(line["anomalies"])) for line in lines if line.get("anomalies")]
    nonfinite = [sum(v.get("nf", 0) for v in (line.get("keys") or {}).values() if isinstance(v, dict))
                 for line in lines]
    charts = [Chart("health: NaN/inf values per step", steps, {"NaN/inf": nonfinite}, zero=True, marks=marks)]
    means: dict[str, list[Any]] = {}
    for line in lines:
        for key, value in (line.get("keys") or {}).items():
            if isinstance(value, dict) and "mean" in value and len(means) < 8:
                means.setdefault(key, [None] * len(steps))
    for i, line in enumerate(lines):
        for key in means:
            value = (line.get("keys") or {}).get(key)
            means[key][i] = value.get("mean") if isinstance(value, dict) else None
    for key, values in means.items():
        charts.append(Chart(f"health: mean of {key}", steps, {key: values}, marks=marks, width=360, height=220))
    listed = "".join(f"<li>step {s}: {escape(label)}</li>" for s, label in marks[:200])
    return ("<div id=\"health\"><h2>Health of every step</h2>" + (f"<ul>{listed}</ul>" if listed else
                                                                "<p class=\"muted\">No step stands out.</p>")
            + charts_html(charts, specs) + "</div>")


def _check_section(dump_dir: str | os.PathLike[str], stream: str) -> str:
    """Check mode's verdicts of the stream, per step and per sample (paired by key): the samples that
    differ, their first diverging token and the log-prob difference of the tokens before it."""
    from rollout_mock.wrap.check import read_check_verdicts

    verdicts = [v for v in read_check_verdicts(dump_dir) if v.stream == stream]
    if not verdicts:
        return ""
    rows, details = [], []
    for v in verdicts:
        s = v.samples or {}
        rows.append(f"<tr><td>{v.step}</td><td class=\"{'good' if v.passed else 'bad'}\">"
                    f"{'pass' if v.passed else 'FAIL'}</td><td>{v.match:.4f}</td>"
                    f"<td>{escape(str(s.get('paired_by', '-')))}</td>" + "".join(
                        f"<td>{escape(str(s.get(k, '-')))}</td>" for k in ("paired", "identical", "differs", "missing",
                                                                            "extra")) + "</tr>")
        for sample in (x for x in s.get("samples", []) if isinstance(x, dict) and x.get("status") != "equal"):
            details.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in (
                v.step, sample.get("key", "")[:24], sample.get("status"), sample.get("recorded_index"),
                sample.get("live_index"), sample.get("first_diff"), sample.get("recorded_token"),
                sample.get("live_token"), sample.get("logprob_diff_before"))) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("step", "verdict", "match", "paired by", "paired", "identical",
                                              "differ", "missing", "extra"))
    out = f"<h2>Check mode, by sample</h2><table><tr>{head}</tr>{''.join(rows)}</table>"
    if details:
        cols = ("step", "sample key", "status", "recorded #", "live #", "first diverging token", "recorded token",
                "live token", "max |log-prob diff| before it")
        out += ("<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>" + "".join(details[:500])
                + "</table>")
    return out


def write_report(dump_dir: str | os.PathLike[str], output: str | os.PathLike[str], **options: Any) -> Path:
    """Write the HTML report of ``dump_dir`` to ``output`` (atomically) and return its path.

    ``options`` (those of :func:`render_report`): ``split``, the split to show (default:
    ``train``, or the first split with steps when train has none); ``tokenizer``, a loaded
    tokenizer (``None``: token ids); ``logprobs_json``, the output of ``rollout-mock logprobs
    --json``; ``max_samples``, full sample previews per step; ``against``, a second dump to compare
    with, step by step and key by key, or a metrics file (a mock run's ``MetricsWriter`` output,
    CSV, TensorBoard...) compared with the dump run's recorded metrics, bitwise; ``trusted``, load
    with the plain unpickler; ``progress``, a bar over the steps (``None``: on a terminal only);
    ``explain``, reports of ``rollout-mock explain`` to show (paths).
    Raises :class:`DebugInputError` when the stream has no step (nothing to report); a step that
    cannot be read is marked in the page, not raised.
    """
    return render_report(dump_dir, **options).write(output)

"""``rollout-mock report``: one self-contained HTML file to look at a dump (or compare two).

No server and nothing fetched: CSS, JavaScript and the SVG charts are inline. Charts per step:
the reward, response-length and token log-prob distributions (min-max and p25-p75 bands, mean
and median lines), rejected samples, GRPO groups whose members all got one reward, the log-prob
mismatch when a ``rollout-mock logprobs --json`` result is given, and the dump run's metrics
when the dump stores them. Below them: a per-step table, and a sample browser (step -> sortable,
searchable previews -> messages; per-key tensor statistics of the step) showing decoded text with
a local tokenizer, else token ids (the :mod:`rollout_mock.compare.traces` builders).

Size and work are bounded: each step is read with at most
:data:`~rollout_mock.debug.report_data.STATS_ROWS` rows, and only a few previews per step (the
first samples, the lowest and the highest rewards; long texts cut) go into the page.
``against=``: a second dump, compared step by step and key by key (:mod:`~rollout_mock.debug.report_compare`).

Everything read from the dump is untrusted (see :mod:`~rollout_mock.debug.report_page`).
"""

from __future__ import annotations

import json
import math
import os
from html import escape
from pathlib import Path
from typing import Any

from rollout_mock.debug.report_data import STATS_ROWS, StepSummary, summarize_step
from rollout_mock.debug.report_page import DEFAULT_MAX_SAMPLES, page
from rollout_mock.debug.svg import COLORS, Band, fmt, line_chart
from rollout_mock.errors import DebugInputError
from rollout_mock.storage import format_ranges
from rollout_mock.text import write_text_atomic

__all__ = ["DEFAULT_MAX_SAMPLES", "MAX_BROWSER_STEPS", "browsable", "distribution_chart", "summarize_dump",
           "write_report"]

#: Steps offered by the sample browser (previews, tensor statistics, histograms, groups): a page
#: stays a few MB however long the run; charts and the per-step table cover every step.
MAX_BROWSER_STEPS = 300

def _load_logprobs(path: str | os.PathLike[str] | None) -> dict[int, float]:
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return {int(s["step"]): float(s["token_mult_prob_error"]) if not isinstance(s["token_mult_prob_error"], str)
                else math.nan for s in data.get("steps", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        raise DebugInputError(f"--logprobs-json {path}: not the output of `rollout-mock logprobs --json` "
                              f"({type(exc).__name__}: {str(exc)[:200]})") from None


def _q(summaries: list[StepSummary], dist: str, name: str) -> list[float | None]:
    out: list[float | None] = []
    for s in summaries:
        q = s.dist.get(dist)
        out.append(None if q is None else q[name])
    return out


def distribution_chart(title: str, summaries: list[StepSummary], dist: str, color: str = COLORS[0]) -> str:
    """Per step: the min-max and p25-p75 bands, the mean line and the median (dashed)."""
    steps = [s.step for s in summaries]
    bands = [Band("min–max", _q(summaries, dist, "min"), _q(summaries, dist, "max"), color, 0.12),
             Band("p25–p75", _q(summaries, dist, "p25"), _q(summaries, dist, "p75"), color, 0.28)]
    series = {"mean": _q(summaries, dist, "mean"), "median": _q(summaries, dist, "median")}
    return line_chart(title, steps, series, bands=bands, dashed=("median",),
                      colors={"mean": color, "median": "#333"})


def browsable(steps: list[int], limit: int = MAX_BROWSER_STEPS) -> set[int]:
    """The steps the sample browser offers: all of them up to ``limit``, else ``limit`` evenly
    spaced ones (the first and the last included)."""
    if len(steps) <= limit:
        return set(steps)
    return {steps[round(i * (len(steps) - 1) / (limit - 1))] for i in range(limit)}


def summarize_dump(dump: Any, stream: Any, *, tokenizer: Any = None, max_samples: int = DEFAULT_MAX_SAMPLES,
                   trusted: bool = False) -> tuple[list[StepSummary], set[int]]:
    """Every step of ``stream``, each read with bounded work (:func:`summarize_step`), and the
    steps the browser offers (:func:`browsable`: only those keep previews)."""
    steps = dump.steps(stream)
    shown = browsable(steps)
    return [summarize_step(dump, stream, step, tokenizer=tokenizer, max_samples=max_samples if step in shown else 0,
                           trusted=trusted) for step in steps], shown


def step_charts(summaries: list[StepSummary]) -> list[str]:
    """The distribution charts, rejected samples and GRPO groups."""
    steps = [s.step for s in summaries]
    charts = [distribution_chart("reward", summaries, "reward", COLORS[0]),
              distribution_chart("response length (tokens)", summaries, "length", COLORS[2])]
    if any(s.dist.get("logprob") for s in summaries):
        charts.append(distribution_chart("response token log-prob", summaries, "logprob", COLORS[3]))
    charts.append(line_chart("rejected samples", steps, {"rejected": [float(s.rejected) for s in summaries]},
                             colors={"rejected": COLORS[1]}, zero=True))
    if any(s.groups for s in summaries):
        flat = [None if s.groups is None else 100 * s.groups["flat_fraction"] for s in summaries]
        charts.append(line_chart("GRPO groups with one reward for all members (%)", steps,
                                 {"groups without signal (%)": flat}, colors={"groups without signal (%)": COLORS[4]},
                                 zero=True))
    return charts


def _cells(s: StepSummary) -> list[str]:
    r, n = s.dist.get("reward") or {}, s.dist.get("length") or {}
    groups = "-" if s.groups is None else f"{int(s.groups['flat'])}/{int(s.groups['groups'])}"
    return [str(s.step), str(s.total), str(s.rejected), fmt(r.get("mean")), fmt(r.get("min")), fmt(r.get("max")),
            fmt(n.get("mean")), fmt(n.get("min")), fmt(n.get("max")), groups]


def step_table(summaries: list[StepSummary]) -> str:
    head = ["step", "samples", "rejected", "reward mean", "min", "max", "length mean", "min", "max",
            "flat groups"]
    rows = "".join("<tr>" + "".join(f"<td class=\"num\">{escape(c)}</td>" for c in _cells(s)) + "</tr>"
                   for s in summaries)
    opened = " open" if len(summaries) <= 40 else ""
    return (f"<details{opened}><summary>Per-step table ({len(summaries)} steps)</summary><div class=\"scroll\">"
            "<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + f"</tr>{rows}</table></div></details>")


def dump_info(dump: Any, dump_dir: str | os.PathLike[str], stream: Any, steps: int) -> str:
    manifest = dump.manifest
    return (f"{escape(str(Path(dump_dir).resolve()))} &middot; stream {escape(str(stream))} &middot; "
            f"{steps} step{'' if steps == 1 else 's'} &middot; "
            f"written by rollout_mock {escape(str(manifest.writer.get('rollout_mock')))} "
            f"on Python {escape(str(manifest.writer.get('python')))} at {escape(str(manifest.created_at))}")


def write_report(
    dump_dir: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    split: str = "train",
    tokenizer: Any = None,
    logprobs_json: str | os.PathLike[str] | None = None,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    trusted: bool = False,
    against: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the HTML report of ``dump_dir`` to ``output`` (atomically) and return its path.

    ``tokenizer``: a loaded tokenizer (or ``None`` for token ids); ``logprobs_json``: the output of
    ``rollout-mock logprobs --json``; ``max_samples``: sample previews per step in the page;
    ``against``: a second dump to compare with, step by step and key by key; or a metrics file
    (a mock run's ``MetricsWriter`` output, CSV, TensorBoard...) compared with the dump run's
    recorded metrics, bitwise.
    """
    from rollout_mock.compare.expected import read_expected
    from rollout_mock.storage import open_dump

    if max_samples < 0:
        raise DebugInputError(f"max_samples {max_samples}: must be >= 0")
    mismatch = _load_logprobs(logprobs_json)
    dump = open_dump(dump_dir)
    stream = dump.stream(split)
    summaries, shown = summarize_dump(dump, stream, tokenizer=tokenizer, max_samples=max_samples, trusted=trusted)
    steps = [s.step for s in summaries]
    body = ""
    if against is not None and Path(against).is_file():  # a run's metrics file, against the dump run's
        from rollout_mock.debug.report_compare import metrics_comparison_section

        body += metrics_comparison_section(dump_dir, against)
    elif against is not None:
        from rollout_mock.debug.report_compare import comparison_section

        body += comparison_section(dump_dir, against, summaries, split=split, trusted=trusted)
    charts = step_charts(summaries)
    if mismatch:
        charts.append(line_chart("log-prob mismatch (token_mult_prob_error)", steps,
                                 {"mult_prob_err": [mismatch.get(s) for s in steps]}))
    table = read_expected(dump_dir)  # contained: never a link out of the dump, a FIFO or a device
    metric_charts = []
    if table is not None:
        for i, name in enumerate(sorted(table)):
            metric_charts.append(line_chart(name, table.steps, {name: [table[name].get(s) for s in table.steps]},
                                            colors={name: COLORS[i % len(COLORS)]}, width=360, height=200))
    capped = [s.step for s in summaries if s.capped]
    note = (f"<p class=\"muted\">Steps with {STATS_ROWS} samples or more: statistics over their first "
            f"{STATS_ROWS} ({len(capped)} steps: {escape(format_ranges(capped))}).</p>" if capped else "")
    body += (f"<h2>Per step</h2>{note}<div class=\"charts\">{''.join(charts)}</div>{step_table(summaries)}")
    if metric_charts:
        body += f"<h2>Dump run metrics</h2><div class=\"charts\">{''.join(metric_charts)}</div>"
    info = (dump_info(dump, dump_dir, stream, len(steps)) + " &middot; " +
            ("decoded with a tokenizer" if tokenizer is not None else "token ids (no tokenizer)"))
    if len(shown) < len(summaries):
        body += (f"<p class=\"muted\">The sample browser offers {len(shown)} of the {len(summaries)} steps "
                 "(evenly spaced, the first and the last included); the charts and the table cover all.</p>")
    data = {"steps": {str(s.step): s.to_json() for s in summaries if s.step in shown}}
    html = page(f"rollout-mock report: {Path(dump_dir).name}", info, body, data)
    return write_text_atomic(Path(output), html)

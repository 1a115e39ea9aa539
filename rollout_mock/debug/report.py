"""``rollout-mock report``: one self-contained HTML file to look at a dump.

No server and nothing fetched: CSS, JavaScript and the SVG plots are inline. Plots per step:
reward mean/min/max, response length mean/min/max, rejected samples, the log-prob mismatch when
a ``rollout-mock logprobs --json`` result is given, and the dump run's metrics when the dump
stores them. A sample browser (step → samples → messages) shows decoded text with a local
tokenizer, else token ids (the :mod:`rollout_mock.compare.traces` builders).

Everything read from the dump is untrusted: HTML text goes through :func:`html.escape`, the
browser's data is JSON inside ``<script type="application/json">`` with ``<``, ``>``, ``&``
escaped as ``\\u003c``..., and the script only ever sets ``textContent``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from html import escape
from pathlib import Path
from typing import Any

from rollout_mock.debug._files import write_text_atomic
from rollout_mock.debug.svg import line_chart
from rollout_mock.errors import DebugInputError
from rollout_mock.text import jsonable

__all__ = ["write_report"]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 24px 40px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
.muted{color:#777;fill:#777}.charts{display:flex;flex-wrap:wrap;gap:12px}
.chart .ct{font-size:12px;font-weight:600}.chart .tick{font-size:10px;fill:#555}.chart .legend{font-size:11px}
.chart .frame{fill:none;stroke:#ccc}
table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
#browser{display:flex;gap:16px;align-items:flex-start}#samples{max-height:520px;overflow:auto;min-width:260px}
#samples li{cursor:pointer;padding:2px 4px;list-style:none}#samples li.sel{background:#e6f0ff}
#samples ul{padding:0;margin:0}.rej{color:#b00}
#detail{flex:1;min-width:0}.msg{margin:6px 0;padding:6px;border-left:3px solid #ccc;background:#fafafa}
.msg .role{font-weight:600;font-size:12px}.msg pre{white-space:pre-wrap;word-break:break-word;margin:2px 0 0}
.msg.assistant{border-color:#1f77b4}.msg.user{border-color:#2ca02c}.msg.tool{border-color:#ff7f0e}
"""

_JS = """
(function(){
  var data = JSON.parse(document.getElementById('rm-data').textContent);
  var stepSel = document.getElementById('step'), list = document.getElementById('samples'),
      detail = document.getElementById('detail');
  function el(tag, cls, text){var e=document.createElement(tag); if(cls) e.className=cls;
    if(text!==undefined && text!==null) e.textContent=String(text); return e;}
  function showSample(step, i){
    var t = data.steps[step].traces[i]; detail.replaceChildren();
    detail.appendChild(el('h3', null, 'step ' + step + ', sample ' + t.index + ' (' + t.status + ')'));
    detail.appendChild(el('div', 'muted', 'reward: ' + t.reward));
    (t.messages || []).forEach(function(m){
      var box = el('div', 'msg ' + String(m.role).replace(/[^a-z]/g, ''));
      box.appendChild(el('div', 'role', m.role + (m.tokens !== undefined ? ' (' + m.tokens + ' tokens)' : '')));
      box.appendChild(el('pre', null, m.content)); detail.appendChild(box);});
    var meta = el('pre', 'muted', JSON.stringify(t.metadata, null, 1)); detail.appendChild(meta);
    Array.prototype.forEach.call(list.querySelectorAll('li'), function(li){
      li.classList.toggle('sel', li.dataset.i === String(i));});
  }
  function showStep(step){
    var s = data.steps[step]; var ul = el('ul'); list.replaceChildren(ul); detail.replaceChildren();
    list.appendChild(el('div', 'muted', s.traces.length + ' of ' + s.total + ' samples shown'));
    s.traces.forEach(function(t, i){
      var li = el('li', t.status === 'rejected' ? 'rej' : null,
        '#' + t.index + '  reward ' + t.reward + (t.length !== null ? '  len ' + t.length : '') +
        (t.status === 'rejected' ? '  rejected' : ''));
      li.dataset.i = String(i); li.addEventListener('click', function(){showSample(step, i);}); ul.appendChild(li);});
    if (s.traces.length) showSample(step, 0);
  }
  Object.keys(data.steps).forEach(function(step){
    var o = el('option', null, 'step ' + step); o.value = step; stepSel.appendChild(o);});
  stepSel.addEventListener('change', function(){showStep(stepSel.value);});
  if (stepSel.options.length) showStep(stepSel.value);
})();
"""


def _script_json(value: Any) -> str:
    """JSON that cannot end a ``<script>`` element (``<``, ``>``, ``&`` and U+2028/9 escaped)."""
    text = json.dumps(jsonable(value), allow_nan=False, separators=(",", ":"))
    escapes = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))
    for raw, esc in escapes:
        text = text.replace(raw, esc)
    return text


def _stats(values: list[float]) -> tuple[float | None, float | None, float | None]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None, None, None
    return statistics.fmean(finite), min(finite), max(finite)


def _length(trace: Any) -> int | None:
    meta = trace.metadata or {}
    if isinstance(meta.get("completion_tokens"), int):
        return meta["completion_tokens"]
    tokens = [m.get("tokens") for m in trace.messages if m.get("role") == "assistant"]
    return sum(t for t in tokens if isinstance(t, int)) if tokens else None


def _load_logprobs(path: str | os.PathLike[str] | None) -> dict[int, float]:
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return {int(s["step"]): float(s["token_mult_prob_error"]) if not isinstance(s["token_mult_prob_error"], str)
                else math.nan for s in data.get("steps", [])}
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        raise DebugInputError(f"--logprobs-json {path}: not the output of `rollout-mock logprobs --json` "
                              f"({type(exc).__name__}: {str(exc)[:200]})") from None


def write_report(
    dump_dir: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    split: str = "train",
    tokenizer: Any = None,
    logprobs_json: str | os.PathLike[str] | None = None,
    max_samples: int = 64,
    trusted: bool = False,
) -> Path:
    """Write the HTML report of ``dump_dir`` to ``output`` (atomically) and return its path.

    ``tokenizer``: a loaded tokenizer (or ``None`` for token ids); ``logprobs_json``: the output of
    ``rollout-mock logprobs --json``; ``max_samples``: samples per step in the browser.
    """
    from rollout_mock.compare.traces import batch_traces, count_traces
    from rollout_mock.storage.reader import open_dump

    dump = open_dump(dump_dir)
    stream = dump.stream(split)
    steps = dump.steps(stream)
    browser: dict[str, Any] = {}
    rewards: dict[str, list[float | None]] = {"mean": [], "min": [], "max": []}
    lengths: dict[str, list[float | None]] = {"mean": [], "min": [], "max": []}
    rejected: list[float | None] = []
    rows: list[list[str]] = []
    for step in steps:
        batch = dump.load(step, stream, trusted=trusted)
        total = count_traces(batch) or 0
        traces = batch_traces(batch, max_traces=total, tokenizer=tokenizer, step=step)
        ok = [t for t in traces if t.status != "rejected"]
        r = _stats([t.reward for t in ok if isinstance(t.reward, int | float)])
        n = _stats([float(x) for t in ok if (x := _length(t)) is not None])
        for d, v in ((rewards, r), (lengths, n)):
            for key, value in zip(("mean", "min", "max"), v, strict=True):
                d[key].append(value)
        rejected.append(float(len(traces) - len(ok)))
        rows.append([str(step), str(total), str(len(traces) - len(ok)),
                     *("-" if v is None else f"{v:.4g}" for v in (*r, *n))])
        browser[str(step)] = {"total": total, "traces": [
            {**t.to_json(step), "length": _length(t)} for t in traces[:max_samples]]}
    charts = [line_chart("reward", steps, rewards), line_chart("response length (tokens)", steps, lengths),
              line_chart("rejected samples", steps, {"rejected": rejected})]
    mismatch = _load_logprobs(logprobs_json)
    if mismatch:
        charts.append(line_chart("log-prob mismatch (token_mult_prob_error)", steps,
                                 {"mult_prob_err": [mismatch.get(s) for s in steps]}))
    from rollout_mock.debug.expected import read_expected

    table = read_expected(dump_dir)  # contained: never a link out of the dump, a FIFO or a device
    if table is not None:
        for name in sorted(table):
            series = {name: [table[name].get(s) for s in table.steps]}
            charts.append(line_chart(f"dump run: {name}", table.steps, series))
    head = ["step", "samples", "rejected", "reward mean", "min", "max", "length mean", "min", "max"]
    table_html = "<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>"
    manifest = dump.manifest
    info = (f"{escape(str(Path(dump_dir).resolve()))} &middot; stream {escape(str(stream))} &middot; "
            f"{len(steps)} steps &middot; written by rollout_mock {escape(str(manifest.writer.get('rollout_mock')))} "
            f"on Python {escape(str(manifest.writer.get('python')))} at {escape(manifest.created_at)}"
            f" &middot; {'decoded with a tokenizer' if tokenizer is not None else 'token ids (no tokenizer)'}")
    html = (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">"
        f"<title>rollout-mock report: {escape(Path(dump_dir).name)}</title><style>{_CSS}</style></head><body>"
        f"<h1>rollout-mock report</h1><p class=\"muted\">{info}</p>"
        f"<h2>Per step</h2><div class=\"charts\">{''.join(charts)}</div>{table_html}"
        "<h2>Samples</h2><p><label>Step <select id=\"step\"></select></label></p>"
        "<div id=\"browser\"><div id=\"samples\"></div><div id=\"detail\"></div></div>"
        f"<script type=\"application/json\" id=\"rm-data\">{_script_json({'steps': browser})}</script>"
        f"<script>{_JS}</script></body></html>\n"
    )
    return write_text_atomic(Path(output), html)

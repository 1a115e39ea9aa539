"""The HTML page of ``rollout-mock report``: its style, its script and the page around them.

Nothing is fetched: CSS and JavaScript are inline and the Content-Security-Policy forbids any
network access. Data from the dump reaches the page only as text: HTML through
:func:`html.escape`, the browser's data as JSON in ``<script type="application/json">`` (see
:func:`script_json`), and the script only ever sets ``textContent``.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from rollout_mock.text import jsonable

__all__ = ["DEFAULT_MAX_SAMPLES", "page", "script_json"]

#: Sample previews per step in the page (the first ones, the lowest and the highest rewards).
DEFAULT_MAX_SAMPLES = 12

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 24px 40px;color:#222;max-width:1500px}
h1{font-size:20px;margin-bottom:4px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:10px 0 4px}
.muted{color:#666;fill:#666}.charts{display:flex;flex-wrap:wrap;gap:14px}
.chart{background:#fff;border:1px solid #e4e4e4;border-radius:4px}
.chart .ct{font-size:13px;font-weight:600;fill:#222}.chart .tick{font-size:10.5px;fill:#555}
.chart .legend{font-size:11px;fill:#333}.chart .frame{fill:none;stroke:#bbb}
.chart .grid{stroke:#eee}.chart .hover{fill:transparent}.chart .hover:hover{fill:rgba(0,0,0,.06)}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left}th{background:#f6f6f6;position:sticky;top:0}
.num{font-variant-numeric:tabular-nums}.bad{color:#b00;font-weight:600}.good{color:#176b1a}
details>summary{cursor:pointer;margin:8px 0}.scroll{max-height:420px;overflow:auto}
.toolbar{display:flex;gap:16px;align-items:center;flex-wrap:wrap;margin:8px 0}
#browser{display:flex;gap:16px;align-items:flex-start;margin-top:10px}
#samplebox{width:640px;flex:none}#samples{max-height:560px;overflow:auto;border:1px solid #e4e4e4}
#samples ul{padding:0;margin:0}
.srow{display:grid;grid-template-columns:48px 70px 56px 70px 1fr;gap:6px;padding:2px 6px;list-style:none;
 font-variant-numeric:tabular-nums;white-space:nowrap;overflow:hidden}
#samples li{cursor:pointer;border-bottom:1px solid #f2f2f2}#samples li:hover{background:#f5f8ff}
#samples li.sel{background:#e6f0ff}.srow span{overflow:hidden;text-overflow:ellipsis}
.shead{background:#f6f6f6;font-weight:600;position:sticky;top:0}
.shead button{all:unset;cursor:pointer}.shead button:hover{text-decoration:underline}
.rej{color:#b00}.tag{font-size:11px;color:#555;background:#eef;border-radius:3px;padding:0 3px;margin-left:3px}
#detail{flex:1;min-width:0}.msg{margin:6px 0;padding:6px;border-left:3px solid #ccc;background:#fafafa}
.msg .role{font-weight:600;font-size:12px}.msg pre{white-space:pre-wrap;word-break:break-word;margin:2px 0 0}
.msg.assistant{border-color:#1f77b4}.msg.user{border-color:#2ca02c}.msg.tool{border-color:#ff7f0e}
.msg.note{border-color:#aaa;color:#666}.pair{display:flex;gap:32px;flex-wrap:wrap;align-items:flex-start}
#groups .scroll{max-height:300px}
"""

JS = """
(function(){
  var data = JSON.parse(document.getElementById('rm-data').textContent);
  var stepSel = document.getElementById('step'), list = document.getElementById('samples'),
      detail = document.getElementById('detail'), filter = document.getElementById('filter'),
      keys = document.getElementById('keystats'), info = document.getElementById('stepinfo'),
      hists = document.getElementById('hists'), groups = document.getElementById('groups');
  var sortKey = 'index', sortDir = 1, current = null;
  function el(tag, cls, text){var e=document.createElement(tag); if(cls) e.className=cls;
    if(text!==undefined && text!==null) e.textContent=String(text); return e;}
  function num(x){
    if (x===null || x===undefined) return '-'; if (typeof x !== 'number') return String(x);
    if (x === 0) return '0'; var a = Math.abs(x);
    if (a >= 1e-4 && a < 1e6) return String(Number(x.toPrecision(4)));
    return x.toExponential(3).replace(/\\.?0+e/, 'e').replace('e+', 'e');
  }
  function lastText(t){
    var ms = t.messages || [];
    for (var i = ms.length - 1; i >= 0; i--) if (ms[i].role === 'assistant') return String(ms[i].content);
    return ms.length ? String(ms[ms.length - 1].content) : '';
  }
  function haystack(t){
    return [t.index, t.uid || '', (t.why || []).join(' '), t.status].concat((t.messages || []).map(
      function(m){return m.content;})).join(' ').toLowerCase();
  }
  function showSample(step, i){
    var t = data.steps[step].traces[i]; detail.replaceChildren();
    detail.appendChild(el('h3', null, 'step ' + step + ', sample ' + t.index + ' (' + t.status + ')'));
    detail.appendChild(el('div', 'muted', 'reward: ' + num(t.reward) + '   length: ' + num(t.length) +
      (t.uid !== undefined ? '   uid: ' + t.uid : '') +
      ((t.why || []).length ? '   shown as: ' + t.why.join(', ') : '')));
    (t.messages || []).forEach(function(m){
      var box = el('div', 'msg ' + String(m.role).replace(/[^a-z]/g, ''));
      var n = m.tokens !== undefined && m.tokens !== null ? ' (' + m.tokens + ' tokens)' : '';
      box.appendChild(el('div', 'role', m.role + n));
      box.appendChild(el('pre', null, m.content)); detail.appendChild(box);});
    detail.appendChild(el('pre', 'muted', JSON.stringify(t.metadata, null, 1)));
    Array.prototype.forEach.call(list.querySelectorAll('li'), function(li){
      li.classList.toggle('sel', li.dataset.i === String(i));});
  }
  function cell(text, cls){ return el('span', cls || null, text); }
  function renderList(){
    var step = current, s = data.steps[step]; list.replaceChildren();
    var head = el('div', 'srow shead');
    var cols = [['index', '#'], ['reward', 'reward'], ['length', 'length'], ['uid', 'uid'], ['text', 'response']];
    cols.forEach(function(c){
      var b = el('button', null, c[1] + (sortKey === c[0] ? (sortDir > 0 ? ' \\u25b2' : ' \\u25bc') : ''));
      b.addEventListener('click', function(){
        sortDir = sortKey === c[0] ? -sortDir : 1; sortKey = c[0]; renderList(); });
      var span = el('span'); span.appendChild(b); head.appendChild(span);});
    list.appendChild(head);
    var q = filter.value.toLowerCase(), uidOnly = q.indexOf('uid:') === 0 ? q.slice(4).trim() : null;
    var ul = el('ul'), order = s.traces.map(function(t, i){return i;});
    order.sort(function(a, b){
      var x = s.traces[a], y = s.traces[b], u = sortKey === 'text' ? lastText(x) : x[sortKey],
          v = sortKey === 'text' ? lastText(y) : y[sortKey];
      if (u === v) return x.index - y.index; if (u === null || u === undefined) return 1;
      if (v === null || v === undefined) return -1; return (u < v ? -1 : 1) * sortDir;});
    var shown = 0;
    order.forEach(function(i){
      var t = s.traces[i];
      if (uidOnly !== null ? String(t.uid).toLowerCase() !== uidOnly : q && haystack(t).indexOf(q) < 0) return;
      shown++;
      var li = el('li', 'srow' + (t.status === 'rejected' ? ' rej' : ''));
      li.appendChild(cell('#' + t.index)); li.appendChild(cell(num(t.reward), 'num'));
      li.appendChild(cell(num(t.length), 'num')); li.appendChild(cell(t.uid !== undefined ? t.uid : '-'));
      var txt = cell(t.status === 'rejected' ? 'rejected' : lastText(t).slice(0, 160));
      (t.why || []).forEach(function(w){ txt.appendChild(el('span', 'tag', w)); });
      li.appendChild(txt); li.dataset.i = String(i);
      li.addEventListener('click', function(){showSample(step, i);}); ul.appendChild(li);});
    list.appendChild(ul);
    var g = s.groups;
    info.textContent = shown + ' of ' + s.traces.length + ' previews shown (' + s.total +
      ' samples in the step' + (s.capped ? ', statistics over the first ' + s.read : '') + ')' +
      (g ? ' \\u00b7 ' + g.groups + ' GRPO groups, ' + g.flat + ' with one reward for all members' : '') +
      (s.note ? ' \\u00b7 ' + s.note : '');
  }
  function renderKeys(step){
    var rows = data.steps[step].keys || []; keys.replaceChildren();
    if (!rows.length) { keys.appendChild(el('p', 'muted', 'no numeric tensors in this step')); return; }
    var table = el('table'), tr = el('tr');
    ['key', 'dtype', 'shape', 'mean', 'std', 'min', 'max', 'NaN', 'inf'].forEach(function(h){
      tr.appendChild(el('th', null, h)); });
    table.appendChild(tr);
    rows.forEach(function(r){
      var row = el('tr');
      [r.key, r.dtype, '[' + r.shape.join(', ') + ']', num(r.mean), num(r.std), num(r.min), num(r.max)].forEach(
        function(v, j){ row.appendChild(el('td', j > 2 ? 'num' : null, v)); });
      row.appendChild(el('td', r.nan ? 'bad' : 'num', r.nan)); row.appendChild(el('td', r.inf ? 'bad' : 'num', r.inf));
      table.appendChild(row);});
    keys.appendChild(table);
  }
  var NS = 'http://www.w3.org/2000/svg', HIST = {reward: 'reward', length: 'response length',
    logprob: 'response token log-prob'};
  function svg(tag, attrs){ var e = document.createElementNS(NS, tag);
    Object.keys(attrs).forEach(function(k){ e.setAttribute(k, String(attrs[k])); }); return e; }
  function histogram(name, h){
    var w = 300, ht = 136, left = 34, bottom = 22, top = 26, n = h.counts.length;
    var box = svg('svg', {'class': 'chart', width: w, height: ht, viewBox: '0 0 ' + w + ' ' + ht, role: 'img'});
    var title = svg('text', {x: 6, y: 14, 'class': 'ct'});
    title.textContent = (HIST[name] || name) + ' (this step)'; box.appendChild(title);
    var peak = Math.max.apply(null, h.counts) || 1, pw = w - left - 8, ph = ht - top - bottom, bw = pw / n;
    [0, peak].forEach(function(c){ var t = svg('text', {x: left - 4, y: top + ph - c / peak * ph + 4,
      'class': 'tick', 'text-anchor': 'end'}); t.textContent = c; box.appendChild(t); });
    h.counts.forEach(function(c, i){
      var bar = svg('rect', {x: left + i * bw + 1, y: top + ph - c / peak * ph, width: Math.max(1, bw - 2),
        height: c / peak * ph, fill: '#1f77b4', 'fill-opacity': 0.75});
      var label = h.values ? num(h.values[i]) : num(h.lo + (h.hi - h.lo) * i / n) + ' .. ' +
        num(h.lo + (h.hi - h.lo) * (i + 1) / n);
      var tip = svg('title', {}); tip.textContent = label + ': ' + c; bar.appendChild(tip); box.appendChild(bar);
      if (h.values && (n <= 8 || i % Math.ceil(n / 8) === 0)) { var t = svg('text', {x: left + (i + 0.5) * bw,
        y: ht - 6, 'class': 'tick', 'text-anchor': 'middle'}); t.textContent = num(h.values[i]); box.appendChild(t); }
    });
    if (!h.values) [[h.lo, 'start', left], [h.hi, 'end', left + pw]].forEach(function(a){
      var t = svg('text', {x: a[2], y: ht - 6, 'class': 'tick', 'text-anchor': a[1]}); t.textContent = num(a[0]);
      box.appendChild(t); });
    return box;
  }
  function renderHists(step){
    hists.replaceChildren(); var hs = data.steps[step].hist || {};
    Object.keys(hs).forEach(function(name){ if (hs[name]) hists.appendChild(histogram(name, hs[name])); });
  }
  function renderGroups(step){
    var g = data.steps[step].groups; groups.replaceChildren(); if (!g) return;
    groups.appendChild(el('h3', null, 'GRPO groups of this step (' + g.groups + ', ' + g.flat +
      ' with one reward for all members' + (g.table.length < g.groups ? '; ' + g.table.length + ' listed' : '') + ')'));
    var table = el('table'), tr = el('tr');
    ['uid', 'size', 'reward mean', 'reward std'].forEach(function(h){ tr.appendChild(el('th', null, h)); });
    table.appendChild(tr);
    g.table.forEach(function(r){
      var row = el('tr'), a = el('a', null, r[0]); a.href = '#samples';
      a.addEventListener('click', function(ev){ ev.preventDefault(); filter.value = 'uid:' + r[0]; renderList(); });
      var td = el('td'); td.appendChild(a); row.appendChild(td);
      row.appendChild(el('td', 'num', r[1])); row.appendChild(el('td', 'num', num(r[2])));
      row.appendChild(el('td', r[3] === 0 && r[1] > 1 ? 'bad' : 'num', num(r[3]))); table.appendChild(row);});
    groups.appendChild(el('div', 'scroll')).appendChild(table);
  }
  function showStep(step){
    current = step; detail.replaceChildren(); renderList(); renderKeys(step); renderHists(step);
    renderGroups(step);
    if (data.steps[step].traces.length) showSample(step, 0);
  }
  Object.keys(data.steps).sort(function(a, b){return Number(a) - Number(b);}).forEach(function(step){
    var o = el('option', null, 'step ' + step); o.value = step; stepSel.appendChild(o);});
  stepSel.addEventListener('change', function(){showStep(stepSel.value);});
  filter.addEventListener('input', function(){ if (current !== null) renderList(); });
  if (stepSel.options.length) showStep(stepSel.value);
})();
"""

SAMPLES_HTML = (
    "<h2>Samples</h2><div class=\"toolbar\"><label>Step <select id=\"step\"></select></label>"
    "<label>Search <input id=\"filter\" type=\"search\" placeholder=\"text, index, or uid:ID\" size=\"28\"></label>"
    "<span id=\"stepinfo\" class=\"muted\"></span></div><div id=\"hists\" class=\"charts\"></div>"
    "<div id=\"browser\"><div id=\"samplebox\"><div id=\"samples\"></div></div><div id=\"detail\"></div></div>"
    "<div class=\"pair\"><div><h3>Tensor statistics of this step</h3><div id=\"keystats\"></div></div>"
    "<div id=\"groups\"></div></div>"
)


def script_json(value: Any) -> str:
    """JSON that cannot end a ``<script>`` element (``<``, ``>``, ``&`` and U+2028/9 escaped)."""
    text = json.dumps(jsonable(value), allow_nan=False, separators=(",", ":"))
    escapes = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))
    for raw, esc in escapes:
        text = text.replace(raw, esc)
    return text


def page(title: str, info: str, body: str, data: Any) -> str:
    """The whole page: ``info`` and ``body`` are HTML already escaped; ``data`` becomes ``rm-data``."""
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{escape(title)}</h1><p class=\"muted\">{info}</p>{body}{SAMPLES_HTML}"
        f"<script type=\"application/json\" id=\"rm-data\">{script_json(data)}</script>"
        f"<script>{JS}</script></body></html>\n"
    )

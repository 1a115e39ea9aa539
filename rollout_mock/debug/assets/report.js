/* rollout-mock report: draws the charts (uPlot) and runs the sample browser.
   Data comes only from the page's rm-data JSON and is only ever set as textContent. */
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('rm-data').textContent);
  var PR = window.devicePixelRatio || 1;

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function num(x) {
    if (x === null || x === undefined) return '-';
    if (typeof x !== 'number') return String(x);
    if (isNaN(x)) return 'nan';
    if (!isFinite(x)) return x > 0 ? 'inf' : '-inf';
    if (x === 0) return '0';
    var a = Math.abs(x);
    if (a >= 1e-4 && a < 1e6) return String(Number(x.toPrecision(4)));
    return x.toExponential(3).replace(/\.?0+e/, 'e').replace('e+', 'e');
  }

  // ------------------------------------------------------------------------------ charts
  var plots = [], smoothing = 0;
  var lo = document.getElementById('xmin'), hi = document.getElementById('xmax');

  function rgba(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return 'rgba(' + (n >> 16 & 255) + ',' + (n >> 8 & 255) + ',' + (n & 255) + ',' + a + ')';
  }
  function ema(values, w) {
    if (!w) return values.slice();
    var out = [], last = 0, n = 0;
    for (var i = 0; i < values.length; i++) {
      var v = values[i];
      if (v === null) { out.push(null); continue; }
      last = last * w + (1 - w) * v; n++;
      out.push(last / (1 - Math.pow(w, n)));
    }
    return out;
  }
  function niceStep(span, target) {
    var raw = span / target, p = Math.pow(10, Math.floor(Math.log10(raw))), m = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < m.length; i++) if (raw <= m[i] * p * (1 + 1e-9)) return m[i] * p;
    return 10 * p;
  }
  function linearSplits(target, integer) {
    return function (u, axis, min, max) {
      if (!isFinite(min) || !isFinite(max) || !(max > min)) return [min];
      var step = niceStep(max - min, target);
      if (!isFinite(step) || step <= 0) return [min, max];
      if (integer) step = Math.max(1, Math.round(step));
      var first = Math.ceil(min / step - 1e-9) * step, out = [];
      for (var k = 0; k < 40; k++) {
        var v = first + k * step;
        if (v > max + step * 1e-9) break;
        out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
      }
      return out;
    };
  }
  function logSplits(u, axis, min, max) {
    var a = Math.round(Math.log10(min)), b = Math.round(Math.log10(max)), k = Math.max(1, Math.ceil((b - a) / 6));
    var out = [];
    for (var e = a; e <= b; e += k) out.push(Math.pow(10, e));
    return out;
  }
  function yRange(min, max, zero) {
    if (min === null || max === null || !isFinite(min) || !isFinite(max)) return [0, 1];
    if (zero) { min = Math.min(min, 0); max = Math.max(max, 0); }
    if (min === max) {
      if (zero && min === 0) return [0, 1];
      var d = min === 0 ? 1 : Math.abs(min) * 0.1;
      return [min - d, max + d];
    }
    var pad = (max - min) * 0.06;
    return [zero && min === 0 ? 0 : min - pad, zero && max === 0 ? 0 : max + pad];
  }
  function extent(xs) {
    if (!xs.length) return [0, 1];
    var a = xs[0], b = xs[xs.length - 1];
    return a === b ? [a - 1, b + 1] : [a, b];
  }
  function labelSize(u, values) {
    var n = 0;
    (values || []).forEach(function (v) { n = Math.max(n, String(v).length); });
    return Math.max(36, 16 + n * 6.6);
  }

  function drawChart(box, spec) {
    box.appendChild(el('div', 'ct', spec.title));
    if (spec.note) box.appendChild(el('div', 'cnote', spec.note));
    var legend = el('div', 'legend'), tip = el('div', 'tip');
    box.appendChild(legend);
    var cols = [spec.x], series = [{label: 'step'}], bands = [], entries = [], lines = [];
    spec.bands.forEach(function (b) {
      var top = cols.push(b.hi) - 1, bottom = cols.push(b.lo) - 1;
      [top, bottom].forEach(function () { series.push({stroke: 'transparent', width: 0, points: {show: false}}); });
      bands.push({series: [top, bottom], fill: rgba(b.color, b.opacity)});
      entries.push({name: b.name, color: rgba(b.color, Math.min(1, b.opacity * 1.6)), kind: 'band', idx: [top, bottom]});
    });
    spec.series.forEach(function (s) {
      var i = cols.push(spec.log ? s.values : ema(s.values, smoothing)) - 1;
      series.push({label: s.name, stroke: s.color, width: 1.6, dash: s.dash ? [5, 3] : undefined,
        points: {size: 4, fill: s.color}});
      lines.push(i);
      entries.push({name: s.name, color: s.color, kind: s.dash ? 'dash' : 'line', idx: [i]});
    });
    var hovered = false;
    var opts = {
      width: spec.w, height: spec.h, series: series, bands: bands, legend: {show: false},
      scales: {
        x: {time: false, range: function (u, min, max) { return min === max ? [min - 1, max + 1] : [min, max]; }},
        y: spec.log ? {distr: 3, log: 10, range: function () { return spec.yrange; }}
          : {range: function (u, min, max) { return yRange(min, max, spec.zero); }}
      },
      axes: [
        {splits: linearSplits(6, true), values: function (u, v) { return v.map(num); }, size: 36,
          label: 'step', labelSize: 16, labelFont: '11px system-ui,sans-serif', font: '10.5px system-ui,sans-serif'},
        {splits: spec.log ? logSplits : linearSplits(5, false), values: function (u, v) { return v.map(num); },
          filter: function (u, v) { return v; }, size: labelSize, font: '10.5px system-ui,sans-serif',
          grid: {stroke: '#eee'}}
      ],
      cursor: {sync: {key: 'steps'}, drag: {x: true, y: false, setScale: false}, points: {size: 6}},
      hooks: {
        setScale: [function (u, key) {  // the shown step range, readable from the page (and by tests)
          if (key === 'x') { box.dataset.xmin = String(u.scales.x.min); box.dataset.xmax = String(u.scales.x.max); }
        }],
        setSelect: [function (u) {
          if (u.select.width > 3) {
            setRange(Math.floor(u.posToVal(u.select.left, 'x')), Math.ceil(u.posToVal(u.select.left + u.select.width, 'x')));
          }
          u.setSelect({left: 0, top: 0, width: 0, height: 0}, false);
        }],
        setCursor: [function (u) {
          var i = u.cursor.idx;
          if (!hovered || i === null || i === undefined) { tip.style.display = 'none'; return; }
          var text = ['step ' + num(spec.x[i])];
          spec.bands.forEach(function (b) { text.push(b.name + ': ' + num(b.lo[i]) + ' .. ' + num(b.hi[i])); });
          spec.series.forEach(function (s, j) {
            var shown = u.data[lines[j]][i], raw = s.values[i];
            text.push(s.name + ': ' + num(raw) + (smoothing && !spec.log && raw !== null && shown !== raw
              ? '  (smoothed ' + num(shown) + ')' : ''));
          });
          spec.marks.forEach(function (m) { if (m.x === spec.x[i]) text.push('\u2691 ' + m.label); });
          tip.textContent = text.join('\n');
          tip.style.display = 'block';
          var over = u.over.getBoundingClientRect(), frame = box.getBoundingClientRect();
          var x = over.left - frame.left + u.cursor.left + 14, y = over.top - frame.top + u.cursor.top + 14;
          if (x + tip.offsetWidth > frame.width) x = over.left - frame.left + u.cursor.left - tip.offsetWidth - 10;
          tip.style.left = Math.max(0, x) + 'px';
          tip.style.top = y + 'px';
        }],
        draw: [function (u) {
          var ctx = u.ctx, b = u.bbox;
          spec.marks.forEach(function (m) {
            var x = u.valToPos(m.x, 'x', true);
            if (x < b.left - 1 || x > b.left + b.width + 1) return;
            ctx.save();
            var color = m.quiet ? '#7a4fb0' : '#b00';  // quiet: a pinned step, its reasons in the tooltip
            ctx.strokeStyle = color; ctx.fillStyle = color; ctx.lineWidth = (m.quiet ? 1 : 1.5) * PR;
            ctx.setLineDash([4 * PR, 3 * PR]);
            ctx.beginPath(); ctx.moveTo(x, b.top); ctx.lineTo(x, b.top + b.height); ctx.stroke();
            if (m.quiet) { ctx.restore(); return; }
            ctx.font = (11 * PR) + 'px system-ui,sans-serif';
            var right = x > b.left + b.width * 0.6;
            ctx.textAlign = right ? 'right' : 'left';
            ctx.fillText(m.label, x + (right ? -4 : 4) * PR, b.top + 12 * PR);
            ctx.restore();
          });
        }]
      }
    };
    var u = new uPlot(opts, cols, box);
    box.appendChild(tip);
    u.over.addEventListener('mouseenter', function () { hovered = true; });
    u.over.addEventListener('mouseleave', function () { hovered = false; tip.style.display = 'none'; });
    u.over.addEventListener('dblclick', resetRange);
    entries.forEach(function (e) {
      var item = el('span'), mark = el('i', e.kind === 'line' ? null : e.kind);
      if (e.kind === 'band') mark.style.background = e.color; else mark.style.borderTopColor = e.color;
      item.appendChild(mark); item.appendChild(document.createTextNode(e.name));
      item.title = 'click: hide or show';
      item.addEventListener('click', function () {
        var show = item.classList.toggle('off') === false;
        e.idx.forEach(function (i) { u.setSeries(i, {show: show}); });
      });
      legend.appendChild(item);
    });
    plots.push({u: u, spec: spec, lines: lines});
  }

  function setRange(a, b) {
    if (!isFinite(a) || !isFinite(b)) return;
    if (a > b) { var t = a; a = b; b = t; }
    if (a === b) { a -= 0.5; b += 0.5; }
    lo.value = String(Math.round(a)); hi.value = String(Math.round(b));
    plots.forEach(function (p) { p.u.setScale('x', {min: a, max: b}); });
  }
  function resetRange() {
    lo.value = ''; hi.value = '';
    plots.forEach(function (p) { var e = extent(p.spec.x); p.u.setScale('x', {min: e[0], max: e[1]}); });
  }
  function applyInputs() {
    var all = [Infinity, -Infinity];
    plots.forEach(function (p) { var e = extent(p.spec.x); all = [Math.min(all[0], e[0]), Math.max(all[1], e[1])]; });
    var a = lo.value === '' ? all[0] : Number(lo.value), b = hi.value === '' ? all[1] : Number(hi.value);
    if (lo.value === '' && hi.value === '') resetRange(); else setRange(a, b);
  }
  function setSmoothing(w) {
    smoothing = w;
    document.getElementById('smoothval').textContent = w.toFixed(2);
    plots.forEach(function (p) {
      if (p.spec.log) return;
      var cols = p.u.data.slice();
      p.spec.series.forEach(function (s, j) { cols[p.lines[j]] = ema(s.values, w); });
      p.u.setData(cols, false);
      p.u.redraw(false);
    });
  }

  (data.charts || []).forEach(function (spec, i) {
    var box = document.querySelector('.chart[data-chart="' + i + '"]');
    if (box) drawChart(box, spec);
  });
  if (lo) {
    lo.addEventListener('change', applyInputs);
    hi.addEventListener('change', applyInputs);
    document.getElementById('resetzoom').addEventListener('click', resetRange);
    var slider = document.getElementById('smooth');
    slider.addEventListener('input', function () { setSmoothing(Number(slider.value)); });
  }

  // ------------------------------------------------------------------------------ samples
  var steps = data.steps || {};
  var stepSel = document.getElementById('step'), list = document.getElementById('samples'),
    detail = document.getElementById('detail'), filter = document.getElementById('filter'),
    keys = document.getElementById('keystats'), info = document.getElementById('stepinfo'),
    hists = document.getElementById('hists'), groups = document.getElementById('groups');
  var sortKey = 'index', sortDir = 1, current = null, selected = null, rowsCache = {};

  function lastText(t) {
    var ms = t.messages || [];
    for (var i = ms.length - 1; i >= 0; i--) if (ms[i].role === 'assistant') return String(ms[i].content);
    return ms.length ? String(ms[ms.length - 1].content) : '';
  }
  function rowsOf(step) {
    if (rowsCache[step]) return rowsCache[step];
    var s = steps[step], ix = s.rows || {n: 0}, out = [], previews = {};
    (s.traces || []).forEach(function (t) { previews[t.index] = t; });
    for (var i = 0; i < ix.n; i++) {
      var t = previews[i], uid = ix.u && ix.u[i] !== null ? ix.uids[ix.u[i]] : (t && t.uid !== undefined ? t.uid : null);
      var row = {index: i, reward: ix.r ? ix.r[i] : null, length: ix.len ? ix.len[i] : null, uid: uid,
        status: ix.st && ix.st[i] === 'r' ? 'rejected' : 'ok', snippet: ix.t ? ix.t[i] : '', preview: t};
      row.text = t ? (t.status === 'rejected' ? 'rejected' : lastText(t)) : (row.status === 'rejected' ? 'rejected' : row.snippet);
      row.hay = [i, '#' + i, uid === null ? '' : uid, row.status, row.snippet].concat(t ? (t.why || []).concat(
        (t.messages || []).map(function (m) { return m.content; })) : []).join(' ').toLowerCase();
      out.push(row);
    }
    rowsCache[step] = out;
    return out;
  }
  function matches(row, q) {
    if (!q) return true;
    if (q.indexOf('uid:') === 0) return row.uid !== null && String(row.uid).toLowerCase() === q.slice(4).trim();
    return row.hay.indexOf(q) >= 0;
  }
  function shq(s) {  // a shell word: quoted unless plain
    s = String(s);
    return /^[A-Za-z0-9_.\/:=@%+-]+$/.test(s) ? s : "'" + s.replace(/'/g, "'\\''") + "'";
  }
  function command(step, i) {
    var split = data.split && data.split !== 'train' ? ' --split ' + shq(data.split) : '';
    return 'rollout-mock show ' + shq(data.dump || 'DUMP') + split + ' --step ' + step + ' --max ' + (i + 1);
  }
  function showSample(step, row) {
    selected = row ? row.index : null;
    detail.replaceChildren();
    Array.prototype.forEach.call(list.querySelectorAll('li'), function (li) {
      li.classList.toggle('sel', row !== null && li.dataset.i === String(row.index)); });
    if (!row) { detail.appendChild(el('p', 'muted', 'No sample of this step matches the search.')); return; }
    detail.appendChild(el('h3', null, 'step ' + step + ', sample ' + row.index + ' (' + row.status + ')'));
    detail.appendChild(el('div', 'muted', 'reward: ' + num(row.reward) + '   length: ' + num(row.length) +
      (row.uid !== null ? '   uid: ' + row.uid : '') +
      (row.preview && (row.preview.why || []).length ? '   shown as: ' + row.preview.why.join(', ') : '')));
    var t = row.preview;
    if (!t) {
      detail.appendChild(el('p', null, 'Not previewed in this page: each step keeps a few samples in full (the ' +
        'first ones, the lowest and the highest rewards).' + (row.snippet ? ' It starts:' : '')));
      if (row.snippet) detail.appendChild(el('div', 'msg note')).appendChild(el('pre', null, row.snippet));
      var p = el('p', null, 'Read it in full (the last trace printed): ');
      p.appendChild(el('code', null, command(step, row.index)));
      detail.appendChild(p);
      return;
    }
    (t.messages || []).forEach(function (m) {
      var box = el('div', 'msg ' + String(m.role).replace(/[^a-z]/g, ''));
      var count = Array.isArray(m.tokens) ? m.tokens.length : m.tokens;  // slime's messages hold the ids
      var n = count !== undefined && count !== null ? ' (' + count + ' tokens)' : '';
      box.appendChild(el('div', 'role', m.role + n));
      box.appendChild(el('pre', null, m.content));
      detail.appendChild(box);
    });
    detail.appendChild(el('pre', 'muted', JSON.stringify(t.metadata, null, 1)));
  }
  function cell(text, cls) { return el('span', cls || null, text); }
  function renderList() {
    var step = current, s = steps[step];
    list.replaceChildren();
    var head = el('div', 'srow shead');
    [['index', '#'], ['reward', 'reward'], ['length', 'length'], ['uid', 'uid'], ['text', 'response']].forEach(function (c) {
      var b = el('button', null, c[1] + (sortKey === c[0] ? (sortDir > 0 ? ' \u25b2' : ' \u25bc') : ''));
      b.addEventListener('click', function () { sortDir = sortKey === c[0] ? -sortDir : 1; sortKey = c[0]; renderList(); });
      var span = el('span'); span.appendChild(b); head.appendChild(span);
    });
    list.appendChild(head);
    var rows = rowsOf(step), q = filter.value.toLowerCase().trim();
    var shown = rows.filter(function (r) { return matches(r, q); });
    shown.sort(function (x, y) {
      var u = x[sortKey], v = y[sortKey];
      if (u === v) return x.index - y.index;
      if (u === null || u === undefined) return 1;
      if (v === null || v === undefined) return -1;
      return (u < v ? -1 : 1) * sortDir;
    });
    var ul = el('ul');
    shown.forEach(function (r) {
      var li = el('li', 'srow' + (r.status === 'rejected' ? ' rej' : ''));
      li.appendChild(cell('#' + r.index)); li.appendChild(cell(num(r.reward), 'num'));
      li.appendChild(cell(num(r.length), 'num')); li.appendChild(cell(r.uid !== null ? r.uid : '-'));
      var txt = cell(String(r.text).slice(0, 160));
      ((r.preview || {}).why || []).forEach(function (w) { txt.appendChild(el('span', 'tag', w)); });
      li.appendChild(txt);
      li.dataset.i = String(r.index);
      li.addEventListener('click', function () { showSample(step, r); });
      ul.appendChild(li);
    });
    list.appendChild(ul);
    var g = s.groups, previews = (s.traces || []).length;
    info.textContent = shown.length + ' of ' + rows.length + ' samples' + (q ? ' match' : '') + ' (' + previews +
      ' in full' + (s.total > rows.length ? '; ' + s.total + ' in the step, the first ' + rows.length + ' read' : '') +
      ')' + (g ? ' \u00b7 ' + g.groups + ' GRPO groups, ' + g.flat + ' with one reward for all members' : '') +
      (s.note ? ' \u00b7 ' + s.note : '') + (s.error ? ' \u00b7 unreadable: ' + s.error : '');
    var keep = shown.filter(function (r) { return r.index === selected; })[0];
    showSample(step, keep || shown[0] || null);
  }
  function renderKeys(step) {
    var rows = steps[step].keys || [];
    keys.replaceChildren();
    if (!rows.length) { keys.appendChild(el('p', 'muted', 'no numeric tensors in this step')); return; }
    var table = el('table'), tr = el('tr');
    ['key', 'dtype', 'shape', 'mean', 'std', 'min', 'max', 'NaN', 'inf'].forEach(function (h) { tr.appendChild(el('th', null, h)); });
    table.appendChild(tr);
    rows.forEach(function (r) {
      var row = el('tr'), shape = Array.isArray(r.shape) ? '[' + r.shape.join(', ') + ']' : r.shape;
      [r.key, r.dtype, shape, num(r.mean), num(r.std), num(r.min), num(r.max)].forEach(function (v, j) {
        row.appendChild(el('td', j > 2 ? 'num' : null, v)); });
      row.appendChild(el('td', r.nan ? 'bad' : 'num', r.nan)); row.appendChild(el('td', r.inf ? 'bad' : 'num', r.inf));
      table.appendChild(row);
    });
    keys.appendChild(table);
  }
  var NS = 'http://www.w3.org/2000/svg', HIST = {reward: 'reward', length: 'response length', logprob: 'response token log-prob'};
  function svg(tag, attrs) {
    var e = document.createElementNS(NS, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    return e;
  }
  function histogram(name, h) {
    var w = 300, ht = 136, left = 34, bottom = 22, top = 26, n = h.counts.length;
    var box = svg('svg', {'class': 'hist', width: w, height: ht, viewBox: '0 0 ' + w + ' ' + ht, role: 'img'});
    var title = svg('text', {x: 6, y: 14, 'class': 'ct'});
    title.textContent = (HIST[name] || name) + ' (this step)'; box.appendChild(title);
    var peak = Math.max.apply(null, h.counts) || 1, pw = w - left - 8, ph = ht - top - bottom, bw = pw / n;
    [0, peak].forEach(function (c) {
      var t = svg('text', {x: left - 4, y: top + ph - c / peak * ph + 4, 'class': 'tick', 'text-anchor': 'end'});
      t.textContent = c; box.appendChild(t); });
    h.counts.forEach(function (c, i) {
      var bar = svg('rect', {x: left + i * bw + 1, y: top + ph - c / peak * ph, width: Math.max(1, bw - 2),
        height: c / peak * ph, fill: '#1f77b4', 'fill-opacity': 0.75});
      var label = h.values ? num(h.values[i]) : num(h.lo + (h.hi - h.lo) * i / n) + ' .. ' + num(h.lo + (h.hi - h.lo) * (i + 1) / n);
      var tip = svg('title', {}); tip.textContent = label + ': ' + c; bar.appendChild(tip); box.appendChild(bar);
      if (h.values && (n <= 8 || i % Math.ceil(n / 8) === 0)) {
        var t = svg('text', {x: left + (i + 0.5) * bw, y: ht - 6, 'class': 'tick', 'text-anchor': 'middle'});
        t.textContent = num(h.values[i]); box.appendChild(t); }
    });
    if (!h.values) [[h.lo, 'start', left], [h.hi, 'end', left + pw]].forEach(function (a) {
      var t = svg('text', {x: a[2], y: ht - 6, 'class': 'tick', 'text-anchor': a[1]}); t.textContent = num(a[0]);
      box.appendChild(t); });
    return box;
  }
  function renderHists(step) {
    hists.replaceChildren();
    var hs = steps[step].hist || {};
    Object.keys(hs).forEach(function (name) { if (hs[name]) hists.appendChild(histogram(name, hs[name])); });
  }
  function renderGroups(step) {
    var g = steps[step].groups;
    groups.replaceChildren();
    if (!g) return;
    groups.appendChild(el('h3', null, 'GRPO groups of this step (' + g.groups + ', ' + g.flat +
      ' with one reward for all members' + (g.table.length < g.groups ? '; ' + g.table.length + ' listed' : '') + ')'));
    var table = el('table'), tr = el('tr');
    ['uid', 'size', 'reward mean', 'reward std'].forEach(function (h) { tr.appendChild(el('th', null, h)); });
    table.appendChild(tr);
    g.table.forEach(function (r) {
      var row = el('tr'), a = el('a', null, r[0]);
      a.href = '#samples';
      a.addEventListener('click', function (ev) { ev.preventDefault(); filter.value = 'uid:' + r[0]; renderList(); });
      var td = el('td'); td.appendChild(a); row.appendChild(td);
      row.appendChild(el('td', 'num', r[1])); row.appendChild(el('td', 'num', num(r[2])));
      row.appendChild(el('td', r[3] === 0 && r[1] > 1 ? 'bad' : 'num', num(r[3]))); table.appendChild(row);
    });
    groups.appendChild(el('div', 'scroll')).appendChild(table);
  }
  function showStep(step) {
    current = step; selected = null;
    renderList(); renderKeys(step); renderHists(step); renderGroups(step);
  }
  if (!stepSel) return;
  Object.keys(steps).sort(function (a, b) { return Number(a) - Number(b); }).forEach(function (step) {
    var o = el('option', null, 'step ' + step + (steps[step].error ? ' (unreadable)' : ''));
    o.value = step; stepSel.appendChild(o);
  });
  stepSel.addEventListener('change', function () { showStep(stepSel.value); });
  filter.addEventListener('input', function () { if (current !== null) renderList(); });
  if (stepSel.options.length) showStep(stepSel.value);
})();

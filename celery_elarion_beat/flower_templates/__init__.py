"""The ``/elarion`` page, a Tornado template that extends Flower's ``base.html``.

Kept as a Python string (not a data file) so that it ships in every install
without package-data configuration. It renders the board from an embedded JSON
snapshot, then polls ``state_url`` every ``poll_ms`` milliseconds. Per occurrence
it shows the state as a coloured badge (:data:`STATE_BADGES`), the lateness and
the runtime (``340 ms``, ``1.2 s``, ``2 min 5 s``) and the worker; per job an
inline SVG sparkline of the recent runtimes. No script or style is loaded from
anywhere but Flower's own pages.

Above the nodes, the Controls card (each job's pause; Pause, Resume and Run now
buttons) and the Audit card: :mod:`.controls`; then the One-offs card (upcoming and
recent ``schedule_once`` one-offs): :mod:`.one_offs`.
"""

from __future__ import annotations

from . import one_offs
from .controls import CARDS, SCRIPT, STYLE

__all__ = ["PAGE", "PAGE_NAME", "STATE_BADGES"]

PAGE_NAME = "elarion.html"

#: The badge classes of each occurrence state (Bootstrap's, as Flower's task states).
STATE_BADGES = {
    "published": "text-bg-info", "running": "task-state-started",
    "succeeded": "text-bg-success", "failed": "text-bg-danger",
    "retried": "text-bg-warning", "orphaned": "text-bg-dark",
    "missed": "elarion-state-missed", "skipped": "text-bg-secondary",
    "claimed": "text-bg-light border", "paused": "elarion-state-paused",
}

_PAGE = r"""{% extends "base.html" %}

{% block title %}Beat · Flower{% end %}

{% block navbar %}
  {% module Template("navbar.html", active_tab="elarion") %}
{% end %}

{% block container %}
<style>
  .elarion-page .elarion-card { margin-bottom: 1rem; }
  .elarion-page .elarion-card-title { display: flex; flex-wrap: wrap; gap: .5rem 1rem;
    align-items: baseline; padding: .875rem 1rem .5rem; margin: 0; font-size: 1rem; }
  .elarion-page .elarion-card-title small { color: var(--flower-text-muted); font-weight: 400; }
  .elarion-page td, .elarion-page th { white-space: nowrap; }
  .elarion-page td.elarion-skips { white-space: normal; }
  .elarion-page .elarion-skip { margin: 0 .25rem .15rem 0; font-weight: 500; }
  .elarion-page .elarion-empty { padding: 1rem; color: var(--flower-text-muted); }
  .elarion-page code { font-size: .8125rem; }
  .elarion-page .elarion-job td, .elarion-page .elarion-job th { padding-left: .55rem;
    padding-right: .55rem; }
  .elarion-page .elarion-job .task-uuid-full { display: none; }
  .elarion-page .elarion-job .task-uuid-short { display: inline; }
  .elarion-page .elarion-state .badge { font-weight: 600; }
  .elarion-page .elarion-state-missed { color: var(--flower-danger);
    border: 1px solid var(--flower-danger); background: transparent; }
  .elarion-page .elarion-exception { margin-left: .35rem; color: var(--flower-danger);
    font-size: .8125rem; }
  .elarion-page .elarion-spark-box { display: inline-flex; gap: .5rem; align-items: center;
    margin-left: auto; color: var(--flower-text-muted); font-size: .8125rem; font-weight: 400; }
  .elarion-page svg.elarion-spark { overflow: visible; }
  .elarion-page svg.elarion-spark polyline { fill: none; stroke: var(--flower-active);
    stroke-width: 1.5; stroke-linejoin: round; stroke-linecap: round; }
  .elarion-page svg.elarion-spark line { stroke: var(--flower-text-muted); stroke-width: .5;
    opacity: .5; }
  .elarion-page svg.elarion-spark circle { fill: var(--flower-active); }
  .elarion-page svg.elarion-spark circle.elarion-spark-failed { fill: var(--flower-danger); }
  .elarion-page svg.elarion-spark circle.elarion-spark-retried { fill: var(--flower-warning); }
  .elarion-page .elarion-state-paused { color: var(--flower-warning);
    border: 1px solid var(--flower-warning); background: transparent; }
/* controls: style */
</style>
<div class="page-section elarion-page" id="elarion" data-state-url="{{ state_url }}"
     data-task-url="{{ task_url }}" data-poll-ms="{{ poll_ms }}"
     data-controls-url="{{ controls_url }}" data-controls-poll-ms="{{ controls_poll_ms }}"
     data-one-offs-url="{{ one_offs_url }}"
     data-xsrf="{{ xsrf }}">
  <header class="page-header">
    <div>
      <p class="page-eyebrow">Beat cluster</p>
      <p class="page-description">Each due occurrence of a beat entry: which beat node won its
        claim and sent it, how late, how its run went and how long it took, and which nodes
        skipped it and why (celery-elarion-beat events).</p>
    </div>
    <div class="refresh-status" aria-live="polite">
      <span class="status-dot status-dot-live" id="elarion-live" aria-hidden="true"></span>
      <span id="elarion-status">Live</span>
    </div>
  </header>

  <section class="metric-grid" aria-label="Beat summary">
    <article class="metric-card"><p class="metric-label">Beat nodes</p>
      <p class="metric-value" id="elarion-nodes-count">—</p></article>
    <article class="metric-card metric-card-active"><p class="metric-label">Jobs</p>
      <p class="metric-value" id="elarion-jobs-count">—</p></article>
    <article class="metric-card metric-card-success"><p class="metric-label">Dispatched</p>
      <p class="metric-value" id="elarion-dispatched">—</p></article>
    <article class="metric-card metric-card-danger"><p class="metric-label">Skipped</p>
      <p class="metric-value" id="elarion-skipped">—</p></article>
  </section>

<!-- controls: cards -->
<!-- one-offs: card -->

  <section class="workers-table-card elarion-card" aria-label="Beat nodes">
    <h2 class="elarion-card-title">Nodes</h2>
    <table id="elarion-nodes" class="workers-table table table-hover align-middle w-100 mb-0">
      <thead><tr><th>Node</th><th class="text-end">Dispatched</th><th class="text-end">Skipped</th>
        <th>Skip reasons</th><th>Last seen</th><th>Schedule drift</th></tr></thead>
      <tbody></tbody>
    </table>
  </section>

  <div id="elarion-jobs"></div>
</div>
<script type="application/json" id="elarion-initial">{% raw initial %}</script>
{% end %}

{% block extra_scripts %}
<script>
(function () {
  'use strict';
  var root = document.getElementById('elarion');
  var stateUrl = root.dataset.stateUrl, taskUrl = root.dataset.taskUrl;
  var pollMs = parseInt(root.dataset.pollMs, 10) || 2000;
  var BADGE = {'claimed-elsewhere': 'text-bg-secondary', 'claim-error': 'text-bg-danger',
               'publish-error': 'text-bg-danger', 'invalid-entry': 'text-bg-warning'};
  var STATE = {% raw state_badges %};
  var SVG = 'http://www.w3.org/2000/svg';

  var nav = document.querySelector('.app-nav');
  if (nav) {
    var li = el('li', 'nav-item'), a = el('a', 'nav-link active', 'Beat');
    a.href = location.pathname; a.setAttribute('aria-current', 'page');
    li.appendChild(a); nav.appendChild(li);
  }

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function cell(row, content, cls) {
    var td = el('td', cls || '');
    if (content instanceof Node) { td.appendChild(content); } else { td.textContent = content; }
    row.appendChild(td);
    return td;
  }
  function when(iso) { return iso ? iso.replace('T', ' ').replace('Z', ' UTC') : '—'; }
  function ago(ts, now) {
    var s = Math.max(0, Math.round(now - ts));
    if (s < 60) { return s + ' s ago'; }
    if (s < 3600) { return Math.floor(s / 60) + ' min ago'; }
    return Math.floor(s / 3600) + ' h ago';
  }
  function taskLink(id) {
    if (!id) { return el('span', 'value-missing', '—'); }
    var a = el('a', 'elarion-task');
    a.href = taskUrl.replace('__TASK_ID__', encodeURIComponent(id));
    a.title = id;
    a.appendChild(el('span', 'task-uuid-full', id));
    a.appendChild(el('span', 'task-uuid-short', id.slice(0, 8)));
    return a;
  }
  function skips(list) {
    var span = el('span');
    if (!list.length) { span.appendChild(el('span', 'value-missing', '—')); }
    list.forEach(function (s) {
      var badge = el('span', 'badge elarion-skip ' + (BADGE[s.reason] || 'text-bg-secondary'),
                     s.node + ' · ' + s.reason);
      badge.dataset.node = s.node; badge.dataset.reason = s.reason;
      span.appendChild(badge);
    });
    return span;
  }
  function duration(s) {
    if (s === null || s === undefined) { return '—'; }
    if (s < 0.01) { return (s * 1000).toFixed(1) + ' ms'; }
    if (s < 1) { return Math.round(s * 1000) + ' ms'; }
    if (s < 10) { return s.toFixed(1) + ' s'; }
    if (s < 60) { return Math.round(s) + ' s'; }
    var t = Math.round(s), m = Math.floor(s / 60);
    if (t < 3600) { return Math.floor(t / 60) + ' min ' + (t % 60) + ' s'; }
    return Math.floor(m / 60) + ' h ' + (m % 60) + ' min';
  }
  function stateBadge(o) {
    var span = el('span');
    var badge = el('span', 'badge ' + (STATE[o.state] || 'text-bg-secondary'), o.state);
    span.appendChild(badge);
    if (o.exception) { span.appendChild(el('span', 'elarion-exception', o.exception)); }
    return span;
  }
  function svg(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    return node;
  }
  function sparkline(runtimes, states) {
    var box = el('span', 'elarion-spark-box');
    if (!runtimes.length) {
      box.appendChild(el('span', 'value-missing', 'no runs recorded'));
      return box;
    }
    var top = Math.max.apply(null, runtimes), w = 180, h = 28, pad = 3, max = top || 1;
    var step = runtimes.length > 1 ? (w - 2 * pad) / (runtimes.length - 1) : 0;
    var points = runtimes.map(function (v, i) {
      return [pad + i * step, h - pad - (v / max) * (h - 2 * pad)];
    });
    var chart = svg('svg', {'class': 'elarion-spark', width: w, height: h, role: 'img',
                            viewBox: '0 0 ' + w + ' ' + h, 'data-points': runtimes.length});
    var title = svg('title', {});
    title.textContent = 'Runtimes of the last ' + runtimes.length + ' runs, oldest first: ' +
      runtimes.map(duration).join(', ');
    chart.appendChild(title);
    chart.appendChild(svg('line', {x1: 0, x2: w, y1: h - pad, y2: h - pad}));
    chart.appendChild(svg('polyline', {points: points.map(function (p) {
      return p[0].toFixed(1) + ',' + p[1].toFixed(1); }).join(' ')}));
    points.forEach(function (p, i) {  // a dot for the last run and each run that raised
      var state = states[i] || 'succeeded';
      if (i === points.length - 1 || state !== 'succeeded') {
        chart.appendChild(svg('circle', {cx: p[0].toFixed(1), cy: p[1].toFixed(1), r: 2.5,
                                         'class': 'elarion-spark-' + state}));
      }
    });
    box.appendChild(chart);
    box.appendChild(el('span', 'elarion-spark-label', 'last ' +
                       duration(runtimes[runtimes.length - 1]) + ' · max ' + duration(top)));
    return box;
  }
  function reasons(map) {
    var keys = Object.keys(map);
    return keys.length ? keys.map(function (k) { return k + ' ' + map[k]; }).join(', ') : '—';
  }

  function renderNodes(state) {
    var body = document.querySelector('#elarion-nodes tbody');
    body.replaceChildren();
    state.nodes.forEach(function (n) {
      var row = el('tr', 'elarion-node');
      row.dataset.node = n.node;
      cell(row, el('strong', '', n.node));
      cell(row, n.dispatched, 'text-end elarion-node-dispatched');
      cell(row, n.skipped, 'text-end elarion-node-skipped');
      cell(row, reasons(n.reasons));
      cell(row, ago(n.last_seen_ts, state.now_ts), 'elarion-node-seen').title = when(n.last_seen);
      var drift = Object.keys(n.drift || {});
      cell(row, drift.length ? 'differs from ' + drift.join(', ') : 'none');
      body.appendChild(row);
    });
    if (!state.nodes.length) {
      var row = el('tr'), td = cell(row, 'No beat events received yet.', 'elarion-empty');
      td.colSpan = 6; body.appendChild(row);
    }
  }

  function renderJob(job) {
    var card = el('section', 'workers-table-card elarion-card elarion-job');
    card.dataset.job = job.job;
    var title = el('h2', 'elarion-card-title');
    title.appendChild(el('span', '', job.job));
    title.appendChild(el('small', '', (job.task_name || '') + ' · ' + job.dispatched +
                         ' dispatched, ' + job.skipped + ' skipped' +
                         (job.orphaned ? ', ' + job.orphaned + ' orphaned' : '')));
    title.appendChild(sparkline(job.runtimes || [], job.runtime_states || []));
    card.appendChild(title);
    var table = el('table', 'workers-table table table-hover align-middle w-100 mb-0');
    table.innerHTML = '<thead><tr><th>Occurrence</th><th>State</th><th>Winner</th>' +
                      '<th>Task</th><th>Worker</th><th class="text-end">Lateness</th>' +
                      '<th class="text-end">Runtime</th><th>Skipped by</th><th>Notes</th>' +
                      '</tr></thead>';
    var body = el('tbody');
    job.occurrences.forEach(function (o) {
      var row = el('tr', 'elarion-occurrence');
      row.dataset.occurrence = o.occurrence || o.at;
      row.dataset.winner = o.winner || '';
      row.dataset.taskId = o.task_id || '';
      row.dataset.state = o.state;
      cell(row, when(o.occurrence || o.at), 'elarion-when');
      cell(row, stateBadge(o), 'elarion-state');
      cell(row, o.winner || '—', 'elarion-winner');
      cell(row, taskLink(o.task_id), 'elarion-task-id');
      cell(row, o.worker || '—', 'elarion-worker');
      cell(row, duration(o.lateness), 'text-end elarion-lateness');
      cell(row, duration(o.runtime), 'text-end elarion-runtime');
      cell(row, skips(o.skipped), 'elarion-skips');
      cell(row, (o.notes || []).join('; ') || '—', 'elarion-notes');
      body.appendChild(row);
    });
    table.appendChild(body);
    card.appendChild(table);
    return card;
  }

  function render(state) {
    var sum = function (key) {
      return state.nodes.reduce(function (t, n) { return t + n[key]; }, 0);
    };
    document.getElementById('elarion-nodes-count').textContent = state.nodes.length;
    document.getElementById('elarion-jobs-count').textContent = state.jobs.length;
    document.getElementById('elarion-dispatched').textContent = sum('dispatched');
    document.getElementById('elarion-skipped').textContent = sum('skipped');
    renderNodes(state);
    var jobs = document.getElementById('elarion-jobs');
    jobs.replaceChildren.apply(jobs, state.jobs.map(renderJob));
  }

  function status(ok, text) {
    document.getElementById('elarion-live').className =
      'status-dot ' + (ok ? 'status-dot-live' : 'status-dot-error');
    document.getElementById('elarion-status').textContent = text;
  }

  function refresh() {
    fetch(stateUrl, {credentials: 'same-origin', headers: {'Accept': 'application/json'}})
      .then(function (r) { if (!r.ok) { throw new Error('HTTP ' + r.status); } return r.json(); })
      .then(function (state) {
        render(state);
        status(true, 'Live · updated ' + new Date().toLocaleTimeString());
      })
      .catch(function (err) { status(false, 'Update failed: ' + err.message); })
      .then(function () { setTimeout(refresh, pollMs); });
  }

  // controls: script
  // one-offs: script

  render(JSON.parse(document.getElementById('elarion-initial').textContent));
  setTimeout(refresh, pollMs);
  loadControls();
  loadOneOffs();
})();
</script>
{% end %}
"""

#: The page's template: the board, with the Controls and Audit cards (:mod:`.controls`).
PAGE = (_PAGE.replace("/* controls: style */", STYLE)
        .replace("<!-- controls: cards -->", CARDS)
        .replace("  // controls: script", SCRIPT)
        .replace("<!-- one-offs: card -->", one_offs.CARD)
        .replace("  // one-offs: script", one_offs.SCRIPT))

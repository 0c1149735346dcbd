"""The ``/elarion`` page, a Tornado template that extends Flower's ``base.html``.

Kept as a Python string (not a data file) so that it ships in every install
without package-data configuration. It renders the board from an embedded JSON
snapshot, then polls ``state_url`` every ``poll_ms`` milliseconds. Per occurrence
it shows the state as a coloured badge (:data:`STATE_BADGES`), the lateness and
the runtime as the server wrote them (``340ms``, ``1.2s``, ``2m5s``: the package's
one duration formatter) and the worker; per job an
inline SVG sparkline of the recent runtimes. No script or style is loaded from
anywhere but Flower's own pages.

Above the nodes, the Controls card (each job's pause; Pause, Resume and Run now
buttons) and the Audit card: :mod:`.controls`; with ``elarion_beat_flower_edit``, the
Schedule card (the entries and their edit form): :mod:`.schedule`; then the One-offs
card (upcoming and recent ``schedule_once`` one-offs): :mod:`.one_offs`; then the
Every-node card (which live nodes ran each every-node entry): :mod:`.every_node`.
"""

from __future__ import annotations

from . import every_node, one_offs, schedule
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
/* schedule: style */
</style>
<div class="page-section elarion-page" id="elarion" data-state-url="{{ state_url }}"
     data-task-url="{{ task_url }}" data-poll-ms="{{ poll_ms }}"
     data-controls-url="{{ controls_url }}" data-controls-poll-ms="{{ controls_poll_ms }}"
     data-one-offs-url="{{ one_offs_url }}" data-every-node-url="{{ every_node_url }}"
     data-schedule="{{ '1' if schedule_edit else '' }}"
     data-xsrf="{{ xsrf }}">
  <header class="page-header">
    <div>
      <p class="page-eyebrow">Beat cluster <span id="elarion-cluster">{{ cluster }}</span></p>
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

  <section class="workers-table-card elarion-card" id="elarion-foreign" hidden
           aria-label="Beats that claim nothing">
    <h2 class="elarion-card-title">Beats that claim nothing: every occurrence they send goes out
      twice</h2>
    <p class="page-description">The workers received these beat messages without the library's
      headers: a stock <code>celery beat</code>, or a <code>celery worker -B</code> without
      <code>--scheduler elarion</code>, runs beside the claiming beats. Stop it, or set
      <code>beat_scheduler = "elarion"</code> in its configuration.</p>
    <table class="workers-table table table-hover align-middle w-100 mb-0">
      <thead><tr><th>Sender (origin)</th><th>Host</th><th>Tasks (entry)</th>
        <th class="text-end">Messages</th><th>Last seen</th><th>Seen by</th></tr></thead>
      <tbody></tbody>
    </table>
  </section>

<!-- controls: cards -->
<!-- schedule: card -->
<!-- one-offs: card -->
<!-- every-node: card -->

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
               'publish-error': 'text-bg-danger', 'invalid-entry': 'text-bg-warning',
               'clock-fenced': 'text-bg-warning'};
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
  // durations come written by the server (the package's one formatter): 340ms, 1m16s
  function text(t) { return t === null || t === undefined ? '—' : t; }
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
  function sparkline(runtimes, states, texts, maxText) {
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
      texts.map(text).join(', ');
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
                       text(texts[texts.length - 1]) + ' · max ' + text(maxText)));
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
      cell(row, n.last_seen_ago === null ? '—' : n.last_seen_ago + ' ago',
           'elarion-node-seen').title = when(n.last_seen);
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
    title.appendChild(sparkline(job.runtimes || [], job.runtime_states || [],
                                job.runtimes_text || [], job.max_runtime_text));
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
      cell(row, text(o.lateness_text), 'text-end elarion-lateness');
      cell(row, text(o.runtime_text), 'text-end elarion-runtime');
      cell(row, skips(o.skipped), 'elarion-skips');
      cell(row, (o.notes || []).join('; ') || '—', 'elarion-notes');
      body.appendChild(row);
    });
    table.appendChild(body);
    card.appendChild(table);
    return card;
  }

  function renderForeign(state) {
    var card = document.getElementById('elarion-foreign'), senders = state.foreign_beats || [];
    var body = card.querySelector('tbody');
    body.replaceChildren();
    card.hidden = !senders.length;
    senders.forEach(function (f) {
      var row = el('tr', 'elarion-foreign-sender');
      row.dataset.origin = f.origin;
      cell(row, el('strong', '', f.origin));
      cell(row, f.host);
      cell(row, f.tasks.map(function (t) {
        return t.task + (t.entry ? ' (' + t.entry + ')' : '') + ' × ' + t.count;
      }).join(', '));
      cell(row, f.count, 'text-end');
      cell(row, f.last_seen_ago + ' ago').title = when(f.last_seen);
      cell(row, f.worker || '—');
      body.appendChild(row);
    });
  }

  function render(state) {
    var sum = function (key) {
      return state.nodes.reduce(function (t, n) { return t + n[key]; }, 0);
    };
    document.getElementById('elarion-nodes-count').textContent = state.nodes.length;
    document.getElementById('elarion-jobs-count').textContent = state.jobs.length;
    document.getElementById('elarion-dispatched').textContent = sum('dispatched');
    document.getElementById('elarion-skipped').textContent = sum('skipped');
    renderForeign(state);
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
  // schedule: script
  // one-offs: script
  // every-node: script

  render(JSON.parse(document.getElementById('elarion-initial').textContent));
  setTimeout(refresh, pollMs);
  loadControls();
  loadOneOffs();
  loadEveryNode();
  if (root.dataset.schedule) { loadSchedule(); }
})();
</script>
{% end %}
"""

#: The page's template: the board, with the Controls and Audit cards (:mod:`.controls`).
PAGE = (_PAGE.replace("/* controls: style */", STYLE)
        .replace("<!-- controls: cards -->", CARDS)
        .replace("  // controls: script", SCRIPT)
        .replace("/* schedule: style */", schedule.STYLE)
        .replace("<!-- schedule: card -->", schedule.CARD)
        .replace("  // schedule: script", schedule.SCRIPT)
        .replace("<!-- one-offs: card -->", one_offs.CARD)
        .replace("  // one-offs: script", one_offs.SCRIPT)
        .replace("<!-- every-node: card -->", every_node.CARD)
        .replace("  // every-node: script", every_node.SCRIPT))

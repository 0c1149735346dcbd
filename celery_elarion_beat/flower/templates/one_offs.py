"""The One-offs card of the ``/elarion`` page (:mod:`..one_offs`): its markup
and its script, which the page's template takes in (the script inside the page's own,
so that it uses the page's helpers ``el``, ``cell``, ``when``, ``taskLink`` and
``root``).

The script reads ``one_offs_url`` (JSON: ``upcoming`` and ``recent``) when the page
loads and every ``controls_poll_ms``, and draws two tables: the one-offs still to be
sent, soonest first (due, task, key, state, the node leasing it), and the finished
ones, newest first (due, task, key, state, the publishing node, the task id linked to
Flower's task page, attempts, and the error of a failed one).
"""

from __future__ import annotations

__all__ = ["CARD", "SCRIPT"]

CARD = r"""
  <section class="workers-table-card elarion-card" id="elarion-one-offs" aria-label="One-offs">
    <h2 class="elarion-card-title">One-offs
      <small>schedule_once: the next 50 to be sent and the last 50 finished, from the
        claims database</small></h2>
    <div id="elarion-one-offs-message" class="alert alert-danger elarion-message" hidden></div>
    <table id="elarion-one-offs-upcoming"
           class="workers-table table table-hover align-middle w-100 mb-0">
      <thead><tr><th>Due</th><th>Task</th><th>Key</th><th>State</th><th>Node</th>
        <th>Id</th></tr></thead>
      <tbody><tr><td class="elarion-empty" colspan="6">Loading the one-offs…</td></tr></tbody>
    </table>
    <table id="elarion-one-offs-recent"
           class="workers-table table table-hover align-middle w-100 mb-0">
      <thead><tr><th>Due</th><th>Task</th><th>Key</th><th>State</th><th>Node</th>
        <th>Task id</th><th class="text-end">Attempts</th><th>Published / error</th></tr></thead>
      <tbody></tbody>
    </table>
  </section>"""

SCRIPT = r"""
  // -- one-offs: upcoming and recent ----------------------------------------------
  var oneOffsUrl = root.dataset.oneOffsUrl;
  var ONE_OFF_BADGE = {'scheduled': 'text-bg-light border', 'leased': 'text-bg-info',
                       'published': 'text-bg-success', 'failed': 'text-bg-danger',
                       'cancelled': 'text-bg-secondary'};
  function oneOffRow(o, finished) {
    var row = el('tr', 'elarion-one-off');
    row.dataset.id = o.id; row.dataset.state = o.state;
    cell(row, when(o.due), 'elarion-when');
    cell(row, el('code', '', o.task));
    cell(row, o.key || '—', 'elarion-one-off-key');
    cell(row, el('span', 'badge ' + (ONE_OFF_BADGE[o.state] || 'text-bg-secondary'), o.state),
         'elarion-state');
    cell(row, o.node || '—', 'elarion-one-off-node');
    if (!finished) {
      cell(row, el('code', '', o.id.slice(0, 8)), 'elarion-one-off-id').title = o.id;
      return row;
    }
    cell(row, o.state === 'published' ? taskLink(o.id) : el('code', '', o.id.slice(0, 8)),
         'elarion-task-id');
    cell(row, o.attempts, 'text-end elarion-one-off-attempts');
    cell(row, o.error ? el('span', 'elarion-exception', o.error) : when(o.published),
         'elarion-one-off-outcome');
    return row;
  }
  function oneOffRows(id, list, finished, empty) {
    var body = document.querySelector('#' + id + ' tbody');
    body.replaceChildren.apply(body, list.map(function (o) { return oneOffRow(o, finished); }));
    if (!list.length) {
      var row = el('tr'), td = cell(row, empty, 'elarion-empty');
      td.colSpan = finished ? 8 : 6; body.appendChild(row);
    }
  }
  function loadOneOffs() {
    var box = document.getElementById('elarion-one-offs-message');
    fetch(oneOffsUrl, {credentials: 'same-origin', headers: {'Accept': 'application/json'}})
      .then(function (r) {
        return r.json().then(function (body) {
          if (!r.ok) { throw new Error(body.error || ('HTTP ' + r.status)); }
          return body;
        });
      })
      .then(function (data) {
        box.hidden = true;
        oneOffRows('elarion-one-offs-upcoming', data.upcoming, false, 'Nothing scheduled.');
        oneOffRows('elarion-one-offs-recent', data.recent, true, 'None finished yet.');
      })
      .catch(function (err) { box.textContent = 'One-offs: ' + err.message; box.hidden = false; })
      .then(function () { setTimeout(loadOneOffs, controlsPollMs); });
  }"""

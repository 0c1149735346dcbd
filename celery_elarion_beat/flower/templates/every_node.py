"""The Every-node card of the ``/elarion`` page (:mod:`..every_node`): its markup and its
script, which the page's template takes in (the script inside the page's own, so that
it uses the page's helpers ``el``, ``cell``, ``when`` and ``root``).

The script reads ``every_node_url`` (JSON: ``entries``) when the page loads and every
``controls_poll_ms``, and draws one row per every-node entry: its window, the nodes
missing (red: a live node whose workers recorded no run of it), the nodes that ran it
with their runs, and the nodes not tracked (no worker there records runs).
"""

from __future__ import annotations

__all__ = ["CARD", "SCRIPT"]

CARD = r"""
  <section class="workers-table-card elarion-card" id="elarion-every-node"
           aria-label="Every-node runs">
    <h2 class="elarion-card-title">Every-node runs
      <small>per every-node entry, the live beat nodes whose workers ran it in its last two
        periods, from the claims database</small></h2>
    <div id="elarion-every-node-message" class="alert alert-danger elarion-message" hidden></div>
    <table id="elarion-every-node-table"
           class="workers-table table table-hover align-middle w-100 mb-0">
      <thead><tr><th>Entry</th><th>Since</th><th>Missing</th><th>Ran (runs)</th>
        <th>Not tracked</th></tr></thead>
      <tbody><tr><td class="elarion-empty" colspan="5">Loading…</td></tr></tbody>
    </table>
  </section>"""

SCRIPT = r"""
  // -- every-node runs: which live nodes ran each every-node entry -------------------
  var everyNodeUrl = root.dataset.everyNodeUrl;
  function nodeBadges(names, style) {
    var span = el('span', 'elarion-every-node-nodes');
    names.forEach(function (n) { span.appendChild(el('span', 'badge me-1 ' + style, n)); });
    if (!names.length) { span.textContent = '—'; }
    return span;
  }
  function everyNodeRow(e) {
    var missing = e.nodes_missing.length ? ' table-danger' : '';
    var row = el('tr', 'elarion-every-node-entry' + missing);
    row.dataset.job = e.job;
    cell(row, el('code', '', e.job));
    cell(row, when(e.since), 'elarion-when');
    cell(row, nodeBadges(e.nodes_missing, 'text-bg-danger'), 'elarion-every-node-missing');
    cell(row, nodeBadges(Object.keys(e.nodes_ran).sort().map(function (n) {
      return n + ' ' + e.nodes_ran[n]; }), 'text-bg-success'), 'elarion-every-node-ran');
    cell(row, nodeBadges(e.nodes_not_tracked, 'text-bg-light border'),
         'elarion-every-node-untracked');
    return row;
  }
  function loadEveryNode() {
    var box = document.getElementById('elarion-every-node-message');
    fetch(everyNodeUrl, {credentials: 'same-origin', headers: {'Accept': 'application/json'}})
      .then(function (r) {
        return r.json().then(function (body) {
          if (!r.ok) { throw new Error(body.error || ('HTTP ' + r.status)); }
          return body;
        });
      })
      .then(function (data) {
        box.hidden = true;
        var body = document.querySelector('#elarion-every-node-table tbody');
        body.replaceChildren.apply(body, data.entries.map(everyNodeRow));
        if (!data.entries.length) {
          var row = el('tr'), td = cell(row, 'No every-node entries.', 'elarion-empty');
          td.colSpan = 5; body.appendChild(row);
        }
      })
      .catch(function (err) {
        box.textContent = 'Every-node runs: ' + err.message; box.hidden = false;
      })
      .then(function () { setTimeout(loadEveryNode, controlsPollMs); });
  }"""

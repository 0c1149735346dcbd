"""The Controls and Audit cards of the ``/elarion`` page (:mod:`..controls`):
their style, their markup and their script, which the page's template takes in
(the script inside its own, so that it uses the page's helpers: ``el``, ``cell``,
``when``, ``taskLink``, ``root`` and ``STATE``). They are Tornado template text too:
the script reads ``{% raw action_urls %}``.

The script reads ``controls_url`` (JSON: whether this caller may act, the jobs, their
pauses, the audit) when the page loads, every ``controls_poll_ms`` and after each
action, and draws the cards. Unless the controls say ``read_only: true`` (no button at
all) each job gets Pause / Resume / Run now buttons and the card a Pause all / Resume
all pair. While the controls say ``actions: false`` the buttons are disabled, each
with ``actions_reason`` as its title, and a note above the table says the reason (the
card stays readable: the states, the pauses and the audit). A button
asks first (``window.prompt`` for a pause's reason and end and for a run's reason,
``window.confirm`` to resume; cancel sends nothing), then POSTs the form to its URL in
``action_urls`` with the XSRF token the page was rendered with (the ``_xsrf`` field
and the ``X-XSRFToken`` header), and shows the answer's ``message`` or ``error``. A
run refused as a duplicate (409) may be sent again with ``force``.
"""

from __future__ import annotations

__all__ = ["CARDS", "SCRIPT", "STYLE"]

STYLE = r"""
  .elarion-page .elarion-card-actions { margin-left: auto; display: inline-flex; gap: .35rem; }
  .elarion-page td.elarion-actions { text-align: right; }
  .elarion-page td.elarion-actions .btn { margin-left: .25rem; }
  .elarion-page .elarion-pause-who { margin-left: .4rem; color: var(--flower-text-muted);
    font-size: .8125rem; white-space: normal; }
  .elarion-page td.elarion-pause-cell, .elarion-page td.elarion-audit-details {
    white-space: normal; }
  .elarion-page .elarion-banner, .elarion-page .elarion-message { margin: 0 1rem .75rem;
    padding: .5rem .75rem; }
  .elarion-page .elarion-audit-action { font-weight: 600; }"""

CARDS = r"""
  <section class="workers-table-card elarion-card" id="elarion-controls" aria-label="Controls">
    <h2 class="elarion-card-title">Controls
      <small>pause, resume and run now: for the whole cluster, kept in the claims database</small>
      <span class="elarion-card-actions" id="elarion-all-actions"></span></h2>
    <div id="elarion-actions-note" class="alert alert-secondary elarion-banner" role="note"
         hidden></div>
    <div id="elarion-all-paused" class="alert alert-warning elarion-banner" hidden></div>
    <div id="elarion-control-message" class="alert elarion-message" role="status"
         aria-live="polite" hidden></div>
    <table id="elarion-control-jobs"
           class="workers-table table table-hover align-middle w-100 mb-0">
      <thead></thead>
      <tbody><tr><td class="elarion-empty">Loading the controls…</td></tr></tbody>
    </table>
  </section>

  <section class="workers-table-card elarion-card" id="elarion-audit" aria-label="Audit">
    <h2 class="elarion-card-title">Audit
      <small>the last 30 pauses, resumes and runs by hand, newest first</small></h2>
    <table id="elarion-audit-rows" class="workers-table table table-hover align-middle w-100 mb-0">
      <thead><tr><th>When</th><th>Who</th><th>Action</th><th>Job</th><th>Details</th></tr></thead>
      <tbody></tbody>
    </table>
  </section>"""

SCRIPT = r"""
  // -- controls: pause, resume, run now, and the audit ------------------------------

  var controlsUrl = root.dataset.controlsUrl, xsrf = root.dataset.xsrf;
  var controlsPollMs = parseInt(root.dataset.controlsPollMs, 10) || 10000;
  var ACTIONS = {% raw action_urls %};
  var AUDIT = {pause: 'elarion-state-paused', resume: 'text-bg-success',
               trigger: 'text-bg-info'};
  var controlsTimer = null, busy = false;

  function stamp(iso) { return iso ? when(iso.replace(/\.\d+/, '')) : '—'; }
  function jobName(job) { return job === '' ? '(all jobs)' : job; }
  function pauseText(p) {
    var parts = ['by ' + p.paused_by, 'since ' + stamp(p.paused_at)];
    parts.push(p.until ? 'until ' + stamp(p.until) : 'until resumed');
    if (p.reason) { parts.push('“' + p.reason + '”'); }
    return parts.join(' · ');
  }
  function pauseBadge(p, label) {
    var span = el('span', 'elarion-pause');
    span.appendChild(el('span', 'badge ' + STATE.paused, label));
    span.appendChild(el('span', 'elarion-pause-who', pauseText(p)));
    return span;
  }
  var refusedReason = '';  // why this caller may not act ('' : they may)
  function actionButton(label, cls, action, job, enabled) {
    var b = el('button', 'btn btn-sm elarion-action ' + cls, label);
    b.type = 'button';
    b.dataset.action = action; b.dataset.job = job;
    if (refusedReason) { enabled = false; b.title = refusedReason; }
    b.disabled = !enabled || busy;
    b.dataset.enabled = enabled ? '1' : '';
    b.addEventListener('click', function () { ask(action, job); });
    return b;
  }
  function message(ok, text) {
    var box = document.getElementById('elarion-control-message');
    box.className = 'alert elarion-message ' + (ok ? 'alert-success' : 'alert-danger');
    box.dataset.ok = ok ? '1' : '';
    box.textContent = text;
    box.hidden = false;
  }
  function setBusy(on) {
    busy = on;
    document.querySelectorAll('#elarion .elarion-action').forEach(function (b) {
      b.disabled = on || !b.dataset.enabled;
    });
  }

  function ask(action, job) {
    var every = job === '', name = every ? 'every job' : job, fields = {};
    if (every) { fields.all = '1'; } else { fields.job = job; }
    if (action === 'pause') {
      var reason = window.prompt('Pause ' + name + ' on every beat node?\n\n' +
                                 'Reason (optional):', '');
      if (reason === null) { return; }
      var until = window.prompt('Pause ' + name + ' until when?\n\nAn ISO time ' +
                                '(2026-12-01T06:00:00Z) or a duration (30m, 2h); ' +
                                'empty: until resumed.', '');
      if (until === null) { return; }
      fields.reason = reason; fields.until = until;
    } else if (action === 'resume') {
      if (!window.confirm('Resume ' + name + ' on every beat node?')) { return; }
    } else {
      var why = window.prompt('Run ' + name + ' now, once, outside its schedule?\n\n' +
                              'Reason (optional):', '');
      if (why === null) { return; }
      fields.reason = why;
    }
    send(action, fields);
  }

  function send(action, fields) {
    var body = new URLSearchParams(fields);
    body.set('_xsrf', xsrf);
    setBusy(true);
    return fetch(ACTIONS[action], {method: 'POST', credentials: 'same-origin', body: body,
                            headers: {'X-XSRFToken': xsrf, 'Accept': 'application/json'}})
      .then(function (r) {
        return r.text().then(function (text) {
          var data;
          try { data = JSON.parse(text); } catch (e) {
            data = {error: 'HTTP ' + r.status + ' ' + r.statusText};
          }
          return {status: r.status, data: data};
        });
      })
      .then(function (res) {
        var d = res.data;
        if (res.status === 409 && action === 'trigger' && !fields.force &&
            window.confirm(d.error + '\n\nSend another run anyway?')) {
          fields.force = '1';
          return send(action, fields);
        }
        message(res.status < 300, d.message || d.error || 'HTTP ' + res.status);
      })
      .catch(function (err) { message(false, 'The request failed: ' + err.message); })
      .then(function () { setBusy(false); loadControls(); });
  }

  function renderControls(c) {
    var every = c.all_paused, buttons = !c.read_only;
    refusedReason = c.actions ? '' : (c.actions_reason || 'you may not act here');
    root.dataset.actions = c.actions ? '1' : '';
    var note = document.getElementById('elarion-actions-note');
    note.hidden = !refusedReason;
    note.textContent = refusedReason;
    var all = document.getElementById('elarion-all-actions');
    all.replaceChildren();
    if (buttons) {
      all.appendChild(actionButton('Pause all', 'btn-outline-warning', 'pause', '', true));
      all.appendChild(actionButton('Resume all', 'btn-outline-success', 'resume', '', !!every));
    } else {
      all.appendChild(el('small', 'elarion-read-only', 'read-only'));
    }
    var banner = document.getElementById('elarion-all-paused');
    banner.hidden = !every;
    banner.textContent = every ? 'Every job is paused ' + pauseText(every) + '.' : '';
    var table = document.getElementById('elarion-control-jobs');
    table.tHead.innerHTML = '<tr><th>Job</th><th>Task</th><th>Schedule</th><th>State</th>' +
                            (buttons ? '<th class="text-end">Actions</th>' : '') + '</tr>';
    var body = table.tBodies[0];
    body.replaceChildren();
    c.jobs.forEach(function (j) {
      var row = el('tr', 'elarion-control');
      row.dataset.job = j.name;
      row.dataset.paused = j.paused ? 'own' : (every ? 'all' : '');
      cell(row, el('strong', '', j.name));
      cell(row, j.task ? el('code', '', j.task) : el('span', 'value-missing', '—'));
      cell(row, j.schedule || '—');
      cell(row, j.paused ? pauseBadge(j.paused, 'paused') :
                every ? pauseBadge(every, 'paused (all jobs)') :
                el('span', 'badge text-bg-light border', 'active'), 'elarion-pause-cell');
      if (buttons) {
        var td = cell(row, '', 'elarion-actions');
        td.appendChild(actionButton('Pause', 'btn-outline-warning', 'pause', j.name, true));
        td.appendChild(actionButton('Resume', 'btn-outline-success', 'resume', j.name,
                                    !!j.paused));
        td.appendChild(actionButton('Run now', 'btn-outline-primary', 'trigger', j.name, true));
      }
      body.appendChild(row);
    });
    if (!c.jobs.length) {
      var empty = el('tr'), td = cell(empty, 'No beat_schedule entries.', 'elarion-empty');
      td.colSpan = 5; body.appendChild(empty);
    }
    renderAudit(c.audit);
  }

  function renderAudit(rows) {
    var body = document.querySelector('#elarion-audit-rows tbody');
    body.replaceChildren();
    rows.forEach(function (a) {
      var row = el('tr', 'elarion-audit-row');
      row.dataset.action = a.action; row.dataset.job = a.job; row.dataset.actor = a.actor;
      row.dataset.taskId = a.task_id || '';
      cell(row, stamp(a.at), 'elarion-audit-when');
      cell(row, a.actor, 'elarion-audit-actor');
      cell(row, el('span', 'badge elarion-audit-action ' + (AUDIT[a.action] ||
                   'text-bg-secondary'), a.action));
      cell(row, jobName(a.job), 'elarion-audit-job');
      var details = el('span');
      if (a.reason) { details.appendChild(el('span', '', '“' + a.reason + '” ')); }
      if (a.until) { details.appendChild(el('span', '', 'until ' + stamp(a.until) + ' ')); }
      if (a.task_id) {
        details.appendChild(el('span', '', 'task '));
        details.appendChild(taskLink(a.task_id));
      }
      if (a.detail) { details.appendChild(el('span', 'value-missing', ' (' + a.detail + ')')); }
      if (!details.childNodes.length) { details.appendChild(el('span', 'value-missing', '—')); }
      cell(row, details, 'elarion-audit-details');
      body.appendChild(row);
    });
    if (!rows.length) {
      var empty = el('tr'), td = cell(empty, 'No pause, resume or run by hand yet.',
                                      'elarion-empty');
      td.colSpan = 5; body.appendChild(empty);
    }
  }

  function loadControls() {
    clearTimeout(controlsTimer);
    fetch(controlsUrl, {credentials: 'same-origin', headers: {'Accept': 'application/json'}})
      .then(function (r) {
        return r.json().then(function (data) {
          if (!r.ok) { throw new Error(data.error || 'HTTP ' + r.status); }
          return data;
        }, function () { throw new Error('HTTP ' + r.status); });
      })
      .then(function (c) {
        if (!busy) { renderControls(c); }
        root.dataset.controlsLoaded = String(Date.now());
      })
      .catch(function (err) {
        var body = document.querySelector('#elarion-control-jobs tbody');
        var row = el('tr'), td = cell(row, 'The controls are unavailable: ' + err.message,
                                      'elarion-empty elarion-controls-error');
        td.colSpan = 5; body.replaceChildren(row);
        document.getElementById('elarion-all-actions').replaceChildren();
      })
      .then(function () { controlsTimer = setTimeout(loadControls, controlsPollMs); });
  }"""

"""The Schedule card of the ``/elarion`` page (:mod:`..schedule`): its style, its markup
(rendered only with ``elarion_beat_flower_edit``: the template's ``schedule_edit``) and
its script, inside the page's own (it uses the page's helpers ``el``, ``cell``,
``when``, ``root``, and the Controls' ``xsrf`` and ``loadControls``).

The script reads the entries (``schedule_urls.entries``) when the page loads and every
``controls_poll_ms``, and draws them: code entries read-only (with Override when the
entry can be overridden), database entries with Edit, Enable or Disable, and Remove.
Each opens the form with the entry as it was read, and its revision: the conflict
token sent back on save. The form previews the change (``schedule_urls.preview``)
whenever a field changes (and on Preview); Save is enabled once the form as it stands
has been previewed. A 409 (the entry changed meanwhile) shows what happened and a
Reload button that loads the entry as it is now (the reason typed is kept); a 400
marks the field at fault. Every value is set as text (``textContent``, ``value``),
never as HTML.
"""

from __future__ import annotations

__all__ = ["CARD", "SCRIPT", "STYLE"]

STYLE = r"""
  .elarion-page .elarion-schedule-tasks { margin: 0 1rem .5rem; color: var(--flower-text-muted);
    font-size: .8125rem; }
  .elarion-page .elarion-schedule-form { margin: .75rem 1rem 1rem; padding: .75rem 1rem;
    border: 1px solid var(--flower-border, rgba(127, 127, 127, .35)); border-radius: .5rem; }
  .elarion-page .elarion-schedule-form h3 { font-size: 1rem; margin: 0 0 .75rem; }
  .elarion-page .elarion-schedule-form h4 { font-size: .9rem; margin: 1rem 0 .5rem; }
  .elarion-page .elarion-schedule-grid { display: grid; grid-template-columns: 9rem 1fr;
    gap: .5rem .75rem; align-items: start; }
  .elarion-page .elarion-schedule-grid > label { padding-top: .3rem; font-weight: 500; }
  .elarion-page .elarion-schedule-when { display: flex; flex-wrap: wrap; gap: .4rem; }
  .elarion-page .elarion-schedule-when select { max-width: 19rem; }
  .elarion-page .elarion-schedule-when input { max-width: 14rem; }
  .elarion-page .elarion-schedule-grid textarea { font-family: var(--bs-font-monospace);
    font-size: .8125rem; }
  .elarion-page .elarion-help { display: block; color: var(--flower-text-muted);
    font-size: .75rem; margin-top: .2rem; }
  .elarion-page .elarion-schedule-buttons { display: flex; gap: .5rem; align-items: center;
    margin-top: .75rem; }
  .elarion-page .elarion-schedule-form .elarion-message { margin: .75rem 0 0; }
  .elarion-page tr.elarion-preview-effective td { font-weight: 600;
    border-top: 2px solid var(--flower-active); }
  .elarion-page tr.elarion-preview-more td { color: var(--flower-text-muted); }
  .elarion-page .elarion-schedule-scroll { overflow-x: auto; }
  .elarion-page td.elarion-schedule-change { min-width: 13rem; font-size: .8125rem; }
  .elarion-page td.elarion-schedule-state { white-space: normal; min-width: 9rem; }
  .elarion-page td.elarion-schedule-change, .elarion-page .elarion-schedule-problem,
  .elarion-page #elarion-schedule-history-rows td { white-space: normal; }
  .elarion-page .elarion-schedule-problem { display: block; color: var(--flower-warning);
    font-size: .8125rem; }"""

CARD = r"""
{% if schedule_edit %}
  <section class="workers-table-card elarion-card" id="elarion-schedule" aria-label="Schedule">
    <h2 class="elarion-card-title">Schedule
      <small>every entry beat runs; database entries are edited here while the cluster runs,
        each change a revision with who and why</small>
      <span class="elarion-card-actions">
        <button type="button" class="btn btn-sm btn-outline-primary elarion-schedule-action"
                id="elarion-schedule-add" data-action="add" disabled>Add an entry</button>
      </span></h2>
    <div id="elarion-schedule-note" class="alert alert-secondary elarion-banner" role="note"
         hidden></div>
    <p id="elarion-schedule-tasks" class="elarion-schedule-tasks"></p>
    <div id="elarion-schedule-message" class="alert elarion-message" role="status"
         aria-live="polite" hidden></div>
    <div class="elarion-schedule-scroll">
    <table id="elarion-schedule-entries"
           class="workers-table table table-hover align-middle w-100 mb-0">
      <thead><tr><th>Entry</th><th>Task</th><th>Schedule</th><th>State</th>
        <th class="text-end">Revision</th><th>Last change</th>
        <th class="text-end">Actions</th></tr></thead>
      <tbody><tr><td class="elarion-empty" colspan="7">Loading the schedule…</td></tr></tbody>
    </table>
    </div>
    <form id="elarion-schedule-form" class="elarion-schedule-form" hidden novalidate
          autocomplete="off">
      <h3 id="elarion-schedule-form-title"></h3>
      <div id="elarion-schedule-conflict" class="alert alert-warning" role="alert" hidden>
        <span id="elarion-schedule-conflict-text"></span>
        <button type="button" class="btn btn-sm btn-warning ms-2"
                id="elarion-schedule-reload">Reload the entry</button>
      </div>
      <div class="elarion-schedule-grid">
        <label for="elarion-f-name">Name</label>
        <div><input id="elarion-f-name" name="name" class="form-control form-control-sm"
                    maxlength="191"></div>
        <label for="elarion-f-task" data-part="definition">Task</label>
        <div data-part="definition">
          <input id="elarion-f-task" name="task" class="form-control form-control-sm"
                 list="elarion-f-tasks">
          <datalist id="elarion-f-tasks"></datalist>
          <small class="elarion-help" id="elarion-f-task-help"></small></div>
        <label for="elarion-f-kind" data-part="definition">Schedule</label>
        <div data-part="definition"><div class="elarion-schedule-when">
          <select id="elarion-f-kind" name="kind" class="form-select form-select-sm">
            <option value="cron">cron, with seconds: S M H DOM MON DOW</option>
            <option value="crontab">crontab: M H DOM MON DOW</option>
            <option value="every">every N seconds</option>
            <option value="solar">a solar event</option>
          </select>
          <input id="elarion-f-expr" name="expr" class="form-control form-control-sm"
                 data-kinds="cron crontab" placeholder="0 */5 * * * *">
          <input id="elarion-f-tz" name="tz" class="form-control form-control-sm"
                 data-kinds="cron crontab" placeholder="time zone">
          <input id="elarion-f-every" name="every" class="form-control form-control-sm"
                 data-kinds="every" inputmode="decimal" placeholder="seconds">
          <select id="elarion-f-event" name="event" class="form-select form-select-sm"
                  data-kinds="solar"></select>
          <input id="elarion-f-lat" name="lat" class="form-control form-control-sm"
                 data-kinds="solar" inputmode="decimal" placeholder="latitude">
          <input id="elarion-f-lon" name="lon" class="form-control form-control-sm"
                 data-kinds="solar" inputmode="decimal" placeholder="longitude">
        </div>
          <small class="elarion-help" id="elarion-f-kind-help"></small></div>
        <label for="elarion-f-args" data-part="definition">Args</label>
        <div data-part="definition"><textarea id="elarion-f-args" name="args" rows="1"
             class="form-control form-control-sm" placeholder='[1, "a"] (JSON)'></textarea></div>
        <label for="elarion-f-kwargs" data-part="definition">Kwargs</label>
        <div data-part="definition"><textarea id="elarion-f-kwargs" name="kwargs" rows="1"
             class="form-control form-control-sm" placeholder='{"days": 7} (JSON)'></textarea></div>
        <label for="elarion-f-options" data-part="definition">Options</label>
        <div data-part="definition"><textarea id="elarion-f-options" name="options" rows="1"
             class="form-control form-control-sm" placeholder='{"queue": "reports"} (JSON)'
             ></textarea></div>
        <label for="elarion-f-enabled" data-part="enabled">Enabled</label>
        <div data-part="enabled"><input type="checkbox" id="elarion-f-enabled" name="enabled"
             class="form-check-input" checked>
          <small class="elarion-help">unchecked: written disabled (enable it later)</small></div>
        <label for="elarion-f-restart" data-part="restart">Interval</label>
        <div data-part="restart"><input type="checkbox" id="elarion-f-restart" name="restart"
             class="form-check-input">
          <small class="elarion-help">restart the interval at the effective time (else it keeps
            its phase)</small></div>
        <label for="elarion-f-effective" data-part="effective">Effective</label>
        <div data-part="effective">
          <input type="radio" name="effective-mode" value="now" id="elarion-f-now"
                 class="form-check-input" checked>
          <label for="elarion-f-now">now (the database clock)</label>
          <input type="radio" name="effective-mode" value="at" id="elarion-f-at"
                 class="form-check-input ms-3">
          <label for="elarion-f-at">from</label>
          <input id="elarion-f-effective" name="effective" class="form-control form-control-sm"
                 placeholder="2026-12-01T06:00:00Z">
          <small class="elarion-help">an ISO time with an offset: occurrences before it keep the
            entry as it is, from it on the change governs</small></div>
        <label for="elarion-f-reason">Reason</label>
        <div><input id="elarion-f-reason" name="reason" class="form-control form-control-sm"
                    maxlength="500" placeholder="why (kept in the history, with your name)">
        </div>
      </div>
      <div class="elarion-schedule-buttons">
        <button type="button" class="btn btn-sm btn-outline-secondary"
                id="elarion-schedule-preview-button">Preview</button>
        <button type="submit" class="btn btn-sm btn-primary" id="elarion-schedule-save"
                disabled>Save</button>
        <button type="button" class="btn btn-sm btn-link" id="elarion-schedule-cancel">Cancel
        </button>
        <small class="elarion-help" id="elarion-schedule-save-hint"></small>
      </div>
      <div id="elarion-schedule-form-error" class="alert alert-danger elarion-message"
           role="alert" hidden></div>
      <div id="elarion-schedule-preview" hidden>
        <h4>Preview <small id="elarion-schedule-preview-span" class="elarion-help"></small></h4>
        <ul id="elarion-schedule-preview-notes" class="elarion-help"></ul>
        <table id="elarion-schedule-preview-rows"
               class="workers-table table table-sm align-middle w-100 mb-0">
          <thead><tr><th>Governed by</th><th>UTC</th><th>Local</th><th>Offset</th>
            <th>Notes</th></tr></thead>
          <tbody></tbody>
        </table>
      </div>
      <div id="elarion-schedule-history" hidden>
        <h4>History</h4>
        <table id="elarion-schedule-history-rows"
               class="workers-table table table-sm align-middle w-100 mb-0">
          <thead><tr><th class="text-end">Revision</th><th>When</th><th>Who</th><th>Action</th>
            <th>Schedule</th><th>Effective</th><th>Reason</th></tr></thead>
          <tbody></tbody>
        </table>
      </div>
    </form>
  </section>
{% end %}"""

SCRIPT = r"""
  // -- schedule: the entries and the edit form (elarion_beat_flower_edit) ---------------
  var SCHEDULE = {% raw schedule_urls %};
  var scheduleForm = document.getElementById('elarion-schedule-form');
  var sched = {data: null, action: null, name: null, revision: null, previewed: null,
               timer: null, seq: 0, busy: false};
  var SAVE_LABEL = {add: 'Add', edit: 'Save the edit', override: 'Override',
                    enable: 'Enable', disable: 'Disable', remove: 'Remove'};
  var KIND_HELP = {cron: 'six fields, seconds first: "0 30 6 * * mon-fri"',
                   crontab: 'five fields, Celery\'s crontab: "30 6 * * mon-fri"',
                   every: 'an interval in seconds: "30", "0.5"',
                   solar: 'an event (sunrise, dusk, ...) at a latitude and longitude'};
  var DEFINITION_FIELDS = ['task', 'kind', 'expr', 'tz', 'every', 'event', 'lat', 'lon',
                           'args', 'kwargs', 'options'];

  function field(name) { return document.getElementById('elarion-f-' + name); }
  function at(iso) { return iso ? stamp(iso.replace(/\+00:00$/, 'Z')) : '—'; }
  function specText(s) {
    if (!s) { return '—'; }
    if ('every' in s) { return 'every ' + s.every + 's'; }
    if ('solar' in s) { return 'solar ' + s.solar + ' ' + s.lat + ' ' + s.lon; }
    var kind = 'cron' in s ? 'cron' : 'crontab';
    return kind + ' ' + s[kind] + (s.tz ? ' ' + s.tz : '');
  }
  function scheduleNote(id, ok, text) {
    var box = document.getElementById(id);
    box.className = 'alert elarion-message ' + (ok ? 'alert-success' : 'alert-danger');
    box.dataset.ok = ok ? '1' : '';
    box.textContent = text || '';
    box.hidden = !text;
  }
  function entryOf(name) {
    var found = null;
    ((sched.data && sched.data.entries) || []).forEach(function (e) {
      if (e.name === name) { found = e; } });
    return found;
  }
  function scheduleButton(label, cls, action, entry, enabled, title) {
    var b = el('button', 'btn btn-sm elarion-schedule-action ' + cls, label);
    b.type = 'button'; b.dataset.action = action; b.dataset.name = entry.name;
    var may = sched.data && sched.data.edit;
    b.disabled = !may || !enabled;
    b.title = !may ? (sched.data.edit_reason || '') : (title || '');
    b.addEventListener('click', function () { openForm(action, entry.name); });
    return b;
  }
  function stateText(e) {
    if (e.source === 'code') { return e.runs === 'code' ? 'code' : 'code · not running'; }
    return 'database' + (e.overrides ? ' (overrides code)' : '') + ' · ' +
      (e.enabled ? 'enabled' : 'disabled') + (e.runs === 'database' ? '' :
       e.runs === 'code' ? ' · the code entry runs' : ' · nothing runs');
  }
  function changeText(e) {
    if (e.source === 'code') { return el('span', 'value-missing', 'beat_schedule (read-only)'); }
    var span = el('span');
    span.appendChild(el('span', '', e.actor || '?'));
    if (e.reason) { span.appendChild(el('span', '', ': “' + e.reason + '”')); }
    span.appendChild(el('span', 'elarion-help', at(e.updated_at) +
                        (e.effective_at && e.effective_at !== e.updated_at ?
                         ', effective ' + at(e.effective_at) : '')));
    return span;
  }

  function renderSchedule(data) {
    sched.data = data;
    var note = document.getElementById('elarion-schedule-note');
    note.hidden = data.edit; note.textContent = data.edit ? '' : (data.edit_reason || '');
    document.getElementById('elarion-schedule-tasks').textContent =
      data.allowed_tasks.length ? 'Tasks a database entry may start ' +
        '(elarion_beat_db_entry_tasks): ' + data.allowed_tasks.join(', ') :
      'No task may be started by a database entry yet: list the tasks (or glob patterns) ' +
        'in elarion_beat_db_entry_tasks.';
    var add = document.getElementById('elarion-schedule-add');
    add.disabled = !data.edit; add.title = data.edit ? '' : (data.edit_reason || '');
    var body = document.querySelector('#elarion-schedule-entries tbody');
    body.replaceChildren();
    data.entries.forEach(function (e) {
      var row = el('tr', 'elarion-schedule-entry');
      row.dataset.name = e.name; row.dataset.source = e.source;
      row.dataset.revision = e.revision === null ? '' : String(e.revision);
      var name = el('span');
      name.appendChild(el('strong', '', e.name));
      if (e.problem) { name.appendChild(el('span', 'elarion-schedule-problem', e.problem)); }
      cell(row, name);
      cell(row, e.task ? el('code', '', e.task) : el('span', 'value-missing', '—'));
      cell(row, e.schedule || '—', 'elarion-schedule-text');
      cell(row, stateText(e), 'elarion-schedule-state');
      cell(row, e.revision === null ? '—' : e.revision, 'text-end elarion-schedule-revision');
      cell(row, changeText(e), 'elarion-schedule-change');
      var td = cell(row, '', 'elarion-actions');
      if (e.source === 'code') {
        td.appendChild(scheduleButton('Override', 'btn-outline-secondary', 'override', e,
                                      !!e.overridable, e.override_problem));
      } else {
        td.appendChild(scheduleButton('Edit', 'btn-outline-primary', 'edit', e, true));
        td.appendChild(e.enabled ?
          scheduleButton('Disable', 'btn-outline-warning', 'disable', e, true) :
          scheduleButton('Enable', 'btn-outline-success', 'enable', e, true));
        td.appendChild(scheduleButton(e.overrides ? 'Remove the override' : 'Remove',
                                      'btn-outline-danger', 'remove', e, true));
      }
      body.appendChild(row);
    });
    if (!data.entries.length) {
      var empty = el('tr'), cellEmpty = cell(empty, 'No entries.', 'elarion-empty');
      cellEmpty.colSpan = 7; body.appendChild(empty);
    }
    var tasks = document.getElementById('elarion-f-tasks');
    tasks.replaceChildren.apply(tasks, data.allowed_tasks.filter(function (t) {
      return !/[*?\[]/.test(t); }).map(function (t) {
        var option = el('option'); option.value = t; return option; }));
    document.getElementById('elarion-f-task-help').textContent = data.allowed_tasks.length ?
      'allowed: ' + data.allowed_tasks.join(', ') : 'no task is allowed yet';
    var events = field('event');
    if (!events.options.length) {
      data.solar_events.forEach(function (ev) {
        var option = el('option', '', ev); option.value = ev; events.appendChild(option);
      });
    }
    field('tz').placeholder = 'time zone (default ' + data.app_timezone + ')';
  }

  function loadSchedule() {
    clearTimeout(sched.poll);
    return fetch(SCHEDULE.entries, {credentials: 'same-origin',
                                    headers: {'Accept': 'application/json'}})
      .then(function (r) {
        return r.json().then(function (data) {
          if (!r.ok) { throw new Error(data.error || 'HTTP ' + r.status); }
          return data;
        }, function () { throw new Error('HTTP ' + r.status); });
      })
      .then(function (data) {
        renderSchedule(data);
        root.dataset.scheduleLoaded = String(Date.now());
      })
      .catch(function (err) {
        scheduleNote('elarion-schedule-message', false,
                     'The schedule is unavailable: ' + err.message);
      })
      .then(function () { sched.poll = setTimeout(loadSchedule, controlsPollMs); });
  }

  // -- the form ----------------------------------------------------------------------

  function showKind() {
    var kind = field('kind').value;
    document.querySelectorAll('#elarion-schedule-form [data-kinds]').forEach(function (i) {
      i.hidden = i.dataset.kinds.split(' ').indexOf(kind) < 0;
    });
    document.getElementById('elarion-f-kind-help').textContent = KIND_HELP[kind] || '';
    var restart = sched.action === 'edit' && kind === 'every';
    document.querySelectorAll('#elarion-schedule-form [data-part="restart"]').forEach(
      function (n) { n.hidden = !restart; });
  }
  function fillDefinition(d) {
    var s = (d && d.schedule) || {};
    var kind = ['cron', 'crontab', 'every', 'solar'].filter(function (k) {
      return k in s; })[0] || 'cron';
    field('task').value = (d && d.task) || '';
    field('kind').value = kind;
    field('expr').value = (kind === 'cron' || kind === 'crontab') ? s[kind] : '';
    field('tz').value = s.tz || '';
    field('every').value = kind === 'every' ? String(s.every) : '';
    field('event').value = kind === 'solar' ? s.solar : field('event').value;
    field('lat').value = kind === 'solar' ? String(s.lat) : '';
    field('lon').value = kind === 'solar' ? String(s.lon) : '';
    field('args').value = JSON.stringify(d ? d.args : []);
    field('kwargs').value = JSON.stringify(d ? d.kwargs : {});
    field('options').value = JSON.stringify(d ? d.options : {});
    field('enabled').checked = d ? d.enabled !== false : true;
    field('restart').checked = false;
  }
  function showParts(action) {
    var definition = ['add', 'edit', 'override'].indexOf(action) >= 0;
    document.querySelectorAll('#elarion-schedule-form [data-part]').forEach(function (n) {
      var part = n.dataset.part;
      n.hidden = part === 'enabled' ? ['add', 'override'].indexOf(action) < 0 :
                 part === 'effective' ? action === 'remove' : false;
    });
    DEFINITION_FIELDS.forEach(function (name) { field(name).disabled = !definition; });
    field('name').readOnly = action !== 'add';
    showKind();
  }
  function clearInvalid() {
    document.querySelectorAll('#elarion-schedule-form .is-invalid').forEach(function (n) {
      n.classList.remove('is-invalid'); });
  }
  function openForm(action, name, keep) {
    var entry = name ? entryOf(name) : null;
    if (name && !entry) {
      scheduleNote('elarion-schedule-message', false, name + ' is no longer in the schedule.');
      closeForm();
      return;
    }
    sched.action = action; sched.name = name || null;
    sched.revision = entry && entry.source !== 'code' ? entry.revision : null;
    var title = {add: 'Add an entry', edit: 'Edit ', override: 'Override the code entry ',
                 enable: 'Enable ', disable: 'Disable ', remove: 'Remove '}[action];
    document.getElementById('elarion-schedule-form-title').textContent = title +
      (name || '') + (sched.revision !== null ? ' (revision ' + sched.revision + ')' : '');
    scheduleForm.dataset.action = action;
    scheduleForm.dataset.name = name || '';
    scheduleForm.dataset.revision = sched.revision === null ? '' : String(sched.revision);
    field('name').value = name || '';
    fillDefinition(entry ? entry.definition : null);
    if (!keep) {
      field('reason').value = '';
      field('effective').value = '';
      field('now').checked = true;
    }
    showParts(action);
    document.getElementById('elarion-schedule-save').textContent = SAVE_LABEL[action];
    document.getElementById('elarion-schedule-conflict').hidden = true;
    scheduleNote('elarion-schedule-form-error', false, '');
    clearInvalid();
    scheduleForm.hidden = false;
    sched.previewed = null;
    renderPreview(null);
    loadHistory(sched.revision !== null ? name : null);
    scheduleForm.scrollIntoView({block: 'nearest'});
    preview();
  }
  function closeForm() {
    scheduleForm.hidden = true;
    sched.action = null; sched.name = null; sched.revision = null; sched.previewed = null;
    clearTimeout(sched.timer);
  }

  function formFields() {
    var action = sched.action, out = {name: field('name').value};
    if (sched.revision !== null) { out.revision = String(sched.revision); }
    if (action !== 'remove' && field('at').checked) { out.effective = field('effective').value; }
    if (['add', 'edit', 'override'].indexOf(action) >= 0) {
      var kind = field('kind').value;
      out.task = field('task').value; out.kind = kind;
      if (kind === 'cron' || kind === 'crontab') {
        out.expr = field('expr').value; out.tz = field('tz').value;
      } else if (kind === 'every') {
        out.every = field('every').value;
      } else {
        out.event = field('event').value; out.lat = field('lat').value;
        out.lon = field('lon').value;
      }
      out.args = field('args').value; out.kwargs = field('kwargs').value;
      out.options = field('options').value;
      if (action !== 'edit') { out.enabled = field('enabled').checked ? '1' : '0'; }
      if (action === 'edit' && kind === 'every') {
        out.restart = field('restart').checked ? '1' : '0';
      }
    }
    return out;
  }
  function formKey() { return JSON.stringify([sched.action, formFields()]); }
  function updateSave() {
    var save = document.getElementById('elarion-schedule-save');
    var ready = sched.previewed !== null && sched.previewed === formKey();
    save.disabled = !ready || sched.busy || !(sched.data && sched.data.edit);
    document.getElementById('elarion-schedule-save-hint').textContent = ready ? '' :
      'the preview of the form as it stands comes first';
  }
  function markInvalid(name) {
    var input = name && field(name);
    if (input) { input.classList.add('is-invalid'); }
  }

  function answerOf(r) {
    return r.text().then(function (text) {
      var data;
      try { data = JSON.parse(text); } catch (e) {
        data = {error: 'HTTP ' + r.status + ' ' + r.statusText};
      }
      return {status: r.status, data: data};
    });
  }
  function showConflict(d) {
    var box = document.getElementById('elarion-schedule-conflict');
    var now = d.current_revision === null || d.current_revision === undefined ? '' :
      ' It is at revision ' + d.current_revision + ' now.';
    document.getElementById('elarion-schedule-conflict-text').textContent =
      'Conflict: ' + d.error + now;
    box.dataset.currentRevision = now ? String(d.current_revision) : '';
    box.hidden = false;
    sched.previewed = null;
    updateSave();
  }
  function failed(res) {
    var d = res.data;
    if (res.status === 409) { showConflict(d); return; }
    scheduleNote('elarion-schedule-form-error', false, d.error || 'HTTP ' + res.status);
    markInvalid(d.field);
  }

  function preview() {
    clearTimeout(sched.timer);
    if (!sched.action) { return; }
    var key = formKey(), seq = ++sched.seq;
    var query = new URLSearchParams(formFields());
    query.set('action', sched.action);
    fetch(SCHEDULE.preview + '?' + query.toString(),
          {credentials: 'same-origin', headers: {'Accept': 'application/json'}})
      .then(answerOf)
      .then(function (res) {
        if (seq !== sched.seq) { return; }  // a later preview is under way
        clearInvalid();
        if (res.status !== 200) {
          renderPreview(null);
          sched.previewed = null;
          failed(res);
        } else {
          scheduleNote('elarion-schedule-form-error', false, '');
          renderPreview(res.data);
          sched.previewed = key;
        }
        updateSave();
      })
      .catch(function (err) {
        scheduleNote('elarion-schedule-form-error', false, 'The preview failed: ' + err.message);
      });
  }
  function later() {
    if (sched.previewed !== null && sched.previewed === formKey()) { return; }  // a blur
    sched.previewed = null;
    updateSave();
    clearTimeout(sched.timer);
    sched.timer = setTimeout(preview, 500);
  }

  function previewRow(body, side, o, cls) {
    var row = el('tr', 'elarion-preview-row ' + (cls || ''));
    row.dataset.side = side; row.dataset.utc = o.utc; row.dataset.governs = o.governs;
    cell(row, o.governs, 'elarion-preview-governs');
    cell(row, when(o.utc), 'elarion-preview-utc');
    cell(row, o.local.replace('T', ' ') + ' ' + o.zone, 'elarion-preview-local');
    cell(row, o.offset, 'elarion-preview-offset');
    var notes = [];
    if (o.dst_mark) { notes.push(o.dst_mark); }
    if (o.paused) { notes.push('paused by ' + o.paused.paused_by); }
    if (o.anchor) { notes.push(o.anchor); }
    cell(row, notes.join('; ') || '—', 'elarion-preview-notes').dataset.dst = o.dst_mark || '';
    body.appendChild(row);
  }
  function lineRow(body, cls, text) {
    var row = el('tr', cls), td = cell(row, text);
    td.colSpan = 5; body.appendChild(row);
  }
  function renderPreview(p) {
    var box = document.getElementById('elarion-schedule-preview');
    var body = document.querySelector('#elarion-schedule-preview-rows tbody');
    body.replaceChildren();
    box.hidden = !p;
    scheduleForm.dataset.previewed = p ? String(Date.now()) : '';
    if (!p) { return; }
    var effectiveNow = p.effective === p.now;
    document.getElementById('elarion-schedule-preview-span').textContent =
      'the next occurrences' + (effectiveNow ? ', from now' :
      ' before and after the effective time ' + when(p.effective)) + ' (read at ' +
      when(p.now) + ')';
    var notes = document.getElementById('elarion-schedule-preview-notes');
    notes.replaceChildren.apply(notes, p.notes.map(function (n) { return el('li', '', n); }));
    p.before.occurrences.forEach(function (o) { previewRow(body, 'before', o); });
    if (p.before.more) {
      lineRow(body, 'elarion-preview-more', '… more until the effective time');
      if (p.before.last) { previewRow(body, 'before', p.before.last, 'elarion-preview-last'); }
    }
    if (!effectiveNow || p.before.occurrences.length) {
      lineRow(body, 'elarion-preview-effective', 'effective ' + when(p.effective) + ': ' +
              (p.after.governs.join(', ') || 'nothing runs'));
    }
    p.after.occurrences.forEach(function (o) { previewRow(body, 'after', o); });
    if (!p.after.occurrences.length) {
      lineRow(body, 'elarion-preview-none', 'No occurrence from the effective time on (' +
              (p.after.governs.join(', ') || 'nothing runs') + ').');
    } else if (p.after.more) {
      lineRow(body, 'elarion-preview-more', '… and later');
    }
  }

  function loadHistory(name) {
    var box = document.getElementById('elarion-schedule-history');
    var body = document.querySelector('#elarion-schedule-history-rows tbody');
    body.replaceChildren();
    box.hidden = !name;
    if (!name) { return; }
    fetch(SCHEDULE.history + '?' + new URLSearchParams({name: name}).toString(),
          {credentials: 'same-origin', headers: {'Accept': 'application/json'}})
      .then(answerOf)
      .then(function (res) {
        if (res.status !== 200) { throw new Error(res.data.error || 'HTTP ' + res.status); }
        res.data.revisions.forEach(function (h) {
          var row = el('tr', 'elarion-history-row');
          row.dataset.revision = String(h.revision); row.dataset.actor = h.actor;
          row.dataset.action = h.action;
          cell(row, h.revision, 'text-end');
          cell(row, at(h.at));
          cell(row, h.actor, 'elarion-history-actor');
          cell(row, h.action);
          cell(row, specText(h.schedule));
          cell(row, at(h.effective_at));
          cell(row, h.reason || '—', 'elarion-history-reason');
          body.appendChild(row);
        });
      })
      .catch(function (err) {
        var row = el('tr'), td = cell(row, 'The history is unavailable: ' + err.message);
        td.colSpan = 7; body.appendChild(row);
      });
  }

  function scheduleSave(event) {
    event.preventDefault();
    if (document.getElementById('elarion-schedule-save').disabled) { return; }
    var action = sched.action, body = new URLSearchParams(formFields());
    body.set('reason', field('reason').value);
    body.set('_xsrf', xsrf);
    sched.busy = true; updateSave();
    fetch(SCHEDULE[action], {method: 'POST', credentials: 'same-origin', body: body,
                             headers: {'X-XSRFToken': xsrf, 'Accept': 'application/json'}})
      .then(answerOf)
      .then(function (res) {
        clearInvalid();
        if (res.status === 200) {
          closeForm();
          scheduleNote('elarion-schedule-message', true, res.data.message);
          loadControls();
          return loadSchedule();
        }
        failed(res);
      })
      .catch(function (err) {
        scheduleNote('elarion-schedule-form-error', false, 'The request failed: ' + err.message);
      })
      .then(function () { sched.busy = false; updateSave(); });
  }

  function reloadEntry() {
    var action = sched.action, name = sched.name;
    loadSchedule().then(function () {
      if (action && name) { openForm(action, name, true); }
    });
  }

  if (scheduleForm) {
    scheduleForm.addEventListener('submit', scheduleSave);
    scheduleForm.addEventListener('input', function (event) {
      if (event.target === field('reason')) { return; }
      if (event.target === field('effective')) { field('at').checked = true; }
      later();
    });
    scheduleForm.addEventListener('change', function (event) {
      if (event.target === field('kind')) { showKind(); }
      if (event.target !== field('reason')) { later(); }
    });
    document.getElementById('elarion-schedule-preview-button').addEventListener(
      'click', preview);
    document.getElementById('elarion-schedule-cancel').addEventListener('click', closeForm);
    document.getElementById('elarion-schedule-reload').addEventListener('click', reloadEntry);
    document.getElementById('elarion-schedule-add').addEventListener(
      'click', function () { openForm('add', null); });
  }"""

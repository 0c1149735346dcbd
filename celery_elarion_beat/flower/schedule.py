"""Flower: the Schedule card of the ``/elarion`` page, the edit form of the schedule's
database entries (:mod:`..live_schedules`), with a preview of each change.

Off unless ``elarion_beat_flower_edit`` is True (and ``elarion_beat_db_entries``, which
the beat nodes need too): the page then has no card, and every URL below answers 403
naming the setting (:data:`.operators.EDIT_OFF`, :data:`.operators.NO_DB_ENTRIES`). Once
on, the callers who may press the buttons may edit (:func:`.operators.edit_refusal`);
everyone else Flower lets in sees the entries read-only, without their arguments.

* ``GET /elarion/api/schedule``: JSON ``{edit, edit_reason, caller, allowed_tasks,
  kinds, solar_events, app_timezone, override_policy, entries, now}``: every entry,
  code and database (:meth:`.EntryView.as_dict`: ``source``, ``revision``, ``runs``,
  ``problem``, who changed it last, when and why), with its ``definition`` (task,
  schedule, args, kwargs, options, enabled) for a caller who may edit; a code entry
  also says whether it can be overridden (``overridable``, else ``override_problem``);
* ``GET /elarion/api/schedule/history?name=NAME``: its last :data:`HISTORY_ROWS`
  revisions, newest first (who, when, what, why, effective from when);
* ``GET /elarion/api/schedule/preview?action=ACTION&...`` (the fields of the change):
  its next occurrences across its effective time (:mod:`..operate.change_preview`);
* ``POST /elarion/api/schedule/<action>``: ``add``, ``edit``, ``override``, ``enable``,
  ``disable``, ``remove``, with form fields ``name``; ``revision`` (the conflict token:
  the revision the form was loaded with; required but for add and override);
  ``reason`` (required); ``task``; the schedule: ``kind`` (``cron``: ``expr`` six
  fields, seconds first, and ``tz``; ``crontab``: five fields and ``tz``; ``every``:
  seconds; ``solar``: ``event``, ``lat``, ``lon``); ``args``, ``kwargs``, ``options``
  (JSON; blank: none); ``enabled`` (add, override); ``effective`` (an ISO time with an
  offset, blank: now; not for remove); ``restart`` (an interval counts from the
  effective time). A field not sent stays as it is (an edit).

Answers: ``{ok, message, entry, version, unchanged}``; or ``{error, field}`` with 400
(bad input, naming the field and the fix; nothing written), ``{error}`` with 403 (the
form is off, this caller may not edit, or the XSRF check), 404 (no such entry),
``{error, conflict, current_revision, entry}`` with 409 (``conflict``: ``revision``,
the entry changed since the form was loaded; ``name``, the name is taken; nothing
written), or 503 (the claims database). The write endpoints are
:class:`.controls.ActionHandler`\\ s: refused before they read their form, then
Tornado's XSRF check. The change is written as the Flower user
(:attr:`.operators.Caller.actor`, ``bob (flower)``), into the revision history.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import tornado.web
from celery.schedules import solar

from ..config.entries import read_schedule
from ..config.live_entries import (
    SCHEDULE_KINDS,
    EntryDefinition,
    check_definition,
    live_cluster,
    spec_of_schedule,
)
from ..exceptions import ConfigurationError, EntryConflict, EntryNotFound
from ..live_schedules import api
from ..operate.change_preview import SIDE_LIMIT, preview_change
from ..schedules.slots import iso
from ..store.control_records import REASON_MAX
from .controls import ActionHandler, Panel, Refused, _Unconfigured, panel
from .operators import EDIT_OFF, NO_DB_ENTRIES, Caller, actor_of, caller_of, edit_refusal

__all__ = ["EDIT_ACTIONS", "HISTORY_ROWS", "ScheduleAction", "ScheduleEntries",
           "ScheduleHandler", "ScheduleHistory", "SchedulePreview", "change_of", "edit_on",
           "field_of"]

#: The write URLs: ``/elarion/api/schedule/<action>``.
EDIT_ACTIONS = ("add", "edit", "override", "enable", "disable", "remove")
#: The revisions the history shows.
HISTORY_ROWS = 20
#: The actions that name the revision they change (the conflict token).
_REVISED = ("edit", "enable", "disable", "remove")
#: The actions whose form holds a definition.
_DEFINED = ("add", "edit", "override")
_EMPTY = {"args": "[]", "kwargs": "{}", "options": "{}"}
_FIELD = re.compile(r"^(\w+): ")
#: The word after ``schedule:`` in an error -> the form field at fault.
_SCHEDULE_FIELDS = {"tz": "tz", "cron": "expr", "crontab": "expr", "every": "every",
                    "solar": "event", "lat": "lat", "lon": "lon"}
_FIELDS = ("name", "task", "kind", "expr", "tz", "every", "event", "lat", "lon", "args",
           "kwargs", "options", "enabled", "effective", "restart", "reason", "revision")
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def field_of(text: str) -> str | None:
    """The form field an error text (``task: ...``, ``schedule: tz ...``) is about."""
    found = _FIELD.match(text)
    if not found:
        return None
    name = found.group(1)
    if name == "schedule":
        word = text[found.end():].split(" ", 1)[0]
        return _SCHEDULE_FIELDS.get(word, "expr")
    return name if name in _FIELDS else None


# -- the form -> a change -------------------------------------------------------------

Get = Callable[[str], "str | None"]


def _flag(name: str, text: str | None, default: bool) -> bool:
    if text is None:
        return default
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(f"{name}: {text!r} is not true or false; send 1 or 0")


def _number(name: str, text: str | None, what: str) -> float:
    try:
        return float((text or "").strip())
    except ValueError:
        raise ConfigurationError(f"{name}: {text!r} is not a number; give {what}") from None


def _schedule(get: Get) -> Any:
    """The schedule the form's fields give (``kind`` and its own fields); UNSET when
    none of them is sent."""
    kind = (get("kind") or "").strip()
    if not kind:
        if any((get(k) or "").strip() for k in ("expr", "every", "event", "lat", "lon")):
            raise ConfigurationError(f"kind: missing; choose the schedule's kind: "
                                     f"{', '.join(SCHEDULE_KINDS)}")
        return api.UNSET
    if kind in ("cron", "crontab"):
        expr = " ".join((get("expr") or "").split())
        if not expr:
            example = '"0 */5 * * * *" (seconds first)' if kind == "cron" else '"0 6 * * *"'
            raise ConfigurationError(f"expr: missing; give the {kind} expression, e.g. "
                                     f"{example}")
        tz = (get("tz") or "").strip()
        return {kind: expr, **({"tz": tz} if tz else {})}
    if kind == "every":
        return {"every": _number("every", get("every"), "the interval in seconds, e.g. 30")}
    if kind == "solar":
        return {"solar": (get("event") or "").strip(),
                "lat": _number("lat", get("lat"), "a latitude, e.g. 52.52"),
                "lon": _number("lon", get("lon"), "a longitude, e.g. 13.40")}
    raise ConfigurationError(f"kind: {kind!r} is not a kind of schedule; choose one of "
                             f"{', '.join(SCHEDULE_KINDS)}")


def _json_field(get: Get, name: str) -> Any:
    text = get(name)
    if text is None:
        return api.UNSET
    return text if text.strip() else _EMPTY[name]


def _revision(action: str, get: Get) -> int | None:
    text = (get("revision") or "").strip()
    if action not in _REVISED:
        return None
    if not text:
        raise ConfigurationError(
            "revision: missing; send the revision the entry had when the form was loaded "
            "(GET /elarion/api/schedule has it): a change without it could undo someone "
            "else's")
    try:
        return int(text)
    except ValueError:
        raise ConfigurationError(f"revision: {text!r} is not a revision number; load the "
                                 "entry again") from None


def reason_of(get: Get) -> str:
    """The reason the form gives: required, at most ``REASON_MAX`` characters."""
    reason = (get("reason") or "").strip()
    if not reason:
        raise ConfigurationError("reason: missing; say why you change the schedule (it is "
                                 "kept in the entry's history, with your name)")
    if len(reason) > REASON_MAX:
        raise ConfigurationError(f"reason: {len(reason)} characters; keep it under "
                                 f"{REASON_MAX}")
    return reason


def change_of(action: str, get: Get) -> api.Change:
    """The change the form's fields (*get*: a field's text, None when not sent) ask for;
    :class:`ConfigurationError` naming the field at fault."""
    if action not in EDIT_ACTIONS:
        raise ConfigurationError(f"action: {action!r} is not one of {', '.join(EDIT_ACTIONS)}")
    name = get("name") or ""
    if action == "add":
        name = name.strip()
    if not name.strip():
        raise ConfigurationError("name: missing; give the entry's name")
    revision = _revision(action, get)
    effective = (get("effective") or "").strip() or None
    if action == "remove":
        if effective is not None:
            raise ConfigurationError("effective: a remove takes effect at once; to stop the "
                                     "entry at a later time, disable it from then on and "
                                     "remove it afterwards")
        return api.Change("remove", name, revision=revision)
    api.parse_effective(effective)  # bad text: named here, before anything is read
    if action in ("enable", "disable"):
        return api.Change(action, name, revision=revision, effective=effective)
    task = get("task")
    fields: dict[str, Any] = {
        "task": api.UNSET if task is None else task.strip(), "schedule": _schedule(get),
        "args": _json_field(get, "args"), "kwargs": _json_field(get, "kwargs"),
        "options": _json_field(get, "options")}
    if action == "edit":
        return api.Change("edit", name, **fields, revision=revision, effective=effective,
                          restart=_flag("restart", get("restart"), False))
    return api.Change(action, name, **fields, enabled=_flag("enabled", get("enabled"), True),
                      effective=effective)


# -- what the handlers read and write (blocking: on the pool) ------------------------------


def edit_on(application: Any) -> bool:
    """Whether the page of this Flower application shows the Schedule card."""
    try:
        settings = panel(application).settings
    except _Unconfigured:
        return False
    return settings.flower_edit and settings.db_entries


def _refusal(board: Panel, caller: Caller) -> str | None:
    s = board.settings
    return edit_refusal(caller, s.flower_operators, s.flower_actions, s.flower_edit,
                        s.db_entries)


def _code_definition(board: Panel, name: str, entry: Any) -> tuple[dict[str, Any] | None,
                                                                   str | None]:
    """A code entry's definition as an override would start from it, or why it cannot
    be overridden here."""
    spec = spec_of_schedule(entry.schedule)
    if spec is None:
        return None, (f"its schedule ({entry.schedule!r}) has no database form "
                      "(cron, crontab, every or solar)")
    try:
        definition = EntryDefinition.of(entry.task, spec, tuple(entry.args or ()),
                                        dict(entry.kwargs or {}), dict(entry.options or {}))
        check_definition(name, definition, board.settings, board.app)
    except ConfigurationError as exc:
        return None, str(exc)
    return definition.as_json(), None


def schedule_view(board: Panel, caller: Caller) -> dict[str, Any]:
    """The card's data: every entry, and whether *caller* may edit."""
    refused = _refusal(board, caller)
    may = refused is None
    code = read_schedule(board.app, board.settings).entries
    entries = []
    for view in api.list_entries(board.app, board.store):
        shown = view.as_dict()
        if not may:
            shown.pop("definition", None)
        if view.source == "code" and view.name in code:
            definition, problem = _code_definition(board, view.name, code[view.name])
            shown["overridable"], shown["override_problem"] = definition is not None, problem
            if may and definition is not None:
                shown["definition"] = definition
        entries.append(shown)
    return {"edit": may, "edit_reason": refused, "caller": caller.actor,
            "allowed_tasks": list(board.settings.db_entry_tasks),
            "kinds": list(SCHEDULE_KINDS), "solar_events": sorted(solar._all_events),
            "app_timezone": str(board.app.timezone),
            "override_policy": board.settings.db_override_policy, "entries": entries,
            "now": iso(board.store.clock())}


def history_view(board: Panel, caller: Caller, name: str) -> dict[str, Any]:
    may = _refusal(board, caller) is None
    revisions = []
    for rev in api.entry_history(board.app, name, HISTORY_ROWS, store=board.store):
        shown = rev.as_dict()
        if not may:
            for key in ("args", "kwargs", "options"):
                shown.pop(key, None)
        revisions.append(shown)
    return {"name": name, "revisions": revisions}


def _latest(board: Panel, name: str) -> dict[str, Any] | None:
    cluster = live_cluster(board.settings, board.app)
    found = board.store.entry_history(cluster, name, 1)
    entry = found[0].entry() if found else None
    return entry.as_dict() if entry is not None else None


def _answer(board: Panel, name: str, call: Callable[[], dict[str, Any]]
            ) -> tuple[int, dict[str, Any]]:
    """*call*'s answer (200), or a conflict (409: what the entry is now) or a missing
    entry (404)."""
    try:
        return 200, call()
    except EntryConflict as exc:
        text = str(exc)
        return 409, {"error": text, "current_revision": exc.current,
                     "conflict": "revision" if text.startswith("revision:") else "name",
                     "entry": _latest(board, name)}
    except EntryNotFound as exc:
        return 404, {"error": str(exc), "field": "name"}


def _message(change: api.Change, wrote: Any, actor: str) -> str:
    entry = wrote.entries[0] if wrote.entries else None
    if wrote.version is None:
        return f"{change.name}: unchanged (the change leaves it as it is); nothing written"
    if entry is None:
        return f"{change.name}: removed by {actor}"
    verb = {"add": "added", "edit": "edited", "override": "overridden", "enable": "enabled",
            "disable": "disabled"}[change.action]
    return (f"{change.name}: {verb} by {actor}: revision {entry.revision}, effective "
            f"{iso(entry.effective_at)}")


def save(board: Panel, change: api.Change, reason: str, actor: str
         ) -> tuple[int, dict[str, Any]]:
    """Write *change* as *actor*: the answer and its status."""
    def write() -> dict[str, Any]:
        wrote = api.apply_changes(board.app, [change], reason=reason, actor=actor,
                                  store=board.store)
        entry = wrote.entries[0] if wrote.entries else None
        return {"ok": True, "message": _message(change, wrote, actor),
                "entry": entry.as_dict() if entry is not None else None,
                "version": wrote.version, "unchanged": wrote.version is None}
    return _answer(board, change.name, write)


def preview(board: Panel, change: api.Change, limit: int) -> tuple[int, dict[str, Any]]:
    return _answer(board, change.name, lambda: preview_change(
        board.app, change, store=board.store, settings=board.settings, limit=limit).as_dict())


# -- the handlers ------------------------------------------------------------------------


class ScheduleHandler(ActionHandler):
    """The URLs of the edit form: refused with 403 unless the form is on and this caller
    may edit (a write: before the form is read; then the XSRF check); a 400 names the
    form field at fault (``{error, field}``)."""

    def refusal(self, caller: Caller) -> str | None:
        return _refusal(panel(self.application), caller)

    async def blocking(self, call: Callable[[], Any]) -> Any:
        try:
            return await super().blocking(call)
        except Refused as exc:
            if exc.status_code == 400:
                raise Refused(400, exc.text, field=field_of(exc.text)) from exc
            raise

    async def refuse_readers(self, editing: bool = False) -> Caller:
        """403 for a reader while the form is off (or, *editing*, unless this caller may
        edit); the caller otherwise."""
        caller = caller_of(self)
        board = panel(self.application)
        refused = await self.blocking(lambda: _refusal(board, caller))
        if refused in (EDIT_OFF, NO_DB_ENTRIES) or (editing and refused is not None):
            raise Refused(403, str(refused))
        return caller

    def reply(self, status: int, answer: dict[str, Any]) -> None:
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        self.write(answer)

    def form(self, body: bool) -> Get:
        """A field's text as sent (None: not sent): the body's, else the query's."""
        def get(name: str) -> str | None:
            found = (self.request.body_arguments if body else
                     self.request.query_arguments).get(name)
            return found[-1].decode("utf-8", "replace") if found else None
        return get

    def bad(self, exc: ConfigurationError) -> Refused:
        return Refused(400, str(exc), field=field_of(str(exc)))


class ScheduleEntries(ScheduleHandler):
    """``GET /elarion/api/schedule``: the entries and whether this caller may edit."""

    @tornado.web.authenticated
    async def get(self) -> None:
        caller = await self.refuse_readers()
        board = panel(self.application)
        self.reply(200, await self.blocking(lambda: schedule_view(board, caller)))


class ScheduleHistory(ScheduleHandler):
    """``GET /elarion/api/schedule/history?name=NAME``: the entry's last revisions."""

    @tornado.web.authenticated
    async def get(self) -> None:
        caller = await self.refuse_readers()
        name = self.form(False)("name")
        if not name:
            raise Refused(400, "name: missing; give the entry's name", field="name")
        board = panel(self.application)
        self.reply(200, await self.blocking(lambda: history_view(board, caller, name)))


class SchedulePreview(ScheduleHandler):
    """``GET /elarion/api/schedule/preview?action=...``: a change's next occurrences
    across its effective time (for a caller who may edit)."""

    @tornado.web.authenticated
    async def get(self) -> None:
        await self.refuse_readers(editing=True)
        get = self.form(False)
        try:
            change = change_of((get("action") or "").strip(), get)
            limit = int(_number("limit", get("limit") or str(SIDE_LIMIT), "a whole number"))
            if not 1 <= limit <= 100:
                raise ConfigurationError(f"limit: {limit} is not from 1 to 100")
        except ConfigurationError as exc:
            raise self.bad(exc) from exc
        board = panel(self.application)
        self.reply(*await self.blocking(lambda: preview(board, change, limit)))


class ScheduleAction(ScheduleHandler):
    """``POST /elarion/api/schedule/<action>``: write a change (see the module)."""

    def initialize(self, action: str) -> None:
        if action not in EDIT_ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        self.action = action

    @tornado.web.authenticated
    async def post(self) -> None:
        board = panel(self.application)  # ActionHandler.prepare let this caller edit
        get = self.form(True)
        try:
            reason = reason_of(get)
            change = change_of(self.action, get)
        except ConfigurationError as exc:
            raise self.bad(exc) from exc
        actor = actor_of(self)
        self.reply(*await self.blocking(lambda: save(board, change, reason, actor)))

"""Live schedules: add, edit and remove database entries while the cluster runs.

::

    from celery_elarion_beat import live_schedules as live

    live.add_entry(app, "report", "proj.tasks.report", {"cron": "0 0 6 * * *"},
                   reason="morning numbers")
    entry = live.get_entry(app, "report")
    live.edit_entry(app, "report", schedule={"cron": "0 30 6 * * *"},
                    revision=entry.revision, reason="later")   # a stale revision: refused
    live.disable_entry(app, "report", reason="holiday")

Every verb takes the app (its settings: ``elarion_beat_db_entries`` must be on, and
its ``elarion_beat_db_entry_tasks`` lists the tasks an entry may start), and:

* *reason*: why (kept in the revision history, the audit), *actor*: who (default
  the OS user and host; a web app passes its user);
* *revision*: the revision the caller read (a conflict token): a change of an entry
  that changed since is refused with :class:`~..exceptions.EntryConflict`. Without it,
  a change applies to the entry as it is (an edit of some fields is read, merged and
  written; if the entry changed in between, it is read again);
* *effective*: from when the change governs the occurrences (an aware datetime or
  ISO text; default the database clock's now, never earlier): occurrences before it
  belong to the old definition, from it on to the new one;
* *connection*: the caller's SQLAlchemy ``Connection`` (or on PostgreSQL a psycopg 3
  connection) inside a transaction on the claims database: the change commits (or
  rolls back) with the caller's own writes, in a savepoint of its own.

Bad input raises :class:`~..exceptions.ConfigurationError` naming the field and the fix,
before anything is written. :func:`apply_changes` writes several changes with one
version bump; :func:`import_entries` and :func:`export_entries` move a whole set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ..config.entries import read_schedule
from ..config.live_entries import (
    EntryDefinition,
    ScheduleSpec,
    check_definition,
    live_cluster,
    spec_of_schedule,
)
from ..config.settings import Settings
from ..exceptions import ConfigurationError, EntryConflict, EntryNotFound
from ..schedules.clock import as_utc
from ..store.control_records import os_actor, reason_text
from ..store.entry_records import EntryChange, EntryRevision, EntryWrite, StoredEntry
from ..store.interface import ClaimStore
from ..store.registry import app_store
from .listing import EntryView, entry_views
from .rules import code_digest

__all__ = ["UNSET", "Change", "ImportReport", "add_entry", "apply_changes", "disable_entry",
           "edit_entry", "enable_entry", "entry_history", "export_entries", "get_entry",
           "import_entries", "list_entries", "override_entry", "parse_effective",
           "plan_changes", "remove_entry"]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: A field an edit leaves as it is.
UNSET: Any = _Unset()
#: How often an edit without a revision reads the entry again when it changed meanwhile.
_RETRIES = 3


@dataclasses.dataclass(frozen=True)
class Change:
    """One change for :func:`apply_changes`: *action* (``add``, ``edit``, ``override``,
    ``enable``, ``disable``, ``remove``) of entry *name*; the fields given (:data:`UNSET`:
    as it is, for an edit), *revision* (a conflict token), *effective*, *restart*."""

    action: str
    name: str
    task: Any = UNSET
    schedule: Any = UNSET
    args: Any = UNSET
    kwargs: Any = UNSET
    options: Any = UNSET
    enabled: Any = UNSET
    revision: int | None = None
    effective: datetime | str | None = None
    restart: bool = False


@dataclasses.dataclass(frozen=True)
class ImportReport:
    """What an import did (or, *dry_run*, would do): the names added, changed, removed
    and left as they were; *version*: the cluster's version after it (None: nothing
    written)."""

    added: list[str]
    changed: list[str]
    removed: list[str]
    unchanged: list[str]
    version: int | None
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- the context of a call --------------------------------------------------------------


def _context(app: Any, store: ClaimStore | None = None) -> tuple[Settings, ClaimStore, str]:
    settings = Settings.from_app(app)
    if not settings.db_entries:
        raise ConfigurationError(
            "database entries are off: set elarion_beat_db_entries = True (or "
            "ELARION_BEAT_DB_ENTRIES=1) for the app, on every beat node too")
    return settings, store or app_store(app), live_cluster(settings, app)


def parse_effective(value: datetime | str | None) -> datetime | None:
    """An effective time from an aware datetime or ISO text with an offset."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigurationError(
                f"effective: {value!r} is not an ISO time; write e.g. "
                "2026-12-01T06:00:00Z (with an offset)") from None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ConfigurationError(
            f"effective: {value!r} has no time zone; a naive time means another instant on "
            "every machine: give an offset, e.g. 2026-12-01T06:00:00+01:00")
    return as_utc(value)


def _code_entries(app: Any, settings: Settings) -> dict[str, Any]:
    return read_schedule(app, settings).entries


def _current(store: ClaimStore, cluster: str, name: str) -> StoredEntry | None:
    """The entry as it is now (its latest revision), or None."""
    found = store.entry_history(cluster, name, limit=1)
    return found[0].entry() if found else None


def _definition(base: EntryDefinition | None, change: Change) -> EntryDefinition:
    """*base* with the fields *change* gives (an add: every field from the change)."""
    def pick(value: Any, held: Any, default: Any) -> Any:
        if value is not UNSET:
            return value
        return held if base is not None else default

    b = base
    task = pick(change.task, b.task if b else None, None)
    schedule = pick(change.schedule, b.schedule if b else None, None)
    if task is None:
        raise ConfigurationError("task: missing; give the task to send, e.g. "
                                 "'proj.tasks.report'")
    if schedule is None:
        raise ConfigurationError('schedule: missing; give one of {"cron": "S M H DOM MON '
                                 'DOW"}, {"crontab": "M H DOM MON DOW"}, {"every": SECONDS} '
                                 'or {"solar": EVENT, "lat": ..., "lon": ...}')
    return EntryDefinition.of(
        task, schedule, pick(change.args, b.args if b else (), ()),
        pick(change.kwargs, dict(b.kwargs) if b else {}, {}),
        pick(change.options, dict(b.options) if b else {}, {}),
        pick(change.enabled, b.enabled if b else True, True))


def _code_definition(name: str, code: Any) -> EntryDefinition:
    """A code entry's definition, the base of an override."""
    spec = spec_of_schedule(code.schedule)
    if spec is None:
        raise ConfigurationError(
            f"schedule: code entry {name!r} has a schedule ({code.schedule!r}) that a "
            "database entry cannot hold; give the override's schedule (--cron, --crontab or "
            "--every)")
    return EntryDefinition.of(code.task, spec, tuple(code.args or ()), dict(code.kwargs or {}),
                              dict(code.options or {}))


def _changes(app: Any, settings: Settings, store: ClaimStore, cluster: str,
             changes: Sequence[Change]) -> list[EntryChange]:
    """The store's changes for *changes*, each checked (and an edit merged with the
    entry as it is)."""
    code = _code_entries(app, settings)
    out = []
    for change in changes:
        effective = parse_effective(change.effective)
        if change.action not in ("add", "edit", "override", "enable", "disable", "remove"):
            raise ConfigurationError(f"action: {change.action!r} is not one of add, edit, "
                                     "override, enable, disable, remove")
        if change.action == "add":
            if change.name in code:
                raise EntryConflict(
                    f"name: {change.name!r} is the name of a code entry (beat_schedule); "
                    "choose another name, or override the code entry with `schedule "
                    f"override {change.name}`")
            definition = _definition(None, change)
            check_definition(change.name, definition, settings, app)
            out.append(EntryChange("add", change.name, definition, None, effective,
                                   change.restart))
            continue
        if change.action == "override":
            entry = code.get(change.name)
            if entry is None:
                raise ConfigurationError(
                    f"name: {change.name!r} is no code entry of this app; `schedule add` "
                    "makes a database entry, `schedule override` replaces a code entry")
            held = _current(store, cluster, change.name)
            if held is not None:
                raise EntryConflict(f"name: {change.name!r} has a database entry already "
                                    f"(revision {held.revision}); edit it, or remove it "
                                    "first", held.revision)
            definition = _definition(_code_definition(change.name, entry), change)
            check_definition(change.name, definition, settings, app)
            out.append(EntryChange("override", change.name, definition, None, effective,
                                   change.restart, code_digest(change.name, entry)))
            continue
        held = _current(store, cluster, change.name)
        if held is None:
            raise EntryNotFound(
                f"name: no database entry is named {change.name!r}"
                + (" (it is a code entry: `schedule override` replaces it)"
                   if change.name in code else "") + "; `schedule list` shows the entries")
        if change.revision is not None and change.revision != held.revision:
            raise EntryConflict(
                f"revision: entry {change.name!r} is at revision {held.revision}, not "
                f"{change.revision}: it changed since it was read; read it again and "
                "repeat the change", held.revision)
        expected = change.revision if change.revision is not None else held.revision
        if change.action == "remove":
            out.append(EntryChange("remove", change.name, None, expected))
            continue
        if change.action in ("enable", "disable"):
            definition = dataclasses.replace(held.definition,
                                             enabled=change.action == "enable")
        else:
            definition = _definition(held.definition, change)
        check_definition(change.name, definition, settings, app)
        out.append(EntryChange(change.action, change.name, definition, expected, effective,
                               change.restart))
    return out


def apply_changes(app: Any, changes: Sequence[Change], *, reason: str = "",
                  actor: str | None = None, connection: Any = None,
                  store: ClaimStore | None = None) -> EntryWrite:
    """Write *changes* in one transaction, one version bump (nothing when none changes
    anything). An edit without a revision that meets an entry changed in between is
    read and merged again (a few times); with a revision it is refused."""
    settings, store, cluster = _context(app, store)
    why = reason_text(reason, "reason")
    who = actor or os_actor("api")
    for attempt in range(_RETRIES):
        planned = _changes(app, settings, store, cluster, changes)
        try:
            return store.write_entries(cluster, planned, who, why, connection=connection)
        except EntryConflict:
            given = all(c.revision is not None or c.action in ("add", "override")
                        for c in changes)
            if given or attempt == _RETRIES - 1 or connection is not None:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def plan_changes(app: Any, changes: Sequence[Change],
                 store: ClaimStore | None = None) -> list[EntryChange]:
    """What :func:`apply_changes` would write for *changes*, each checked as it checks
    it (an edit merged with the entry as it is, a stale revision refused with
    :class:`~..exceptions.EntryConflict`), writing nothing: for a preview or a dry run.
    The store decides the effective times when it writes
    (:func:`~..store.entry_records.plan_writes`)."""
    settings, store, cluster = _context(app, store)
    return _changes(app, settings, store, cluster, changes)


def _one(app: Any, change: Change, reason: str, actor: str | None, connection: Any,
         store: ClaimStore | None) -> StoredEntry | None:
    wrote = apply_changes(app, [change], reason=reason, actor=actor, connection=connection,
                          store=store)
    return wrote.entries[0]


def add_entry(app: Any, name: str, task: str, schedule: Any, args: Sequence[Any] = (),
              kwargs: Mapping[str, Any] | None = None,
              options: Mapping[str, Any] | None = None, *, enabled: bool = True,
              effective: datetime | str | None = None, reason: str = "",
              actor: str | None = None, connection: Any = None,
              store: ClaimStore | None = None) -> StoredEntry:
    """Add database entry *name* (refused when an entry or a code entry has the name).
    *schedule*: ``{"cron": "S M H DOM MON DOW", "tz": ...}``, ``{"crontab": "M H DOM MON
    DOW", "tz": ...}``, ``{"every": SECONDS}`` or ``{"solar": EVENT, "lat": ..., "lon":
    ...}`` (JSON text too). Its first run is its first slot at or after *effective*."""
    entry = _one(app, Change("add", name, task, schedule, args, kwargs or {}, options or {},
                             enabled, effective=effective), reason, actor, connection, store)
    assert entry is not None
    return entry


def edit_entry(app: Any, name: str, *, task: Any = UNSET, schedule: Any = UNSET,
               args: Any = UNSET, kwargs: Any = UNSET, options: Any = UNSET,
               revision: int | None = None, effective: datetime | str | None = None,
               restart: bool = False, reason: str = "", actor: str | None = None,
               connection: Any = None, store: ClaimStore | None = None) -> StoredEntry:
    """Change the fields given of database entry *name* (the others stay). An interval
    keeps its phase unless *restart* (it then counts from the effective time)."""
    entry = _one(app, Change("edit", name, task, schedule, args, kwargs, options,
                             revision=revision, effective=effective, restart=restart),
                 reason, actor, connection, store)
    assert entry is not None
    return entry


def override_entry(app: Any, name: str, *, task: Any = UNSET, schedule: Any = UNSET,
                   args: Any = UNSET, kwargs: Any = UNSET, options: Any = UNSET,
                   enabled: bool = True, effective: datetime | str | None = None,
                   reason: str = "", actor: str | None = None, connection: Any = None,
                   store: ClaimStore | None = None) -> StoredEntry:
    """Replace code entry *name* by a database entry: the code entry's definition with
    the fields given (``enabled=False`` stops the code entry). When the code entry
    changes in code later, the override is reported (``elarion_beat_db_override_policy``
    decides what runs); removing the override brings the code entry back."""
    entry = _one(app, Change("override", name, task, schedule, args, kwargs, options,
                             enabled, effective=effective), reason, actor, connection, store)
    assert entry is not None
    return entry


def remove_entry(app: Any, name: str, *, revision: int | None = None, reason: str = "",
                 actor: str | None = None, connection: Any = None,
                 store: ClaimStore | None = None) -> int | None:
    """Remove database entry *name* (an override: the code entry runs again); the
    cluster's version after it."""
    return apply_changes(app, [Change("remove", name, revision=revision)], reason=reason,
                         actor=actor, connection=connection, store=store).version


def enable_entry(app: Any, name: str, *, revision: int | None = None,
                 effective: datetime | str | None = None, reason: str = "",
                 actor: str | None = None, connection: Any = None,
                 store: ClaimStore | None = None) -> StoredEntry:
    """Enable database entry *name*: it runs from its first slot at or after the effective
    time (no overdue run)."""
    entry = _one(app, Change("enable", name, revision=revision, effective=effective), reason,
                 actor, connection, store)
    assert entry is not None
    return entry


def disable_entry(app: Any, name: str, *, revision: int | None = None,
                  effective: datetime | str | None = None, reason: str = "",
                  actor: str | None = None, connection: Any = None,
                  store: ClaimStore | None = None) -> StoredEntry:
    """Disable database entry *name* (kept, with its history; enable it again later)."""
    entry = _one(app, Change("disable", name, revision=revision, effective=effective), reason,
                 actor, connection, store)
    assert entry is not None
    return entry


# -- reads --------------------------------------------------------------------------------


def list_entries(app: Any, store: ClaimStore | None = None) -> list[EntryView]:
    """Every entry, code and database, by name, each with what runs under it."""
    settings = Settings.from_app(app)
    if not settings.db_entries:
        return entry_views(app, settings, None)
    return entry_views(app, settings, store or app_store(app))


def get_entry(app: Any, name: str, store: ClaimStore | None = None) -> EntryView:
    """The entry *name* (:class:`~..exceptions.EntryNotFound` when there is none)."""
    for view in list_entries(app, store):
        if view.name == name:
            return view
    raise EntryNotFound(f"name: no entry is named {name!r}; `schedule list` shows them")


def entry_history(app: Any, name: str | None = None, limit: int = 100,
                  store: ClaimStore | None = None) -> list[EntryRevision]:
    """The revisions of database entry *name* (of all when None), newest first: who
    changed what, when, why, effective from when."""
    _, store, cluster = _context(app, store)
    return store.entry_history(cluster, name, limit)


def export_entries(app: Any, store: ClaimStore | None = None) -> dict[str, Any]:
    """The database entries as data (``schedule import`` reads it back)."""
    _, store, cluster = _context(app, store)
    rows = store.live_entries(cluster).entries
    return {"cluster": cluster, "entries": {
        row.name: {**row.definition.as_json(), **({"override": True} if row.overrides else {})}
        for row in sorted(rows, key=lambda r: r.name)}}


def import_entries(app: Any, data: Mapping[str, Any], *, dry_run: bool = False,
                   prune: bool = False, reason: str = "", actor: str | None = None,
                   connection: Any = None, store: ClaimStore | None = None,
                   progress: Callable[[str, int, int], None] | None = None) -> ImportReport:
    """Make the database entries what *data* (as :func:`export_entries` writes it) says:
    add the new ones, change the changed ones, and with *prune* remove the ones it does
    not name; one write, one version bump; importing the same data again writes nothing.
    Every entry is checked before anything is written. *progress* (a hook for a progress
    display) is told ``(step, done, total)``."""
    settings, store, cluster = _context(app, store)
    entries = data.get("entries") if isinstance(data, Mapping) else None
    if not isinstance(entries, Mapping):
        raise ConfigurationError('import: the file must be an object with "entries": '
                                 '{NAME: {"task": ..., "schedule": ...}, ...} (as `schedule '
                                 'export` writes it)')
    held = {row.name: row for row in store.live_entries(cluster).entries}
    changes: list[Change] = []
    added, changed, unchanged = [], [], []
    total = len(entries)
    for done, (name, fields) in enumerate(sorted(entries.items()), 1):
        if not isinstance(fields, Mapping):
            raise ConfigurationError(f"import: entry {name!r} is not an object")
        unknown = set(fields) - {"task", "schedule", "args", "kwargs", "options", "enabled",
                                 "override"}
        if unknown:
            raise ConfigurationError(f"import: entry {name!r} has unknown fields "
                                     f"{', '.join(sorted(unknown))}")
        wanted = EntryDefinition.of(fields.get("task"), fields.get("schedule"),
                                    fields.get("args", ()), fields.get("kwargs"),
                                    fields.get("options"), fields.get("enabled", True))
        check_definition(name, wanted, settings, app)
        override = bool(fields.get("override", False))
        current = held.get(name)
        if current is None:
            changes.append(Change("override" if override else "add", name, wanted.task,
                                  wanted.schedule, wanted.args, wanted.kwargs, wanted.options,
                                  wanted.enabled))
            added.append(name)
        elif current.definition.same(wanted) and current.overrides == override:
            unchanged.append(name)
        elif current.overrides != override:
            now_is = "an override" if current.overrides else "a database entry"
            file_is = "an override" if override else "not"
            raise ConfigurationError(
                f"import: entry {name!r} is {now_is} in the database and {file_is} in the "
                "file; remove it first to change what it is")
        else:
            changes.append(Change("edit", name, wanted.task, wanted.schedule, wanted.args,
                                  wanted.kwargs, wanted.options, wanted.enabled,
                                  revision=current.revision))
            changed.append(name)
        if progress is not None:
            progress("check", done, total)
    removed = sorted(set(held) - set(entries)) if prune else []
    changes += [Change("remove", name, revision=held[name].revision) for name in removed]
    version = None
    if changes and not dry_run:
        wrote = apply_changes(app, changes, reason=reason, actor=actor, connection=connection,
                              store=store)
        version = wrote.version
    if progress is not None:
        progress("write", total, total)
    return ImportReport(added, changed, removed, unchanged, version, dry_run)


def schedule_spec(kind: str, value: Any, tz: str | None = None) -> dict[str, Any]:
    """A schedule's JSON from the CLI's options (``--cron``, ``--crontab``, ``--every``)."""
    if kind == "every":
        out: dict[str, Any] = {"every": value}
    else:
        out = {kind: value}
        if tz:
            out["tz"] = tz
    ScheduleSpec.parse(out)
    return out

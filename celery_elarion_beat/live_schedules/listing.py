"""The schedule as it runs: code entries and database entries under one name space.

:func:`read_live_schedule` is :func:`~celery_elarion_beat.config.entries.read_schedule`
with the database entries added, as beat puts them in place (:mod:`.rules`): what
``status``, ``preview``, ``pause``/``trigger``, the Flower page and ``simulate`` read
when ``elarion_beat_db_entries`` is on. A database entry that cannot run is named
with why, as a broken code entry is. :func:`entry_views` is the same, one view per
name, for ``schedule list`` and ``show``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery.beat import ScheduleEntry

from ..config.entries import InvalidEntry, Schedule, read_schedule
from ..config.live_entries import (
    EntryDefinition,
    LiveEntry,
    check_definition,
    live_cluster,
    spec_of_schedule,
)
from ..config.settings import Settings
from ..exceptions import ConfigurationError
from ..observe.fingerprint import describe_schedule, entry_digests
from ..store.entry_records import StoredEntry, governing
from ..store.interface import ClaimStore
from .rules import CODE, DATABASE, decide

__all__ = ["EntryView", "entry_views", "read_live_schedule", "upcoming_entries"]


@dataclass(frozen=True)
class EntryView:
    """One name of the schedule: the code entry, the database entry, or both (an
    override). *runs*: what runs under the name now (``code``, ``database``, or None);
    *problem*: what an operator must hear about it."""

    name: str
    source: str
    task: str
    schedule: str
    enabled: bool
    revision: int | None
    runs: str | None
    problem: str | None = None
    overrides: bool = False
    definition: EntryDefinition | None = None
    effective_at: datetime | None = None
    updated_at: datetime | None = None
    actor: str | None = None
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "task": self.task, "schedule": self.schedule,
            "source": self.source, "enabled": self.enabled, "revision": self.revision,
            "runs": self.runs, "overrides": self.overrides, "problem": self.problem,
            "effective_at": self.effective_at.isoformat() if self.effective_at else None,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
            "actor": self.actor, "reason": self.reason}
        if self.definition is not None:
            out["definition"] = self.definition.as_json()
        return out


def _rows(store: ClaimStore, settings: Settings, app: Any) -> list[StoredEntry]:
    if not settings.db_entries:
        return []
    return store.live_entries(live_cluster(settings, app)).entries


def _live_entry(app: Any, settings: Settings, row: StoredEntry,
                until: datetime | None = None) -> LiveEntry:
    built = check_definition(row.name, row.definition, settings, app)
    return LiveEntry(name=row.name, task=built.task, schedule=built.schedule,
                     args=list(row.definition.args), kwargs=dict(row.definition.kwargs),
                     options=dict(row.definition.options), app=app, revision=row.revision,
                     cluster=row.cluster, effective_at=row.effective_at, until=until,
                     restart=row.restart)


def _governing(store: ClaimStore, settings: Settings, app: Any) -> tuple[
        list[StoredEntry], dict[str, StoredEntry]]:
    """The database entries as they govern now, and the revisions still to come (an
    edit with a later effective time), by name."""
    if not settings.db_entries:
        return [], {}
    cluster = live_cluster(settings, app)
    snapshot = store.live_entries(cluster)
    now_rows, upcoming = [], {}
    for row in snapshot.entries:
        if row.effective_at <= snapshot.now:
            now_rows.append(row)
            continue
        upcoming[row.name] = row
        history = store.entry_history(cluster, row.name, 50)
        found = governing(history, snapshot.now)
        entry = found.entry() if found is not None else None
        if entry is not None:
            now_rows.append(entry)
    return now_rows, upcoming


def upcoming_entries(app: Any, settings: Settings, store: ClaimStore) -> dict[str, LiveEntry]:
    """The revisions of database entries still to come (an edit with a later effective
    time), each as the entry it will be from then on (for ``preview``)."""
    out = {}
    for name, row in _governing(store, settings, app)[1].items():
        try:
            out[name] = _live_entry(app, settings, row)
        except ConfigurationError:
            continue
    return out


def read_live_schedule(app: Any, settings: Settings | None = None,
                       store: ClaimStore | None = None, *, checked: bool = True) -> Schedule:
    """The entries that run (code entries, and with ``elarion_beat_db_entries`` and a
    *store* the database entries as beat puts them in place: each under the revision
    that governs now, its span ending where a revision still to come begins) and the
    ones left out, each with why. *checked*: code entries are checked as beat checks
    them (their options), else only built."""
    settings = settings or Settings.from_app(app)
    code, invalid = read_schedule(app, settings if checked else None)
    if store is None or not settings.db_entries:
        return Schedule(code, invalid)
    entries: dict[str, ScheduleEntry] = dict(code)
    invalid = list(invalid)
    digests = entry_digests(code)
    rows, upcoming = _governing(store, settings, app)
    for row in rows:
        decision = decide(row.name, code.get(row.name), row, settings.db_override_policy,
                          digests)
        if decision.problem is not None:
            invalid.append(InvalidEntry(row.name, decision.problem, "database"))
        if decision.runs == DATABASE:
            later = upcoming.get(row.name)
            try:
                entries[row.name] = _live_entry(app, settings, row,
                                                later.effective_at if later else None)
            except ConfigurationError as exc:
                invalid.append(InvalidEntry(row.name, str(exc), "database"))
                entries.pop(row.name, None)
        elif decision.runs is None:
            entries.pop(row.name, None)
    return Schedule(dict(sorted(entries.items())), invalid)


def _code_view(name: str, entry: ScheduleEntry) -> EntryView:
    spec = spec_of_schedule(entry.schedule)
    return EntryView(name, CODE, str(entry.task), spec.text() if spec else
                     describe_schedule(entry.schedule), True, None, CODE)


def entry_views(app: Any, settings: Settings, store: ClaimStore | None) -> list[EntryView]:
    """Every name of the schedule, code and database, sorted, each with what runs under
    it and what is wrong with it."""
    code, invalid = read_schedule(app, settings)
    views: dict[str, EntryView] = {name: _code_view(name, entry)
                                   for name, entry in code.items()}
    for bad in invalid:
        views[bad.job] = EntryView(bad.job, CODE, "", "", True, None, None, bad.reason)
    digests = entry_digests(code)
    for row in (_rows(store, settings, app) if store is not None else []):
        decision = decide(row.name, code.get(row.name), row, settings.db_override_policy,
                          digests)
        problem = decision.problem
        if decision.runs == DATABASE:
            try:
                check_definition(row.name, row.definition, settings, app)
            except ConfigurationError as exc:
                problem, decision = str(exc), decide(row.name, None, None, "keep")
        views[row.name] = EntryView(
            row.name, "database", row.definition.task, row.definition.schedule.text(),
            row.definition.enabled, row.revision, decision.runs, problem, row.overrides,
            row.definition, row.effective_at, row.updated_at, row.actor, row.reason)
    return [views[name] for name in sorted(views)]

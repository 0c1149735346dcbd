"""The next occurrences of one database entry, for its change view in the admin.

The same instants ``celery -A proj elarion-beat preview --job NAME`` lists
(:func:`~...operate.preview.preview_entries`): the revision that governs now until a
revision still to come takes over (an edit with a later effective time), then that
one; an interval entry counted from its newest claim in the ledger; daylight-saving
changes marked; a pause in force shown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery.schedules import schedule as interval_schedule

from ...config.entries import read_schedule
from ...config.live_entries import LiveEntry, check_definition
from ...config.settings import Settings
from ...exceptions import ConfigurationError, ElarionBeatError
from ...live_schedules.rules import DATABASE, decide
from ...operate.preview import PreviewRow, preview_entries
from ...store.control_records import Pause
from ...store.entry_records import EntryRevision, StoredEntry, governing
from ...store.interface import ClaimStore

__all__ = ["EntryPreview", "entry_preview"]

#: How far ahead the change view looks, and how many occurrences it lists. The
#: revisions are previewed under the keys ``NAME@REVISION``.
SPAN = timedelta(days=400)
LIMIT = 10


@dataclass(frozen=True)
class EntryPreview:
    """The next occurrences (*rows*), or why there are none (*note*)."""

    rows: list[PreviewRow]
    note: str | None = None


def _entry(app: Any, settings: Settings, row: StoredEntry,
           until: datetime | None) -> LiveEntry:
    built = check_definition(row.name, row.definition, settings, app)
    return LiveEntry(name=row.name, task=built.task, schedule=built.schedule,
                     args=list(row.definition.args), kwargs=dict(row.definition.kwargs),
                     options=dict(row.definition.options), app=app, revision=row.revision,
                     cluster=row.cluster, effective_at=row.effective_at, until=until,
                     restart=row.restart)


def entry_preview(app: Any, settings: Settings, store: ClaimStore, name: str,
                  history: Sequence[EntryRevision], now: datetime,
                  limit: int = LIMIT) -> EntryPreview:
    """The next *limit* occurrences of database entry *name* from *now*, given its
    revisions *history* (newest first)."""
    latest = history[0].entry() if history else None
    if latest is None:
        return EntryPreview([], "the entry is removed")
    now_rev = governing(history, now)
    current = now_rev.entry() if now_rev is not None else None
    upcoming = latest if latest.effective_at > now else None
    code = read_schedule(app, settings).entries.get(name)
    parts: dict[str, LiveEntry] = {}
    notes = []
    try:
        for row, until in ((current, upcoming.effective_at if upcoming else None),
                           (upcoming, None)):
            if row is None or not row.definition.enabled:
                continue
            decision = decide(name, code, row, settings.db_override_policy)
            if decision.runs != DATABASE:
                notes.append(decision.problem or "nothing runs under this name")
                continue
            parts[f"{name}@{row.revision}"] = _entry(app, settings, row, until)
    except ConfigurationError as exc:
        return EntryPreview([], f"it cannot run: {exc}")
    if not parts:
        return EntryPreview([], "; ".join(notes) or "the entry is disabled")
    anchors: dict[str, datetime] | None = None
    pauses: list[Pause] = []
    try:
        if any(isinstance(e.schedule, interval_schedule) for e in parts.values()):
            newest = store.latest_claims([name]).get(name)
            anchors = {key: newest.occurrence for key in parts} if newest else {}
        pauses = [p for p in store.pauses()[1] if p.job in ("", name)]
    except ElarionBeatError as exc:
        notes.append(f"the ledger could not be read ({exc})")
    result = preview_entries(parts, now, now + SPAN, app_zone=app.timezone, limit=limit,
                             tolerance=settings.window_tolerance,
                             anchor_mode=settings.interval_anchor, anchors=anchors,
                             pauses=[*(p for p in pauses if not p.job),
                                     *(dataclasses.replace(p, job=key) for p in pauses
                                       if p.job for key in parts)])
    rows = sorted(result.rows, key=lambda r: r.utc)[:limit]
    return EntryPreview(rows, "; ".join(notes) or None)

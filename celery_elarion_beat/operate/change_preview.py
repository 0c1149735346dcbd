"""The preview of a change of a database entry: its next occurrences across the change's
effective time, before anything is written (what the Flower edit form shows).

A change governs the occurrences from its effective time on; the ones before it stay
the old definition's. :func:`preview_change` lists both sides as beat will run them:

* **before** (from now until the effective time): the entry as it runs now, the code
  entry or the database revision that governs now, then each revision already written
  with a later effective time from that time on (the same rule as beat's:
  :func:`~..store.entry_records.governing`, :func:`~..live_schedules.rules.decide`);
* **after** (from the effective time on): what the change leaves running under the
  name: the new definition; nothing (a disable, a remove); or the code entry again
  (an override removed).

Each occurrence carries its local time, offset and daylight-saving mark
(:func:`~.preview.preview_entries`), and the pauses in force. An interval keeps its
phase across the edit (counted from its newest claim, as beat counts it:
:func:`~..config.live_entries.phase_anchor`) unless restarted.

The change is checked as :func:`~..live_schedules.api.apply_changes` checks it
(:func:`~..live_schedules.api.plan_changes`, then the store's own refusals,
:func:`~..store.entry_records.plan_writes`): bad input raises
:class:`~..exceptions.ConfigurationError` naming the field, a stale revision or a
taken name :class:`~..exceptions.EntryConflict`; nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from celery.beat import ScheduleEntry
from celery.schedules import schedule as interval_schedule

from ..config.entries import read_schedule
from ..config.live_entries import check_definition, live_cluster, phase_anchor
from ..config.settings import Settings
from ..exceptions import ConfigurationError
from ..live_schedules.api import Change, plan_changes
from ..live_schedules.rules import CODE, DATABASE, decide
from ..schedules.slots import iso
from ..store.control_records import Pause
from ..store.entry_records import EntryRevision, StoredEntry, governing, plan_writes
from ..store.interface import ClaimStore
from .preview import PreviewRow, preview_entries

__all__ = ["HORIZON", "SIDE_LIMIT", "ChangePreview", "Side", "preview_change"]

#: Occurrences listed on each side of the effective time, unless told otherwise.
SIDE_LIMIT = 10
#: How far past the effective time the preview looks for the new definition's.
HORIZON = timedelta(days=400)
#: The revisions of the entry read (the ones still to come are among the newest).
_HISTORY = 50
#: What governs after the effective time, by action.
_LABELS = {"add": "the new entry", "edit": "the edit", "override": "the override",
           "enable": "enabled", "disable": "disabled", "remove": "removed"}
#: The spans searched, shortest first, for the last occurrence before the effective time.
_LAST_SPANS = (timedelta(minutes=1), timedelta(hours=1), timedelta(days=1),
               timedelta(days=32), timedelta(days=400))


@dataclass(frozen=True)
class Segment:
    """A span of time in which one definition governs the name (*entry*; None: nothing
    runs), described by *label*; *restart*: an interval's phase restarts at *start*."""

    start: datetime
    end: datetime
    entry: ScheduleEntry | None
    label: str
    restart: bool = False


@dataclass
class Side:
    """The occurrences on one side of the effective time: *rows* (each with what
    governs it), *more*: there are more than listed; *last*: the last occurrence before
    the effective time when *more* (the before side)."""

    rows: list[tuple[str, PreviewRow]] = field(default_factory=list)
    more: bool = False
    last: tuple[str, PreviewRow] | None = None
    governs: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"occurrences": [_row(label, row) for label, row in self.rows],
                "more": self.more, "governs": self.governs,
                "last": _row(*self.last) if self.last is not None else None}


@dataclass
class ChangePreview:
    """The occurrences of entry *name* before and after the change's *effective* time
    (*now*: the store clock when it was read). *unchanged*: the change leaves the entry
    as it is (saving it writes nothing); *notes*: what an operator should know."""

    name: str
    action: str
    now: datetime
    effective: datetime
    unchanged: bool
    before: Side
    after: Side
    limit: int
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "action": self.action, "now": iso(self.now),
                "effective": iso(self.effective), "unchanged": self.unchanged,
                "limit": self.limit, "before": self.before.as_dict(),
                "after": self.after.as_dict(), "notes": self.notes}


def _row(label: str, row: PreviewRow) -> dict[str, Any]:
    found = row.as_dict()
    return {"governs": label, "utc": found["utc"], "local": found["local"],
            "zone": found["zone"], "offset": found["offset"], "dst_mark": found["dst_mark"],
            "kind": found["kind"], "anchor": found["anchor"], "paused": found["paused"]}


def preview_change(app: Any, change: Change, *, store: ClaimStore,
                   settings: Settings | None = None, limit: int = SIDE_LIMIT) -> ChangePreview:
    """The preview of *change* (as :func:`~..live_schedules.api.apply_changes` would take
    it) of a database entry of *app*, read from *store*; nothing is written."""
    settings = settings or Settings.from_app(app)
    cluster = live_cluster(settings, app)
    (planned,) = plan_changes(app, [change], store=store)
    now = store.clock()
    history = store.entry_history(cluster, change.name, _HISTORY)
    latest = history[0].entry() if history else None
    plan = plan_writes([planned], {change.name: latest} if latest is not None else {}, now)
    effective = plan[0][1] if plan else now
    code = read_schedule(app, settings).entries.get(change.name)
    notes: list[str] = []
    before = _before(app, settings, change.name, code, history, now, effective, notes)
    if planned.action == "remove":
        row = None
    else:
        assert planned.definition is not None
        row = StoredEntry(cluster, change.name, planned.definition, 0, effective, now, "", "",
                          planned.action == "override" or bool(latest and latest.overrides),
                          planned.code_digest or (latest.code_digest if latest else None),
                          planned.restart)
    after = _segment(app, settings, change.name, code, row, effective, effective + HORIZON,
                     _LABELS[planned.action], notes)
    if not plan:
        notes.append("this change leaves the entry as it is: saving it writes nothing")
    pauses = store.pauses()[1]
    claim = _newest_claim(store, settings, change.name, [*before, after])
    result = ChangePreview(change.name, planned.action, now, effective, not plan,
                           Side(), Side(), limit, notes)
    rhythm, counted = _list(app, settings, before, claim, True, result.before, pauses, limit)
    if result.before.more:
        result.before.last = _last_before(app, settings, before, counted, pauses)
    _list(app, settings, [after], rhythm, False, result.after, pauses, limit)
    return result


def _before(app: Any, settings: Settings, name: str, code: ScheduleEntry | None,
            history: Sequence[EntryRevision], now: datetime, effective: datetime,
            notes: list[str]) -> list[Segment]:
    """The spans from *now* to *effective*, each with what governs the name then: now,
    and from each later effective time of a revision already written."""
    starts = sorted({now, *(rev.effective_at for rev in history
                            if now < rev.effective_at < effective)})
    out = []
    for start, end in zip(starts, [*starts[1:], effective]):
        found = governing(history, start)
        row = found.entry() if found is not None else None
        label = f"revision {found.revision}" if found is not None else "the code entry"
        out.append(_segment(app, settings, name, code, row, start, end, label, notes))
    return out


def _segment(app: Any, settings: Settings, name: str, code: ScheduleEntry | None,
             row: StoredEntry | None, start: datetime, end: datetime, label: str,
             notes: list[str]) -> Segment:
    """What runs under *name* from *start* to *end* given its database row *row*."""
    decision = decide(name, code, row, settings.db_override_policy)
    if decision.problem is not None and decision.problem not in notes:
        notes.append(decision.problem)
    if decision.runs == CODE and code is not None:
        return Segment(start, end, code, "the code entry")
    if decision.runs == DATABASE and row is not None:
        try:
            built = check_definition(name, row.definition, settings, app)
        except ConfigurationError as exc:
            notes.append(f"{label} cannot run: {exc}")
            return Segment(start, end, None, label)
        return Segment(start, end, built, label, row.restart)
    return Segment(start, end, None, label)


def _newest_claim(store: ClaimStore, settings: Settings, name: str,
                  segments: Sequence[Segment]) -> datetime | None:
    """The newest claim of *name*, which an interval counts from (cluster anchor)."""
    if settings.interval_anchor != "cluster" or not any(
            s.entry is not None and isinstance(s.entry.schedule, interval_schedule)
            for s in segments):
        return None
    claim = store.latest_claims([name]).get(name)
    return claim.occurrence if claim is not None else None


def _counted(segment: Segment, previous: datetime | None, first: bool) -> datetime | None:
    """The run an interval span counts from: for the span that runs now, the newest
    claim (*previous*; None: unknown, shown from the window's start); for a later span,
    as beat puts it in place at its start: the last point of the rhythm before it
    moved onto its own interval (its phase kept), or its start (restarted, or no
    interval ran before it)."""
    assert segment.entry is not None
    if first:
        return previous
    if previous is None:
        return segment.start
    return phase_anchor(previous, segment.entry.schedule.run_every, segment.start,
                        segment.restart)


def _list(app: Any, settings: Settings, segments: Sequence[Segment],
          rhythm: datetime | None, runs_now: bool, side: Side, pauses: Sequence[Pause],
          limit: int) -> tuple[datetime | None, list[datetime | None]]:
    """Add the occurrences of *segments* (in order) to *side*, at most *limit*.
    *rhythm*: the last run of an interval running before them (for the span running
    now, *runs_now*: its newest claim). Returns the last run of the rhythm they leave
    at their end (None: no interval ran last) and the run each span counted from."""
    counted_by: list[datetime | None] = []
    for index, segment in enumerate(segments):
        if segment.end > segment.start:
            side.governs.append(segment.label if segment.entry is not None else
                                f"nothing runs ({segment.label})")
        if segment.entry is None:
            rhythm = None
            counted_by.append(None)
            continue
        sched = segment.entry.schedule
        counted = None
        if isinstance(sched, interval_schedule):
            counted = _counted(segment, rhythm, runs_now and index == 0)
        found = _preview(app, settings, segment, segment.start, pauses, counted,
                         limit - len(side.rows))
        counted_by.append(counted)
        if isinstance(sched, interval_schedule):
            base = counted if counted is not None else segment.start
            rhythm = phase_anchor(base, sched.run_every, segment.end, False)
        else:
            rhythm = None
        rows = found.rows
        if counted is not None and not (runs_now and index == 0):
            text = (f"restarted: counted from {iso(counted)}" if segment.restart else
                    f"its phase kept: counted from {iso(counted)}")
            rows = [replace(row, anchor=text) for row in rows]
        side.rows += [(segment.label, row) for row in rows]
        side.more = side.more or bool(found.cut)
    return rhythm, counted_by


def _preview(app: Any, settings: Settings, segment: Segment, start: datetime,
             pauses: Sequence[Pause], anchor: datetime | None, limit: int) -> Any:
    assert segment.entry is not None
    name = str(segment.entry.name)
    return preview_entries({name: segment.entry}, start, segment.end, app_zone=app.timezone,
                           limit=max(limit, 0), tolerance=settings.window_tolerance,
                           anchor_mode=settings.interval_anchor,
                           anchors={name: anchor} if anchor is not None else {},
                           pauses=pauses)


def _last_before(app: Any, settings: Settings, segments: Sequence[Segment],
                 counted: Sequence[datetime | None],
                 pauses: Sequence[Pause]) -> tuple[str, PreviewRow] | None:
    """The last occurrence before the effective time (the end of the last of
    *segments*), searched back over growing spans (None: too many to tell)."""
    for segment, anchor in reversed(list(zip(segments, counted))):
        if segment.entry is None or segment.end <= segment.start:
            continue
        for span in _LAST_SPANS:
            start = max(segment.start, segment.end - span)
            found = _preview(app, settings, segment, start, pauses, anchor, 1000)
            if found.cut:
                return None
            if found.rows:
                return segment.label, found.rows[-1]
            if start == segment.start:
                break
    return None

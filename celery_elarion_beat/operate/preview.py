"""Preview: the occurrences each ``beat_schedule`` entry will have in a time window.

What ``celery -A proj elarion-beat preview`` prints. Pure: the entries, the window
and what the database said (live nodes, pauses, the newest claims of interval
entries) are passed in; nothing here reads a clock or the store.

* An exact-slot entry (``crontab``, ``solar``, ``cron``) lists the slots the slot
  naming gives (:mod:`..schedules.slots`, :meth:`~..schedules.cron.cron.next_after`):
  the same instants every node claims, daylight-saving transitions included
  (:mod:`..schedules.dst_marks`).
* An interval entry has no instants of its own: it runs one interval after its
  newest claim (``elarion_beat_interval_anchor = "cluster"``, when the ledger has
  one), else one interval after each node's start, shown as if a node started at
  the window's start; each claim checks a window (:func:`~..schedules.slots.window_length`).
* An every-node entry is never claimed: each live node sends each occurrence.
* A database entry (live schedules) lists the occurrences its revision governs: from
  its effective time until a revision still to come takes over (that one is listed
  as an entry of its own, from its effective time on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, tzinfo
from typing import Any

from celery.beat import ScheduleEntry
from celery.schedules import crontab
from celery.schedules import schedule as interval_schedule

from ..config.entries import InvalidEntry
from ..config.placement import Placement, entry_placement
from ..schedules.cron import cron, zone_name
from ..schedules.dst_marks import Transition, dst_marks, offset_text, transitions
from ..schedules.slots import (
    ClaimKind,
    is_slotted,
    iso,
    name_occurrence,
    next_slot,
    window_length,
)
from ..store.control_records import Pause, pauses_in_force

__all__ = ["LIMIT", "PreviewRow", "SchedulePreview", "preview_entries"]

#: Occurrences listed per entry unless told otherwise: an hourly entry over 48 hours.
LIMIT = 50
#: The claim kind of an every-node entry: it is never claimed.
UNCLAIMED = "none"


@dataclass(frozen=True)
class PreviewRow:
    """One occurrence of one entry, shown in *zone*."""

    job: str
    task: str
    utc: datetime
    zone: tzinfo
    kind: str
    placement: Placement
    dst_mark: str = ""
    #: the window an interval claim checks
    window: timedelta | None = None
    #: what an interval's instants count from
    anchor: str = ""
    #: the live nodes that each send it (every-node entries); None: one node, or unknown
    nodes: tuple[str, ...] | None = None
    paused: Pause | None = None

    @property
    def local(self) -> datetime:
        return self.utc.astimezone(self.zone)

    @property
    def offset(self) -> str:
        return offset_text(self.local)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "task": self.task, "utc": iso(self.utc),
                "local": self.local.replace(microsecond=0).isoformat(),
                "zone": zone_name(self.zone), "offset": self.offset,
                "dst_mark": self.dst_mark or None, "kind": self.kind,
                "placement": self.placement.value,
                "window": self.window.total_seconds() if self.window else None,
                "anchor": self.anchor or None,
                "nodes": list(self.nodes) if self.nodes is not None else None,
                "paused": self.paused.as_dict() if self.paused else None}


@dataclass
class SchedulePreview:
    """The occurrences of every entry in ``[start, end)``, sorted by time."""

    start: datetime
    end: datetime
    rows: list[PreviewRow]
    invalid: list[InvalidEntry] = field(default_factory=list)
    #: entries with more occurrences in the window than the limit
    cut: list[str] = field(default_factory=list)
    #: entries whose schedule names no instants a preview can list (a custom schedule
    #: without ``elarion_slot``, or whose ``elarion_slot`` failed)
    unknown: list[str] = field(default_factory=list)
    #: the live nodes (None: unknown, see *nodes_error*)
    nodes: list[str] | None = None
    nodes_error: str | None = None
    limit: int = LIMIT
    zones: list[tzinfo] = field(default_factory=list)

    def transitions(self) -> list[Transition]:
        """The offset changes in the window of every zone the preview shows."""
        found = [t for zone in self.zones for t in transitions(zone, self.start, self.end)]
        return sorted(found, key=lambda t: (t.at, zone_name(t.zone)))

    def as_dict(self) -> dict[str, Any]:
        return {"from": iso(self.start), "to": iso(self.end), "limit": self.limit,
                "nodes": self.nodes, "nodes_error": self.nodes_error,
                "transitions": [{"zone": zone_name(t.zone), "utc": iso(t.at),
                                 "mark": t.mark(), "clocks": t.describe()}
                                for t in self.transitions()],
                "occurrences": [row.as_dict() for row in self.rows],
                "invalid": [{"job": i.job, "reason": i.reason} for i in self.invalid],
                "cut": self.cut, "unknown": self.unknown}


def entry_zone(sched: Any, app_zone: tzinfo) -> tzinfo:
    """The zone *sched* reads wall times in: a ``cron``'s own (else the app's), a
    ``crontab``'s (the app's), else the app's."""
    if isinstance(sched, cron):
        return sched.zone
    if isinstance(sched, crontab):
        own: tzinfo | None = sched.tz
        return own if own is not None else app_zone
    return app_zone


def preview_entries(entries: Mapping[str, ScheduleEntry], start: datetime, end: datetime, *,
                    app_zone: tzinfo, display_zone: tzinfo | None = None, limit: int = LIMIT,
                    tolerance: float = 1.0, anchor_mode: str = "cluster",
                    anchors: Mapping[str, datetime] | None = None,
                    live_nodes: Sequence[str] | None = None, pauses: Sequence[Pause] = (),
                    invalid: Sequence[InvalidEntry] = ()) -> SchedulePreview:
    """The occurrences of *entries* in ``[start, end)``, at most *limit* per entry.

    *anchors* are the newest claims of interval entries (None: the ledger is
    unknown); *live_nodes* the nodes that send every-node entries (None: unknown);
    *pauses* the pauses in force. Times in the entry's own zone, or *display_zone*."""
    result = SchedulePreview(start, end, [], list(invalid), limit=limit,
                             nodes=sorted(live_nodes) if live_nodes is not None else None)
    held = pauses_in_force(pauses, entries)
    zones: dict[str, tzinfo] = {}
    for name, entry in sorted(entries.items()):
        placement = entry_placement(name, entry.options)
        own = entry_zone(entry.schedule, app_zone)
        shown = display_zone or own
        zones.setdefault(zone_name(own), own)
        zones.setdefault(zone_name(shown), shown)
        every = placement is Placement.EVERY_NODE
        base = PreviewRow(name, str(entry.task), start, shown, UNCLAIMED, placement,
                          nodes=tuple(result.nodes) if every and result.nodes is not None
                          else None)
        sched = entry.schedule
        if is_slotted(sched):
            try:
                previous, instants, more = _slots(name, sched, start, end, limit)
            except Exception:  # noqa: BLE001 - a custom elarion_slot that fails: not listed
                result.unknown.append(name)
                continue
            base = replace(base, kind=UNCLAIMED if every else ClaimKind.SLOT.value)
        elif isinstance(sched, interval_schedule):
            anchor, text = _anchor(name, every, anchor_mode, anchors)
            previous, instants, more = _rhythm(sched.run_every, anchor, start, end, limit)
            base = replace(base, kind=UNCLAIMED if every else ClaimKind.WINDOW.value,
                           anchor=text, window=None if every else window_length(
                               sched.run_every, tolerance))
        else:
            result.unknown.append(name)
            continue
        if more:
            result.cut.append(name)
        effective, until = getattr(entry, "effective_at", None), getattr(entry, "until", None)
        if effective is not None or until is not None:  # a database entry's revision
            instants = [i for i in instants if (effective is None or i >= effective)
                        and (until is None or i < until)]
        marks = dst_marks(name, sched, own, instants, previous,
                          zone_shown=zone_name(own) != zone_name(shown))
        pause = held.get(name)
        for instant, mark in zip(instants, marks):
            paused = pause if pause is not None and (
                pause.until is None or pause.until > instant) else None
            result.rows.append(replace(base, utc=instant, dst_mark="; ".join(mark),
                                       paused=paused))
    result.rows.sort(key=lambda row: (row.utc, row.job))
    result.zones = list(zones.values())
    return result


def _slots(job: str, sched: Any, start: datetime, end: datetime,
           limit: int) -> tuple[datetime | None, list[datetime], bool]:
    """The slot before *start*, up to *limit* slots in ``[start, end)``, and whether
    there are more."""
    try:
        previous = name_occurrence(job, sched, start - timedelta(microseconds=1),
                                   tolerance=0.0).slot
    except ValueError:  # no slot that far back
        previous = None
    out: list[datetime] = []
    cursor: datetime | None = start - timedelta(microseconds=1)
    while cursor is not None:
        cursor = (sched.next_after(cursor) if isinstance(sched, cron)
                  else next_slot(job, sched, cursor, cursor))
        if cursor is None or cursor >= end:
            return previous, out, False
        if len(out) == limit:
            return previous, out, True
        out.append(cursor)
    return previous, out, False


def _anchor(job: str, every_node: bool, mode: str,
            anchors: Mapping[str, datetime] | None) -> tuple[datetime | None, str]:
    if every_node or mode != "cluster":
        return None, "anchored at each node's start (shown as if one started at the window's start)"
    if anchors is None:
        return None, "cluster anchor: newest claim unknown (shown from the window's start)"
    last = anchors.get(job)
    if last is None:
        return None, "cluster anchor: no claim yet (shown from the window's start)"
    return last, f"cluster anchor: newest claim {iso(last)}"


def _rhythm(every: timedelta, anchor: datetime | None, start: datetime, end: datetime,
            limit: int) -> tuple[datetime, list[datetime], bool]:
    """The points ``anchor + k * every`` in ``[start, end)`` (from *start* when there is
    no anchor), the point before them, and whether there are more than *limit*."""
    base = anchor if anchor is not None else start
    steps = max(1, -((base - start) // every)) if base < start else 1
    first = point = base + steps * every
    out: list[datetime] = []
    while point < end:
        if len(out) == limit:
            return first - every, out, True
        out.append(point)
        point += every
    return first - every, out, False

"""Reconciliation: what became of each entry's occurrences over a period.

``celery elarion-beat status --since 24h`` counts, per entry of the schedule and
from the claims ledger alone, over the period ``[start, now]`` (database clock;
*start* is ``now - since``, clipped to the claim retention, since older claims
are purged):

``expected``
    Exact-slot entries (crontab, solar, cron): the slots the schedule names in
    the period, from when the entry was first known (its oldest claim kept, or
    the start of a node that had it), except the slots less than *grace* old that
    nobody claimed yet (they are not late yet). At most :data:`MAX_EXPECTED`
    slots per entry, the most recent: an entry with more is counted from its
    oldest listed slot (``capped``). Interval entries: the period (from when the
    entry was first known) divided by the interval, rounded down. This is
    nominal: beat runs an interval entry one interval after its previous run, not
    on a grid, so each run lands a tick late and ``claimed`` may fall a few short
    of it with nothing missed (``missed`` looks at the gaps instead).
``claimed``
    The job's rows in the period, except ``skipped`` ones.
``published``
    Claimed rows whose message reached the broker (``published``) or whose run
    started (a worker received it).
``succeeded``, ``failed``, ``running``
    By the workers' ``run_state``: ``failed`` is a run that raised (a publish
    that failed is an orphan, not a failed run); ``running`` is a run started and
    not finished, including ``retried``.
``missed``
    Exact slots: expected slots with no row at all. Intervals: the interval points
    that passed with no run, counted in the gaps between consecutive occurrences
    (``skipped`` ones included) longer than one interval plus *grace*: a gap of
    *g* seconds holds ``floor(g / interval) - 1`` missed runs (the run that ends
    it stands for one: a run late by less than another interval is late, not
    missed), the gap from the last occurrence to now ``floor((g - grace) /
    interval)`` (as ``status`` flags an interval entry whose newest claim is older
    than its interval plus grace). The gap from the period's start counts like
    one between runs: at least what was missed.
``orphaned``
    Rows claimed and never published within ``elarion_beat_publish_timeout``
    (:meth:`~celery_elarion_beat.store.interface.ClaimRow.status`).
``skipped``
    Occurrences the cluster decided not to send: ``overlap: skip`` found the
    previous run unfinished (``still-running``).
``duplicates``
    Must be 0. A slot holds one row (the primary key), so a duplicate is either
    (a) two consecutive claims of an interval entry closer than its claim window
    (the interval less ``elarion_beat_window_tolerance``, at most 10% of it), or
    (b) a row taken over (``takeovers`` > 0) whose run started before the takeover
    (``started_at < claimed_at``): its first message was delivered, then published
    again. (A start recorded after the takeover hides (b): as far as the ledger knows.)

Every-node entries are never claimed: each worker's run has a row of kind
``node``, counted as ``published`` (runs) and ``succeeded``/``failed``/``running``,
per beat node too; ``expected``, ``claimed``, ``missed``, ``orphaned``,
``skipped`` and ``duplicates`` do not apply (None). Other schedules name no slots
and have no interval: only their rows are counted.

An entry never claimed that no live or recent node ran is new: nothing is
expected of it. At most :data:`MAX_ROWS` rows are read per entry (the most
recent): an entry with more is counted from its oldest row read (``capped``).

Pure counting over rows; the only I/O is :func:`read_rows` and the builder's
reads, through the store seam.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery.schedules import crontab, solar
from celery.schedules import schedule as interval_schedule

from ..config.jitter import slot_delay
from ..config.placement import Placement, entry_placement
from ..observe.fingerprint import describe_schedule
from ..schedules.cron import cron
from ..schedules.slots import (
    ClaimKind,
    name_occurrence,
    recent_slots,
    window_length,
)
from ..store.interface import ClaimStore
from ..store.records import ClaimRow, NodeState
from ..store.states import (
    EVERY_NODE_KIND,
    MANUAL_KIND,
    PUBLISHED,
    RUN_FAILED,
    SKIPPED,
    SUCCEEDED,
    UNFINISHED_RUNS,
)

__all__ = ["COUNTERS", "MAX_EXPECTED", "MAX_ROWS", "EntryCount", "Reconciliation",
           "count_entry", "first_run_by_nodes", "known_since", "read_rows", "reconcile"]

#: Slots listed per entry at most (the most recent), like ``catch_up.MAX_MISSED``.
MAX_EXPECTED = 10_000
#: Ledger rows read per entry at most (the most recent).
MAX_ROWS = 20_000
#: Occurrences named per finding and entry (the counts are complete).
DETAILS = 20
#: The counters, in the order ``status`` shows them.
COUNTERS = ("expected", "claimed", "published", "succeeded", "failed", "running", "missed",
            "orphaned", "skipped", "duplicates", "manual")

SLOTS, INTERVAL, EVERY_NODE, OTHER = "slots", "interval", "every_node", "other"


@dataclass
class EntryCount:
    """One entry's counts over ``[start, end]`` (None: does not apply to its kind)."""

    job: str
    kind: str
    #: where this entry's count begins: the period's start, or later when the entry
    #: was first known later or ``capped``
    start: datetime
    expected: int | None = None
    claimed: int | None = 0
    published: int = 0
    succeeded: int = 0
    failed: int = 0
    running: int = 0
    missed: int | None = None
    orphaned: int | None = 0
    skipped: int | None = 0
    duplicates: int | None = 0
    #: runs an operator triggered (kind ``manual``): not occurrences of the schedule, so
    #: counted apart (their outcomes count in succeeded, failed, running)
    manual: int = 0
    capped: bool = False
    #: the latest occurrences behind each finding, newest first (at most DETAILS)
    missed_at: list[datetime] = field(default_factory=list)
    failures: list[ClaimRow] = field(default_factory=list)
    duplicate_at: list[datetime] = field(default_factory=list)
    orphaned_at: list[datetime] = field(default_factory=list)
    #: every-node entries: per beat node, its runs by outcome
    nodes: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "kind": self.kind, "start": self.start.isoformat(),
                "capped": self.capped, **{name: getattr(self, name) for name in COUNTERS},
                "missed_at": [m.isoformat() for m in self.missed_at],
                "failures": [{"occurrence": r.occurrence.isoformat(), "worker": r.worker,
                              "node": r.node, "error": r.run_error} for r in self.failures],
                "duplicate_at": [d.isoformat() for d in self.duplicate_at],
                "orphaned_at": [o.isoformat() for o in self.orphaned_at],
                "nodes": self.nodes}


@dataclass
class Reconciliation:
    """Every entry's counts over ``[start, end]``; ``clipped`` when the period asked
    for began before the claim retention."""

    start: datetime
    end: datetime
    grace: timedelta
    clipped: bool
    entries: list[EntryCount]

    def total(self, counter: str) -> int:
        return sum(getattr(e, counter) or 0 for e in self.entries)

    @property
    def findings(self) -> dict[str, int]:
        """The counters that must be 0, where they are not."""
        found = {name: self.total(name) for name in ("missed", "failed", "duplicates",
                                                      "orphaned")}
        return {name: count for name, count in found.items() if count}

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start.isoformat(), "end": self.end.isoformat(),
                "grace": self.grace.total_seconds(), "clipped": self.clipped,
                "entries": [e.as_dict() for e in self.entries],
                "totals": {name: self.total(name) for name in COUNTERS}}


def first_run_by_nodes(nodes: Iterable[NodeState]) -> dict[str, datetime]:
    """Per entry, the earliest start of a node whose schedule has it."""
    out: dict[str, datetime] = {}
    for node in nodes:
        if node.started_at is None:
            continue
        for name in node.entries:
            if name not in out or node.started_at < out[name]:
                out[name] = node.started_at
    return out


def known_since(first_claim: datetime | None, first_node: datetime | None) -> datetime | None:
    """When an entry was first known: its oldest claim or the first node that ran it."""
    known = [when for when in (first_claim, first_node) if when is not None]
    return min(known) if known else None


def read_rows(store: ClaimStore, jobs: Iterable[str], start: datetime, end: datetime,
              limit: int = MAX_ROWS) -> dict[str, tuple[list[ClaimRow], bool]]:
    """Each job's rows with an occurrence in ``[start, end]``, newest first, at most
    *limit*, and whether there were more. One bounded ``find_claims`` per job (the
    store has no call for a set of jobs over a period yet)."""
    out = {}
    for job in jobs:
        rows = [r for r in store.find_claims(job=job, since=start, limit=limit + 1)
                if r.occurrence <= end]
        out[job] = (rows[:limit], len(rows) > limit)
    return out


def entry_kind(name: str, entry: Any, now: datetime) -> str:
    """``every_node``, ``slots`` (exact slots), ``interval`` or ``other``."""
    if entry_placement(name, entry.options) is Placement.EVERY_NODE:
        return EVERY_NODE
    try:
        named = name_occurrence(name, entry.schedule, now, tolerance=0.0)
    except Exception:  # a schedule that cannot be named: only its rows count
        return OTHER
    if named.kind is ClaimKind.SLOT:
        return SLOTS
    return INTERVAL if isinstance(entry.schedule, interval_schedule) else OTHER


def count_entry(job: str, kind: str, rows: Sequence[ClaimRow], *, start: datetime,
                end: datetime, grace: timedelta, publish_timeout: timedelta,
                slots: Sequence[datetime] = (), every: timedelta | None = None,
                tolerance: float = 1.0,
                delay: Callable[[datetime], timedelta] = lambda slot: timedelta(0),
                ) -> EntryCount:
    """The counts of one entry from its *rows* in ``[start, end]`` (any order): for
    ``slots``, *slots* are the schedule's slots there (each published *delay* after
    it: its jitter); for ``interval``, *every* is the interval. Pure: the module
    docstring defines each counter."""
    rows = sorted((r for r in rows if start <= r.occurrence <= end),
                  key=lambda r: r.occurrence, reverse=True)
    if kind == EVERY_NODE:
        return _every_node(job, start, rows)
    count = EntryCount(job, kind, start)
    for row in rows:
        if row.kind == MANUAL_KIND:
            count.manual += 1
            _outcome(count, row)
    claims = [r for r in rows if r.kind not in (EVERY_NODE_KIND, MANUAL_KIND)]
    _tally(count, claims, end, publish_timeout)
    if kind == SLOTS:
        held = {r.occurrence for r in claims}
        expected = [s for s in slots if start <= s <= end
                    and (s + delay(s) <= end - grace or s in held)]
        missed = [s for s in expected if s not in held]
        count.expected, count.missed = len(expected), len(missed)
        count.missed_at = sorted(missed, reverse=True)[:DETAILS]
    elif kind == INTERVAL and every is not None and every > timedelta(0):
        count.expected = int((end - start) / every)
        _gaps(count, claims, every, start, end, grace, window_length(every, tolerance))
    return count


def _tally(count: EntryCount, rows: Sequence[ClaimRow], now: datetime,
           timeout: timedelta) -> None:
    for row in rows:
        if row.state == SKIPPED:
            count.skipped = (count.skipped or 0) + 1
            continue
        count.claimed = (count.claimed or 0) + 1
        if row.state in (PUBLISHED, None) or row.run_state is not None:
            count.published += 1
        _outcome(count, row)
        if row.status(now, timeout) == "orphaned":
            count.orphaned = (count.orphaned or 0) + 1
            _note(count.orphaned_at, row.occurrence)
        if row.takeovers and row.started_at is not None and row.started_at < row.claimed_at:
            count.duplicates = (count.duplicates or 0) + 1
            _note(count.duplicate_at, row.occurrence)


def _outcome(count: EntryCount, row: ClaimRow) -> str | None:
    if row.run_state == SUCCEEDED:
        count.succeeded += 1
    elif row.run_state == RUN_FAILED:
        count.failed += 1
        if len(count.failures) < DETAILS:
            count.failures.append(row)
    elif row.run_state in UNFINISHED_RUNS:
        count.running += 1
    return row.run_state


def _gaps(count: EntryCount, rows: Sequence[ClaimRow], every: timedelta, start: datetime,
          end: datetime, grace: timedelta, window: timedelta) -> None:
    """Missed runs and too-close claims of an interval entry."""
    points = sorted(r.occurrence for r in rows)
    step, late = every.total_seconds(), (every + grace).total_seconds()
    last = points[-1] if points else start
    tail = (end - last).total_seconds()
    # (the point the gap begins at, how many runs it missed), newest gap first
    gaps = [(last, math.floor((tail - grace.total_seconds()) / step) if tail >= late else 0)]
    for before, after in reversed(list(zip([start, *points], points))):
        gap = (after - before).total_seconds()
        gaps.append((before, math.floor(gap / step) - 1 if gap > late else 0))
    count.missed = sum(missed for _, missed in gaps)
    for begin, missed in gaps:
        for k in range(missed, 0, -1):
            if len(count.missed_at) >= DETAILS:
                break
            count.missed_at.append(begin + every * k)
    runs = [r.occurrence for r in sorted(rows, key=lambda r: r.occurrence, reverse=True)
            if r.state != SKIPPED]
    for after, before in zip(runs, runs[1:]):
        if after - before < window:
            count.duplicates = (count.duplicates or 0) + 1
            _note(count.duplicate_at, after)


def _every_node(job: str, start: datetime, rows: Sequence[ClaimRow]) -> EntryCount:
    count = EntryCount(job, EVERY_NODE, start, claimed=None, orphaned=None, skipped=None,
                       duplicates=None)
    for row in rows:
        if row.kind != EVERY_NODE_KIND:
            continue
        count.published += 1
        per = count.nodes.setdefault(row.node, {"runs": 0, "succeeded": 0, "failed": 0,
                                                "running": 0})
        per["runs"] += 1
        outcome = _outcome(count, row)
        if outcome in (SUCCEEDED, RUN_FAILED):
            per[outcome] += 1
        elif outcome in UNFINISHED_RUNS:
            per["running"] += 1
    return count


def _note(found: list[datetime], when: datetime) -> None:
    if len(found) < DETAILS:
        found.append(when)


def reconcile(entries: Mapping[str, Any], store: ClaimStore, *, now: datetime,
              start: datetime, grace: timedelta, publish_timeout: timedelta,
              tolerance: float, nodes: Iterable[NodeState] = (),
              clipped: bool = False) -> Reconciliation:
    """Count every entry of *entries* (name -> ScheduleEntry) over ``[start, now]``."""
    kinds = {name: entry_kind(name, entry, now) for name, entry in sorted(entries.items())}
    cluster = [name for name, kind in kinds.items() if kind != EVERY_NODE]
    firsts = store.job_ledger({name: (now, now) for name in cluster}) if cluster else {}
    started = first_run_by_nodes(nodes)
    begins: dict[str, datetime] = {}
    for name in kinds:
        known = known_since(firsts[name].first, started.get(name)) if name in firsts else start
        effective = getattr(entries[name], "effective_at", None)  # a database entry's revision
        if known is not None and effective is not None:
            known = max(known, effective)  # older occurrences were another revision's
        begins[name] = max(start, known) if known is not None else now
    listed: dict[str, list[datetime]] = {}
    shared: dict[str, list[datetime]] = {}  # entries with one schedule share its slots
    capped: set[str] = set()
    for name, kind in kinds.items():
        if kind != SLOTS or begins[name] >= now:  # never known: nothing expected
            continue
        sched = entries[name].schedule
        key = describe_schedule(sched) if isinstance(sched, (crontab, cron, solar)) else None
        slots = shared.get(key) if key else None
        if slots is None:
            slots = recent_slots(name, sched, now, start, MAX_EXPECTED)
            if key:
                shared[key] = slots
        listed[name] = slots
        if len(slots) >= MAX_EXPECTED:
            capped.add(name)
            begins[name] = max(begins[name], slots[-1])
    ledger = read_rows(store, kinds, start, now, MAX_ROWS)
    counts = []
    for name, kind in kinds.items():
        rows, more = ledger[name]
        if more:
            capped.add(name)
            begins[name] = max(begins[name], rows[-1].occurrence)
        sched = entries[name].schedule
        count = count_entry(
            name, kind, rows, start=begins[name], end=now, grace=grace,
            publish_timeout=publish_timeout, slots=listed.get(name, ()),
            every=sched.run_every if kind == INTERVAL else None, tolerance=tolerance,
            delay=slot_delay(entries[name]))
        count.capped = name in capped
        counts.append(count)
    return Reconciliation(start, now, grace, clipped, counts)

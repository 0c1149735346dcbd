"""The cluster's health, as ``celery elarion-beat status`` shows it.

Built from the app's ``beat_schedule`` and the store (claims and nodes tables),
on the database clock. Unhealthy when live nodes run different schedules or a
cluster entry missed its latest slot (the dead-man report: nobody claimed it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery.beat import ScheduleEntry
from celery.schedules import crontab
from celery.schedules import schedule as interval_schedule

from .clock import as_utc
from .cron import cron
from .fingerprint import describe_schedule, diff_entries, entry_digests, fingerprint
from .placement import Placement, entry_placement
from .settings import Settings
from .slots import ClaimKind, name_occurrence
from .store import ClaimStore
from .store.base import ClaimRow, NodeState

__all__ = ["EntryStatus", "NodeStatus", "Status", "build_status", "schedule_entries"]


@dataclass
class EntryStatus:
    name: str
    task: str
    schedule: str
    placement: str
    last_occurrence: datetime | None
    winner: str | None
    task_id: str | None
    next_due: datetime | None
    skips: dict[str, int]
    missed: datetime | None = None


@dataclass
class NodeStatus:
    node: str
    alive: bool
    last_seen: datetime | None
    started_at: datetime | None
    version: str
    fingerprint: str
    host: str
    pid: int


@dataclass
class Status:
    now: datetime
    entries: list[EntryStatus]
    nodes: list[NodeStatus]
    drift: dict[str, list[str]] = field(default_factory=dict)

    @property
    def missed(self) -> list[EntryStatus]:
        return [e for e in self.entries if e.missed is not None]

    @property
    def healthy(self) -> bool:
        return not self.drift and not self.missed

    def as_dict(self) -> dict[str, Any]:
        def when(value: datetime | None) -> str | None:
            return value.isoformat() if value else None

        return {
            "now": when(self.now), "healthy": self.healthy, "drift": self.drift,
            "entries": [{**e.__dict__, "last_occurrence": when(e.last_occurrence),
                         "next_due": when(e.next_due), "missed": when(e.missed)}
                        for e in self.entries],
            "nodes": [{**n.__dict__, "last_seen": when(n.last_seen),
                       "started_at": when(n.started_at)} for n in self.nodes],
        }


def schedule_entries(app: Any) -> dict[str, ScheduleEntry]:
    """The app's beat_schedule as beat builds it."""
    return {name: ScheduleEntry(**dict(spec, name=name, app=app))
            for name, spec in (app.conf.beat_schedule or {}).items()}


def build_status(app: Any, settings: Settings, store: ClaimStore,
                 grace: timedelta = timedelta(seconds=60)) -> Status:
    entries = schedule_entries(app)
    now, nodes = store.nodes()
    latest = store.latest_claims()
    timeout = timedelta(seconds=settings.node_timeout)
    live = [n for n in nodes if n.last_seen is not None and now - n.last_seen <= timeout]
    node_rows = [NodeStatus(n.node, n in live, n.last_seen, n.started_at, n.version,
                            n.fingerprint, n.host, n.pid) for n in nodes]
    skips = _skips(nodes)
    statuses = [_entry_status(name, entry, now, latest.get(name), skips.get(name, {}),
                              settings)
                for name, entry in sorted(entries.items())]
    earliest = min((n.started_at for n in live if n.started_at), default=None)
    _dead_man(statuses, entries, now, grace, earliest, store, settings)
    return Status(now, statuses, node_rows, _drift(live))


def _skips(nodes: list[NodeState]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for node in nodes:
        for key, count in node.counts.items():
            job, outcome, reason = (key.split("|") + ["", ""])[:3]
            if outcome == "skipped":
                per = out.setdefault(job, {})
                per[reason] = per.get(reason, 0) + count
    return out


def _entry_status(name: str, entry: ScheduleEntry, now: datetime, claim: ClaimRow | None,
                  skips: Mapping[str, int], settings: Settings) -> EntryStatus:
    placement = entry_placement(name, entry.options).value
    return EntryStatus(
        name=name, task=entry.task, schedule=describe_schedule(entry.schedule),
        placement=placement,
        last_occurrence=claim.occurrence if claim else None,
        winner=claim.node if claim else None, task_id=claim.task_id if claim else None,
        next_due=_next_due(entry, now, claim), skips=dict(skips))


def _next_due(entry: ScheduleEntry, now: datetime, claim: ClaimRow | None) -> datetime | None:
    sched = entry.schedule
    try:
        if isinstance(sched, cron):
            return sched.next_after(now)
        if isinstance(sched, interval_schedule):
            every: timedelta = sched.run_every
            return (claim.occurrence if claim else now) + every
        if isinstance(sched, crontab):
            start, delta, _ = sched.remaining_delta(now)
            return as_utc(start + delta)
        estimate: timedelta = sched.remaining_estimate(now)
        return now + estimate
    except Exception:
        return None


def _dead_man(statuses: list[EntryStatus], entries: Mapping[str, ScheduleEntry], now: datetime,
              grace: timedelta, earliest: datetime | None, store: ClaimStore,
              settings: Settings) -> None:
    """Mark cluster entries whose latest slot nobody claimed while a node was running."""
    if earliest is None:
        return
    wanted: dict[str, datetime] = {}
    for status in statuses:
        entry = entries[status.name]
        if status.placement != Placement.CLUSTER.value:
            continue
        occ = name_occurrence(status.name, entry.schedule, now - grace,
                              tolerance=settings.window_tolerance)
        if occ.kind is ClaimKind.SLOT and occ.slot is not None:
            if occ.slot >= earliest:
                wanted[status.name] = occ.slot
        elif isinstance(entry.schedule, interval_schedule):
            limit = now - entry.schedule.run_every - grace
            last = status.last_occurrence
            if limit >= earliest and (last is None or last < limit):
                status.missed = limit
    found = store.existing(wanted.items())
    for status in statuses:
        slot = wanted.get(status.name)
        if slot is not None and (status.name, slot) not in found:
            status.missed = slot


def _drift(live: list[NodeState]) -> dict[str, list[str]]:
    """Per node, the entries that differ from the most common schedule among live nodes."""
    if len({n.fingerprint for n in live}) <= 1:
        return {}
    counts: dict[str, int] = {}
    for n in live:
        counts[n.fingerprint] = counts.get(n.fingerprint, 0) + 1
    majority = max(counts, key=lambda fp: (counts[fp], fp))
    reference = next(n for n in live if n.fingerprint == majority)
    return {n.node: diff_entries(reference.entries, n.entries)
            for n in live if n.fingerprint != majority}


def local_fingerprint(app: Any) -> str:
    """The fingerprint this app's schedule would have on a beat node."""
    return fingerprint(entry_digests(schedule_entries(app)))


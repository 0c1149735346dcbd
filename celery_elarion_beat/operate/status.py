"""The cluster's health, as ``celery elarion-beat status`` shows it.

Built from the app's ``beat_schedule`` and the store (claims and nodes tables),
on the database clock. Unhealthy when live nodes run different schedules or a
cluster entry missed a slot (the dead-man report: nobody claimed it).

Missed slots come from the ledger, not from which nodes are alive now, so a
whole-cluster outage is reported while the cluster is down and after it is
back. For an exact-slot entry, every slot in the *lookback* (default: the claim
retention; at most the last :data:`MAX_SLOTS` slots) since the entry was first
known (its oldest claim, or the start of a node that ran it) and older than
*grace* must have a claim. The purge keeps each job's newest claim, so a job that
runs monthly never looks missed. An interval entry has no slots: it is missed
while its newest claim is older than its interval plus *grace*.

With a period (``status --since 24h``), each entry's occurrences over it are
reconciled as well (:mod:`.reconcile`: expected, claimed, published, succeeded,
failed, missed, orphaned, skipped, duplicates). The findings (:data:`FINDINGS`):
drift, missed slots, orphans, over a period failed runs and duplicates, and tables
shared with another app that still have the keys of 0.2 (``shared``: their claims
collide until ``init-db``); each makes ``status`` exit 1 unless ``--fail-on`` leaves
it out.

``foreign-beat``: the workers (``install_worker``) saw messages of a beat that claims
nothing (Celery's stock scheduler beside the claiming beats: every occurrence it sends
goes out twice) within the period (``--since``; else ``--lookback``; else the last
:data:`FOREIGN_WINDOW`). ``foreign_beats`` lists the senders, each with its ``origin``
(``gen<pid>@<host>``), host, message count and tasks. When the foreign beats table
cannot be read (made by no migration yet, or no privilege on it), the report says so
and ``foreign_beats`` is None: the other findings stand.

``node-missing``: an every-node entry that a live beat node did not run (its worker is
down: its beat sends on, and the messages expire unexecuted). Each every-node entry has
``nodes_ran`` (node -> runs the workers recorded), ``nodes_missing`` (live nodes, live
for two periods of the entry within the period, whose workers record runs and recorded
none of it), ``nodes_not_tracked`` (live nodes whose workers never recorded a run: no
``install_worker``; never missing) and ``nodes_too_new``; over ``--since``, else
``--lookback``, else the entry's last two periods (:mod:`.coverage`).

With ``elarion_beat_db_entries`` the database entries are reported as the code entries
are (each under the revision that governs now; its slots counted from that revision's
effective time). *Drift* compares the live nodes' code entries (a deploy in progress);
a node that holds an older version of the database entries than the cluster's, for
longer than it takes to hear of a change, is *behind* (it has not caught up with the
database schedule), a finding of its own.

Everything is of the app's cluster (``elarion_beat_cluster``): its entries, its
nodes, its pauses, the foreign beats its workers saw; other apps' rows in the same
tables are never counted.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery.beat import ScheduleEntry
from celery.schedules import crontab, solar
from celery.schedules import schedule as interval_schedule

from ..config.catch_up import entry_catch_up
from ..config.delivery import entry_delivery
from ..config.entries import InvalidEntry, schedule_entries
from ..config.jitter import slot_delay
from ..config.live_entries import LiveEntry, live_cluster
from ..config.placement import Placement, entry_placement
from ..config.settings import Settings
from ..exceptions import ConfigurationError, StoreError
from ..live_schedules.listing import read_live_schedule
from ..observe.fingerprint import (
    describe_schedule,
    drift_from,
    entry_digests,
    fingerprint,
    schedule_text,
)
from ..schedules.clock import as_utc
from ..schedules.cron import cron
from ..schedules.slots import recent_slots
from ..store.clusters import ClusterCensus
from ..store.control_records import Pause, pauses_in_force
from ..store.foreign_records import ForeignSender, foreign_senders
from ..store.interface import ClaimStore
from ..store.records import ClaimRow, NodeState
from .coverage import NodeCoverage, every_node_coverage
from .reconcile import (
    Reconciliation,
    first_run_by_nodes,
    known_since,
    reconcile,
)

__all__ = ["FINDINGS", "FOREIGN_WINDOW", "EntryStatus", "NodeStatus", "Status", "build_status"]


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
    #: the latest missed slot (or, for an interval, when the gap began to count)
    missed: datetime | None = None
    #: how many slots were missed within the lookback
    missed_count: int = 0
    #: the entry's catch-up policy and delivery (see docs/missed.md)
    catch_up: str = "skip"
    delivery: str = "at_most_once"
    #: occurrences claimed and still unpublished after elarion_beat_publish_timeout
    orphaned: list[datetime] = field(default_factory=list)
    #: occurrences claimed and not published yet, within the publish timeout
    unpublished: list[datetime] = field(default_factory=list)
    #: the pause in force (its own, else the pause of every job): who, when, why, until
    paused: Pause | None = None
    #: every-node entries (None for the others, see :mod:`.coverage`): node -> runs its
    #: workers recorded since ``nodes_since``; the live tracked nodes with none; the live
    #: nodes whose workers record no runs; the live nodes too new to be judged
    nodes_ran: dict[str, int] | None = None
    nodes_missing: list[str] | None = None
    nodes_not_tracked: list[str] | None = None
    nodes_too_new: list[str] | None = None
    nodes_since: datetime | None = None

    def cover(self, coverage: NodeCoverage) -> None:
        """Take an every-node entry's coverage (:mod:`.coverage`)."""
        self.nodes_ran, self.nodes_missing = coverage.ran, coverage.missing
        self.nodes_not_tracked, self.nodes_too_new = coverage.not_tracked, coverage.too_new
        self.nodes_since = coverage.since


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
    #: ``''``: a node of a version before clusters (0.2), still to upgrade
    cluster: str = ""


#: What ``status`` can find wrong, each a reason to exit 1 (``--fail-on``).
FINDINGS = ("missed", "failed", "duplicates", "orphaned", "drift", "behind", "foreign-beat",
            "node-missing", "shared")

#: How far back ``status`` looks for foreign beats without ``--since`` or ``--lookback``.
FOREIGN_WINDOW = timedelta(days=1)


@dataclass
class Status:
    now: datetime
    entries: list[EntryStatus]
    nodes: list[NodeStatus]
    drift: dict[str, list[str]] = field(default_factory=dict)
    #: the per-entry counts over a period (``status --since``)
    reconciliation: Reconciliation | None = None
    #: every pause in force (``elarion-beat pause``), a job's and every job's
    pauses: list[Pause] = field(default_factory=list)
    #: the ``beat_schedule`` entries beat leaves out, with why (:mod:`..config.entries`)
    invalid: list[InvalidEntry] = field(default_factory=list)
    #: the beats that sent without claiming within the period; None: unknown (see
    #: ``foreign_error``)
    foreign_beats: list[ForeignSender] | None = field(default_factory=list)
    #: why the foreign beats could not be read
    foreign_error: str | None = None
    #: the start of the period foreign beats were looked for in (database clock)
    foreign_since: datetime | None = None
    #: the cluster reported on (``elarion_beat_cluster``), and its claims table
    cluster: str = ""
    table: str = ""
    #: where the tables stand: other apps in them, keys of 0.2 (:mod:`..store.clusters`)
    census: ClusterCensus | None = None
    #: the database entries' version (live schedules; None: off)
    entries_version: int | None = None
    #: live nodes that have not caught up with it: node -> the version they hold
    behind: dict[str, int | None] = field(default_factory=dict)

    @property
    def missed(self) -> list[EntryStatus]:
        return [e for e in self.entries if e.missed is not None]

    @property
    def orphaned(self) -> list[EntryStatus]:
        return [e for e in self.entries if e.orphaned]

    @property
    def node_missing(self) -> list[EntryStatus]:
        """The every-node entries a live, tracked node recorded no run of (:mod:`.coverage`)."""
        return [e for e in self.entries if e.nodes_missing]

    @property
    def findings(self) -> list[str]:
        """Which of :data:`FINDINGS` there are: drift between live nodes, missed slots
        (the dead-man check or the reconciliation), orphans, beats that claim nothing,
        every-node entries a live node did not run, and with a reconciliation failed
        runs and duplicates."""
        found = set(self.reconciliation.findings) if self.reconciliation else set()
        if self.drift:
            found.add("drift")
        if self.behind:
            found.add("behind")
        if self.missed:
            found.add("missed")
        if self.orphaned:
            found.add("orphaned")
        if self.foreign_beats:
            found.add("foreign-beat")
        if self.node_missing:
            found.add("node-missing")
        if self.census is not None and self.census.colliding:
            found.add("shared")
        return [name for name in FINDINGS if name in found]

    @property
    def healthy(self) -> bool:
        return not self.findings

    def exit_code(self, fail_on: Collection[str] = FINDINGS) -> int:
        """1 when there is a finding of a kind in *fail_on*, else 0."""
        return 1 if set(self.findings) & set(fail_on) else 0

    def as_dict(self) -> dict[str, Any]:
        def when(value: datetime | None) -> str | None:
            return value.isoformat() if value else None

        out = {
            "now": when(self.now), "healthy": self.healthy, "findings": self.findings,
            "cluster": self.cluster,
            "tables": self.census.as_dict() if self.census is not None else None,
            "drift": self.drift,
            "entries": [{**e.__dict__, "last_occurrence": when(e.last_occurrence),
                         "next_due": when(e.next_due), "missed": when(e.missed),
                         "orphaned": [when(o) for o in e.orphaned],
                         "unpublished": [when(o) for o in e.unpublished],
                         "nodes_since": when(e.nodes_since),
                         "paused": e.paused.as_dict() if e.paused else None}
                        for e in self.entries],
            "pauses": [p.as_dict() for p in self.pauses],
            "invalid_entries": [{"job": i.job, "reason": i.reason, "source": i.source}
                                for i in self.invalid],
            "entries_version": self.entries_version, "behind": self.behind,
            "nodes": [{**n.__dict__, "last_seen": when(n.last_seen),
                       "started_at": when(n.started_at)} for n in self.nodes],
            "foreign_beats": (None if self.foreign_beats is None else
                              [s.as_dict() for s in self.foreign_beats]),
            "foreign_beats_since": when(self.foreign_since),
        }
        if self.foreign_error is not None:
            out["foreign_beats_error"] = self.foreign_error
        if self.reconciliation is not None:
            out["reconciliation"] = self.reconciliation.as_dict()
        return out


#: Slots per entry that ``status`` checks at most (the most recent ones).
MAX_SLOTS = 1000


def build_status(app: Any, settings: Settings, store: ClaimStore,
                 grace: timedelta = timedelta(seconds=60),
                 lookback: timedelta | None = None,
                 since: datetime | timedelta | None = None) -> Status:
    """The cluster's health; with *since* (a start time, or how far back from the
    database clock) also the reconciliation over ``[since, now]`` (see
    :mod:`.reconcile`), clipped to the claim retention, and missed slots looked for
    over that period unless *lookback* says otherwise."""
    entries, invalid = read_live_schedule(app, settings, store, checked=False)
    now, nodes = store.nodes()
    latest = store.latest_claims()
    timeout = timedelta(seconds=settings.node_timeout)
    live = [n for n in nodes if n.is_live(now, timeout)]
    node_rows = [NodeStatus(n.node, n in live, n.last_seen, n.started_at, n.version,
                            n.fingerprint, n.host, n.pid, n.cluster) for n in nodes]
    skips = _skips(nodes)
    statuses = [_entry_status(name, entry, now, latest.get(name), skips.get(name, {}),
                              settings)
                for name, entry in sorted(entries.items())]
    retention = timedelta(seconds=settings.claim_retention)
    start = None
    if since is not None:
        start = min(now, now - since if isinstance(since, timedelta) else as_utc(since))
    back = lookback or (min(now - start, retention) if start is not None else retention)
    _dead_man(statuses, entries, now, grace, now - back, nodes, store, settings)
    _unpublished(statuses, store, back, timedelta(seconds=settings.publish_timeout))
    report = Status(now, statuses, node_rows, _drift(live), pauses=store.pauses()[1],
                    invalid=invalid, cluster=store.cluster, table=settings.qualified_table,
                    census=store.census(timeout))
    if settings.db_entries:
        report.entries_version, report.behind = _behind(app, settings, store, live)
    held = pauses_in_force(report.pauses, entries)
    for status in statuses:
        status.paused = held.get(status.name)
    _foreign(report, store, start if start is not None else now - (lookback or FOREIGN_WINDOW))
    covered = every_node_coverage(
        entries, nodes, store, now=now, live_within=timeout, retention=retention,
        start=start if start is not None else (now - lookback if lookback else None))
    for status in statuses:
        if status.name in covered:
            status.cover(covered[status.name])
    if start is not None:
        report.reconciliation = reconcile(
            entries, store, now=now, start=max(start, now - retention), grace=grace,
            publish_timeout=timedelta(seconds=settings.publish_timeout),
            tolerance=settings.window_tolerance, nodes=nodes,
            clipped=start < now - retention)
    return report


def _foreign(report: Status, store: ClaimStore, since: datetime) -> None:
    """The foreign beats seen since *since* (database clock), or why they are unknown."""
    report.foreign_since = since
    try:
        _, rows = store.foreign_beats(within=max(timedelta(0), report.now - since))
    except StoreError as exc:
        report.foreign_beats, report.foreign_error = None, " ".join(str(exc).split())
        return
    report.foreign_beats = foreign_senders(rows)


def _behind(app: Any, settings: Settings, store: ClaimStore,
            live: list[NodeState]) -> tuple[int, dict[str, int | None]]:
    """The database entries' version, and the live nodes behind it: the first change
    a node does not hold was written longer ago than a node takes to hear of it (a poll
    interval, and the heartbeat that reports it), before the node's last heartbeat."""
    cluster = live_cluster(settings, app)
    version = store.entries_version(cluster)
    hear = timedelta(seconds=settings.db_entries_poll + settings.heartbeat_interval + 1)
    behind: dict[str, int | None] = {}
    for node in live:
        held = node.entries_version
        if held is not None and held >= version:
            continue
        missing = store.entry_changes(cluster, held or 0, limit=1).revisions
        if missing and node.last_seen is not None and missing[0].at < node.last_seen - hear:
            behind[node.node] = held
    return version, behind


def _unpublished(statuses: list[EntryStatus], store: ClaimStore, back: timedelta,
                 timeout: timedelta) -> None:
    """Each entry's claims not published yet: orphaned once older than *timeout*."""
    db_now, rows = store.unpublished(back, limit=MAX_SLOTS * 10)
    by_name = {status.name: status for status in statuses}
    for row in rows:
        status = by_name.get(row.job)
        if status is not None:
            (status.orphaned if row.orphaned(db_now, timeout)
             else status.unpublished).append(row.occurrence)


def _skips(nodes: list[NodeState]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for node in nodes:
        for (job, outcome, reason), count in node.counts.items():
            if outcome == "skipped":
                per = out.setdefault(job, {})
                per[reason] = per.get(reason, 0) + count
    return out


def _entry_status(name: str, entry: ScheduleEntry, now: datetime, claim: ClaimRow | None,
                  skips: Mapping[str, int], settings: Settings) -> EntryStatus:
    placement = entry_placement(name, entry.options).value
    try:
        catch_up = entry_catch_up(name, entry.options, settings.catch_up_policy).describe()
        delivery = entry_delivery(name, entry.options, settings.default_delivery).value
    except ConfigurationError as exc:
        catch_up = delivery = f"invalid: {exc}"
    return EntryStatus(
        name=name, task=entry.task, schedule=schedule_text(entry.schedule),
        placement=placement,
        last_occurrence=claim.occurrence if claim else None,
        winner=claim.node if claim else None, task_id=claim.task_id if claim else None,
        next_due=_next_due(entry, now, claim), skips=dict(skips),
        catch_up=catch_up if placement == Placement.CLUSTER.value else "-",
        delivery=delivery if placement == Placement.CLUSTER.value else "-")


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
              grace: timedelta, horizon: datetime, nodes: list[NodeState], store: ClaimStore,
              settings: Settings) -> None:
    """Mark the cluster entries that missed slots since they were first known."""
    due_by = now - grace
    started = first_run_by_nodes(nodes)
    slots: dict[str, list[datetime]] = {}
    shared: dict[str, list[datetime]] = {}  # entries with one schedule share its slots
    intervals: list[EntryStatus] = []
    for status in statuses:
        entry = entries[status.name]
        if status.placement != Placement.CLUSTER.value:
            continue
        if isinstance(entry.schedule, interval_schedule):
            intervals.append(status)
            continue
        key = (describe_schedule(entry.schedule)
               if isinstance(entry.schedule, (crontab, cron, solar)) else None)
        recent = shared.get(key) if key else None
        if recent is None:
            recent = recent_slots(status.name, entry.schedule, due_by, horizon, MAX_SLOTS)
            if key:
                shared[key] = recent
        if recent:
            slots[status.name] = recent
    ledger = store.job_ledger({job: (found[-1], found[0]) for job, found in slots.items()})
    for status in statuses:
        if status.name not in slots:
            continue
        known = _since(entries[status.name],
                       known_since(ledger[status.name].first, started.get(status.name)))
        if known is None:
            continue  # never claimed and no node ran it yet: a new entry, not a miss
        delay = slot_delay(entries[status.name])  # a jittered slot is due later
        missed = [slot for slot in slots[status.name]
                  if slot >= known and slot not in ledger[status.name].claimed
                  and slot + delay(slot) <= due_by]
        if missed:
            status.missed, status.missed_count = missed[0], len(missed)
    if intervals:
        firsts = store.job_ledger({s.name: (now, now) for s in intervals})
        for status in intervals:
            every = entries[status.name].schedule.run_every
            limit = due_by - every
            known = _since(entries[status.name],
                           known_since(firsts[status.name].first, started.get(status.name)))
            last = status.last_occurrence
            if known is not None and limit >= max(known, horizon) and (
                    last is None or last < limit):
                status.missed, status.missed_count = limit, 1


def _since(entry: ScheduleEntry, known: datetime | None) -> datetime | None:
    """When *entry*'s occurrences are expected from: for a database entry, not before
    the effective time of the revision that governs it (older slots were another
    revision's)."""
    if known is None or not isinstance(entry, LiveEntry) or entry.effective_at is None:
        return known
    return max(known, entry.effective_at)


def _drift(live: list[NodeState]) -> dict[str, list[str]]:
    """Per node, the entries that differ from the most common schedule among live nodes."""
    if len({n.fingerprint for n in live}) <= 1:
        return {}
    counts: dict[str, int] = {}
    for n in live:
        counts[n.fingerprint] = counts.get(n.fingerprint, 0) + 1
    majority = max(counts, key=lambda fp: (counts[fp], fp))
    return drift_from(next(n for n in live if n.fingerprint == majority), live)


def local_fingerprint(app: Any) -> str:
    """The fingerprint this app's schedule would have on a beat node."""
    return fingerprint(entry_digests(schedule_entries(app)))


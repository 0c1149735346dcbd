"""Every-node accountability: which live beat nodes ran each every-node entry (#35).

An every-node entry is never claimed: each node's beat sends it to its node queue,
and the workers of that node (``install_worker``) record each run on a row of its
own (kind ``node``, naming the beat node). When a node's worker is down its beat
keeps sending and the messages expire unexecuted; the ledger then has no run of that
node. Here the expected nodes (the heartbeats) are held against the recorded runs.

For each every-node entry, over a window (``status --since``; else ``--lookback``;
else the entry's last :data:`PERIODS` periods), clipped to the claim retention:

* ``ran``: node -> runs recorded in the window (any node, live or not);
* ``missing``: the live beat nodes that run the entry, are *tracked*, have been live
  for at least :data:`PERIODS` periods of the entry within the window, and have no run
  of it recorded in the window;
* ``not_tracked``: live nodes whose workers recorded no every-node run within the
  claim retention (no ``install_worker``, or never started): never missing, as
  nothing would ever record their runs.

A node is *tracked* once a worker of it recorded a run of any every-node entry of the
schedule within the claim retention. A period (:func:`coverage_mark`) is the interval
of an interval entry; for a slotted one (crontab, solar, cron), the gaps between its
consecutive slots: "live for two periods" means live since the slot two before the
latest (so a weekday cron on a Monday reaches back to Thursday). A node is live as
``status`` says (seen within ``elarion_beat_node_timeout``); how long it has been
live is its row's ``started_at`` (its beat's start). A schedule with no period to
tell (a custom one) is never judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery.beat import ScheduleEntry

from ..config.live_entries import LiveEntry
from ..config.placement import Placement, entry_placement
from ..config.settings import Settings
from ..exceptions import ConfigurationError
from ..live_schedules.listing import read_live_schedule
from ..schedules.slots import is_slotted, recent_slots
from ..store.interface import ClaimStore, Runs
from ..store.records import NodeState

__all__ = ["PERIODS", "NodeCoverage", "coverage_mark", "every_node_coverage", "read_coverage"]

#: How many periods of an entry a node must have been live for to be judged (and the
#: default window: the entry's last this many periods).
PERIODS = 2


@dataclass
class NodeCoverage:
    """Which nodes ran one every-node entry over a window (see the module)."""

    job: str
    #: the window's start (database clock): runs are counted from here to now
    since: datetime
    #: node -> runs recorded in the window
    ran: dict[str, int] = field(default_factory=dict)
    #: live, tracked nodes, live for PERIODS periods in the window, with no run in it
    missing: list[str] = field(default_factory=list)
    #: live nodes whose workers recorded no every-node run within the claim retention
    not_tracked: list[str] = field(default_factory=list)
    #: live, tracked nodes not judged yet: not live for PERIODS periods in the window
    too_new: list[str] = field(default_factory=list)
    #: live nodes that ran it in the window
    covered: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "since": self.since.isoformat(), "nodes_ran": dict(self.ran),
                "nodes_missing": list(self.missing), "nodes_not_tracked": list(self.not_tracked),
                "nodes_too_new": list(self.too_new)}


def coverage_mark(job: str, schedule: Any, now: datetime, horizon: datetime) -> datetime | None:
    """Since when a node must have been live to have run *schedule* at least once by
    *now*, with a period to spare: :data:`PERIODS` intervals back, or the slot
    :data:`PERIODS` before the latest (not before *horizon*). None: no period to tell."""
    if is_slotted(schedule):
        slots = recent_slots(job, schedule, now, horizon, PERIODS + 1)
        return slots[PERIODS] if len(slots) > PERIODS else None
    every = getattr(schedule, "run_every", None)
    if isinstance(every, timedelta) and every > timedelta(0):
        mark = now - PERIODS * every
        return mark if mark >= horizon else None
    return None


def every_node_jobs(entries: Mapping[str, ScheduleEntry]) -> dict[str, ScheduleEntry]:
    """The every-node entries of *entries* (an entry whose placement is invalid is none)."""
    out = {}
    for name, entry in entries.items():
        try:
            placement = entry_placement(name, entry.options)
        except ConfigurationError:
            continue
        if placement is Placement.EVERY_NODE:
            out[name] = entry
    return out


def every_node_coverage(entries: Mapping[str, ScheduleEntry], nodes: Sequence[NodeState],
                        store: Runs, *, now: datetime, live_within: timedelta,
                        retention: timedelta, start: datetime | None = None
                        ) -> dict[str, NodeCoverage]:
    """Per every-node entry of *entries*, which nodes ran it since *start* (None: its
    last :data:`PERIODS` periods), on the store clock *now* (see the module)."""
    jobs = every_node_jobs(entries)
    if not jobs:
        return {}
    horizon = now - retention
    marks = {name: coverage_mark(name, entry.schedule, now, horizon)
             for name, entry in jobs.items()}
    windows = {name: max(horizon, start if start is not None else (marks[name] or now))
               for name in jobs}
    found = store.node_runs(windows, tracked_since=horizon)
    tracked = found.tracked
    live = [n for n in nodes if n.is_live(now, live_within)]
    out = {}
    for name, entry in sorted(jobs.items()):
        report = out[name] = NodeCoverage(name, windows[name], ran={
            node: count for (job, node), count in sorted(found.runs.items())
            if job == name and count})
        mark = marks[name]
        for node in live:
            if not _runs_entry(node, name, entry):
                continue
            if node.node not in tracked:
                report.not_tracked.append(node.node)
            elif node.node in report.ran:
                report.covered.append(node.node)
            elif (mark is None or windows[name] > mark or node.started_at is None
                  or node.started_at > mark):
                report.too_new.append(node.node)
            else:
                report.missing.append(node.node)
    return out


def _runs_entry(node: NodeState, name: str, entry: ScheduleEntry) -> bool:
    """Whether *node* runs the entry *name*: its heartbeat lists the code entries it
    runs (a database entry is every node's that reads the database entries)."""
    if isinstance(entry, LiveEntry) or not node.entries:
        return True
    return name in node.entries


def read_coverage(app: Any, settings: Settings, store: ClaimStore,
                  start: datetime | None = None) -> tuple[datetime, dict[str, NodeCoverage]]:
    """The app's every-node entries (its ``beat_schedule`` and database entries) and
    their coverage now, on the store clock: what the metric and Flower's card show."""
    entries, _ = read_live_schedule(app, settings, store, checked=False)
    now, nodes = store.nodes()
    return now, every_node_coverage(
        entries, nodes, store, now=now, live_within=timedelta(seconds=settings.node_timeout),
        retention=timedelta(seconds=settings.claim_retention), start=start)

"""Orphans: won claims whose message never reached the broker.

A claim is ``pending`` from its claim until its winner reports the publish
(``published`` or ``failed``). One still unpublished ``elarion_beat_publish_timeout``
after it was claimed is an **orphan**: its winner died between claim and publish,
or the broker refused the message. Every node looks for orphans after each of its
heartbeats (one indexed query), so an orphan is handled within
``publish_timeout + heartbeat_interval``:

* ``delivery: at_least_once`` (an entry this node has, the occurrence within the
  entry's catch-up window): the node takes the orphan over, one node of all that
  try (:meth:`~..store.interface.ClaimStore.take_over`), and the scheduler publishes it
  with the original task id;
* otherwise the orphan is reported, once per cluster: the one node whose UPDATE
  marks it reported in the claims table
  (:meth:`~..store.interface.ClaimStore.mark_orphans_reported`, ``orphan_reported_at``)
  logs a WARNING and sends an ``elarion-orphaned`` event; the other nodes, and this
  one after a restart, read the mark and stay quiet (``status`` lists orphans too).
  A takeover makes a claim of its own: orphaned in turn, it is reported again. A
  beat role without ``UPDATE`` of ``orphan_reported_at`` (grants of before this
  column) cannot mark: that node says so once, then reports each orphan once per start
  of its own, as before.

The takeovers come first: a failing report never holds them up.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from celery.beat import ScheduleEntry

from ..config.catch_up import entry_catch_up
from ..config.delivery import Delivery, entry_delivery
from ..config.parsers import format_duration
from ..config.placement import Placement, entry_placement
from ..config.settings import Settings
from ..exceptions import ConfigurationError, StoreRefused
from ..observe.events import ORPHANED, EventSender
from ..schedules.slots import iso
from ..store.interface import ClaimStore
from ..store.records import ClaimRow, Takeover
from .watched_schedule import ScheduleMemo

__all__ = ["OrphanWatch", "orphan_fields"]

logger = logging.getLogger(__name__)

#: Orphans a node that cannot mark them remembers having reported (each once per start).
_REMEMBERED = 10_000
#: Unpublished claims read per look.
_LIMIT = 1000


def orphan_fields(row: ClaimRow, now: datetime, node: str, delivery: Delivery | None,
                  action: str) -> dict[str, object]:
    """The fields of an ``elarion-orphaned`` event (and of its log line's ``extra``)."""
    return {"job": row.job, "occurrence": iso(row.occurrence), "node": node,
            "holder": row.node, "task_id": row.task_id, "claim": row.kind,
            "state": row.state, "publish_error": row.publish_error,
            "age": round((now - row.claimed_at).total_seconds(), 3),
            "takeovers": row.takeovers, "delivery": delivery.value if delivery else None,
            "action": action}


class OrphanWatch:
    """One node's periodic look for orphaned claims."""

    def __init__(self, settings: Settings, store: ClaimStore,
                 events: EventSender | None = None) -> None:
        self.settings = settings
        self.store = store
        self.events = events
        self.timeout = timedelta(seconds=settings.publish_timeout)
        #: the store refused to mark orphans reported (the role's grants): this node
        #: reports each orphan once per start, remembering them here
        self.unmarked = False
        self._reported: OrderedDict[tuple[str, datetime, int], None] = OrderedDict()
        #: how far back to look: the longest catch-up window of the schedule's entries
        self._horizon: ScheduleMemo[float] = ScheduleMemo(lambda entries: max(
            [self.settings.catch_up_window]
            + [self._window(name, e) for name, e in entries.items()]))

    def check(self, entries: Mapping[str, ScheduleEntry]) -> list[Takeover]:
        """Look for orphans: report the ones to report, take over the ones to take
        over (returned, for the scheduler to publish). Raises the store's errors."""
        horizon = self._horizon.get(entries)  # worked out again after an edit
        db_now, rows = self.store.unpublished(timedelta(seconds=horizon) + self.timeout,
                                              limit=_LIMIT)
        orphans = [row for row in rows if row.orphaned(db_now, self.timeout)]
        takeable = []
        reportable: dict[tuple[str, datetime], Delivery | None] = {}
        for row in orphans:
            delivery, window = self._policy(row.job, entries.get(row.job))
            if delivery is Delivery.AT_LEAST_ONCE and window is not None \
                    and row.occurrence >= db_now - window:
                takeable.append(row)
            elif not row.orphan_reported:  # else the cluster reported it already
                reportable[(row.job, row.occurrence)] = delivery
        taken = self.store.take_over(self.settings.node, takeable, self.timeout) \
            if takeable else []
        for takeover in taken:
            row = takeover.row
            logger.warning(
                "beat: taking over the orphaned claim of %s at %s: claimed by %s, not "
                "published within elarion_beat_publish_timeout (%s)%s; publishing it with "
                "its task id %s (delivery at_least_once, takeover %d)", row.job,
                iso(row.occurrence), takeover.previous, format_duration(self.timeout),
                f", last error: {row.publish_error}" if row.publish_error else "",
                row.task_id, row.takeovers,
                extra={"action": "orphan-taken-over", "job": row.job, "node": self.settings.node,
                       "holder": takeover.previous, "task_id": row.task_id,
                       "occurrence": iso(row.occurrence)})
            if self.events is not None:
                fields = orphan_fields(row, db_now, self.settings.node,
                                       Delivery.AT_LEAST_ONCE, "taken-over")
                self.events.send(ORPHANED, **{**fields, "holder": takeover.previous})
        if reportable:
            for row in self._mark([row for row in orphans
                                   if (row.job, row.occurrence) in reportable]):
                self._report(row, db_now, reportable[(row.job, row.occurrence)])
        return taken

    def _mark(self, rows: Sequence[ClaimRow]) -> list[ClaimRow]:
        """The orphans of *rows* this node reports: the ones it marked reported for the
        cluster; without the right to mark, the ones it has not reported since its start."""
        if not self.unmarked:
            try:
                return self.store.mark_orphans_reported(rows)
            except StoreRefused as exc:
                self.unmarked = True
                logger.warning(
                    "beat: cannot mark orphaned claims reported in the claims database "
                    "(%s): this node reports each one once per start, and so does every "
                    "node without the right; grant the beat role UPDATE (orphan_reported_at) "
                    "on %s (docs/howto/database-role.md)", exc,
                    self.settings.qualified_table, extra={"action": "orphans-unmarked"})
        fresh = []
        for row in rows:
            key = (row.job, row.occurrence, row.takeovers)
            if key not in self._reported:
                self._reported[key] = None
                fresh.append(row)
        while len(self._reported) > _REMEMBERED:
            self._reported.popitem(last=False)
        return fresh

    def _policy(self, job: str, entry: ScheduleEntry | None
                ) -> tuple[Delivery | None, timedelta | None]:
        """The delivery of *job* on this node and its catch-up window; (None, None) for
        a job this node does not have (or cannot read)."""
        if entry is None:
            return None, None
        try:
            if entry_placement(job, entry.options) is not Placement.CLUSTER:
                return None, None
            delivery = entry_delivery(job, entry.options, self.settings.default_delivery)
            window = entry_catch_up(job, entry.options, self.settings.catch_up_policy).window
        except ConfigurationError:
            return None, None
        return delivery, window

    def _window(self, name: str, entry: ScheduleEntry) -> float:
        _, window = self._policy(name, entry)
        return window.total_seconds() if window is not None else 0.0

    def _report(self, row: ClaimRow, now: datetime, delivery: Delivery | None) -> None:
        """The WARNING and the event of an orphan this node marked reported."""
        why = (f"the broker refused it: {row.publish_error}" if row.publish_error
               else "its node may have died between claim and publish")
        what = ("it is not sent again (delivery at_most_once)"
                if delivery is not Delivery.AT_LEAST_ONCE
                else "too old to take over (beyond its catch_up_window)")
        logger.warning("beat: orphaned claim: %s at %s was claimed by %s %s ago and never "
                       "published (%s); %s", row.job, iso(row.occurrence), row.node,
                       format_duration(now - row.claimed_at, 1), why, what,
                       extra={"action": "orphaned", "job": row.job, "node": self.settings.node,
                              "holder": row.node, "task_id": row.task_id,
                              "occurrence": iso(row.occurrence)})
        if self.events is not None:
            self.events.send(ORPHANED, **orphan_fields(row, now, self.settings.node, delivery,
                                                       "reported"))

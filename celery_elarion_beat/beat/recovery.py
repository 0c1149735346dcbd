"""Recovery: what one node does so that no slot has to be lost.

The scheduler's tick calls into one :class:`Recovery`:

* **resume** from the ledger: interval entries count from their newest claim, read
  as beat starts, before its first tick decides anything (a window that comes due
  as the node starts runs at its time); missed exact slots are queued 2 s after
  start (so the slots other nodes were claiming as this one started have landed);
  both again after each claims-database outage (:mod:`.resume`, :mod:`.catch_up`);
* **replays**: this tick's share of the queued missed slots;
* **re-anchoring**: an interval entry that lost its window follows the winner;
* **publish marks**: when the marks of the last chunk cannot wait for the next
  claim to carry them, they are written now;
* **sleep**: how long beat may sleep with all that pending.

Orphans are watched by :mod:`.orphans`; the scheduler publishes what it takes over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from datetime import datetime, timedelta

from celery.beat import ScheduleEntry
from celery.schedules import schedule as interval_schedule

from ..config.catch_up import MAX_MISSED
from ..config.live_entries import outside_revision
from ..config.overlap import OverlapRule
from ..config.settings import Settings
from ..exceptions import StoreError
from ..schedules.clock import Clock
from ..store.interface import ClaimStore
from .catch_up import CatchUpQueue
from .plan import Plan, replay_plan
from .resume import interval_anchors, last_runs, resume_from_ledger
from .signals import deferred_signals

__all__ = ["IN_FLIGHT", "Recovery"]

logger = logging.getLogger(__name__)

#: How long after start beat reads the ledger to resume.
IN_FLIGHT = timedelta(seconds=2)


class Recovery:
    """Missed slots, interval anchors and publish marks of one beat node."""

    def __init__(self, settings: Settings, store: Callable[[], ClaimStore | None],
                 clock: Clock, schedule: Callable[[], MutableMapping[str, ScheduleEntry]],
                 skew: Callable[[], float],
                 overlap: Callable[[ScheduleEntry], OverlapRule | None] = lambda entry: None,
                 ) -> None:
        self.settings = settings
        self._overlap = overlap
        self._store = store
        self._clock = clock
        self._schedule = schedule
        self._skew = skew
        self.queue = CatchUpQueue()
        #: the ledger is to be read: at start, and after each outage
        self.due = True
        self._at: datetime | None = None  # not before (the scheduler's clock)
        self._failed = False
        #: each entry's start on this node, until the ledger was read once
        self._started: dict[str, datetime] = {}
        #: exact slots skipped while the database was down, per job
        self._skipped: dict[str, set[datetime]] = {}
        self._waiting: list[tuple[str, datetime]] = []
        self._rescheduled: dict[str, float] = {}
        self._marks_since: float | None = None
        #: the last claim failed: the marks wait for one that succeeds (writing them
        #: now would make a tick wait for the failing database a second time)
        self._claims_failing = False

    # -- resume ----------------------------------------------------------------

    def start(self) -> None:
        """Beat has set its schedule up: each entry's normal runs begin now. The interval
        entries are anchored on the ledger now, before the first tick; the whole ledger
        is read in :data:`IN_FLIGHT`."""
        schedule = self._schedule()
        self._started = last_runs(schedule)
        now = self._clock()
        self._at = now + IN_FLIGHT
        store = self._store()
        if store is None or self.settings.interval_anchor != "cluster":
            return
        try:
            with deferred_signals():
                anchors = interval_anchors(store, self.settings, schedule, now)
        except Exception as exc:  # read again with the rest, in IN_FLIGHT
            logger.debug("beat: the interval anchors were not read at start: %s", exc)
            return
        self._anchor(anchors)

    def _anchor(self, anchors: Mapping[str, datetime]) -> None:
        """Count each interval entry of *anchors* from its anchor (ledger clock)."""
        schedule = self._schedule()
        skew = timedelta(seconds=self._skew())
        for name, anchor in anchors.items():
            entry = schedule.get(name)
            if entry is not None:
                entry.last_run_at = anchor + skew

    def resume(self) -> bool:
        """Read where each entry stands in the ledger, if it is time: anchor interval
        entries on their newest claim, queue the missed slots. True when the entries'
        next runs changed (beat must rebuild its heap). A store error is retried a
        heartbeat interval later, or as soon as a claim succeeds."""
        now = self._clock()
        if not self.due or (self._at is not None and now < self._at):
            return False
        store = self._store()
        if store is None:
            return False
        schedule = self._schedule()
        try:
            with deferred_signals():
                resumed = resume_from_ledger(store, self.settings, schedule, now,
                                             self._started, self._skipped)
        except Exception as exc:
            logger.warning("beat: could not read the ledger to resume the schedule (missed "
                           "slots, interval anchors); retrying: %s", exc,
                           exc_info=not isinstance(exc, StoreError))
            self._failed = True
            self._at = now + timedelta(seconds=self.settings.heartbeat_interval)
            return False
        self.due = self._failed = False
        self._started = {}  # read once: later resumes follow an outage
        self._skipped.clear()
        self._anchor(resumed.anchors)
        for missed in resumed.missed:
            self.queue.add(missed.job, missed.replay)
            self._waiting.extend((missed.job, slot) for slot in missed.waiting)
        return bool(resumed.anchors)

    def waiting(self) -> list[Plan]:
        """The unclaimed slots the last ledger read found still within their jitter
        (once): not replays, but slots to claim at slot + offset like any other."""
        schedule = self._schedule()
        found, self._waiting = self._waiting, []
        plans = [replay_plan(schedule[job], slot, self._overlap(schedule[job]))
                 for job, slot in found if job in schedule]
        for plan in plans:
            plan.catch_up = False
        return plans

    def late(self, job: str, slots: Sequence[datetime]) -> None:
        """Slots of *job* due already when this node put its entry in place (a database
        entry this node heard of after its effective time): claimed as any slot, at the
        next tick, never as replays."""
        self._waiting.extend((job, slot) for slot in slots)

    def claims_failed(self, plans: Sequence[Plan]) -> None:
        """The database refused these claims: their exact slots may be missed later."""
        self._claims_failing = True
        for plan in plans:
            slot = plan.occurrence.slot if plan.occurrence is not None else None
            if slot is not None:
                skipped = self._skipped.setdefault(plan.entry.name, set())
                if len(skipped) < MAX_MISSED:
                    skipped.add(slot)

    def claims_answered(self, after_outage: bool) -> None:
        """A claim succeeded: after an outage (or a failed read) read the ledger now."""
        self._claims_failing = False
        if after_outage or self._failed:
            self.due, self._at = True, None

    # -- replays and anchors ---------------------------------------------------------

    def replays(self) -> list[Plan]:
        """This tick's share of the queued missed slots (``elarion_beat_catch_up_per_tick``)."""
        if not self.queue:
            return []
        schedule = self._schedule()
        taken = self.queue.take(self.settings.catch_up_per_tick, lambda job: job in schedule)
        # a database entry replays only slots its revision governs: never from before
        # its effective time (an edit or an enable fires no overdue run)
        return [replay_plan(schedule[job], slot, self._overlap(schedule[job]))
                for job, slot in taken
                if not outside_revision(schedule[job], slot, False, slot)]

    def reanchor(self, entry: ScheduleEntry, held: datetime | None) -> None:
        """An interval entry lost its window to a claim made at *held* (database
        clock): count its next run from there, as the node that won does."""
        if (held is None or self.settings.interval_anchor != "cluster"
                or not isinstance(entry.schedule, interval_schedule)):
            return
        current = self._schedule().get(entry.name)
        if current is None:
            return
        anchor = held + timedelta(seconds=self._skew())
        current.last_run_at = anchor
        wait = (anchor + entry.schedule.run_every - self._clock()).total_seconds()
        # never sooner than the tolerance: a skewed clock must not spin on a lost window
        self._rescheduled[entry.name] = max(wait, self.settings.window_tolerance)

    def rescheduled(self) -> dict[str, float]:
        """The entries re-anchored since the last call: seconds until their next run."""
        out, self._rescheduled = self._rescheduled, {}
        return out

    # -- publish marks -----------------------------------------------------------------

    def marks_deferred(self) -> None:
        """Publish marks wait for the next claim to carry them."""
        if self._marks_since is None:
            self._marks_since = time.monotonic()

    def flush_marks(self) -> None:
        """Write the deferred publish marks now (one statement)."""
        self._marks_since = None
        store = self._store()
        if store is None or not store.deferred_reports:
            return
        try:
            with deferred_signals():
                store.flush_reports()
        except Exception as exc:
            logger.warning("beat: could not mark %d claims published yet (they ride along "
                           "with the next claim): %s", store.deferred_reports, exc)
            self._marks_since = time.monotonic()

    def sleep(self, seconds: float) -> float:
        """How long beat may sleep: *seconds*, but at most 1 s while missed slots
        wait, and no longer than until the ledger is to be read; publish marks that
        would wait too long for a ride (``publish_timeout / 4``) are written now."""
        if self.queue:
            seconds = min(seconds, 1.0)
        if self.due and self._at is not None:
            seconds = min(seconds, max((self._at - self._clock()).total_seconds(), 0.05))
        if self._marks_since is not None and not self._claims_failing:
            budget = self.settings.publish_timeout / 4
            if seconds >= budget or time.monotonic() - self._marks_since >= budget:
                self.flush_marks()  # no claim soon enough to carry them
        return seconds


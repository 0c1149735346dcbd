"""ClaimingScheduler: Celery beat that claims each occurrence before sending it.

Celery glue only; no SQL and no claim logic here. Each tick takes every due entry
in one pass, reserves it (its chain moves on) and hands the batch to the claim
pipeline (:mod:`.pipeline`: plan, claim, publish, skip, record). Around the ticks
it drives what keeps a node honest: heartbeats and the purge (:mod:`.maintenance`),
the ledger read at start and when the claims database comes back (:mod:`.recovery`:
intervals count from their newest claim, missed slots are queued for replay),
orphaned claims (:mod:`.orphans`), durable one-offs
(:mod:`celery_elarion_beat.one_offs.runner`) and, with ``elarion_beat_db_entries``,
the database entries (:mod:`.live_entries`: each change put in place at its
effective time, the heap edited rather than rebuilt).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import crontab
from celery.schedules import schedule as interval_schedule
from celery.utils.time import humanize_seconds
from kombu.entity import Queue
from kombu.utils.objects import cached_property

from ..config.dsn import backend_for
from ..config.entries import build_entries, check_entry
from ..config.live_entries import LiveEntry, live_cluster, outside_revision
from ..config.node_queue import node_queue
from ..exceptions import (
    SchemaMissing,
    StoreError,
    StoreRefused,
)
from ..observe.events import EventSender
from ..observe.logformat import install_json_logging
from ..observe.outcome import Recorder
from ..one_offs.runner import OneOffRunner
from ..schedules.clock import Clock, ClusterClock, utcnow
from ..schedules.slots import ClaimKind, crontab_due, crontab_last_run, name_occurrence
from ..store.clusters import ClusterCensus
from ..store.interface import ClaimStore
from ..store.registry import open_store
from .clock_fence import ClockFence
from .clusters import report_clusters
from .fail_closed import Outage
from .heap_event import PRIORITY, HeapEvent
from .jitter_queue import JitterQueue
from .live_entries import LiveFollower
from .maintenance import Maintenance
from .orphans import OrphanWatch
from .pipeline import ClaimPipeline
from .plan import Plan, replay_plan
from .recovery import Recovery
from .signals import deferred_signals
from .startup import (
    built_by_beat,
    exit_code,
    read_settings,
    refuse_to_start,
)
from .tick_errors import RETRY, TickFailures
from .watched_schedule import WatchedSchedule

__all__ = ["ClaimingScheduler"]

logger = logging.getLogger(__name__)

#: A clock offset (s) too small to correct Celery's schedules for (see _now_fun).
_NEGLIGIBLE = 0.001


class ClaimingScheduler(Scheduler):
    """A beat scheduler that every node of a cluster can run at once.

    ``celery -A proj beat -S celery_elarion_beat.ClaimingScheduler`` (or ``-S elarion``).
    """

    #: The claim pipeline's class (a test hook may subclass it).
    Pipeline: type[ClaimPipeline] = ClaimPipeline

    _heap: Any
    data: Any
    max_interval: float

    def __init__(self, app: Any, *args: Any, store: ClaimStore | None = None,
                 clock: Clock | None = None, **kwargs: Any) -> None:
        #: built by `celery beat`: a refusal to start exits (:mod:`.startup`)
        self._by_beat = built_by_beat(kwargs)
        self.settings, self._refusal = read_settings(app, self._by_beat,
                                                     bool(kwargs.get("lazy")))
        #: the cluster's clock: this node's, corrected to the database's (:mod:`.clock_fence`),
        #: unless ``elarion_beat_clock = "node"``
        self._clock: Clock = clock or (utcnow if self.settings.clock == "node"
                                       else ClusterClock())
        self._store = store
        self.events: EventSender | None = None
        self.maintenance: Maintenance | None = None
        self.orphans: OrphanWatch | None = None
        self.one_offs: OneOffRunner | None = None  # schedule_once's rows
        #: where the tables stood for this cluster at start (:mod:`.clusters`)
        self.census: ClusterCensus | None = None
        self.live: LiveFollower | None = None  # the database entries (live schedules)
        self.recovery = Recovery(self.settings, lambda: self._store, self._clock,
                                 lambda: self.schedule, self._skew,
                                 lambda entry: self.pipeline.rules.overlap(entry))
        self.fence = ClockFence(self.settings, self._clock, lambda: self.store,
                                failing=lambda: self.outage.since is not None)
        self.pipeline = self.Pipeline(
            app, self.settings, lambda: self.store, self._clock, self.recovery,
            fence=self.fence,
            node_queue=lambda: self.node_queue,
            live_nodes=lambda: self.maintenance.live_nodes if self.maintenance else [],
            max_interval=lambda: self.max_interval)
        self._heartbeats_seen = 0
        self._tick_started = time.monotonic()
        self._heap_of: tuple[Any, int] | None = None  # (schedule, layout) the heap holds
        self._heap_dropped = 0  # events of entries swapped out, still on the heap
        self.tick_failures = TickFailures()  # ticks that raised (:mod:`.tick_errors`)
        self._now_funs: tuple[float, Callable[[], datetime]] | None = None  # _now_fun's
        super().__init__(app, *args, **kwargs)
        # wake at least once per heartbeat, however far away the next entry is
        self.max_interval = min(self.max_interval, self.settings.heartbeat_interval)

    @property
    def recorder(self) -> Recorder:
        """Every outcome of this node (:class:`~..observe.outcome.Recorder`)."""
        return self.pipeline.recorder

    @property
    def outage(self) -> Outage:
        """The claims database's outages as this node sees them (:mod:`.fail_closed`)."""
        return self.pipeline.outage

    @property
    def jittered(self) -> JitterQueue:
        """Slots held back for their jitter (:mod:`.jitter_queue`)."""
        return self.pipeline.jittered

    # -- setup ---------------------------------------------------------------

    def setup_schedule(self) -> None:
        try:
            self._setup()
        except Exception as exc:
            if not self._by_beat:
                raise
            if self._store is not None:
                self._store.close()
            refuse_to_start(exc, exit_code(exc))

    def _setup(self) -> None:
        if self.settings.log_format == "json":
            install_json_logging()  # beat has set up its logging by now
        super().setup_schedule()
        for name, entry in self.schedule.items():
            check_entry(name, entry, self.settings)
        with deferred_signals():  # the first database round trip (a bad entry needs none)
            self.fence.measure()
        self._on_cluster_time()  # the entries start on the cluster's time
        logger.info("beat: claiming occurrences in %s as node %s of cluster %s",
                    self.store.describe(), self.settings.node, self.store.cluster,
                    extra={"action": "started", "node": self.settings.node,
                           "cluster": self.store.cluster})
        scope = backend_for(self.settings.dsn).scope if self.settings.dsn else None
        if scope:
            logger.warning(scope, extra={"action": "store-scope"})
        try:
            with deferred_signals():
                self.store.ensure_schema()
        except StoreError as exc:
            if isinstance(exc, SchemaMissing) or (isinstance(exc, StoreRefused)
                                                  and self.settings.startup_errors == "refuse"):
                self.store.close()
                raise
            self.outage.failed(exc)  # fail closed; every claim retries the schema
        else:
            with deferred_signals():
                self.census = report_clusters(self.settings, self.store)
        if self.settings.db_entries:
            self.live = LiveFollower(self.app, self.settings, lambda: self.store, self._clock,
                                     live_cluster(self.settings, self.app),
                                     late=self.recovery.late)
            with deferred_signals():
                self.live.start(self.schedule, self._clock())
            self.pipeline.redecide = self._redecide
        if self.settings.events:
            self.events = EventSender(self.app, self.settings.node,
                                      batch=self.settings.event_batch,
                                      cluster=self.store.cluster)
            self.recorder.listeners.append(self.events.on_record)
            self.pipeline.events = self.events
        self.maintenance = Maintenance(
            self.settings, self.store, self.recorder, self._clock,
            # the drift check compares the code entries; the database entries' version
            # is compared on its own (a node behind, not a deploy)
            self._code_entries, events=self.events,
            entries_version=lambda: self.live.version if self.live is not None else None)
        self.orphans = OrphanWatch(self.settings, self.store, events=self.events)
        self.one_offs = OneOffRunner(self.app, self.settings, lambda: self.store, self._clock,
                                     self._skew, events=self.events, guard=deferred_signals)
        self.one_offs.run(store_failed=self.outage.since is not None)  # due while beat was down
        self._maintain()
        # read the ledger a moment after start: the slots other nodes were claiming
        # as this one started have landed by then (else nodes that start on both
        # sides of a slot could each replay a different "latest" one)
        self.recovery.start()
        self._watch_orphans()

    def _on_cluster_time(self) -> None:
        """Move the entries' last runs, which Celery took from this node's own clock as it
        built them, to the cluster's (the database's) clock."""
        offset = self._clock.offset if isinstance(self._clock, ClusterClock) else None
        if offset is None or abs(offset) < _NEGLIGIBLE:
            return
        shift = timedelta(seconds=offset)
        for entry in self.schedule.values():
            if isinstance(entry.last_run_at, datetime):
                entry.last_run_at = entry.last_run_at - shift

    def _code_entries(self) -> Any:
        """The entries the drift check compares: the code entries (with database entries
        on, as built at start), else the schedule."""
        return self.live.code_schedule if self.live is not None else self.schedule

    # -- the schedule (a WatchedSchedule: a tick that sends nothing is O(1)) -------

    def get_schedule(self) -> WatchedSchedule:
        data = self.data
        if not isinstance(data, WatchedSchedule):
            data = self.data = WatchedSchedule(data)
        return data

    def set_schedule(self, schedule: Any) -> None:
        self.data = schedule if isinstance(schedule, WatchedSchedule) \
            else WatchedSchedule(schedule)
        self.data.touch()

    schedule = property(get_schedule, set_schedule)

    def merge_inplace(self, b: Any) -> None:
        """Stock beat's merge, but each entry built on its own: a broken one is left
        out with an ERROR naming it (:mod:`..config.entries`), and the others run."""
        schedule = self.schedule
        built = build_entries(b, lambda name, fields: self.Entry(
            **dict(fields, name=name, app=self.app)), node=self.settings.node)
        for key in set(schedule) - set(built):
            schedule.pop(key, None)
        for key, entry in built.items():
            if schedule.get(key):
                schedule[key].update(entry)
            else:
                schedule[key] = entry
        schedule.touch()  # entries updated in place too

    def _now_fun(self) -> Callable[[], datetime] | None:
        """What Celery's schedules must read as "now" (their ``nowfun``) to decide on the
        cluster's clock, or None when this node's own clock is the cluster's (within a
        millisecond: a correction that small is not worth a call per entry). Made once
        per offset: beat asks it for every due entry."""
        clock = self._clock
        offset = clock.offset if isinstance(clock, ClusterClock) else None
        if offset is None or abs(offset) < _NEGLIGIBLE:
            return None
        made = self._now_funs
        if made is None or made[0] != offset:
            tz = self.app.timezone
            made = self._now_funs = (offset, lambda: clock().astimezone(tz))
        return made[1]

    def is_due(self, entry: ScheduleEntry) -> tuple[bool, float]:
        """:meth:`_is_due`, on the cluster's clock: a schedule without a ``nowfun`` of its
        own reads the corrected clock while it answers (beat is single-threaded)."""
        sched = entry.schedule
        now_fun = self._now_fun()
        if now_fun is None or getattr(sched, "nowfun", True) is not None:
            return self._is_due(entry)
        sched.nowfun = now_fun
        try:
            return self._is_due(entry)
        finally:
            sched.nowfun = None

    def _is_due(self, entry: ScheduleEntry) -> tuple[bool, float]:
        """The entry's own answer. A crontab is asked with its ``last_run_at`` in its own
        zone (every Celery version then fires the same wall times:
        :func:`~celery_elarion_beat.schedules.slots.crontab_last_run`) and, for an
        every-hour crontab near a fall back, also runs the second instant of the
        repeated hour that Celery's crontab skips
        (:func:`~celery_elarion_beat.schedules.slots.crontab_due`)."""
        sched = entry.schedule
        if isinstance(entry, LiveEntry) and entry.until is not None \
                and isinstance(sched, interval_schedule) and self._clock() >= entry.until:
            # a window claimed now is governed by the next revision (put in place at the
            # end of this tick): the interval ran its span, and keeps its last run
            return False, 1.0
        if isinstance(sched, crontab):
            last = crontab_last_run(sched, entry.last_run_at)
            return crontab_due(sched, last, self._clock(), sched.is_due(last))
        answer: tuple[bool, float] = entry.is_due()
        return answer

    def _is_due_failed(self, entry: ScheduleEntry) -> tuple[bool, float]:
        """An entry whose next run cannot be computed: Celery's ERROR naming it, and a
        new look in ``max_interval``; its neighbours go on. Celery's own (5.7) when it
        has one: before 5.7 beat let the exception stop every entry."""
        own = getattr(super(), "_is_due_failed", None)
        if own is not None:
            answer: tuple[bool, float] = own(entry)
            return answer
        logging.getLogger("celery.beat").error(
            "beat: Cannot calculate the next run of %r, trying again in %s.",
            entry.name, humanize_seconds(self.max_interval), exc_info=True)
        return False, self.max_interval

    def reserve(self, entry: ScheduleEntry) -> ScheduleEntry:
        """Move *entry* on to its next run (no edit of the schedule)."""
        sched = entry.schedule
        now_fun = self._now_fun()
        if now_fun is None or getattr(sched, "nowfun", True) is not None:
            new_entry = next(entry)
        else:  # its last run, on the cluster's clock
            sched.nowfun = now_fun
            try:
                new_entry = next(entry)
            finally:
                sched.nowfun = None
        self.schedule.advance(entry.name, new_entry)
        return new_entry

    def _heap_current(self) -> bool:
        """Whether the heap holds the schedule as it is (not replaced, not edited)."""
        schedule = self.schedule
        return self._heap is not None and self._heap_of is not None \
            and self._heap_of[0] is schedule and self._heap_of[1] == schedule.layout \
            and self._heap_dropped <= len(schedule) + 1000

    def populate_heap(self, event_t: Any = HeapEvent, heapify: Any = heapq.heapify) -> None:
        """The heap of next runs, as stock beat builds it (``event_t(time, 5, entry)``),
        but events due at the same time are ordered by entry name, never by comparing
        the entries (:mod:`.heap_event`)."""
        schedule = self.schedule
        heap = []
        for entry in schedule.values():
            try:
                is_due, next_call_delay = self.is_due(entry)
            except Exception:
                is_due, next_call_delay = self._is_due_failed(entry)
            heap.append(event_t(self._when(entry, 0 if is_due else next_call_delay) or 0,
                                PRIORITY, entry))
        heapify(heap)
        self._heap = heap
        self._heap_of = (schedule, schedule.layout)
        self._heap_dropped = 0
        schedule.fresh.clear()  # on the heap already

    def _push_fresh(self, event_t: Any = HeapEvent) -> None:
        """Push the entries put in place by a swap (the database entries) on the heap;
        the events of the entries they replaced are dropped when they come up."""
        schedule = self.schedule
        if not schedule.fresh:
            return
        fresh, schedule.fresh = schedule.fresh, []
        if not self._heap_current():
            return  # rebuilt at the next tick, the fresh entries with the rest
        for entry in fresh:
            if schedule.get(entry.name) is not entry:
                continue  # swapped out again meanwhile
            try:
                is_due, next_call_delay = self.is_due(entry)
            except Exception:
                is_due, next_call_delay = self._is_due_failed(entry)
            self._heap_dropped += 1
            heapq.heappush(self._heap, event_t(
                self._when(entry, 0 if is_due else next_call_delay) or 0, PRIORITY, entry))

    @property
    def store(self) -> ClaimStore:
        """The claims store; a lazily built scheduler opens it on first use (from
        ``elarion_beat_dsn``, or pass ``store=`` to the constructor)."""
        if self._store is None:
            self._store = open_store(self.settings, clock=self._clock)
        return self._store

    @property
    def info(self) -> str:
        s = self.settings
        if self._refusal is not None:
            return "    . claims -> (cannot start: a setting is wrong, see below)"
        return "\n".join([
            f"    . claims -> {s.safe_dsn} (table {s.qualified_table})",
            f"    . node -> {s.node} (every-node queue {s.node_queue})",
            f"    . cluster -> {s.cluster}",
        ])

    @cached_property
    def node_queue(self) -> Queue:
        """This node's queue, where every-node entries are sent."""
        return node_queue(self.settings)

    def close(self) -> None:
        # closing pooled connections is database I/O: a SIGTERM in the middle would
        # raise SystemExit inside the pool and log a traceback
        with deferred_signals():
            try:
                super().close()
                self.recovery.flush_marks()
            finally:
                if self.events is not None:
                    if self.maintenance is not None:
                        self.maintenance.stopping()  # a clean stop, not a silent node
                    self.events.close()
                if self.one_offs is not None:
                    self.one_offs.close()
                if self.live is not None:
                    self.live.close()
                if self._store is not None:
                    self._store.close()

    def _maintain(self) -> None:
        """Heartbeat and purge when due; database I/O, so held from SIGTERM. Not in a
        tick whose claims failed: a tick waits for a failing database once."""
        if self.maintenance is not None and not self._failed_this_tick():
            with deferred_signals():
                self.maintenance.run()

    def _failed_this_tick(self) -> bool:
        return self.outage.failed_since(self._tick_started)

    # -- the tick ------------------------------------------------------------

    def tick(self, event_t: Any = HeapEvent, min: Any = min,  # noqa: A002 - beat's signature
             heappop: Any = heapq.heappop, heappush: Any = heapq.heappush) -> float:
        """Send every entry that is due now, claiming them in one batch. A tick that
        raises is logged once as ERROR, and the next one comes (:mod:`.tick_errors`)."""
        try:
            return self._tick(event_t, min, heappop, heappush)
        except Exception as exc:
            wake = self._wake_after_failure()
            self.tick_failures.failed(exc, wake)
            return wake

    def _wake_after_failure(self) -> float:
        """Seconds to the next tick after one that raised: until the next entry is due,
        on a heap rebuilt (the events the tick had taken off went with it); RETRY when
        one is due already (the tick failed before taking it) or the heap fails."""
        self._heap = None
        try:
            self.populate_heap()
            top = self._heap[0] if self._heap else None
            wait = self.max_interval if top is None else top[0] - self._when(top[2], 0)
        except Exception:
            wait = 0.0
        return float(min(wait if wait > 0 else RETRY, self.max_interval))

    def _tick(self, event_t: Any, min: Any,  # noqa: A002 - beat's signature
              heappop: Any, heappush: Any) -> float:
        self._tick_started = time.monotonic()
        if self.live is not None:  # O(1) unless a change may have come (a NOTIFY, a poll)
            with deferred_signals():
                self.live.follow(self.schedule, self._clock())
        if not self._heap_current():  # O(1): no copy of the schedule to compare with
            self.populate_heap()
        self._push_fresh()
        heap = self._heap
        schedule = self.schedule
        due: list[tuple[Any, ScheduleEntry, ScheduleEntry, float, float]] = []
        later = []
        while heap:
            event = heap[0]
            entry = event[2]
            if schedule.get(entry.name) is not entry:  # swapped out (a database entry)
                heappop(heap)
                continue
            if event[0] > self._when(entry, 0):
                break
            heappop(heap)
            try:
                is_due, next_time_to_run = self.is_due(entry)
            except Exception:
                is_due, next_time_to_run = self._is_due_failed(entry)
            if is_due:
                next_entry = self.reserve(entry)
                # when the next run is due, from now: measured after a long batch the
                # delay would make every later slot late by the batch's duration
                due.append((event, entry, next_entry, next_time_to_run,
                            self._when(next_entry, next_time_to_run)))
            else:
                delay = next_time_to_run if isinstance(next_time_to_run, (int, float)) \
                    else self.max_interval
                later.append(event_t(self._when(entry, delay), event[1], entry))
        repeats: dict[str, float] = {}
        replays = self.recovery.replays()
        if due or replays or self.jittered.wait(self._clock()) == 0.0:
            repeats = self.apply_entries([(entry, nxt) for _, entry, _, nxt, _ in due],
                                         producer=self.producer, replays=replays)
        for event, _, next_entry, _, when in due:
            if next_entry.name in repeats:  # handled already, or re-anchored: sleep past it
                when = self._when(next_entry, repeats[next_entry.name])
            heappush(heap, event_t(when, event[1], next_entry))
        for event in later:
            heappush(heap, event)
        if self.live is not None and self.live.promote(self.schedule, self._clock()):
            self._push_fresh()  # revisions whose effective time came, after the old ones ran
        if self.recovery.resume():  # at start, and when the database came back
            self._heap = None  # interval entries were re-anchored: re-read every next run
            if self.one_offs is not None:
                self.one_offs.database_back()
        for plan in self.recovery.waiting():  # unclaimed slots still within their jitter
            if self.pipeline.now_or_held(plan, replay=True):
                self.jittered.hold(self._clock(), plan)  # the time came since the read
        self._maintain()
        self._watch_orphans()
        if not heap:
            return self._sleep(float(self.max_interval))
        top = heap[0]
        return self._sleep(float(max(0.0, min(top[0] - self._when(top[2], 0),
                                              self.max_interval))))

    def _sleep(self, seconds: float) -> float:
        """How long to sleep: *seconds*, or less when a jittered slot is due sooner or
        skips held back for the next event batch must go out (:mod:`..observe.events`), or
        one-offs may be due (at most elarion_beat_one_offs_poll; sent first)."""
        poll = self.one_offs.run(store_failed=self._failed_this_tick()) \
            if self.one_offs is not None else seconds
        held = self.jittered.wait(self._clock())
        if held is not None:
            seconds = min(seconds, held)
        if self.events is not None:
            self.events.end_tick()  # held skips whose time came
            due = self.events.held_for()
            if due is not None:
                seconds = min(seconds, due)
        seconds = min(self.recovery.sleep(seconds), poll)  # marks: by beat's own next wake
        if self.live is not None:
            wake = self.live.wake_in(self._clock())
            if wake is not None:
                seconds = min(seconds, wake)
            if self._by_beat:  # beat's own sleep cannot be woken: a NOTIFY ends this wait
                seconds = self.live.wait(seconds)
        return seconds

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        """Claim and, if won, send one reserved entry (beat's single-entry step)."""
        self.apply_entries([(entry, None)], producer=producer)

    def apply_entries(self, batch: Sequence[tuple[ScheduleEntry, float | None]],
                      producer: Any = None, replays: Sequence[Plan] = ()) -> dict[str, float]:
        """Claim a batch of reserved entries and send the winners (:mod:`.pipeline`).

        The answer maps the entries that must sleep past a slot handled already, and
        interval entries re-anchored on another node's claim, to the seconds until
        their next run."""
        return self.pipeline.apply(batch, producer=producer, replays=replays)

    def _redecide(self, stale: list[Plan], now: Any) -> list[Plan]:
        """Claims refused as stale: load the changes, and claim the same slots again
        under the revisions that govern them (a window waits for the next tick, where
        the entry in place decides)."""
        if self.live is None:
            return []
        with deferred_signals():
            self.live.refresh(self.schedule, now)
        self._push_fresh()
        out = []
        for plan in stale:
            occ = plan.occurrence
            if occ is None or occ.kind is not ClaimKind.SLOT or occ.slot is None:
                continue
            entry = self.schedule.get(plan.entry.name)
            if entry is None or outside_revision(entry, occ.slot, False, now):
                continue  # removed, disabled, or governed by a revision still to come
            if isinstance(entry, LiveEntry) and plan.request is not None \
                    and entry.revision == plan.request.revision:
                continue  # nothing new was learned: skipped (stale-revision)
            try:
                named = name_occurrence(entry.name, entry.schedule, occ.slot, tolerance=0.0)
            except Exception:
                continue
            if named.slot != occ.slot:
                continue  # the revision that governs the slot does not run at it
            out.append(replay_plan(entry, occ.slot, self.pipeline.rules.overlap(entry),
                                   catch_up=False))
        return out

    # -- orphans -------------------------------------------------------------------

    def _skew(self) -> float:
        """The scheduler's clock minus the database clock, as the last heartbeat measured:
        what the cluster clock's correction left (about 0), or an injected clock's skew."""
        skew = self.maintenance.skew if self.maintenance is not None else None
        if skew is None:
            return 0.0
        clock = self._clock
        if isinstance(clock, ClusterClock) and clock.offset is not None:
            return skew - clock.offset
        return skew

    def _watch_orphans(self) -> None:
        """After each heartbeat, look for orphaned claims; publish the ones taken over."""
        if self.orphans is None or self.maintenance is None \
                or self.maintenance.heartbeats == self._heartbeats_seen:
            return
        if self._failed_this_tick():
            return  # no second wait for a failing database in this tick
        self._heartbeats_seen = self.maintenance.heartbeats
        try:
            with deferred_signals():
                taken = self.orphans.check(self.schedule)
        except Exception as exc:
            logger.warning("beat: could not look for orphaned claims: %s", exc,
                           exc_info=not isinstance(exc, StoreError))
            return
        if taken:
            self.pipeline.publish_takeovers(taken, self.schedule, self.producer)

    def adjust(self, n: float, drift: float = 0.0) -> float:
        """Wake exactly when the next entry is due, not 10 ms early as stock beat.

        An early wake-up finds only some entries of a slot due and splits the
        slot's batch over two ticks, differently on each node; on time, every
        node takes the whole slot in one tick and the chunks line up.
        """
        return n

"""ClaimingScheduler: Celery beat that claims each occurrence before sending it.

Celery glue only; no SQL here. Each tick takes every due entry in one pass,
reserves it (its chain moves on), names its occurrence, claims the batch in
chunks of ``elarion_beat_claim_chunk`` entries (one store call each, usually one
for the whole tick) and publishes each chunk's winners. Losers and failed claims
are recorded as skips and publish nothing.

Each chunk's publish results ride along with the next claim (or are written at
the end of the tick when the next one is far). When beat starts and when the
claims database comes back, the ledger says where each entry stands
(:mod:`.resume`): intervals count from their newest claim, missed slots are
queued for replay (:mod:`.catch_up`). Orphaned claims are watched (:mod:`.orphans`).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from celery.beat import ScheduleEntry, Scheduler, event_t
from celery.schedules import crontab
from kombu.entity import Queue
from kombu.exceptions import OperationalError
from kombu.utils.objects import cached_property

from .backends import backend_for
from .chunks import rotated_chunks
from .clock import Clock, utcnow
from .deferral import deferred_signals
from .dispatch import (
    Due,
    check_entry,
    label,
    message,
    plan_entry,
    takeover_plan,
    when_text,
)
from .entries import build_entries
from .events import EventSender
from .exceptions import (
    ConfigurationError,
    SchemaMissing,
    StoreError,
    StoreRefused,
    StoreUnavailable,
)
from .handled import HandledSlots
from .jitter import JitterQueue, entry_jitter, jitter_offset
from .logformat import install_json_logging
from .maintenance import Maintenance
from .node_queue import node_queue, refresh_queue_ttl
from .one_off_runner import OneOffRunner
from .orphans import OrphanWatch
from .outage import Outage
from .outcome import Outcome, Record, Recorder, SkipReason
from .overlap import entry_overlap
from .pausing import PauseWatch
from .placement import Placement, entry_placement
from .recovery import Recovery
from .slots import ClaimKind, crontab_due, is_slotted, iso
from .startup import built_by_beat, exit_code, read_settings, refuse_to_start
from .store import ClaimResult, ClaimStore, PublishReport, Takeover, open_store
from .store.base import OverlapRule, Pause
from .watched import WatchedSchedule

__all__ = ["ClaimingScheduler"]

logger = logging.getLogger(__name__)


class ClaimingScheduler(Scheduler):
    """A beat scheduler that every node of a cluster can run at once.

    ``celery -A proj beat -S celery_elarion_beat.ClaimingScheduler`` (or ``-S elarion``).
    """

    _heap: Any
    data: Any
    max_interval: float

    def __init__(self, app: Any, *args: Any, store: ClaimStore | None = None,
                 clock: Clock | None = None, **kwargs: Any) -> None:
        #: built by `celery beat`: a refusal to start exits (:mod:`.startup`)
        self._by_beat = built_by_beat(kwargs)
        self.settings, self._refusal = read_settings(app, self._by_beat,
                                                     bool(kwargs.get("lazy")))
        self._clock: Clock = clock or utcnow
        self._store = store
        self.recorder = Recorder()
        self.outage = Outage()
        self.handled = HandledSlots()
        self.events: EventSender | None = None
        self.maintenance: Maintenance | None = None
        self.orphans: OrphanWatch | None = None
        self.one_offs: OneOffRunner | None = None  # schedule_once's rows (one_off_runner)
        self.recovery = Recovery(self.settings, lambda: self._store, self._clock,
                                 lambda: self.schedule, self._skew, self._overlap)
        self._overlaps: dict[str, tuple[Any, OverlapRule | None]] = {}
        self._jitters: dict[str, tuple[Any, timedelta | None]] = {}
        self.jittered = JitterQueue()
        self.pauses = PauseWatch(lambda: self.store, self._clock)
        self._heartbeats_seen = 0
        self._tick_started = time.monotonic()
        self._pauses_probed = 0.0  # monotonic: the last pauses read during an outage
        #: the broker error of this tick's first failed publish (kombu gave up
        #: reconnecting): the tick's other winners fail at once instead of each waiting
        #: out task_publish_retry_policy again
        self._broker_down: OperationalError | None = None
        self._heap_of: tuple[Any, int] | None = None  # (schedule, version) the heap holds
        super().__init__(app, *args, **kwargs)
        # wake at least once per heartbeat, however far away the next entry is
        self.max_interval = min(self.max_interval, self.settings.heartbeat_interval)

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
        logger.info("beat: claiming occurrences in %s as node %s",
                    self.store.describe(), self.settings.node,
                    extra={"action": "started", "node": self.settings.node})
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
        if self.settings.events:
            self.events = EventSender(self.app, self.settings.node,
                                      batch=self.settings.event_batch)
            self.recorder.listeners.append(self.events.on_record)
        self.maintenance = Maintenance(self.settings, self.store, self.recorder, self._clock,
                                       lambda: self.schedule, events=self.events)
        self.orphans = OrphanWatch(self.settings, self.store, events=self.events)
        self.one_offs = OneOffRunner(self.app, self.settings, lambda: self.store, self._clock,
                                     self._skew, events=self.events)
        self.one_offs.run(store_failed=self.outage.since is not None)  # due while beat was down
        self._maintain()
        # read the ledger a moment after start: the slots other nodes were claiming
        # as this one started have landed by then (else nodes that start on both
        # sides of a slot could each replay a different "latest" one)
        self.recovery.start()
        self._watch_orphans()

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
        out with an ERROR naming it (:mod:`.entries`), and the others run."""
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

    def is_due(self, entry: ScheduleEntry) -> tuple[bool, float]:
        """The entry's own answer; for an every-hour crontab near a fall back, with the
        second instant of the repeated hour that Celery's crontab skips
        (:func:`.slots.crontab_due`)."""
        answer: tuple[bool, float] = entry.is_due()
        if isinstance(entry.schedule, crontab):
            sched = entry.schedule
            return crontab_due(sched, sched.maybe_make_aware(entry.last_run_at), self._clock(),
                               answer)
        return answer

    def reserve(self, entry: ScheduleEntry) -> ScheduleEntry:
        """Move *entry* on to its next run (no edit of the schedule)."""
        new_entry = next(entry)
        self.schedule.advance(entry.name, new_entry)
        return new_entry

    def _heap_current(self) -> bool:
        """Whether the heap holds the schedule as it is (not replaced, not edited)."""
        schedule = self.schedule
        return self._heap is not None and self._heap_of is not None \
            and self._heap_of[0] is schedule and self._heap_of[1] == schedule.version

    def populate_heap(self, event_t: Any = event_t, heapify: Any = heapq.heapify) -> None:
        """The heap of next runs, as stock beat builds it, but each entry's place in the
        schedule breaks ties (stock beat's equal priorities make heap operations on
        entries due at the same time compare the entries themselves, field by field)."""
        schedule = self.schedule
        heap = []
        for order, entry in enumerate(schedule.values()):
            try:
                is_due, next_call_delay = self.is_due(entry)
            except Exception:
                is_due, next_call_delay = self._is_due_failed(entry)
            heap.append(event_t(self._when(entry, 0 if is_due else next_call_delay) or 0,
                                order, entry))
        heapify(heap)
        self._heap = heap
        self._heap_of = (schedule, schedule.version)

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

    def _probe_pauses(self) -> bool:
        """Whether this tick, in an outage, reads the pauses after sending its every-node
        entries. While the claims fail, the pauses last read hold (every-node entries do
        not wait for the failing database); they are read again once per heartbeat
        interval of the outage, so a pause written after the database came back applies
        even before the next cluster claim."""
        now = time.monotonic()
        since = max(self._pauses_probed, self.outage.since or 0.0)
        if now - since < self.settings.heartbeat_interval:
            return False
        self._pauses_probed = now
        return True

    # -- the tick ------------------------------------------------------------

    def tick(self, event_t: Any = event_t, min: Any = min,  # noqa: A002 - beat's signature
             heappop: Any = heapq.heappop, heappush: Any = heapq.heappush) -> float:
        """Send every entry that is due now, claiming them in one batch."""
        self._tick_started = time.monotonic()
        if not self._heap_current():  # O(1): no copy of the schedule to compare with
            self.populate_heap()
        heap = self._heap
        due: list[tuple[Any, ScheduleEntry, ScheduleEntry, float, float]] = []
        later = []
        while heap:
            event = heap[0]
            entry = event[2]
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
        if self.recovery.resume():  # at start, and when the database came back
            self._heap = None  # interval entries were re-anchored: re-read every next run
            if self.one_offs is not None:
                self.one_offs.database_back()
        for plan in self.recovery.waiting():  # unclaimed slots still within their jitter
            if self._now_or_held(plan, replay=True):
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
        skips held back for the next event batch must go out (:mod:`.events`), or
        one-offs may be due (at most elarion_beat_one_off_poll; sent first)."""
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
        return min(self.recovery.sleep(seconds), poll)  # marks: by beat's own next wake

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        """Claim and, if won, send one reserved entry (beat's single-entry step)."""
        self.apply_entries([(entry, None)], producer=producer)

    def apply_entries(self, batch: Sequence[tuple[ScheduleEntry, float | None]],
                      producer: Any = None, replays: Sequence[Due] = ()) -> dict[str, float]:
        """Claim a batch of reserved entries and send the winners.

        The batch is sorted by job name and claimed in chunks of
        ``elarion_beat_claim_chunk`` (one store call each), each chunk's winners
        published before the next chunk is claimed. Every node walks the same
        chunks in the same cyclic order but starts at its own rank among the live
        nodes, so the nodes of a cluster win different chunks and publish in
        parallel, and a node killed mid-batch loses at most one chunk.

        SIGTERM and SIGINT are held back during each chunk: a claim that is won
        must be published, or the occurrence would be lost for the cluster.

        An exact slot this process already claimed or skipped is never claimed
        again (a crontab says "due" on every tick inside a repeated daylight-saving
        hour); the answer maps such entries, and interval entries re-anchored on
        another node's claim, to the seconds until their next run.

        *replays* (missed slots, :mod:`.catch_up`) are claimed first, oldest first,
        in chunks of their own (never rotated), and never a slot of this batch.
        """
        now = self._clock()
        self._broker_down = None  # each tick tries the broker again, once
        plans = [plan for plan in (self._plan(entry, nxt, now) for entry, nxt in batch) if plan]
        repeats = self.handled.repeats(plans, now, self.max_interval)
        plans = [plan for plan in plans if plan.entry.name not in repeats]
        local = [plan for plan in plans if plan.request is None]
        # a jittered slot waits until slot + offset; those whose time came join this batch
        claimed = [plan for plan in plans if plan.request is not None and self._now_or_held(plan)]
        claimed += self.jittered.due(now)
        live = self.maintenance.live_nodes if self.maintenance is not None else []
        chunks = rotated_chunks(claimed, lambda plan: plan.entry.name, self.settings.node,
                                live, self.settings.claim_chunk)
        # replays first, oldest first (never rotated), and never a slot claimed right now
        if replays:
            due_now = {(plan.entry.name, plan.occurrence.slot) for plan in claimed
                       if plan.occurrence is not None}
            replays = [plan for plan in replays
                       if plan.occurrence is not None
                       and (plan.entry.name, plan.occurrence.slot) not in due_now]
        size = self.settings.claim_chunk
        chunks = [list(replays[i:i + size]) for i in range(0, len(replays), size)] + chunks
        with deferred_signals():  # reading the pauses is database I/O too
            names = [plan.entry.name for plan in local]
            read = bool(local) and self.outage.since is None
            probe = bool(local) and not read and self._probe_pauses()
            started = time.monotonic()
            paused = self.pauses.of(names) if read else self.pauses.held(names)
            for plan in local:
                pause = paused.get(plan.entry.name)
                if pause is not None:
                    self._skip(plan, now, SkipReason.PAUSED, pause=pause)
                else:
                    self._send(plan, now, producer, occurrence=None)
            if probe:  # after the sends: every-node entries never wait for a failing database
                started = time.monotonic()
                self.pauses.of(names)
            reading = time.monotonic() - started
            read = read or probe
        # the pauses read waited out the claim timeout and failed: the database stalls, and
        # the claims would wait for it too. (A read that failed at once, on a connection
        # killed while pooled, says nothing about the claims: they retry on a fresh one.)
        stalled = read and reading >= self.settings.claim_timeout * 0.9
        failed: BaseException | None = self.pauses.error if stalled and isinstance(
            self.pauses.error, StoreUnavailable) else None
        for chunk in chunks:
            with deferred_signals():
                if failed is None:
                    failed = self._claim_and_send(chunk, now, producer)
                else:  # the store failed this tick: the rest fail closed at once
                    self.handled.note([plan for plan in chunk if not plan.catch_up])
                    self._claims_failed(chunk, now, failed)
        repeats.update(self.recovery.rescheduled())
        if self.events is not None:
            self.events.end_tick()  # this tick's outcomes: one batch event (or a few)
        return repeats

    def _claims_failed(self, plans: Sequence[Due], now: datetime, exc: BaseException) -> None:
        """The store failed: skip *plans* as claim-error (fail closed)."""
        self.outage.failed(exc, skipped=len(plans))
        for plan in plans:
            self._skip(plan, now, SkipReason.CLAIM_ERROR)
        self.recovery.claims_failed(plans)

    def _claim_and_send(self, plans: Sequence[Due], now: datetime,
                        producer: Any) -> BaseException | None:
        """Claim *plans* and send the winners; the store's error when it failed."""
        requests = [plan.request for plan in plans if plan.request is not None]
        self.handled.note([plan for plan in plans if not plan.catch_up])
        try:
            answers = self.store.claim_isolating(self.settings.node, requests)
        except Exception as exc:
            if not isinstance(exc, StoreError):  # a store bug: still fail closed, never die
                logger.exception("beat: the claim store raised %s, which is a bug; failing "
                                 "closed", type(exc).__name__)
            self._claims_failed(plans, now, exc)
            return exc
        self.recovery.claims_answered(after_outage=self.outage.since is not None)
        self.outage.recovered()
        results = {id(answer.request): answer for answer in answers}
        reports = []
        for plan in plans:
            result = results[id(plan.request)]
            if result.won:
                error = self._send(plan, now, producer, occurrence=result.occurrence)
                if result.token and result.occurrence is not None:
                    reports.append(PublishReport(plan.entry.name, result.occurrence,
                                                 result.token, error))
            elif result.refused is not None:
                self._invalid(plan.entry, now, f"the claims database refused its claim "
                              f"({result.refused})", plan=plan)
            elif result.paused:
                self._skip(plan, now, SkipReason.PAUSED, result, pause=result.pause)
                if result.request.kind is ClaimKind.WINDOW:
                    self.recovery.reanchor(plan.entry, result.occurrence)
            elif result.still_running:
                self._skip(plan, now, SkipReason.STILL_RUNNING, result)
                if result.request.kind is ClaimKind.WINDOW:
                    self.recovery.reanchor(plan.entry, result.occurrence)
            else:
                self._skip(plan, now, SkipReason.CLAIMED_ELSEWHERE, result)
                if result.request.kind is ClaimKind.WINDOW:
                    self.recovery.reanchor(plan.entry, result.occurrence)
        if reports:
            self.store.defer_report(reports)
            self.recovery.marks_deferred()
        return None

    # -- orphans -------------------------------------------------------------------

    def _skew(self) -> float:
        """This node's clock minus the database clock, as the last heartbeat measured."""
        skew = self.maintenance.skew if self.maintenance is not None else None
        return skew or 0.0

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
            self._publish_takeovers(taken)

    def _publish_takeovers(self, taken: Sequence[Takeover]) -> None:
        now = self._clock()
        reports = []
        self._broker_down = None
        with deferred_signals():
            for takeover in taken:
                entry = self.schedule.get(takeover.row.job)
                if entry is None:  # gone from the schedule since the look
                    continue
                plan = takeover_plan(entry, takeover.row)
                error = self._send(plan, now, self.producer, occurrence=takeover.row.occurrence)
                reports.append(PublishReport(takeover.row.job, takeover.row.occurrence,
                                             takeover.token, error))
            self.store.defer_report(reports)
            self.recovery.flush_marks()
        if self.events is not None:
            self.events.end_tick()

    def adjust(self, n: float, drift: float = 0.0) -> float:
        """Wake exactly when the next entry is due, not 10 ms early as stock beat.

        An early wake-up finds only some entries of a slot due and splits the
        slot's batch over two ticks, differently on each node; on time, every
        node takes the whole slot in one tick and the chunks line up.
        """
        return n

    # -- steps ---------------------------------------------------------------

    def _overlap(self, entry: ScheduleEntry) -> OverlapRule | None:
        """The entry's overlap rule (:mod:`.overlap`), worked out again only when its
        options change (each tick's entry is a copy: an empty ``options`` is a new dict)."""
        held = self._overlaps.get(entry.name)
        if held is not None and (held[0] is entry.options or held[0] == entry.options):
            return held[1]
        task = self.app.tasks.get(entry.task)
        limit = getattr(task, "time_limit", None) or self.app.conf.task_time_limit
        rule = entry_overlap(entry.name, entry.options, self.settings.overlap_timeout,
                             self.settings.publish_timeout,
                             time_limit=float(limit) if limit else None,
                             every_node=entry_placement(entry.name, entry.options)
                             is Placement.EVERY_NODE)
        self._overlaps[entry.name] = (entry.options, rule)
        return rule

    def _jitter(self, entry: ScheduleEntry) -> timedelta | None:
        """The entry's jitter (:mod:`.jitter`), worked out again only when its options
        change; an entry whose jitter became invalid since start has none."""
        held = self._jitters.get(entry.name)
        if held is not None and (held[0] is entry.options or held[0] == entry.options):
            return held[1]
        try:
            jitter = entry_jitter(entry.name, entry.options, slotted=is_slotted(entry.schedule),
                                  every_node=entry_placement(entry.name, entry.options)
                                  is Placement.EVERY_NODE)
        except ConfigurationError as exc:
            logger.error("beat: %s; it runs without jitter", exc,
                         extra={"action": "invalid-entry", "job": entry.name,
                                "node": self.settings.node})
            jitter = None
        self._jitters[entry.name] = (entry.options, jitter)
        return jitter

    def _now_or_held(self, plan: Due, replay: bool = False) -> bool:
        """True to claim *plan* now; False when its slot is jittered to a later time
        (it then waits in :attr:`jittered`). Replays of missed slots and takeovers are
        never held (a slot a restart found *waiting* for its jitter is no replay)."""
        occ = plan.occurrence
        if occ is None or occ.kind is not ClaimKind.SLOT or occ.slot is None or (
                plan.catch_up and not replay):
            return True
        jitter = self._jitter(plan.entry)
        if jitter is None:
            return True
        plan.jitter = jitter_offset(plan.entry.name, occ.slot, jitter)
        at = occ.slot + plan.jitter
        if at <= self._clock():
            return True
        logger.debug("beat: holding %s slot %s for its jitter (%.3fs)", plan.entry.name,
                     iso(occ.slot), plan.jitter.total_seconds())
        self.jittered.hold(at, plan)
        return False

    def _plan(self, entry: ScheduleEntry, next_due: float | None, now: datetime) -> Due | None:
        try:
            return plan_entry(entry, next_due, now, self.settings.window_tolerance,
                              self._overlap(entry))
        except ConfigurationError as exc:
            self._invalid(entry, now, str(exc))
        except Exception as exc:
            self._invalid(entry, now, f"its occurrence cannot be named ({exc}); fix the "
                          "entry's schedule or options", traceback=True)
        return None

    def _invalid(self, entry: ScheduleEntry, now: datetime, why: str, plan: Due | None = None,
                 traceback: bool = False) -> None:
        """Skip one broken entry (reason invalid-entry), saying why; its neighbours go on."""
        logger.error("beat: Skipping %r: %s", entry.name[:200], why, exc_info=traceback,
                     extra={"action": "invalid-entry", "job": entry.name,
                            "node": self.settings.node})
        self._record(entry, plan.placement if plan else Placement.CLUSTER, now,
                     Outcome.SKIPPED, plan=plan, reason=SkipReason.INVALID_ENTRY, detail=why)

    def _send(self, plan: Due, now: datetime, producer: Any,
              occurrence: datetime | None) -> str | None:
        """Publish *plan*; None when the broker accepted it, else why not."""
        entry = plan.entry
        how = ("every node" if plan.placement is Placement.EVERY_NODE
               else f"{label(plan, occurrence)} won")
        if plan.catch_up:
            how += ", catch-up"
        if plan.takeover:
            how = f"{label(plan, occurrence)} taken over ({plan.takeover})"
        logger.info("beat: Sending due task %s (%s) [%s]", entry.name, entry.task, how,
                    extra={"action": "dispatched", **self._log_fields(plan, occurrence),
                           "task_id": plan.task_id})
        try:
            if self._broker_down is not None:
                raise OperationalError(f"not sent: the broker refused an earlier message of "
                                       f"this tick ({self._broker_down})")
            self._publish(plan, occurrence, producer)
        except Exception as exc:
            first = self._broker_down is None
            if first and isinstance(exc, OperationalError):
                self._broker_down = exc
            after = ("" if plan.placement is Placement.EVERY_NODE else
                     " after winning its claim; the claim is marked failed (an orphan: "
                     "retried by a live node with delivery at_least_once, else reported)")
            logger.error("beat: Message Error: could not send %s (%s)%s: %s", entry.name,
                         entry.task, after, exc,
                         exc_info=first, extra={"action": "publish-error",
                                               **self._log_fields(plan, occurrence),
                                               "task_id": plan.task_id})
            self._record(entry, plan.placement, now, Outcome.SKIPPED, plan=plan,
                         occurrence=occurrence, reason=SkipReason.PUBLISH_ERROR, detail=str(exc))
            return f"{type(exc).__name__}: {exc}"
        slot = plan.occurrence.slot if plan.occurrence is not None else None
        lateness = (self._clock() - slot).total_seconds() if slot is not None else None
        self._record(entry, plan.placement, now, Outcome.DISPATCHED, plan=plan,
                     occurrence=occurrence, winner=self.settings.node, lateness=lateness,
                     jitter=plan.jitter.total_seconds() if plan.jitter is not None else None)
        return None

    def _publish(self, plan: Due, occurrence: datetime | None, producer: Any) -> Any:
        queue = self.node_queue if plan.placement is Placement.EVERY_NODE else None
        args, kwargs, options = message(plan, occurrence, self.settings.node, queue)
        task = self.app.tasks.get(plan.entry.task)
        if task is not None:
            result = task.apply_async(args, kwargs, producer=producer, **options)
        else:
            result = self.send_task(plan.entry.task, args, kwargs, producer=producer, **options)
        if queue is not None:
            refresh_queue_ttl(producer, queue, self.settings.node_queue_expires)
        return result

    def _skip(self, plan: Due, now: datetime, reason: SkipReason,
              result: ClaimResult | None = None, pause: Pause | None = None) -> None:
        entry = plan.entry
        occurrence = result.occurrence if result else None
        winner = result.winner if result else None
        fields = {"action": "skipped", **self._log_fields(plan, occurrence),
                  "reason": reason.value, "winner": winner}
        if reason is SkipReason.CLAIMED_ELSEWHERE:
            logger.info("beat: Skipping %s at %s: %s (winner %s)", entry.name,
                        when_text(plan, occurrence, now), reason, winner or "unknown",
                        extra=fields)
        elif reason is SkipReason.STILL_RUNNING:
            blocker = result.blocker if result else None
            logger.info("beat: Skipping %s at %s: %s (the run of %s has not finished; "
                        "decided by %s)", entry.name, when_text(plan, occurrence, now), reason,
                        iso(blocker) if blocker else "an earlier occurrence",
                        winner or "unknown", extra=fields)
        elif reason is SkipReason.PAUSED:
            logger.info("beat: Skipping %s at %s: %s (%s)", entry.name,
                        when_text(plan, occurrence, now), reason,
                        pause.describe() if pause else "decided by " + (winner or "unknown"),
                        extra=fields)
        else:
            logger.info("beat: Skipping %s at %s: %s", entry.name,
                        when_text(plan, occurrence, now), reason, extra=fields)
        self._record(entry, plan.placement, now, Outcome.SKIPPED, plan=plan,
                     occurrence=occurrence, reason=reason, winner=winner)

    def _log_fields(self, plan: Due, occurrence: datetime | None) -> dict[str, Any]:
        """The ``extra`` of a log line about *plan*: the fields its event has, same names."""
        occ = plan.occurrence
        at = occurrence or (occ.slot if occ else None)
        return {"job": plan.entry.name, "node": self.settings.node,
                "placement": plan.placement.value, "claim": occ.kind.value if occ else None,
                "occurrence": iso(at) if at else None}

    def _record(self, entry: ScheduleEntry, placement: Placement, now: datetime,
                outcome: Outcome, *, plan: Due | None = None, occurrence: datetime | None = None,
                reason: SkipReason | None = None, winner: str | None = None,
                detail: str | None = None, lateness: float | None = None,
                jitter: float | None = None) -> None:
        occ = plan.occurrence if plan else None
        self.recorder.add(Record(
            job=entry.name, task=entry.task, node=self.settings.node, outcome=outcome,
            placement=placement, at=now, kind=occ.kind if occ else None,
            occurrence=occurrence or (occ.slot if occ else None),
            task_id=plan.task_id if plan and outcome is Outcome.DISPATCHED else None,
            reason=reason, winner=winner, detail=detail,
            catch_up=plan.catch_up if plan else False, takeover=plan.takeover if plan else 0,
            lateness=lateness, jitter=jitter))

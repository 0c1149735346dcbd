"""The claim pipeline: what one tick does with its due entries.

claim -> publish -> skip -> record, in steps that each do one thing
(:meth:`ClaimPipeline.apply`):

1. **plan**: name each reserved entry's occurrence and build its claim
   (:mod:`.plan`); a broken entry is skipped as ``invalid-entry``, its neighbours go on;
2. **drop repeats**: an exact slot this process already claimed or skipped is never
   claimed again (a crontab says "due" on every tick inside a repeated
   daylight-saving hour, :mod:`.repeat_guard`);
3. **hold jittered slots** until slot + offset; those whose time came join the batch
   (:mod:`.jitter_queue`);
4. **chunk**: sort by job name, cut into chunks of ``elarion_beat_claim_chunk``
   (one store call each), each node starting at its own rank among the live nodes
   (:mod:`.chunks`); replays of missed slots go first, oldest first, never rotated,
   and never a slot of this batch;
5. **send the every-node entries** (never claimed), unless paused; the pauses read
   doubles as a probe: a read that waited out the claim timeout means a stalled
   database, and the claims then fail closed at once instead of waiting too;
6. **claim each chunk and publish its winners** before the next chunk is claimed;
   losers and failed claims are recorded as skips and publish nothing;
7. **decide stale claims again**: a database entry's claim refused as stale (it
   changed, and this node had not heard yet) is handed to :attr:`ClaimPipeline.redecide`,
   which loads the change and names the claims of the same slots under the revision
   that governs them, claimed in the same tick (twice at most; then the slot is
   skipped ``stale-revision``).

SIGTERM and SIGINT are held back during each chunk: a claim that is won must be
published, or the occurrence would be lost for the cluster. Each chunk's publish
results ride along with the next claim (or are written at the end of the tick).
Every outcome goes to the :class:`~..observe.outcome.Recorder` (and from there to
the events) and to one log line beside beat's own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from celery.beat import ScheduleEntry
from kombu.entity import Queue

from ..config.jitter import jitter_offset
from ..config.live_entries import naming_time, outside_revision
from ..config.parsers import format_duration
from ..config.settings import Settings
from ..exceptions import ConfigurationError, StoreError, StoreUnavailable
from ..observe.events import EventSender
from ..observe.outcome import Recorder, SkipReason
from ..schedules.clock import Clock
from ..schedules.slots import ClaimKind, iso
from ..store.interface import ClaimStore
from ..store.records import ClaimResult, PublishReport, Takeover
from .chunks import rotated_chunks
from .clock_fence import ClockFence
from .entry_rules import EntryRules
from .fail_closed import Outage
from .jitter_queue import JitterQueue
from .pause_watch import PauseWatch
from .plan import Plan, plan_entry, takeover_plan
from .recovery import Recovery
from .repeat_guard import RepeatGuard
from .sender import LOGGER, Sender
from .signals import deferred_signals

__all__ = ["ClaimPipeline"]

logger = logging.getLogger(LOGGER)

Batch = Sequence[tuple[ScheduleEntry, "float | None"]]


class ClaimPipeline:
    """Claims one tick's due entries and sends the winners, recording every outcome.

    Built by :class:`~.scheduler.ClaimingScheduler` (its ``Pipeline``); what it does
    not own, it reads through the callables it is given: the store (opened lazily),
    the node queue, the live nodes, beat's ``max_interval``. Publishing and recording
    one plan is its :class:`~.sender.Sender`'s job; each entry's overlap rule and
    jitter are its :class:`~.entry_rules.EntryRules`'.
    """

    #: The sender's class (a test hook may subclass it).
    Sender: type[Sender] = Sender

    def __init__(self, app: Any, settings: Settings, store: Callable[[], ClaimStore],
                 clock: Clock, recovery: Recovery, node_queue: Callable[[], Queue],
                 live_nodes: Callable[[], list[str]],
                 max_interval: Callable[[], float], fence: ClockFence | None = None) -> None:
        self.app = app
        #: whether this node's clock lets it claim (:mod:`.clock_fence`)
        self.fence = fence
        self.settings = settings
        self._store = store
        self._clock = clock
        self.recovery = recovery
        self._node_queue = node_queue
        self._live_nodes = live_nodes
        self._max_interval = max_interval
        self.recorder = Recorder()
        self.sender = self.Sender(app, settings, clock, self.recorder, node_queue)
        self.rules = EntryRules(app, settings)
        self.outage = Outage()
        self.repeats = RepeatGuard()
        self.jittered = JitterQueue()
        self.pauses = PauseWatch(store, clock)
        #: set by the scheduler once its events are on (``elarion_beat_events``)
        self.events: EventSender | None = None
        #: set by the scheduler when it runs database entries: the claims of the same
        #: slots under the revisions that govern them, for claims refused as stale
        self.redecide: Callable[[list[Plan], datetime], list[Plan]] | None = None
        self._stale: list[Plan] = []
        self._pauses_probed = 0.0  # monotonic: the last pauses read during an outage
        #: the most an exact slot's claim may come before the slot, on the database clock
        self._lead: timedelta | None = (timedelta(seconds=settings.max_clock_skew)
                      if settings.clock == "database" else None)

    # -- one tick ---------------------------------------------------------------------

    def apply(self, batch: Batch, producer: Any = None,
              replays: Sequence[Plan] = ()) -> dict[str, float]:
        """Claim a batch of reserved entries (with the missed slots to *replays*) and
        send the winners. The answer maps the entries that must sleep past a slot
        handled already, and interval entries re-anchored on another node's claim, to
        the seconds until their next run."""
        now = self._clock()
        self.sender.new_tick()
        plans = [plan for plan in (self.plan(entry, nxt, now) for entry, nxt in batch) if plan]
        repeats = self.repeats.repeats(plans, now, self._max_interval())
        plans = [plan for plan in plans if plan.entry.name not in repeats]
        every_node = [plan for plan in plans if plan.request is None]
        claimed = self._claimed_now([plan for plan in plans if plan.request is not None], now)
        if self.fence is not None and (claimed or replays) and self.fence.fenced():
            for plan in [*replays, *claimed]:  # nothing claimed: its every-node entries go on
                self.sender.skip(plan, now, SkipReason.CLOCK_FENCED)
            claimed, replays = [], ()
        chunks = self._chunks(claimed, replays)
        stalled = self._send_every_node(every_node, now, producer)
        failed = self._claim_chunks(chunks, now, producer, failed=stalled)
        self._decide_stale(now, producer, failed)
        repeats.update(self.recovery.rescheduled())
        if self.events is not None:
            self.events.end_tick()  # this tick's outcomes: one batch event (or a few)
        return repeats

    def _claimed_now(self, plans: list[Plan], now: datetime) -> list[Plan]:
        """The claims to make now: *plans* not held for their jitter, and the held ones
        whose time came."""
        return [plan for plan in plans if self.now_or_held(plan)] + self.jittered.due(now)

    def _chunks(self, claimed: list[Plan], replays: Sequence[Plan]) -> list[list[Plan]]:
        """This node's chunks of *claimed*, in its own rotation, after the replays."""
        size = self.settings.claim_chunk
        chunks = rotated_chunks(claimed, lambda plan: plan.entry.name, self.settings.node,
                                self._live_nodes(), size)
        if replays:
            due_now = {(plan.entry.name, plan.occurrence.slot) for plan in claimed
                       if plan.occurrence is not None}
            replays = [plan for plan in replays
                       if plan.occurrence is not None
                       and (plan.entry.name, plan.occurrence.slot) not in due_now]
        return [list(replays[i:i + size]) for i in range(0, len(replays), size)] + chunks

    def _send_every_node(self, plans: Sequence[Plan], now: datetime,
                         producer: Any) -> BaseException | None:
        """Send the every-node entries, skipping the paused ones. The pauses are read
        before (or, in an outage, probed after the sends, at most once per heartbeat
        interval: every-node entries never wait for a failing database). Returns the
        read's error when it waited out the claim timeout: the database stalls, and
        the claims would wait for it too. (A read that failed at once, on a connection
        killed while pooled, says nothing about the claims: they retry on a fresh one.)"""
        if not plans:
            return None
        with deferred_signals():  # reading the pauses is database I/O too
            names = [plan.entry.name for plan in plans]
            read = self.outage.since is None
            probe = not read and self._probe_pauses()
            started = time.monotonic()
            paused = self.pauses.of(names) if read else self.pauses.held(names)
            for plan in plans:
                pause = paused.get(plan.entry.name)
                if pause is not None:
                    self.sender.skip(plan, now, SkipReason.PAUSED, pause=pause)
                else:
                    self.sender.send(plan, now, producer, occurrence=None)
            if probe:
                started = time.monotonic()
                self.pauses.of(names)
            reading = time.monotonic() - started
        stalled = (read or probe) and reading >= self.settings.claim_timeout * 0.9
        error = self.pauses.error
        return error if stalled and isinstance(error, StoreUnavailable) else None

    def _probe_pauses(self) -> bool:
        """Whether this tick, in an outage, reads the pauses after sending its every-node
        entries. While the claims fail, the pauses last read hold; they are read again
        once per heartbeat interval of the outage, so a pause written after the database
        came back applies even before the next cluster claim."""
        now = time.monotonic()
        since = max(self._pauses_probed, self.outage.since or 0.0)
        if now - since < self.settings.heartbeat_interval:
            return False
        self._pauses_probed = now
        return True

    def _claim_chunks(self, chunks: list[list[Plan]], now: datetime, producer: Any,
                      failed: BaseException | None) -> BaseException | None:
        """Claim and send chunk by chunk; once the store failed this tick, the rest
        fail closed at once. The store's error, if it failed."""
        for chunk in chunks:
            with deferred_signals():
                if failed is None:
                    failed = self.claim_and_send(chunk, now, producer)
                else:
                    self.repeats.note([plan for plan in chunk if not plan.catch_up])
                    self.claims_failed(chunk, now, failed)
        return failed

    def _decide_stale(self, now: datetime, producer: Any,
                      failed: BaseException | None) -> None:
        """The claims refused as stale, decided again under the revisions that govern
        their slots (twice at most), the rest skipped ``stale-revision``."""
        for _ in range(2):
            if not self._stale or self.redecide is None or failed is not None:
                break
            stale, self._stale = self._stale, []
            again = self.redecide(stale, now)
            if again:
                with deferred_signals():
                    failed = self.claim_and_send(again, now, producer)
        stale, self._stale = self._stale, []
        for plan in stale:
            self.sender.skip(plan, now, SkipReason.STALE_REVISION)

    # -- claims ------------------------------------------------------------------------

    def claims_failed(self, plans: Sequence[Plan], now: datetime, exc: BaseException) -> None:
        """The store failed: skip *plans* as claim-error (fail closed)."""
        self.outage.failed(exc, skipped=len(plans))
        for plan in plans:
            self.sender.skip(plan, now, SkipReason.CLAIM_ERROR)
        self.recovery.claims_failed(plans)

    def claim_and_send(self, plans: Sequence[Plan], now: datetime,
                       producer: Any) -> BaseException | None:
        """Claim *plans* and send the winners; the store's error when it failed."""
        requests = [plan.request for plan in plans if plan.request is not None]
        self.repeats.note([plan for plan in plans if not plan.catch_up])
        try:
            answers = self._store().claim_isolating(self.settings.node, requests)
        except Exception as exc:
            if not isinstance(exc, StoreError):  # a store bug: still fail closed, never die
                logger.exception("beat: the claim store raised %s, which is a bug; failing "
                                 "closed", type(exc).__name__)
            self.claims_failed(plans, now, exc)
            return exc
        self.recovery.claims_answered(after_outage=self.outage.since is not None)
        self.outage.recovered()
        results = {id(answer.request): answer for answer in answers}
        reports = []
        for plan in plans:
            result = results[id(plan.request)]
            if result.stale:  # a database entry changed: decided again (_decide_stale)
                self._stale.append(plan)
                continue
            if result.won:
                error = self.sender.send(plan, now, producer, occurrence=result.occurrence)
                if result.token and result.occurrence is not None:
                    reports.append(PublishReport(plan.entry.name, result.occurrence,
                                                 result.token, error))
            else:
                self._lost(plan, now, result)
        if reports:
            self._store().defer_report(reports)
            self.recovery.marks_deferred()
        return None

    def _lost(self, plan: Plan, now: datetime, result: ClaimResult) -> None:
        """Record a claim this node did not win, and why."""
        if result.refused is not None:
            self.sender.invalid(plan.entry, now, f"the claims database refused its claim "
                         f"({result.refused})", plan=plan)
            return
        if result.early:  # this node's clock ran ahead since its last measurement
            self.sender.skip(plan, now, SkipReason.CLOCK_FENCED, result)
            return
        if result.paused:
            self.sender.skip(plan, now, SkipReason.PAUSED, result, pause=result.pause)
        elif result.still_running:
            self.sender.skip(plan, now, SkipReason.STILL_RUNNING, result)
        else:
            self.sender.skip(plan, now, SkipReason.CLAIMED_ELSEWHERE, result)
        if result.request.kind is ClaimKind.WINDOW:
            self.recovery.reanchor(plan.entry, result.occurrence)

    def publish_takeovers(self, taken: Sequence[Takeover], schedule: Any,
                          producer: Any) -> None:
        """Publish the orphaned claims this node took over, under their task ids."""
        now = self._clock()
        reports = []
        self.sender.new_tick()
        with deferred_signals():
            for takeover in taken:
                entry = schedule.get(takeover.row.job)
                if entry is None:  # gone from the schedule since the look
                    continue
                plan = takeover_plan(entry, takeover.row)
                error = self.sender.send(plan, now, producer, occurrence=takeover.row.occurrence)
                reports.append(PublishReport(takeover.row.job, takeover.row.occurrence,
                                             takeover.token, error))
            self._store().defer_report(reports)
            self.recovery.flush_marks()
        if self.events is not None:
            self.events.end_tick()

    # -- one entry ------------------------------------------------------------------------

    def now_or_held(self, plan: Plan, replay: bool = False) -> bool:
        """True to claim *plan* now; False when its slot is jittered to a later time
        (it then waits in :attr:`jittered`). Replays of missed slots and takeovers are
        never held (a slot a restart found *waiting* for its jitter is no replay)."""
        occ = plan.occurrence
        if occ is None or occ.kind is not ClaimKind.SLOT or occ.slot is None or (
                plan.catch_up and not replay):
            return True
        jitter = self.rules.jitter(plan.entry)
        if jitter is None:
            return True
        plan.jitter = jitter_offset(plan.entry.name, occ.slot, jitter)
        at = occ.slot + plan.jitter
        if at <= self._clock():
            return True
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("beat: holding %s slot %s for its jitter (%s)", plan.entry.name,
                         iso(occ.slot), format_duration(plan.jitter, 0.001))
        self.jittered.hold(at, plan)
        return False

    def plan(self, entry: ScheduleEntry, next_due: float | None, now: datetime) -> Plan | None:
        """*entry*'s plan (:func:`.plan.plan_entry`), or None when it cannot be named (the
        entry is skipped as ``invalid-entry``)."""
        try:
            plan = plan_entry(entry, next_due, naming_time(entry, now),
                              self.settings.window_tolerance, self.rules.overlap(entry),
                              lead=self._lead)
            occ = plan.occurrence
            if occ is not None and outside_revision(entry, occ.slot,
                                                    occ.kind is ClaimKind.WINDOW, now):
                # a database entry's occurrence that another revision governs: not its own
                logger.debug("beat: %s: %s is governed by another revision", entry.name,
                             occ.label())
                return None
            return plan
        except ConfigurationError as exc:
            self.sender.invalid(entry, now, str(exc))
        except Exception as exc:
            self.sender.invalid(entry, now, f"its occurrence cannot be named ({exc}); fix the "
                         "entry's schedule or options", traceback=True)
        return None








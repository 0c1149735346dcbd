"""Sending one plan: publish it, or skip it, and record what became of it.

Every outcome of the tick goes through here: one log line beside beat's own (on
the logger ``celery_elarion_beat.scheduler``, :data:`.pipeline.LOGGER`), and one
:class:`~..observe.outcome.Record` for the recorder (and from there the events and
the counters). After the first publish of a tick that the broker refused (kombu
gave up reconnecting), the tick's other winners fail at once instead of each waiting
out ``task_publish_retry_policy`` again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery.beat import ScheduleEntry
from kombu.entity import Queue
from kombu.exceptions import OperationalError

from ..config.node_queue import refresh_queue_ttl
from ..config.placement import Placement
from ..config.settings import Settings
from ..observe.outcome import Outcome, Record, Recorder, SkipReason
from ..schedules.clock import Clock
from ..schedules.slots import iso
from ..store.control_records import Pause
from ..store.records import ClaimResult
from .plan import Plan, label, message, when_text

__all__ = ["LOGGER", "Sender"]

#: The logger of beat's outcome lines: the name the docs and earlier releases show
#: (``celery_elarion_beat.scheduler``), whichever module of :mod:`celery_elarion_beat.beat`
#: writes them.
LOGGER = "celery_elarion_beat.scheduler"

logger = logging.getLogger(LOGGER)


class Sender:
    """Publishes plans and records every outcome of one node (a test hook may
    subclass it through :attr:`.pipeline.ClaimPipeline.Sender`)."""

    def __init__(self, app: Any, settings: Settings, clock: Clock, recorder: Recorder,
                 node_queue: Callable[[], Queue]) -> None:
        self.app = app
        self.settings = settings
        self._clock = clock
        self.recorder = recorder
        self._node_queue = node_queue
        #: the broker error of this tick's first failed publish
        self.broker_down: OperationalError | None = None

    def new_tick(self) -> None:
        """Each tick tries the broker again, once."""
        self.broker_down = None

    def send(self, plan: Plan, now: datetime, producer: Any,
             occurrence: datetime | None) -> str | None:
        """Publish *plan*; None when the broker accepted it, else why not."""
        entry = plan.entry
        if logger.isEnabledFor(logging.INFO):  # the line is built only when it is written
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
            if self.broker_down is not None:
                raise OperationalError(f"not sent: the broker refused an earlier message of "
                                       f"this tick ({self.broker_down})")
            self.publish(plan, occurrence, producer)
        except Exception as exc:
            return self._publish_failed(plan, now, occurrence, exc)
        slot = plan.occurrence.slot if plan.occurrence is not None else None
        lateness = (self._clock() - slot).total_seconds() if slot is not None else None
        self.record(entry, plan.placement, now, Outcome.DISPATCHED, plan=plan,
                    occurrence=occurrence, winner=self.settings.node, lateness=lateness,
                    jitter=plan.jitter.total_seconds() if plan.jitter is not None else None)
        return None

    def _publish_failed(self, plan: Plan, now: datetime, occurrence: datetime | None,
                        exc: Exception) -> str:
        """Record a publish the broker refused; the first of a tick logs its traceback."""
        entry = plan.entry
        first = self.broker_down is None
        if first and isinstance(exc, OperationalError):
            self.broker_down = exc
        after = ("" if plan.placement is Placement.EVERY_NODE else
                 " after winning its claim; the claim is marked failed (an orphan: "
                 "retried by a live node with delivery at_least_once, else reported)")
        logger.error("beat: Message Error: could not send %s (%s)%s: %s", entry.name,
                     entry.task, after, exc,
                     exc_info=first, extra={"action": "publish-error",
                                           **self._log_fields(plan, occurrence),
                                           "task_id": plan.task_id})
        self.record(entry, plan.placement, now, Outcome.SKIPPED, plan=plan,
                    occurrence=occurrence, reason=SkipReason.PUBLISH_ERROR, detail=str(exc))
        return f"{type(exc).__name__}: {exc}"

    def publish(self, plan: Plan, occurrence: datetime | None, producer: Any) -> Any:
        """Hand *plan*'s message to the broker (every-node entries: to the node queue)."""
        queue = self._node_queue() if plan.placement is Placement.EVERY_NODE else None
        args, kwargs, options = message(plan, occurrence, self.settings.node, queue)
        task = self.app.tasks.get(plan.entry.task)
        if task is not None:
            result = task.apply_async(args, kwargs, producer=producer, **options)
        else:
            result = self.app.send_task(plan.entry.task, args, kwargs, producer=producer,
                                        **options)
        if queue is not None:
            refresh_queue_ttl(producer, queue, self.settings.node_queue_expires)
        return result

    def skip(self, plan: Plan, now: datetime, reason: SkipReason,
             result: ClaimResult | None = None, pause: Pause | None = None) -> None:
        """Record *plan* skipped for *reason*, with one log line saying why."""
        entry = plan.entry
        occurrence = result.occurrence if result else None
        winner = result.winner if result else None
        if logger.isEnabledFor(logging.INFO):  # the line is built only when it is written
            self._log_skip(plan, now, reason, result, pause)
        self.record(entry, plan.placement, now, Outcome.SKIPPED, plan=plan,
                    occurrence=occurrence, reason=reason, winner=winner)

    def _log_skip(self, plan: Plan, now: datetime, reason: SkipReason,
                  result: ClaimResult | None, pause: Pause | None) -> None:
        entry = plan.entry
        occurrence = result.occurrence if result else None
        winner = result.winner if result else None
        fields = {"action": "skipped", **self._log_fields(plan, occurrence),
                  "reason": reason.value, "winner": winner}
        when = when_text(plan, occurrence, now)
        if reason is SkipReason.CLAIMED_ELSEWHERE:
            logger.info("beat: Skipping %s at %s: %s (winner %s)", entry.name, when, reason,
                        winner or "unknown", extra=fields)
        elif reason is SkipReason.STILL_RUNNING:
            blocker = result.blocker if result else None
            logger.info("beat: Skipping %s at %s: %s (the run of %s has not finished; "
                        "decided by %s)", entry.name, when, reason,
                        iso(blocker) if blocker else "an earlier occurrence",
                        winner or "unknown", extra=fields)
        elif reason is SkipReason.PAUSED:
            logger.info("beat: Skipping %s at %s: %s (%s)", entry.name, when, reason,
                        pause.describe() if pause else "decided by " + (winner or "unknown"),
                        extra=fields)
        else:
            logger.info("beat: Skipping %s at %s: %s", entry.name, when, reason, extra=fields)

    def _log_fields(self, plan: Plan, occurrence: datetime | None) -> dict[str, Any]:
        """The ``extra`` of a log line about *plan*: the fields its event has, same names."""
        occ = plan.occurrence
        at = occurrence or (occ.slot if occ else None)
        return {"job": plan.entry.name, "node": self.settings.node,
                "cluster": self.settings.cluster,
                "placement": plan.placement.value, "claim": occ.kind.value if occ else None,
                "occurrence": iso(at) if at else None}

    def record(self, entry: ScheduleEntry, placement: Placement, now: datetime,
               outcome: Outcome, *, plan: Plan | None = None,
               occurrence: datetime | None = None, reason: SkipReason | None = None,
               winner: str | None = None, detail: str | None = None,
               lateness: float | None = None, jitter: float | None = None) -> None:
        """Add one outcome to the recorder (and so to the events and the counters)."""
        occ = plan.occurrence if plan else None
        self.recorder.add(Record(
            job=entry.name, task=entry.task, node=self.settings.node, outcome=outcome,
            placement=placement, at=now, kind=occ.kind if occ else None,
            occurrence=occurrence or (occ.slot if occ else None),
            task_id=plan.task_id if plan and outcome is Outcome.DISPATCHED else None,
            reason=reason, winner=winner, detail=detail,
            catch_up=plan.catch_up if plan else False, takeover=plan.takeover if plan else 0,
            lateness=lateness, jitter=jitter))

    def invalid(self, entry: ScheduleEntry, now: datetime, why: str, plan: Plan | None = None,
                traceback: bool = False) -> None:
        """Skip one broken entry (reason invalid-entry), saying why; its neighbours go on."""
        logger.error("beat: Skipping %r: %s", entry.name[:200], why, exc_info=traceback,
                     extra={"action": "invalid-entry", "job": entry.name,
                            "node": self.settings.node})
        self.record(entry, plan.placement if plan else Placement.CLUSTER, now,
                    Outcome.SKIPPED, plan=plan, reason=SkipReason.INVALID_ENTRY, detail=why)

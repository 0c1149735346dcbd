"""A beat cluster in one process: N ClaimingScheduler nodes, one store, one clock.

Each node is a real :class:`~celery_elarion_beat.ClaimingScheduler` over the
in-memory claims store; the nodes share a :class:`.BeatClock` that the schedules
read too, so time passes only when the test says so. Every message a node
publishes is recorded (:meth:`Cluster.sent`) and, by default, goes no further:
with ``deliver=True`` it is also published to the app's in-memory broker, where a
worker of the same app (``celery_worker``) consumes it.

:meth:`Cluster.run_until` lets time pass as beat would: each node wakes when its
last tick asked to, so 48 hours of a per-minute schedule cost a few thousand
ticks, not one per second.
"""

from __future__ import annotations

import logging
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from kombu.messaging import Producer

from ..beat.scheduler import ClaimingScheduler
from ..config.headers import (
    HEADER_CLAIM,
    HEADER_JOB,
    HEADER_NODE,
    HEADER_OCCURRENCE,
    HEADER_PLACEMENT,
)
from ..config.placement import Placement
from ..exceptions import ElarionBeatError
from ..schedules.slots import ClaimKind, is_slotted, name_occurrence, parse_iso
from ..store.memory import MemoryClaimStore
from ..store.records import RunReport
from ..store.states import SUCCEEDED
from .beat_app import beat_app
from .beat_clock import BeatClock, moment

__all__ = ["Cluster", "SimulatedOccurrence", "SimulationError"]

#: The shortest step time takes when a node asks to be woken "now" again and again.
MIN_STEP = timedelta(milliseconds=1)


def _to_millisecond(value: datetime) -> datetime:
    """*value* rounded to the nearest whole millisecond."""
    micro = value.microsecond
    rounded = value.replace(microsecond=micro - micro % 1000)
    return rounded + MIN_STEP if micro % 1000 >= 500 else rounded


class SimulationError(ElarionBeatError):
    """The simulated cluster did not settle (it woke more often than its cap allows)."""


@dataclass(frozen=True)
class SimulatedOccurrence:
    """One message a node of the cluster published.

    ``slot`` is the occurrence: the exact slot of a cron-like schedule, the claim's
    instant for an interval window; for an every-node entry (never claimed) the slot
    its schedule names at ``sent_at``, or ``sent_at`` for an interval. ``kind`` is the
    claim (``slot`` or ``window``); for every-node entries, the kind the schedule
    would claim. ``headers`` are the message's headers, ``elarion_*`` included.
    """

    job: str
    task: str
    slot: datetime
    node: str
    placement: Placement
    kind: ClaimKind
    sent_at: datetime
    task_id: str
    headers: dict[str, Any] = field(repr=False)
    args: tuple[Any, ...] = field(default=(), repr=False)
    kwargs: dict[str, Any] = field(default_factory=dict, repr=False)


class _Unless(logging.Filter):
    """Drops the records of one ``action``."""

    def __init__(self, action: str) -> None:
        super().__init__()
        self.action = action

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "action", None) != self.action


class _RecordingProducer(Producer):
    """A producer that records each publish, and passes it on only when delivering."""

    def __init__(self, channel: Any, cluster: Cluster, node: ClaimingScheduler,
                 deliver: bool) -> None:
        super().__init__(channel, auto_declare=False)  # type: ignore[no-untyped-call]
        self._cluster = cluster
        self._node = node
        self._deliver = deliver

    def publish(self, body: Any, routing_key: Any = None, *args: Any, **kwargs: Any) -> Any:
        self._cluster._record(self._node, body, dict(kwargs.get("headers") or {}))
        if self._deliver:
            return super().publish(  # type: ignore[no-untyped-call]
                body, routing_key, *args, **kwargs)
        return None


class Cluster:
    """*nodes* beat nodes of *app* (a copy of it: see :mod:`.beat_app`) over one
    memory store *namespace* and one *clock*, created at the clock's time.

    *names* are the nodes' names (``elarion_beat_node``; default ``node-0``,
    ``node-1``, ...). *deliver* also publishes each message to the app's in-memory broker (for a
    worker of the app to consume). *finish_runs* records, as a worker would, that
    each claimed occurrence ran at once and succeeded (for ``overlap`` options,
    which wait for the previous run to finish); leave it off when a real worker
    records the runs.
    """

    def __init__(self, app: Any, nodes: int = 3, clock: BeatClock | None = None, *,
                 namespace: str | None = None, deliver: bool = False,
                 names: list[str] | None = None, finish_runs: bool = False) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, not {nodes}")
        self.clock = clock or BeatClock()
        self._owns_namespace = namespace is None
        self.namespace = namespace or f"sim-{uuid.uuid4().hex}"
        self.app = beat_app(app, self.clock, self.namespace)
        self.deliver = deliver
        self.finish_runs = finish_runs
        self._connection = self.app.connection_for_write()
        self._sent: list[SimulatedOccurrence] = []
        self.nodes: list[ClaimingScheduler] = []
        self.wakeups = 0
        quiet = _Unless("store-scope")  # "memory:// coordinates this process only": meant
        scheduler_log = logging.getLogger(ClaimingScheduler.__module__)
        scheduler_log.addFilter(quiet)
        try:
            for name in names or [f"node-{i}" for i in range(nodes)]:
                self.app.conf.elarion_beat_node = name  # each node reads its settings once
                node = ClaimingScheduler(self.app, clock=self.clock, store=MemoryClaimStore(
                    self.namespace, clock=self.clock))
                node.producer = _RecordingProducer(self._connection, self, node, deliver)
                self.nodes.append(node)
        except BaseException:  # a bad setting or entry: beat would refuse to start too
            self.close()
            raise
        finally:
            scheduler_log.removeFilter(quiet)
        self._wake = [self.clock() for _ in self.nodes]

    # -- time ----------------------------------------------------------------------

    def tick(self) -> float:
        """Tick every node now (see :meth:`_order`); the seconds until the first of
        them wants to wake again."""
        now = self.clock()
        order = self._order()
        for i in order:
            self._tick(i, now)
        return min((wake - now).total_seconds() for wake in self._wake)

    def run_until(self, when: datetime | date | str, inclusive: bool = True,
                  max_wakeups: int = 1_000_000) -> None:
        """Let time pass until *when*: each node ticks when it asked to be woken, then
        the clock stands at *when*. A wake-up exactly at *when* happens only if
        *inclusive*. The nodes due at one instant tick in an order that depends on
        the instant (:meth:`_order`): which node wins a claim is no promise. Raises
        :class:`SimulationError` after *max_wakeups* ticks."""
        end = moment(when)
        budget = self.wakeups + max_wakeups
        while True:
            wake = min(self._wake)
            if wake > end or (wake == end and not inclusive):
                break
            if wake > self.clock():
                self.clock.set(wake)
            now = self.clock()
            for i in self._order():
                if self._wake[i] <= now:
                    self._tick(i, now)
            if self.wakeups > budget:
                raise SimulationError(
                    f"the simulated cluster woke {max_wakeups} times before "
                    f"{end.isoformat()} (now {now.isoformat()}): a schedule that is due "
                    "on every tick? Pass a larger max_wakeups for very long runs")
        if end > self.clock():
            self.clock.set(end)

    def advance(self, by: float | timedelta) -> None:
        """Let *by* seconds (or a timedelta) pass, the nodes waking as they ask."""
        step = by if isinstance(by, timedelta) else timedelta(seconds=by)
        self.run_until(self.clock() + step)

    def wake(self) -> None:
        """Wake every node at the next step, as a NOTIFY wakes beat: after a write of
        the database entries (live schedules) from outside the nodes."""
        now = self.clock()
        self._wake = [min(wake, now) for wake in self._wake]

    def _order(self) -> list[int]:
        """The nodes in the order they tick at this instant: a rotation chosen by a hash
        of the instant, so the winners vary (and a run repeats exactly)."""
        n = len(self.nodes)
        start = zlib.crc32(self.clock().isoformat().encode()) % n
        return [(start + k) % n for k in range(n)]

    def _tick(self, i: int, now: datetime) -> None:
        self.wakeups += 1
        delay = timedelta(seconds=max(0.0, float(self.nodes[i].tick())))
        # beat may ask to tick again at once; time still moves on in a simulation. Wake-ups
        # fall on whole milliseconds: beat's float seconds would land them a microsecond
        # off the slot, and interval windows would drift by that much each run
        self._wake[i] = _to_millisecond(now + max(delay, MIN_STEP))

    # -- messages ----------------------------------------------------------------------

    def sent(self) -> list[SimulatedOccurrence]:
        """What the nodes published since the last call, in order."""
        out, self._sent = self._sent, []
        return out

    def _record(self, node: ClaimingScheduler, body: Any, headers: dict[str, Any]) -> None:
        now = self.clock()
        job = str(headers.get(HEADER_JOB) or headers.get("task") or "")
        placement = Placement(headers.get(HEADER_PLACEMENT) or Placement.CLUSTER.value)
        claim = headers.get(HEADER_CLAIM)
        occurrence = headers.get(HEADER_OCCURRENCE)
        if occurrence:
            slot, kind = parse_iso(str(occurrence)), ClaimKind(claim or ClaimKind.SLOT.value)
        else:
            slot, kind = self._named(node, job, now)
        if self.finish_runs and occurrence and placement is Placement.CLUSTER:
            task_id = str(headers.get("id", ""))
            node.store.record_runs([
                RunReport(job, slot, task_id, RunReport.STARTED, "simulated",
                          node=node.settings.node),
                RunReport(job, slot, task_id, SUCCEEDED, "simulated", runtime=0.0,
                          node=node.settings.node)])
        args, kwargs = (body[0], body[1]) if isinstance(body, (tuple, list)) else ((), {})
        self._sent.append(SimulatedOccurrence(
            job=job, task=str(headers.get("task", "")), slot=slot,
            node=str(headers.get(HEADER_NODE) or node.settings.node), placement=placement,
            kind=kind, sent_at=now, task_id=str(headers.get("id", "")), headers=headers,
            args=tuple(args or ()), kwargs=dict(kwargs or {})))

    @staticmethod
    def _named(node: ClaimingScheduler, job: str, now: datetime) -> tuple[datetime, ClaimKind]:
        """An every-node occurrence, named as a claim would name it."""
        entry = node.schedule.get(job)
        if entry is not None and is_slotted(entry.schedule):
            occ = name_occurrence(job, entry.schedule, now, tolerance=0.0)
            if occ.slot is not None:
                return occ.slot, ClaimKind.SLOT
        return now, ClaimKind.WINDOW

    # -- the end -----------------------------------------------------------------------

    def close(self) -> None:
        """Close every node, the broker connection, and the store namespace if the
        cluster made it."""
        try:
            for node in self.nodes:
                node.close()
        finally:
            self._connection.release()
            if self._owns_namespace:
                MemoryClaimStore.reset(self.namespace)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

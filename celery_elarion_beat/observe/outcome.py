"""Outcomes: what happened to each due occurrence on this node.

Every due occurrence ends as one :class:`Record`: ``dispatched`` (this node sent
it) or ``skipped`` with a reason. The scheduler hands each record to its
:class:`Recorder`, which keeps the most recent ones and running counts, and
passes them on to listeners (events, metrics).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from ..config.placement import Placement
from ..schedules.slots import ClaimKind

__all__ = ["Outcome", "Record", "Recorder", "SkipReason"]

logger = logging.getLogger(__name__)


class Outcome(str, enum.Enum):
    DISPATCHED = "dispatched"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value


class SkipReason(str, enum.Enum):
    """Why a node did not send an occurrence."""

    #: another node (or this node, earlier) holds the claim
    CLAIMED_ELSEWHERE = "claimed-elsewhere"
    #: the claims database failed or timed out: fail closed
    CLAIM_ERROR = "claim-error"
    #: the job is paused (``elarion-beat pause``; decided once for the cluster: the
    #: occurrence is stored ``skipped``, ``paused``)
    PAUSED = "paused"
    #: the claim was won but the broker refused the message (the claim is marked
    #: ``failed``: an orphan that ``delivery: at_least_once`` retries, else reported)
    PUBLISH_ERROR = "publish-error"
    #: the entry itself is broken (bad placement, a schedule that cannot be named)
    INVALID_ENTRY = "invalid-entry"
    #: ``overlap: skip`` and the job's previous run is unfinished (decided once for
    #: the cluster: the occurrence is stored ``skipped``)
    STILL_RUNNING = "still-running"
    #: a database entry changed under the claim again and again: the claims database
    #: refused its revision each time (live schedules; rare, a storm of edits)
    STALE_REVISION = "stale-revision"
    #: this node's clock is not trusted: its offset to the database clock is unknown
    #: or beyond ``elarion_beat_max_clock_offset`` (the node claims nothing), or the
    #: claims database refused a claim for a slot that had not come on its clock
    CLOCK_FENCED = "clock-fenced"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Record:
    """One due occurrence's outcome on one node. Never holds task arguments."""

    job: str
    task: str
    node: str
    outcome: Outcome
    placement: Placement
    at: datetime
    kind: ClaimKind | None = None
    occurrence: datetime | None = None
    task_id: str | None = None
    reason: SkipReason | None = None
    winner: str | None = None
    detail: str | None = field(default=None, compare=False)
    #: a replay of a slot the cluster missed (:mod:`celery_elarion_beat.config.catch_up`)
    catch_up: bool = False
    #: the takeover count of an orphaned claim this node published (:mod:`..beat.orphans`)
    takeover: int = 0
    #: seconds from the slot to the broker accepting the message (sent exact slots)
    lateness: float | None = None
    #: a run an operator triggered (``elarion-beat trigger``)
    manual: bool = False
    #: the slot's deterministic publish delay, in seconds (``jitter`` option)
    jitter: float | None = None


Listener = Callable[[Record], None]


class Recorder:
    """Keeps the last *maxlen* records and counts per (job, outcome, reason)."""

    def __init__(self, maxlen: int = 1000, listeners: Iterable[Listener] = ()) -> None:
        self._lock = threading.Lock()
        self.recent: deque[Record] = deque(maxlen=maxlen)
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.listeners: list[Listener] = list(listeners)

    def add(self, record: Record) -> None:
        with self._lock:
            self.recent.append(record)
            self.counts[(record.job, record.outcome.value,
                         record.reason.value if record.reason else "")] += 1
        for listener in list(self.listeners):
            try:
                listener(record)
            except Exception:  # a broken listener never breaks the tick
                logger.exception("beat: outcome listener %r failed", listener)

    def total(self, outcome: Outcome, reason: SkipReason | None = None) -> int:
        with self._lock:
            return sum(n for (_, o, r), n in self.counts.items()
                       if o == outcome.value and (reason is None or r == reason.value))

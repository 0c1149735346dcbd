"""The claim store seam: a small interface with domain methods.

A backend answers one question for a batch of occurrences: "may this node send
them?" The scheduler never sees SQL, connections or driver exceptions; a
backend translates its driver's errors into :class:`~..exceptions.StoreError`.

A claim is won only by the call that inserts it. A row that already exists is a
loss even when it names this node and task id: it may be a second beat process
running under the same node name, which must not send the occurrence again. (A
backend that retries a call internally after a lost reply may recognise its own
row from that same call.)
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..clock import as_utc
from ..exceptions import ClaimRefused
from ..slots import ClaimKind
from .schema import UNPUBLISHED

__all__ = ["ClaimRequest", "ClaimResult", "ClaimRow", "ClaimStore", "JobLedger", "NodeState",
           "PublishReport", "Takeover", "storable"]


@dataclass(frozen=True)
class ClaimRequest:
    """Claim one occurrence of *job*: an exact *slot*, or a *window* ending now.

    A ``tracked`` claim is stored ``pending`` until its publish is reported; an
    untracked one (the purge election) publishes nothing and is never an orphan.
    """

    job: str
    kind: ClaimKind
    task_id: str
    slot: datetime | None = None
    window: timedelta | None = None
    tracked: bool = True

    @classmethod
    def for_slot(cls, job: str, slot: datetime, task_id: str) -> ClaimRequest:
        return cls(job, ClaimKind.SLOT, task_id, slot=as_utc(slot))

    @classmethod
    def for_window(cls, job: str, window: timedelta, task_id: str,
                   tracked: bool = True) -> ClaimRequest:
        return cls(job, ClaimKind.WINDOW, task_id, window=window, tracked=tracked)


@dataclass(frozen=True)
class ClaimResult:
    """The answer to one :class:`ClaimRequest`.

    ``occurrence`` is the claimed slot, or for a window the claim time on the
    store's clock. ``winner`` and ``winner_task_id`` name the node holding the
    claim (this node when ``won``; for a loss, the other node where known).
    ``refused`` says why the store refused this request's data (never won).
    ``token`` is the claim token of a won claim: its publish is reported with it.
    """

    request: ClaimRequest
    won: bool
    occurrence: datetime | None
    winner: str | None
    winner_task_id: str | None = None
    refused: str | None = None
    token: str | None = None


@dataclass(frozen=True)
class ClaimRow:
    """One row of the claims ledger (``node`` holds the claim: its taker after a takeover)."""

    job: str
    occurrence: datetime
    node: str
    task_id: str
    kind: str
    claimed_at: datetime
    state: str | None = None
    published_at: datetime | None = None
    publish_error: str | None = None
    takeovers: int = 0

    def orphaned(self, now: datetime, timeout: timedelta) -> bool:
        """Claimed (or taken over) *timeout* before *now* and still not published."""
        return self.state in UNPUBLISHED and now - self.claimed_at >= timeout


def storable(text: str, most: int = 2000) -> str:
    """*text* as any database stores it: no NUL, valid UTF-8, at most *most* characters
    (a publish error rides along with every claim until written: it must never be the
    reason a claim is refused)."""
    clean = text.replace("\x00", "").encode("utf-8", "backslashreplace").decode("utf-8")
    return clean[:most]


@dataclass(frozen=True)
class PublishReport:
    """What became of a won claim's message: accepted by the broker (``error`` None)
    or not. *token* is the claim's token: a report never touches a row that another
    call has taken over since."""

    job: str
    occurrence: datetime
    token: str
    error: str | None = None

    def __post_init__(self) -> None:
        # the error rides along with every claim until it is written: whatever the
        # exception said, it must be text every backend stores
        if self.error is not None:
            object.__setattr__(self, "error", storable(self.error))


@dataclass(frozen=True)
class Takeover:
    """An orphaned claim this node re-claimed: *row* as it is now (this node, one more
    takeover), *token* to report its publish with, *previous* the node that held it."""

    row: ClaimRow
    token: str
    previous: str


@dataclass(frozen=True)
class JobLedger:
    """What the ledger knows of one job: its oldest claim still kept, and the
    occurrences claimed within the range that was asked about."""

    first: datetime | None
    claimed: frozenset[datetime]


@dataclass(frozen=True)
class NodeState:
    """One beat node as its heartbeat describes it.

    ``entries`` maps each entry name to the digest of its normalized definition;
    ``counts`` maps ``(job, outcome, reason)`` to the node's counts since it started.
    ``started_at`` and ``last_seen`` are set by the store (its clock).
    """

    node: str
    boot_id: str
    version: str
    fingerprint: str
    entries: dict[str, str] = field(default_factory=dict)
    counts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    host: str = ""
    pid: int = 0
    started_at: datetime | None = None
    last_seen: datetime | None = None

    def is_live(self, now: datetime, timeout: timedelta) -> bool:
        """Seen within *timeout* before *now* (both on the store clock)."""
        return self.last_seen is not None and now - self.last_seen <= timeout


class ClaimStore(abc.ABC):
    """Where the nodes of a cluster claim occurrences."""

    #: Network round trips made so far (a memory store makes none).
    round_trips: int = 0
    #: Publish reports waiting to ride along with the next store call.
    _deferred: tuple[PublishReport, ...] = ()

    @abc.abstractmethod
    def ensure_schema(self) -> None:
        """Create the claims table if allowed, else check that it exists."""

    @abc.abstractmethod
    def claim(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim every request for *node* at once; results are in request order.

        Exact slots are won by exactly one node. A window is won only if no claim
        for its job exists within the window before now (the store's clock);
        concurrent window claims of one job are serialized.
        """

    def claim_isolating(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """:meth:`claim`, except that a request whose data the store refuses
        (:class:`ClaimRefused`) is answered ``refused`` and never takes its
        neighbours down: the batch is halved until the request at fault is alone,
        which costs about two extra calls per halving, only when a request is bad."""
        try:
            return self.claim(node, requests)
        except ClaimRefused as exc:
            if len(requests) <= 1:
                return [ClaimResult(r, False, None, None, refused=str(exc)) for r in requests]
        half = len(requests) // 2
        return (self.claim_isolating(node, requests[:half])
                + self.claim_isolating(node, requests[half:]))

    @abc.abstractmethod
    def report(self, reports: Sequence[PublishReport]) -> None:
        """Record now whether each won claim's message was published: ``published``
        (with ``published_at``) or ``failed`` (with ``publish_error``). A row that is
        no longer ``pending`` under the report's token is left alone."""

    def defer_report(self, reports: Sequence[PublishReport]) -> None:
        """Record *reports* with the next store call that can carry them (on
        PostgreSQL the next claim's round trip), or at :meth:`flush_reports`."""
        self._deferred = (*self._deferred, *reports)

    def flush_reports(self) -> int:
        """Write the deferred reports now, in one call; how many there were. They
        stay deferred if the call fails (reporting twice is harmless)."""
        reports = self._deferred
        if reports:
            self.report(reports)
            self._deferred = self._deferred[len(reports):]
        return len(reports)

    @property
    def deferred_reports(self) -> int:
        """How many publish reports wait to be written."""
        return len(self._deferred)

    @abc.abstractmethod
    def unpublished(self, within: timedelta,
                    limit: int = 1000) -> tuple[datetime, list[ClaimRow]]:
        """The store clock, and the claims still ``pending`` or ``failed`` that were
        claimed (or taken over) within *within* before it, oldest first."""

    @abc.abstractmethod
    def take_over(self, node: str, rows: Sequence[ClaimRow],
                  older_than: timedelta) -> list[Takeover]:
        """Re-claim, for *node*, each of *rows* that is still orphaned (unpublished
        for *older_than*), atomically: of several nodes taking one orphan over at
        once, exactly one gets it. Returns the rows this call took over."""

    @abc.abstractmethod
    def purge(self, older_than: timedelta, batch_size: int = 5000, dry_run: bool = False) -> int:
        """Delete claims made more than *older_than* ago, *batch_size* rows per
        transaction; return how many (with *dry_run*, count them only).

        The newest claim of every job is kept whatever its age: it says where the
        job stands (``status`` tells a missed slot from a job that runs rarely)."""

    @abc.abstractmethod
    def heartbeat(self, state: NodeState, retention: timedelta | None = None,
                  live_within: timedelta | None = None) -> tuple[datetime, list[NodeState]]:
        """Upsert this node's row; return the store clock and the rows of the nodes
        seen within *live_within* (all when None), without their counts, and with
        ``entries`` only where the fingerprint differs from this node's. Rows not
        seen for *retention* are deleted."""

    @abc.abstractmethod
    def clock(self) -> datetime:
        """The store clock, read in one short round trip (for skew measurement)."""

    @abc.abstractmethod
    def nodes(self) -> tuple[datetime, list[NodeState]]:
        """The store clock and every node's row."""

    @abc.abstractmethod
    def find_claims(self, job: str | None = None, node: str | None = None,
                    since: datetime | None = None, limit: int = 100) -> list[ClaimRow]:
        """The newest claims first, filtered by job, winning node and occurrence."""

    @abc.abstractmethod
    def latest_claims(self, jobs: Collection[str] | None = None,
                      before: datetime | None = None) -> dict[str, ClaimRow]:
        """The newest claim of every job (of each of *jobs*, when given), among the
        claims of occurrences up to *before* (all, when None)."""

    @abc.abstractmethod
    def job_ledger(self, ranges: Mapping[str, tuple[datetime, datetime]]) -> dict[str, JobLedger]:
        """For each job, its oldest claim, and its occurrences in ``[start, end]``."""

    @abc.abstractmethod
    def existing(self, keys: Iterable[tuple[str, datetime]]) -> set[tuple[str, datetime]]:
        """Which of the (job, occurrence) keys have a claim."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; the store may not be used afterwards."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for the beat banner and logs, with any password masked."""

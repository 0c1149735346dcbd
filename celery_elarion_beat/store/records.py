"""The claims ledger's records: what a store takes and returns (no SQLAlchemy).

A claim request names one occurrence (an exact slot or a window); its result says
who won. A row of the ledger follows the occurrence from its claim to its publish
(:class:`PublishReport`) and its run (:class:`RunReport`, written by the workers).
The words a row's ``state``, ``run_state`` and ``kind`` hold are :mod:`.states`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..config.overlap import OverlapRule
from ..schedules.clock import as_utc
from ..schedules.slots import ClaimKind
from .control_records import Pause, storable
from .states import (
    EVERY_NODE_KIND,
    MANUAL_KIND,
    PAUSED,
    PENDING,
    PUBLISHED,
    RETRIED,
    RUN_FAILED,
    RUNNING,
    SKIPPED,
    STILL_RUNNING,
    SUCCEEDED,
    UNFINISHED_RUNS,
    UNPUBLISHED,
)

__all__ = ["ClaimRequest", "ClaimResult", "ClaimRow", "DdlProgress", "JobLedger", "ManualClaim",
           "NodeRuns", "NodeState", "PublishReport", "PurgeProgress", "RunReport", "SchemaStep",
           "Takeover", "overlap_blocks", "storable"]


def overlap_blocks(rule: OverlapRule, row: ClaimRow, now: datetime) -> bool:
    """Whether *row* is a run of the job that keeps a new one from starting under
    *rule* (``overlap: skip``, :mod:`celery_elarion_beat.config.overlap`).

    A run is unfinished from its claim until a worker records its finish, for at
    most ``rule.timeout`` after its claim (its worker may have died). A claim still
    ``pending`` (being published) counts for at most ``rule.pending``; after that it
    is an orphan, which runs only if taken over (and then counts again)."""
    age = now - row.claimed_at
    if row.kind == EVERY_NODE_KIND or age >= rule.timeout:
        return False
    if row.state == PENDING:
        return age < rule.pending
    return row.state == PUBLISHED and (row.run_state is None
                                      or row.run_state in UNFINISHED_RUNS)


@dataclass(frozen=True)
class ClaimRequest:
    """Claim one occurrence of *job*: an exact *slot*, or a *window* ending now.

    A ``tracked`` claim is stored ``pending`` until its publish is reported; an
    untracked one (the purge election) publishes nothing and is never an orphan.
    With an *overlap* rule, a job whose previous run is unfinished is not claimed:
    the occurrence is stored ``skipped`` instead (every node then skips it).

    A claim of a database entry carries its *revision* (of the store's cluster's
    entries): the store refuses it, as ``stale``, unless that revision governs the
    occurrence (:func:`~.entry_records.governing`), and records it on the row.

    With a *lead*, the claim of an exact slot that is more than *lead* ahead of the
    store's clock is refused, as ``early``: the claiming node's clock runs ahead of
    the cluster's, and the slot has not come (nothing is written).
    """

    job: str
    kind: ClaimKind
    task_id: str
    slot: datetime | None = None
    window: timedelta | None = None
    tracked: bool = True
    overlap: OverlapRule | None = None
    revision: int | None = None
    lead: timedelta | None = None

    @classmethod
    def for_slot(cls, job: str, slot: datetime, task_id: str,
                 overlap: OverlapRule | None = None, revision: int | None = None,
                 lead: timedelta | None = None) -> ClaimRequest:
        return cls(job, ClaimKind.SLOT, task_id, slot=as_utc(slot), overlap=overlap,
                   revision=revision, lead=lead)

    @classmethod
    def for_window(cls, job: str, window: timedelta, task_id: str,
                   tracked: bool = True, overlap: OverlapRule | None = None,
                   revision: int | None = None) -> ClaimRequest:
        return cls(job, ClaimKind.WINDOW, task_id, window=window, tracked=tracked,
                   overlap=overlap, revision=revision)

    def too_early(self, now: datetime) -> bool:
        """Whether this is an exact slot more than its *lead* ahead of *now* (the
        store's clock)."""
        return (self.lead is not None and self.slot is not None
                and self.kind is ClaimKind.SLOT and self.slot - now > self.lead)

    def decided(self, pause: Pause | None, blocker: datetime | None) -> tuple[str | None,
                                                                              str | None]:
        """The ``state`` and ``publish_error`` of this request's new row: ``skipped``
        when its job is paused or its previous run unfinished, else ``pending`` (tracked)."""
        if pause is not None and self.tracked:
            return SKIPPED, PAUSED
        if blocker is not None:
            return SKIPPED, STILL_RUNNING
        return (PENDING if self.tracked else None), None


@dataclass(frozen=True)
class ClaimResult:
    """The answer to one :class:`ClaimRequest`.

    ``occurrence`` is the claimed slot, or for a window the claim time on the
    store's clock. ``winner`` and ``winner_task_id`` name the node holding the
    claim (this node when ``won``; for a loss, the other node where known).
    ``refused`` says why the store refused this request's data (never won).
    ``token`` is the claim token of a won claim: its publish is reported with it.
    ``still_running`` is set when the occurrence was decided ``skipped`` because
    the job's previous run was unfinished (by this call, or by ``winner``'s);
    ``blocker`` is then that run's occurrence, where known. ``paused`` is set when
    it was decided ``skipped`` because its job was paused; ``pause`` is then the
    pause, where it is still there. ``stale`` is set when the request's revision does
    not govern the occurrence (a database entry changed since the node read it):
    nothing was written, the node loads the change and decides the slot again.
    ``early`` is set when the request's slot had not come on the store's clock
    (see :attr:`ClaimRequest.lead`): nothing was written.
    """

    request: ClaimRequest
    won: bool
    occurrence: datetime | None
    winner: str | None
    winner_task_id: str | None = None
    refused: str | None = None
    token: str | None = None
    still_running: bool = False
    blocker: datetime | None = None
    paused: bool = False
    pause: Pause | None = None
    stale: bool = False
    early: bool = False

    @classmethod
    def refused_early(cls, request: ClaimRequest) -> ClaimResult:
        """The answer to a slot request made before its slot came on the store's clock."""
        return cls(request, False, request.slot, None, early=True)

    @classmethod
    def refused_stale(cls, request: ClaimRequest) -> ClaimResult:
        """The answer to a request whose revision does not govern its occurrence."""
        return cls(request, False, request.slot, None, stale=True)

    @classmethod
    def skipped(cls, request: ClaimRequest, occurrence: datetime | None, winner: str | None,
                task_id: str | None, why: str | None, blocker: datetime | None = None,
                pause: Pause | None = None) -> ClaimResult:
        """The answer for an occurrence stored ``skipped`` (*why*: its ``publish_error``)."""
        paused = why == PAUSED
        return cls(request, False, occurrence, winner, task_id, still_running=not paused,
                   blocker=None if paused else blocker, paused=paused,
                   pause=pause if paused else None)


@dataclass(frozen=True)
class ManualClaim:
    """The answer to :meth:`ClaimStore.claim_manual`: ``row`` is the run's new claim
    (``token`` reports its publish), or None when *duplicate*, a manual run of the job
    triggered within the trigger window, was found instead."""

    row: ClaimRow | None
    token: str | None
    duplicate: ClaimRow | None = None


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
    run_state: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    worker: str | None = None
    runtime: float | None = None
    run_error: str | None = None
    #: the cluster (``elarion_beat_cluster``) the row belongs to
    cluster: str = ""
    #: the revision of the database entry it ran under (None: a code entry)
    revision: int | None = None
    #: when the cluster last reported it orphaned (None: never); see :attr:`orphan_reported`
    orphan_reported_at: datetime | None = None

    def orphaned(self, now: datetime, timeout: timedelta) -> bool:
        """Claimed (or taken over) *timeout* before *now* and still not published (a
        triggered run never is: its publish was reported to the operator)."""
        return (self.state in UNPUBLISHED and self.kind != MANUAL_KIND
                and now - self.claimed_at >= timeout)

    @property
    def orphan_reported(self) -> bool:
        """Whether the cluster reported this claim orphaned: since it was claimed, or
        taken over (a takeover makes a claim of its own, reported again if orphaned)."""
        return self.orphan_reported_at is not None and self.orphan_reported_at >= self.claimed_at

    @property
    def lateness(self) -> float | None:
        """Seconds from the slot to the broker accepting its message (slots only:
        a window's occurrence is its claim time)."""
        if self.published_at is None or self.kind != ClaimKind.SLOT.value:
            return None
        return (self.published_at - self.occurrence).total_seconds()

    def status(self, now: datetime, publish_timeout: timedelta) -> str:
        """One word for where the occurrence stands: ``skipped``, ``pending``,
        ``orphaned``, ``published`` (not started yet), or its run state."""
        if self.run_state is not None:
            return self.run_state
        if self.state == SKIPPED:
            return SKIPPED
        if self.orphaned(now, publish_timeout):
            return "orphaned"
        return self.state or PUBLISHED  # rows of 0.1 knew no state: they were sent


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
class RunReport:
    """A worker's record of one transition of a run: ``started``, or finished as
    ``succeeded``, ``failed`` or ``retried`` (:data:`~.states.RUN_FAILED` ...).

    The run is the claim row ``(job, occurrence)`` with *task_id*; for an
    every-node run (*every_node*) the worker writes a row of its own, of kind
    ``node``, for beat node *node*. *age* is how many seconds ago the transition
    happened (the write may lag it): the store stamps it on its own clock, minus
    the age. *runtime* is the worker's measure, start to finish.
    """

    job: str
    occurrence: datetime
    task_id: str
    event: str
    worker: str
    age: float = 0.0
    runtime: float | None = None
    error: str | None = None
    node: str = ""
    every_node: bool = False

    STARTED = "started"
    EVENTS = ("started", SUCCEEDED, RUN_FAILED, RETRIED)

    def __post_init__(self) -> None:
        if self.event not in self.EVENTS:
            raise ValueError(f"a run event is one of {', '.join(self.EVENTS)}, "
                             f"not {self.event!r}")
        if self.error is not None:
            object.__setattr__(self, "error", storable(self.error))

    @property
    def span(self) -> tuple[datetime, datetime]:
        """Where the row's occurrence lies: the headers name it to the second (a
        window's claim time has microseconds), so the row is the one of this task id
        within that second."""
        start = as_utc(self.occurrence).replace(microsecond=0)
        return start, start + timedelta(seconds=1)

    @property
    def run_state(self) -> str:
        """The ``run_state`` this transition leaves the row in."""
        return RUNNING if self.event == self.STARTED else self.event


@dataclass(frozen=True)
class Takeover:
    """An orphaned claim this node re-claimed: *row* as it is now (this node, one more
    takeover), *token* to report its publish with, *previous* the node that held it."""

    row: ClaimRow
    token: str
    previous: str


@dataclass(frozen=True)
class PurgeProgress:
    """Where one purge pass stands after a stretch of it (:meth:`ClaimStore.purge_pass`).

    *cutoff* (store clock) is fixed when the pass starts: a pass continued at a later
    tick deletes what was due then, never more. *deleted* counts the claims this
    stretch deleted, *total* the whole pass so far; *dropped* names the day
    partitions this stretch dropped (partitioned layout). *done*: nothing is left.
    """

    cutoff: datetime
    deleted: int
    total: int
    done: bool
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True)
class SchemaStep:
    """One change that brings a table of an older version up to date
    (:meth:`ClaimStore.create_schema`, ``init-db``): the *number*-th of *total*, its
    DDL *statement*. On a big table one may take a while."""

    number: int
    total: int
    statement: str


@dataclass(frozen=True)
class DdlProgress:
    """How far the schema change in hand got, as the database reports it
    (PostgreSQL building an index: the table's blocks scanned, then the tuples
    loaded): its *phase*, *done* of *total* *unit* (0 of 0 when it does not count)."""

    phase: str
    done: int
    total: int
    unit: str


@dataclass(frozen=True)
class JobLedger:
    """What the ledger knows of one job: its oldest claim still kept, and the
    occurrences claimed within the range that was asked about."""

    first: datetime | None
    claimed: frozenset[datetime]


@dataclass(frozen=True)
class NodeRuns:
    """The every-node runs the workers recorded (rows of kind ``node``), per job and
    beat node (:meth:`~.interface.Runs.node_runs`).

    ``runs`` counts each (job, node)'s runs since the time asked for that job;
    ``last`` is the start of each (job, node)'s newest run since the tracking horizon.
    A node is *tracked* once a worker of it (``install_worker``) recorded a run within
    that horizon: only those workers write these rows.
    """

    runs: dict[tuple[str, str], int] = field(default_factory=dict)
    last: dict[tuple[str, str], datetime] = field(default_factory=dict)

    @property
    def tracked(self) -> frozenset[str]:
        """The nodes whose workers recorded a run within the horizon."""
        return frozenset(node for _, node in self.last)


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
    #: its cluster, set by the store; ``''``: a node of a version before clusters (0.2)
    #: heartbeating into a table that has the column (see :mod:`.clusters`)
    cluster: str = ""
    #: the version of the database entries the node runs (None: it runs none)
    entries_version: int | None = None

    def is_live(self, now: datetime, timeout: timedelta) -> bool:
        """Seen within *timeout* before *now* (both on the store clock)."""
        return self.last_seen is not None and now - self.last_seen <= timeout

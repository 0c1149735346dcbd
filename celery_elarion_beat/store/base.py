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
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..clock import as_utc, iso_utc
from ..exceptions import ClaimRefused
from ..slots import ClaimKind
from .oneoff_rows import LeasedOneOff, NewOneOff, OneOff, OneOffState
from .schema import (
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

__all__ = ["ALL_JOBS", "AuditEntry", "ClaimRequest", "ClaimResult", "ClaimRow", "ClaimStore",
           "JobLedger", "LeasedOneOff", "ManualClaim", "NewOneOff", "NodeState", "OneOff",
           "OneOffState", "OneOffWakeups", "OverlapRule", "Pause", "PublishReport",
           "PurgeProgress", "RunReport", "Takeover", "pauses_in_force", "storable"]

#: The job name of a pause of every job (``elarion-beat pause --all``): no job has it.
ALL_JOBS = ""


@dataclass(frozen=True)
class Pause:
    """A job paused cluster-wide (:data:`ALL_JOBS`: every job), by whom, why, until when
    (None: until resumed). Times are on the database clock."""

    job: str
    paused_at: datetime
    paused_by: str
    reason: str = ""
    until: datetime | None = None

    @property
    def all_jobs(self) -> bool:
        return self.job == ALL_JOBS

    def active(self, now: datetime) -> bool:
        """Not expired at *now* (database clock)."""
        return self.until is None or self.until > now

    def covers(self, job: str) -> bool:
        return self.all_jobs or self.job == job

    def describe(self) -> str:
        """``paused by alice@host (cli) until 2026-12-01T06:00:00Z: db migration``."""
        text = f"paused by {self.paused_by}"
        if self.until is not None:
            text += f" until {self.until.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        return text + (f": {self.reason}" if self.reason else "")

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "all_jobs": self.all_jobs,
                "paused_at": iso_utc(self.paused_at), "paused_by": self.paused_by,
                "reason": self.reason, "until": iso_utc(self.until)}


def pauses_in_force(pauses: Iterable[Pause], jobs: Iterable[str]) -> dict[str, Pause]:
    """Each of *jobs* that *pauses* hold, with the pause that holds it: its own pause,
    else the pause of every job."""
    found = list(pauses)
    every = next((p for p in found if p.all_jobs), None)
    own = {p.job: p for p in found if not p.all_jobs}
    held = {job: own.get(job) or every for job in jobs}
    return {job: pause for job, pause in held.items() if pause is not None}


@dataclass(frozen=True)
class AuditEntry:
    """One operator action: ``pause``, ``resume`` or ``trigger`` of *job* (:data:`ALL_JOBS`:
    every job), by *actor*, at *at* (database clock)."""

    at: datetime
    actor: str
    action: str
    job: str
    reason: str = ""
    until: datetime | None = None
    task_id: str | None = None
    detail: str = ""

    PAUSE = "pause"
    RESUME = "resume"
    TRIGGER = "trigger"

    def as_dict(self) -> dict[str, Any]:
        return {"at": iso_utc(self.at), "actor": self.actor, "action": self.action,
                "job": self.job, "all_jobs": self.job == ALL_JOBS, "reason": self.reason,
                "until": iso_utc(self.until), "task_id": self.task_id, "detail": self.detail}



@dataclass(frozen=True)
class OverlapRule:
    """``overlap: skip``: do not claim while the job's previous run is unfinished.

    A run is unfinished from its claim until a worker records its finish, for at
    most *timeout* after its claim (its worker may have died). A claim still
    ``pending`` (being published) counts for at most *pending*; after that it is
    an orphan, which runs only if taken over (and then counts again).
    """

    timeout: timedelta
    pending: timedelta

    def blocks(self, row: ClaimRow, now: datetime) -> bool:
        """Whether *row* is a run of the job that keeps a new one from starting."""
        age = now - row.claimed_at
        if row.kind == EVERY_NODE_KIND or age >= self.timeout:
            return False
        if row.state == PENDING:
            return age < self.pending
        return row.state == PUBLISHED and (row.run_state is None
                                          or row.run_state in UNFINISHED_RUNS)


@dataclass(frozen=True)
class ClaimRequest:
    """Claim one occurrence of *job*: an exact *slot*, or a *window* ending now.

    A ``tracked`` claim is stored ``pending`` until its publish is reported; an
    untracked one (the purge election) publishes nothing and is never an orphan.
    With an *overlap* rule, a job whose previous run is unfinished is not claimed:
    the occurrence is stored ``skipped`` instead (every node then skips it).
    """

    job: str
    kind: ClaimKind
    task_id: str
    slot: datetime | None = None
    window: timedelta | None = None
    tracked: bool = True
    overlap: OverlapRule | None = None

    @classmethod
    def for_slot(cls, job: str, slot: datetime, task_id: str,
                 overlap: OverlapRule | None = None) -> ClaimRequest:
        return cls(job, ClaimKind.SLOT, task_id, slot=as_utc(slot), overlap=overlap)

    @classmethod
    def for_window(cls, job: str, window: timedelta, task_id: str,
                   tracked: bool = True, overlap: OverlapRule | None = None) -> ClaimRequest:
        return cls(job, ClaimKind.WINDOW, task_id, window=window, tracked=tracked,
                   overlap=overlap)

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
    pause, where it is still there.
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

    def orphaned(self, now: datetime, timeout: timedelta) -> bool:
        """Claimed (or taken over) *timeout* before *now* and still not published (a
        triggered run never is: its publish was reported to the operator)."""
        return (self.state in UNPUBLISHED and self.kind != MANUAL_KIND
                and now - self.claimed_at >= timeout)

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
class RunReport:
    """A worker's record of one transition of a run: ``started``, or finished as
    ``succeeded``, ``failed`` or ``retried`` (:data:`~.schema.RUN_FAILED` ...).

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


class OneOffWakeups(abc.ABC):
    """Tells the runner, without blocking, that one-offs were scheduled since it last asked."""

    @abc.abstractmethod
    def poll(self) -> bool | None:
        """Whether a one-off was scheduled since the last poll: True also just after
        the listener (re)connected (it may have missed some); None when it cannot tell
        (not connected: the caller polls the table instead)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop listening."""


class ClaimStore(abc.ABC):
    """Where the nodes of a cluster claim occurrences."""

    #: Network round trips made so far (a memory store makes none).
    round_trips: int = 0
    #: Whether other processes write to this store (one-offs may appear at any time, so
    #: beat polls for them; the memory store is this process's alone).
    shared: bool = True
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
    def record_runs(self, reports: Sequence[RunReport]) -> None:
        """Record what the workers saw of the runs: one statement per kind of
        transition. A start marks a claim still ``pending`` or ``failed`` as
        ``published`` (the worker got the message). An every-node run gets a row of
        its own. A report whose claim row is gone (purged) is dropped."""

    # -- live control --------------------------------------------------------

    @abc.abstractmethod
    def pause(self, job: str, actor: str, reason: str = "",
              until: datetime | None = None) -> Pause:
        """Pause *job* (:data:`ALL_JOBS`: every job) for the whole cluster, replacing any
        pause of it, stamped with the store clock; with an audit row, in one transaction.
        Every claim of the job is then stored ``skipped`` (``paused``) until it is
        resumed or *until* has passed."""

    @abc.abstractmethod
    def resume(self, job: str, actor: str) -> Pause | None:
        """Lift the pause of *job* (:data:`ALL_JOBS`: the pause of every job); the pause
        lifted, with an audit row, or None when it was not paused (nothing written)."""

    @abc.abstractmethod
    def pauses(self, jobs: Collection[str] | None = None) -> tuple[datetime, list[Pause]]:
        """The store clock and the pauses in force: of *jobs* and of every job (all
        pauses when None)."""

    @abc.abstractmethod
    def claim_manual(self, job: str, node: str, task_id: str, actor: str,
                     window: timedelta | None, reason: str = "") -> ManualClaim:
        """Record a run of *job* an operator triggered: a ``pending`` claim of kind
        ``manual`` at the store clock, and an audit row, in one transaction. Unless
        *window* is None (``--force``), a manual run of the job claimed within *window*
        and not ``failed`` is answered instead (as ``duplicate``), and nothing is
        written; concurrent calls for one job are serialized."""

    @abc.abstractmethod
    def audit(self, job: str | None = None, since: datetime | None = None,
              limit: int = 100) -> list[AuditEntry]:
        """The operator actions, newest first: of *job* when given, since *since*."""

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

    def purge_pass(self, older_than: timedelta, batch_size: int = 5000,
                   budget: float | None = None, resume: PurgeProgress | None = None,
                   monotonic: Callable[[], float] = time.monotonic) -> PurgeProgress:
        """A stretch of a purge pass: what :meth:`purge` deletes, stopped once *budget*
        seconds (of *monotonic*) are spent, checked after each batch (so a stretch
        deletes at least one batch). Continue with *resume*, the progress returned,
        until it is ``done``; the cutoff stays the one of the pass's start. Without a
        budget the pass runs to the end. (This default suits a store whose purge is
        quick: it purges in one go.)"""
        cutoff = resume.cutoff if resume is not None else self.clock() - older_than
        deleted = self.purge(older_than, batch_size=batch_size)
        return PurgeProgress(cutoff, deleted, deleted + (resume.total if resume else 0), True)

    def ensure_partitions(self, now: datetime | None = None) -> list[str]:
        """Create the partitions of the claims table the coming days need, if its
        layout has any (none by default): the UTC day of *now* (the store clock when
        None) and the ``elarion_beat_partitions_ahead`` days after. Cheap when called
        again on the same day. Returns the names of the partitions created."""
        return []

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

    # -- one-offs (schedule_once; see .oneoff_rows) -----------------------------

    @abc.abstractmethod
    def add_one_off(self, new: NewOneOff, connection: Any = None) -> OneOff:
        """Write *new* (``scheduled``), stamped with the store clock; with a key that a
        row has already, that row instead (whatever its state), and nothing written.
        *connection* (SQL stores): the caller's connection, inside its transaction."""

    @abc.abstractmethod
    def lease_one_offs(self, node: str, *, limit: int, lease: timedelta) -> list[LeasedOneOff]:
        """Lease up to *limit* one-offs for *node*, oldest due first: the ``scheduled``
        ones due by the store clock, and the ``leased`` ones whose lease expired
        (takeover). Each becomes ``leased`` by *node* until now + *lease*, attempts + 1.
        Concurrent calls never lease one row twice and never wait for each other."""

    @abc.abstractmethod
    def finish_one_offs(self, node: str, published: Sequence[str], failed: Mapping[str, str],
                        released: Sequence[str] = ()) -> None:
        """Record what became of one-offs *node* leased: ``published``, ``failed``
        (id -> error) or *released* (back to ``scheduled``: retried later). Only rows
        still ``leased`` by *node* change: a lease taken over since is left alone."""

    @abc.abstractmethod
    def cancel_one_off(self, id_or_key: str) -> OneOff | None:
        """Cancel the one-off of this id or key if it is still ``scheduled``; the row
        as it is afterwards (``cancelled`` if this call or an earlier one won), None
        when there is none. A cancel and a lease of one row have one winner."""

    @abc.abstractmethod
    def one_offs(self, *, id_or_key: str | None = None,
                 states: Collection[OneOffState] | None = None,
                 limit: int = 100, order: str = "-due") -> list[OneOff]:
        """One-offs: the one of *id_or_key*, or those in *states* (all when None), in
        *order*: ``-due`` latest due first, ``due`` soonest due first, ``-finished``
        latest published/failed/cancelled first, ``finished`` (then by id)."""

    @abc.abstractmethod
    def next_one_off_due(self) -> datetime | None:
        """When a one-off may next be leasable (store clock): the earliest due of the
        ``scheduled`` rows, or the earliest lease expiry when sooner; None: none."""

    @abc.abstractmethod
    def purge_one_offs(self, older_than: timedelta, batch_size: int = 5000) -> int:
        """Delete the one-offs published, failed or cancelled more than *older_than*
        ago (store clock); how many."""

    def one_off_wakeups(self) -> OneOffWakeups | None:
        """A listener told when a one-off is scheduled (PostgreSQL NOTIFY), or None:
        the runner polls :meth:`next_one_off_due` instead."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; the store may not be used afterwards."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for the beat banner and logs, with any password masked."""

"""The claim store seam: role interfaces with domain methods, and the store that has them all.

A backend answers one question for a batch of occurrences: "may this node send
them?" The scheduler never sees SQL, connections or driver exceptions; a
backend translates its driver's errors into :class:`~celery_elarion_beat.exceptions.StoreError`.

A claim is won only by the call that inserts it. A row that already exists is a
loss even when it names this node and task id: it may be a second beat process
running under the same node name, which must not send the occurrence again. (A
backend that retries a call internally after a lost reply may recognise its own
row from that same call.)

The seam is cut by role, each an interface of its own:

==================  =======================================================
:class:`Claims`     claim occurrences, report their publish, find and purge
                    claims, take orphans over (the beat tick, recovery)
:class:`Runs`       record what the workers saw of each run (the worker)
:class:`Control`    pause, resume, trigger, audit (operators, every claim)
:class:`Nodes`      heartbeats and the node list (maintenance, status)
:class:`OneOffs`    durable one-offs: add, lease, finish, cancel, list
:class:`ForeignBeats`  senders of beat messages that claim nothing, as the
                    workers saw them (the workers write, ``status`` reads)
:class:`LiveEntries` database entries (live schedules): write, snapshot,
                    changes since a version, the version, the history
==================  =======================================================

Every backend implements them all in one class, :class:`ClaimStore` (they share
one connection pool and one transaction per call); code that needs one role is
typed against that role.

A store is bound to one cluster (``elarion_beat_cluster``, :attr:`Store.cluster`):
every row it writes names it, every query reads only its rows, so several apps may
share one set of tables (:mod:`.clusters`).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ..config.settings import DEFAULT_CLUSTER
from ..exceptions import ClaimRefused
from .clusters import ClusterCensus
from .control_records import AuditEntry, Pause
from .entry_records import EntryChange, EntryChanges, EntryRevision, EntrySnapshot, EntryWrite
from .foreign_records import ForeignBeat, ForeignSighting
from .one_off_records import LeasedOneOff, NewOneOff, OneOff, OneOffState
from .records import (
    ClaimRequest,
    ClaimResult,
    ClaimRow,
    DdlProgress,
    JobLedger,
    ManualClaim,
    NodeRuns,
    NodeState,
    PublishReport,
    PurgeProgress,
    RunReport,
    SchemaStep,
    Takeover,
)

__all__ = ["ClaimStore", "Claims", "Control", "ForeignBeats", "LiveEntries", "Nodes",
           "OneOffWakeups", "OneOffs", "Runs", "Store", "Wakeups"]


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

    #: Whether every change is told (in-process): then nothing is polled besides.
    reliable: bool = False

    def fileno(self) -> int | None:
        """The socket a notification arrives on (to wait for it), or None."""
        return None


#: Any listener of that shape (the database entries' too).
Wakeups = OneOffWakeups


class Store(abc.ABC):
    """What every role shares: the store clock, and the connection's round trips."""

    #: Network round trips made so far (a memory store makes none).
    round_trips: int = 0
    #: The cluster (``elarion_beat_cluster``) whose rows this store writes and reads.
    cluster: str = DEFAULT_CLUSTER
    #: Whether other processes write to this store (one-offs may appear at any time, so
    #: beat polls for them; the memory store is this process's alone).
    shared: bool = True

    @abc.abstractmethod
    def clock(self) -> datetime:
        """The store clock, read in one short round trip (for skew measurement)."""


class Claims(Store):
    """The claims ledger: one row per occurrence claimed, from its claim to its publish."""

    #: Publish reports waiting to ride along with the next store call.
    _deferred: tuple[PublishReport, ...] = ()

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
    def mark_orphans_reported(self, rows: Sequence[ClaimRow]) -> list[ClaimRow]:
        """Mark each of *rows* (orphans, as read by :meth:`unpublished`) reported
        (``orphan_reported_at``: the store clock), if it still is that claim (not taken
        over since), still unpublished and not marked since it was claimed or taken
        over (:attr:`ClaimRow.orphan_reported`), atomically: of several nodes marking
        one orphan at once, exactly one does. Returns the rows this call marked, as they
        are now: the caller reports those, so the cluster reports each orphan once."""

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

    def estimate_purge(self, older_than: timedelta) -> int:
        """About how many claims :meth:`purge` would delete now, read quickly (a
        progress line's total, ``elarion-beat purge``): at most one claim per job more
        than it deletes (it keeps each job's newest). This default counts exactly."""
        return self.purge(older_than, dry_run=True)

    def ensure_partitions(self, now: datetime | None = None) -> list[str]:
        """Create the partitions of the claims table the coming days need, if its
        layout has any (none by default): the UTC day of *now* (the store clock when
        None) and the ``elarion_beat_partitions_ahead`` days after. Cheap when called
        again on the same day. Returns the names of the partitions created."""
        return []


class Runs(Store):
    """What the workers saw of each run, written on the run's claim row."""

    @abc.abstractmethod
    def record_runs(self, reports: Sequence[RunReport]) -> None:
        """Record what the workers saw of the runs: one statement per kind of
        transition. A start marks a claim still ``pending`` or ``failed`` as
        ``published`` (the worker got the message). An every-node run gets a row of
        its own. A report whose claim row is gone (purged) is dropped."""

    @abc.abstractmethod
    def node_runs(self, since: Mapping[str, datetime], tracked_since: datetime) -> NodeRuns:
        """The every-node runs (rows of kind ``node``) of the jobs of *since*, per job and
        beat node: how many started at or after the job's time in *since*, and when the
        newest started at or after *tracked_since* (which nodes' workers record runs of
        these jobs). One transaction; the rows are found by key (job, occurrence)."""


class Control(Store):
    """Live control: pauses read inside every claim, manual runs, and the audit."""

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


class Nodes(Store):
    """Beat nodes as their heartbeats describe them."""

    @abc.abstractmethod
    def heartbeat(self, state: NodeState, retention: timedelta | None = None,
                  live_within: timedelta | None = None) -> tuple[datetime, list[NodeState]]:
        """Upsert this node's row; return the store clock and the rows of the nodes
        seen within *live_within* (all when None), without their counts, and with
        ``entries`` only where the fingerprint differs from this node's. Rows not
        seen for *retention* are deleted."""

    @abc.abstractmethod
    def nodes(self) -> tuple[datetime, list[NodeState]]:
        """The store clock and every node's row."""


class OneOffs(Store):
    """Durable one-offs (``schedule_once``): rows leased by the beat nodes at their due time."""

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
    def purge_one_offs(self, older_than: timedelta, batch_size: int = 5000,
                       dry_run: bool = False) -> int:
        """Delete the one-offs published, failed or cancelled more than *older_than*
        ago (store clock), *batch_size* rows per transaction; how many (with *dry_run*,
        count them only)."""

    def purge_one_offs_pass(self, older_than: timedelta, batch_size: int = 5000,
                            budget: float | None = None, resume: PurgeProgress | None = None,
                            monotonic: Callable[[], float] = time.monotonic) -> PurgeProgress:
        """A stretch of a purge of the one-offs, as :meth:`Claims.purge_pass` is of the
        claims: stopped once *budget* seconds are spent (checked after each batch),
        continued with *resume* (same cutoff) until ``done``. This default purges in
        one go."""
        cutoff = resume.cutoff if resume is not None else self.clock() - older_than
        deleted = self.purge_one_offs(older_than, batch_size=batch_size)
        return PurgeProgress(cutoff, deleted, deleted + (resume.total if resume else 0), True)

    def one_off_wakeups(self) -> OneOffWakeups | None:
        """A listener told when a one-off is scheduled (PostgreSQL NOTIFY), or None:
        the runner polls :meth:`next_one_off_due` instead."""
        return None


class ForeignBeats(Store):
    """Beats that send without claiming (a stock beat among the replicas), by sender and
    task: the workers record what they saw, ``status`` reads it from any machine."""

    @abc.abstractmethod
    def record_foreign_beats(self, sightings: Sequence[ForeignSighting],
                             retention: timedelta | None = None) -> None:
        """Add *sightings* to their rows, one per sender (``origin``) and task, in one
        transaction: the count grows by the sighting's, ``last_seen`` becomes the store
        clock, ``entry`` and ``worker`` the sighting's; a new row's ``first_seen`` is the
        store clock too. Rows not seen for *retention* are deleted. Several workers
        may record one sender's task at once: each count is added once."""

    @abc.abstractmethod
    def foreign_beats(self, within: timedelta | None = None) -> tuple[datetime, list[ForeignBeat]]:
        """The store clock, and the rows seen within *within* before it (all when None),
        the most recently seen first."""


class LiveEntries(Store):
    """Database entries (live schedules), their revisions and the cluster's version.

    Every method names the *cluster* whose entries it reads or writes: two apps that
    share a database never see each other's entries. A write is one transaction that
    bumps the cluster's version once, however many entries it changes; on the caller's
    *connection* it joins the caller's transaction (the outbox pattern), in a savepoint
    of its own, so a refused write leaves the caller's transaction as it was.
    """

    @abc.abstractmethod
    def write_entries(self, cluster: str, changes: Sequence[EntryChange], actor: str,
                      reason: str = "", connection: Any = None) -> EntryWrite:
        """Write *changes* (at most one per name) in one transaction, in which the store
        clock is read after the cluster's version row is locked (so no claim of an
        occurrence after the effective time commits under the old revision). Refused
        whole, nothing written: :class:`~..exceptions.EntryConflict` (a stale
        *expected*, an ``add`` of a name that exists),
        :class:`~..exceptions.EntryNotFound` (a change of a name that does not exist),
        :class:`~..exceptions.ConfigurationError` (an effective time before the store
        clock's now)."""

    @abc.abstractmethod
    def entries_version(self, cluster: str) -> int:
        """The cluster's version now (0: no entry was ever written): one key read."""

    @abc.abstractmethod
    def live_entries(self, cluster: str) -> EntrySnapshot:
        """Every entry of the cluster and the version they are at, in one transaction."""

    @abc.abstractmethod
    def entry_changes(self, cluster: str, since: int, limit: int = 5000) -> EntryChanges:
        """The revisions written after version *since*, oldest first (at most *limit*)."""

    @abc.abstractmethod
    def entry_history(self, cluster: str, name: str | None = None,
                      limit: int = 100) -> list[EntryRevision]:
        """The revisions of entry *name* (of every entry when None), newest first."""

    def entry_wakeups(self, cluster: str) -> Wakeups | None:
        """A listener told when the cluster's entries change (PostgreSQL NOTIFY, on the
        connection the one-offs listen on), or None: the nodes poll the version."""
        return None


class ClaimStore(Claims, Runs, Control, Nodes, OneOffs, ForeignBeats, LiveEntries):
    """Where the nodes of a cluster coordinate: every role, in one backend class.

    ``open_store(settings)`` (:mod:`.registry`) returns one; the schema and the
    connections are the store's, shared by its roles.
    """

    @abc.abstractmethod
    def ensure_schema(self) -> None:
        """Create the claims table if allowed, else check that it exists (and, on tables
        of 0.2, add the cluster column: the keys stay until :meth:`create_schema`)."""

    @abc.abstractmethod
    def census(self, live_within: timedelta) -> ClusterCensus:
        """Where the tables stand for this cluster: the tables still on the keys of
        0.2, the clusters with rows in them, and the nodes of a version before clusters
        seen within *live_within*."""

    def create_schema(self, on_step: Callable[[SchemaStep], None] | None = None,
                      force: bool = False) -> tuple[str, ...]:
        """``init-db``: create the tables whatever ``elarion_beat_create_table`` says,
        bring tables of an older version up to date (*on_step* hears of each upgrade
        before it runs: one may take a while on a big table, so the upgrades run without
        the statement timeout of ``elarion_beat_claim_timeout``), and finish the upgrade
        of tables of 0.2 (the keys that start with the cluster); refused
        (:class:`~..exceptions.UpgradeRefused`) while a node of a version before
        clusters is live, unless *force*. The tables whose keys it upgraded. This
        default: :meth:`ensure_schema` (a store with no schema to upgrade)."""
        self.ensure_schema()
        return ()

    def schema_progress(self) -> DdlProgress | None:
        """How far the upgrade :meth:`create_schema` runs now got, when the database
        tells (PostgreSQL building an index), else None. Called from another thread
        while it runs; it never raises."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; the store may not be used afterwards."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for the beat banner and logs, with any password masked."""

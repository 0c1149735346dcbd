"""The in-memory claim store: one process, no I/O.

Selected with the DSN ``memory://`` (or ``memory://name`` for a separate
namespace). Schedulers in one process that use the same name share claims, so
it coordinates several beat threads of one process and serves unit tests; it
cannot coordinate separate processes or hosts. Within a namespace each cluster
(``elarion_beat_cluster``) has rows of its own, as in a SQL store's tables.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..config.settings import DEFAULT_CLUSTER
from ..schedules.clock import Clock, utcnow
from ..schedules.slots import ClaimKind
from .clusters import ClusterCensus
from .control_records import ALL_JOBS, AuditEntry, Pause
from .foreign_records import ForeignBeat
from .interface import ClaimStore
from .memory_entries import EntrySpace, MemoryLiveEntries
from .memory_foreign import MemoryForeignBeats
from .memory_one_offs import MemoryOneOffs, OneOffRecord
from .records import (
    ClaimRequest,
    ClaimResult,
    ClaimRow,
    JobLedger,
    ManualClaim,
    NodeRuns,
    NodeState,
    PublishReport,
    RunReport,
    Takeover,
    overlap_blocks,
)
from .states import (
    EVERY_NODE_KIND,
    FAILED,
    MANUAL_KIND,
    PENDING,
    PUBLISHED,
    SKIPPED,
    UNPUBLISHED,
)

__all__ = ["MemoryClaimStore"]


@dataclass(frozen=True)
class _Row:
    node: str
    task_id: str
    kind: str
    claimed_at: datetime
    token: str = ""
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
    revision: int | None = None
    orphan_reported_at: datetime | None = None


class _Space:
    """The rows of one cluster in a namespace (under the namespace's lock)."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.jobs: dict[str, dict[datetime, _Row]] = {}
        self.nodes: dict[str, NodeState] = {}
        self.pauses: dict[str, Pause] = {}
        self.audit: list[AuditEntry] = []
        self.one_offs: dict[str, OneOffRecord] = {}
        self.foreign: dict[tuple[str, str], ForeignBeat] = {}
        self.entries = EntrySpace()

    def clear(self) -> None:
        self.jobs.clear()
        self.nodes.clear()
        self.pauses.clear()
        self.audit.clear()
        self.one_offs.clear()
        self.foreign.clear()
        self.entries.clear()

    @property
    def used(self) -> bool:
        return bool(self.jobs or self.nodes)


class _Namespace:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clusters: dict[str, _Space] = {}

    def space(self, cluster: str) -> _Space:
        with self.lock:
            return self.clusters.setdefault(cluster, _Space(self.lock))


_NAMESPACES: dict[str, _Namespace] = {}
_NAMESPACES_LOCK = threading.Lock()


class MemoryClaimStore(MemoryOneOffs, MemoryForeignBeats, MemoryLiveEntries, ClaimStore):
    """Claims kept in this process, shared by every store of the same *name*."""

    shared = False  # beat sleeps until its next one-off, not one poll interval

    def __init__(self, name: str = "", clock: Clock = utcnow,
                 cluster: str = DEFAULT_CLUSTER) -> None:
        self.name = name
        self.cluster = cluster
        self._clock = clock
        with _NAMESPACES_LOCK:
            self._namespace = _NAMESPACES.setdefault(name, _Namespace())
        self._ns = self._namespace.space(cluster)

    def _one_off_space(self) -> tuple[threading.Lock, dict[str, OneOffRecord]]:
        return self._ns.lock, self._ns.one_offs

    def _foreign_space(self) -> tuple[threading.Lock, dict[tuple[str, str], ForeignBeat]]:
        return self._ns.lock, self._ns.foreign

    def _entry_space(self) -> tuple[threading.Lock, EntrySpace]:
        return self._ns.lock, self._ns.entries

    @classmethod
    def from_dsn(cls, dsn: str, clock: Clock = utcnow,
                 cluster: str = DEFAULT_CLUSTER) -> MemoryClaimStore:
        return cls(dsn[len("memory://"):].strip("/"), clock=clock, cluster=cluster)

    def ensure_schema(self) -> None:
        return None

    def census(self, live_within: timedelta) -> ClusterCensus:
        with self._namespace.lock:
            used = tuple(sorted(c for c, space in self._namespace.clusters.items()
                                if space.used))
        return ClusterCensus(self.cluster, (), used, ())

    def claim(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        token = str(uuid.uuid4())
        self.flush_reports()
        with self._ns.lock:
            return [self._claim_one(node, request, token) for request in requests]

    def _claim_one(self, node: str, request: ClaimRequest, token: str) -> ClaimResult:
        rows = self._ns.jobs.setdefault(request.job, {})
        now = self._clock()
        if request.too_early(now):
            return ClaimResult.refused_early(request)
        if self._stale_request(request, now):
            return ClaimResult.refused_stale(request)
        pause = self._pause_of(request.job, now)
        if request.kind is ClaimKind.SLOT:
            assert request.slot is not None
            occ = request.slot
            held = rows.get(occ)
            if held is not None:
                return _answer(request, occ, held, pause)
        else:
            assert request.window is not None
            recent = [(at, row) for at, row in rows.items()
                      if at > now - request.window and row.kind != MANUAL_KIND]
            if recent:
                at, held = max(recent, key=lambda pair: pair[0])
                return _answer(request, at, held, pause)
            occ = now
        blocker = self._blocker(request, rows, now)
        state, why = request.decided(pause, blocker)
        rows[occ] = _Row(node, request.task_id, request.kind.value, now, token, state,
                         publish_error=why, revision=request.revision)
        if state == SKIPPED:
            return ClaimResult.skipped(request, occ, node, request.task_id, why, blocker, pause)
        return ClaimResult(request, True, occ, node, request.task_id, token=token)

    def _pause_of(self, job: str, now: datetime) -> Pause | None:
        for key in (job, ALL_JOBS):
            pause = self._ns.pauses.get(key)
            if pause is not None and pause.active(now):
                return pause
        return None

    # -- live control ----------------------------------------------------------

    def pause(self, job: str, actor: str, reason: str = "",
              until: datetime | None = None) -> Pause:
        now = self._clock()
        with self._ns.lock:
            pause = self._ns.pauses[job] = Pause(job, now, actor, reason, until)
            self._ns.audit.append(AuditEntry(now, actor, AuditEntry.PAUSE, job, reason, until))
            return pause

    def resume(self, job: str, actor: str) -> Pause | None:
        now = self._clock()
        with self._ns.lock:
            pause = self._ns.pauses.pop(job, None)
            if pause is None or not pause.active(now):
                return None
            self._ns.audit.append(AuditEntry(now, actor, AuditEntry.RESUME, job))
            return pause

    def pauses(self, jobs: Collection[str] | None = None) -> tuple[datetime, list[Pause]]:
        now = self._clock()
        wanted = None if jobs is None else {*jobs, ALL_JOBS}
        with self._ns.lock:
            return now, sorted((p for p in self._ns.pauses.values() if p.active(now)
                                and (wanted is None or p.job in wanted)), key=lambda p: p.job)

    def claim_manual(self, job: str, node: str, task_id: str, actor: str,
                     window: timedelta | None, reason: str = "") -> ManualClaim:
        now = self._clock()
        with self._ns.lock:
            rows = self._ns.jobs.setdefault(job, {})
            if window is not None:
                recent = [(occ, row) for occ, row in rows.items()
                          if row.kind == MANUAL_KIND and row.state != FAILED
                          and occ > now - window]
                if recent:
                    occ, row = max(recent, key=lambda pair: pair[0])
                    return ManualClaim(None, None, duplicate=_claim_row(job, occ, row,
                                                                           self.cluster))
            token = str(uuid.uuid4())
            rows[now] = _Row(node, task_id, MANUAL_KIND, now, token, PENDING)
            self._ns.audit.append(AuditEntry(now, actor, AuditEntry.TRIGGER, job, reason,
                                             task_id=task_id,
                                             detail="forced" if window is None else ""))
            return ManualClaim(_claim_row(job, now, rows[now], self.cluster), token)

    def audit(self, job: str | None = None, since: datetime | None = None,
              limit: int = 100) -> list[AuditEntry]:
        with self._ns.lock:
            found = [a for a in self._ns.audit if (job is None or a.job == job)
                     and (since is None or a.at >= since)]
        return list(reversed(found))[:limit]

    @staticmethod
    def _blocker(request: ClaimRequest, rows: Mapping[datetime, _Row],
                 now: datetime) -> datetime | None:
        """The occurrence of the job's newest unfinished run, if the rule forbids overlap."""
        rule = request.overlap
        if rule is None:
            return None
        found = [occ for occ, row in rows.items()
                 if overlap_blocks(rule, _claim_row(request.job, occ, row), now)]
        return max(found, default=None)

    def record_runs(self, reports: Sequence[RunReport]) -> None:
        now = self._clock()
        with self._ns.lock:
            for report in reports:
                rows = self._ns.jobs.setdefault(report.job, {})
                at = now - timedelta(seconds=report.age)
                start, end = report.span
                found = [occ for occ, row in rows.items()
                         if start <= occ < end and row.task_id == report.task_id]
                occurrence = found[0] if found else report.occurrence
                held = rows.get(occurrence) if found else None
                if held is None and report.every_node and occurrence not in rows:
                    held = _Row(report.node, report.task_id, EVERY_NODE_KIND, at,
                                state=PUBLISHED, published_at=at)
                if held is None:
                    continue  # purged since, or never claimed: nothing to follow
                rows[occurrence] = _run_update(held, report, at)

    def node_runs(self, since: Mapping[str, datetime], tracked_since: datetime) -> NodeRuns:
        found = NodeRuns()
        with self._ns.lock:
            for job, start in since.items():
                for occ, row in self._ns.jobs.get(job, {}).items():
                    if row.kind != EVERY_NODE_KIND:
                        continue
                    key = (job, row.node)
                    if occ >= tracked_since:
                        found.last[key] = max(found.last.get(key, occ), occ)
                    if occ >= start:
                        found.runs[key] = found.runs.get(key, 0) + 1
        return found

    def report(self, reports: Sequence[PublishReport]) -> None:
        now = self._clock()
        with self._ns.lock:
            for report in reports:
                rows = self._ns.jobs.get(report.job, {})
                held = rows.get(report.occurrence)
                if held is None or held.token != report.token or held.state != PENDING:
                    continue
                rows[report.occurrence] = dataclasses.replace(
                    held, state=FAILED if report.error else PUBLISHED,
                    published_at=None if report.error else now, publish_error=report.error)

    def unpublished(self, within: timedelta,
                    limit: int = 1000) -> tuple[datetime, list[ClaimRow]]:
        now = self._clock()
        rows = [r for r in self._rows() if r.state in UNPUBLISHED and r.kind != MANUAL_KIND
                and r.claimed_at >= now - within]
        rows.sort(key=lambda r: (r.claimed_at, r.job))
        return now, rows[:limit]

    def take_over(self, node: str, rows: Sequence[ClaimRow],
                  older_than: timedelta) -> list[Takeover]:
        token = str(uuid.uuid4())
        now = self._clock()
        out = []
        with self._ns.lock:
            for row in rows:
                jobs = self._ns.jobs.get(row.job, {})
                held = jobs.get(row.occurrence)
                if held is None or held.state not in UNPUBLISHED \
                        or now - held.claimed_at < older_than:
                    continue
                taken = dataclasses.replace(held, node=node, token=token, state=PENDING,
                                            claimed_at=now, takeovers=held.takeovers + 1)
                jobs[row.occurrence] = taken
                out.append(Takeover(_claim_row(row.job, row.occurrence, taken, self.cluster), token,
                                    held.node))
        return out

    def mark_orphans_reported(self, rows: Sequence[ClaimRow]) -> list[ClaimRow]:
        now = self._clock()
        out = []
        with self._ns.lock:
            for row in rows:
                jobs = self._ns.jobs.get(row.job, {})
                held = jobs.get(row.occurrence)
                if held is None or held.state not in UNPUBLISHED \
                        or held.takeovers != row.takeovers \
                        or _claim_row(row.job, row.occurrence, held).orphan_reported:
                    continue
                marked = jobs[row.occurrence] = dataclasses.replace(held, orphan_reported_at=now)
                out.append(_claim_row(row.job, row.occurrence, marked, self.cluster))
        return out

    def purge(self, older_than: timedelta, batch_size: int = 5000, dry_run: bool = False) -> int:
        cutoff = self._clock() - older_than
        with self._ns.lock:
            purged = 0
            for rows in self._ns.jobs.values():
                newest = max(rows, default=None)
                old = [occ for occ, row in rows.items()
                       if row.claimed_at < cutoff and occ != newest]
                if not dry_run:
                    for occ in old:
                        del rows[occ]
                purged += len(old)
        return purged

    def heartbeat(self, state: NodeState, retention: timedelta | None = None,
                  live_within: timedelta | None = None) -> tuple[datetime, list[NodeState]]:
        now = self._clock()
        with self._ns.lock:
            held = self._ns.nodes.get(state.node)
            same_boot = held is not None and held.boot_id == state.boot_id
            started = held.started_at if held and same_boot else now
            # the entries as the SQL stores keep them: rewritten when the schedule changed
            entries = held.entries if held and same_boot \
                and held.fingerprint == state.fingerprint else state.entries
            self._ns.nodes[state.node] = dataclasses.replace(
                state, started_at=started, last_seen=now, entries=entries, cluster=self.cluster)
            if retention is not None:
                for name, row in list(self._ns.nodes.items()):
                    if row.last_seen is not None and row.last_seen < now - retention:
                        del self._ns.nodes[name]
            rows = [dataclasses.replace(
                        row, counts={},
                        entries={} if row.fingerprint == state.fingerprint else row.entries)
                    for row in self._ns.nodes.values()
                    if live_within is None or row.is_live(now, live_within)]
            return now, sorted(rows, key=lambda n: n.node)

    def clock(self) -> datetime:
        return self._clock()

    def nodes(self) -> tuple[datetime, list[NodeState]]:
        with self._ns.lock:
            return self._clock(), sorted(self._ns.nodes.values(), key=lambda n: n.node)

    def find_claims(self, job: str | None = None, node: str | None = None,
                    since: datetime | None = None, limit: int = 100) -> list[ClaimRow]:
        rows = [r for r in self._rows() if (job is None or r.job == job)
                and (node is None or r.node == node)
                and (since is None or r.occurrence >= since)]
        rows.sort(key=lambda r: r.job)
        rows.sort(key=lambda r: r.occurrence, reverse=True)  # stable: job ascending within
        return rows[:limit]

    def latest_claims(self, jobs: Collection[str] | None = None,
                      before: datetime | None = None) -> dict[str, ClaimRow]:
        latest: dict[str, ClaimRow] = {}
        wanted = set(jobs) if jobs is not None else None
        for row in self._rows():
            if (wanted is not None and row.job not in wanted) or row.kind == MANUAL_KIND or (
                    before is not None and row.occurrence > before):
                continue
            if row.job not in latest or row.occurrence > latest[row.job].occurrence:
                latest[row.job] = row
        return latest

    def job_ledger(self, ranges: Mapping[str, tuple[datetime, datetime]]) -> dict[str, JobLedger]:
        with self._ns.lock:
            out = {}
            for job, (start, end) in ranges.items():
                rows = self._ns.jobs.get(job, {})
                out[job] = JobLedger(min(rows, default=None),
                                     frozenset(occ for occ in rows if start <= occ <= end))
            return out

    def existing(self, keys: Iterable[tuple[str, datetime]]) -> set[tuple[str, datetime]]:
        with self._ns.lock:
            return {(job, occ) for job, occ in keys if occ in self._ns.jobs.get(job, {})}

    def _rows(self) -> list[ClaimRow]:
        with self._ns.lock:
            return [_claim_row(job, occ, row, self.cluster)
                    for job, rows in self._ns.jobs.items() for occ, row in rows.items()]

    def close(self) -> None:
        return None

    def describe(self) -> str:
        return f"memory://{self.name} (this process only)"

    @staticmethod
    def reset(name: str | None = None) -> None:
        """Forget the claims of namespace *name* (all namespaces when None)."""
        with _NAMESPACES_LOCK:
            for key in list(_NAMESPACES) if name is None else [name]:
                ns = _NAMESPACES.get(key)
                if ns is not None:
                    with ns.lock:
                        for space in ns.clusters.values():
                            space.clear()


def _claim_row(job: str, occurrence: datetime, row: _Row, cluster: str = "") -> ClaimRow:
    return ClaimRow(job, occurrence, row.node, row.task_id, row.kind, row.claimed_at,
                    state=row.state, published_at=row.published_at,
                    publish_error=row.publish_error, takeovers=row.takeovers,
                    run_state=row.run_state, started_at=row.started_at,
                    finished_at=row.finished_at, worker=row.worker, runtime=row.runtime,
                    run_error=row.run_error, cluster=cluster, revision=row.revision,
                    orphan_reported_at=row.orphan_reported_at)


def _run_update(held: _Row, report: RunReport, at: datetime) -> _Row:
    """*held* after the transition *report* (stamped *at*)."""
    if report.event == RunReport.STARTED:
        published = held.state in (PENDING, FAILED)
        return dataclasses.replace(
            held, run_state=report.run_state, started_at=at, finished_at=None,
            worker=report.worker, runtime=None, run_error=None,
            state=PUBLISHED if published else held.state,
            published_at=held.published_at or at)
    started = held.started_at
    if started is None and report.runtime is not None:
        started = at - timedelta(seconds=report.runtime)
    return dataclasses.replace(held, run_state=report.run_state, finished_at=at,
                               started_at=started, worker=held.worker or report.worker,
                               runtime=report.runtime, run_error=report.error)


def _answer(request: ClaimRequest, occ: datetime, held: _Row,
            pause: Pause | None) -> ClaimResult:
    if held.state == SKIPPED:
        return ClaimResult.skipped(request, occ, held.node, held.task_id, held.publish_error,
                                   pause=pause)
    return ClaimResult(request, False, occ, held.node, held.task_id)

"""The claims ledger on a SQL database: what :class:`~.interface.Claims` and
:class:`~.interface.Runs` ask, in SQLAlchemy Core (every dialect).

The claim itself needs the database's own locking: each backend writes it
(:mod:`.postgres`, :mod:`.mysql`, :mod:`.sqlite`). Here: publish reports, the
workers' run records, the ledger reads, orphan takeovers and the purge. Every
statement reads and writes the rows of the store's cluster only.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    case,
    func,
    literal,
    or_,
    select,
    tuple_,
)
from sqlalchemy.engine import Connection

from ..schedules.clock import as_utc
from .control_records import Pause
from .records import (
    ClaimRequest,
    ClaimResult,
    ClaimRow,
    JobLedger,
    PublishReport,
    PurgeProgress,
    RunReport,
    Takeover,
    overlap_blocks,
)
from .sql_base import KEYS_PER_QUERY, SqlBase
from .states import (
    EVERY_NODE_KIND,
    FAILED,
    MANUAL_KIND,
    PENDING,
    PUBLISHED,
    RUNNING,
    SKIPPED,
    UNPUBLISHED,
)

__all__ = ["SqlClaims", "claim_row", "held_result"]


class SqlClaims(SqlBase):
    """The claims ledger on SQL: reports, runs, reads, takeovers and the purge."""

    def purge(self, older_than: timedelta, batch_size: int = 5000, dry_run: bool = False) -> int:
        if not dry_run:
            return self.purge_pass(older_than, batch_size=batch_size).total
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            return self._count_purgeable(conn, self._db_now(conn) - older_than)

    def purge_pass(self, older_than: timedelta, batch_size: int = 5000,
                   budget: float | None = None, resume: PurgeProgress | None = None,
                   monotonic: Callable[[], float] = time.monotonic) -> PurgeProgress:
        started = monotonic()

        def spent() -> bool:
            return budget is not None and monotonic() - started >= budget

        with self._translated():
            if resume is not None:
                cutoff = resume.cutoff
            else:
                with self.engine.begin() as conn:
                    self.round_trips += 1
                    cutoff = self._db_now(conn) - older_than
            deleted, dropped, done = self._purge_stretch(cutoff, batch_size, spent)
        return PurgeProgress(cutoff, deleted, deleted + (resume.total if resume else 0), done,
                             tuple(dropped))

    def estimate_purge(self, older_than: timedelta) -> int:
        """The claims made before the cutoff: one count by the ``claimed_at`` index
        (the exact count of ``purge --dry-run`` checks each row for a newer claim of
        its job, which takes long on a big table)."""
        c = self.table.c
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            cutoff = self._param_time(self._db_now(conn) - older_than)
            return int(conn.execute(select(func.count()).select_from(self.table)
                                    .where(self._mine(self.table), c.claimed_at < cutoff))
                       .scalar_one())

    def _purge_stretch(self, cutoff: datetime, batch_size: int,
                       spent: Callable[[], bool]) -> tuple[int, list[str], bool]:
        """Delete the claims purgeable at *cutoff*, batch after batch, until none is
        left or *spent* says the budget is: (rows deleted, partitions dropped, done)."""
        deleted = 0
        while True:
            with self.engine.begin() as conn:
                self.round_trips += 1
                batch = self._delete_batch(conn, cutoff, batch_size)
            deleted += batch
            if batch < batch_size:
                return deleted, [], True
            if spent():
                return deleted, [], False

    def _count_purgeable(self, conn: Connection, cutoff: datetime) -> int:
        """How many claims a purge at *cutoff* would delete."""
        old, newer = self._purgeable()
        query = select(func.count()).select_from(old).where(
            old.c.cluster == self.cluster, old.c.claimed_at < self._param_time(cutoff), newer)
        return int(conn.execute(query).scalar_one())

    def _purgeable(self) -> tuple[Any, Any]:
        """An alias of the claims table and the condition "a newer claim of the job
        exists", which keeps every job's newest claim out of the purge."""
        old, new = self.table.alias("o"), self.table.alias("n")
        newer = select(new.c.job_name).where(new.c.cluster == old.c.cluster,
                                             new.c.job_name == old.c.job_name,
                                             new.c.occurrence_utc > old.c.occurrence_utc)
        return old, newer.exists()

    def find_claims(self, job: str | None = None, node: str | None = None,
                    since: datetime | None = None, limit: int = 100) -> list[ClaimRow]:
        c = self.table.c
        query = (select(self.table).where(self._mine(self.table))
                 .order_by(c.occurrence_utc.desc(), c.job_name).limit(limit))
        if job is not None:
            query = query.where(c.job_name == job)
        if node is not None:
            query = query.where(c.node == node)
        if since is not None:
            query = query.where(c.occurrence_utc >= self._param_time(since))
        return self._rows(query)

    def latest_claims(self, jobs: Collection[str] | None = None,
                      before: datetime | None = None) -> dict[str, ClaimRow]:
        if jobs is not None:
            names = sorted(set(jobs))
            out: dict[str, ClaimRow] = {}
            for start in range(0, len(names), KEYS_PER_QUERY):
                out.update(self._latest(names[start:start + KEYS_PER_QUERY], before))
            return out
        return self._latest(None, before)

    def _latest(self, jobs: list[str] | None, before: datetime | None) -> dict[str, ClaimRow]:
        c = self.table.c
        # a triggered run is no occurrence of the schedule: it never says where it stands
        newest = select(c.job_name, func.max(c.occurrence_utc).label("newest")).where(
            self._mine(self.table), c.kind != MANUAL_KIND)
        if jobs is not None:
            newest = newest.where(c.job_name.in_(jobs))
        if before is not None:
            newest = newest.where(c.occurrence_utc <= self._param_time(before))
        sub = newest.group_by(c.job_name).subquery()
        query = select(self.table).join(sub, and_(c.job_name == sub.c.job_name,
                                                  c.occurrence_utc == sub.c.newest)).where(
            self._mine(self.table))
        return {row.job: row for row in self._rows(query)}

    def job_ledger(self, ranges: Mapping[str, tuple[datetime, datetime]]) -> dict[str, JobLedger]:
        c = self.table.c
        out = {}
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            for job, (start, end) in ranges.items():
                first = conn.execute(select(func.min(c.occurrence_utc))
                                     .where(self._mine(self.table), c.job_name == job)).scalar()
                claimed = conn.execute(select(c.occurrence_utc).where(
                    self._mine(self.table), c.job_name == job,
                    c.occurrence_utc >= self._param_time(start),
                    c.occurrence_utc <= self._param_time(end))).scalars()
                out[job] = JobLedger(as_utc(first) if first is not None else None,
                                     frozenset(as_utc(occ) for occ in claimed))
        return out

    def existing(self, keys: Iterable[tuple[str, datetime]]) -> set[tuple[str, datetime]]:
        wanted = [(job, as_utc(occ)) for job, occ in keys]
        if not wanted:
            return set()
        c = self.table.c
        query = select(c.job_name, c.occurrence_utc).where(
            self._mine(self.table),
            tuple_(c.job_name, c.occurrence_utc).in_([(job, self._param_time(occ))
                                                     for job, occ in wanted]))
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            return {(job, as_utc(occ)) for job, occ in conn.execute(query)}

    def _rows(self, query: Any) -> list[ClaimRow]:
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            return [claim_row(r) for r in conn.execute(query)]

    def report(self, reports: Sequence[PublishReport]) -> None:
        if not reports:
            return
        with self._translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                self._write_reports(conn, reports)

    def _write_reports(self, conn: Connection, reports: Sequence[PublishReport]) -> None:
        """Failures row by row (rare), then every published claim in one UPDATE."""
        c = self.table.c
        failed = [r for r in reports if r.error is not None]
        if failed:
            conn.execute(self.table.update().where(
                self._mine(self.table),
                c.job_name == bindparam("k_job"), c.occurrence_utc == bindparam("k_occ"),
                c.claim_token == bindparam("k_token"), c.state == PENDING,
            ).values(state=FAILED, publish_error=bindparam("k_error")),
                [{"k_job": r.job, "k_occ": self._param_time(r.occurrence), "k_token": r.token,
                  "k_error": r.error} for r in failed])
        published = [r for r in reports if r.error is None]
        for start in range(0, len(published), KEYS_PER_QUERY):
            part = published[start:start + KEYS_PER_QUERY]
            conn.execute(self.table.update().where(
                self._mine(self.table),
                tuple_(c.job_name, c.occurrence_utc).in_(
                    [(r.job, self._param_time(r.occurrence)) for r in part]),
                c.claim_token.in_({r.token for r in part}), c.state == PENDING,
            ).values(state=PUBLISHED, published_at=self._param_time(self._db_now(conn))))

    def record_runs(self, reports: Sequence[RunReport]) -> None:
        """In one transaction: the every-node rows first (inserted unless a row of the
        same run exists), then one UPDATE per kind of transition, by key and task id."""
        if not reports:
            return
        c = self.table.c
        called = time.monotonic()
        with self._translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                now = self._db_now(conn)
                # the ages were taken when this call began: connecting (and the schema
                # check of a first call) must not date the transitions late
                lag = time.monotonic() - called

                def at(report: RunReport, extra: float = 0.0) -> datetime:
                    return self._param_time(now - timedelta(seconds=report.age + lag + extra))

                fresh = [r for r in reports if r.every_node]
                if fresh:
                    keys = {(r.job, self._param_time(r.occurrence)) for r in fresh}
                    have = {(row.job_name, self._param_time(as_utc(row.occurrence_utc)))
                            for row in conn.execute(select(c.job_name, c.occurrence_utc).where(
                                self._mine(self.table),
                                tuple_(c.job_name, c.occurrence_utc).in_(sorted(keys))))}
                    rows = {(r.job, self._param_time(r.occurrence)): r for r in fresh}
                    new = [r for key, r in rows.items() if key not in have]
                    if new:
                        self._insert_ignoring(conn, [{
                            "job_name": r.job, "occurrence_utc": self._param_time(r.occurrence),
                            "node": r.node, "task_id": r.task_id, "kind": EVERY_NODE_KIND,
                            "claimed_at": at(r), "state": PUBLISHED, "published_at": at(r),
                            "takeovers": 0} for r in new])
                # the header names the occurrence to the second: the task id tells the row
                key = (self._mine(self.table), c.job_name == bindparam("k_job"),
                       c.occurrence_utc >= bindparam("k_occ"),
                       c.occurrence_utc < bindparam("k_end"), c.task_id == bindparam("k_task"))

                def where(r: RunReport) -> dict[str, Any]:
                    start, end = r.span
                    return {"k_job": r.job, "k_occ": self._param_time(start),
                            "k_end": self._param_time(end), "k_task": r.task_id}

                started = [r for r in reports if r.event == RunReport.STARTED]
                if started:
                    conn.execute(self.table.update().where(*key).values(
                        run_state=RUNNING, started_at=bindparam("k_at"), finished_at=None,
                        worker=bindparam("k_worker"), runtime=None, run_error=None,
                        # no IN (...): executemany takes no expanding parameters
                        state=case((or_(c.state == PENDING, c.state == FAILED),
                                    literal(PUBLISHED)), else_=c.state),
                        published_at=func.coalesce(c.published_at, bindparam("k_at"))),
                        [{**where(r), "k_at": at(r), "k_worker": r.worker} for r in started])
                finished = [r for r in reports if r.event != RunReport.STARTED]
                if finished:
                    conn.execute(self.table.update().where(*key).values(
                        run_state=bindparam("k_state"), finished_at=bindparam("k_at"),
                        runtime=bindparam("k_runtime"), run_error=bindparam("k_error"),
                        worker=func.coalesce(c.worker, bindparam("k_worker")),
                        started_at=func.coalesce(c.started_at, bindparam("k_start"))),
                        [{**where(r), "k_state": r.run_state, "k_at": at(r),
                          "k_runtime": r.runtime, "k_error": r.error, "k_worker": r.worker,
                          "k_start": at(r, r.runtime or 0.0)} for r in finished])

    def _blockers(self, conn: Connection, requests: Sequence[ClaimRequest],
                  now: datetime) -> dict[int, datetime]:
        """For each request with an overlap rule (by ``id``), the occurrence of its job's
        newest unfinished run, where one exists: one query for the whole batch."""
        ruled = [r for r in requests if r.overlap is not None]
        if not ruled:
            return {}
        c = self.table.c
        oldest = max(r.overlap.timeout for r in ruled if r.overlap is not None)
        jobs = sorted({r.job for r in ruled})
        rows: dict[str, list[ClaimRow]] = {}
        for start in range(0, len(jobs), KEYS_PER_QUERY):
            for r in conn.execute(select(self.table).where(
                    self._mine(self.table), c.job_name.in_(jobs[start:start + KEYS_PER_QUERY]),
                    c.claimed_at > self._param_time(now - oldest),
                    c.state.in_((PENDING, PUBLISHED)))):
                row = claim_row(r)
                rows.setdefault(row.job, []).append(row)
        out = {}
        for request in ruled:
            assert request.overlap is not None
            found = [row.occurrence for row in rows.get(request.job, ())
                     if overlap_blocks(request.overlap, row, now)]
            if found:
                out[id(request)] = max(found)
        return out

    def unpublished(self, within: timedelta,
                    limit: int = 1000) -> tuple[datetime, list[ClaimRow]]:
        c = self.table.c
        with self._translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                now = self._db_now(conn)
                # a triggered run's publish is the operator's: reported to them, never
                # taken over (it would run long after they were told it failed)
                query = (select(self.table)
                         .where(self._mine(self.table), c.state.in_(UNPUBLISHED),
                                c.kind != MANUAL_KIND,
                                c.claimed_at >= self._param_time(now - within))
                         .order_by(c.claimed_at, c.job_name).limit(limit))
                return now, [claim_row(r) for r in conn.execute(query)]

    def take_over(self, node: str, rows: Sequence[ClaimRow],
                  older_than: timedelta) -> list[Takeover]:
        """One UPDATE per orphan, each guarded by "still unpublished and still old":
        the database lets one of several concurrent UPDATEs of a row match it."""
        if not rows:
            return []
        c = self.table.c
        token = str(uuid.uuid4())
        out = []
        with self._translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                now = self._db_now(conn)
                for row in rows:
                    key = (self._mine(self.table), c.job_name == row.job,
                           c.occurrence_utc == self._param_time(row.occurrence))
                    self.round_trips += 1
                    taken = conn.execute(self.table.update().where(
                        *key, c.state.in_(UNPUBLISHED),
                        c.claimed_at <= self._param_time(now - older_than),
                    ).values(node=node, claim_token=token, state=PENDING,
                             claimed_at=self._param_time(now),
                             takeovers=c.takeovers + 1)).rowcount
                    if taken == 1:
                        fresh = conn.execute(select(self.table).where(*key)).one()
                        out.append(Takeover(claim_row(fresh), token, row.node))
        return out

    def mark_orphans_reported(self, rows: Sequence[ClaimRow]) -> list[ClaimRow]:
        """One UPDATE per orphan, guarded by "the same claim (its takeovers), still
        unpublished, not marked since its claim or takeover": the database lets one of
        several concurrent UPDATEs of a row match it, as for a takeover."""
        if not rows:
            return []
        c = self.table.c
        out = []
        with self._translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                now = self._param_time(self._db_now(conn))
                for row in rows:
                    key = (self._mine(self.table), c.job_name == row.job,
                           c.occurrence_utc == self._param_time(row.occurrence))
                    self.round_trips += 1
                    marked = conn.execute(self.table.update().where(
                        *key, c.state.in_(UNPUBLISHED), c.takeovers == row.takeovers,
                        or_(c.orphan_reported_at.is_(None),
                            c.orphan_reported_at < c.claimed_at),
                    ).values(orphan_reported_at=now)).rowcount
                    if marked == 1:
                        out.append(claim_row(conn.execute(select(self.table).where(*key)).one()))
        return out


def claim_row(r: Any) -> ClaimRow:
    """A :class:`ClaimRow` from a row of the claims table."""
    return ClaimRow(r.job_name, as_utc(r.occurrence_utc), r.node, r.task_id, r.kind,
                    as_utc(r.claimed_at), state=r.state,
                    published_at=as_utc(r.published_at) if r.published_at else None,
                    publish_error=r.publish_error, takeovers=int(r.takeovers or 0),
                    run_state=r.run_state,
                    started_at=as_utc(r.started_at) if r.started_at else None,
                    finished_at=as_utc(r.finished_at) if r.finished_at else None,
                    worker=r.worker, runtime=r.runtime, run_error=r.run_error,
                    cluster=getattr(r, "cluster", "") or "",
                    revision=getattr(r, "revision", None),
                    orphan_reported_at=_maybe_utc(getattr(r, "orphan_reported_at", None)))


def _maybe_utc(value: Any) -> datetime | None:
    return as_utc(value) if value else None


def held_result(request: ClaimRequest, held: Any, pause: Pause | None) -> ClaimResult:
    """The answer to *request* when *held* (node, task_id, occurrence_utc, state,
    publish_error) already holds its occurrence: a loss, or the cluster's skip."""
    occurrence = as_utc(held.occurrence_utc)
    if held.state == SKIPPED:
        return ClaimResult.skipped(request, occurrence, held.node, held.task_id,
                                   held.publish_error, pause=pause)
    return ClaimResult(request, False, occurrence, held.node, held.task_id)

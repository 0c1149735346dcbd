"""Live control on a SQL database: pauses, manual runs and the audit
(:class:`~.interface.Control`, SQLAlchemy Core, every dialect), each of the store's
cluster: a pause of every job (``pause --all``) pauses one app's jobs, never
another's."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Collection, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    or_,
    select,
)
from sqlalchemy.engine import Connection

from ..schedules.clock import as_utc
from .control_records import ALL_JOBS, AuditEntry, Pause, pauses_in_force
from .records import (
    ClaimRequest,
    ClaimRow,
    ManualClaim,
)
from .sql_base import KEYS_PER_QUERY, SqlBase
from .sql_claims import claim_row
from .states import (
    FAILED,
    MANUAL_KIND,
    PENDING,
)

__all__ = ["SqlControl", "pause_row"]


class SqlControl(SqlBase):
    """Live control on a SQL database: pauses, manual runs and the audit"""

    def _paused(self, conn: Connection, requests: Sequence[ClaimRequest],
                now: datetime) -> dict[str, Pause]:
        """The pause in force of each requested job that is paused (its own, else the
        pause of every job): one query for the whole batch."""
        jobs = sorted({r.job for r in requests})
        return pauses_in_force(self._pause_rows(conn, now, jobs), jobs)

    def _pause_rows(self, conn: Connection, now: datetime,
                    jobs: Collection[str] | None) -> list[Pause]:
        p = self.pauses_table.c
        query = select(self.pauses_table).where(
            self._mine(self.pauses_table),
            or_(p.until_utc.is_(None), p.until_utc > self._param_time(now)))
        if jobs is None:
            return [pause_row(r) for r in conn.execute(query.order_by(p.job_name))]
        out: list[Pause] = []
        names = sorted({*jobs, ALL_JOBS})
        for start in range(0, len(names), KEYS_PER_QUERY):
            out.extend(pause_row(r) for r in conn.execute(
                query.where(p.job_name.in_(names[start:start + KEYS_PER_QUERY]))))
        return out

    @contextlib.contextmanager
    def _control(self, key: str) -> Iterator[tuple[Connection, datetime]]:
        """A transaction serialized with every control transaction of *key*, and the
        store clock read inside it."""
        with self._translated():
            self._ready()
            with self.engine.connect() as conn, self._serialized(conn, key):
                self.round_trips += 1
                yield conn, self._db_now(conn)

    def pause(self, job: str, actor: str, reason: str = "",
              until: datetime | None = None) -> Pause:
        p = self.pauses_table
        with self._control(f"control:{job}") as (conn, now):
            conn.execute(p.delete().where(self._mine(p), p.c.job_name == job))
            row = {"cluster": self.cluster, "job_name": job, "paused_at": self._param_time(now),
                   "paused_by": actor, "reason": reason,
                   "until_utc": self._param_time(until) if until is not None else None}
            if not self._insert_or_skip(conn, p, row):
                # a table of 0.2, keyed by the job alone, holds another cluster's pause
                # of the job: replaced, as 0.2 did, until init-db gives each its own key
                conn.execute(p.delete().where(p.c.job_name == job))
                conn.execute(p.insert().values(**row))
            self._audit_row(conn, now, actor, AuditEntry.PAUSE, job, reason, until)
        return Pause(job, now, actor, reason, until)

    def resume(self, job: str, actor: str) -> Pause | None:
        p = self.pauses_table
        with self._control(f"control:{job}") as (conn, now):
            held = conn.execute(select(self.pauses_table).where(
                self._mine(p), p.c.job_name == job)).first()
            if held is None:
                return None
            conn.execute(p.delete().where(self._mine(p), p.c.job_name == job))
            pause = pause_row(held)
            if not pause.active(now):
                return None  # it had ended by itself: nothing to record
            self._audit_row(conn, now, actor, AuditEntry.RESUME, job, "", None)
            return pause

    def pauses(self, jobs: Collection[str] | None = None) -> tuple[datetime, list[Pause]]:
        with self._translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                now = self._db_now(conn)
                return now, self._pause_rows(conn, now, jobs)

    def claim_manual(self, job: str, node: str, task_id: str, actor: str,
                     window: timedelta | None, reason: str = "") -> ManualClaim:
        c = self.table.c
        with self._control(f"trigger:{job}") as (conn, now):
            if window is not None:
                recent = conn.execute(select(self.table).where(
                    self._mine(self.table), c.job_name == job, c.kind == MANUAL_KIND,
                    c.state != FAILED,
                    c.occurrence_utc > self._param_time(now - window))
                    .order_by(c.occurrence_utc.desc()).limit(1)).first()
                if recent is not None:
                    return ManualClaim(None, None, duplicate=claim_row(recent))
            token = str(uuid.uuid4())
            conn.execute(self.table.insert().values(
                cluster=self.cluster, job_name=job, occurrence_utc=self._param_time(now),
                node=node, task_id=task_id,
                kind=MANUAL_KIND, claimed_at=self._param_time(now), claim_token=token,
                state=PENDING, takeovers=0))
            self._audit_row(conn, now, actor, AuditEntry.TRIGGER, job, reason, None,
                            task_id=task_id, detail="forced" if window is None else "")
        return ManualClaim(ClaimRow(job, now, node, task_id, MANUAL_KIND, now, state=PENDING,
                                    cluster=self.cluster), token)

    def audit(self, job: str | None = None, since: datetime | None = None,
              limit: int = 100) -> list[AuditEntry]:
        a = self.audit_table.c
        query = (select(self.audit_table).where(self._mine(self.audit_table))
                 .order_by(a.at.desc(), a.id.desc()).limit(limit))
        if job is not None:
            query = query.where(a.job_name == job)
        if since is not None:
            query = query.where(a.at >= self._param_time(since))
        with self._translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                return [AuditEntry(as_utc(r.at), r.actor, r.action, r.job_name, r.reason,
                                   as_utc(r.until_utc) if r.until_utc else None, r.task_id,
                                   r.detail) for r in conn.execute(query)]

    def _audit_row(self, conn: Connection, now: datetime, actor: str, action: str, job: str,
                   reason: str, until: datetime | None, task_id: str | None = None,
                   detail: str = "") -> None:
        conn.execute(self.audit_table.insert().values(
            cluster=self.cluster, at=self._param_time(now), actor=actor, action=action,
            job_name=job,
            reason=reason, until_utc=self._param_time(until) if until is not None else None,
            task_id=task_id, detail=detail))



def pause_row(r: Any) -> Pause:
    """A :class:`Pause` from a row of the pauses table."""
    return Pause(r.job_name, as_utc(r.paused_at), r.paused_by, r.reason,
                 as_utc(r.until_utc) if r.until_utc is not None else None)

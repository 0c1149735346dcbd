"""The MariaDB / MySQL claim store (SQLAlchemy, PyMySQL driver).

``mysql://user:pass@host/db`` (or ``mysql+pymysql://``, ``mariadb://``).

* Exact slots: ``INSERT IGNORE`` on the primary key ``(job_name, occurrence_utc)``
  (rows in key order, so concurrent batches never deadlock), then one read of
  who holds each slot.
* Windows: a named lock per job (``GET_LOCK``, taken in a fixed order before the
  transaction and released after it) serializes the check-then-insert; the
  check runs in READ COMMITTED, so it sees the claim of the node that held the
  lock before. Times come from the server's ``UTC_TIMESTAMP(6)``.

A batch costs a handful of statements in one transaction (PostgreSQL needs one
round trip); see the benchmarks for what that means.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import create_engine, func, insert, select, text, tuple_
from sqlalchemy.engine import Connection

from ..clock import as_utc
from ..exceptions import SchemaMissing, StoreError, StoreUnavailable
from ..settings import Settings
from ..slots import ClaimKind
from .base import ClaimRequest, ClaimResult
from .sql import SqlClaimStore, missing_table_message

__all__ = ["MysqlClaimStore"]


class MysqlClaimStore(SqlClaimStore):
    """Claims in a MariaDB or MySQL table shared by every node."""

    def __init__(self, settings: Settings) -> None:
        timeout = max(1, int(settings.claim_timeout))
        engine = create_engine(
            settings.require_dsn(), isolation_level="READ COMMITTED", pool_size=1,
            max_overflow=4, pool_recycle=1800, pool_timeout=settings.claim_timeout,
            connect_args={"connect_timeout": timeout, "read_timeout": timeout,
                          "write_timeout": timeout})
        super().__init__(settings, engine)
        self._lock_timeout = timeout

    def _db_now(self, conn: Connection) -> datetime:
        return as_utc(conn.execute(select(func.utc_timestamp(6))).scalar_one())

    def _param_time(self, value: datetime) -> datetime:
        return as_utc(value).replace(tzinfo=None)

    def _lock_name(self, what: str) -> str:
        digest = hashlib.sha1(f"{self.settings.qualified_table}:{what}".encode()).hexdigest()
        return f"elarion:{digest}"  # 48 characters: MySQL allows 64

    def create_schema(self) -> None:
        with self._translated(), self.engine.connect() as conn:
            self.round_trips += 1
            self._acquire(conn, [self._lock_name("ddl")])
            try:
                self.metadata.create_all(conn, checkfirst=True)
                conn.commit()
            finally:
                self._release(conn, [self._lock_name("ddl")])
        self._schema_ready = True

    def _acquire(self, conn: Connection, names: list[str]) -> None:
        for name in names:
            self.round_trips += 1
            got = conn.execute(text("SELECT GET_LOCK(:name, :timeout)"),
                               {"name": name, "timeout": self._lock_timeout}).scalar()
            if got != 1:
                raise StoreUnavailable(
                    f"a window lock of the claims table was not granted within "
                    f"elarion_beat_claim_timeout ({self.settings.claim_timeout:g}s)")
        if names:
            conn.commit()  # named locks belong to the session, not to this transaction

    def _release(self, conn: Connection, names: list[str]) -> None:
        for name in reversed(names):
            self.round_trips += 1
            conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})
        conn.commit()

    def _upsert_node(self, conn: Connection, values: dict[str, Any]) -> None:
        nodes = self.nodes_table
        held = conn.execute(select(nodes.c.boot_id, nodes.c.started_at)
                            .where(nodes.c.node == values["node"]).with_for_update()).first()
        if held is None:
            conn.execute(insert(nodes).prefix_with("IGNORE").values(**values))
            return
        if held.boot_id == values["boot_id"]:
            values = {**values, "started_at": held.started_at}
        conn.execute(nodes.update().where(nodes.c.node == values["node"]).values(**values))

    def _delete_batch(self, conn: Connection, cutoff: datetime, batch: int) -> int:
        t = self._quoted(self.table)
        result = conn.execute(text(f"DELETE FROM {t} WHERE claimed_at < :cutoff LIMIT :batch"),
                              {"cutoff": self._param_time(cutoff), "batch": batch})
        return int(result.rowcount)

    def _translate(self, exc: BaseException) -> StoreError:
        code = getattr(getattr(exc, "orig", None), "args", [None])[0]
        if code == 1146:  # table doesn't exist
            self._schema_ready = False
            return SchemaMissing(missing_table_message(self.table))
        return super()._translate(exc)

    # -- claims --------------------------------------------------------------

    def claim(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        if not requests:
            return []
        windows = sorted({r.job for r in requests if r.kind is ClaimKind.WINDOW})
        names = sorted(self._lock_name(job) for job in windows)
        with self._translated():
            self._ready()
            with self.engine.connect() as conn:
                self._acquire(conn, names)
                try:
                    with conn.begin():
                        self.round_trips += 2  # the clock read, and the commit
                        now = self._db_now(conn)
                        held = self._claim_slots(conn, node, requests, now)
                        return [held[id(r)] if r.kind is ClaimKind.SLOT
                                else self._claim_window(conn, node, r, now) for r in requests]
                finally:
                    if names:
                        self._release(conn, names)

    def _claim_slots(self, conn: Connection, node: str, requests: Sequence[ClaimRequest],
                     now: datetime) -> dict[int, ClaimResult]:
        slots = sorted((r for r in requests if r.kind is ClaimKind.SLOT),
                       key=lambda r: (r.job, r.slot))
        if not slots:
            return {}
        t = self.table
        self.round_trips += 2  # one multi-row INSERT IGNORE, one read of the holders
        conn.execute(insert(t).prefix_with("IGNORE"), [
            {"job_name": r.job, "occurrence_utc": self._param_time(r.slot or now),
             "node": node, "task_id": r.task_id, "kind": r.kind.value,
             "claimed_at": self._param_time(now)} for r in slots])
        keys = [(r.job, self._param_time(r.slot or now)) for r in slots]
        holders = {(row.job_name, row.occurrence_utc): row for row in conn.execute(
            select(t.c.job_name, t.c.occurrence_utc, t.c.node, t.c.task_id, t.c.claimed_at)
            .where(tuple_(t.c.job_name, t.c.occurrence_utc).in_(keys)))}
        out = {}
        stamp = self._param_time(now)
        for request, key in zip(slots, keys):
            row = holders[key]
            # INSERT IGNORE does not say which rows it inserted: ours carry this
            # transaction's clock reading as well as our node and task id
            mine = (row.node == node and row.task_id == request.task_id
                    and row.claimed_at == stamp)
            out[id(request)] = ClaimResult(request, mine, as_utc(row.occurrence_utc), row.node,
                                           row.task_id)
        return out

    def _claim_window(self, conn: Connection, node: str, request: ClaimRequest,
                      now: datetime) -> ClaimResult:
        assert request.window is not None
        t = self.table
        self.round_trips += 1
        held = conn.execute(select(t.c.node, t.c.task_id, t.c.occurrence_utc).where(
            t.c.job_name == request.job,
            t.c.occurrence_utc > self._param_time(now - request.window))
            .order_by(t.c.occurrence_utc.desc()).limit(1)).first()
        if held is not None:
            return ClaimResult(request, False, as_utc(held.occurrence_utc), held.node,
                               held.task_id)
        self.round_trips += 1
        conn.execute(insert(t).values(
            job_name=request.job, occurrence_utc=self._param_time(now), node=node,
            task_id=request.task_id, kind=request.kind.value, claimed_at=self._param_time(now)))
        return ClaimResult(request, True, now, node, request.task_id)

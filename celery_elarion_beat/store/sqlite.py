"""The SQLite claim store: several beat processes on ONE host, no server.

``sqlite:///path/to/claims.db``. For development, demos and single-host setups:
every claim batch runs in one ``BEGIN IMMEDIATE`` transaction, which takes the
database's write lock, so batches of all processes are serialized (exact slots
and windows alike) and a check-then-insert cannot race. The clock is the host's
clock, shared by every process on it. It cannot coordinate several hosts (a
network file system does not give SQLite's locks their meaning); the beat log
says so at start.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import MetaData, Table, create_engine, event, inspect, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateIndex, CreateTable

from ..config.settings import Settings
from ..exceptions import ConfigurationError
from ..schedules.clock import Clock, as_utc, utcnow
from ..schedules.slots import ClaimKind
from .clusters import LEGACY_NODE
from .control_records import Pause
from .records import ClaimRequest, ClaimResult
from .sql import SqlClaimStore, held_result
from .sql_upgrade import KeyGap, by_table, copy_rows_sql
from .states import MANUAL_KIND, SKIPPED

__all__ = ["SqliteClaimStore"]


class SqliteClaimStore(SqlClaimStore):
    """Claims in a SQLite file shared by the beat processes of one host."""

    def __init__(self, settings: Settings, clock: Clock = utcnow) -> None:
        if settings.schema:
            raise ConfigurationError("elarion_beat_schema is not supported with SQLite; unset it")
        timeout = settings.claim_timeout
        engine = create_engine(settings.require_dsn(),
                               connect_args={"timeout": timeout, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        super().__init__(settings, engine)
        self._clock = clock

    def _db_now(self, conn: Connection) -> datetime:
        return as_utc(self._clock())

    def _clock_now(self) -> datetime:
        return as_utc(self._clock())

    def _param_time(self, value: datetime) -> datetime:
        return as_utc(value).replace(tzinfo=None)

    def _insert_or_skip(self, conn: Connection, table: Table, row: dict[str, Any]) -> bool:
        return bool(conn.execute(sqlite_insert(table).values(**row).on_conflict_do_nothing())
                    .rowcount)

    def _delete_batch(self, conn: Connection, cutoff: datetime, batch: int) -> int:
        t = self._quoted(self.table)
        result = conn.exec_driver_sql(
            f"DELETE FROM {t} WHERE rowid IN (SELECT o.rowid FROM {t} AS o "
            "WHERE o.cluster = ? AND o.claimed_at < ? AND EXISTS (SELECT 1 FROM "
            f"{t} AS n WHERE n.cluster = o.cluster AND n.job_name = o.job_name "
            "AND n.occurrence_utc > o.occurrence_utc) LIMIT ?)",
            # SQLAlchemy stores DateTime on SQLite as this text; compare like with like
            (self.cluster, self._param_time(cutoff).strftime("%Y-%m-%d %H:%M:%S.%f"), batch))
        return int(result.rowcount)

    def _swap_keys(self, gaps: list[KeyGap]) -> None:
        """SQLite alters no key: each table of *gaps* is rebuilt as declared (created
        under a new name, filled, the old one dropped, the new one renamed, its indexes
        made), in one transaction (BEGIN IMMEDIATE holds every writer meanwhile)."""
        dialect = self.engine.dialect
        with self.engine.begin() as conn:
            conn.execute(self.nodes_table.delete().where(
                self.nodes_table.c.cluster == LEGACY_NODE))
            for name, (table, _) in by_table(gaps).items():
                present = {c["name"] for c in inspect(conn).get_columns(name)}
                temp = table.to_metadata(MetaData(), name=f"{name}_elarion_new")
                for index in list(temp.indexes):
                    temp.indexes.discard(index)
                conn.execute(CreateTable(temp))
                conn.exec_driver_sql(copy_rows_sql(table, self._quoted(table),
                                                   self._quoted(temp), present, dialect))
                conn.exec_driver_sql(f"DROP TABLE {self._quoted(table)}")
                conn.exec_driver_sql(f"ALTER TABLE {self._quoted(temp)} RENAME TO "
                                     f"{self._quoted(table)}")
                for index in table.indexes:
                    conn.execute(CreateIndex(index))

    def _missing_table(self, exc: BaseException) -> bool:
        return "no such table" in str(exc)

    def claim(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        if not requests:
            return []
        with self._translated():
            self._ready()
            token = str(uuid.uuid4())
            reports = self._deferred  # ride along in this transaction
            with self.engine.begin() as conn:
                self.round_trips += 1
                now = self._db_now(conn)
                if reports:
                    self._write_reports(conn, reports)
                stale = self._stale_requests(conn, requests, now)
                paused = self._paused(conn, requests, now)
                results = [ClaimResult.refused_early(r) if r.too_early(now)
                           else ClaimResult.refused_stale(r) if id(r) in stale
                           else self._claim_one(conn, node, r, now, token, paused.get(r.job))
                           for r in requests]
            self._deferred = self._deferred[len(reports):]
            return results

    def _held(self, conn: Connection, where: tuple[Any, ...]) -> Any:
        t = self.table
        return conn.execute(select(t.c.node, t.c.task_id, t.c.occurrence_utc, t.c.state,
                                   t.c.publish_error)
                            .where(*where).order_by(t.c.occurrence_utc.desc()).limit(1)).first()

    def _claim_one(self, conn: Connection, node: str, request: ClaimRequest,
                   now: datetime, token: str, pause: Pause | None) -> ClaimResult:
        t = self.table
        if request.kind is ClaimKind.SLOT:
            assert request.slot is not None
            key: tuple[Any, ...] = (t.c.job_name == request.job,
                                    t.c.occurrence_utc == self._param_time(request.slot))
            where = (self._mine(t), *key)
            occurrence = request.slot
        else:
            assert request.window is not None
            where = (self._mine(t), t.c.job_name == request.job, t.c.kind != MANUAL_KIND,
                     t.c.occurrence_utc > self._param_time(now - request.window))
            key = (t.c.job_name == request.job,
                   t.c.occurrence_utc == self._param_time(now))
            occurrence = now
        held = self._held(conn, where)
        if held is not None:
            return held_result(request, held, pause)
        blocker = self._blockers(conn, [request], now).get(id(request))
        state, why = request.decided(pause, blocker)
        if not self._insert_or_skip(conn, t, {
                "cluster": self.cluster, "job_name": request.job,
                "occurrence_utc": self._param_time(occurrence), "node": node,
                "task_id": request.task_id, "kind": request.kind.value,
                "claimed_at": self._param_time(now), "claim_token": token, "state": state,
                "publish_error": why, "revision": request.revision}):
            # a table of 0.2, keyed without the cluster: another cluster holds the key
            return held_result(request, self._held(conn, key), pause)
        if state == SKIPPED:
            return ClaimResult.skipped(request, occurrence, node, request.task_id, why,
                                       blocker, pause)
        return ClaimResult(request, True, occurrence, node, request.task_id, token=token)

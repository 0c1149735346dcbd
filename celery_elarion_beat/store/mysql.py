"""The MariaDB / MySQL claim store (SQLAlchemy, PyMySQL driver).

``mysql://user:pass@host/db`` (or ``mysql+pymysql://``, ``mariadb://``).

* Exact slots: ``INSERT IGNORE`` on the primary key ``(cluster, job_name,
  occurrence_utc)`` (rows in key order, so concurrent batches never deadlock), then
  one read of who holds each slot.
* Windows: a named lock per job of the cluster (``GET_LOCK``, taken in a fixed order
  before the transaction and released after it; on a table of 0.2 the lock of 0.2
  first) serializes the check-then-insert; the check runs in READ COMMITTED, so it
  sees the claim of the node that held the lock before. Times come from the server's
  ``UTC_TIMESTAMP(6)``.

A batch costs a handful of statements in one transaction (PostgreSQL needs one
round trip), plus one short transaction for the previous chunk's publish marks;
see the benchmarks for what that means.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Table, create_engine, func, insert, inspect, select, text, tuple_
from sqlalchemy.dialects.mysql import VARBINARY
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

from ..config.names import KEY_LENGTH
from ..config.parsers import format_duration
from ..config.settings import Settings
from ..exceptions import ClaimRefused, StoreUnavailable
from ..schedules.clock import as_utc
from ..schedules.slots import ClaimKind
from .clusters import LEGACY_NODE
from .control_records import Pause
from .entry_triggers import has_entry_triggers
from .foreign_records import ForeignSighting
from .records import ClaimRequest, ClaimResult
from .schema import CLUSTER
from .sql import SqlClaimStore, held_result
from .sql_upgrade import KeyGap, by_table, mysql_swap
from .states import MANUAL_KIND, SKIPPED

__all__ = ["MysqlClaimStore"]


class MysqlClaimStore(SqlClaimStore):
    """Claims in a MariaDB or MySQL table shared by every node."""

    def __init__(self, settings: Settings) -> None:
        timeout = settings.claim_timeout
        engine = create_engine(
            settings.require_dsn(), isolation_level="READ COMMITTED", pool_size=1,
            max_overflow=4, pool_recycle=1800, pool_timeout=timeout,
            connect_args={"connect_timeout": max(1, round(timeout)), "read_timeout": timeout,
                          "write_timeout": timeout})
        super().__init__(settings, engine)
        # a lock wait answers before the socket's read timeout gives up on the session
        self._lock_timeout = round(timeout * 0.8, 3)

    def _db_now(self, conn: Connection) -> datetime:
        return as_utc(conn.execute(select(func.utc_timestamp(6))).scalar_one())

    def _param_time(self, value: datetime) -> datetime:
        return as_utc(value).replace(tzinfo=None)

    def _lock_name(self, what: str, cluster: str | None = None) -> str:
        """The named lock of *what* on this table (of *cluster*'s, when given; without
        one, the name 0.2 used)."""
        scope = self.settings.qualified_table
        if cluster is not None:
            scope += f"\x00{cluster}"
        digest = hashlib.sha1(f"{scope}:{what}".encode()).hexdigest()
        return f"elarion:{digest}"  # 48 characters: MySQL allows 64

    def _lock_names(self, keys: list[str]) -> list[str]:
        """The named locks of *keys* (job names, control keys) in the order they are
        taken: the cluster's, after those of 0.2 while the table may have nodes of 0.2."""
        mine = sorted(self._lock_name(key, self.cluster) for key in keys)
        if not self.legacy_locks:
            return mine
        return sorted(self._lock_name(key) for key in keys) + mine

    @contextlib.contextmanager
    def _ddl_transaction(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            self._acquire(conn, [self._lock_name("ddl")])
            try:
                yield conn
                conn.commit()
            finally:
                self._release(conn, [self._lock_name("ddl")])

    def _swap_keys(self, gaps: list[KeyGap]) -> None:
        """One ``ALTER TABLE`` per table, on a connection of its own (no read timeout:
        InnoDB rebuilds the table online, which takes as long as it takes), under the
        DDL lock."""
        engine = create_engine(self.settings.require_dsn(), poolclass=NullPool)
        try:
            with engine.connect() as conn:
                self._acquire(conn, [self._lock_name("ddl")])
                try:
                    conn.execute(self.nodes_table.delete().where(
                        self.nodes_table.c.cluster == LEGACY_NODE))
                    conn.commit()
                    for _, (table, mine) in by_table(gaps).items():
                        quoted = self._quoted(table)
                        conn.exec_driver_sql(mysql_swap(mine, quoted, engine.dialect))
                        conn.exec_driver_sql(f"ALTER TABLE {quoted} ALTER COLUMN {CLUSTER} "
                                             "DROP DEFAULT")
                finally:
                    self._release(conn, [self._lock_name("ddl")])
        finally:
            engine.dispose()

    @contextlib.contextmanager
    def _unbounded(self, conn: Connection) -> Iterator[None]:
        """No read timeout on this session meanwhile: an ALTER TABLE that rebuilds a big
        table answers only when it is done (PyMySQL reads ``_read_timeout`` before
        each read)."""
        raw = conn.connection.dbapi_connection
        saved = getattr(raw, "_read_timeout", None)
        if raw is not None:
            raw._read_timeout = None
        try:
            yield
        finally:
            if raw is not None:
                raw._read_timeout = saved

    def _create_entries_schema(self) -> None:
        """The entries tables and triggers, under the DDL's named lock (a trigger is
        dropped and created: two nodes starting together must not race on it)."""
        with self.engine.connect() as conn:
            self.round_trips += 1
            self._acquire(conn, [self._lock_name("ddl")])
            try:
                self.entries_metadata.create_all(conn, checkfirst=True)
                if not has_entry_triggers(conn, self.engine.dialect.name, self.entries.name,
                                          self.settings.schema):
                    for statement in self.entry_trigger_statements():
                        conn.exec_driver_sql(statement)
                conn.commit()
            finally:
                self._release(conn, [self._lock_name("ddl")])

    def _upgrades(self, conn: Connection) -> list[str]:
        """Also: key names stored as bytes (tables of 0.1 used the server's collation)."""
        upgrades = super()._upgrades(conn)
        inspector = inspect(conn)
        for table, column in ((self.table, "job_name"), (self.nodes_table, "node")):
            found = {c["name"]: c["type"] for c in inspector.get_columns(
                table.name, schema=self.settings.schema)}
            if not isinstance(found.get(column), VARBINARY):
                upgrades.append(f"ALTER TABLE {self._quoted(table)} MODIFY {column} "
                                f"VARBINARY({KEY_LENGTH * 4}) NOT NULL")
        return upgrades

    def _acquire(self, conn: Connection, names: list[str]) -> None:
        """Take every named lock, or none: a lock that times out releases the ones
        already granted (they belong to the pooled session and would outlive us)."""
        taken: list[str] = []
        try:
            for name in names:
                self.round_trips += 1
                got = conn.execute(text("SELECT GET_LOCK(:name, :timeout)"),
                                   {"name": name, "timeout": self._lock_timeout}).scalar()
                if got != 1:
                    raise StoreUnavailable(
                        f"a window lock of the claims table was not granted within "
                        "elarion_beat_claim_timeout "
                        f"({format_duration(self.settings.claim_timeout)})")
                taken.append(name)
            if names:
                conn.commit()  # named locks belong to the session, not to this transaction
        except BaseException:
            try:
                self._release(conn, taken)
            except Exception:  # the session was invalidated, which released the locks
                pass
            raise

    def _release(self, conn: Connection, names: list[str]) -> None:
        """Release *names*; if that fails, the session is closed, which releases them."""
        try:
            for name in reversed(names):
                self.round_trips += 1
                conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})
            conn.commit()
        except BaseException:
            conn.invalidate()  # never return a session that may still hold a lock
            raise

    @contextlib.contextmanager
    def _serialized(self, conn: Connection, key: str) -> Iterator[None]:
        names = self._lock_names([key])
        self._acquire(conn, names)
        try:
            with conn.begin():
                yield
        finally:
            self._release(conn, names)

    def _insert_or_skip(self, conn: Connection, table: Table, row: dict[str, Any]) -> bool:
        return bool(conn.execute(insert(table).prefix_with("IGNORE").values(**row)).rowcount)

    def _add_sightings(self, conn: Connection, sightings: Sequence[ForeignSighting],
                       now: datetime) -> None:
        """One upsert per sighting: an ``UPDATE`` of no row locks a gap, and two workers
        inserting after one would deadlock."""
        t = self.foreign_beats_table
        for seen in sightings:
            stmt = mysql_insert(t).values(
                cluster=self.cluster, origin=seen.origin, task_name=seen.task,
                entry=seen.entry, messages=seen.count, first_seen=now, last_seen=now,
                worker=seen.worker)
            conn.execute(stmt.on_duplicate_key_update(
                messages=t.c.messages + stmt.inserted.messages, last_seen=stmt.inserted.last_seen,
                entry=stmt.inserted.entry, worker=stmt.inserted.worker))

    def _delete_batch(self, conn: Connection, cutoff: datetime, batch: int) -> int:
        t = self._quoted(self.table)
        # the LIMITed derived table is materialized, so it may read the table it deletes from
        result = conn.execute(text(
            f"DELETE c FROM {t} AS c JOIN (SELECT o.cluster, o.job_name, o.occurrence_utc "
            f"FROM {t} AS o WHERE o.cluster = :cluster AND o.claimed_at < :cutoff AND EXISTS "
            f"(SELECT 1 FROM {t} AS n WHERE n.cluster = o.cluster AND n.job_name = o.job_name "
            "AND n.occurrence_utc > o.occurrence_utc) LIMIT :batch) AS d "
            "ON d.cluster = c.cluster AND d.job_name = c.job_name "
            "AND d.occurrence_utc = c.occurrence_utc"),
            {"cluster": self.cluster.encode("utf-8"), "cutoff": self._param_time(cutoff),
             "batch": batch})
        return int(result.rowcount)

    def _missing_table(self, exc: BaseException) -> bool:
        return bool(getattr(getattr(exc, "orig", None), "args", [None])[0] == 1146)

    # -- claims --------------------------------------------------------------

    def claim(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        if not requests:
            return []
        windows = sorted({r.job for r in requests if r.kind is ClaimKind.WINDOW})
        token = str(uuid.uuid4())
        with self._translated():
            self._ready()
            names = self._lock_names(windows)
            with self.engine.connect() as conn:
                self._acquire(conn, names)
                try:
                    # the publish marks first, in a transaction of their own: an INSERT
                    # IGNORE that meets a row holds a shared lock on it until commit, so
                    # marks in the claim's transaction would deadlock two nodes whose
                    # claims cross (each marking its own row, claiming the other's)
                    reports = self._deferred
                    if reports:
                        with conn.begin():
                            self.round_trips += 2  # the UPDATE, and its commit
                            self._write_reports(conn, reports)
                        self._deferred = self._deferred[len(reports):]
                    with conn.begin():
                        self.round_trips += 2  # the clock read, and the commit
                        now = self._db_now(conn)
                        early = {id(r) for r in requests if r.too_early(now)}
                        stale = self._stale_requests(
                            conn, [r for r in requests if id(r) not in early], now)
                        fresh = [r for r in requests if id(r) not in stale
                                 and id(r) not in early]
                        paused = self._paused(conn, fresh, now) if fresh else {}
                        blockers = self._blockers(conn, fresh, now)
                        held = self._claim_slots(conn, node, fresh, now, token, blockers,
                                                 paused)
                        results = [ClaimResult.refused_early(r) if id(r) in early
                                   else ClaimResult.refused_stale(r) if id(r) in stale
                                   else held[id(r)] if r.kind is ClaimKind.SLOT
                                   else self._claim_window(conn, node, r, now, token,
                                                           blockers.get(id(r)),
                                                           paused.get(r.job))
                                   for r in requests]
                    return results
                finally:
                    if names:
                        self._release(conn, names)

    def _claim_slots(self, conn: Connection, node: str, requests: Sequence[ClaimRequest],
                     now: datetime, token: str, blockers: dict[int, datetime],
                     paused: dict[str, Pause]) -> dict[int, ClaimResult]:
        slots = sorted((r for r in requests if r.kind is ClaimKind.SLOT),
                       key=lambda r: (r.job, r.slot))
        if not slots:
            return {}
        t = self.table
        self.round_trips += 2  # one multi-row INSERT IGNORE, one read of the holders
        rows = []
        for r in slots:
            state, why = r.decided(paused.get(r.job), blockers.get(id(r)))
            rows.append({"cluster": self.cluster, "job_name": r.job,
                         "occurrence_utc": self._param_time(r.slot or now),
                         "node": node, "task_id": r.task_id, "kind": r.kind.value,
                         "claimed_at": self._param_time(now), "claim_token": token,
                         "state": state, "publish_error": why, "revision": r.revision})
        conn.execute(insert(t).prefix_with("IGNORE"), rows)
        keys = [(r.job, self._param_time(r.slot or now)) for r in slots]
        columns = (t.c.job_name, t.c.occurrence_utc, t.c.node, t.c.task_id, t.c.claim_token,
                   t.c.state, t.c.publish_error)
        # the whole key in the row constructor: MariaDB reads it as ranges of the primary
        # key (with the cluster as a separate condition it took seconds per 1,000 keys)
        holders = {(row.job_name, row.occurrence_utc): row for row in conn.execute(
            select(*columns).where(tuple_(t.c.cluster, t.c.job_name, t.c.occurrence_utc).in_(
                [(self.cluster, job, occ) for job, occ in keys])))}
        missing = [key for key in keys if key not in holders]
        if missing:  # a table of 0.2, keyed without the cluster: another cluster's rows
            others = {(row.job_name, row.occurrence_utc): row for row in conn.execute(
                select(*columns).where(tuple_(t.c.job_name, t.c.occurrence_utc).in_(missing)))}
        out = {}
        for request, key in zip(slots, keys):
            row = holders.get(key)
            if row is None and missing:
                row = others.get(key)
                if row is not None:
                    out[id(request)] = ClaimResult(request, False, as_utc(row.occurrence_utc),
                                                   row.node, row.task_id)
                    continue
            if row is None:  # names are validated up front; never a KeyError into beat
                raise ClaimRefused(f"the claim of {request.job[:80]!r} at {key[1]} was "
                                   "not stored as sent (the table's key columns may "
                                   "predate byte-exact names: run init-db)")
            # INSERT IGNORE does not say which rows it inserted: ours carry this
            # call's token (a second beat under our node name has another)
            occurrence = as_utc(row.occurrence_utc)
            if row.state == SKIPPED:
                blocker = blockers.get(id(request)) if row.claim_token == token else None
                out[id(request)] = ClaimResult.skipped(
                    request, occurrence, row.node, row.task_id, row.publish_error, blocker,
                    paused.get(request.job))
                continue
            won = row.claim_token == token
            out[id(request)] = ClaimResult(request, won, occurrence, row.node,
                                           row.task_id, token=token if won else None)
        return out

    def _claim_window(self, conn: Connection, node: str, request: ClaimRequest,
                      now: datetime, token: str, blocker: datetime | None,
                      pause: Pause | None) -> ClaimResult:
        assert request.window is not None
        t = self.table
        self.round_trips += 1
        held = conn.execute(select(t.c.node, t.c.task_id, t.c.occurrence_utc, t.c.state,
                                   t.c.publish_error).where(
            self._mine(t), t.c.job_name == request.job, t.c.kind != MANUAL_KIND,
            t.c.occurrence_utc > self._param_time(now - request.window))
            .order_by(t.c.occurrence_utc.desc()).limit(1)).first()
        if held is not None:
            return held_result(request, held, pause)
        self.round_trips += 1
        state, why = request.decided(pause, blocker)
        conn.execute(insert(t).values(
            cluster=self.cluster, job_name=request.job, occurrence_utc=self._param_time(now),
            node=node,
            task_id=request.task_id, kind=request.kind.value, claimed_at=self._param_time(now),
            claim_token=token, state=state, publish_error=why, revision=request.revision))
        if state == SKIPPED:
            return ClaimResult.skipped(request, now, node, request.task_id, why, blocker, pause)
        return ClaimResult(request, True, now, node, request.task_id, token=token)

"""The PostgreSQL claim store (SQLAlchemy 2 Core engine, psycopg 3 driver).

One tick's claims cost one network round trip. The statements are sent
together in a psycopg pipeline, inside one transaction:

1. ``pg_advisory_xact_lock(namespace, hashtext(job))`` for every window job,
   in key order (so two nodes never deadlock), only when there are windows;
2. one ``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING RETURNING``
   that claims every exact slot and every window whose job has no claim within
   its window before ``clock_timestamp()``, and reports the holder of each lost
   claim;
3. ``COMMIT``.

Windows are measured on the **database clock** (``clock_timestamp()``), so the
nodes' own clocks may disagree. The statement that checks the window runs after
the lock statement, so its snapshot sees the claim committed by the node that
held the lock before. The lock key is the two-int form ``(namespace, hash)``
with a namespace derived from the table's name; two-int advisory keys never
conflict with an application's single-bigint advisory keys.

Driver errors are translated into :class:`~..exceptions.StoreError` here.
"""

from __future__ import annotations

import contextlib
import json
import math
import zlib
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import (
    MetaData,
    Table,
    case,
    create_engine,
    func,
    inspect,
    select,
    text,
    tuple_,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Engine

from ..clock import as_utc
from ..exceptions import SchemaMissing, StoreError, StoreUnavailable
from ..settings import Settings, mask_dsn
from ..slots import ClaimKind
from .base import ClaimRequest, ClaimResult, ClaimRow, ClaimStore, NodeState
from .schema import claims_table, nodes_table

__all__ = ["PostgresClaimStore"]

_LOCK_SQL = """
SELECT count(pg_advisory_xact_lock(%(ns)s, k)) FROM (
    SELECT DISTINCT hashtext(j) AS k FROM unnest(%(jobs)s::text[]) AS j ORDER BY 1 OFFSET 0
) AS keys
"""

_INPUT = """
input AS (
    SELECT t.ord, t.job_name, t.kind, t.slot, t.window_s, t.task_id
    FROM unnest(%(jobs)s::text[], %(kinds)s::text[], %(slots)s::timestamptz[],
                %(windows)s::float8[], %(task_ids)s::text[])
         WITH ORDINALITY AS t(job_name, kind, slot, window_s, task_id, ord)
)"""

_HELD = """
LEFT JOIN LATERAL (
    SELECT p.node, p.task_id, p.occurrence_utc FROM {table} AS p
    WHERE p.job_name = i.job_name
      AND ((i.kind = 'slot' AND p.occurrence_utc = i.slot)
        OR (i.kind = 'window'
            AND p.occurrence_utc > clock_timestamp() - make_interval(secs => i.window_s)))
    ORDER BY p.occurrence_utc DESC LIMIT 1
) AS held ON {condition}"""

_CLAIM_SQL = "WITH " + _INPUT + """,
inserted AS (
    INSERT INTO {table} AS c (job_name, occurrence_utc, node, task_id, kind, claimed_at)
    SELECT i.job_name,
           CASE WHEN i.kind = 'window' THEN clock_timestamp() ELSE i.slot END,
           %(node)s, i.task_id, i.kind, clock_timestamp()
    FROM input AS i
    WHERE i.kind = 'slot'
       OR NOT EXISTS (
            SELECT 1 FROM {table} AS p
            WHERE p.job_name = i.job_name
              AND p.occurrence_utc > clock_timestamp() - make_interval(secs => i.window_s))
    ORDER BY i.job_name, i.slot
    ON CONFLICT (job_name, occurrence_utc) DO NOTHING
    RETURNING c.job_name, c.occurrence_utc, c.task_id
)
SELECT i.ord, ins.occurrence_utc IS NOT NULL,
       COALESCE(ins.occurrence_utc, held.occurrence_utc, i.slot), held.node, held.task_id
FROM input AS i
LEFT JOIN inserted AS ins ON ins.job_name = i.job_name AND ins.task_id = i.task_id
""" + _HELD.replace("{condition}", "ins.occurrence_utc IS NULL") + """
ORDER BY i.ord
"""

_LOOKUP_SQL = "WITH " + _INPUT + """
SELECT i.ord, false, COALESCE(held.occurrence_utc, i.slot), held.node, held.task_id
FROM input AS i
""" + _HELD.replace("{condition}", "true") + """
ORDER BY i.ord
"""


def lock_namespace(qualified_table: str) -> int:
    """The first key of the window advisory locks: a signed int32 from the table name."""
    crc = zlib.crc32(f"celery_elarion_beat:{qualified_table}".encode())
    return (crc ^ 0x80000000) - 0x80000000


class PostgresClaimStore(ClaimStore):
    """Claims in a PostgreSQL table shared by every node."""

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        self.settings = settings
        dsn = settings.require_dsn()
        timeout = settings.claim_timeout
        self.engine = engine or create_engine(
            dsn,
            pool_size=1,
            max_overflow=4,
            pool_timeout=timeout,
            pool_recycle=1800,
            connect_args={
                "connect_timeout": max(2, math.ceil(timeout)),
                "application_name": f"celery-elarion-beat {settings.node}"[:63],
                "options": f"-c statement_timeout={int(timeout * 1000)} "
                           f"-c lock_timeout={int(timeout * 1000)}",
                "keepalives": 1,
                "keepalives_idle": 30,
                "keepalives_interval": 5,
                "keepalives_count": 3,
                "tcp_user_timeout": int(timeout * 1000),
            },
        )
        self.metadata = MetaData()
        self.table: Table = claims_table(self.metadata, settings.table, settings.schema)
        self.nodes_table: Table = nodes_table(self.metadata, settings.nodes_table, settings.schema)
        self._table_sql = self.engine.dialect.identifier_preparer.format_table(self.table)
        self._claim_sql = _CLAIM_SQL.replace("{table}", self._table_sql)
        self._lookup_sql = _LOOKUP_SQL.replace("{table}", self._table_sql)
        self._namespace = lock_namespace(settings.qualified_table)
        self._schema_ready = False
        self.round_trips = 0

    # -- schema --------------------------------------------------------------

    def ensure_schema(self) -> None:
        with self._translated():
            with self.engine.begin() as conn:
                self.round_trips += 1
                if self.settings.create_table:
                    conn.execute(select(func.pg_advisory_xact_lock(self._namespace, 0)))
                    if self.settings.schema:
                        schema = self.engine.dialect.identifier_preparer.quote_schema(
                            self.settings.schema)
                        conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))
                    self.metadata.create_all(conn, checkfirst=True)
                else:
                    inspector = inspect(conn)
                    for table in (self.table, self.nodes_table):
                        if not inspector.has_table(table.name, schema=self.settings.schema):
                            raise SchemaMissing(_missing(table, self.settings))
        self._schema_ready = True

    def create_schema(self) -> None:
        """Create the tables whatever elarion_beat_create_table says (``init-db``)."""
        with self._translated():
            with self.engine.begin() as conn:
                conn.execute(select(func.pg_advisory_xact_lock(self._namespace, 0)))
                if self.settings.schema:
                    schema = self.engine.dialect.identifier_preparer.quote_schema(
                        self.settings.schema)
                    conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))
                self.metadata.create_all(conn, checkfirst=True)
        self._schema_ready = True

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except sa_exc.DBAPIError as exc:
            raise _translate(exc.orig, self.settings) from exc
        except psycopg.Error as exc:
            raise _translate(exc, self.settings) from exc

    # -- claims --------------------------------------------------------------

    def claim(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        if not requests:
            return []
        if not self._schema_ready:
            self.ensure_schema()
        params = _params(node, requests)
        windows = sorted({r.job for r in requests if r.kind is ClaimKind.WINDOW})
        for attempt in (1, 2):
            try:
                raw = self.engine.raw_connection()
            except sa_exc.DBAPIError as exc:
                raise _translate(exc.orig, self.settings) from exc
            except psycopg.Error as exc:
                # Engine.raw_connection() is pool.connect(): a failed connect raises the
                # driver's own error, not a wrapped DBAPIError
                raise _translate(exc, self.settings) from exc
            except sa_exc.TimeoutError as exc:
                raise StoreUnavailable(f"no database connection free: {exc}") from exc
            pc: psycopg.Connection[Any] = raw.driver_connection  # type: ignore[assignment]
            try:
                rows = self._claim_rows(pc, params, windows)
                missing = [row[0] for row in rows if not row[1] and row[3] is None]
                if missing:
                    rows = self._fill_holders(pc, rows, requests, node, missing)
                return [_result(request, node, row) for request, row in zip(requests, rows)]
            except psycopg.OperationalError as exc:
                raw.invalidate()
                if attempt == 2:
                    raise _translate(exc, self.settings) from exc
                # a pooled connection may have gone stale: one try on a fresh one
            except psycopg.Error as exc:
                raw.invalidate()
                if isinstance(exc, psycopg.errors.UndefinedTable):
                    self._schema_ready = False
                raise _translate(exc, self.settings) from exc
            finally:
                raw.close()
        raise AssertionError("unreachable")  # pragma: no cover

    def _claim_rows(self, pc: psycopg.Connection[Any], params: dict[str, Any],
                    windows: list[str]) -> list[tuple[Any, ...]]:
        with pc.pipeline():
            if windows:
                pc.execute(_LOCK_SQL, {"ns": self._namespace, "jobs": windows})
            cur = pc.execute(self._claim_sql, params)
            pc.commit()
        self.round_trips += 1
        return cur.fetchall()

    def _fill_holders(self, pc: psycopg.Connection[Any], rows: list[tuple[Any, ...]],
                      requests: Sequence[ClaimRequest], node: str,
                      missing: list[int]) -> list[tuple[Any, ...]]:
        """Ask again who holds the claims lost to a racer that committed mid-statement."""
        subset = [requests[ord_ - 1] for ord_ in missing]
        with pc.pipeline():
            cur = pc.execute(self._lookup_sql, _params(node, subset))
            pc.commit()
        self.round_trips += 1
        found = {missing[row[0] - 1]: row for row in cur.fetchall()}
        return [(row[0], row[1], *found[row[0]][2:]) if row[0] in found else row for row in rows]

    # -- maintenance ---------------------------------------------------------

    def purge(self, older_than: timedelta, batch_size: int = 5000, dry_run: bool = False) -> int:
        t = self._table_sql
        if dry_run:
            count = text(f"SELECT count(*) FROM {t} "
                         "WHERE claimed_at < clock_timestamp() - make_interval(secs => :secs)")
            with self._translated(), self.engine.begin() as conn:
                self.round_trips += 1
                return int(conn.execute(count, {"secs": older_than.total_seconds()}).scalar_one())
        sql = text(f"DELETE FROM {t} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {t} "
                   "WHERE claimed_at < clock_timestamp() - make_interval(secs => :secs) "
                   "LIMIT :batch))")
        total = 0
        with self._translated():
            while True:
                with self.engine.begin() as conn:
                    self.round_trips += 1
                    deleted = int(conn.execute(sql, {"secs": older_than.total_seconds(),
                                                     "batch": batch_size}).rowcount)
                total += deleted
                if deleted < batch_size:
                    return total

    # -- nodes and the ledger --------------------------------------------------

    def heartbeat(self, state: NodeState) -> tuple[datetime, list[NodeState]]:
        nodes = self.nodes_table
        values = {
            "node": state.node, "boot_id": state.boot_id, "version": state.version,
            "fingerprint": state.fingerprint, "host": state.host, "pid": state.pid,
            "entries": json.dumps(state.entries, sort_keys=True),
            "counts": json.dumps(state.counts, sort_keys=True),
            "started_at": func.clock_timestamp(), "last_seen": func.clock_timestamp(),
        }
        stmt = pg_insert(nodes).values(**values)
        stmt = stmt.on_conflict_do_update(
            index_elements=[nodes.c.node],
            set_={
                **{k: stmt.excluded[k] for k in ("boot_id", "version", "fingerprint", "host",
                                                 "pid", "entries", "counts", "last_seen")},
                "started_at": case((nodes.c.boot_id == stmt.excluded.boot_id, nodes.c.started_at),
                                   else_=stmt.excluded.started_at),
            },
        )
        with self._translated():
            if not self._schema_ready:
                self.ensure_schema()
            with self.engine.begin() as conn:
                self.round_trips += 1
                conn.execute(stmt)
                now = conn.execute(select(func.clock_timestamp())).scalar_one()
                rows = conn.execute(select(nodes).order_by(nodes.c.node)).mappings().all()
        return as_utc(now), [_node(row) for row in rows]

    def nodes(self) -> tuple[datetime, list[NodeState]]:
        with self._translated():
            with self.engine.begin() as conn:
                self.round_trips += 1
                now = conn.execute(select(func.clock_timestamp())).scalar_one()
                rows = conn.execute(select(self.nodes_table)
                                    .order_by(self.nodes_table.c.node)).mappings().all()
        return as_utc(now), [_node(row) for row in rows]

    def find_claims(self, job: str | None = None, node: str | None = None,
                    since: datetime | None = None, limit: int = 100) -> list[ClaimRow]:
        c = self.table.c
        query = select(self.table).order_by(c.occurrence_utc.desc(), c.job_name).limit(limit)
        if job is not None:
            query = query.where(c.job_name == job)
        if node is not None:
            query = query.where(c.node == node)
        if since is not None:
            query = query.where(c.occurrence_utc >= since)
        return self._claim_rows_of(query)

    def latest_claims(self) -> dict[str, ClaimRow]:
        c = self.table.c
        query = (select(self.table).distinct(c.job_name)
                 .order_by(c.job_name, c.occurrence_utc.desc()))
        return {row.job: row for row in self._claim_rows_of(query)}

    def existing(self, keys: Iterable[tuple[str, datetime]]) -> set[tuple[str, datetime]]:
        wanted = [(job, as_utc(occ)) for job, occ in keys]
        if not wanted:
            return set()
        c = self.table.c
        query = select(c.job_name, c.occurrence_utc).where(
            tuple_(c.job_name, c.occurrence_utc).in_(wanted))
        with self._translated():
            with self.engine.begin() as conn:
                self.round_trips += 1
                return {(job, as_utc(occ)) for job, occ in conn.execute(query)}

    def _claim_rows_of(self, query: Any) -> list[ClaimRow]:
        with self._translated():
            with self.engine.begin() as conn:
                self.round_trips += 1
                return [ClaimRow(r.job_name, as_utc(r.occurrence_utc), r.node, r.task_id, r.kind,
                                 as_utc(r.claimed_at)) for r in conn.execute(query)]

    def close(self) -> None:
        self.engine.dispose()

    def describe(self) -> str:
        return f"{mask_dsn(self.settings.dsn)} (table {self.settings.qualified_table})"


def _node(row: Any) -> NodeState:
    return NodeState(
        node=row["node"], boot_id=row["boot_id"], version=row["version"],
        fingerprint=row["fingerprint"], entries=json.loads(row["entries"] or "{}"),
        counts=json.loads(row["counts"] or "{}"), host=row["host"], pid=row["pid"],
        started_at=as_utc(row["started_at"]), last_seen=as_utc(row["last_seen"]))


def _missing(table: Table, settings: Settings) -> str:
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    return (f"the table {name} does not exist and elarion_beat_create_table is False: "
            "create it with your migrations (celery_elarion_beat.claims_table(metadata) and "
            "nodes_table(metadata) declare the tables), run `celery -A proj elarion-beat "
            "init-db`, or set elarion_beat_create_table = True to let beat create it")


def _params(node: str, requests: Sequence[ClaimRequest]) -> dict[str, Any]:
    return {
        "node": node,
        "jobs": [r.job for r in requests],
        "kinds": [r.kind.value for r in requests],
        "slots": [r.slot for r in requests],
        "windows": [r.window.total_seconds() if r.window is not None else None for r in requests],
        "task_ids": [r.task_id for r in requests],
    }


def _result(request: ClaimRequest, node: str, row: tuple[Any, ...]) -> ClaimResult:
    _, inserted, occurrence, holder, holder_task = row
    occurrence = as_utc(occurrence) if occurrence is not None else None
    if inserted:
        return ClaimResult(request, True, occurrence, node, request.task_id)
    mine = holder == node and holder_task == request.task_id
    return ClaimResult(request, mine, occurrence, holder, holder_task)


def _translate(exc: BaseException | None, settings: Settings) -> StoreError:
    where = mask_dsn(settings.dsn)
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return SchemaMissing(f"the claims table {settings.qualified_table} is missing at {where}")
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return StoreUnavailable(
            f"the claims database {where} did not answer within elarion_beat_claim_timeout "
            f"({settings.claim_timeout:g}s): {exc}")
    if isinstance(exc, psycopg.OperationalError):
        return StoreUnavailable(f"the claims database {where} is unreachable: {exc}".strip())
    return StoreError(f"the claims database {where} failed: {type(exc).__name__}: {exc}")

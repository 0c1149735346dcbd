"""What every SQL claim store shares: tables, schema, the ledger and nodes queries.

Backends subclass :class:`SqlClaimStore` and provide the claim itself (the part
that needs the database's own locking) plus a few dialect hooks: the clock, the
upsert of a node row, a bounded delete, and how DDL is serialized. The generic
queries here are SQLAlchemy Core and run on every dialect.
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import MetaData, Table, and_, func, inspect, select, tuple_
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from ..clock import as_utc
from ..exceptions import SchemaMissing, StoreError, StoreUnavailable
from ..settings import Settings, mask_dsn
from .base import ClaimRow, ClaimStore, NodeState
from .schema import claims_table, nodes_table

__all__ = ["SqlClaimStore"]


class SqlClaimStore(ClaimStore):
    """A claim store on a SQL database through a SQLAlchemy engine."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.metadata = MetaData()
        self.table: Table = claims_table(self.metadata, settings.table, settings.schema)
        self.nodes_table: Table = nodes_table(self.metadata, settings.nodes_table, settings.schema)
        self._schema_ready = False
        self.round_trips = 0

    # -- dialect hooks -------------------------------------------------------

    @abc.abstractmethod
    def _db_now(self, conn: Connection) -> datetime:
        """The store clock (aware UTC) read on *conn*."""

    @abc.abstractmethod
    def _upsert_node(self, conn: Connection, values: dict[str, Any]) -> None:
        """Insert or update the node row; keep started_at while boot_id is unchanged."""

    @abc.abstractmethod
    def _delete_batch(self, conn: Connection, cutoff: datetime, batch: int) -> int:
        """Delete up to *batch* claims with claimed_at < *cutoff*; return how many."""

    def _serialize_ddl(self, conn: Connection) -> None:
        """Keep nodes that start together from racing on DDL (a no-op by default)."""

    def _translate(self, exc: BaseException) -> StoreError:
        where = mask_dsn(self.settings.dsn)
        if isinstance(exc, sa_exc.OperationalError):
            return StoreUnavailable(f"the claims database {where} is unreachable or busy: "
                                    f"{exc.orig}")
        if isinstance(exc, sa_exc.TimeoutError):
            return StoreUnavailable(f"no connection to the claims database {where} is free: {exc}")
        return StoreError(f"the claims database {where} failed: {type(exc).__name__}: {exc}")

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
            raise self._translate(exc) from exc

    # -- schema --------------------------------------------------------------

    def ensure_schema(self) -> None:
        if self.settings.create_table:
            self.create_schema()
            return
        with self._translated(), self.engine.connect() as conn:
            self.round_trips += 1
            inspector = inspect(conn)
            for table in (self.table, self.nodes_table):
                if not inspector.has_table(table.name, schema=self.settings.schema):
                    raise SchemaMissing(missing_table_message(table))
        self._schema_ready = True

    def create_schema(self) -> None:
        """Create the tables whatever elarion_beat_create_table says (``init-db``)."""
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            self._serialize_ddl(conn)
            self.metadata.create_all(conn, checkfirst=True)
        self._schema_ready = True

    def _ready(self) -> None:
        if not self._schema_ready:
            self.ensure_schema()

    # -- maintenance ---------------------------------------------------------

    def purge(self, older_than: timedelta, batch_size: int = 5000, dry_run: bool = False) -> int:
        total = 0
        with self._translated():
            with self.engine.begin() as conn:
                self.round_trips += 1
                cutoff = self._db_now(conn) - older_than
                if dry_run:
                    query = select(func.count()).select_from(self.table).where(
                        self.table.c.claimed_at < self._param_time(cutoff))
                    return int(conn.execute(query).scalar_one())
            while True:
                with self.engine.begin() as conn:
                    self.round_trips += 1
                    deleted = self._delete_batch(conn, cutoff, batch_size)
                total += deleted
                if deleted < batch_size:
                    return total

    def _param_time(self, value: datetime) -> datetime:
        """How this dialect wants a datetime parameter (aware UTC by default)."""
        return as_utc(value)

    def heartbeat(self, state: NodeState) -> tuple[datetime, list[NodeState]]:
        with self._translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                now = self._db_now(conn)
                self._upsert_node(conn, {
                    "node": state.node, "boot_id": state.boot_id, "version": state.version,
                    "fingerprint": state.fingerprint, "host": state.host, "pid": state.pid,
                    "entries": json.dumps(state.entries, sort_keys=True),
                    "counts": json.dumps(state.counts, sort_keys=True),
                    "started_at": self._param_time(now), "last_seen": self._param_time(now),
                })
                rows = conn.execute(select(self.nodes_table)
                                    .order_by(self.nodes_table.c.node)).mappings().all()
        return now, [node_state(row) for row in rows]

    def nodes(self) -> tuple[datetime, list[NodeState]]:
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            now = self._db_now(conn)
            rows = conn.execute(select(self.nodes_table)
                                .order_by(self.nodes_table.c.node)).mappings().all()
        return now, [node_state(row) for row in rows]

    # -- the ledger ----------------------------------------------------------

    def find_claims(self, job: str | None = None, node: str | None = None,
                    since: datetime | None = None, limit: int = 100) -> list[ClaimRow]:
        c = self.table.c
        query = select(self.table).order_by(c.occurrence_utc.desc(), c.job_name).limit(limit)
        if job is not None:
            query = query.where(c.job_name == job)
        if node is not None:
            query = query.where(c.node == node)
        if since is not None:
            query = query.where(c.occurrence_utc >= self._param_time(since))
        return self._rows(query)

    def latest_claims(self) -> dict[str, ClaimRow]:
        c = self.table.c
        newest = (select(c.job_name, func.max(c.occurrence_utc).label("newest"))
                  .group_by(c.job_name).subquery())
        query = select(self.table).join(newest, and_(c.job_name == newest.c.job_name,
                                                     c.occurrence_utc == newest.c.newest))
        return {row.job: row for row in self._rows(query)}

    def existing(self, keys: Iterable[tuple[str, datetime]]) -> set[tuple[str, datetime]]:
        wanted = [(job, as_utc(occ)) for job, occ in keys]
        if not wanted:
            return set()
        c = self.table.c
        query = select(c.job_name, c.occurrence_utc).where(tuple_(c.job_name, c.occurrence_utc)
                                                           .in_([(job, self._param_time(occ))
                                                                 for job, occ in wanted]))
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            return {(job, as_utc(occ)) for job, occ in conn.execute(query)}

    def _rows(self, query: Any) -> list[ClaimRow]:
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            return [ClaimRow(r.job_name, as_utc(r.occurrence_utc), r.node, r.task_id, r.kind,
                             as_utc(r.claimed_at)) for r in conn.execute(query)]

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        self.engine.dispose()

    def describe(self) -> str:
        return f"{mask_dsn(self.settings.dsn)} (table {self.settings.qualified_table})"

    def _quoted(self, table: Table) -> str:
        return str(self.engine.dialect.identifier_preparer.format_table(table))


def node_state(row: Any) -> NodeState:
    return NodeState(
        node=row["node"], boot_id=row["boot_id"], version=row["version"],
        fingerprint=row["fingerprint"], entries=json.loads(row["entries"] or "{}"),
        counts=json.loads(row["counts"] or "{}"), host=row["host"], pid=row["pid"],
        started_at=as_utc(row["started_at"]), last_seen=as_utc(row["last_seen"]))


def missing_table_message(table: Table) -> str:
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    return (f"the table {name} does not exist and elarion_beat_create_table is False: "
            "create it with your migrations (celery_elarion_beat.claims_table(metadata) and "
            "nodes_table(metadata) declare the tables), run `celery -A proj elarion-beat "
            "init-db`, or set elarion_beat_create_table = True to let beat create it")


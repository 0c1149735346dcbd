"""The one-offs of the SQL stores (SQLAlchemy Core; a few dialect branches).

* **Lease**, one statement per batch on PostgreSQL and SQLite: ``WITH picked AS
  MATERIALIZED (SELECT id ... ORDER BY due_utc LIMIT n FOR UPDATE SKIP LOCKED)
  UPDATE ... WHERE id IN picked RETURNING ...``; concurrent nodes skip each other's
  rows instead of waiting (SQLite ignores ``FOR UPDATE``: its ``BEGIN IMMEDIATE``
  serializes the writers). MariaDB/MySQL allow no ``LIMIT`` in an ``IN`` subquery
  and no ``UPDATE ... RETURNING``: one transaction of ``SELECT ... FOR UPDATE SKIP
  LOCKED`` (expired leases, then due rows: two index-ordered reads), ``UPDATE``,
  ``SELECT`` (MariaDB 10.6+, MySQL 8.0+).
* **Add**: ``INSERT ... ON CONFLICT (idem_key) DO NOTHING`` (MariaDB/MySQL: a plain
  ``INSERT``, its duplicate-key error ignored: ``ON DUPLICATE KEY UPDATE`` would need
  ``UPDATE`` of every inserted column), then the row read back by id, else by key. On
  the caller's connection it joins the caller's transaction (the outbox pattern).
* **Cancel**: ``UPDATE ... WHERE state = 'scheduled'``. Against a lease of the same
  row the database decides: the lease's row lock makes the cancel wait and then
  find the row ``leased`` (too late); a cancel that locked first makes the lease
  skip the row, which it then finds ``cancelled``.

Every comparison with "now" uses the database clock (SQLite: the host's clock).
Every statement reads and writes the rows of the store's cluster only: a key is
unique within a cluster, and each app leases only its own one-offs.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Table, and_, bindparam, delete, func, or_, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from ..exceptions import ConfigurationError, SchemaMissing
from ..schedules.clock import as_utc
from .one_off_records import (
    FINISHED_STATES,
    LeasedOneOff,
    NewOneOff,
    OneOff,
    OneOffState,
)
from .records import PurgeProgress
from .sql_base import SqlBase

__all__ = ["SqlOneOffs", "missing_one_offs_message"]

_IDS_PER_QUERY = 1000
_SCHEDULED = OneOffState.SCHEDULED.value
_LEASED = OneOffState.LEASED.value
_MYSQL = ("mysql", "mariadb")
_DUPLICATE_KEY = 1062  # MariaDB/MySQL ER_DUP_ENTRY
_FINISHED = [state.value for state in FINISHED_STATES]


class SqlOneOffs(SqlBase):
    """The one-offs on a SQL database (:class:`~.interface.OneOffs`): the base gives
    the engine, the table, the clock and the error translation."""

    # -- dialect hooks -------------------------------------------------------------

    def _oo_now(self, conn: Connection) -> Any:
        """The store clock as a statement parameter or SQL expression."""
        return self._param_time(self._db_now(conn))

    def _oo_raw(self, conn: Any, stmt: Any) -> list[dict[str, Any]]:
        """Run *stmt* on a connection that is not SQLAlchemy's (PostgreSQL: psycopg)."""
        raise ConfigurationError(
            "schedule_once(connection=...) takes a SQLAlchemy Connection (Session.connection())"
            f" on this database, not {type(conn).__name__}")

    def _oo_added(self, conn: Any) -> None:
        """A one-off was written on *conn* (PostgreSQL: NOTIFY, delivered at commit)."""

    # -- helpers --------------------------------------------------------------------

    @contextlib.contextmanager
    def _oo_translated(self) -> Iterator[None]:
        try:
            with self._translated():
                yield
        except SchemaMissing as exc:
            raise SchemaMissing(missing_one_offs_message(self.one_offs_table)) from exc

    def _oo_exec(self, conn: Any, stmt: Any) -> list[dict[str, Any]]:
        self.round_trips += 1
        if not isinstance(conn, Connection):
            return self._oo_raw(conn, stmt)
        result = conn.execute(stmt)
        return [dict(m) for m in result.mappings()] if result.returns_rows else []

    def _oo_columns(self, payload: bool = False) -> list[Any]:
        skip = () if payload else ("content_type", "content_encoding", "body")
        return [c for c in self.one_offs_table.c if c.name not in skip]

    def _oo_match(self, c: Any, id_or_key: str) -> Any:
        return and_(c.cluster == self.cluster, or_(c.id == id_or_key, c.idem_key == id_or_key))

    # -- the methods -----------------------------------------------------------------

    def add_one_off(self, new: NewOneOff, connection: Any = None) -> OneOff:
        with self._oo_translated():
            self._ready()
            if connection is not None:
                if isinstance(connection, Connection) and \
                        connection.dialect.name != self.engine.dialect.name:
                    raise ConfigurationError(
                        f"schedule_once(connection=...) got a {connection.dialect.name} "
                        f"connection, and elarion_beat_dsn is {self.engine.dialect.name}: "
                        "pass a connection to the claims database")
                return self._add(connection, new)
            with self.engine.begin() as conn:
                return self._add(conn, new)

    def _add(self, conn: Any, new: NewOneOff) -> OneOff:
        t = self.one_offs_table
        now = self._oo_now(conn) if isinstance(conn, Connection) else self._oo_now_raw()
        due = self._param_time(new.due) if new.due is not None \
            else now + timedelta(seconds=new.delay or 0.0)
        values = {"cluster": self.cluster, "id": new.id, "idem_key": new.key,
                  "task_name": new.task, "due_utc": due,
                  "state": _SCHEDULED, "created_at": now, "attempts": 0,
                  "options": json.dumps(dict(new.options), sort_keys=True),
                  "content_type": new.content_type, "content_encoding": new.content_encoding,
                  "body": new.body}
        try:
            self._oo_exec(conn, self._insert(values))
        except sa_exc.IntegrityError as exc:  # MariaDB/MySQL: the key is taken (1062)
            if self.engine.dialect.name not in _MYSQL or _errno(exc) != _DUPLICATE_KEY:
                raise
        columns = self._oo_columns()
        rows = self._oo_exec(conn, select(*columns).where(t.c.id == new.id))
        if rows:
            self._oo_added(conn)
            return one_off_from_row(rows[0])
        rows = self._oo_exec(conn, select(*columns).where(t.c.cluster == self.cluster,
                                                          t.c.idem_key == new.key))
        if not rows:  # a table of 0.2: the key is unique across clusters until init-db
            rows = self._oo_exec(conn, select(*columns).where(t.c.idem_key == new.key))
        return one_off_from_row(rows[0])

    def _oo_now_raw(self) -> Any:
        return func.statement_timestamp()

    def _insert(self, values: dict[str, Any]) -> Any:
        t = self.one_offs_table
        name = self.engine.dialect.name
        # no conflict target: the key (cluster, idem_key) holds, and idem_key's of a
        # table of 0.2 (its unique index stays until init-db)
        if name == "postgresql":
            return postgresql.insert(t).values(**values).on_conflict_do_nothing()
        if name == "sqlite":
            return sqlite.insert(t).values(**values).on_conflict_do_nothing()
        # a plain INSERT, the taken key caught in _add: MariaDB refuses ON DUPLICATE KEY
        # UPDATE to a role without UPDATE on every inserted column (database-role.md)
        return mysql_dialect.insert(t).values(**values)

    def lease_one_offs(self, node: str, *, limit: int, lease: timedelta) -> list[LeasedOneOff]:
        t = self.one_offs_table
        c = t.c
        with self._oo_translated():
            self._ready()
            with self.engine.begin() as conn:
                now = self._oo_now(conn)
                due = and_(c.cluster == self.cluster,
                           or_(and_(c.state == _SCHEDULED, c.due_utc <= now),
                               and_(c.state == _LEASED, c.lease_until < now)))
                pick = (select(c.id).where(due).order_by(c.due_utc, c.id).limit(limit)
                        .with_for_update(skip_locked=True))
                taken = {"state": _LEASED, "lease_node": node, "lease_until": now + lease,
                         "attempts": c.attempts + 1}
                if self.engine.dialect.name in _MYSQL:
                    ids = self._pick_in_steps(conn, now, limit)
                    if not ids:
                        return []
                    self._oo_exec(conn, t.update().where(c.id.in_(ids)).values(**taken))
                    rows = self._oo_exec(conn, select(*self._oo_columns(True))
                                         .where(c.id.in_(ids)))
                else:
                    picked = pick.cte("picked").prefix_with("MATERIALIZED")
                    rows = self._oo_exec(conn, t.update().where(
                        c.id.in_(select(picked.c.id))).values(**taken)
                        .returning(*self._oo_columns(True)))
        out = [leased_from_row(r) for r in rows]
        out.sort(key=lambda r: (r.one_off.due, r.id))
        return out

    def _pick_in_steps(self, conn: Connection, now: Any, limit: int) -> list[str]:
        """MariaDB/MySQL: the expired leases, then the due rows, each read in the order of
        ``ix_<table>_due`` so that InnoDB locks only the rows it returns (one ``OR``
        query sorts after locking every match, and the other nodes skip them all)."""
        c = self.one_offs_table.c
        ids: list[str] = []
        for where in ((c.cluster == self.cluster, c.state == _LEASED, c.lease_until < now),
                      (c.cluster == self.cluster, c.state == _SCHEDULED, c.due_utc <= now)):
            if len(ids) < limit:
                ids += [r["id"] for r in self._oo_exec(conn, select(c.id).where(*where)
                        .order_by(c.due_utc, c.id).limit(limit - len(ids))
                        .with_for_update(skip_locked=True))]
        return ids

    def finish_one_offs(self, node: str, published: Sequence[str], failed: Mapping[str, str],
                        released: Sequence[str] = ()) -> None:
        if not (published or failed or released):
            return
        t = self.one_offs_table
        c = t.c
        mine = (c.cluster == self.cluster, c.lease_node == node, c.state == _LEASED)
        with self._oo_translated():
            self._ready()
            with self.engine.begin() as conn:
                now = self._oo_now(conn)

                def update(ids: Sequence[str], **values: Any) -> None:
                    for start in range(0, len(ids), _IDS_PER_QUERY):
                        part = list(ids[start:start + _IDS_PER_QUERY])
                        self._oo_exec(conn, t.update().where(c.id.in_(part), *mine)
                                      .values(**values))

                update(published, state=OneOffState.PUBLISHED.value, published_at=now,
                       finished_at=now)
                if failed:
                    self.round_trips += 1
                    conn.execute(t.update().where(c.id == bindparam("k_id"), *mine).values(
                        state=OneOffState.FAILED.value, error=bindparam("k_error"),
                        finished_at=now),
                        [{"k_id": id_, "k_error": error} for id_, error in failed.items()])
                update(released, state=_SCHEDULED, lease_node=None, lease_until=None)

    def cancel_one_off(self, id_or_key: str) -> OneOff | None:
        t = self.one_offs_table
        c = t.c
        with self._oo_translated():
            self._ready()
            with self.engine.begin() as conn:
                now = self._oo_now(conn)
                self._oo_exec(conn, t.update().where(
                    self._oo_match(c, id_or_key), c.state == _SCHEDULED).values(
                    state=OneOffState.CANCELLED.value, finished_at=now))
                rows = self._oo_exec(conn, select(*self._oo_columns())
                                     .where(self._oo_match(c, id_or_key)).limit(1))
        return one_off_from_row(rows[0]) if rows else None

    def one_offs(self, *, id_or_key: str | None = None,
                 states: Collection[OneOffState] | None = None,
                 limit: int = 100, order: str = "-due") -> list[OneOff]:
        c = self.one_offs_table.c
        column = c.finished_at if order.endswith("finished") else c.due_utc
        ordered = (column.desc(), c.id.desc()) if order.startswith("-") \
            else (column.asc(), c.id.asc())
        query = (select(*self._oo_columns()).where(c.cluster == self.cluster)
                 .order_by(*ordered).limit(limit))
        if id_or_key is not None:
            query = query.where(self._oo_match(c, id_or_key))
        if states is not None:
            query = query.where(c.state.in_([OneOffState(s).value for s in states]))
        with self._oo_translated():
            self._ready()
            with self.engine.begin() as conn:
                return [one_off_from_row(r) for r in self._oo_exec(conn, query)]

    def next_one_off_due(self) -> datetime | None:
        c = self.one_offs_table.c
        t = self.one_offs_table
        due = select(func.min(c.due_utc)).where(
            c.cluster == self.cluster, c.state == _SCHEDULED).scalar_subquery()
        lease = select(func.min(c.lease_until)).where(
            c.cluster == self.cluster, c.state == _LEASED).scalar_subquery()
        with self._oo_translated():
            self._ready()
            with self.engine.begin() as conn:
                (row,) = self._oo_exec(conn, select(due.label("due"), lease.label("lease"))
                                       .select_from(t).limit(1)) or [{"due": None,
                                                                      "lease": None}]
        times = [as_utc(v) for v in (row["due"], row["lease"]) if v is not None]
        return min(times, default=None)

    def purge_one_offs(self, older_than: timedelta, batch_size: int = 5000,
                       dry_run: bool = False) -> int:
        if not dry_run:
            return self.purge_one_offs_pass(older_than, batch_size=batch_size).total
        c = self.one_offs_table.c
        with self._oo_translated():
            self._ready()
            with self.engine.begin() as conn:
                cutoff = self._param_time(self._db_now(conn) - older_than)
                (row,) = self._oo_exec(conn, select(func.count().label("n")).where(
                    c.cluster == self.cluster, c.state.in_(_FINISHED), c.finished_at < cutoff))
        return int(row["n"])

    def purge_one_offs_pass(self, older_than: timedelta, batch_size: int = 5000,
                            budget: float | None = None, resume: PurgeProgress | None = None,
                            monotonic: Callable[[], float] = time.monotonic) -> PurgeProgress:
        t = self.one_offs_table
        c = t.c
        started = monotonic()
        deleted = 0
        with self._oo_translated():
            self._ready()
            if resume is not None:
                cutoff = resume.cutoff
            else:
                with self.engine.begin() as conn:
                    cutoff = self._db_now(conn) - older_than
            while True:
                with self.engine.begin() as conn:
                    ids = [r["id"] for r in self._oo_exec(conn, select(c.id).where(
                        c.cluster == self.cluster, c.state.in_(_FINISHED),
                        c.finished_at < self._param_time(cutoff)).limit(batch_size))]
                    if ids:
                        self._oo_exec(conn, delete(t).where(c.id.in_(ids)))
                deleted += len(ids)
                done = len(ids) < batch_size
                if done or (budget is not None and monotonic() - started >= budget):
                    break
        return PurgeProgress(cutoff, deleted, deleted + (resume.total if resume else 0), done)


def _errno(exc: sa_exc.DBAPIError) -> int | None:
    args = getattr(exc.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def missing_one_offs_message(table: Table) -> str:
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    return (f"the one-offs table {name} does not exist: run `celery -A proj elarion-beat "
            "init-db`, add celery_elarion_beat.one_offs_table(metadata) to your migrations, "
            "or set elarion_beat_create_table = True")


def one_off_from_row(r: Mapping[str, Any]) -> OneOff:
    """A :class:`OneOff` from a row (mapping) of the one-offs table."""
    def at(value: Any) -> datetime | None:
        return as_utc(value) if value is not None else None

    return OneOff(id=r["id"], key=r["idem_key"], task=r["task_name"], due=as_utc(r["due_utc"]),
                  state=OneOffState(r["state"]), created=as_utc(r["created_at"]),
                  node=r["lease_node"], lease_until=at(r["lease_until"]),
                  attempts=int(r["attempts"] or 0), published=at(r["published_at"]),
                  error=r["error"], options=json.loads(r["options"] or "{}"))


def leased_from_row(r: Mapping[str, Any]) -> LeasedOneOff:
    """A :class:`LeasedOneOff` from a row (mapping) with the payload columns."""
    return LeasedOneOff(one_off_from_row(r), r["content_type"], r["content_encoding"],
                        bytes(r["body"]))

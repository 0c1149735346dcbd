"""The database entries on a SQL database (:class:`~.interface.LiveEntries`, SQLAlchemy
Core, every dialect; the triggers are :mod:`.entry_triggers`).

A write (:meth:`SqlLiveEntries.write_entries`) is one transaction, in this order:

1. **open the batch**: upsert the cluster's row of the versions table, ``version + 1``,
   ``batch = 1`` with the actor and reason: the row is locked until commit, so writers
   of one cluster (the API's, and raw SQL through the triggers) take their versions in
   commit order, and a claim that checks a revision (which reads the row ``FOR SHARE``)
   either committed before or sees the change;
2. read the store clock (after the lock) and the entries the changes name; refuse the
   write whole on a stale revision, a name taken or missing, an effective time in the
   past (nothing is left of it: a savepoint on the caller's connection, a rollback on
   ours);
3. write the rows; the triggers stamp them and write the revision rows with the
   batch's version (one version, however many rows);
4. close the batch (``batch = 0``) and read the rows back.

On the caller's *connection* (a SQLAlchemy ``Connection``, or on PostgreSQL a psycopg 3
connection) the write runs in a savepoint inside the caller's transaction and commits
with it. The nodes read the version (:meth:`entries_version`, one key read) and the
revisions after the version they hold (:meth:`entry_changes`); a claim of a database
entry is refused unless its revision governs the occurrence (:meth:`_stale_requests`,
PostgreSQL checks it inside its claim statement).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Table, delete, func, insert, inspect, literal, select, update
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from ..config.live_entries import EntryDefinition
from ..exceptions import ConfigurationError, SchemaMissing
from ..schedules.clock import as_utc
from ..schedules.slots import ClaimKind
from .entry_records import (
    EntryChange,
    EntryChanges,
    EntryRevision,
    EntrySnapshot,
    EntryWrite,
    StoredEntry,
    check_unique_names,
    governing,
    plan_writes,
)
from .entry_triggers import entries_channel, entry_trigger_ddl, has_entry_triggers
from .records import ClaimRequest
from .sql_base import KEYS_PER_QUERY, SqlBase

__all__ = ["SqlLiveEntries", "entry_revision", "missing_entries_message", "stored_entry"]


class _NothingChanged(Exception):
    """Every change of a write was a no-op: roll the batch back."""


class SqlLiveEntries(SqlBase):
    """The database entries on a SQL database; the base gives the engine, the clock and
    the error translation."""

    @property
    def entries_channel(self) -> str:
        """The NOTIFY channel of this entries table (PostgreSQL)."""
        return entries_channel(self.settings.entries_table, self.settings.schema)

    # -- schema -------------------------------------------------------------------

    def entry_trigger_statements(self) -> list[str]:
        """The DDL of the entries table's triggers on this database."""
        return entry_trigger_ddl(self.engine.dialect.name, self.settings.table,
                                 self.settings.schema)

    def ensure_entries_schema(self, create: bool | None = None) -> None:
        """Create the entries tables and their triggers (when *create*, by default
        ``elarion_beat_create_table``), else check that they exist. Called at the first
        use of the entries (beat's follower, the API): the workers never need them."""
        create = self.settings.create_table if create is None else create
        with self._translated():
            if create:
                self._create_entries_schema()
            else:
                with self.engine.connect() as conn:
                    self.round_trips += 1
                    inspector = inspect(conn)
                    for table in (self.entries, self.revisions, self.versions):
                        if not inspector.has_table(table.name, schema=self.settings.schema):
                            raise SchemaMissing(missing_entries_message(table))
                    # MariaDB and MySQL show a trigger only to a role with the TRIGGER
                    # privilege, which beat's role has no need of: checked where visible
                    visible = self.engine.dialect.name not in ("mysql", "mariadb")
                    if visible and not has_entry_triggers(conn, self.engine.dialect.name,
                                                          self.entries.name,
                                                          self.settings.schema):
                        raise SchemaMissing(missing_entries_message(self.entries,
                                                                    triggers=True))
        self._entries_ready_flag = True

    def _create_entries_schema(self) -> None:
        with self.engine.begin() as conn:
            self.round_trips += 1
            self._serialize_ddl(conn)
            self.entries_metadata.create_all(conn, checkfirst=True)
            if not has_entry_triggers(conn, self.engine.dialect.name, self.entries.name,
                                      self.settings.schema):
                for statement in self.entry_trigger_statements():
                    conn.exec_driver_sql(statement)

    def _entries_ready(self) -> None:
        if not self._entries_ready_flag:
            self.ensure_entries_schema()

    @contextlib.contextmanager
    def _entries_translated(self) -> Iterator[None]:
        """:meth:`_translated`, naming the entries tables when one is missing (and
        checking them again at the next call)."""
        try:
            with self._translated():
                yield
        except SchemaMissing as exc:
            self._entries_ready_flag = False
            raise SchemaMissing(missing_entries_message(self.entries)) from exc

    # -- how a statement runs (a dialect hook: psycopg connections on PostgreSQL) ---

    def _entry_rows(self, conn: Any, stmt: Any) -> list[dict[str, Any]]:
        self.round_trips += 1
        if not isinstance(conn, Connection):
            raise ConfigurationError(
                "connection= takes a SQLAlchemy Connection (Session.connection()) on this "
                f"database, not {type(conn).__name__}")
        result = conn.execute(stmt)
        return [dict(m) for m in result.mappings()] if result.returns_rows else []

    @contextlib.contextmanager
    def _entry_savepoint(self, conn: Any) -> Iterator[None]:
        """A savepoint on the caller's connection, rolled back if the write is refused."""
        if not isinstance(conn, Connection):
            raise ConfigurationError(
                "connection= takes a SQLAlchemy Connection (Session.connection()) on this "
                f"database, not {type(conn).__name__}")
        if conn.dialect.name != self.engine.dialect.name:
            raise ConfigurationError(
                f"connection= got a {conn.dialect.name} connection, and elarion_beat_dsn is "
                f"{self.engine.dialect.name}: pass a connection to the claims database")
        with conn.begin_nested():
            yield

    def _entry_now(self, conn: Any) -> datetime:
        rows = self._entry_rows(conn, select(self._now_expression().label("now")))
        return as_utc(rows[0]["now"])

    def _now_expression(self) -> Any:
        """The store clock as an SQL expression (SQLite: the host's clock, bound)."""
        name = self.engine.dialect.name
        if name == "postgresql":
            return func.clock_timestamp()
        if name in ("mysql", "mariadb"):
            return func.utc_timestamp(6)
        return literal(self._param_time(self._clock_now()))

    def _clock_now(self) -> datetime:
        raise NotImplementedError  # SQLite provides its clock

    # -- writes ----------------------------------------------------------------------

    def write_entries(self, cluster: str, changes: Sequence[EntryChange], actor: str,
                      reason: str = "", connection: Any = None) -> EntryWrite:
        check_unique_names(changes)
        if not changes:
            return EntryWrite(None, [])
        with self._entries_translated():
            self._ready()
            self._entries_ready()
            try:
                if connection is not None:
                    with self._entry_savepoint(connection):
                        return self._write(connection, cluster, changes, actor, reason)
                with self.engine.begin() as conn:
                    return self._write(conn, cluster, changes, actor, reason)
            except _NothingChanged as nothing:
                current: list[StoredEntry | None] = nothing.args[0]
                return EntryWrite(None, current)

    def _write(self, conn: Any, cluster: str, changes: Sequence[EntryChange], actor: str,
               reason: str) -> EntryWrite:
        version = self._open_batch(conn, cluster, actor, reason)
        now = self._entry_now(conn)
        self._entry_rows(conn, update(self.versions).where(self.versions.c.cluster == cluster)
                         .values(at=self._param_time(now)))
        held = self._read_entries(conn, cluster, [c.name for c in changes])
        writes = plan_writes(changes, held, now)
        if not writes:
            raise _NothingChanged([held.get(c.name) for c in changes])
        e = self.entries.c
        for change, effective in writes:
            key = (e.cluster == cluster, e.name == change.name)
            if change.action == "remove":
                self._entry_rows(conn, delete(self.entries).where(*key))
                continue
            assert change.definition is not None
            values = {**change.definition.columns(),
                      "effective_at": self._param_time(effective),
                      "restart": change.restart}
            if change.action in ("add", "override"):
                values.update(cluster=cluster, name=change.name, revision=0, actor=actor,
                              reason=reason, overrides=change.action == "override",
                              code_digest=change.code_digest)
                self._entry_rows(conn, insert(self.entries).values(**values))
            else:
                self._entry_rows(conn, update(self.entries).where(*key).values(**values))
        self._entry_rows(conn, update(self.versions).where(self.versions.c.cluster == cluster)
                         .values(batch=0, actor=None, reason=None))
        after = self._read_entries(conn, cluster, [c.name for c in changes])
        return EntryWrite(version, [after.get(c.name) for c in changes], now)

    def _open_batch(self, conn: Any, cluster: str, actor: str, reason: str) -> int:
        """Bump the cluster's version once for this write and lock its row (see the
        module docstring); the version."""
        v = self.versions
        values = {"cluster": cluster, "version": 1, "batch": 1, "actor": actor,
                  "reason": reason}
        bumped = {"version": v.c.version + 1, "batch": 1, "actor": actor, "reason": reason}
        name = self.engine.dialect.name
        stmt: Any
        if name == "postgresql":
            stmt = postgresql.insert(v).values(**values).on_conflict_do_update(
                index_elements=[v.c.cluster], set_=bumped)
        elif name == "sqlite":
            stmt = sqlite.insert(v).values(**values).on_conflict_do_update(
                index_elements=[v.c.cluster], set_=bumped)
        else:
            stmt = mysql_dialect.insert(v).values(**values).on_duplicate_key_update(**bumped)
        self._entry_rows(conn, stmt)
        rows = self._entry_rows(conn, select(v.c.version).where(v.c.cluster == cluster))
        return int(rows[0]["version"])

    def _read_entries(self, conn: Any, cluster: str,
                      names: Sequence[str] | None) -> dict[str, StoredEntry]:
        e = self.entries.c
        out: dict[str, StoredEntry] = {}
        if names is None:
            query = select(self.entries).where(e.cluster == cluster).order_by(e.name)
            return {r["name"]: stored_entry(r) for r in self._entry_rows(conn, query)}
        ordered = sorted(set(names))
        for start in range(0, len(ordered), KEYS_PER_QUERY):
            part = ordered[start:start + KEYS_PER_QUERY]
            query = select(self.entries).where(e.cluster == cluster, e.name.in_(part))
            out.update((r["name"], stored_entry(r)) for r in self._entry_rows(conn, query))
        return out

    # -- reads ------------------------------------------------------------------------

    def entries_version(self, cluster: str) -> int:
        v = self.versions.c
        with self._entries_translated():
            self._entries_ready()
            with self.engine.connect() as conn:
                found = self._entry_rows(conn, select(v.version).where(v.cluster == cluster))
                conn.rollback()
        return int(found[0]["version"]) if found else 0

    def live_entries(self, cluster: str) -> EntrySnapshot:
        v = self.versions.c
        with self._entries_translated():
            self._entries_ready()
            with self.engine.begin() as conn:
                # the version first: rows read after it are as new or newer (a change
                # seen twice is applied twice, the same; one never seen would be lost)
                found = self._entry_rows(conn, select(v.version).where(v.cluster == cluster))
                now = self._db_now(conn)
                rows = self._read_entries(conn, cluster, None)
        version = int(found[0]["version"]) if found else 0
        return EntrySnapshot(version, list(rows.values()), now)

    def entry_changes(self, cluster: str, since: int, limit: int = 5000) -> EntryChanges:
        r = self.revisions.c
        query = (select(self.revisions).where(r.cluster == cluster, r.revision > since)
                 .order_by(r.revision, r.name).limit(limit + 1))
        with self._entries_translated():
            self._entries_ready()
            with self.engine.begin() as conn:
                rows = [entry_revision(row) for row in self._entry_rows(conn, query)]
        more = len(rows) > limit
        rows = rows[:limit]
        return EntryChanges(max((x.revision for x in rows), default=since), rows, more)

    def entry_history(self, cluster: str, name: str | None = None,
                      limit: int = 100) -> list[EntryRevision]:
        r = self.revisions.c
        query = (select(self.revisions).where(r.cluster == cluster)
                 .order_by(r.revision.desc(), r.name).limit(limit))
        if name is not None:
            query = query.where(r.name == name)
        with self._entries_translated():
            self._entries_ready()
            with self.engine.begin() as conn:
                return [entry_revision(row) for row in self._entry_rows(conn, query)]

    # -- the claims' check ----------------------------------------------------------------

    def _stale_requests(self, conn: Connection, requests: Sequence[ClaimRequest],
                        now: datetime) -> set[int]:
        """The requests (by ``id``) whose revision does not govern their occurrence (a
        window's: *now*), read after the versions row is locked ``FOR SHARE``: an edit
        in flight commits first, and one that comes later has a later effective time."""
        ruled = [r for r in requests if r.revision is not None]
        if not ruled:
            return set()
        stale: set[int] = set()
        v, x = self.versions.c, self.revisions.c
        conn.execute(select(v.version).where(v.cluster == self.cluster)
                     .with_for_update(read=True))
        oldest = min(r.revision or 0 for r in ruled)
        names = sorted({r.job for r in ruled})
        known: dict[str, list[EntryRevision]] = {}
        for start in range(0, len(names), KEYS_PER_QUERY):
            part = names[start:start + KEYS_PER_QUERY]
            for row in conn.execute(select(self.revisions).where(
                    x.cluster == self.cluster, x.name.in_(part),
                    x.revision >= oldest)).mappings():
                rev = entry_revision(row)
                known.setdefault(rev.name, []).append(rev)
        for request in ruled:
            at = request.slot if request.kind is ClaimKind.SLOT and request.slot else now
            found = governing(known.get(request.job, ()), at)
            if found is None or found.revision != request.revision or found.removed:
                stale.add(id(request))
        return stale


def stored_entry(r: Any) -> StoredEntry:
    """A :class:`StoredEntry` from a row (mapping) of the entries table."""
    return StoredEntry(
        cluster=r["cluster"], name=r["name"], definition=EntryDefinition.from_columns(r),
        revision=int(r["revision"] or 0),
        effective_at=as_utc(r["effective_at"] or r["updated_at"]),
        updated_at=as_utc(r["updated_at"] or r["effective_at"]), actor=r["actor"] or "",
        reason=r["reason"] or "", overrides=bool(r["overrides"]),
        code_digest=r["code_digest"], restart=bool(r["restart"]))


def entry_revision(r: Any) -> EntryRevision:
    """An :class:`EntryRevision` from a row (mapping) of the revisions table."""
    return EntryRevision(
        cluster=r["cluster"], name=r["name"], revision=int(r["revision"]), action=r["action"],
        definition=EntryDefinition.from_columns(r), effective_at=as_utc(r["effective_at"]),
        at=as_utc(r["at"]), actor=r["actor"] or "", reason=r["reason"] or "",
        overrides=bool(r["overrides"]), code_digest=r["code_digest"],
        restart=bool(r["restart"]))


def missing_entries_message(table: Table, triggers: bool = False) -> str:
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    what = f"the triggers of the table {name} do" if triggers else f"the table {name} does"
    return (f"{what} not exist and elarion_beat_create_table is False, while "
            "elarion_beat_db_entries is on: run `celery -A proj elarion-beat init-db`, or apply "
            "the live-schedules migration (docs/howto/live-schedules.md)")

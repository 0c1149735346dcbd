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
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    MetaData,
    Table,
    and_,
    bindparam,
    case,
    func,
    inspect,
    literal,
    or_,
    select,
    tuple_,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.schema import CreateIndex

from ..backends import mask_dsn
from ..clock import as_utc
from ..exceptions import (
    ClaimRefused,
    SchemaMissing,
    StoreError,
    StoreRefused,
    StoreUnavailable,
)
from ..settings import Settings
from .base import (
    ALL_JOBS,
    AuditEntry,
    ClaimRequest,
    ClaimResult,
    ClaimRow,
    ClaimStore,
    JobLedger,
    ManualClaim,
    NodeState,
    Pause,
    PublishReport,
    PurgeProgress,
    RunReport,
    Takeover,
    pauses_in_force,
)
from .oneoff_rows import one_offs_table
from .refusal import refusal
from .schema import (
    EVERY_NODE_KIND,
    FAILED,
    MANUAL_KIND,
    PENDING,
    PUBLISHED,
    RUNNING,
    SKIPPED,
    TOKEN_LENGTH,
    UNPUBLISHED,
    audit_table,
    claims_table,
    nodes_table,
    pauses_table,
)
from .sql_oneoffs import SqlOneOffs

#: Keys per statement when a query lists (job, occurrence) keys or job names.
_KEYS_PER_QUERY = 1000

__all__ = ["SqlClaimStore"]


class SqlClaimStore(SqlOneOffs, ClaimStore):
    """A claim store on a SQL database through a SQLAlchemy engine."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.metadata = MetaData()
        self.table: Table = claims_table(self.metadata, settings.table, settings.schema,
                                         partitioned=settings.claims_layout == "partitioned")
        self.nodes_table: Table = nodes_table(self.metadata, settings.nodes_table, settings.schema)
        self.pauses_table: Table = pauses_table(self.metadata, settings.pauses_table,
                                                settings.schema)
        self.audit_table: Table = audit_table(self.metadata, settings.audit_table,
                                              settings.schema)
        self.one_offs_table: Table = one_offs_table(self.metadata, settings.one_offs_table,
                                                    settings.schema)
        self._schema_ready = False
        #: (node, boot id, fingerprint) of the node row this store last wrote whole
        self._node_written: tuple[str, str, str] | None = None
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

    @contextlib.contextmanager
    def _serialized(self, conn: Connection, key: str) -> Iterator[None]:
        """One transaction on *conn*, serialized with every other one of *key* (the
        default suits a database whose transactions are serialized already)."""
        with conn.begin():
            yield

    def _missing_table(self, exc: BaseException) -> bool:
        """Whether *exc* says the claims table does not exist (a dialect hook)."""
        return False

    def _translate(self, exc: BaseException) -> StoreError:
        if self._missing_table(exc):
            self._schema_ready = False
            return SchemaMissing(missing_table_message(self.table))
        where = mask_dsn(self.settings.dsn)
        fix = refusal(exc)
        if fix is not None:
            return StoreRefused(f"the claims database {where} refused this node ({fix}): "
                                f"{getattr(exc, 'orig', None) or exc}")
        if isinstance(exc, (sa_exc.DataError, sa_exc.IntegrityError, UnicodeError)) or (
                isinstance(exc, sa_exc.StatementError)
                and not isinstance(exc, sa_exc.DBAPIError)):
            return ClaimRefused(f"the claims database {where} refused the data: "
                                f"{getattr(exc, 'orig', None) or exc}")
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
        except (sa_exc.StatementError, sa_exc.TimeoutError, UnicodeError) as exc:
            raise self._translate(exc) from exc

    # -- schema --------------------------------------------------------------

    def ensure_schema(self) -> None:
        if self.settings.create_table:
            self.create_schema()
            return
        with self._translated(), self.engine.connect() as conn:
            self.round_trips += 1
            inspector = inspect(conn)
            for table in (self.table, self.nodes_table, self.pauses_table, self.audit_table):
                if not inspector.has_table(table.name, schema=self.settings.schema):
                    raise SchemaMissing(missing_table_message(table))
            self._check_layout(conn, create=False)
            upgrades = self._upgrades(conn)
            if upgrades:
                raise SchemaMissing(outdated_table_message(self.table, upgrades))
        self._schema_ready = True

    def create_schema(self) -> None:
        """Create the tables whatever elarion_beat_create_table says (``init-db``),
        and bring tables made by an older version up to date."""
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            self._serialize_ddl(conn)
            self.metadata.create_all(conn, checkfirst=True)
            self._check_layout(conn, create=True)
            for statement in self._upgrades(conn):
                conn.exec_driver_sql(statement)
        self._schema_ready = True

    def _check_layout(self, conn: Connection, create: bool) -> None:
        """Check that the claims table has the layout of ``elarion_beat_claims_layout``
        and (with *create*) make what the layout needs besides the table; raise
        :class:`SchemaMissing` otherwise (a dialect hook: only one layout by default)."""

    def _upgrades(self, conn: Connection) -> list[str]:
        """The DDL that brings tables of an older version up to date (none when current):
        the columns added since 0.1, then the index of unpublished claims."""
        inspector = inspect(conn)
        schema = self.settings.schema
        columns = {c["name"] for c in inspector.get_columns(self.table.name, schema=schema)}
        table = self._quoted(self.table)
        stamp = self._timestamp_ddl()
        added = {"claim_token": f"VARCHAR({TOKEN_LENGTH})", "state": "VARCHAR(16)",
                 "published_at": stamp, "publish_error": "TEXT",
                 "takeovers": "INTEGER NOT NULL DEFAULT 0",
                 # 0.2 too: what ran (the workers' run tracking)
                 "run_state": "VARCHAR(16)", "started_at": stamp, "finished_at": stamp,
                 "worker": "TEXT", "runtime": self._ddl_type("runtime"), "run_error": "TEXT"}
        out = [f"ALTER TABLE {table} ADD COLUMN {name} {ddl}"
               for name, ddl in added.items() if name not in columns]
        have = {i["name"] for i in inspector.get_indexes(self.table.name, schema=schema)}
        for index in (f"ix_{self.table.name}_pending", f"ix_{self.table.name}_job_claimed"):
            if index not in have:
                found = next(i for i in self.table.indexes if i.name == index)
                out.append(str(CreateIndex(found).compile(dialect=self.engine.dialect)))
        return out

    def _ddl_type(self, column: str) -> str:
        """The DDL type of one of the claims table's columns on this dialect."""
        return str(self.table.c[column].type.compile(dialect=self.engine.dialect))

    def _timestamp_ddl(self) -> str:
        """The DDL type of a timestamp column on this dialect."""
        return self._ddl_type("published_at")

    def _ready(self) -> None:
        if not self._schema_ready:
            self.ensure_schema()

    # -- maintenance ---------------------------------------------------------

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
            old.c.claimed_at < self._param_time(cutoff), newer)
        return int(conn.execute(query).scalar_one())

    def _purgeable(self) -> tuple[Any, Any]:
        """An alias of the claims table and the condition "a newer claim of the job
        exists", which keeps every job's newest claim out of the purge."""
        old, new = self.table.alias("o"), self.table.alias("n")
        newer = select(new.c.job_name).where(new.c.job_name == old.c.job_name,
                                             new.c.occurrence_utc > old.c.occurrence_utc)
        return old, newer.exists()

    def _param_time(self, value: datetime) -> datetime:
        """How this dialect wants a datetime parameter (aware UTC by default)."""
        return as_utc(value)

    def heartbeat(self, state: NodeState, retention: timedelta | None = None,
                  live_within: timedelta | None = None) -> tuple[datetime, list[NodeState]]:
        nodes = self.nodes_table
        with self._translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                now = self._db_now(conn)
                written = (state.node, state.boot_id, state.fingerprint)
                # the entries (a digest each: megabytes at 100,000 entries) are written
                # when they changed, not with every heartbeat
                if written != self._node_written or not self._touch_node(conn, state, now):
                    self._upsert_node(conn, {
                        "node": state.node, "boot_id": state.boot_id, "version": state.version,
                        "fingerprint": state.fingerprint, "host": state.host, "pid": state.pid,
                        "entries": json.dumps(state.entries, sort_keys=True),
                        "counts": dump_counts(state.counts),
                        "started_at": self._param_time(now), "last_seen": self._param_time(now),
                    })
                if retention is not None:
                    conn.execute(nodes.delete().where(
                        nodes.c.last_seen < self._param_time(now - retention)))
                # only what the heartbeat needs: no counts, and a node's entries only
                # when its schedule differs from this node's
                entries = case((nodes.c.fingerprint == state.fingerprint, literal("{}")),
                               else_=nodes.c.entries)
                query = (select(*[c for c in nodes.c if c.name not in ("entries", "counts")],
                                entries.label("entries"), literal("[]").label("counts"))
                         .order_by(nodes.c.node))
                if live_within is not None:
                    query = query.where(nodes.c.last_seen >= self._param_time(now - live_within))
                rows = conn.execute(query).mappings().all()
        self._node_written = written  # committed
        return now, [node_state(row) for row in rows]

    def _touch_node(self, conn: Connection, state: NodeState, now: datetime) -> bool:
        """The heartbeat of a node whose row holds its entries already: last seen and
        counts only. False when the row is gone or another process wrote it since."""
        nodes = self.nodes_table
        result = conn.execute(nodes.update().where(
            nodes.c.node == state.node, nodes.c.boot_id == state.boot_id,
            nodes.c.fingerprint == state.fingerprint,
        ).values(last_seen=self._param_time(now), counts=dump_counts(state.counts),
                 version=state.version, host=state.host, pid=state.pid))
        return bool(result.rowcount)

    def clock(self) -> datetime:
        with self._translated(), self.engine.connect() as conn:
            self.round_trips += 1
            now = self._db_now(conn)
            conn.rollback()
            return now

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

    def latest_claims(self, jobs: Collection[str] | None = None,
                      before: datetime | None = None) -> dict[str, ClaimRow]:
        if jobs is not None:
            names = sorted(set(jobs))
            out: dict[str, ClaimRow] = {}
            for start in range(0, len(names), _KEYS_PER_QUERY):
                out.update(self._latest(names[start:start + _KEYS_PER_QUERY], before))
            return out
        return self._latest(None, before)

    def _latest(self, jobs: list[str] | None, before: datetime | None) -> dict[str, ClaimRow]:
        c = self.table.c
        # a triggered run is no occurrence of the schedule: it never says where it stands
        newest = select(c.job_name, func.max(c.occurrence_utc).label("newest")).where(
            c.kind != MANUAL_KIND)
        if jobs is not None:
            newest = newest.where(c.job_name.in_(jobs))
        if before is not None:
            newest = newest.where(c.occurrence_utc <= self._param_time(before))
        sub = newest.group_by(c.job_name).subquery()
        query = select(self.table).join(sub, and_(c.job_name == sub.c.job_name,
                                                  c.occurrence_utc == sub.c.newest))
        return {row.job: row for row in self._rows(query)}

    def job_ledger(self, ranges: Mapping[str, tuple[datetime, datetime]]) -> dict[str, JobLedger]:
        c = self.table.c
        out = {}
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            for job, (start, end) in ranges.items():
                first = conn.execute(select(func.min(c.occurrence_utc))
                                     .where(c.job_name == job)).scalar()
                claimed = conn.execute(select(c.occurrence_utc).where(
                    c.job_name == job, c.occurrence_utc >= self._param_time(start),
                    c.occurrence_utc <= self._param_time(end))).scalars()
                out[job] = JobLedger(as_utc(first) if first is not None else None,
                                     frozenset(as_utc(occ) for occ in claimed))
        return out

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
            return [claim_row(r) for r in conn.execute(query)]

    # -- publish reports and orphans -----------------------------------------

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
                c.job_name == bindparam("k_job"), c.occurrence_utc == bindparam("k_occ"),
                c.claim_token == bindparam("k_token"), c.state == PENDING,
            ).values(state=FAILED, publish_error=bindparam("k_error")),
                [{"k_job": r.job, "k_occ": self._param_time(r.occurrence), "k_token": r.token,
                  "k_error": r.error} for r in failed])
        published = [r for r in reports if r.error is None]
        for start in range(0, len(published), _KEYS_PER_QUERY):
            part = published[start:start + _KEYS_PER_QUERY]
            conn.execute(self.table.update().where(
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
                key = (c.job_name == bindparam("k_job"), c.occurrence_utc >= bindparam("k_occ"),
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
        for start in range(0, len(jobs), _KEYS_PER_QUERY):
            for r in conn.execute(select(self.table).where(
                    c.job_name.in_(jobs[start:start + _KEYS_PER_QUERY]),
                    c.claimed_at > self._param_time(now - oldest),
                    c.state.in_((PENDING, PUBLISHED)))):
                row = claim_row(r)
                rows.setdefault(row.job, []).append(row)
        out = {}
        for request in ruled:
            assert request.overlap is not None
            found = [row.occurrence for row in rows.get(request.job, ())
                     if request.overlap.blocks(row, now)]
            if found:
                out[id(request)] = max(found)
        return out

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
            or_(p.until_utc.is_(None), p.until_utc > self._param_time(now)))
        if jobs is None:
            return [pause_row(r) for r in conn.execute(query.order_by(p.job_name))]
        out: list[Pause] = []
        names = sorted({*jobs, ALL_JOBS})
        for start in range(0, len(names), _KEYS_PER_QUERY):
            out.extend(pause_row(r) for r in conn.execute(
                query.where(p.job_name.in_(names[start:start + _KEYS_PER_QUERY]))))
        return out

    # -- live control ----------------------------------------------------------

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
            conn.execute(p.delete().where(p.c.job_name == job))
            conn.execute(p.insert().values(
                job_name=job, paused_at=self._param_time(now), paused_by=actor, reason=reason,
                until_utc=self._param_time(until) if until is not None else None))
            self._audit_row(conn, now, actor, AuditEntry.PAUSE, job, reason, until)
        return Pause(job, now, actor, reason, until)

    def resume(self, job: str, actor: str) -> Pause | None:
        p = self.pauses_table
        with self._control(f"control:{job}") as (conn, now):
            held = conn.execute(select(self.pauses_table).where(p.c.job_name == job)).first()
            if held is None:
                return None
            conn.execute(p.delete().where(p.c.job_name == job))
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
                    c.job_name == job, c.kind == MANUAL_KIND, c.state != FAILED,
                    c.occurrence_utc > self._param_time(now - window))
                    .order_by(c.occurrence_utc.desc()).limit(1)).first()
                if recent is not None:
                    return ManualClaim(None, None, duplicate=claim_row(recent))
            token = str(uuid.uuid4())
            conn.execute(self.table.insert().values(
                job_name=job, occurrence_utc=self._param_time(now), node=node, task_id=task_id,
                kind=MANUAL_KIND, claimed_at=self._param_time(now), claim_token=token,
                state=PENDING, takeovers=0))
            self._audit_row(conn, now, actor, AuditEntry.TRIGGER, job, reason, None,
                            task_id=task_id, detail="forced" if window is None else "")
        return ManualClaim(ClaimRow(job, now, node, task_id, MANUAL_KIND, now, state=PENDING),
                           token)

    def audit(self, job: str | None = None, since: datetime | None = None,
              limit: int = 100) -> list[AuditEntry]:
        a = self.audit_table.c
        query = select(self.audit_table).order_by(a.at.desc(), a.id.desc()).limit(limit)
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
            at=self._param_time(now), actor=actor, action=action, job_name=job,
            reason=reason, until_utc=self._param_time(until) if until is not None else None,
            task_id=task_id, detail=detail))

    def _insert_ignoring(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Insert *rows*, each in a savepoint: a row another writer inserted since
        the look is left as it is."""
        for row in rows:
            try:
                with conn.begin_nested():
                    conn.execute(self.table.insert().values(**row))
            except sa_exc.IntegrityError:
                continue

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
                         .where(c.state.in_(UNPUBLISHED), c.kind != MANUAL_KIND,
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
                    key = (c.job_name == row.job,
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

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        self.engine.dispose()

    def describe(self) -> str:
        return f"{mask_dsn(self.settings.dsn)} (table {self.settings.qualified_table})"

    def _quoted(self, table: Table) -> str:
        return str(self.engine.dialect.identifier_preparer.format_table(table))


def claim_row(r: Any) -> ClaimRow:
    """A :class:`ClaimRow` from a row of the claims table."""
    return ClaimRow(r.job_name, as_utc(r.occurrence_utc), r.node, r.task_id, r.kind,
                    as_utc(r.claimed_at), state=r.state,
                    published_at=as_utc(r.published_at) if r.published_at else None,
                    publish_error=r.publish_error, takeovers=int(r.takeovers or 0),
                    run_state=r.run_state,
                    started_at=as_utc(r.started_at) if r.started_at else None,
                    finished_at=as_utc(r.finished_at) if r.finished_at else None,
                    worker=r.worker, runtime=r.runtime, run_error=r.run_error)


def held_result(request: ClaimRequest, held: Any, pause: Pause | None) -> ClaimResult:
    """The answer to *request* when *held* (node, task_id, occurrence_utc, state,
    publish_error) already holds its occurrence: a loss, or the cluster's skip."""
    occurrence = as_utc(held.occurrence_utc)
    if held.state == SKIPPED:
        return ClaimResult.skipped(request, occurrence, held.node, held.task_id,
                                   held.publish_error, pause=pause)
    return ClaimResult(request, False, occurrence, held.node, held.task_id)


def pause_row(r: Any) -> Pause:
    """A :class:`Pause` from a row of the pauses table."""
    return Pause(r.job_name, as_utc(r.paused_at), r.paused_by, r.reason,
                 as_utc(r.until_utc) if r.until_utc is not None else None)


def node_state(row: Any) -> NodeState:
    return NodeState(
        node=row["node"], boot_id=row["boot_id"], version=row["version"],
        fingerprint=row["fingerprint"], entries=json.loads(row["entries"] or "{}"),
        counts=load_counts(row["counts"]), host=row["host"], pid=row["pid"],
        started_at=as_utc(row["started_at"]), last_seen=as_utc(row["last_seen"]))


def dump_counts(counts: Mapping[tuple[str, str, str], int]) -> str:
    """Outcome counts as JSON rows ``[job, outcome, reason, n]``: any job name survives."""
    return json.dumps(sorted([*key, n] for key, n in counts.items()))


def load_counts(text: str | None) -> dict[tuple[str, str, str], int]:
    """Read :func:`dump_counts`, and the ``{"job|outcome|reason": n}`` rows of 0.1."""
    data = json.loads(text or "[]")
    if isinstance(data, dict):
        old: dict[tuple[str, str, str], int] = {}
        for key, n in data.items():  # 0.1 joined the key with "|" (lossy for "|" in names)
            job, outcome, reason = (key.rsplit("|", 2) + ["", ""])[:3]
            old[(job, outcome, reason)] = int(n)
        return old
    return {(str(job), str(outcome), str(reason)): int(n) for job, outcome, reason, n in data}


def missing_table_message(table: Table) -> str:
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    return (f"the table {name} does not exist and elarion_beat_create_table is False: "
            "create it with your migrations (celery_elarion_beat.claims_table(metadata) and "
            "nodes_table(metadata) declare the tables), run `celery -A proj elarion-beat "
            "init-db`, or set elarion_beat_create_table = True to let beat create it")


def outdated_table_message(table: Table, upgrades: list[str]) -> str:
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    return (f"the table {name} was made by an older celery-elarion-beat and "
            "elarion_beat_create_table is False: apply the migration (see docs/howto/"
            "migrations.md), run `celery -A proj elarion-beat init-db`, or run: "
            + "; ".join(upgrades))


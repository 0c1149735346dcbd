"""The PostgreSQL claim store (SQLAlchemy 2 Core engine, psycopg 3 driver).

One chunk of claims (``elarion_beat_claim_chunk`` requests; usually a whole
tick) costs one network round trip, plus one look-up of the holders when a racer
committed in the middle of the statement. The statements are sent together in a
psycopg pipeline, inside one transaction:

1. ``pg_advisory_xact_lock(namespace, hashtext(job))`` for every window job,
   in key order (so two nodes never deadlock), only when there are windows (the
   namespace is the table's and the cluster's; on a table of 0.2, the table's
   first, as nodes of 0.2 take it);
2. one ``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING RETURNING``
   that claims every exact slot and every window whose job has no claim within
   its window before ``clock_timestamp()``, and reports the holder of each lost
   claim; a job paused (the pauses table, read in the same statement) or whose
   previous run is unfinished (``overlap: skip``) is stored ``skipped`` instead;
3. the publish marks of the previous chunk (one ``UPDATE``), after the claim;
4. ``COMMIT``.

Every inserted row carries the call's random ``claim_token``. After a lost reply
the call is retried once on a fresh connection, and only rows with that token
count as won: never a row of another process under the same node name.

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
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import date, datetime
from typing import Any

import psycopg
from sqlalchemy import Table, func, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection, Engine

from ..config.dsn import mask_dsn
from ..config.parsers import format_duration
from ..config.settings import Settings
from ..exceptions import (
    ClaimRefused,
    SchemaMissing,
    StoreError,
    StoreRefused,
    StoreUnavailable,
)
from ..schedules.clock import as_utc
from ..schedules.slots import ClaimKind
from .partitions import (
    PARTITIONED,
    DayPartitions,
    layout_message,
    missing_default_message,
)
from .pg_claim import (
    CLAIM_SQL,
    GUARDED_CLAIM_SQL,
    LOCK_SQL,
    LOOKUP_SQL,
    REPORT_SQL,
    VERSIONS_LOCK_SQL,
    claim_params,
    claim_result,
    guarded,
    lock_namespace,
    report_params,
)
from .pg_engine import (
    CLIENT_GRACE,
    LOCAL_SETTINGS_SQL,
    UNBOUNDED,
    Watchdog,
    local_settings,
    postgres_engine,
    release_deadlines,
    watchdog,
)
from .pg_one_offs import PgOneOffs
from .pg_upgrade import swap_keys
from .records import ClaimRequest, ClaimResult, DdlProgress, PublishReport, SchemaStep
from .refusal import refusal
from .sql import SqlClaimStore
from .sql_upgrade import KeyGap

__all__ = ["PostgresClaimStore"]

logger = logging.getLogger(__name__)
class PostgresClaimStore(PgOneOffs, SqlClaimStore):
    """Claims in a PostgreSQL table shared by every node."""

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        super().__init__(settings, engine or postgres_engine(settings))
        self._local_settings = local_settings(settings)  # PgBouncer: SET LOCAL per claim
        self._table_sql = self._quoted(self.table)
        self._claim_sql = CLAIM_SQL.replace("{table}", self._table_sql).replace(
            "{pauses}", self._quoted(self.pauses_table))
        self._guarded_sql = GUARDED_CLAIM_SQL.replace("{table}", self._table_sql).replace(
            "{pauses}", self._quoted(self.pauses_table)).replace(
            "{revisions}", self._quoted(self.revisions))
        self._versions_lock_sql = VERSIONS_LOCK_SQL.replace("{versions}",
                                                            self._quoted(self.versions))
        self._lookup_sql = LOOKUP_SQL.replace("{table}", self._table_sql).replace(
            "{pauses}", self._quoted(self.pauses_table))
        self._report_sql = REPORT_SQL.replace("{table}", self._table_sql)
        #: the table's lock namespace (DDL, partitions; the window locks of 0.2)
        self._namespace = lock_namespace(settings.qualified_table)
        #: the cluster's: its window and control locks
        self._cluster_namespace = lock_namespace(settings.qualified_table, self.cluster)
        #: elarion_beat_claims_layout = "partitioned": day partitions (:mod:`.partitions`)
        self._partitioned = settings.claims_layout == PARTITIONED
        self._days = DayPartitions(
            self.table, self.engine.dialect.identifier_preparer, self._namespace, self.cluster,
            settings.partitions_ahead, max(100, min(1000, int(settings.claim_timeout * 200))))
        self._partitions_day: date | None = None
        #: the backend pid of the connection running init-db's upgrades, meanwhile
        self._ddl_pid: int | None = None

    # -- dialect hooks ---------------------------------------------------------

    def _db_now(self, conn: Connection) -> datetime:
        return as_utc(conn.execute(select(func.clock_timestamp())).scalar_one())

    def _serialize_ddl(self, conn: Connection) -> None:
        conn.execute(select(func.pg_advisory_xact_lock(self._namespace, 0)))
        if self.settings.schema:
            schema = self.engine.dialect.identifier_preparer.quote_schema(self.settings.schema)
            conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))

    @property
    def _lock_namespaces(self) -> list[int]:
        """The namespaces of the window and control locks, in the order they are taken."""
        if self.legacy_locks:
            return [self._namespace, self._cluster_namespace]
        return [self._cluster_namespace]

    @contextlib.contextmanager
    def _serialized(self, conn: Connection, key: str) -> Iterator[None]:
        with conn.begin():
            for namespace in self._lock_namespaces:
                conn.execute(select(func.pg_advisory_xact_lock(namespace, func.hashtext(key))))
            yield

    def _insert_or_skip(self, conn: Connection, table: Table, row: dict[str, Any]) -> bool:
        # no conflict target: the key of a table of 0.2 holds as well as today's
        return bool(conn.execute(pg_insert(table).values(**row).on_conflict_do_nothing())
                    .rowcount)

    def _delete_batch(self, conn: Connection, cutoff: datetime, batch: int) -> int:
        t = self._table_sql
        # a ctid names a row within one table only: a partitioned table deletes by key
        key = "(cluster, job_name, occurrence_utc)" if self._partitioned else "ctid"
        picked = "o.cluster, o.job_name, o.occurrence_utc" if self._partitioned else "o.ctid"
        result = conn.execute(text(
            f"DELETE FROM {t} WHERE {key} IN (SELECT {picked} FROM {t} AS o "
            "WHERE o.cluster = :cluster AND o.claimed_at < :cutoff AND EXISTS (SELECT 1 FROM "
            f"{t} AS n WHERE n.cluster = o.cluster AND n.job_name = o.job_name "
            "AND n.occurrence_utc > o.occurrence_utc) LIMIT :batch)"),
            {"cluster": self.cluster, "cutoff": cutoff, "batch": batch})
        return int(result.rowcount)

    # -- finishing the upgrade of tables of 0.2 (init-db) ----------------------------

    def _swap_keys(self, gaps: list[KeyGap]) -> None:
        """:func:`.pg_upgrade.swap_keys` on a connection of its own; a partitioned claims
        table cannot build its keys concurrently."""
        args, params = self.engine.dialect.create_connect_args(self.engine.url)
        try:
            with psycopg.connect(*args, **{**params, "autocommit": True}) as pc:
                swap_keys(pc, gaps, self.engine.dialect, quoted=self._quoted,
                          concurrently=lambda gap: not (self._partitioned
                                                        and gap.table is self.table),
                          nodes=self.nodes_table, namespace=self._namespace,
                          lock_timeout_ms=self._days.lock_timeout_ms)
        except psycopg.Error as exc:
            raise _translate(exc, self.settings) from exc

    # -- the partitioned layout --------------------------------------------------

    def describe(self) -> str:
        text = super().describe()
        return text[:-1] + ", partitioned by day)" if self._partitioned else text

    def _check_layout(self, conn: Connection, create: bool) -> None:
        found, wanted = self._days.layout(conn), self.settings.claims_layout
        if found is not None and found != wanted:
            raise SchemaMissing(layout_message(self.settings.qualified_table, found, wanted))
        if not self._partitioned:
            return
        if create:
            self._days.create_default(conn)
        elif not self._days.has_default(conn):
            raise SchemaMissing(missing_default_message(
                self.settings.qualified_table, self._days.default, self._days.parent))

    def ensure_schema(self) -> None:
        super().ensure_schema()
        self._prepare_partitions(strict=False)

    def create_schema(self, on_step: Callable[[SchemaStep], None] | None = None,
                      force: bool = False) -> tuple[str, ...]:
        upgraded = super().create_schema(on_step, force)
        self._prepare_partitions(strict=True)
        return upgraded

    @contextlib.contextmanager
    def _unbounded(self, conn: Connection) -> Iterator[None]:
        """No statement timeout for the rest of the transaction (``SET LOCAL``), no
        client-side cut; the lock timeout stays: a busy table fails the upgrade soon
        instead of queueing every claim behind it. The backend's pid lets
        :meth:`schema_progress` find the statement."""
        conn.execute(text("SELECT set_config('statement_timeout', '0', true)"))
        self._ddl_pid = int(conn.execute(select(func.pg_backend_pid())).scalar_one())
        conn.info[UNBOUNDED] = True
        try:
            yield
        finally:
            conn.info.pop(UNBOUNDED, None)
            self._ddl_pid = None

    def schema_progress(self) -> DdlProgress | None:
        pid = self._ddl_pid
        if pid is None:
            return None
        try:
            with self.engine.connect() as conn:
                row = conn.execute(text(
                    "SELECT phase, blocks_done, blocks_total, tuples_done, tuples_total "
                    "FROM pg_stat_progress_create_index WHERE pid = :pid"), {"pid": pid}).first()
        except Exception:  # a progress probe never stops the work it watches
            return None
        if row is None:
            return None
        phase, blocks_done, blocks_total, tuples_done, tuples_total = row
        if blocks_total:
            return DdlProgress(str(phase), int(blocks_done), int(blocks_total), "blocks")
        if tuples_total:
            return DdlProgress(str(phase), int(tuples_done), int(tuples_total), "tuples")
        return DdlProgress(str(phase), 0, 0, "")

    def _prepare_partitions(self, strict: bool) -> None:
        """The day partitions, once the schema is there. A partition that cannot be made
        now (the table busy, or no right to) stops only ``init-db``: until it exists its
        claims land in the DEFAULT partition."""
        try:
            self.ensure_partitions()
        except StoreError as exc:
            if strict:
                raise
            logger.warning("beat: the day partitions of %s were not created, claims go to its "
                           "DEFAULT partition until they are: %s",
                           self.settings.qualified_table, exc)

    def ensure_partitions(self, now: datetime | None = None) -> list[str]:
        if not self._partitioned or (now is not None
                                     and as_utc(now).date() == self._partitions_day):
            return []
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            today = as_utc(now if now is not None else self._db_now(conn)).date()
            created = self._days.ensure(conn, today)
        self._partitions_day = today
        if created:
            logger.info("beat: created the claims partitions %s", ", ".join(created),
                        extra={"action": "partitions", "partitions": created})
        return created

    def _purge_stretch(self, cutoff: datetime, batch_size: int,
                       spent: Callable[[], bool]) -> tuple[int, list[str], bool]:
        """Partitioned: first drop the day partitions past *cutoff* whole (each in a
        short transaction of its own, after reading what it must keep), then the
        batched delete purges the rest (the DEFAULT partition, mostly)."""
        if not self._partitioned:
            return super()._purge_stretch(cutoff, batch_size, spent)
        deleted, dropped = 0, []
        with self.engine.begin() as conn:
            self.round_trips += 1
            expired = self._days.expired(conn, cutoff)
        for part in expired:
            with self.engine.begin() as conn:  # reads only: no claim waits on them
                self.round_trips += 1
                rows, keep = self._days.rows(conn, part), self._days.kept(conn, part)
            with self.engine.begin() as conn:
                self.round_trips += 1
                kept = self._days.drop(conn, part, keep, cutoff)
            if kept is not None:
                deleted += max(0, rows - kept)
                dropped.append(part.name)
            if spent():
                return deleted, dropped, False
        more, _, done = super()._purge_stretch(cutoff, batch_size, spent)
        return deleted + more, dropped, done

    def _count_purgeable(self, conn: Connection, cutoff: datetime) -> int:
        if not self._partitioned:
            return super()._count_purgeable(conn, cutoff)
        expired = self._days.expired(conn, cutoff)
        total = self._days.count_rows_purgeable(conn, cutoff, expired)
        for part in expired:
            keep = self._days.kept(conn, part)
            total += max(0, self._days.rows(conn, part)
                         - self._days.keeping(conn, part, keep, cutoff))
        return total

    def _translate(self, exc: BaseException) -> StoreError:
        orig = getattr(exc, "orig", exc)
        if isinstance(orig, psycopg.errors.UndefinedTable):
            self._schema_ready = False
        return _translate(orig, self.settings)

    def _write_reports(self, conn: Connection, reports: Sequence[PublishReport]) -> None:
        conn.exec_driver_sql(self._report_sql, report_params(reports, self.cluster))

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        super().close()
        release_deadlines()  # a closed beat leaves no watchdog thread behind

    # -- claims --------------------------------------------------------------

    def claim(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        if not requests:
            return []
        self._ready()
        # one token per call: the retry below recognises only rows this call inserted
        token = str(uuid.uuid4())
        params = claim_params(node, requests, token, self.cluster)
        windows = sorted({r.job for r in requests if r.kind is ClaimKind.WINDOW})
        checked = guarded(requests)  # a database entry's claim checks its revision
        reports = self._deferred  # the previous chunk's publish reports ride along
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
            deadline = watchdog(raw.info) or Watchdog(
                pc, self.settings.claim_timeout + CLIENT_GRACE)
            try:
                with deadline:
                    rows = self._claim_rows(pc, params, windows, reports, checked)
                self._deferred = self._deferred[len(reports):]
                # lost, with no holder read: neither refused stale nor early (the
                # statement's last two columns)
                missing = [row[0] for row in rows
                           if not row[1] and row[3] is None and not row[-2] and not row[-1]]
                if missing:
                    rows = self._fill_holders(pc, rows, requests, node, missing)
                return [claim_result(request, node, row, token)
                        for request, row in zip(requests, rows)]
            except psycopg.OperationalError as exc:
                raw.invalidate()
                if deadline.fired:
                    raise StoreUnavailable(
                        f"the claims database {mask_dsn(self.settings.dsn)} did not answer "
                        "within elarion_beat_claim_timeout "
                        f"({format_duration(self.settings.claim_timeout)});"
                        f" the connection was cut on the client side: {exc}") from exc
                if attempt == 2 or isinstance(exc, _TIMEOUTS):
                    # a timeout has spent the claim timeout already: a retry would
                    # spend it twice (the tick must never wait longer than one)
                    raise _translate(exc, self.settings) from exc
                # a pooled connection may have gone stale: one try on a fresh one
            except (psycopg.DataError, psycopg.errors.IntegrityError, UnicodeError) as exc:
                raw.invalidate()
                raise ClaimRefused(f"the claims database refused the claim data of "
                                   f"{_jobs_text(requests)}: {exc}") from exc
            except psycopg.Error as exc:
                raw.invalidate()
                if isinstance(exc, psycopg.errors.UndefinedTable):
                    self._schema_ready = False
                raise _translate(exc, self.settings) from exc
            finally:
                raw.close()
        raise AssertionError("unreachable")  # pragma: no cover

    def _claim_rows(self, pc: psycopg.Connection[Any], params: dict[str, Any],
                    windows: list[str], reports: Sequence[PublishReport],
                    checked: bool) -> list[tuple[Any, ...]]:
        with pc.pipeline():
            if self._local_settings is not None:
                pc.execute(LOCAL_SETTINGS_SQL, self._local_settings)
            if windows:
                pc.execute(LOCK_SQL, {"ns": self._lock_namespaces, "jobs": windows})
            if checked:  # database entries: an edit in flight commits first, and is seen
                pc.execute(self._versions_lock_sql, {"cluster": self.cluster})
            cur = pc.execute(self._guarded_sql if checked else self._claim_sql, params)
            # the marks go after the claim: an UPDATE of this node's rows first would make
            # the INSERT of a row another node's marks are updating wait in a cycle (two
            # nodes walk a tick's chunks from their own ranks), a deadlock; an INSERT
            # that meets a row DO NOTHINGs without locking it
            if reports:
                pc.execute(self._report_sql, report_params(reports, self.cluster))
            pc.commit()
        self.round_trips += 1
        return cur.fetchall()

    def _fill_holders(self, pc: psycopg.Connection[Any], rows: list[tuple[Any, ...]],
                      requests: Sequence[ClaimRequest], node: str,
                      missing: list[int]) -> list[tuple[Any, ...]]:
        """Ask again who holds the claims lost to a racer that committed mid-statement."""
        subset = [requests[ord_ - 1] for ord_ in missing]
        with pc.pipeline():
            if self._local_settings is not None:
                pc.execute(LOCAL_SETTINGS_SQL, self._local_settings)
            cur = pc.execute(self._lookup_sql, claim_params(node, subset, "", self.cluster))
            pc.commit()
        self.round_trips += 1
        found = {missing[row[0] - 1]: row for row in cur.fetchall()}
        return [(row[0], row[1], *found[row[0]][2:]) if row[0] in found else row for row in rows]


#: The claim timeout was spent: never retried.
_TIMEOUTS = (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)



def _jobs_text(requests: Sequence[ClaimRequest], most: int = 3) -> str:
    names = ", ".join(repr(r.job[:80]) for r in requests[:most])
    return names + (f" and {len(requests) - most} more" if len(requests) > most else "")










def _translate(exc: BaseException | None, settings: Settings) -> StoreError:
    where = mask_dsn(settings.dsn)
    fix = refusal(exc)
    if fix is not None:
        return StoreRefused(f"the claims database {where} refused this node ({fix}): {exc}")
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return SchemaMissing(f"the claims table {settings.qualified_table} is missing at {where}; "
                             f"{missing_table_message_for(settings)}")
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return StoreUnavailable(
            f"the claims database {where} did not answer within elarion_beat_claim_timeout "
            f"({format_duration(settings.claim_timeout)}): {exc}")
    if isinstance(exc, psycopg.OperationalError):
        return StoreUnavailable(f"the claims database {where} is unreachable: {exc}".strip())
    return StoreError(f"the claims database {where} failed: {type(exc).__name__}: {exc}")


def missing_table_message_for(settings: Settings) -> str:
    return ("create it with `celery -A proj elarion-beat init-db`, your migrations, or "
            "elarion_beat_create_table = True")

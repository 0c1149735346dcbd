"""The PostgreSQL claim store (SQLAlchemy 2 Core engine, psycopg 3 driver).

One chunk of claims (``elarion_beat_claim_chunk`` requests; usually a whole
tick) costs one network round trip, plus one look-up of the holders when a racer
committed in the middle of the statement. The statements are sent together in a
psycopg pipeline, inside one transaction:

1. ``pg_advisory_xact_lock(namespace, hashtext(job))`` for every window job,
   in key order (so two nodes never deadlock), only when there are windows;
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
import zlib
from collections.abc import Callable, Iterator, Sequence
from datetime import date, datetime
from typing import Any

import psycopg
from sqlalchemy import case, func, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection, Engine

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
from ..slots import ClaimKind
from .base import ClaimRequest, ClaimResult, Pause, PublishReport
from .partitions import PARTITIONED, DayPartitions, layout_message, missing_default_message
from .pg_engine import (
    CLIENT_GRACE,
    LOCAL_SETTINGS_SQL,
    Watchdog,
    local_settings,
    postgres_engine,
    watchdog,
)
from .pg_oneoffs import PgOneOffs
from .refusal import refusal
from .schema import PENDING, SKIPPED
from .sql import SqlClaimStore

__all__ = ["PostgresClaimStore"]

logger = logging.getLogger(__name__)
_LOCK_SQL = """
SELECT count(pg_advisory_xact_lock(%(ns)s, k)) FROM (
    SELECT DISTINCT hashtext(j) AS k FROM unnest(%(jobs)s::text[]) AS j ORDER BY 1 OFFSET 0
) AS keys
"""

_INPUT = """
input AS (
    SELECT t.ord, t.job_name, t.kind, t.slot, t.window_s, t.task_id, t.state, t.overlap_s,
           t.pending_s
    FROM unnest(%(jobs)s::text[], %(kinds)s::text[], %(slots)s::timestamptz[],
                %(windows)s::float8[], %(task_ids)s::text[], %(states)s::text[],
                %(overlaps)s::float8[], %(pendings)s::float8[])
         WITH ORDINALITY AS t(job_name, kind, slot, window_s, task_id, state, overlap_s,
                              pending_s, ord)
)"""

#: Where a window ends: its length back from the clock. The clock is read in a
#: sub-select, one value for the whole statement (read after the advisory lock):
#: clock_timestamp() itself is volatile, so it could not bound an index scan, and
#: each window check would read every claim the job ever made (at 10 million rows,
#: 1,000 per job, a chunk took seconds instead of milliseconds).
_WINDOW_START = "((SELECT clock_timestamp()) - make_interval(secs => i.window_s))"

#: The claim that holds a request's occurrence: the slot's row (a primary-key look-up)
#: or the newest claim inside the window (a backward scan of the key, bounded by the
#: window's start).
_HELD = """
LEFT JOIN LATERAL (
    SELECT p.node, p.task_id, p.occurrence_utc, p.claim_token, p.state, p.publish_error
    FROM {table} AS p
    WHERE {condition} AND p.job_name = i.job_name
      AND p.occurrence_utc BETWEEN
          CASE WHEN i.kind = 'slot' THEN i.slot ELSE """ + _WINDOW_START + """ END
          AND CASE WHEN i.kind = 'slot' THEN i.slot ELSE 'infinity'::timestamptz END
      AND (i.kind = 'slot'
        OR (p.kind <> 'manual' AND p.occurrence_utc > """ + _WINDOW_START + """))
    ORDER BY p.occurrence_utc DESC LIMIT 1
) AS held ON true"""

#: ``overlap: skip``: the newest unfinished run of the job (see OverlapRule.blocks),
#: found through ix_<table>_job_claimed; only for requests with an overlap rule. The
#: bound reads the clock in a sub-select, a value for the whole statement: with
#: clock_timestamp() itself (volatile) it could not be an index condition, and the
#: scan would read every claim of the job.
_RUNNING = """
LEFT JOIN LATERAL (
    SELECT r.occurrence_utc FROM {table} AS r
    WHERE i.overlap_s IS NOT NULL AND r.job_name = i.job_name
      AND r.claimed_at > (SELECT clock_timestamp()) - make_interval(secs => i.overlap_s)
      AND r.kind <> 'node'
      AND ((r.state = 'pending'
            AND r.claimed_at > clock_timestamp() - make_interval(secs => i.pending_s))
        OR (r.state = 'published' AND (r.run_state IS NULL
                                       OR r.run_state IN ('running', 'retried'))))
    ORDER BY r.claimed_at DESC LIMIT 1
) AS run ON true"""

#: ``elarion-beat pause``: the pause in force of the job (its own before the pause of
#: every job, whose name '' sorts first); never of an untracked claim (the purge election).
_PAUSED = """
LEFT JOIN LATERAL (
    SELECT z.job_name, z.paused_at, z.paused_by, z.reason, z.until_utc FROM {pauses} AS z
    WHERE i.state IS NOT NULL AND z.job_name IN (i.job_name, '')
      AND (z.until_utc IS NULL OR z.until_utc > clock_timestamp())
    ORDER BY z.job_name DESC LIMIT 1
) AS pz ON true"""

_CLAIM_SQL = "WITH " + _INPUT + """,
decided AS (
    SELECT i.*, run.occurrence_utc AS blocker, pz.job_name AS p_job, pz.paused_at AS p_at,
           pz.paused_by AS p_by, pz.reason AS p_reason, pz.until_utc AS p_until
    FROM input AS i""" + _RUNNING + _PAUSED + """
),
inserted AS (
    INSERT INTO {table} AS c (job_name, occurrence_utc, node, task_id, kind, claimed_at,
                              claim_token, state, publish_error)
    SELECT i.job_name,
           CASE WHEN i.kind = 'window' THEN clock_timestamp() ELSE i.slot END,
           %(node)s, i.task_id, i.kind, clock_timestamp(), %(token)s,
           CASE WHEN i.p_at IS NOT NULL OR i.blocker IS NOT NULL THEN 'skipped'
                ELSE i.state END,
           CASE WHEN i.p_at IS NOT NULL THEN 'paused'
                WHEN i.blocker IS NOT NULL THEN 'still-running' END
    FROM decided AS i
    WHERE i.kind = 'slot'
       OR NOT EXISTS (
            SELECT 1 FROM {table} AS p
            WHERE p.job_name = i.job_name AND p.kind <> 'manual'
              AND p.occurrence_utc > """ + _WINDOW_START + """)
    ORDER BY i.job_name, i.slot
    ON CONFLICT (job_name, occurrence_utc) DO NOTHING
    RETURNING c.job_name, c.occurrence_utc, c.task_id, c.state, c.publish_error
)
SELECT i.ord, ins.occurrence_utc IS NOT NULL,
       COALESCE(ins.occurrence_utc, held.occurrence_utc, i.slot), held.node, held.task_id,
       held.claim_token, COALESCE(ins.state, held.state), i.blocker,
       COALESCE(ins.publish_error, held.publish_error), i.p_job, i.p_at, i.p_by, i.p_reason,
       i.p_until
FROM decided AS i
LEFT JOIN inserted AS ins ON ins.job_name = i.job_name AND ins.task_id = i.task_id
""" + _HELD.replace("{condition}", "ins.occurrence_utc IS NULL") + """
ORDER BY i.ord
"""

_LOOKUP_SQL = "WITH " + _INPUT + """
SELECT i.ord, false, COALESCE(held.occurrence_utc, i.slot), held.node, held.task_id,
       held.claim_token, held.state, NULL::timestamptz, held.publish_error, pz.job_name,
       pz.paused_at, pz.paused_by, pz.reason, pz.until_utc
FROM input AS i
""" + _HELD.replace("{condition}", "true") + _PAUSED + """
ORDER BY i.ord
"""

#: Publish reports, one statement for a whole chunk: by primary key, and only
#: rows still pending under the reporting call's token.
_REPORT_SQL = """
UPDATE {table} AS c
SET state = CASE WHEN u.error IS NULL THEN 'published' ELSE 'failed' END,
    published_at = CASE WHEN u.error IS NULL THEN clock_timestamp() END,
    publish_error = u.error
FROM unnest(%(r_jobs)s::text[], %(r_occurrences)s::timestamptz[], %(r_tokens)s::text[],
            %(r_errors)s::text[]) AS u(job_name, occurrence_utc, token, error)
WHERE c.job_name = u.job_name AND c.occurrence_utc = u.occurrence_utc
  AND c.claim_token = u.token AND c.state = 'pending'
"""


def lock_namespace(qualified_table: str) -> int:
    """The first key of the window advisory locks: a signed int32 from the table name."""
    crc = zlib.crc32(f"celery_elarion_beat:{qualified_table}".encode())
    return (crc ^ 0x80000000) - 0x80000000


class PostgresClaimStore(PgOneOffs, SqlClaimStore):
    """Claims in a PostgreSQL table shared by every node."""

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        super().__init__(settings, engine or postgres_engine(settings))
        self._local_settings = local_settings(settings)  # PgBouncer: SET LOCAL per claim
        self._table_sql = self._quoted(self.table)
        self._claim_sql = _CLAIM_SQL.replace("{table}", self._table_sql).replace(
            "{pauses}", self._quoted(self.pauses_table))
        self._lookup_sql = _LOOKUP_SQL.replace("{table}", self._table_sql).replace(
            "{pauses}", self._quoted(self.pauses_table))
        self._report_sql = _REPORT_SQL.replace("{table}", self._table_sql)
        self._namespace = lock_namespace(settings.qualified_table)
        #: elarion_beat_claims_layout = "partitioned": day partitions (:mod:`.partitions`)
        self._partitioned = settings.claims_layout == PARTITIONED
        self._days = DayPartitions(
            self.table, self.engine.dialect.identifier_preparer, self._namespace,
            settings.partitions_ahead, max(100, min(1000, int(settings.claim_timeout * 200))))
        self._partitions_day: date | None = None

    # -- dialect hooks ---------------------------------------------------------

    def _db_now(self, conn: Connection) -> datetime:
        return as_utc(conn.execute(select(func.clock_timestamp())).scalar_one())

    def _serialize_ddl(self, conn: Connection) -> None:
        conn.execute(select(func.pg_advisory_xact_lock(self._namespace, 0)))
        if self.settings.schema:
            schema = self.engine.dialect.identifier_preparer.quote_schema(self.settings.schema)
            conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))

    @contextlib.contextmanager
    def _serialized(self, conn: Connection, key: str) -> Iterator[None]:
        with conn.begin():
            conn.execute(select(func.pg_advisory_xact_lock(self._namespace, func.hashtext(key))))
            yield

    def _upsert_node(self, conn: Connection, values: dict[str, Any]) -> None:
        nodes = self.nodes_table
        stmt = pg_insert(nodes).values(**values)
        keep = ("boot_id", "version", "fingerprint", "host", "pid", "entries", "counts",
                "last_seen")
        conn.execute(stmt.on_conflict_do_update(
            index_elements=[nodes.c.node],
            set_={**{k: stmt.excluded[k] for k in keep},
                  "started_at": case((nodes.c.boot_id == stmt.excluded.boot_id,
                                      nodes.c.started_at), else_=stmt.excluded.started_at)},
        ))

    def _delete_batch(self, conn: Connection, cutoff: datetime, batch: int) -> int:
        t = self._table_sql
        # a ctid names a row within one table only: a partitioned table deletes by key
        key = "(job_name, occurrence_utc)" if self._partitioned else "ctid"
        picked = "o.job_name, o.occurrence_utc" if self._partitioned else "o.ctid"
        result = conn.execute(text(
            f"DELETE FROM {t} WHERE {key} IN (SELECT {picked} FROM {t} AS o "
            "WHERE o.claimed_at < :cutoff AND EXISTS (SELECT 1 FROM "
            f"{t} AS n WHERE n.job_name = o.job_name AND n.occurrence_utc > o.occurrence_utc) "
            "LIMIT :batch)"), {"cutoff": cutoff, "batch": batch})
        return int(result.rowcount)

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
        if self.settings.create_table:
            super().create_schema()
        else:
            super().ensure_schema()
        self._prepare_partitions(strict=False)

    def create_schema(self) -> None:
        super().create_schema()
        self._prepare_partitions(strict=True)

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
        conn.exec_driver_sql(self._report_sql, _report_params(reports))

    # -- claims --------------------------------------------------------------

    def claim(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        if not requests:
            return []
        self._ready()
        # one token per call: the retry below recognises only rows this call inserted
        token = str(uuid.uuid4())
        params = _params(node, requests, token)
        windows = sorted({r.job for r in requests if r.kind is ClaimKind.WINDOW})
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
                    rows = self._claim_rows(pc, params, windows, reports)
                self._deferred = self._deferred[len(reports):]
                missing = [row[0] for row in rows if not row[1] and row[3] is None]
                if missing:
                    rows = self._fill_holders(pc, rows, requests, node, missing)
                return [_result(request, node, row, token) for request, row in zip(requests, rows)]
            except psycopg.OperationalError as exc:
                raw.invalidate()
                if deadline.fired:
                    raise StoreUnavailable(
                        f"the claims database {mask_dsn(self.settings.dsn)} did not answer "
                        f"within elarion_beat_claim_timeout ({self.settings.claim_timeout:g}s);"
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
                    windows: list[str],
                    reports: Sequence[PublishReport]) -> list[tuple[Any, ...]]:
        with pc.pipeline():
            if self._local_settings is not None:
                pc.execute(LOCAL_SETTINGS_SQL, self._local_settings)
            if windows:
                pc.execute(_LOCK_SQL, {"ns": self._namespace, "jobs": windows})
            cur = pc.execute(self._claim_sql, params)
            # the marks go after the claim: an UPDATE of this node's rows first would make
            # the INSERT of a row another node's marks are updating wait in a cycle (two
            # nodes walk a tick's chunks from their own ranks), a deadlock; an INSERT
            # that meets a row DO NOTHINGs without locking it
            if reports:
                pc.execute(self._report_sql, _report_params(reports))
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
            cur = pc.execute(self._lookup_sql, _params(node, subset, ""))
            pc.commit()
        self.round_trips += 1
        found = {missing[row[0] - 1]: row for row in cur.fetchall()}
        return [(row[0], row[1], *found[row[0]][2:]) if row[0] in found else row for row in rows]


#: The claim timeout was spent: never retried.
_TIMEOUTS = (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)



def _jobs_text(requests: Sequence[ClaimRequest], most: int = 3) -> str:
    names = ", ".join(repr(r.job[:80]) for r in requests[:most])
    return names + (f" and {len(requests) - most} more" if len(requests) > most else "")


def _params(node: str, requests: Sequence[ClaimRequest], token: str) -> dict[str, Any]:
    return {
        "node": node,
        "token": token,
        "jobs": [r.job for r in requests],
        "kinds": [r.kind.value for r in requests],
        "slots": [r.slot for r in requests],
        "windows": [r.window.total_seconds() if r.window is not None else None for r in requests],
        "task_ids": [r.task_id for r in requests],
        "states": [PENDING if r.tracked else None for r in requests],
        "overlaps": [r.overlap.timeout.total_seconds() if r.overlap else None for r in requests],
        "pendings": [r.overlap.pending.total_seconds() if r.overlap else None for r in requests],
    }


def _report_params(reports: Sequence[PublishReport]) -> dict[str, Any]:
    return {
        "r_jobs": [r.job for r in reports],
        "r_occurrences": [r.occurrence for r in reports],
        "r_tokens": [r.token for r in reports],
        "r_errors": [r.error for r in reports],
    }


def _result(request: ClaimRequest, node: str, row: tuple[Any, ...], token: str) -> ClaimResult:
    """Won if this statement inserted the row, or (on the retry after a lost reply)
    if the row carries this call's token: the first attempt inserted it. A row of
    another process under the same node name, with the same slot task id, carries
    another token and is a loss. A row stored ``skipped`` (by this call or another)
    is the cluster's decision that the job's previous run is still running."""
    (_, inserted, occurrence, holder, holder_task, holder_token, state, blocker, why,
     *paused) = row
    occurrence = as_utc(occurrence) if occurrence is not None else None
    skipped = state == SKIPPED
    blocker = as_utc(blocker) if blocker is not None else None
    pause = _pause(*paused)
    if skipped:
        if inserted:
            return ClaimResult.skipped(request, occurrence, node, request.task_id, why,
                                       blocker, pause)
        return ClaimResult.skipped(request, occurrence, holder, holder_task, why, pause=pause)
    if inserted:
        return ClaimResult(request, True, occurrence, node, request.task_id, token=token)
    mine = holder_token == token
    return ClaimResult(request, mine, occurrence, holder, holder_task,
                       token=token if mine else None)


def _pause(job: str | None, at: datetime | None, by: str | None, reason: str | None,
           until: datetime | None) -> Pause | None:
    if at is None or job is None:
        return None
    return Pause(job, as_utc(at), by or "", reason or "", as_utc(until) if until else None)


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
            f"({settings.claim_timeout:g}s): {exc}")
    if isinstance(exc, psycopg.OperationalError):
        return StoreUnavailable(f"the claims database {where} is unreachable: {exc}".strip())
    return StoreError(f"the claims database {where} failed: {type(exc).__name__}: {exc}")


def missing_table_message_for(settings: Settings) -> str:
    return ("create it with `celery -A proj elarion-beat init-db`, your migrations, or "
            "elarion_beat_create_table = True")

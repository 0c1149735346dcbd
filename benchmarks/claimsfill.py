"""Prefill a claims table with realistic history, fast, for :mod:`benchmarks.claimstable`.

The history: ``jobs`` job names, each with ``rows / jobs`` claims spaced evenly
(a whole number of minutes when the spacing is a minute or more) over the last
``span`` (7 days, the default retention), the newest a few minutes before now.
Jobs ``[0, windows)`` are interval jobs (kind ``window``, occurrence = claim time
with milliseconds), the others slot jobs (kind ``slot``, whole-minute slots).
Every row is what a finished run leaves: ``published``, ``run_state``
``succeeded``, task id and claim token as uuids, three beat nodes, four workers.

The rows are written by PostgreSQL itself (``INSERT ... SELECT`` over
``generate_series``), oldest first, as beat writes them. With *rebuild* the
primary key and the secondary indexes are dropped first and created again
afterwards from their own definitions (``pg_get_constraintdef``,
``pg_indexes``; the partial index of unpublished claims, which no history row
enters, stays), which is much faster than maintaining them row by row; the
definitions after are checked to be the ones before. Then ``VACUUM ANALYZE``.
An index built in one pass is denser than one grown by inserts: the sizes
reported are a lower bound of a table that grew in production.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from .common import PG_DSN

JOB_PREFIX = "app.tasks.job_"

#: rows per INSERT statement (one transaction each)
_BATCH_ROWS = 1_000_000

# Everything of a job is computed once (the ``jobs`` CTE) and everything of a step back
# in time once (``t``: OFFSET 0 keeps it from being inlined into every row); a row only
# adds intervals. The outer series (k, steps back) is the outer loop, so rows come out
# oldest first: ``jb`` refers to k (``OFFSET k * 0``), which makes it LATERAL.
_FILL = """
WITH jobs AS MATERIALIZED (
    SELECT %(prefix)s || lpad(j::text, 6, '0') AS name,
           CASE WHEN j < %(windows)s THEN 'window' ELSE 'slot' END AS kind,
           CASE WHEN j < %(windows)s THEN make_interval(secs => (j %% 997) / 1000.0)
                ELSE interval '0' END AS off,
           make_interval(secs => (j %% 40 + 2) / 1000.0) AS lag1,
           make_interval(secs => (j %% 40 + 2) / 500.0) AS lag2,
           make_interval(secs => (j %% 40 + 2) / 200.0) AS lag5,
           make_interval(secs => (j %% 40 + 2) / 200.0 + (j %% 1500) / 1000.0) AS fin,
           ((j %% 1500) / 1000.0)::float8 AS run,
           'beat-' || (j %% 3 + 1) AS node, j %% 3 AS n,
           'celery@worker-' || (j %% 4 + 1) AS worker,
           left(md5('task ' || j)::uuid::text, 24) AS head
    FROM generate_series(0, %(jobs)s::int - 1) AS j
)
INSERT INTO {table} (cluster, job_name, occurrence_utc, node, task_id, kind, claimed_at,
                     claim_token, state, published_at, takeovers, run_state, started_at,
                     finished_at, worker, runtime)
SELECT %(cluster)s, jb.name, o.occ, jb.node, jb.head || lpad(to_hex(k), 12, '0'), jb.kind,
       o.occ + jb.lag1, CASE jb.n WHEN 0 THEN t.a WHEN 1 THEN t.b ELSE t.c END, 'published',
       o.occ + jb.lag2, 0, 'succeeded', o.occ + jb.lag5, o.occ + jb.fin, jb.worker, jb.run
FROM generate_series(%(k_hi)s::int, %(k_lo)s::int, -1) AS k
CROSS JOIN LATERAL (
    SELECT %(end)s::timestamptz - make_interval(secs => k * %(step)s::float8) AS slot,
           md5('token a ' || k)::uuid::text AS a, md5('token b ' || k)::uuid::text AS b,
           md5('token c ' || k)::uuid::text AS c
    OFFSET 0
) AS t
CROSS JOIN LATERAL (SELECT * FROM jobs OFFSET k * 0) AS jb
CROSS JOIN LATERAL (SELECT t.slot + jb.off AS occ) AS o
"""


def connect(schema: str) -> psycopg.Connection[Any]:
    """An autocommit connection whose search path is *schema* (where the table is)."""
    return psycopg.connect(PG_DSN, autocommit=True, options=f"-c search_path={schema}")


def job_name(i: int) -> str:
    """The name of job *i* of the history (as :data:`_FILL` writes it)."""
    return f"{JOB_PREFIX}{i:06d}"


@dataclass(frozen=True)
class History:
    """*rows* claims of *jobs* jobs over *span*, the newest at *end*."""

    rows: int
    jobs: int
    windows: int
    end: datetime
    span: timedelta = timedelta(days=7)

    def __post_init__(self) -> None:
        if self.rows % self.jobs:
            raise ValueError(f"{self.rows} rows are not a whole number of claims for each "
                             f"of {self.jobs} jobs")

    @property
    def per_job(self) -> int:
        return self.rows // self.jobs

    @property
    def step(self) -> float:
        """Seconds between two claims of a job (whole minutes when a minute or more)."""
        if self.per_job <= 1:
            return 0.0
        step = self.span.total_seconds() / (self.per_job - 1)
        return float(int(step // 60) * 60) if step >= 60 else float(int(step))

    @property
    def start(self) -> datetime:
        return self.end - timedelta(seconds=self.step * (self.per_job - 1))


def _definitions(conn: psycopg.Connection[Any], table: str) -> tuple[list[tuple[str, str]],
                                                                      list[tuple[str, str]]]:
    """The primary key constraint(s) and the other indexes of *table*, as DDL."""
    cons = conn.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                        "WHERE conrelid = %s::regclass AND contype = 'p'", (table,)).fetchall()
    idx = conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = "
                       "current_schema() AND tablename = %s ORDER BY indexname",
                       (table,)).fetchall()
    keys = {name for name, _ in cons}
    # a partial index (of unpublished claims) holds none of the history's rows: it stays
    return list(cons), [(n, d) for n, d in idx if n not in keys and " WHERE " not in d]


#: the table and its partitions (a plain table alone: pg_partition_tree has no row for it)
_TREE = """(SELECT relid, isleaf, level FROM pg_partition_tree(%(t)s::regclass)
           UNION ALL SELECT %(t)s::regclass, true, 0
           WHERE NOT EXISTS (SELECT FROM pg_partition_tree(%(t)s::regclass))) AS t"""


def all_indexes(conn: psycopg.Connection[Any], table: str) -> list[str]:
    """Every index definition of *table* and of its partitions (sorted)."""
    rows = conn.execute(
        "SELECT i.indexdef FROM " + _TREE + " JOIN pg_class AS c ON c.oid = t.relid "
        "JOIN pg_indexes AS i ON i.tablename = c.relname AND i.schemaname = current_schema()",
        {"t": table}).fetchall()
    return sorted(r[0] for r in rows)


def fill(schema: str, table: str, history: History, cluster: str, rebuild: bool = True,
         log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write *history* into the empty claims table *schema.table*, as rows of *cluster*
    (the measuring store's: its claims meet them); seconds of each phase."""
    q = f'"{table}"'
    out: dict[str, Any] = {"rows": history.rows, "jobs": history.jobs,
                           "step_s": history.step, "start": history.start.isoformat(),
                           "end": history.end.isoformat(), "rebuilt_indexes": rebuild}
    with connect(schema) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET maintenance_work_mem = '1GB'")
        before = all_indexes(conn, table)
        keys, indexes = _definitions(conn, table)
        t0 = time.monotonic()
        if rebuild:
            for name, _ in indexes:
                conn.execute(f'DROP INDEX "{name}"')
            for name, _ in keys:
                conn.execute(f'ALTER TABLE {q} DROP CONSTRAINT "{name}"')
        per_batch = max(1, _BATCH_ROWS // history.jobs)
        k_hi = history.per_job - 1
        params = {"jobs": history.jobs, "prefix": JOB_PREFIX, "windows": history.windows,
                  "end": history.end, "step": history.step, "cluster": cluster}
        while k_hi >= 0:
            k_lo = max(0, k_hi - per_batch + 1)
            conn.execute(_FILL.format(table=q), {**params, "k_hi": k_hi, "k_lo": k_lo})
            done = (history.per_job - k_lo) * history.jobs
            log(f"    filled {done:,} of {history.rows:,} rows "
                f"({time.monotonic() - t0:.0f}s)")
            k_hi = k_lo - 1
        t1 = time.monotonic()
        if rebuild:
            for name, definition in keys:
                conn.execute(f'ALTER TABLE {q} ADD CONSTRAINT "{name}" {definition}')
            for _, definition in indexes:
                # a partitioned table's index reads "ON ONLY": built on every partition here
                conn.execute(definition.replace(" ON ONLY ", " ON ", 1))
        t2 = time.monotonic()
        conn.execute(f"VACUUM ANALYZE {q}")
        t3 = time.monotonic()
        after = all_indexes(conn, table)
    if after != before:
        raise AssertionError(f"the indexes of {table} differ after the fill:\n{before}\n{after}")
    out.update(insert_s=t1 - t0, index_s=t2 - t1, vacuum_s=t3 - t2, total_s=t3 - t0)
    return out


def sizes(conn: psycopg.Connection[Any], table: str) -> dict[str, int]:
    """Bytes of *table* with its partitions: heap (with TOAST), indexes, total; partitions."""
    row = conn.execute(
        "SELECT coalesce(sum(pg_table_size(relid)), 0), coalesce(sum(pg_indexes_size(relid)), 0),"
        " coalesce(sum(pg_total_relation_size(relid)), 0),"
        " count(*) FILTER (WHERE isleaf AND level > 0) FROM " + _TREE, {"t": table}).fetchone()
    assert row is not None
    heap, index, total, leaves = (int(v) for v in row)
    return {"heap": heap, "index": index, "total": total, "partitions": leaves}


def dead_tuples(conn: psycopg.Connection[Any], table: str) -> tuple[int, int]:
    """(n_live_tup, n_dead_tup) of *table* and its partitions, as the statistics say."""
    row = conn.execute(
        "SELECT coalesce(sum(s.n_live_tup), 0), coalesce(sum(s.n_dead_tup), 0) "
        "FROM " + _TREE + " JOIN pg_stat_user_tables AS s ON s.relid = t.relid",
        {"t": table}).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
    assert row is not None
    return int(row[0])

"""Day partitions of the claims table on PostgreSQL (``elarion_beat_claims_layout =
"partitioned"``).

The table is ``PARTITION BY RANGE (occurrence_utc)``: one partition per UTC day,
``<table>_pYYYYMMDD``, and a DEFAULT partition ``<table>_pdefault`` that takes every
row no day partition covers, so an insert never fails for lack of a partition.

* **Creation.** The nodes create today's partition and the
  ``elarion_beat_partitions_ahead`` days after it, when the schema is made and once
  a day after (:meth:`DayPartitions.ensure`). Each creation is serialized by the
  table's DDL advisory lock (nodes racing find it made) and runs under a short
  ``lock_timeout``: it needs the table to itself for a moment, and the claims queued
  behind it must not wait long (a creation that times out is tried again later).
  Rows the DEFAULT partition already holds for the day are moved in the same
  transaction: a standalone table is created, filled, then attached.
* **Purge.** A day partition whose whole range is older than the cutoff is detached
  and dropped (:meth:`DayPartitions.drop`): no row is deleted, nothing is left to
  vacuum. The rows of it that must stay (each job's newest claim, a claim made
  after the cutoff, and every row of another cluster: one app's purge never deletes
  another's rows) are inserted again first and land in the DEFAULT partition,
  where the ordinary batched delete purges them once a newer claim exists. Finding
  them reads one row per job of the partition (a skip scan of its key), never all
  its rows. The rows dropped are counted from the planner's statistics when the
  partition has been analyzed (autovacuum does it), else counted exactly. A
  partition that holds rows of another cluster is not dropped: the batched delete
  purges this cluster's rows of it (:meth:`DayPartitions.shared`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from sqlalchemy import Table, func, select, text
from sqlalchemy.engine import Connection

from ..schedules.clock import as_utc

__all__ = ["PARTITIONED", "PLAIN", "DayPartition", "DayPartitions", "day_bounds",
           "default_partition_name", "layout_message", "missing_default_message",
           "partition_name"]

PLAIN = "plain"
PARTITIONED = "partitioned"


def partition_name(table: str, day: date) -> str:
    """``<table>_pYYYYMMDD``: the partition of the UTC day *day*."""
    return f"{table}_p{day:%Y%m%d}"


def default_partition_name(table: str) -> str:
    return f"{table}_pdefault"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """The range of a day partition: UTC midnight to the next."""
    start = datetime.combine(day, time(), tzinfo=timezone.utc)
    return start, start + timedelta(days=1)


@dataclass(frozen=True)
class DayPartition:
    """One day partition attached to the claims table."""

    name: str
    day: date
    oid: int

    @property
    def upper(self) -> datetime:
        return day_bounds(self.day)[1]

    def expired(self, cutoff: datetime) -> bool:
        """Whether its whole range is older than *cutoff*."""
        return self.upper <= as_utc(cutoff)


class DayPartitions:
    """The day partitions of one claims table, managed with SQL on a connection the
    caller holds (its transaction is the caller's)."""

    def __init__(self, table: Table, quote: Any, namespace: int, cluster: str, ahead: int,
                 lock_timeout_ms: int) -> None:
        self.table = table
        self._quote = quote  # the dialect's IdentifierPreparer
        self.namespace = namespace
        #: the cluster whose claims the purge may drop (:mod:`.clusters`)
        self.cluster = cluster
        self.ahead = ahead
        self.lock_timeout_ms = lock_timeout_ms
        self.parent = self.qualified(table.name)
        self.default = self.qualified(default_partition_name(table.name))
        self._columns = ", ".join(self._quote.quote(c.name) for c in table.columns)
        self._day_name = re.compile(re.escape(table.name) + r"_p(\d{8})")

    def qualified(self, name: str) -> str:
        quoted = self._quote.quote(name)
        schema = self.table.schema
        return f"{self._quote.quote_schema(schema)}.{quoted}" if schema else quoted

    # -- what there is -------------------------------------------------------------

    def layout(self, conn: Connection) -> str | None:
        """``plain`` or ``partitioned``: the layout of the existing table (None: missing)."""
        kind = conn.execute(text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"),
                            {"t": self.parent}).scalar()
        if kind is None:
            return None
        return PARTITIONED if kind == "p" else PLAIN

    def has_default(self, conn: Connection) -> bool:
        return bool(conn.execute(text(
            "SELECT EXISTS (SELECT 1 FROM pg_inherits AS i JOIN pg_class AS c "
            "ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(:t) "
            "AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT')"), {"t": self.parent}).scalar())

    def days(self, conn: Connection) -> dict[date, DayPartition]:
        """The attached partitions named ``<table>_pYYYYMMDD``, by day (a partition of
        another name is an operator's: never touched)."""
        rows = conn.execute(text(
            "SELECT c.oid, c.relname FROM pg_inherits AS i JOIN pg_class AS c "
            "ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(:t)"), {"t": self.parent})
        out = {}
        for oid, name in rows:
            match = self._day_name.fullmatch(name)
            if match is not None:
                day = datetime.strptime(match[1], "%Y%m%d").date()
                out[day] = DayPartition(name, day, int(oid))
        return out

    # -- creation ------------------------------------------------------------------

    def create_default(self, conn: Connection) -> None:
        conn.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS {self.default} PARTITION OF {self.parent} DEFAULT")

    def ensure(self, conn: Connection, today: date) -> list[str]:
        """Create the partitions of *today* and the days ahead that are missing; the
        names created. Serialized with every other DDL on the table."""
        self._lock(conn)
        have = self.days(conn)
        wanted = [today + timedelta(days=n) for n in range(self.ahead + 1)]
        missing = [day for day in wanted if day not in have]
        if not missing:
            return []
        self._short_lock_timeout(conn)
        for day in missing:
            self.create(conn, day)
        return [partition_name(self.table.name, day) for day in missing]

    def create(self, conn: Connection, day: date) -> None:
        """Create the partition of *day*, moving into it the rows the DEFAULT partition
        holds for it (the caller holds the DDL lock)."""
        name = self.qualified(partition_name(self.table.name, day))
        bounds = "FROM ('{}') TO ('{}')".format(*(b.isoformat() for b in day_bounds(day)))
        start, end = day_bounds(day)
        stray = self.has_default(conn) and conn.execute(text(
            f"SELECT EXISTS (SELECT 1 FROM {self.default} WHERE occurrence_utc >= :start "
            "AND occurrence_utc < :end)"), {"start": start, "end": end}).scalar()
        if not stray:
            conn.exec_driver_sql(f"CREATE TABLE {name} PARTITION OF {self.parent} "
                                 f"FOR VALUES {bounds}")
            return
        # the table to itself, so no claim lands in DEFAULT between the move and the attach
        conn.exec_driver_sql(f"LOCK TABLE {self.parent} IN ACCESS EXCLUSIVE MODE")
        conn.exec_driver_sql(f"CREATE TABLE {name} (LIKE {self.parent} INCLUDING DEFAULTS)")
        conn.execute(text(
            f"WITH moved AS (DELETE FROM {self.default} WHERE occurrence_utc >= :start "
            f"AND occurrence_utc < :end RETURNING {self._columns}) "
            f"INSERT INTO {name} ({self._columns}) SELECT {self._columns} FROM moved"),
            {"start": start, "end": end})
        conn.exec_driver_sql(f"ALTER TABLE {self.parent} ATTACH PARTITION {name} "
                             f"FOR VALUES {bounds}")

    # -- the purge -----------------------------------------------------------------

    def expired(self, conn: Connection, cutoff: datetime) -> list[DayPartition]:
        """The day partitions whose whole range is older than *cutoff* and that hold no
        row of another cluster, oldest first."""
        return sorted((p for p in self.days(conn).values()
                       if p.expired(cutoff) and not self.shared(conn, p)),
                      key=lambda p: p.day)

    def shared(self, conn: Connection, part: DayPartition) -> bool:
        """Whether *part* holds a row of another cluster (then only the batched delete,
        of this cluster's rows, purges it). An index probe each side of this cluster
        where the key leads with it; on a table of 0.2, a scan of the partition."""
        p = self.qualified(part.name)
        return bool(conn.execute(text(
            f"SELECT EXISTS (SELECT 1 FROM {p} WHERE cluster < :cluster) "
            f"OR EXISTS (SELECT 1 FROM {p} WHERE cluster > :cluster)"),
            {"cluster": self.cluster}).scalar())

    def kept(self, conn: Connection, part: DayPartition) -> list[tuple[str, datetime]]:
        """The keys of the rows of *part* that are their job's newest claim: one row
        per job of the partition is read (a skip scan of its primary key)."""
        p = self.qualified(part.name)
        rows = conn.execute(text(f"""
            WITH RECURSIVE jobs(job_name) AS (
                (SELECT job_name FROM {p} WHERE cluster = :cluster ORDER BY job_name LIMIT 1)
                UNION ALL
                SELECT (SELECT q.job_name FROM {p} AS q WHERE q.cluster = :cluster
                        AND q.job_name > jobs.job_name ORDER BY q.job_name LIMIT 1)
                FROM jobs WHERE jobs.job_name IS NOT NULL
            )
            SELECT o.job_name, o.occurrence_utc FROM jobs CROSS JOIN LATERAL (
                SELECT q.job_name, q.occurrence_utc FROM {p} AS q
                WHERE q.cluster = :cluster AND q.job_name = jobs.job_name
                ORDER BY q.occurrence_utc DESC LIMIT 1) AS o
            WHERE NOT EXISTS (SELECT 1 FROM {self.parent} AS n
                              WHERE n.cluster = :cluster AND n.job_name = o.job_name
                                AND n.occurrence_utc >= :upper)
            """), {"upper": part.upper, "cluster": self.cluster})
        return [(job, as_utc(occurrence)) for job, occurrence in rows]

    def rows(self, conn: Connection, part: DayPartition) -> int:
        """The rows of *part*: the planner's estimate once analyzed, else counted."""
        estimate = conn.execute(text("SELECT reltuples FROM pg_class WHERE oid = :oid"),
                                {"oid": part.oid}).scalar()
        if estimate is not None and estimate >= 0:
            return int(estimate)
        return int(conn.execute(text(f"SELECT count(*) FROM {self.qualified(part.name)}"))
                   .scalar_one())

    def keeping(self, conn: Connection, part: DayPartition,
                keep: Sequence[tuple[str, datetime]], cutoff: datetime) -> int:
        """How many rows of *part* a drop at *cutoff* keeps (the dry run's count)."""
        return int(conn.execute(text(
            f"SELECT count(*) FROM {self.qualified(part.name)} WHERE " + _KEEP),
            _keep_params(keep, cutoff, self.cluster)).scalar_one())

    def drop(self, conn: Connection, part: DayPartition, keep: Sequence[tuple[str, datetime]],
             cutoff: datetime) -> int | None:
        """Detach and drop *part*, inserting again the rows *keep* names and those
        claimed at or after *cutoff* (they land in DEFAULT); the rows kept, or None
        when another purger dropped it first."""
        self._lock(conn)
        if part.day not in self.days(conn):
            return None
        self._short_lock_timeout(conn)
        name = self.qualified(part.name)
        conn.exec_driver_sql(f"ALTER TABLE {self.parent} DETACH PARTITION {name}")
        kept = conn.execute(text(
            f"INSERT INTO {self.parent} ({self._columns}) SELECT {self._columns} "
            f"FROM {name} WHERE " + _KEEP), _keep_params(keep, cutoff, self.cluster)).rowcount
        conn.exec_driver_sql(f"DROP TABLE {name}")
        return int(kept)

    def count_rows_purgeable(self, conn: Connection, cutoff: datetime,
                             skip: Sequence[DayPartition]) -> int:
        """The claims the batched delete would purge at *cutoff*, outside *skip*."""
        return int(conn.execute(text(
            f"SELECT count(*) FROM {self.parent} AS o WHERE o.cluster = :cluster "
            "AND o.claimed_at < :cutoff AND o.tableoid <> ALL(CAST(:skip AS oid[])) "
            f"AND EXISTS (SELECT 1 FROM {self.parent} AS n WHERE n.cluster = o.cluster "
            "AND n.job_name = o.job_name AND n.occurrence_utc > o.occurrence_utc)"),
            {"cutoff": cutoff, "skip": [p.oid for p in skip],
             "cluster": self.cluster}).scalar_one())

    def _lock(self, conn: Connection) -> None:
        """The table's DDL lock (the one the schema's creation takes), for this transaction."""
        conn.execute(select(func.pg_advisory_xact_lock(self.namespace, 0)))

    def _short_lock_timeout(self, conn: Connection) -> None:
        """Wait briefly for the table lock: the claims queue behind a waiting DDL."""
        conn.execute(text("SELECT set_config('lock_timeout', :ms, true)"),
                     {"ms": str(self.lock_timeout_ms)})


#: The rows of a day partition its drop keeps: a job's newest claim, or claimed late,
#: and every row of another cluster (one that came since the partition was looked at).
_KEEP = ("cluster <> :cluster OR (job_name, occurrence_utc) IN (SELECT * FROM "
         "unnest(CAST(:jobs AS text[]), CAST(:occurrences AS timestamptz[]))) "
         "OR claimed_at >= :cutoff")


def _keep_params(keep: Sequence[tuple[str, datetime]], cutoff: datetime,
                 cluster: str) -> dict[str, Any]:
    return {"jobs": [job for job, _ in keep], "occurrences": [occ for _, occ in keep],
            "cutoff": cutoff, "cluster": cluster}


def layout_message(qualified_table: str, found: str, wanted: str) -> str:
    """The error of a claims table whose layout is not the one the setting asks for."""
    kind = "a plain" if found == PLAIN else "a partitioned"
    return (f"the claims table {qualified_table} is {kind} table, and "
            f"elarion_beat_claims_layout is {wanted!r}: beat never converts a table."
            f" Set elarion_beat_claims_layout = {found!r}, or migrate the table to the "
            f"{wanted} layout first (docs/howto/large-claims-tables.md, 'Switch an existing "
            "table')")


def missing_default_message(qualified_table: str, default: str, parent: str) -> str:
    return (f"the partitioned claims table {qualified_table} has no DEFAULT partition and "
            f"elarion_beat_create_table is False: run CREATE TABLE {default} PARTITION OF "
            f"{parent} DEFAULT, or `celery -A proj elarion-beat init-db`")


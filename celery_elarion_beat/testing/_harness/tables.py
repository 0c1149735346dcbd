"""Claims tables of a test, the demo or a benchmark: read them, drop them.

Both work on any database the library supports (PostgreSQL, MariaDB/MySQL,
SQLite), given a DSN as ``elarion_beat_dsn`` takes it. Each call opens one
connection and closes it again, so no pool outlives it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import MetaData, create_engine, inspect, select
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

from ...config.dsn import normalize_dsn
from ...config.settings import default_nodes_table, related_table
from ...schedules.clock import as_utc
from ...store.records import ClaimRow
from ...store.schema import claims_table

__all__ = ["claims_tables", "drop_tables", "read_claims"]


def claims_tables(table: str) -> tuple[str, ...]:
    """Every table that goes with the claims table *table*, as beat names them by
    default: the claims, nodes, pauses, audit, one-offs and foreign beats tables, and
    the database entries' tables (entries, revisions, versions)."""
    from ...config.names import TABLE_MAX

    return (table, default_nodes_table(table), related_table(table, "pauses", TABLE_MAX),
            related_table(table, "audit", TABLE_MAX), related_table(table, "oneoffs", TABLE_MAX),
            related_table(table, "foreign_beats", TABLE_MAX),
            related_table(table, "entries", TABLE_MAX),
            related_table(table, "revisions", TABLE_MAX),
            related_table(table, "versions", TABLE_MAX))


@contextmanager
def _connect(dsn: str) -> Iterator[Connection]:
    engine = create_engine(normalize_dsn(dsn), poolclass=NullPool)
    try:
        with engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()


def drop_tables(dsn: str, *names: str, prefix: str | None = None) -> None:
    """Drop the tables *names* if they exist and, with *prefix*, every table whose
    name starts with *prefix* (a run's leftovers)."""
    with _connect(dsn) as conn:
        doomed = list(dict.fromkeys(names))
        if prefix:
            doomed += sorted(n for n in inspect(conn).get_table_names()
                             if n.startswith(prefix) and n not in doomed)
        quote = conn.dialect.identifier_preparer.quote
        for name in doomed:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {quote(name)}")
            if conn.dialect.name == "postgresql" and name.endswith("_entries"):
                # the entries table's trigger function (live schedules) outlives it
                conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {quote(name + '_revise')}()")


def read_claims(dsn: str, table: str) -> list[ClaimRow]:
    """Every row of the claims table *table*, by occurrence then job; none if it
    does not exist (yet)."""
    c = claims_table(MetaData(), table).c
    with _connect(dsn) as conn:
        if not inspect(conn).has_table(table):
            return []
        present = {col["name"] for col in inspect(conn).get_columns(table)}
        query = (select(*[col for col in c if col.name in present])
                 .order_by(c.occurrence_utc, c.job_name))
        return [ClaimRow(r.job_name, as_utc(r.occurrence_utc), r.node, r.task_id, r.kind,
                         as_utc(r.claimed_at), state=getattr(r, "state", None),
                         published_at=as_utc(r.published_at)
                         if getattr(r, "published_at", None) else None,
                         publish_error=getattr(r, "publish_error", None),
                         takeovers=int(getattr(r, "takeovers", 0) or 0),
                         orphan_reported_at=as_utc(r.orphan_reported_at)
                         if getattr(r, "orphan_reported_at", None) else None,
                         run_state=getattr(r, "run_state", None),
                         cluster=getattr(r, "cluster", "") or "",
                         revision=getattr(r, "revision", None))
                for r in conn.execute(query)]

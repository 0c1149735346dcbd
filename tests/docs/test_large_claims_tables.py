"""docs/howto/large-claims-tables.md: the migration of an existing plain table to the
partitioned layout works as written (with this test's table name in place of
``elarion_scheduler_claims``), on the real PostgreSQL server."""

from __future__ import annotations

import re
from datetime import datetime, time, timedelta, timezone
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import MetaData

from celery_elarion_beat import ClaimRequest, Settings
from celery_elarion_beat.store.partitions import partition_name
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.store.schema import claims_table
from celery_elarion_beat.testing._harness import drop_tables

PAGE = Path(__file__).resolve().parents[2] / "docs" / "howto" / "large-claims-tables.md"
pytestmark = pytest.mark.postgres


def sql_blocks(table: str) -> list[str]:
    """The ```sql blocks of the page's "Switch an existing table" section."""
    body = PAGE.read_text().split("\n## Switch an existing table\n", 1)[1].split("\n## ", 1)[0]
    return [b.replace("elarion_scheduler_claims", table)
            for b in re.findall(r"```sql\n(.*?)```", body, re.S)]


def store_for(pg_dsn: str, table: str, layout: str) -> PostgresClaimStore:
    return PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table,
        "elarion_beat_claims_layout": layout}))


def test_the_page_copies_every_column() -> None:
    (_, copy) = sql_blocks("t")
    listed = re.search(r"INSERT INTO t\s*\((.*?)\)", copy, re.S)
    assert listed is not None
    assert [c.strip() for c in listed[1].split(",")] == [
        c.name for c in claims_table(MetaData()).columns]


def test_a_plain_table_moves_to_the_partitioned_layout_as_the_page_says(
        pg_dsn: str, table_name: str) -> None:
    plain = store_for(pg_dsn, table_name, "plain")
    plain.ensure_schema()
    with psycopg.connect(pg_dsn) as conn:
        today = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()[0]  # type: ignore[index]
    slots = [datetime.combine(today - timedelta(days=n), time(12), tzinfo=timezone.utc)
             for n in range(10, -1, -1)]
    plain.claim("node-a", [ClaimRequest.for_slot("daily", s, f"t{i}")
                           for i, s in enumerate(slots)])
    plain.close()
    step1, step3 = sql_blocks(table_name)
    try:
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(step1)
        partitioned = store_for(pg_dsn, table_name, "partitioned")
        partitioned.create_schema()  # what `elarion-beat init-db` does
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(step3)
            where = dict(conn.execute(
                f'SELECT occurrence_utc, tableoid::regclass::text FROM "{table_name}"'))
        assert sorted(where) == slots
        for slot in slots[-8:]:  # the days inside the retention: in their partitions
            assert where[slot] == partition_name(table_name, slot.date())
        for slot in slots[:-8]:
            assert where[slot] == f"{table_name}_pdefault"
        # the moved claims hold their slots
        again = partitioned.claim("node-b", [ClaimRequest.for_slot("daily", s, "x")
                                             for s in slots])
        assert not any(r.won for r in again)
        partitioned.close()
    finally:
        drop_tables(pg_dsn, f"{table_name}_old")

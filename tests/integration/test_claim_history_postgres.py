"""A claim reads the rows it needs, not the history of its jobs (real PostgreSQL).

A claims table at the default retention holds about a week of every job's claims:
10,000 minutely jobs are 100 million rows. The window checks of a claim once read
the clock with ``clock_timestamp()``, which is volatile, so it could not bound the
index scan: each window claim read every claim its job had made (1,000 rows per job
took a chunk of 1,000 from 0.15 s to 5 s). The test runs the real claim statement
under ``EXPLAIN ANALYZE`` against jobs with a long history and counts the rows the
scans of the claims table read and threw away: a handful, whatever the history.
No time is measured.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from celery_elarion_beat import ClaimRequest, Settings
from celery_elarion_beat.store.pg_claim import claim_params as _params
from celery_elarion_beat.store.postgres import PostgresClaimStore

JOBS = 400  # as many jobs as make the planner see a job's rows as a small share
HISTORY = 300  # minutely claims per job, all older than the windows claimed below


@pytest.fixture(params=["plain", "partitioned"])
def store(request: pytest.FixtureRequest, pg_dsn: str,
          table_name: str) -> Iterator[PostgresClaimStore]:
    layout = {"elarion_beat_claims_layout": request.param} if request.param != "plain" else {}
    settings = Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name, **layout})
    store = PostgresClaimStore(settings)
    store.ensure_schema()
    yield store
    store.close()


def _plain(dsn: str) -> str:
    return dsn.replace("postgresql+psycopg://", "postgresql://")


def _scans(plan: dict[str, Any], table: str) -> Iterator[dict[str, Any]]:
    """Every plan node that reads the claims table (or one of its partitions)."""
    if str(plan.get("Relation Name", "")).startswith(table):
        yield plan
    for child in plan.get("Plans", []):
        yield from _scans(child, table)


def test_a_claim_reads_no_history_of_its_jobs(store: PostgresClaimStore, pg_dsn: str,
                                              table_name: str) -> None:
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    jobs = [f"job-{i}" for i in range(JOBS)]
    with psycopg.connect(_plain(pg_dsn), autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {store._table_sql} (cluster, job_name, occurrence_utc, node, task_id,"
            " kind, claimed_at, claim_token, state)"
            " SELECT %(cluster)s, j, %(now)s - make_interval(mins => m), 'old', md5(j || m),"
            "        'slot', %(now)s - make_interval(mins => m), 'token', 'published'"
            " FROM unnest(%(jobs)s::text[]) AS j, generate_series(10, 9 + %(n)s) AS m",
            {"now": now, "jobs": jobs, "n": HISTORY, "cluster": store.cluster})
        conn.execute(f"ANALYZE {store._table_sql}")
    # a claim inside job-1's window, so its window request finds a holder
    (held,) = store.claim("other", [ClaimRequest.for_window("job-1", timedelta(minutes=5),
                                                            str(uuid.uuid4()))])
    assert held.won
    slot = now + timedelta(minutes=1)
    requests = [
        ClaimRequest.for_window("job-0", timedelta(minutes=5), str(uuid.uuid4())),  # wins
        ClaimRequest.for_window("job-1", timedelta(minutes=5), str(uuid.uuid4())),  # held
        ClaimRequest.for_slot("job-2", slot, str(uuid.uuid4())),  # a new slot: wins
        ClaimRequest.for_slot("job-3", now - timedelta(minutes=10), str(uuid.uuid4())),  # held
        ClaimRequest.for_window("job-4", timedelta(minutes=5), str(uuid.uuid4())),  # wins
        ClaimRequest.for_slot("job-5", slot, str(uuid.uuid4())),  # wins
    ]
    with psycopg.connect(_plain(pg_dsn)) as conn:
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + store._claim_sql,
                           _params("node-a", requests, "tok", store.cluster)).fetchone()
        assert row is not None
        result = conn.execute("SELECT 1").fetchone()  # the statement ran in this transaction
        conn.rollback()
    assert result == (1,)
    (explained,) = row
    plan = (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]
    scans = list(_scans(plan, table_name))
    assert scans, "the claim read no claims table?"
    read = sum(int(s.get("Actual Rows", 0)) * int(s.get("Actual Loops", 1)) for s in scans)
    thrown = sum(int(s.get("Rows Removed by Filter", 0)) * int(s.get("Actual Loops", 1))
                 for s in scans)
    # 6 requests: at most a row or two each, never the 300 of a job's history
    assert thrown <= 12, (thrown, [(s["Node Type"], s.get("Rows Removed by Filter"))
                                   for s in scans])
    assert read <= 24, read


def test_claims_are_never_jit_compiled(store: PostgresClaimStore) -> None:
    """A chunk of 1,000 on a big table passes jit_above_cost: compiling it took up to
    1.9 s per chunk at 10 million rows, for a statement made of index probes."""
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW jit").scalar_one() == "off"

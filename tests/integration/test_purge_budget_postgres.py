"""The purge inside beat's tick is bounded by ``elarion_beat_purge_budget``, on the real
PostgreSQL server, with each claims-table layout.

The budget is measured on an injected monotonic clock that moves one second per
reading, so the assertions count batches and passes, never wall-clock time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from celery_elarion_beat import ClaimRequest, Settings
from celery_elarion_beat.beat.maintenance import Maintenance
from celery_elarion_beat.beat.purge import PURGE_JOB
from celery_elarion_beat.observe.outcome import Recorder
from celery_elarion_beat.store.postgres import PostgresClaimStore

pytestmark = pytest.mark.postgres

SLOT = datetime(2026, 1, 5, 3, 0, tzinfo=timezone.utc)
OLD = 100  # purgeable claims: the job has OLD + 1, its newest is kept


@pytest.fixture(params=["plain", "partitioned"])
def store(request: pytest.FixtureRequest, pg_dsn: str,
          table_name: str) -> Iterator[PostgresClaimStore]:
    s = PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name,
        "elarion_beat_node": "node-a", "elarion_beat_claims_layout": request.param,
        "elarion_beat_purge_batch": 10, "elarion_beat_purge_budget": 2.5}))
    s.ensure_schema()
    s.claim("node-a", [ClaimRequest.for_slot("old", SLOT + timedelta(minutes=i), f"t{i}")
                       for i in range(OLD + 1)])
    with psycopg.connect(pg_dsn) as conn:  # claimed 8 days ago (the retention is 7)
        conn.execute(f'UPDATE "{table_name}" SET claimed_at = claimed_at - interval \'8 days\'')
    yield s
    s.close()


def count(pg_dsn: str, table: str, job: str) -> int:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{table}" WHERE job_name = %s',
                           (job,)).fetchone()
        assert row is not None
        return int(row[0])


def ticking() -> Iterator[float]:
    """A monotonic clock one second further at every reading."""
    return itertools.count(1000.0, 1.0)


def test_the_purge_in_the_tick_stops_at_its_budget_and_goes_on_at_the_next_ticks(
        store: PostgresClaimStore, pg_dsn: str, table_name: str) -> None:
    clock = ticking()
    m = Maintenance(store.settings, store, Recorder(), lambda: datetime.now(timezone.utc),
                    entries=dict, monotonic=lambda: next(clock))
    # each stretch: a batch, then the budget is read (1 s, 2 s, 3 s >= 2.5 s): 3 batches
    stretches = []
    m.run()  # heartbeat, and the election this node wins: the first stretch
    stretches.append(OLD + 1 - count(pg_dsn, table_name, "old"))
    assert stretches == [30] and m.purging
    while m.purging and len(stretches) < 10:
        before = count(pg_dsn, table_name, "old")
        m.run()  # no new election (it would lose: this interval's window is held)
        stretches.append(before - count(pg_dsn, table_name, "old"))
    assert stretches == [30, 30, 30, 10] and not m.purging
    assert count(pg_dsn, table_name, "old") == 1  # the job's newest claim
    assert count(pg_dsn, table_name, PURGE_JOB) == 1  # one election for the whole pass
    # the pass is over: the next run waits for the next interval
    m.run()
    assert count(pg_dsn, table_name, PURGE_JOB) == 1


def test_a_stretch_continues_the_pass_at_its_first_cutoff(store: PostgresClaimStore) -> None:
    retention = timedelta(days=7)
    first = store.purge_pass(retention, batch_size=10, budget=2.5, monotonic=ticking().__next__)
    assert (first.deleted, first.total, first.done) == (30, 30, False)
    second = store.purge_pass(retention, batch_size=10, budget=2.5, resume=first,
                              monotonic=ticking().__next__)
    assert second.cutoff == first.cutoff and (second.deleted, second.total) == (30, 60)
    rest = store.purge_pass(retention, batch_size=10, resume=second)  # no budget: to the end
    assert (rest.deleted, rest.total, rest.done) == (40, 100, True)


def test_the_manual_purge_is_not_bounded(store: PostgresClaimStore) -> None:
    """``elarion-beat purge`` (the store's purge) ignores the in-tick budget."""
    assert store.purge(timedelta(days=7), batch_size=10) == OLD

"""ClaimingScheduler against the real PostgreSQL server, in process."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat import (
    ClaimingScheduler,
    Outcome,
    Settings,
    SkipReason,
    StoreUnavailable,
    cron,
)
from celery_elarion_beat.beat.chunks import chunk_size
from celery_elarion_beat.store.postgres import PostgresClaimStore
from tests.helpers.fakes import FakeClock, published
from tests.helpers.threads import lingering


def pg_app(pg_dsn: str, table: str, node: str, entries: dict, **conf: object) -> Celery:
    app = Celery(f"pg{uuid.uuid4().hex[:6]}", broker=f"memory://{uuid.uuid4().hex}",
                 set_as_current=False)
    app.conf.update(beat_schedule=entries, elarion_beat_dsn=pg_dsn, elarion_beat_table=table,
                    elarion_beat_node=node, result_expires=None,
                    task_default_queue=f"q-{uuid.uuid4().hex[:8]}", **conf)
    return app


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc))


def test_a_thousand_due_entries_cost_one_round_trip_per_chunk(pg_dsn: str, table_name: str,
                                                          clock: FakeClock) -> None:
    entries = {f"job-{i:04}": {"task": "tasks.job", "schedule": crontab(nowfun=clock)}
               for i in range(1000)}
    apps = [pg_app(pg_dsn, table_name, f"node-{i}", entries) for i in range(2)]
    nodes = [ClaimingScheduler(app, clock=clock) for app in apps]
    try:
        clock.advance(30.2)
        before = [n.store.round_trips for n in nodes]
        for node in nodes:
            node.tick()
        # one round trip per chunk: one chunk, or one per live node seen (at most 2 here),
        # never one per entry; the winner adds one statement marking its last chunk
        # published, as the next tick (30 s away) is too far for it to ride along
        chunks = [-(-1000 // chunk_size(1000, n.settings.claim_chunk,
                                        len(n.maintenance.live_nodes))) for n in nodes]
        assert all(c <= 2 for c in chunks)
        assert [n.store.round_trips - b for n, b in zip(nodes, before)] == [chunks[0] + 1,
                                                                            chunks[1]]
        sent = [len(published(app)) for app in apps]
        assert sent == [1000, 0]
        assert nodes[1].recorder.total(Outcome.SKIPPED, SkipReason.CLAIMED_ELSEWHERE) == 1000
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(f'SELECT node, count(*) FROM "{table_name}" '
                                "WHERE job_name <> 'elarion.purge' GROUP BY node")
            assert rows.fetchall() == [("node-0", 1000)]
            states = conn.execute(f'SELECT state, count(*) FROM "{table_name}" '
                                  "WHERE job_name <> 'elarion.purge' GROUP BY state")
            assert states.fetchall() == [("published", 1000)]
    finally:
        for node in nodes:
            node.close()


def test_publish_reports_ride_along_with_the_next_claim(pg_dsn: str, table_name: str,
                                                        clock: FakeClock) -> None:
    """An every-second schedule claims on every tick: each tick's claim carries the
    previous tick's publish reports, so marking claims published costs no round trip."""
    entries = {f"job-{i}": {"task": "tasks.job", "schedule": cron("* * * * * *", nowfun=clock)}
               for i in range(20)}
    node = ClaimingScheduler(pg_app(pg_dsn, table_name, "node-0", entries), clock=clock)
    try:
        clock.advance(1.0)
        node.tick()  # the first tick's reports wait for the next claim
        before = node.store.round_trips
        for _ in range(5):
            clock.advance(1.0)
            node.tick()
        assert node.store.round_trips - before == 5  # one per tick: the claim only
        with psycopg.connect(pg_dsn) as conn:
            states = dict(conn.execute(f'SELECT state, count(*) FROM "{table_name}" '
                                       "WHERE job_name <> 'elarion.purge' GROUP BY state"))
        assert states == {"published": 100, "pending": 20}  # the last tick's, until...
        node.close()  # ...beat stops: closing writes them
        with psycopg.connect(pg_dsn) as conn:
            states = dict(conn.execute(f'SELECT state, count(*) FROM "{table_name}" '
                                       "WHERE job_name <> 'elarion.purge' GROUP BY state"))
        assert states == {"published": 120}
    finally:
        node.close()


def test_create_table_disabled_and_missing_is_a_clear_startup_error(pg_dsn: str,
                                                                    table_name: str) -> None:
    app = pg_app(pg_dsn, table_name, "node-0", {}, elarion_beat_create_table=False)
    with pytest.raises(Exception) as info:
        ClaimingScheduler(app)
    message = str(info.value)
    assert table_name in message and "elarion_beat_create_table" in message
    assert "claims_table" in message


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A loopback TCP server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_silent_database_costs_a_bounded_time_and_fails_closed(silent_server: int,
                                                                 clock: FakeClock) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{silent_server}/test"
    app = pg_app(dsn, "claims", "node-0",
                 {"report": {"task": "tasks.report", "schedule": crontab(nowfun=clock)}},
                 elarion_beat_claim_timeout=2)
    scheduler = ClaimingScheduler(app, clock=clock)  # the schema check fails closed, no crash
    clock.advance(30.2)
    started = time.monotonic()
    scheduler.tick()
    elapsed = time.monotonic() - started
    assert elapsed < 60, "a silent database must not hang beat"  # bound, not a speed claim
    assert published(app) == []
    (record,) = scheduler.recorder.recent
    assert record.reason is SkipReason.CLAIM_ERROR
    scheduler.close()


def test_a_refused_connection_is_translated_at_the_store_boundary() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    settings = Settings.from_mapping({
        "elarion_beat_dsn": f"postgresql://postgres:pw@127.0.0.1:{port}/test",
        "elarion_beat_claim_timeout": 2})
    store = PostgresClaimStore(settings)
    with pytest.raises(StoreUnavailable) as info:
        store.ensure_schema()
    assert "pw@" not in str(info.value) and "***" in str(info.value)
    store.close()


def test_a_window_is_measured_on_the_database_clock(pg_dsn: str, table_name: str) -> None:
    """Nodes whose clocks disagree by an hour still share one window."""
    entries = {"poll": {"task": "tasks.poll", "schedule": timedelta(seconds=30)}}
    early = FakeClock(datetime.now(timezone.utc) - timedelta(hours=1))
    late = FakeClock(datetime.now(timezone.utc) + timedelta(hours=1))
    apps = [pg_app(pg_dsn, table_name, f"node-{i}", entries) for i in range(2)]
    nodes = [ClaimingScheduler(app, clock=c) for app, c in zip(apps, (early, late))]
    try:
        for node in nodes:
            node.apply_entry(node.schedule["poll"], producer=node.producer)
        assert [len(published(app)) for app in apps] == [1, 0]
        (skip,) = nodes[1].recorder.recent
        assert skip.reason is SkipReason.CLAIMED_ELSEWHERE and skip.winner == "node-0"
    finally:
        for node in nodes:
            node.close()


def test_close_stops_the_threads_a_postgresql_beat_started(pg_dsn: str, table_name: str) -> None:
    """The event thread, and the statement watchdog's thread once nothing is running
    (a closed beat leaves no thread; the watchdog of a beat dropped unclosed ends
    IDLE_EXIT seconds after its last statement)."""
    before = set(threading.enumerate())
    app = pg_app(pg_dsn, table_name, "node-0",
                 {"report": {"task": "tasks.report", "schedule": timedelta(seconds=30)}})
    node = ClaimingScheduler(app)
    node.tick()
    started = {t.name for t in set(threading.enumerate()) - before}
    assert {"elarion-events", "elarion-watchdog"} <= started
    node.close()
    assert [t.name for t in lingering(before, "elarion", timeout=2.0)] == []

"""One-offs on the real PostgreSQL server: concurrent leases (SKIP LOCKED), a cancel
racing a lease, the outbox (the caller's transaction), and NOTIFY waking beat."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from celery import Celery
from sqlalchemy import create_engine, text

from celery_elarion_beat import ClaimingScheduler, OneOffState, Settings, schedule_once
from celery_elarion_beat.one_offs.api import close_stores, get_one_off
from celery_elarion_beat.store.postgres import PostgresClaimStore
from tests.helpers.fakes import published
from tests.integration.one_off_races import insert_due, race_cancel_and_lease, race_leases

pytestmark = pytest.mark.postgres


@pytest.fixture
def stores(pg_dsn: str, table_name: str) -> Iterator[list[PostgresClaimStore]]:
    made: list[PostgresClaimStore] = []

    def make() -> PostgresClaimStore:
        store = PostgresClaimStore(Settings.from_mapping({
            "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name,
            "elarion_beat_claim_timeout": 3}))
        store.ensure_schema()
        made.append(store)
        return store

    make()
    yield made
    for store in made:
        assert not store.engine.pool.checkedout(), "a connection is still checked out"
        store.close()


def more(stores: list[PostgresClaimStore]) -> PostgresClaimStore:
    store = PostgresClaimStore(stores[0].settings)
    store.ensure_schema()  # the schema check is no part of the race
    stores.append(store)
    return store


def test_four_connections_lease_ten_thousand_rows_each_once(stores: list[PostgresClaimStore],
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    ids = insert_due(stores[0], 10_000)
    racers = [stores[0], *[more(stores) for _ in range(3)]]
    race = race_leases(racers, batch=500)
    everything = [id_ for ids_ in race.leased for id_ in ids_]
    assert len(everything) == len(set(everything)) == 10_000
    assert set(everything) == set(ids)
    assert all(race.split), f"a connection leased nothing: {race.split}"
    with capsys.disabled():
        print(f"\n10,000 one-offs leased by 4 connections in {race.seconds:.2f}s, "
              f"split {race.split}, lease calls {race.calls}")


def test_a_lease_skips_rows_another_transaction_holds(stores: list[PostgresClaimStore],
                                                       pg_dsn: str) -> None:
    """A lease never waits for a lock (the store's lock_timeout is 3 s: waiting would
    raise StoreUnavailable): it leases the rows nobody holds."""
    ids = insert_due(stores[0], 10)
    table = stores[0].one_offs_table.name
    with psycopg.connect(pg_dsn) as holder:
        held = [r[0] for r in holder.execute(
            f'SELECT id FROM "{table}" ORDER BY due_utc LIMIT 4 FOR UPDATE').fetchall()]
        got = stores[0].lease_one_offs("node-a", limit=100, lease=timedelta(seconds=60))
        assert {x.id for x in got} == set(ids) - set(held)
        holder.rollback()
    rest = stores[0].lease_one_offs("node-b", limit=100, lease=timedelta(seconds=60))
    assert {x.id for x in rest} == set(held)


def test_a_cancel_racing_a_lease_has_one_winner(stores: list[PostgresClaimStore]) -> None:
    wins = race_cancel_and_lease(lambda: more(stores), trials=60)
    assert sum(wins.values()) == 60
    print(f"cancel racing lease, 60 trials: {wins}")


def test_schedule_once_joins_a_sqlalchemy_transaction(pg_dsn: str, table_name: str,
                                                      stores: list[PostgresClaimStore]) -> None:
    app = _app(pg_dsn, table_name)
    engine = create_engine(stores[0].engine.url)
    listener = stores[0].one_off_wakeups()
    assert listener is not None
    try:
        assert listener.poll() is True  # connected: it cannot know what it missed
        with engine.connect() as conn:
            trans = conn.begin()
            conn.execute(text("SELECT 1"))
            kept = schedule_once(app, "proj.tasks.remind", countdown=60, connection=conn)
            assert _count(stores[0]) == 0  # not visible before the caller commits
            trans.rollback()
        assert get_one_off(app, kept.id) is None
        time.sleep(0.3)  # a NOTIFY would have arrived by now
        assert listener.poll() is False  # a rolled-back one-off wakes nobody
        with engine.begin() as conn:
            row = schedule_once(app, "proj.tasks.remind", countdown=60, connection=conn)
        assert get_one_off(app, row.id) == row
        _wait(lambda: listener.poll())  # the NOTIFY arrives with the commit
    finally:
        listener.close()
        engine.dispose()
        close_stores()


def test_schedule_once_joins_a_psycopg_transaction(pg_dsn: str, table_name: str,
                                                   stores: list[PostgresClaimStore]) -> None:
    app = _app(pg_dsn, table_name)
    try:
        with psycopg.connect(pg_dsn) as conn:
            gone = schedule_once(app, "proj.tasks.remind", args=(1,), countdown=5,
                                 key="outbox-1", connection=conn)
            conn.rollback()
        assert get_one_off(app, gone.id) is None
        with psycopg.connect(pg_dsn) as conn:
            conn.execute("SELECT 1")
            row = schedule_once(app, "proj.tasks.remind", args=(1,), countdown=5,
                                key="outbox-1", connection=conn)
            again = schedule_once(app, "proj.tasks.remind", key="outbox-1", connection=conn)
            assert again == row
        assert get_one_off(app, "outbox-1") == row
        assert _count(stores[0]) == 1
    finally:
        close_stores()


def test_notify_wakes_beat_for_a_one_off_due_soon(pg_dsn: str, table_name: str,
                                                  stores: list[PostgresClaimStore]) -> None:
    """Two beat nodes in process: a one-off scheduled 0.5 s ahead is sent by the first
    tick at or after its due time, once, by one node, each wake at most
    elarion_beat_one_offs_poll apart."""
    apps = [_app(pg_dsn, table_name, node=f"node-{i}", broker=f"memory://{uuid.uuid4().hex}")
            for i in range(2)]
    apps[1].conf.broker_url = apps[0].conf.broker_url
    apps[1].conf.task_default_queue = apps[0].conf.task_default_queue
    beats = [ClaimingScheduler(app) for app in apps]
    try:
        for beat in beats:
            beat.tick()
        row = schedule_once(apps[0], "proj.tasks.remind", countdown=0.5)
        due = row.due
        waits = []
        while not published_rows(stores[0]):
            for beat in beats:
                waits.append(beat.tick())
            db_now = stores[0].clock()
            if db_now > due + timedelta(seconds=5):
                break
            time.sleep(min(waits[-2:]))
        assert max(waits) <= apps[0].conf.elarion_beat_one_offs_poll
        sent = published(apps[0])
        assert [m["headers"]["id"] for m in sent] == [row.id]
        done = get_one_off(apps[0], row.id)
        assert done is not None and done.state is OneOffState.PUBLISHED
        assert done.published is not None and done.published >= due
        listener = beats[0].one_offs._wakeups  # type: ignore[union-attr]
        assert listener is not None and listener.listening  # type: ignore[attr-defined]
    finally:
        for beat in beats:
            beat.close()
        close_stores()


def published_rows(store: PostgresClaimStore) -> list[Any]:
    return store.one_offs(states=[OneOffState.PUBLISHED])


def _app(pg_dsn: str, table: str, node: str = "node-a", broker: str | None = None) -> Celery:
    app = Celery(f"pg{uuid.uuid4().hex[:6]}", broker=broker or f"memory://{uuid.uuid4().hex}",
                 set_as_current=False)
    app.conf.update(beat_schedule={}, elarion_beat_dsn=pg_dsn, elarion_beat_table=table,
                    elarion_beat_node=node, result_expires=None, elarion_beat_one_offs_poll=1.0,
                    task_default_queue=f"q-{uuid.uuid4().hex[:8]}")

    @app.task(name="proj.tasks.remind", shared=False)
    def remind(*args: Any) -> None:
        return None

    return app


def _count(store: PostgresClaimStore) -> int:
    return len(store.one_offs(limit=1000))


def _wait(condition: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within 5 s"
        time.sleep(0.02)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)  # type: ignore[misc]


def test_the_listener_reconnects_after_its_connection_dies(stores: list[PostgresClaimStore],
                                                           pg_dsn: str) -> None:
    listener = stores[0].one_off_wakeups()
    assert listener is not None
    now = [0.0]
    listener._monotonic = lambda: now[0]  # type: ignore[attr-defined]
    try:
        assert listener.poll() is True
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            pid = listener._conn.info.backend_pid  # type: ignore[attr-defined]
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        _wait(lambda: listener.poll() is None)  # lost: the runner polls the table meanwhile
        assert listener.poll() is None  # not before the reconnection delay
        now[0] += 6
        assert listener.poll() is True  # back, and it may have missed some
        assert listener.connects == 2  # type: ignore[attr-defined]
        stores[0].add_one_off(_new())
        _wait(lambda: listener.poll())
    finally:
        listener.close()


def _new() -> Any:
    from celery_elarion_beat.store.one_off_records import NewOneOff

    return NewOneOff(id=str(uuid.uuid4()), task="proj.tasks.remind",
                     content_type="application/json", content_encoding="utf-8",
                     body=b"[[], {}]", options={}, delay=60.0)


def test_behind_pgbouncer_beat_polls_instead_of_listening(pg_dsn: str, table_name: str) -> None:
    store = PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name,
        "elarion_beat_pgbouncer": True}))
    try:
        assert store.one_off_wakeups() is None  # a LISTEN would not outlive the transaction
        store.ensure_schema()
        row = store.add_one_off(_new())
        assert store.next_one_off_due() == row.due
    finally:
        store.close()

"""Connections are given back, on the real PostgreSQL server, even by a caller who forgets.

* a store dropped without ``close()`` closes its pool's connections when collected
  (not left to psycopg's ``__del__``, which warns, in whatever code runs then);
* a LISTEN connection whose ``LISTEN`` fails right after connecting is closed at once.
"""

from __future__ import annotations

import gc
import time
import uuid
import warnings
from typing import Any

import psycopg
from celery import Celery

from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.store.pg_one_offs import PgOneOffListener
from celery_elarion_beat.store.registry import open_store


def backends(pg_dsn: str, application_name: str) -> int:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                           "AND datname = current_database()", (application_name,)).fetchone()
    return int(row[0]) if row else 0


def test_a_store_dropped_without_close_closes_its_connections(pg_dsn: str,
                                                              table_name: str) -> None:
    node = f"dropped-{uuid.uuid4().hex[:8]}"
    app = Celery("released", set_as_current=False)
    app.conf.update(elarion_beat_dsn=pg_dsn, elarion_beat_table=table_name,
                    elarion_beat_node=node)
    store = open_store(Settings.from_app(app))
    store.ensure_schema()
    store.nodes()  # a pooled connection is open now
    name = f"celery-elarion-beat {node}"
    assert backends(pg_dsn, name) >= 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        del store
        gc.collect()
    leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaked == []
    deadline = time.monotonic() + 10
    while backends(pg_dsn, name) and time.monotonic() < deadline:
        time.sleep(0.05)  # the server notices the Terminate message at once, or nearly
    assert backends(pg_dsn, name) == 0
    app.close()


def test_a_listen_that_fails_after_connecting_closes_the_new_connection(pg_dsn: str) -> None:
    made: list[psycopg.Connection[Any]] = []

    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(pg_dsn)  # not autocommit: the failed statement below
        try:
            conn.execute("SELECT 1 / 0")  # leaves the transaction failed: LISTEN fails
        except psycopg.errors.DivisionByZero:
            pass
        made.append(conn)
        return conn

    listener = PgOneOffListener(connect, "elarion_released_test")
    assert listener.poll() is None  # not connected: the caller polls the table itself
    assert len(made) == 1 and made[0].closed
    assert not listener.listening

"""Live schedules on the real PostgreSQL: the NOTIFY of a committed change reaches the
store's one LISTEN connection (shared with the one-offs), a rolled-back one wakes
nobody, a raw SQL edit notifies too, and behind PgBouncer there is no listener (the
nodes poll the version)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import create_engine, text

from celery_elarion_beat import Settings
from celery_elarion_beat.config.live_entries import EntryDefinition
from celery_elarion_beat.store.entry_records import EntryChange
from celery_elarion_beat.store.postgres import PostgresClaimStore


def _store(pg_dsn: str, table: str, **extra: Any) -> PostgresClaimStore:
    store = PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table,
        "elarion_beat_db_entries": True, **extra}))
    store.ensure_schema()
    return store


def _wait(condition: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s"
        time.sleep(0.02)


def _add(name: str) -> EntryChange:
    return EntryChange("add", name, EntryDefinition.of("proj.tasks.x", {"every": 60}))


def test_a_committed_change_notifies_the_shared_listener(pg_dsn: str, table_name: str) -> None:
    writer, node = _store(pg_dsn, table_name), _store(pg_dsn, table_name)
    engine = create_engine(writer.engine.url)
    try:
        entries = node.entry_wakeups("proj")
        other = node.entry_wakeups("other-app")
        one_offs = node.one_off_wakeups()
        assert entries is not None and other is not None and one_offs is not None
        assert entries.poll() is True  # connected: it may have missed anything
        assert entries.fileno() is not None and entries.fileno() == one_offs.fileno()
        assert other.poll() is True and one_offs.poll() is True
        assert entries.poll() is False
        with engine.connect() as conn:
            trans = conn.begin()
            writer.write_entries("proj", [_add("a")], "t", connection=conn)
            trans.rollback()
        time.sleep(0.3)
        assert entries.poll() is False  # a rolled-back change wakes nobody
        writer.write_entries("proj", [_add("a")], "t")
        _wait(lambda: entries.poll())
        assert other.poll() is False  # another app's entries: not told
        assert one_offs.poll() is False  # the one-offs' channel heard nothing
        with engine.begin() as conn:  # a raw SQL edit notifies too (the trigger)
            conn.execute(text(f"UPDATE {writer._quoted(writer.entries)} SET task = 'y'"))
        _wait(lambda: entries.poll())
    finally:
        engine.dispose()
        writer.close()
        node.close()


def test_behind_pgbouncer_nothing_listens(pg_dsn: str, table_name: str) -> None:
    store = _store(pg_dsn, table_name, elarion_beat_pgbouncer=True)
    try:
        assert store.entry_wakeups("proj") is None
        store.write_entries("proj", [_add("a")], "t")
        assert store.entries_version("proj") == 1
    finally:
        store.close()

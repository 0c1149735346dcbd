"""Pause and jitter through the real PostgreSQL claim statement: three in-process
schedulers on one fake clock, each with its own connection pool on one table."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from celery_elarion_beat import ClaimStore, Settings
from celery_elarion_beat.store.postgres import PostgresClaimStore
from tests.helpers.fakes import FakeClock
from tests.unit.test_live_control import jittered_cluster, paused_cluster

pytestmark = pytest.mark.postgres


def _stores(pg_dsn: str, table: str):
    def make() -> ClaimStore:
        store = PostgresClaimStore(Settings.from_mapping({
            "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table}))
        store.ensure_schema()
        return store
    return make


def test_a_pause_is_honoured_inside_the_postgres_claim(
        pg_dsn: str, table_name: str, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc))
    paused_cluster(clock, _stores(pg_dsn, table_name), caplog)


def test_jittered_slots_are_claimed_once_on_postgres(pg_dsn: str, table_name: str) -> None:
    clock = FakeClock(datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc))
    jittered_cluster(clock, _stores(pg_dsn, table_name))

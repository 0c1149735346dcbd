"""Fixtures of the operations tests: the ops app pointed at a fresh table, a store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_elarion_beat.store.postgres import PostgresClaimStore
from tests.operate import proj_ops
from tests.operate.support import settings_for


@pytest.fixture
def ops_env(pg_dsn: str, table_name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {"ELARION_OPS_DSN": pg_dsn, "ELARION_OPS_TABLE": table_name}
    # undone after the test: the next one (in any order, on any worker) starts clean
    monkeypatch.setitem(proj_ops.app.conf, "elarion_beat_dsn", pg_dsn)
    monkeypatch.setitem(proj_ops.app.conf, "elarion_beat_table", table_name)
    return env


@pytest.fixture
def store(pg_dsn: str, table_name: str) -> Iterator[PostgresClaimStore]:
    s = PostgresClaimStore(settings_for(pg_dsn, table_name))
    s.ensure_schema()
    yield s
    s.close()

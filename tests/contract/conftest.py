"""The contract suite's fixture: one factory of stores per backend (memory,
PostgreSQL with each claims-table layout, SQLite, MariaDB: the real servers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from celery_elarion_beat import ClaimRequest, ClaimStore, MemoryClaimStore, Settings, open_store
from celery_elarion_beat.config.settings import DEFAULT_CLUSTER
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.testing._harness import claims_tables
from tests.conftest import drop_mysql_tables

SLOT = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)


def _pg_store(pg_dsn: str, table: str, node: str = "node-a") -> PostgresClaimStore:
    settings = Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table, "elarion_beat_node": node,
    })
    return PostgresClaimStore(settings)


BACKENDS = [pytest.param(name, marks=getattr(pytest.mark, name))
            for name in ("memory", "postgres", "sqlite", "mysql")]
#: PostgreSQL with elarion_beat_claims_layout = "partitioned" (day partitions)
BACKENDS.insert(2, pytest.param("postgres-partitioned", marks=pytest.mark.postgres))


@pytest.fixture(params=BACKENDS)
def make_store(request: pytest.FixtureRequest, tmp_path) -> Iterator:
    """A factory of stores that share one claims namespace (one table):
    ``make_store()``, or ``make_store("svc_b")`` for a store of another cluster
    (``elarion_beat_cluster``) on the same table.

    Select backends with marks: ``pytest tests/contract -m postgres``. A test that
    leaves a pooled connection checked out fails."""
    made: list[ClaimStore] = []
    table = f"claims_{uuid.uuid4().hex[:12]}"
    extra: dict[str, str] = {}
    if request.param == "memory":
        name = f"contract-{uuid.uuid4().hex}"

        def factory(cluster: str = DEFAULT_CLUSTER) -> ClaimStore:
            store = MemoryClaimStore(name, cluster=cluster)
            made.append(store)
            return store
    else:
        if request.param.startswith("postgres"):
            dsn = request.getfixturevalue("pg_dsn")
            table = request.getfixturevalue("table_name")
            if request.param == "postgres-partitioned":
                extra["elarion_beat_claims_layout"] = "partitioned"
        elif request.param == "mysql":
            dsn = request.getfixturevalue("mysql_dsn")
        else:
            dsn = f"sqlite:///{tmp_path / 'claims.db'}"

        def factory(cluster: str = DEFAULT_CLUSTER) -> ClaimStore:
            store = open_store(Settings.from_mapping({
                "elarion_beat_dsn": dsn, "elarion_beat_table": table,
                "elarion_beat_cluster": cluster, **extra}))
            store.ensure_schema()
            made.append(store)
            return store
    yield factory
    leaked = [store.describe() for store in made
              if getattr(getattr(store, "engine", None), "pool", None) is not None
              and store.engine.pool.checkedout()]  # type: ignore[attr-defined]
    for store in made:
        store.close()
    assert not leaked, f"connections still checked out after the test: {leaked}"
    if request.param == "mysql":
        drop_mysql_tables(dsn, *claims_tables(table))


def slot_request(job: str = "report", slot: datetime = SLOT, task_id: str | None = None):
    return ClaimRequest.for_slot(job, slot, task_id or str(uuid.uuid4()))


def window_request(job: str = "poll", seconds: float = 1.0):
    return ClaimRequest.for_window(job, timedelta(seconds=seconds), str(uuid.uuid4()))



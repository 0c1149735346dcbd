"""Hardening on the real MariaDB server: window locks never leak, old tables upgrade."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy

from celery_elarion_beat import ClaimRequest, Settings, StoreUnavailable
from celery_elarion_beat.config.dsn import normalize_dsn
from celery_elarion_beat.store.mysql import MysqlClaimStore
from celery_elarion_beat.testing._harness import claims_tables
from tests.conftest import drop_mysql_tables
from tests.helpers.crossing import cross_claims


@pytest.fixture
def mysql_table(mysql_dsn: str) -> Iterator[str]:
    name = f"claims_{uuid.uuid4().hex[:12]}"
    yield name
    drop_mysql_tables(mysql_dsn, *claims_tables(name))


def make_store(dsn: str, table: str, **extra: object) -> MysqlClaimStore:
    store = MysqlClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": dsn, "elarion_beat_table": table,
        "elarion_beat_claim_timeout": 1, **extra}))
    store.ensure_schema()
    return store


def window(job: str) -> ClaimRequest:
    return ClaimRequest.for_window(job, timedelta(seconds=60), str(uuid.uuid4()))


def test_a_window_lock_that_times_out_releases_the_ones_already_taken(
        mysql_dsn: str, mysql_table: str) -> None:
    store = make_store(mysql_dsn, mysql_table)
    engine = sqlalchemy.create_engine(normalize_dsn(mysql_dsn))
    try:
        store.ensure_schema()  # a table of today's keys: the cluster's locks only
        names = store._lock_names(["alpha", "beta"])
        held_name = names[1]  # the second lock in the order the claim takes them
        with engine.connect() as holder, engine.connect() as watcher:
            assert holder.exec_driver_sql("SELECT GET_LOCK(%s, 0)", (held_name,)).scalar() == 1
            with pytest.raises(StoreUnavailable, match="elarion_beat_claim_timeout"):
                store.claim("node-a", [window("alpha"), window("beta")])
            free = watcher.exec_driver_sql("SELECT IS_FREE_LOCK(%s)", (names[0],)).scalar()
            assert free == 1, "the first window lock is still held by the pooled session"
            holder.exec_driver_sql("SELECT RELEASE_LOCK(%s)", (held_name,))
        # and another node can claim both windows at once, without waiting
        other = make_store(mysql_dsn, mysql_table, elarion_beat_node="node-b")
        try:
            assert [r.won for r in other.claim("node-b", [window("alpha"), window("beta")])] \
                == [True, True]
        finally:
            other.close()
    finally:
        engine.dispose()
        store.close()


def test_a_table_of_0_1_gets_byte_exact_keys(mysql_dsn: str, mysql_table: str) -> None:
    engine = sqlalchemy.create_engine(normalize_dsn(mysql_dsn))
    with engine.begin() as conn:  # the 0.1 layout: VARCHAR(191) in the server's collation
        conn.exec_driver_sql(
            f"CREATE TABLE `{mysql_table}` (job_name VARCHAR(191) NOT NULL, "
            "occurrence_utc DATETIME(6) NOT NULL, node TEXT NOT NULL, task_id TEXT NOT NULL, "
            "kind VARCHAR(16) NOT NULL, claimed_at DATETIME(6) NOT NULL, "
            "PRIMARY KEY (job_name, occurrence_utc))")
        conn.exec_driver_sql(
            f"CREATE TABLE `{mysql_table}_nodes` (node VARCHAR(191) NOT NULL PRIMARY KEY, "
            "boot_id VARCHAR(36) NOT NULL, started_at DATETIME(6) NOT NULL, "
            "last_seen DATETIME(6) NOT NULL, version VARCHAR(64) NOT NULL, "
            "fingerprint VARCHAR(64) NOT NULL, entries TEXT NOT NULL, counts TEXT NOT NULL, "
            "host TEXT NOT NULL, pid INTEGER NOT NULL)")
    engine.dispose()
    store = make_store(mysql_dsn, mysql_table)
    try:
        slot = datetime(2026, 1, 1, tzinfo=timezone.utc)
        names = ["report", "Report", "cafe", "caf\u00e9"]
        results = store.claim("node-a", [ClaimRequest.for_slot(n, slot, n) for n in names])
        assert [r.won for r in results] == [True] * 4
    finally:
        store.close()


def test_publish_marks_riding_along_never_deadlock_two_nodes(mysql_dsn: str,
                                                             mysql_table: str) -> None:
    """Claims that cross (:func:`cross_claims`): on MariaDB an ``INSERT IGNORE`` that
    meets a row holds a shared lock on it, so the marks (an UPDATE of the node's own
    rows) must not share the claim's transaction, or two nodes deadlock and one claim
    fails (a skip, fail closed)."""
    a, c = make_store(mysql_dsn, mysql_table), make_store(mysql_dsn, mysql_table)
    try:
        errors = cross_claims(a, c)
        assert errors == []
        rows = a.find_claims(limit=1000)
        assert len(rows) == 24 and {r.state for r in rows} == {"published"}
    finally:
        a.close()
        c.close()

"""Orphans on the real PostgreSQL server: each is reported once by the cluster.

Every node looks for orphans after each heartbeat. Each used to report every orphan
once per node and again after each restart (48 orphans made 497 WARNING lines in one
soak run); now the node that marks the orphan reported in the claims table reports
it, and no other node, restarted or not, reports it again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from sqlalchemy.engine import make_url

from celery_elarion_beat import ClaimRequest, Settings
from celery_elarion_beat.beat.orphans import OrphanWatch
from celery_elarion_beat.schedules.clock import utcnow
from celery_elarion_beat.store.postgres import PostgresClaimStore

LOGGER = "celery_elarion_beat.beat.orphans"


@pytest.fixture
def stores(pg_dsn: str, table_name: str) -> Iterator[list[PostgresClaimStore]]:
    made = [PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name,
        "elarion_beat_node": node, "elarion_beat_publish_timeout": 0.5}))
        for node in ("node-a", "node-b", "node-a")]  # the third: node-a restarted
    made[0].ensure_schema()
    yield made
    for store in made:
        store.close()


def reported(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == LOGGER and getattr(r, "action", None) == "orphaned"]


def test_two_nodes_and_a_restarted_one_report_an_orphan_once_in_all(
        stores: list[PostgresClaimStore], caplog: pytest.LogCaptureFixture) -> None:
    slot = utcnow().replace(microsecond=0)
    (won,) = stores[0].claim("node-dead", [ClaimRequest.for_slot("report", slot, "t-1")])
    assert won.won  # and never published: its node died
    watches = [OrphanWatch(store.settings, store) for store in stores]
    deadline = time.monotonic() + 30
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        while not reported(caplog):  # orphaned publish_timeout after its claim
            assert time.monotonic() < deadline, "the orphan was never reported"
            for watch in watches:
                assert watch.check({}) == []  # a job no node has: reported, not taken
            time.sleep(0.05)
        for _ in range(3):  # every node looks again, after each of its heartbeats
            for watch in watches:
                watch.check({})
    lines = [r.getMessage() for r in reported(caplog)]
    assert len(lines) == 1, f"{len(lines)} reports of one orphan: {lines}"
    assert "report at" in lines[0] and "node-dead" in lines[0]
    (row,) = stores[1].find_claims(job="report")
    assert row.orphan_reported and row.state == "pending"


def test_a_role_that_may_not_mark_orphans_still_takes_them_over_and_reports_them(
        pg_dsn: str, table_name: str, stores: list[PostgresClaimStore],
        caplog: pytest.LogCaptureFixture) -> None:
    """A beat role with the grants of before ``orphan_reported_at``: the node says so
    once, reports each orphan once per start (as before), and still takes over."""
    role = f"elarion_nomark_{uuid.uuid4().hex[:8]}"
    admin(pg_dsn, f"CREATE ROLE {role} LOGIN PASSWORD 'x'",
          f"GRANT SELECT, INSERT, DELETE ON {table_name} TO {role}",
          f"GRANT UPDATE (state, published_at, publish_error, node, claim_token, claimed_at, "
          f"takeovers) ON {table_name} TO {role}")
    store = PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": str(make_url(pg_dsn).set(username=role, password="x")
                                .render_as_string(hide_password=False)),
        "elarion_beat_table": table_name, "elarion_beat_node": "node-old",
        "elarion_beat_create_table": False, "elarion_beat_publish_timeout": 0.5}))
    try:
        slot = utcnow().replace(microsecond=0)
        stores[0].claim("node-dead", [ClaimRequest.for_slot("report", slot, "t-1"),
                                      ClaimRequest.for_slot("resend", slot, "t-2")])
        entries = {"resend": ScheduleEntry(name="resend", task="t", app=Celery(
            set_as_current=False), options={"delivery": "at_least_once"})}
        watch = OrphanWatch(store.settings, store)
        deadline = time.monotonic() + 30
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            taken = []
            while not taken:
                assert time.monotonic() < deadline, "the orphan was never taken over"
                taken = watch.check(entries)
                time.sleep(0.05)
            for _ in range(3):
                watch.check(entries)
        assert [t.row.job for t in taken] == ["resend"] and watch.unmarked
        unmarked = [r for r in caplog.records if getattr(r, "action", None) == "orphans-unmarked"]
        assert len(unmarked) == 1 and "UPDATE (orphan_reported_at)" in unmarked[0].getMessage()
        assert [r.job for r in reported(caplog)] == ["report"]
    finally:
        store.close()
        admin(pg_dsn, f"DROP OWNED BY {role}", f"DROP ROLE {role}")


def admin(pg_dsn: str, *statements: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True, connect_timeout=10) as conn:
        for statement in statements:
            conn.execute(statement)

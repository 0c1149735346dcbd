"""Hardening on the real PostgreSQL server: paths where the promise broke in 0.1.

* two beats under one node name after every pooled connection was killed;
* one bad job name in a batch (too long, NUL) must skip itself only;
* the purge keeps each job's newest claim;
* heartbeats expire dead nodes and read only live ones;
* a 0.1 claims table (no claim_token) is brought up to date, or refused clearly.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from celery.schedules import crontab
from sqlalchemy.engine import make_url

from celery_elarion_beat import (
    ClaimingScheduler,
    ClaimRequest,
    ConfigurationError,
    Outcome,
    SchemaMissing,
    Settings,
    SkipReason,
)
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.store.records import NodeState
from celery_elarion_beat.testing._harness import read_claims
from tests.helpers.crossing import cross_claims
from tests.helpers.fakes import FakeClock, published
from tests.integration.test_scheduler_postgres import pg_app


def kill_backends(pg_dsn: str, node: str) -> int:
    """Terminate every server connection the beats named *node* hold (a failover)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            (f"celery-elarion-beat {node}",)).fetchall()
    return len(rows)


def test_two_beats_under_one_node_name_send_once_after_connections_die(
        pg_dsn: str, table_name: str) -> None:
    clock = FakeClock(datetime(2026, 11, 29, 2, 59, 59, tzinfo=timezone.utc))
    entries = {"report": {"task": "tasks.report", "schedule": crontab(minute="*", nowfun=clock)}}
    node = f"same-host-{uuid.uuid4().hex[:6]}"  # its connections are killed by this name
    apps = [pg_app(pg_dsn, table_name, node, entries) for _ in range(2)]
    beats = [ClaimingScheduler(app, clock=clock) for app in apps]
    try:
        clock.advance(1.2)  # 03:00:00: the first slot, on warm pools
        for beat in beats:
            beat.tick()
        assert sum(len(published(app)) for app in apps) == 1
        assert kill_backends(pg_dsn, node) >= 2  # both pools hold a dead connection
        clock.advance(60)  # 03:01:00: both claim on a dead connection, then retry
        for beat in beats:
            beat.tick()
        sent = [len(published(app)) for app in apps]
        assert sum(sent) == 1, f"the 03:01 slot was published {sent} times"
        skipped = [b.recorder.total(Outcome.SKIPPED, SkipReason.CLAIMED_ELSEWHERE) for b in beats]
        assert sum(skipped) == 2  # one loser per slot
    finally:
        for beat in beats:
            beat.close()


def test_a_bad_job_name_skips_itself_and_never_its_neighbours(
        pg_dsn: str, table_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """Names are checked at setup; one that gets past (the schedule changed at run
    time) fails only its own claim, as invalid-entry, and the error says why."""
    clock = FakeClock(datetime(2026, 11, 29, 2, 59, 59, tzinfo=timezone.utc))
    good = {f"good-{i}": {"task": "tasks.job", "schedule": crontab(minute="*", nowfun=clock)}
            for i in range(5)}
    app = pg_app(pg_dsn, table_name, "node-a", good)
    beat = ClaimingScheduler(app, clock=clock)
    try:
        bad = "y" * 300  # added at run time, after the setup check
        beat.schedule[bad] = beat.Entry(name=bad, app=app, task="tasks.job",
                                        schedule=crontab(minute="*", nowfun=clock))
        caplog.set_level(logging.INFO, logger="celery_elarion_beat")
        clock.advance(1.2)
        beat.tick()
        assert len(published(app)) == 5
        assert beat.recorder.total(Outcome.SKIPPED, SkipReason.INVALID_ENTRY) == 1
        assert beat.recorder.total(Outcome.SKIPPED, SkipReason.CLAIM_ERROR) == 0
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "191" in errors[0] and "unavailable" not in errors[0]
    finally:
        beat.close()


@pytest.mark.parametrize("bad", ["x" * 300, "nul\x00name", "lone\udc80surrogate"])
def test_the_store_refuses_one_bad_request_and_claims_its_neighbours(
        pg_dsn: str, table_name: str, bad: str) -> None:
    store = PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name}))
    store.ensure_schema()
    try:
        slot = datetime(2026, 1, 1, tzinfo=timezone.utc)
        requests = [ClaimRequest.for_slot(name, slot, str(uuid.uuid4()))
                    for name in ("a", "b", bad, "c", "d")]
        results = store.claim_isolating("node-a", requests)
        assert [r.won for r in results] == [True, True, False, True, True]
        assert results[2].refused and "refused" in results[2].refused
        assert sorted(r.job for r in store.find_claims()) == ["a", "b", "c", "d"]
    finally:
        store.close()


@pytest.mark.parametrize("bad", ["z" * 192, "nul\x00name", "lone\udc80surrogate"])
def test_a_bad_job_name_is_refused_at_setup_naming_the_entry(
        pg_dsn: str, table_name: str, bad: str) -> None:
    entries = {bad: {"task": "tasks.job", "schedule": crontab()}}
    with pytest.raises(ConfigurationError, match="beat_schedule entry"):
        ClaimingScheduler(pg_app(pg_dsn, table_name, "node-a", entries))


def test_the_purge_keeps_each_jobs_newest_claim(pg_dsn: str, table_name: str) -> None:
    store = PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name}))
    store.ensure_schema()
    try:
        base = datetime(2026, 1, 1, tzinfo=timezone.utc)
        store.claim("node-a", [ClaimRequest.for_slot("monthly", base, "m1"),
                               ClaimRequest.for_slot("daily", base, "d1"),
                               ClaimRequest.for_slot("daily", base + timedelta(days=1), "d2")])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'UPDATE "{table_name}" SET claimed_at = now() - interval \'30 days\'')
        assert store.purge(timedelta(days=7), dry_run=True) == 1
        assert store.purge(timedelta(days=7), batch_size=1) == 1
        left = sorted((r.job, r.occurrence) for r in store.find_claims())
        assert left == [("daily", base + timedelta(days=1)), ("monthly", base)]
    finally:
        store.close()


def test_heartbeats_expire_dead_nodes_and_read_only_live_ones(pg_dsn: str,
                                                              table_name: str) -> None:
    store = PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name}))
    store.ensure_schema()
    try:
        for i in range(181):
            store.heartbeat(NodeState(f"pod-{i:03}", "boot", "0", "fp", {"job": "d"}, {}))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'UPDATE "{table_name}_nodes" SET last_seen = now() - '
                         "interval '2 days' WHERE node < 'pod-150'")
            conn.execute(f'UPDATE "{table_name}_nodes" SET last_seen = now() - '
                         "interval '1 hour' WHERE node >= 'pod-150' AND node < 'pod-170'")
        mine = NodeState("pod-180", "boot", "0", "fp", {"job": "d"},
                         {("a|b", "skipped", "claimed-elsewhere"): 3})
        _, seen = store.heartbeat(mine, retention=timedelta(days=1),
                                  live_within=timedelta(minutes=2))
        assert [n.node for n in seen] == [f"pod-{i}" for i in range(170, 181)]
        assert all(n.counts == {} and n.entries == {} for n in seen)  # same fingerprint
        _, everyone = store.nodes()
        assert len(everyone) == 31  # the 150 dead for 2 days are gone
        # counts survive any job name (0.1 joined them with "|")
        assert next(n for n in everyone if n.node == "pod-180").counts == {
            ("a|b", "skipped", "claimed-elsewhere"): 3}
    finally:
        store.close()


def test_a_table_of_0_1_is_upgraded_or_refused_clearly(pg_dsn: str, table_name: str) -> None:
    settings = Settings.from_mapping({"elarion_beat_dsn": pg_dsn,
                                      "elarion_beat_table": table_name})
    store = PostgresClaimStore(settings)
    store.ensure_schema()
    store.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{table_name}" DROP COLUMN claim_token')
    strict = PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name,
        "elarion_beat_create_table": False}))
    with pytest.raises(SchemaMissing, match="ADD COLUMN claim_token"):
        strict.ensure_schema()
    strict.close()
    store = PostgresClaimStore(settings)
    store.ensure_schema()
    try:
        slot = datetime(2026, 1, 1, tzinfo=timezone.utc)
        assert store.claim("node-a", [ClaimRequest.for_slot("job", slot, "t")])[0].won
    finally:
        store.close()


@pytest.fixture
def private_database(pg_dsn: str) -> Iterator[str]:
    """A database of this test's own: its ``pg_stat_database`` counters count only
    what this test does (other tests and other runs share the ``test`` database)."""
    name = f"elarion_dl_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _deadlocks(pg_dsn: str, database: str) -> int:
    """The deadlocks counted in *database*, once no backend of it is left: a backend's
    counters reach ``pg_stat_database`` when it ends."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                (database,)).fetchone()[0]:
            time.sleep(0.05)
        row = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = %s",
                           (database,)).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def test_publish_marks_riding_along_never_deadlock_two_nodes(pg_dsn: str, table_name: str,
                                                             private_database: str) -> None:
    """Claims that cross (:func:`cross_claims`): the mark (an UPDATE of the node's own
    row) and the claim (an INSERT meeting the other's row) must not wait on each other
    in a cycle: PostgreSQL would kill one as a deadlock after deadlock_timeout, and a
    node whose retry deadlocked too skips (fail closed)."""
    dsn = make_url(pg_dsn).set(database=private_database).render_as_string(hide_password=False)

    def store() -> PostgresClaimStore:
        made = PostgresClaimStore(Settings.from_mapping({"elarion_beat_dsn": dsn,
                                                         "elarion_beat_table": table_name}))
        made.ensure_schema()
        return made

    a, c = store(), store()
    try:
        errors = cross_claims(a, c)
        assert errors == []
        rows = read_claims(dsn, table_name)
        assert {r.state for r in rows} == {"published"}, [(r.job, r.state) for r in rows]
    finally:
        a.close()
        c.close()
    assert _deadlocks(pg_dsn, private_database) == 0, "PostgreSQL killed claims as deadlocks"

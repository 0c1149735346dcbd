"""Operations on the real PostgreSQL server: purge, schema, heartbeats, drift, skew,
dead-man reports and the `celery elarion-beat` CLI (click runner and real subprocess)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from celery_elarion_beat import ClaimingScheduler, ClaimRequest, ConfigurationError, SchemaMissing
from celery_elarion_beat.beat.maintenance import Maintenance
from celery_elarion_beat.config.parsers import format_duration
from celery_elarion_beat.observe.outcome import Recorder
from celery_elarion_beat.store.postgres import PostgresClaimStore
from tests.operate import proj_ops
from tests.operate.support import invoke, settings_for

ROOT = Path(__file__).parents[2]


def age_claims(pg_dsn: str, table: str, seconds: float) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{table}" SET claimed_at = claimed_at - make_interval(secs => %s)',
                     (seconds,))


# -- purge -------------------------------------------------------------------


def test_purge_keeps_recent_claims_and_deletes_in_batches(store: PostgresClaimStore,
                                                          pg_dsn: str, table_name: str) -> None:
    slot = datetime(2026, 1, 1, tzinfo=timezone.utc)
    later = slot + timedelta(hours=1)
    store.claim("node-a", [ClaimRequest.for_slot(f"old-{i}", when, f"t{i}-{when:%H}")
                           for i in range(35) for when in (slot, later)])
    age_claims(pg_dsn, table_name, 8 * 86400)
    store.claim("node-a", [ClaimRequest.for_slot("fresh", slot, "tf")])
    assert store.purge(timedelta(days=7), dry_run=True) == 35
    before = store.round_trips
    assert store.purge(timedelta(days=7), batch_size=10) == 35
    # one clock read, then 10 + 10 + 10 + 5: four short transactions
    assert store.round_trips - before == 1 + 4
    # every job keeps its newest claim, however old
    left = store.find_claims(limit=100)
    assert {(r.job, r.occurrence) for r in left} == {
        *((f"old-{i}", later) for i in range(35)), ("fresh", slot)}


def test_three_beats_purge_once_per_interval(pg_dsn: str, table_name: str) -> None:
    stores = [PostgresClaimStore(settings_for(pg_dsn, table_name, f"node-{i}",
                                              elarion_beat_purge_interval=600))
              for i in range(3)]
    for s in stores:
        s.ensure_schema()
    slot = datetime(2026, 1, 1, tzinfo=timezone.utc)
    stores[0].claim("node-0", [ClaimRequest.for_slot("old", slot, "t"),
                               ClaimRequest.for_slot("old", slot + timedelta(hours=1), "t2")])
    age_claims(pg_dsn, table_name, 8 * 86400)
    barrier = threading.Barrier(3)
    results: dict[str, int | None] = {}

    def run(i: int) -> None:
        m = Maintenance(stores[i].settings, stores[i], Recorder(),
                        lambda: datetime.now(timezone.utc), entries=dict)
        barrier.wait()
        results[f"node-{i}"] = m.purge()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    purged = {node: n for node, n in results.items() if n is not None}
    assert len(purged) == 1 and list(purged.values()) == [1], results
    # the same interval again: nobody purges
    again = Maintenance(stores[1].settings, stores[1], Recorder(),
                        lambda: datetime.now(timezone.utc), entries=dict)
    assert again.purge() is None
    for s in stores:
        s.close()


def test_an_interval_as_long_as_the_retention_is_refused(pg_dsn: str, table_name: str) -> None:
    from celery import Celery

    app = Celery("retention", broker="memory://", set_as_current=False)
    app.conf.update(elarion_beat_dsn=pg_dsn, elarion_beat_table=table_name,
                    elarion_beat_claim_retention=3600,
                    beat_schedule={"hourly-sync": {"task": "t", "schedule": timedelta(hours=1)}})
    with pytest.raises(ConfigurationError, match="hourly-sync.*elarion_beat_claim_retention"):
        ClaimingScheduler(app)


# -- schema ------------------------------------------------------------------


def test_with_creation_disabled_a_missing_table_says_how_to_create_it(pg_dsn: str,
                                                                      table_name: str) -> None:
    s = PostgresClaimStore(settings_for(pg_dsn, table_name, elarion_beat_create_table=False))
    with pytest.raises(SchemaMissing) as info:
        s.ensure_schema()
    message = str(info.value)
    assert table_name in message and "init-db" in message and "claims_table" in message
    with psycopg.connect(pg_dsn) as conn:  # and nothing was created
        assert conn.execute("SELECT to_regclass(%s)", (table_name,)).fetchone() == (None,)
    s.create_schema()  # what init-db does
    s.ensure_schema()  # now fine, still without DDL
    s.close()


def test_alembic_style_metadata_declares_both_tables() -> None:
    from sqlalchemy import MetaData

    from celery_elarion_beat import claims_table
    from celery_elarion_beat.store.schema import nodes_table

    metadata = MetaData()
    claims = claims_table(metadata, name="beat_claims", schema="ops")
    nodes = nodes_table(metadata, name="beat_nodes", schema="ops")
    assert set(metadata.tables) == {"ops.beat_claims", "ops.beat_nodes"}
    assert [c.name for c in claims.primary_key] == ["cluster", "job_name", "occurrence_utc"]
    assert [c.name for c in nodes.primary_key] == ["cluster", "node"]


# -- heartbeats, drift, skew -------------------------------------------------


#: maintenance(node, entries, offset=timedelta(0)): a node's maintenance
MakeNode = Callable[..., Maintenance]


@pytest.fixture
def maintenance(pg_dsn: str, table_name: str) -> Iterator[MakeNode]:
    """Make a node's maintenance (its own store on the test's table), closed at the end
    however the test ends (a store left open warns in a later test)."""
    made: list[Maintenance] = []

    def make(node: str, entries: dict, offset: timedelta = timedelta(0)) -> Maintenance:
        s = PostgresClaimStore(settings_for(pg_dsn, table_name, node))
        made.append(Maintenance(s.settings, s, Recorder(),
                                lambda: datetime.now(timezone.utc) + offset,
                                entries=lambda: entries))
        s.ensure_schema()
        return made[-1]

    yield make
    for m in made:
        m.store.close()


def scheduler_entries(beat_schedule: dict) -> dict:
    from celery import Celery

    from celery_elarion_beat.config.entries import schedule_entries

    app = Celery("entries", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = beat_schedule
    return schedule_entries(app)


BASE = {"report": {"task": "t.report", "schedule": timedelta(seconds=30)}}


def test_drift_between_live_nodes_names_the_entries(
        maintenance: MakeNode, caplog: pytest.LogCaptureFixture) -> None:
    a = maintenance("node-a", scheduler_entries(BASE))
    b = maintenance("node-b", scheduler_entries({
        **BASE, "cleanup": {"task": "t.cleanup", "schedule": timedelta(minutes=5)}}))
    caplog.set_level(logging.INFO, logger="celery_elarion_beat")
    a.heartbeat()
    b.heartbeat()
    a.heartbeat()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "schedule drift" in r.getMessage()]
    assert any("node node-a" in w and "cleanup (only here)" in w for w in warnings), warnings
    assert any("node node-b" in w and "cleanup (missing here)" in w for w in warnings), warnings
    assert a.drift == {"node-b": ["cleanup (missing here)"]}


def test_same_schedules_raise_no_drift(maintenance: MakeNode) -> None:
    a = maintenance("node-a", scheduler_entries(BASE))
    b = maintenance("node-b", scheduler_entries(BASE))
    a.heartbeat()
    b.heartbeat()
    assert a.drift == {} and b.drift == {}


def test_skew_beyond_the_threshold_warns(
        maintenance: MakeNode, caplog: pytest.LogCaptureFixture) -> None:
    skewed = maintenance("node-a", {}, offset=timedelta(seconds=30))
    fine = maintenance("node-b", {})
    caplog.set_level(logging.WARNING, logger="celery_elarion_beat")
    skewed.heartbeat()
    fine.heartbeat()
    assert skewed.skew is not None and 29 < skewed.skew < 31
    assert fine.skew is not None and abs(fine.skew) < 2
    messages = [r.getMessage() for r in caplog.records if "clock skew" in r.getMessage()]
    # the measured skew, to the millisecond (a busy machine may make it 29.999)
    assert len(messages) == 1 and f"+{format_duration(skewed.skew, 0.001)} off" in messages[0]
    assert re.search(r"is \+(29\.9\d*|30(\.0\d*)?)s off", messages[0]), messages[0]


# -- status and the CLI ------------------------------------------------------


def test_status_reports_a_missed_slot_and_fails(
        maintenance: MakeNode, ops_env: dict, pg_dsn: str, table_name: str) -> None:
    node = maintenance("node-a", scheduler_entries(
        proj_ops.app.conf.beat_schedule))
    node.heartbeat()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the node has run for an hour
        conn.execute(f'UPDATE "{table_name}_nodes" SET started_at = started_at - interval \'1h\'')
    code, out = invoke("status")
    assert code == 1, out
    assert "MISSED" in out and "report" in out and "UNHEALTHY" in out
    code, out = invoke("status", "--json")
    data = json.loads(out)
    missed = {e["name"] for e in data["entries"] if e["missed"]}
    assert {"report", "tick", "poll"} <= missed


def test_status_is_healthy_when_every_slot_is_claimed(
        maintenance: MakeNode, ops_env: dict) -> None:
    from celery_elarion_beat.schedules.slots import name_occurrence, slot_task_id

    entries = scheduler_entries(proj_ops.app.conf.beat_schedule)
    node = maintenance("node-a", entries)
    node.heartbeat()  # a node that has just started: only the latest slots are due
    now, _ = node.store.nodes()
    # every slot from before the grace to a minute on: healthy however long the
    # status command takes to start on a loaded machine
    requests = {}
    for name in ("report", "tick"):
        for second in range(-90, 60):
            occ = name_occurrence(name, entries[name].schedule,
                                  now + timedelta(seconds=second), tolerance=1)
            if occ.slot is not None:
                requests[(name, occ.slot)] = ClaimRequest.for_slot(
                    name, occ.slot, slot_task_id(name, occ.slot))
    node.store.claim("node-a", [*requests.values(), ClaimRequest.for_window(
        "poll", timedelta(seconds=1), "poll-task")])
    code, out = invoke("status")
    assert code == 0, out
    assert "healthy" in out and "node-a" in out and "alive" in out
    code, out = invoke("claims", "--job", "report", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert {(row["node"], row["task_id"]) for row in rows} == {
        ("node-a", r.task_id) for (job, _), r in requests.items() if job == "report"}


def test_status_fails_on_drift(maintenance: MakeNode, ops_env: dict) -> None:
    a = maintenance("node-a", scheduler_entries(BASE))
    b = maintenance("node-b", scheduler_entries({
        **BASE, "cleanup": {"task": "t.cleanup", "schedule": timedelta(minutes=5)}}))
    c = maintenance("node-c", scheduler_entries(BASE))
    for m in (a, b, c):
        m.heartbeat()
    code, out = invoke("status", "--grace", "1h")
    assert code == 1 and "SCHEDULE DRIFT" in out and "node-b: cleanup" in out, out


def test_claims_filters_and_purge_cli(ops_env: dict, store: PostgresClaimStore, pg_dsn: str,
                                      table_name: str) -> None:
    slot = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)
    store.claim("node-a", [ClaimRequest.for_slot("report", slot, "t1"),
                           ClaimRequest.for_slot("digest", slot, "t2")])
    store.claim("node-b", [ClaimRequest.for_slot("report", slot + timedelta(hours=1), "t3")])
    code, out = invoke("claims", "--node", "node-b")
    assert code == 0 and "t3" in out and "t1" not in out, out
    code, out = invoke("claims", "--since", "2026-11-29T03:30:00Z", "--json")
    assert [json.loads(line)["task_id"] for line in out.splitlines()] == ["t3"]
    code, out = invoke("claims", "--limit", "1")
    assert out.count("node-") == 1
    age_claims(pg_dsn, table_name, 2 * 86400)
    code, out = invoke("purge", "--older-than", "1d", "--dry-run")
    # each job's newest claim is kept: only report's 03:00 claim goes
    assert code == 0 and "would delete 1 claims" in out, out
    assert len(store.find_claims()) == 3
    code, out = invoke("purge", "--older-than", "1d")
    assert "deleted 1 claims" in out
    assert sorted(r.task_id for r in store.find_claims()) == ["t2", "t3"]


def test_cli_as_a_real_celery_subprocess(ops_env: dict, pg_dsn: str, table_name: str) -> None:
    env = {**os.environ, **ops_env, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "tests.operate.proj_ops",
                           "elarion-beat", "init-db"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "ready:" in done.stdout, done.stdout + done.stderr
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "tests.operate.proj_ops",
                           "elarion-beat", "status"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "healthy" in done.stdout, done.stdout + done.stderr
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "tests.operate.proj_ops",
                           "elarion-beat", "--help"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    for command in ("status", "claims", "init-db", "purge"):
        assert command in done.stdout

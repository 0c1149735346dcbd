"""examples/alembic: the migration creates exactly the tables beat declares.

``alembic upgrade head`` runs as a user runs it (the alembic CLI, the example's
alembic.ini, ALEMBIC_DATABASE_URL) against a scratch PostgreSQL schema, a scratch
MariaDB database and a SQLite file. Then Alembic's own autogenerate comparison
of the database with ``claims_table(metadata)`` and ``nodes_table(metadata)``
must find no difference, a store with ``elarion_beat_create_table = False``
accepts the tables and claims in them, and ``downgrade base`` removes them.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Column, MetaData, Table, Text, create_engine, inspect, text
from sqlalchemy.engine import make_url

from celery_elarion_beat import (
    ClaimRequest,
    Settings,
    claims_table,
    foreign_beats_table,
    one_offs_table,
    open_store,
)
from celery_elarion_beat.config.live_entries import EntryDefinition
from celery_elarion_beat.store.entry_records import EntryChange
from celery_elarion_beat.store.foreign_records import ForeignSighting
from celery_elarion_beat.store.one_off_records import NewOneOff
from celery_elarion_beat.store.schema import (
    KeyName,
    Timestamp,
    audit_table,
    entries_table,
    nodes_table,
    pauses_table,
    revisions_table,
    versions_table,
)
from celery_elarion_beat.testing._harness import clean_env

ROOT = Path(__file__).resolve().parents[2]
ALEMBIC_INI = ROOT / "examples" / "alembic" / "alembic.ini"


def alembic(url: str, *args: str, fails: bool = False, cluster: str = "") -> str:
    """``alembic <args>`` as a user runs it; *cluster*: its ELARION_BEAT_CLUSTER (none:
    the migration of the cluster column must do without, or ask for it)."""
    done = subprocess.run([sys.executable, "-m", "alembic", "-c", str(ALEMBIC_INI), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=clean_env({"ALEMBIC_DATABASE_URL": url,
                                         "ELARION_BEAT_CLUSTER": cluster}))
    assert (done.returncode != 0) == fails, done.stdout + done.stderr
    return done.stdout + done.stderr


class Scratch:
    """A database location of this test only: the SQLAlchemy URL, and the beat DSN."""

    def __init__(self, url: str, beat_dsn: str, schema: str | None = None) -> None:
        self.url, self.beat_dsn, self.schema = url, beat_dsn, schema


@pytest.fixture(params=["postgresql", "mariadb", "sqlite"])
def scratch(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scratch]:
    name = f"alembic_{uuid.uuid4().hex[:10]}"
    if request.param == "sqlite":
        path = tmp_path / "claims.db"
        yield Scratch(f"sqlite:///{path}", f"sqlite:///{path}")
        return
    if request.param == "postgresql":
        dsn = request.getfixturevalue("pg_dsn")
        admin = create_engine(make_url(dsn).set(drivername="postgresql+psycopg"),
                              isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        url = make_url(dsn).set(drivername="postgresql+psycopg",
                                query={"options": f"-csearch_path={name}"})
        try:
            yield Scratch(url.render_as_string(hide_password=False), dsn, schema=name)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
            admin.dispose()
        return
    dsn = request.getfixturevalue("mysql_dsn")
    server = make_url(dsn).set(drivername="mysql+pymysql")
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    try:
        yield Scratch(server.set(database=name).render_as_string(hide_password=False),
                      make_url(dsn).set(database=name).render_as_string(hide_password=False))
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE `{name}`"))
        admin.dispose()


def declared() -> MetaData:
    metadata = MetaData()
    claims_table(metadata)
    nodes_table(metadata)
    pauses_table(metadata)
    audit_table(metadata)
    one_offs_table(metadata)
    foreign_beats_table(metadata)
    entries_table(metadata)
    revisions_table(metadata)
    versions_table(metadata)
    return metadata


def test_the_migration_creates_exactly_the_declared_tables(scratch: Scratch) -> None:
    out = alembic(scratch.url, "upgrade", "head")
    assert all(f"{n:04d}_elarion_beat" in out for n in range(1, 11))
    engine = create_engine(scratch.url)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            assert {"elarion_scheduler_claims", "elarion_scheduler_nodes",
                    "elarion_scheduler_pauses", "elarion_scheduler_audit",
                    "elarion_scheduler_oneoffs", "elarion_scheduler_foreign_beats",
                    "elarion_scheduler_entries", "elarion_scheduler_revisions",
                    "elarion_scheduler_versions",
                    "alembic_version"} <= tables
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(context, declared())
            assert diff == [], diff
            pk = inspect(conn).get_pk_constraint("elarion_scheduler_claims")
            assert pk["constrained_columns"] == ["cluster", "job_name", "occurrence_utc"]
    finally:
        engine.dispose()

    # beat, told not to run DDL, accepts the migrated tables and claims in them
    values = {"elarion_beat_dsn": scratch.beat_dsn, "elarion_beat_node": "node-1",
              "elarion_beat_create_table": False, "elarion_beat_db_entries": True}
    if scratch.schema:
        values["elarion_beat_schema"] = scratch.schema
    store = open_store(Settings.from_mapping(values))
    try:
        store.ensure_schema()
        slot = datetime(2026, 11, 29, 3, tzinfo=timezone.utc)
        (won,) = store.claim("node-1", [ClaimRequest.for_slot("nightly-report", slot, "t-1")])
        (lost,) = store.claim("node-2", [ClaimRequest.for_slot("nightly-report", slot, "t-2")])
        assert won.won and not lost.won and lost.winner == "node-1"
        # and pauses in them: the pause is read inside the next claim
        store.pause("nightly-report", "ops (cli)", "migrated")
        later = slot.replace(hour=4)
        (paused,) = store.claim("node-1", [ClaimRequest.for_slot("nightly-report", later, "t-3")])
        assert paused.paused and [a.action for a in store.audit()] == ["pause"]
        # and one-offs
        one = store.add_one_off(NewOneOff(id=str(uuid.uuid4()), task="proj.tasks.remind",
                                          content_type="application/json",
                                          content_encoding="utf-8", body=b"[[], {}]",
                                          options={}, delay=-1.0, key="migrated"))
        leased = store.lease_one_offs("node-1", limit=5, lease=timedelta(seconds=60))
        assert [x.id for x in leased] == [one.id]
        # and the workers' sightings of a beat that claims nothing
        store.record_foreign_beats([ForeignSighting("gen1@old", "proj.tasks.remind", 1)])
        assert [r.origin for r in store.foreign_beats()[1]] == ["gen1@old"]
        # and database entries, their triggers included (a revision, a version)
        wrote = store.write_entries(store.cluster, [EntryChange(
            "add", "live", EntryDefinition.of("proj.tasks.x", {"every": 60}))], "migrated")
        assert wrote.version == 1
        assert store.entry_history(store.cluster, "live")[0].action == "add"
        due = store.clock().replace(microsecond=0) + timedelta(hours=1)  # after its effect
        (live,) = store.claim("node-1", [ClaimRequest.for_slot(
            "live", due, "t-4", revision=1)])
        assert live.won and store.find_claims(job="live")[0].revision == 1
    finally:
        store.close()

    alembic(scratch.url, "downgrade", "base")
    engine = create_engine(scratch.url)
    try:
        with engine.connect() as conn:
            left = set(inspect(conn).get_table_names()) - {"alembic_version"}
        assert not left, left
    finally:
        engine.dispose()


def test_offline_mode_prints_the_ddl_without_a_database() -> None:
    nowhere = "postgresql+psycopg://nobody@127.0.0.1:9/none"
    out = alembic(nowhere, "-x", "cluster=proj", "upgrade", "head", "--sql")
    assert "CREATE TABLE elarion_scheduler_claims" in out
    assert "PRIMARY KEY (job_name, occurrence_utc)" in out
    assert "CREATE INDEX ix_elarion_scheduler_claims_claimed_at" in out
    assert "CREATE TABLE elarion_scheduler_nodes" in out
    assert "ADD COLUMN cluster VARCHAR(64) DEFAULT 'proj' NOT NULL" in out
    assert "PRIMARY KEY (cluster, job_name, occurrence_utc)" in out
    # offline, the migration cannot look whether the tables hold rows: it asks
    refused = alembic(nowhere, "upgrade", "head", "--sql", fails=True)
    assert "-x cluster=proj" in refused


def test_the_cluster_migrations_upgrade_tables_of_0_2_in_two_steps(scratch: Scratch) -> None:
    """0007 adds the column (nodes of 0.2 claim on with their key), 0008 swaps the keys;
    the rows of 0.2 are the cluster's that -x cluster= names."""
    alembic(scratch.url, "upgrade", "0006_elarion_beat")
    slot = datetime(2026, 11, 29, 3, tzinfo=timezone.utc)
    engine = create_engine(scratch.url)
    claims = "elarion_scheduler_claims"
    # a claim as 0.2 writes it (its key types; naive UTC where the store writes so)
    old = Table(claims, MetaData(), Column("job_name", KeyName()),
                Column("occurrence_utc", Timestamp), Column("node", Text),
                Column("task_id", Text), Column("kind", Text), Column("claimed_at", Timestamp))
    at = slot if scratch.url.startswith("postgresql") else slot.replace(tzinfo=None)

    def insert(conn: Any, hour: int, task: str) -> None:
        conn.execute(old.insert().values(job_name="nightly", occurrence_utc=at.replace(hour=hour),
                                         node="old-node", task_id=task, kind="slot",
                                         claimed_at=at))

    try:
        with engine.begin() as conn:
            insert(conn, 3, "t-0")
        # rows there, and no cluster named: 0007 says what to run
        refused = alembic(scratch.url, "upgrade", "head", fails=True)
        assert "-x cluster=proj" in refused
        alembic(scratch.url, "-x", "cluster=svc_a", "upgrade", "0007_elarion_beat")
        with engine.begin() as conn:  # a node of 0.2 still claims: its row takes svc_a
            insert(conn, 4, "t-1")
        alembic(scratch.url, "upgrade", "head")
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, declared()) == []
            rows = conn.execute(text(f"SELECT cluster, task_id FROM {claims} ORDER BY task_id"))
            assert [(bytes(c).decode() if isinstance(c, bytes) else c, t) for c, t in rows] == [
                ("svc_a", "t-0"), ("svc_a", "t-1")]
    finally:
        engine.dispose()
    values = {"elarion_beat_dsn": scratch.beat_dsn, "elarion_beat_create_table": False,
              "elarion_beat_cluster": "svc_a"}
    if scratch.schema:
        values["elarion_beat_schema"] = scratch.schema
    a = open_store(Settings.from_mapping(values))
    b = open_store(Settings.from_mapping({**values, "elarion_beat_cluster": "svc_b"}))
    try:
        (lost,) = a.claim("node-1", [ClaimRequest.for_slot("nightly", slot, "t-2")])
        assert not lost.won and lost.winner == "old-node"
        (won,) = b.claim("node-1", [ClaimRequest.for_slot("nightly", slot, "t-3")])
        assert won.won  # another app: a key of its own
        assert a.census(timedelta(minutes=1)).legacy == ()
    finally:
        a.close()
        b.close()

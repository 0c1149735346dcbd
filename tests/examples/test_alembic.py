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

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import MetaData, create_engine, inspect, text
from sqlalchemy.engine import make_url

from celery_elarion_beat import ClaimRequest, Settings, claims_table, one_offs_table, open_store
from celery_elarion_beat.store.oneoff_rows import NewOneOff
from celery_elarion_beat.store.schema import audit_table, nodes_table, pauses_table
from celery_elarion_beat.testing import clean_env

ROOT = Path(__file__).resolve().parents[2]
ALEMBIC_INI = ROOT / "examples" / "alembic" / "alembic.ini"


def alembic(url: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "alembic", "-c", str(ALEMBIC_INI), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=clean_env({"ALEMBIC_DATABASE_URL": url}))
    assert done.returncode == 0, done.stdout + done.stderr
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
    return metadata


def test_the_migration_creates_exactly_the_declared_tables(scratch: Scratch) -> None:
    out = alembic(scratch.url, "upgrade", "head")
    assert all(f"000{n}_elarion_beat" in out for n in (1, 2, 3, 4, 5, 6))
    engine = create_engine(scratch.url)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            assert {"elarion_scheduler_claims", "elarion_scheduler_nodes",
                    "elarion_scheduler_pauses", "elarion_scheduler_audit",
                    "elarion_scheduler_oneoffs", "alembic_version"} <= tables
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(context, declared())
            assert diff == [], diff
            pk = inspect(conn).get_pk_constraint("elarion_scheduler_claims")
            assert pk["constrained_columns"] == ["job_name", "occurrence_utc"]
    finally:
        engine.dispose()

    # beat, told not to run DDL, accepts the migrated tables and claims in them
    values = {"elarion_beat_dsn": scratch.beat_dsn, "elarion_beat_node": "node-1",
              "elarion_beat_create_table": False}
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
    out = alembic("postgresql+psycopg://nobody@127.0.0.1:9/none", "upgrade", "head", "--sql")
    assert "CREATE TABLE elarion_scheduler_claims" in out
    assert "PRIMARY KEY (job_name, occurrence_utc)" in out
    assert "CREATE INDEX ix_elarion_scheduler_claims_claimed_at" in out
    assert "CREATE TABLE elarion_scheduler_nodes" in out

"""docs/howto/database-role.md: the least-privilege grants are enough, and no more.

The page's SQL blocks run as written, with role names of this test only
(``elarion_beat`` -> ``elarion_beat_<hex>``, ``elarion_worker`` ->
``elarion_worker_<hex>``, ``elarion_operator`` -> ``elarion_operator_<hex>``) and,
on PostgreSQL, a scratch schema in place of ``public``. Then a claim store runs as
the beat role with ``elarion_beat_create_table = False`` and does everything beat
and the CLI do: claim exact slots and windows, heartbeat, read nodes and the
ledger, purge. A store as the workers' role records runs (``record_runs``: a
claimed run started and finished, an every-node run's own row) and beat's
``overlap: skip`` claim reads them. A store as the operators' role pauses,
triggers (a manual claim and its publish report), resumes, lists the pauses and
the audit and builds ``status``, while beat's role claims the paused job's slots
and reads the pauses of every-node jobs. Every role is refused DDL; the workers'
and the operators' roles are also refused deleting claims and rewriting a
claim's holder, and the workers' touching the nodes table. The one-offs
(:mod:`tests.docs.one_off_roles`): the workers' role schedules (a key twice, the
outbox), cancels and reads; the beat role hears the NOTIFY, leases, publishes,
fails, releases, takes over and purges; the operators' role lists and cancels. The
workers' and operators' roles are refused deleting one-offs or changing what one is
or who leases it; the beat role is refused inserting one or changing what one is.
"""

from __future__ import annotations

import logging
import re
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab
from sqlalchemy import create_engine, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine, make_url

from celery_elarion_beat import (
    ClaimRequest,
    PublishReport,
    Settings,
    StoreError,
    StoreRefused,
    open_store,
)
from celery_elarion_beat.beat.purge import purge_one_offs
from celery_elarion_beat.config.overlap import OverlapRule
from celery_elarion_beat.one_offs.runner import OneOffRunner
from celery_elarion_beat.operate.status import build_status
from celery_elarion_beat.store.foreign_records import ForeignSighting
from celery_elarion_beat.store.records import NodeState, RunReport
from celery_elarion_beat.store.states import (
    EVERY_NODE_KIND,
    FAILED,
    MANUAL_KIND,
    PAUSED,
    PUBLISHED,
    SKIPPED,
    SUCCEEDED,
)
from celery_elarion_beat.testing._harness import claims_tables, drop_tables
from tests.docs.one_off_roles import exercise_one_offs

PAGE = Path(__file__).resolve().parents[2] / "docs" / "howto" / "database-role.md"


def sql_blocks(section: str) -> list[str]:
    """The statements of the ```sql blocks under the page's ``## section`` heading."""
    text_ = PAGE.read_text()
    body = text_.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    statements = []
    for block in re.findall(r"```sql\n(.*?)```", body, re.S):
        statements += [s.strip() for s in block.split(";") if s.strip()]
    assert statements, f"no SQL under ## {section}"
    return statements


def worker_role(role: str) -> str:
    """The workers' role that goes with the beat role *role* of a test."""
    return role.replace("elarion_beat", "elarion_worker", 1)


def operator_role(role: str) -> str:
    """The operators' role that goes with the beat role *role* of a test."""
    return role.replace("elarion_beat", "elarion_operator", 1)


def rename(statement: str, role: str, schema: str | None = None) -> str:
    statement = re.sub(r"\belarion_beat\b", role, statement)
    statement = re.sub(r"\belarion_worker\b", worker_role(role), statement)
    statement = re.sub(r"\belarion_operator\b", operator_role(role), statement)
    if schema:
        statement = re.sub(r"\bpublic\b", schema, statement)
    return statement


def exercise(settings: dict[str, Any]) -> None:
    """Everything beat and the CLI do with the store, as the least-privilege role."""
    store = open_store(Settings.from_mapping({**settings, "elarion_beat_create_table": False}))
    try:
        store.ensure_schema()
        slot = datetime(2026, 11, 29, 3, tzinfo=timezone.utc)
        (won,) = store.claim("node-1", [ClaimRequest.for_slot("report", slot, "t-1")])
        (lost,) = store.claim("node-2", [ClaimRequest.for_slot("report", slot, "t-2")])
        assert won.won and not lost.won and lost.winner == "node-1"
        window = timedelta(minutes=5)
        (w1,) = store.claim("node-1", [ClaimRequest.for_window("poll", window, "w-1")])
        (w2,) = store.claim("node-2", [ClaimRequest.for_window("poll", window, "w-2")])
        assert w1.won and not w2.won
        earlier = slot - timedelta(hours=1)
        assert store.claim("node-1", [ClaimRequest.for_slot("report", earlier, "t-0")])[0].won
        # the publish is reported; an unpublished claim is taken over
        store.report([PublishReport("report", slot, won.token or "")])
        _, pending = store.unpublished(timedelta(days=1))
        assert {row.job for row in pending} == {"poll", "report"}  # the window, 03:00 less 1 h
        (taken, *_) = store.take_over("node-2", pending, older_than=timedelta(0))
        assert taken.row.node == "node-2" and taken.row.takeovers == 1
        # an orphan reported: marked once for the cluster
        _, pending = store.unpublished(timedelta(days=1))
        assert len(store.mark_orphans_reported(pending)) == len(pending) == 2
        assert store.mark_orphans_reported(pending) == []
        for _ in range(2):  # insert, then update; expiring dead nodes deletes
            now, nodes = store.heartbeat(NodeState(
                node="node-1", boot_id=str(uuid.uuid4()), version="0", fingerprint="f" * 16,
                entries={"report": "x"}, counts={("report", "dispatched", ""): 1}, host="h",
                pid=1), retention=timedelta(days=1), live_within=timedelta(minutes=2))
        assert [n.node for n in nodes] == ["node-1"]
        assert store.nodes()[1][0].counts == {("report", "dispatched", ""): 1}
        assert abs((store.clock() - now).total_seconds()) < 60
        assert {c.job for c in store.find_claims()} == {"report", "poll"}
        assert set(store.latest_claims()) == {"report", "poll"}
        assert store.existing([("report", slot)]) == {("report", slot)}
        assert store.job_ledger({"report": (earlier, slot)})["report"].claimed == {earlier, slot}
        assert store.purge(timedelta(0), dry_run=True) == 1  # each job's newest is kept
        assert store.purge(timedelta(0)) == 1
    finally:
        store.close()


def exercise_runs(beat: dict[str, Any], worker: dict[str, Any]) -> None:
    """What the workers do with the store (``install_worker``), as the workers' role,
    and beat's ``overlap: skip`` claim reading what they recorded, as the beat role."""
    beat_store = open_store(Settings.from_mapping({**beat, "elarion_beat_create_table": False}))
    store = open_store(Settings.from_mapping({**worker, "elarion_beat_create_table": False}))
    try:
        skip = OverlapRule(timeout=timedelta(hours=1), pending=timedelta(seconds=30))
        slot = datetime(2026, 11, 29, 4, tzinfo=timezone.utc)
        (won,) = beat_store.claim("node-1", [ClaimRequest.for_slot("export", slot, "r-1")])
        assert won.won
        # the worker's start comes before beat's publish report: it marks the claim published
        store.record_runs([RunReport("export", slot, "r-1", RunReport.STARTED, "celery@w1")])
        later = slot + timedelta(seconds=1)
        (held,) = beat_store.claim("node-1", [ClaimRequest.for_slot("export", later, "r-2",
                                                                    overlap=skip)])
        assert not held.won and held.still_running
        store.record_runs([RunReport("export", slot, "r-1", SUCCEEDED, "celery@w1",
                                     runtime=3.0)])
        (free,) = beat_store.claim("node-1", [ClaimRequest.for_slot(
            "export", later + timedelta(seconds=1), "r-3", overlap=skip)])
        assert free.won
        # an every-node run: a row of its own, inserted by the worker
        start = datetime.now(timezone.utc).replace(microsecond=0)
        store.record_runs([RunReport("cache", start, "n-1", RunReport.STARTED, "celery@w1",
                                     node="node-1", every_node=True)])
        store.record_runs([RunReport("cache", start, "n-1", SUCCEEDED, "celery@w1",
                                     runtime=0.5, node="node-1", every_node=True)])
        (run,) = [r for r in store.find_claims(job="export") if r.occurrence == slot]
        assert (run.state, run.run_state, run.worker, run.runtime) == (
            "published", "succeeded", "celery@w1", 3.0)
        assert run.started_at is not None and run.finished_at is not None
        (node_run,) = store.find_claims(job="cache")
        assert (node_run.kind, node_run.node, node_run.run_state) == (
            EVERY_NODE_KIND, "node-1", "succeeded")
        # a beat that claims nothing: its sender's row, inserted, added to, kept
        sighting = ForeignSighting("gen4242@web-3", "t.report", 2, "report", "celery@w1")
        store.record_foreign_beats([sighting], retention=timedelta(days=7))
        store.record_foreign_beats([sighting], retention=timedelta(days=7))
        (row,) = store.foreign_beats()[1]
        assert (row.origin, row.count) == ("gen4242@web-3", 4)
    finally:
        store.close()
        beat_store.close()


def exercise_control(beat: dict[str, Any], operator: dict[str, Any]) -> None:
    """What the operators do (``elarion-beat pause|resume|trigger|audit|status``, Flower's
    buttons), as the operators' role, and beat's claims of the paused jobs, as the beat
    role: the pause the operators wrote decides them."""
    settings = Settings.from_mapping({**operator, "elarion_beat_create_table": False})
    ops = open_store(settings)
    beat_store = open_store(Settings.from_mapping({**beat, "elarion_beat_create_table": False}))
    actor = "alice@host1 (cli)"
    try:
        until = ops.clock() + timedelta(hours=2)
        ops.pause("report", actor, "db migration", until)
        ops.pause("cache", actor)  # an every-node job, until resumed
        _, pauses = ops.pauses()
        assert {(p.job, p.reason) for p in pauses} == {("report", "db migration"), ("cache", "")}
        # beat, as its role: the paused job's slot and window are stored skipped, paused
        slot = datetime(2026, 11, 29, 5, tzinfo=timezone.utc)
        (held,) = beat_store.claim("node-1", [ClaimRequest.for_slot("report", slot, "s-1")])
        assert not held.won and held.paused and held.pause is not None
        assert held.pause.paused_by == actor
        (other,) = beat_store.claim("node-2", [ClaimRequest.for_slot("report", slot, "s-2")])
        assert not other.won and other.paused
        _, every_node = beat_store.pauses(["cache"])  # what beat reads for every-node entries
        assert [p.job for p in every_node] == ["cache"]
        # trigger: a manual claim at the database clock, its publish report, a duplicate
        window = timedelta(seconds=10)
        first = ops.claim_manual("report", "alice@host1", "m-1", actor, window, "resync")
        assert first.row is not None and first.token is not None
        ops.report([PublishReport("report", first.row.occurrence, first.token)])
        again = ops.claim_manual("report", "alice@host1", "m-2", actor, window)
        assert again.row is None and again.duplicate is not None
        assert again.duplicate.task_id == "m-1"
        forced = ops.claim_manual("report", "alice@host1", "m-3", actor, None)
        assert forced.row is not None and forced.token is not None
        ops.report([PublishReport("report", forced.row.occurrence, forced.token,
                                  "OperationalError: broker down")])
        rows = {r.task_id: r for r in ops.find_claims(job="report")}
        assert (rows["m-1"].kind, rows["m-1"].state) == (MANUAL_KIND, PUBLISHED)
        assert (rows["m-3"].state, rows["m-3"].publish_error) == (
            FAILED, "OperationalError: broker down")
        assert (rows["s-1"].state, rows["s-1"].publish_error) == (SKIPPED, PAUSED)
        # status, as the operators' role: nodes, ledger, pauses
        app = Celery("roles", set_as_current=False)
        app.conf.beat_schedule = {"report": {"task": "t.report",
                                             "schedule": crontab(minute=0)}}
        report = build_status(app, settings, ops, since=timedelta(hours=1))
        assert report.foreign_error is None and report.foreign_beats is not None
        assert {p.job for p in report.pauses} == {"report", "cache"}
        assert report.entries[0].paused is not None
        # resume: the pause goes, a second resume changes nothing
        assert ops.resume("report", actor) is not None
        assert ops.resume("report", actor) is None
        assert ops.resume("cache", actor) is not None
        assert ops.pauses()[1] == []
        later = slot + timedelta(hours=1)
        (won,) = beat_store.claim("node-1", [ClaimRequest.for_slot("report", later, "s-3")])
        assert won.won
        audit = ops.audit()
        assert [(a.action, a.job) for a in audit] == [
            ("resume", "cache"), ("resume", "report"), ("trigger", "report"),
            ("trigger", "report"), ("pause", "cache"), ("pause", "report")]
        assert audit[3].task_id == "m-1" and audit[2].detail == "forced"
    finally:
        ops.close()
        beat_store.close()


def refused(engine: Engine, statement: str) -> None:
    with pytest.raises(sa_exc.DBAPIError) as caught:
        with engine.begin() as conn:
            conn.execute(text(statement))
    assert re.search(r"denied|must be owner", str(caught.value), re.I), caught.value


def test_postgresql_grants_are_enough_for_beat(pg_dsn: str,
                                               pg_scratch: tuple[Engine, str, str]) -> None:
    admin, schema, role = pg_scratch
    owner = {"elarion_beat_dsn": pg_dsn, "elarion_beat_schema": schema}
    store = open_store(Settings.from_mapping(owner))  # init-db, as the owner
    store.create_schema()  # type: ignore[attr-defined]
    store.close()
    with admin.connect() as conn:
        conn.execute(text(f'SET search_path TO "{schema}"'))
        for statement in sql_blocks("PostgreSQL"):
            conn.execute(text(rename(statement, role, schema)))

    as_role = make_url(pg_dsn).set(username=role, password="change-me")
    dsn = as_role.render_as_string(hide_password=False)
    exercise({"elarion_beat_dsn": dsn, "elarion_beat_schema": schema})
    as_worker = make_url(pg_dsn).set(username=worker_role(role), password="change-me")
    exercise_runs({"elarion_beat_dsn": dsn, "elarion_beat_schema": schema},
                  {"elarion_beat_dsn": as_worker.render_as_string(hide_password=False),
                   "elarion_beat_schema": schema})
    as_operator = make_url(pg_dsn).set(username=operator_role(role), password="change-me")
    exercise_control({"elarion_beat_dsn": dsn, "elarion_beat_schema": schema},
                     {"elarion_beat_dsn": as_operator.render_as_string(hide_password=False),
                      "elarion_beat_schema": schema})
    exercise_one_offs({"elarion_beat_dsn": dsn, "elarion_beat_schema": schema},
                      {"elarion_beat_dsn": as_worker.render_as_string(hide_password=False),
                       "elarion_beat_schema": schema},
                      {"elarion_beat_dsn": as_operator.render_as_string(hide_password=False),
                       "elarion_beat_schema": schema})

    claims, nodes = f'"{schema}".elarion_scheduler_claims', f'"{schema}".elarion_scheduler_nodes'
    one_offs = f'"{schema}".elarion_scheduler_oneoffs'
    engine = create_engine(as_role.set(drivername="postgresql+psycopg"))
    try:
        refused(engine, f"DROP TABLE {claims}")
        refused(engine, f'CREATE TABLE "{schema}".x (i int)')
        refused(engine, f"UPDATE {claims} SET job_name = 'x'")
        refused(engine, f"UPDATE {claims} SET task_id = 'x'")
        refused(engine, f"INSERT INTO {one_offs} (id) VALUES ('x')")
        refused(engine, f"UPDATE {one_offs} SET task_name = 'x'")
        refused(engine, f"UPDATE {one_offs} SET due_utc = now()")
    finally:
        engine.dispose()
    engine = create_engine(as_worker.set(drivername="postgresql+psycopg"))
    try:
        refused(engine, f"DROP TABLE {claims}")
        refused(engine, f"DELETE FROM {claims}")
        refused(engine, f"UPDATE {claims} SET node = 'x'")
        refused(engine, f"UPDATE {claims} SET occurrence_utc = now()")
        refused(engine, f"SELECT * FROM {nodes}")
        refused(engine, f"DELETE FROM {one_offs}")
        refused(engine, f"UPDATE {one_offs} SET lease_node = 'x'")
        refused(engine, f"UPDATE {one_offs} SET task_name = 'x'")
    finally:
        engine.dispose()
    engine = create_engine(as_operator.set(drivername="postgresql+psycopg"))
    try:
        refused(engine, f"DROP TABLE {claims}")
        refused(engine, f'DROP TABLE "{schema}".elarion_scheduler_pauses')
        refused(engine, f"DELETE FROM {claims}")
        refused(engine, f"UPDATE {claims} SET node = 'x'")
        refused(engine, f"UPDATE {claims} SET occurrence_utc = now()")
        refused(engine, f"DELETE FROM {nodes}")
        refused(engine, f'DELETE FROM "{schema}".elarion_scheduler_audit')
        refused(engine, f"DELETE FROM {one_offs}")
        refused(engine, f"INSERT INTO {one_offs} (id) VALUES ('x')")
        refused(engine, f"UPDATE {one_offs} SET lease_node = 'x'")
        refused(engine, f"UPDATE {one_offs} SET due_utc = now()")
    finally:
        engine.dispose()
    # as documented: with a schema set, create_table = True needs CREATE on the database
    store = open_store(Settings.from_mapping({"elarion_beat_dsn": dsn,
                                              "elarion_beat_schema": schema}))
    try:
        with pytest.raises(StoreError, match="(?i)denied"):
            store.ensure_schema()
    finally:
        store.close()


# its GRANT on the public schema (and the DROP OWNED after it) must not race the other
# grant tests: PostgreSQL answers "tuple concurrently updated"
@pytest.mark.xdist_group("pg-grants")
def test_postgresql_create_table_true_works_for_the_role_when_the_tables_exist(
        pg_dsn: str, pg_scratch: tuple[Engine, str, str]) -> None:
    """As documented: without a schema, beat's DDL step creates nothing when the tables
    exist, so the role needs no CREATE (tables of this test only, in the default schema)."""
    admin, _, role = pg_scratch
    table = f"claims_{uuid.uuid4().hex[:10]}"
    nodes = table.replace("claims_", "nodes_")
    settings = {"elarion_beat_dsn": pg_dsn, "elarion_beat_table": table,
                "elarion_beat_nodes_table": nodes}
    store = open_store(Settings.from_mapping(settings))
    store.create_schema()  # type: ignore[attr-defined]
    store.close()
    try:
        with admin.connect() as conn:
            for statement in sql_blocks("PostgreSQL"):
                statement = statement.replace("elarion_scheduler_claims", table)
                statement = statement.replace("elarion_scheduler_nodes", nodes)
                statement = statement.replace("elarion_scheduler_pauses", f"{table}_pauses")
                statement = statement.replace("elarion_scheduler_audit", f"{table}_audit")
                statement = statement.replace("elarion_scheduler_oneoffs", f"{table}_oneoffs")
                statement = statement.replace("elarion_scheduler_foreign_beats",
                                              f"{table}_foreign_beats")
                conn.execute(text(rename(statement, role)))
        dsn = make_url(pg_dsn).set(username=role, password="change-me").render_as_string(
            hide_password=False)
        store = open_store(Settings.from_mapping({**settings, "elarion_beat_dsn": dsn}))
        try:
            store.ensure_schema()  # elarion_beat_create_table defaults to True
            slot = datetime(2026, 11, 29, 3, tzinfo=timezone.utc)
            (won,) = store.claim("node-1", [ClaimRequest.for_slot("report", slot, "t-1")])
            assert won.won
        finally:
            store.close()
    finally:
        drop_tables(pg_dsn, nodes, *claims_tables(table))


def test_postgresql_a_beat_role_without_the_one_off_grants_warns_once(
        pg_dsn: str, pg_scratch: tuple[Engine, str, str],
        caplog: pytest.LogCaptureFixture) -> None:
    """A role granted by the page before one-offs (its blocks less the one-offs lines):
    the server's refusal reaches beat's runner as one WARNING naming this page, and the
    purge of the one-offs is refused (beat's purge pass and ``elarion-beat purge``)."""
    admin, schema, role = pg_scratch
    owner = {"elarion_beat_dsn": pg_dsn, "elarion_beat_schema": schema}
    store = open_store(Settings.from_mapping(owner))
    store.create_schema()  # type: ignore[attr-defined]
    store.close()
    with admin.connect() as conn:
        conn.execute(text(f'SET search_path TO "{schema}"'))
        for statement in sql_blocks("PostgreSQL"):
            if "elarion_scheduler_oneoffs" not in statement:
                conn.execute(text(rename(statement, role, schema)))
    dsn = make_url(pg_dsn).set(username=role, password="change-me").render_as_string(
        hide_password=False)
    app = Celery("roles", set_as_current=False)
    app.conf.update(elarion_beat_dsn=dsn, elarion_beat_schema=schema,
                    elarion_beat_create_table=False, elarion_beat_heartbeat_interval=30.0)
    settings = Settings.from_app(app)
    store = open_store(settings)
    now = [1000.0]
    runner = OneOffRunner(app, settings, lambda: store, store.clock, monotonic=lambda: now[0])
    try:
        store.ensure_schema()  # beat starts: the four tables it checks are there
        with caplog.at_level(logging.WARNING, logger="celery_elarion_beat.one_offs.runner"):
            for _ in range(61):  # a minute of one-second wakes: asked at 0, 30 and 60 s
                runner.run()
                now[0] += 1.0
        warnings = [r for r in caplog.records if getattr(r, "action", None) == "one-offs-refused"]
        assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
        assert "permission denied" in warnings[0].getMessage()
        assert "database-role.md" in warnings[0].getMessage()
        with pytest.raises(StoreRefused, match="permission denied"):
            purge_one_offs(store, timedelta(days=1), 100)
    finally:
        runner.close()
        store.close()


def test_mariadb_grants_are_enough_for_beat(mysql_dsn: str,
                                            mysql_scratch: tuple[Engine, str, str]) -> None:
    admin, database, user = mysql_scratch
    owner = make_url(mysql_dsn).set(database=database).render_as_string(hide_password=False)
    store = open_store(Settings.from_mapping({"elarion_beat_dsn": owner}))
    store.create_schema()  # type: ignore[attr-defined]
    store.close()
    try:
        with admin.connect() as conn:
            for statement in sql_blocks("MariaDB and MySQL"):
                conn.execute(text(rename(statement, user)))
    finally:
        admin.dispose()
    as_user = make_url(mysql_dsn).set(username=user, password="change-me", database=database)
    dsn = as_user.render_as_string(hide_password=False)
    exercise({"elarion_beat_dsn": dsn})
    as_worker = as_user.set(username=worker_role(user))
    exercise_runs({"elarion_beat_dsn": dsn},
                  {"elarion_beat_dsn": as_worker.render_as_string(hide_password=False)})
    as_operator = as_user.set(username=operator_role(user))
    exercise_control({"elarion_beat_dsn": dsn},
                     {"elarion_beat_dsn": as_operator.render_as_string(hide_password=False)})
    exercise_one_offs({"elarion_beat_dsn": dsn},
                      {"elarion_beat_dsn": as_worker.render_as_string(hide_password=False)},
                      {"elarion_beat_dsn": as_operator.render_as_string(hide_password=False)})
    engine = create_engine(as_user.set(drivername="mysql+pymysql"))
    try:
        refused(engine, "DROP TABLE elarion_scheduler_claims")
        refused(engine, "CREATE TABLE x (i int)")
        refused(engine, "UPDATE elarion_scheduler_claims SET job_name = 'x'")
        refused(engine, "UPDATE elarion_scheduler_claims SET task_id = 'x'")
        refused(engine, "INSERT INTO elarion_scheduler_oneoffs (id) VALUES ('x')")
        refused(engine, "UPDATE elarion_scheduler_oneoffs SET task_name = 'x'")
        refused(engine, "UPDATE elarion_scheduler_oneoffs SET due_utc = now()")
    finally:
        engine.dispose()
    engine = create_engine(as_worker.set(drivername="mysql+pymysql"))
    try:
        refused(engine, "DROP TABLE elarion_scheduler_claims")
        refused(engine, "DELETE FROM elarion_scheduler_claims")
        refused(engine, "UPDATE elarion_scheduler_claims SET node = 'x'")
        refused(engine, "UPDATE elarion_scheduler_claims SET occurrence_utc = now()")
        refused(engine, "DELETE FROM elarion_scheduler_nodes")
        refused(engine, "DELETE FROM elarion_scheduler_oneoffs")
        refused(engine, "UPDATE elarion_scheduler_oneoffs SET lease_node = 'x'")
        refused(engine, "UPDATE elarion_scheduler_oneoffs SET task_name = 'x'")
    finally:
        engine.dispose()
    engine = create_engine(as_operator.set(drivername="mysql+pymysql"))
    try:
        refused(engine, "DROP TABLE elarion_scheduler_claims")
        refused(engine, "DROP TABLE elarion_scheduler_pauses")
        refused(engine, "DELETE FROM elarion_scheduler_claims")
        refused(engine, "UPDATE elarion_scheduler_claims SET node = 'x'")
        refused(engine, "UPDATE elarion_scheduler_claims SET occurrence_utc = now()")
        refused(engine, "DELETE FROM elarion_scheduler_nodes")
        refused(engine, "DELETE FROM elarion_scheduler_audit")
        refused(engine, "DELETE FROM elarion_scheduler_oneoffs")
        refused(engine, "INSERT INTO elarion_scheduler_oneoffs (id) VALUES ('x')")
        refused(engine, "UPDATE elarion_scheduler_oneoffs SET lease_node = 'x'")
        refused(engine, "UPDATE elarion_scheduler_oneoffs SET due_utc = now()")
    finally:
        engine.dispose()
